"""Recurring tasks in the admin: each schedule with its last and next run, and the
operator's pause, resume, run-now and prune (through :mod:`django_mysqlq.scheduling`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import format_html

from .. import routing, scheduling
from ..models import Schedule
from . import actions
from .databases import DatabaseFilter, DatabaseMixin, selected, shown_suffix
from .readonly import ReadOnlyAdminMixin

if TYPE_CHECKING:
    _Base = admin.ModelAdmin[Schedule]
else:  # ModelAdmin is generic for the type checker only
    _Base = admin.ModelAdmin

#: The permission codename of pause, resume and prune.
PAUSE_SCHEDULE = "pause_schedule"


class StateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(scheduling.ACTIVE, "active"), (scheduling.PAUSED, "paused"),
                (scheduling.REMOVED, "removed (not in the code any more)"),
                (scheduling.BROKEN, "broken (see its error)")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value == scheduling.REMOVED:
            return queryset.filter(removed_at__isnull=False)
        if value == scheduling.BROKEN:
            return queryset.filter(removed_at__isnull=True).exclude(error="")
        if value in (scheduling.ACTIVE, scheduling.PAUSED):
            return queryset.filter(removed_at__isnull=True, error="",
                                   paused=value == scheduling.PAUSED)
        return queryset


def _names(queryset: QuerySet[Any]) -> list[str]:
    return [str(name) for name in queryset.values_list("name", flat=True)[:1000]]


@admin.action(description="Pause the selected schedules", permissions=["pause"])
def pause_selected(modeladmin: ScheduleAdmin, request: HttpRequest,
                   queryset: QuerySet[Any]) -> None:
    changed = scheduling.set_paused(_names(queryset), True, actions.who(request))
    modeladmin.message_user(request, f"Paused {len(changed)} schedule(s): no occurrence is "
                            "enqueued until they are resumed.", messages.SUCCESS)


@admin.action(description="Resume the selected schedules (from their next occurrence)",
              permissions=["pause"])
def resume_selected(modeladmin: ScheduleAdmin, request: HttpRequest,
                    queryset: QuerySet[Any]) -> None:
    changed = scheduling.set_paused(_names(queryset), False, actions.who(request))
    modeladmin.message_user(request, f"Resumed {len(changed)} schedule(s): each runs at its "
                            "next occurrence; those of the pause are not caught up.",
                            messages.SUCCESS)


@admin.action(description="Delete the selected removed schedules", permissions=["pause"])
def prune_selected(modeladmin: ScheduleAdmin, request: HttpRequest,
                   queryset: QuerySet[Any]) -> None:
    names = _names(queryset)
    if not names:  # already deleted (a reload, a second click): an empty list is not "all"
        modeladmin.message_user(request, "None of the selected schedules exists any more: "
                                "nothing deleted.", messages.WARNING)
        return
    deleted = scheduling.prune(names)
    level = messages.SUCCESS if deleted == len(names) else messages.WARNING
    modeladmin.message_user(request, f"Deleted {deleted} removed schedule(s)"
                            + ("" if deleted == len(names) else f"; {len(names) - deleted} "
                               "skipped: still declared by the workers' code") + ".", level)


@admin.action(description="Run the selected schedules once now", permissions=["pause"])
def run_selected(modeladmin: ScheduleAdmin, request: HttpRequest,
                 queryset: QuerySet[Any]) -> None:
    made = scheduling.run_now(_names(queryset), actions.who(request))
    modeladmin.message_user(request, f"Enqueued one run now of {len(made)} schedule(s): "
                            + ", ".join(f"{name} (#{message_id})" for name, message_id
                                        in made.items())
                            + ". Their next occurrences are unchanged.", messages.SUCCESS)


@admin.register(Schedule)
class ScheduleAdmin(DatabaseMixin, ReadOnlyAdminMixin, _Base):
    list_display = ("name", "task_name", "cron", "timezone", "catch_up", "state",
                    "last_run", "next_run", "last_message")
    list_filter = (DatabaseFilter, StateFilter, "source", "queue")
    search_fields = ("name", "task_name")
    actions = [pause_selected, resume_selected, run_selected, prune_selected]
    readonly_fields = ("name", "source", "task_name", "queue", "priority", "max_attempts",
                       "retry_backoff", "timeout", "payload", "cron", "timezone", "catch_up",
                       "state", "last_run", "next_run", "last_enqueued_at", "last_message",
                       "created_at", "declared_at", "removed_at", "error", "changed_at",
                       "changed_by")
    fields = readonly_fields
    change_list_template = "admin/django_mysqlq/schedule/change_list.html"

    def changelist_view(self, request: HttpRequest,
                        extra_context: dict[str, Any] | None = None) -> HttpResponse:
        context = dict(extra_context or {})
        if request.method == "GET" and request.GET.get(StateFilter.parameter_name) in (
                None, scheduling.ACTIVE):
            context["unstored"] = self.unstored(selected(request))
        return super().changelist_view(request, context)

    @staticmethod
    def unstored(alias: str) -> list[scheduling.ScheduleStatus]:
        """The schedules declared for the queues of ``alias`` that no worker has written
        yet: shown above the list (read only; a worker's start or ``queueschedule``
        writes them)."""
        stored = set(Schedule.objects.using(routing.read_alias(alias))
                     .values_list("name", flat=True))
        return scheduling.unstored(alias, stored)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm("django_mysqlq.view_schedule") or \
            request.user.has_perm("django_mysqlq.view_message")

    def has_pause_permission(self, request: HttpRequest) -> bool:
        return actions.allowed(request, PAUSE_SCHEDULE)

    @admin.display(description="state")
    def state(self, obj: Schedule) -> str:
        return scheduling.ScheduleStatus.of(obj).state

    @admin.display(description="last run", ordering="last_run_at")
    def last_run(self, obj: Schedule) -> str:
        return scheduling.ScheduleStatus.of(obj).last_local

    @admin.display(description="next run", ordering="next_run_at")
    def next_run(self, obj: Schedule) -> str:
        return scheduling.ScheduleStatus.of(obj).next_local

    @admin.display(description="last message")
    def last_message(self, obj: Schedule) -> str:
        if obj.last_message_id is None:
            return "-"
        url = reverse("admin:django_mysqlq_attempt_changelist")
        database = shown_suffix().replace("?", "&")
        return format_html('<a href="{}?message_id={}{}">#{}</a>', url, obj.last_message_id,
                           database, obj.last_message_id)
