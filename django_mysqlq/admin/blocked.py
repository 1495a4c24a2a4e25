"""The blocked messages entry point: what waits behind an ordered subject's head or for a
slot of its concurrency key, with the messages holding it (a dead head marked), and the
actions that move a held subject: requeue its dead head, or release it."""

from __future__ import annotations

import contextvars
from typing import Any

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.db.models import QuerySet
from django.http import HttpRequest

from .. import broker
from ..models import BlockedMessage, Message, MessageStatus
from .actions import ACTIONS
from .databases import DatabaseFilter
from .filters import BlockedQueueFilter, BlockedTaskFilter
from .gates import describe_holders, gate_ref, holders_of
from .indexhints import IndexOrder
from .messages import _bulk, _EntryPoint, message_ordering

#: The holders of the gates on the page being rendered (one statement per page).
_holders_now: contextvars.ContextVar[dict[broker.GateRef, list[broker.Holder]]] = \
    contextvars.ContextVar("mysqlq_holders_now")


@admin.register(BlockedMessage)
class BlockedMessageAdmin(_EntryPoint):
    list_display = ["id", "queue", "task_name", "gate_key", "held_by", "priority", "age"]
    list_filter = [DatabaseFilter, BlockedQueueFilter, BlockedTaskFilter]
    actions = [_bulk(ACTIONS[name])
               for name in ("requeue_head", "release_subject", "cancel", "priority")]

    def list_order(self, request: HttpRequest) -> IndexOrder:
        return message_ordering(request.GET, dead_only=True)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return super().get_queryset(request).filter(status=MessageStatus.BLOCKED)

    def get_changelist_instance(self, request: HttpRequest) -> ChangeList:
        changelist = super().get_changelist_instance(request)
        _holders_now.set(holders_of(changelist.result_list))
        return changelist

    @admin.display(description="held by")
    def held_by(self, obj: Message) -> str:
        ref = gate_ref(obj)
        found = _holders_now.get({}).get(ref, []) if ref is not None else []
        return describe_holders(found) or "- (moves at the next ack or check)"
