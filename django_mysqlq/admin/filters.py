"""The list filters of the messages and history lists.

Their choices come from an index, one dive per distinct value (a loose index scan, or
the broker's skip scan of the claim index), never from ``SELECT DISTINCT`` over every
row: the sidebar renders on every page load. A list of one status (the dead list) offers
only the queues and tasks that have messages in it.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from .. import broker
from ..models import Attempt, Message, MessageStatus
from . import databases

#: Choices a filter offers at most; any other value still works in the URL.
MAX_CHOICES = 200


class _ExactFilter(admin.SimpleListFilter):
    """Equality on one column, the column a list's index starts with."""

    column = ""

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(**{self.column: self.value()}) if self.value() else queryset


class QueueFilter(_ExactFilter):
    title = "queue"
    parameter_name = "queue"
    column = "queue"
    #: Offer only queues holding a message in this status (None: any unfinished one).
    status: str | None = None

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        names = broker.queue_names(MAX_CHOICES) if self.status is None \
            else broker.queues_holding(self.status, MAX_CHOICES)
        return [(name, name) for name in names]


class TaskFilter(_ExactFilter):
    title = "task"
    parameter_name = "task"
    column = "task_name"
    #: Offer only tasks with a message in this status (None: any unfinished one).
    status: str | None = None

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        # A loose index scan of mysqlq_msg_task (task_name, status): one dive per task,
        # with a status one dive per (task, status), so no new index is needed.
        messages = Message.objects.all() if self.status is None \
            else Message.objects.filter(status=self.status)
        names = messages.order_by("task_name").values_list("task_name", flat=True) \
            .distinct()[:MAX_CHOICES]
        return [(name, name) for name in names]


class DeadQueueFilter(QueueFilter):
    status = MessageStatus.DEAD


class DeadTaskFilter(TaskFilter):
    status = MessageStatus.DEAD


class BlockedQueueFilter(QueueFilter):
    status = MessageStatus.BLOCKED


class BlockedTaskFilter(TaskFilter):
    status = MessageStatus.BLOCKED


class StuckFilter(admin.SimpleListFilter):
    title = "stuck"
    parameter_name = "stuck"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "Stuck (owner gone, lease expired or overran)")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == "yes":
            return queryset.filter(pk__in=[s.id for s in databases.stuck_messages()])
        return queryset


class HistoryQueueFilter(_ExactFilter):
    title = "queue"
    parameter_name = "queue"
    column = "queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        # A loose index scan of mysqlq_att_queue (queue, finished_at).
        names = Attempt.objects.order_by("queue").values_list("queue", flat=True).distinct()
        return [(name, name) for name in names[:MAX_CHOICES]]


class HistoryTaskFilter(_ExactFilter):
    title = "task"
    parameter_name = "task"
    column = "task_name"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        # A loose index scan of mysqlq_att_task (task_name, finished_at).
        names = Attempt.objects.order_by("task_name").values_list("task_name", flat=True) \
            .distinct()
        return [(name, name) for name in names[:MAX_CHOICES]]
