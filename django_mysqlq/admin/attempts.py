"""History admin: every attempt and operator action, read-only, with "replay"."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import URLPattern, path, reverse
from django.utils.functional import cached_property
from django.utils.html import format_html

from .. import broker, ops
from ..models import Attempt, Message
from . import actions
from .readonly import ReadOnlyAdminMixin

if TYPE_CHECKING:
    _Base = admin.ModelAdmin[Attempt]
    _Pages = Paginator[Attempt]
else:  # ModelAdmin is generic for the type checker only
    _Base = admin.ModelAdmin
    _Pages = Paginator


class HistoryPaginator(_Pages):
    """Pages of history without ``COUNT(*)`` over the whole table when nothing filters it.

    A million rows take a full index scan to count; the unfiltered list shows the
    server's estimate instead (filtered lists are counted exactly, along their index).
    """

    @cached_property
    def count(self) -> int:
        query = getattr(self.object_list, "query", None)
        if query is not None and not query.where:
            return broker.estimated_history_rows()
        return super().count


class HistoryQueueFilter(admin.SimpleListFilter):
    title = "queue"
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        # Distinct over the (queue, finished_at) index: a loose index scan.
        names = Attempt.objects.order_by("queue").values_list("queue", flat=True).distinct()
        return [(name, name) for name in names[:200]]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(queue=self.value()) if self.value() else queryset


class HistoryTaskFilter(HistoryQueueFilter):
    title = "task"
    parameter_name = "task"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        names = Attempt.objects.order_by("task_name").values_list("task_name", flat=True) \
            .distinct()
        return [(name, name) for name in names[:200]]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(task_name=self.value()) if self.value() else queryset


@admin.action(description="Replay: enqueue a copy of each selected finished message",
              permissions=["replay"])
def replay_selected(modeladmin: AttemptAdmin, request: HttpRequest,
                    queryset: QuerySet[Any]) -> None:
    for attempt_id in queryset.values_list("pk", flat=True)[:1000]:
        modeladmin.replay_one(request, int(attempt_id))


@admin.register(Attempt)
class AttemptAdmin(ReadOnlyAdminMixin, _Base):
    list_display = ("id", "message_link", "queue", "task_name", "attempt", "outcome", "by",
                    "started_at", "finished_at", "duration", "error_class")
    list_filter = ("outcome", HistoryTaskFilter, HistoryQueueFilter, "finished_at")
    search_fields = ("=message_id", "task_name")
    ordering = ("-id",)
    list_per_page = 50
    show_full_result_count = False
    paginator = HistoryPaginator
    actions = [replay_selected]
    change_form_template = "admin/django_mysqlq/attempt/change_form.html"
    fields = ("message_link", "queue", "task_name", "attempt", "outcome", "priority", "by",
              "host", "pid", "connection_id", "thread", "enqueued_at", "started_at",
              "finished_at", "error_class", "error_message", "traceback_text", "result",
              "payload")
    readonly_fields = fields

    def has_replay_permission(self, request: HttpRequest) -> bool:
        return actions.allowed(request, actions.REPLAY)

    @admin.display(description="message", ordering="message_id")
    def message_link(self, obj: Attempt) -> str:
        trace = reverse("admin:django_mysqlq_attempt_changelist") + f"?message_id={obj.message_id}"
        page = reverse("admin:django_mysqlq_message_change", args=[obj.message_id])
        return format_html('<a href="{}">#{}</a> (<a href="{}">trace</a>)', page,
                           obj.message_id, trace)

    @admin.display(description="by")
    def by(self, obj: Attempt) -> str:
        return obj.actor or obj.worker_id or "-"

    @admin.display(description="duration")
    def duration(self, obj: Attempt) -> str:
        if obj.started_at is None:
            return "-"
        return f"{(obj.finished_at - obj.started_at).total_seconds():.3f}s"

    @admin.display(description="traceback")
    def traceback_text(self, obj: Attempt) -> str:
        return format_html("<pre>{}</pre>", obj.traceback) if obj.traceback else "-"

    def get_urls(self) -> list[URLPattern]:
        return [
            path("<path:object_id>/replay/", self.admin_site.admin_view(self.replay_view),
                 name="django_mysqlq_attempt_replay"),
            *super().get_urls(),
        ]

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:
        context = dict(extra_context or {})
        attempt = Attempt.objects.filter(pk=object_id).first() if object_id.isdigit() else None
        context["can_replay"] = (attempt is not None and bool(attempt.payload)
                                 and actions.allowed(request, actions.REPLAY))
        context["message_exists"] = attempt is not None and Message.objects.filter(
            pk=attempt.message_id).exists()
        return super().change_view(request, object_id, form_url, context)

    def replay_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        if not actions.allowed(request, actions.REPLAY):
            raise PermissionDenied
        if request.method != "POST":
            return HttpResponseRedirect(reverse("admin:django_mysqlq_attempt_change",
                                                args=[object_id]))
        if not object_id.isdigit():
            raise Http404("History ids are numbers.")
        new_id = self.replay_one(request, int(object_id))
        if new_id is None:
            return HttpResponseRedirect(reverse("admin:django_mysqlq_attempt_change",
                                                args=[object_id]))
        return HttpResponseRedirect(reverse("admin:django_mysqlq_message_change",
                                            args=[new_id]))

    def replay_one(self, request: HttpRequest, attempt_id: int) -> int | None:
        try:
            new_id = ops.replay(attempt_id, actions.who(request))
        except (LookupError, ValueError) as exc:
            self.message_user(request, str(exc), messages.WARNING)
            return None
        self.message_user(request, f"Replayed history row {attempt_id} as message #{new_id}.",
                          messages.SUCCESS)
        return new_id
