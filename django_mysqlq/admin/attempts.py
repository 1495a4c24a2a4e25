"""History admin: every attempt and operator action, read-only, with "replay"."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin.views.main import SEARCH_VAR
from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import URLPattern, path, reverse
from django.utils.datastructures import MultiValueDict
from django.utils.html import format_html

from .. import ops, routing
from ..conf import get_settings
from ..limits import row_id
from ..models import Attempt, Message
from . import actions, databases
from .databases import DatabaseFilter, DatabaseMixin
from .filters import HistoryQueueFilter, HistoryTaskFilter
from .listing import CappedPaginator, given, text
from .readonly import ReadOnlyAdminMixin

if TYPE_CHECKING:
    _Base = admin.ModelAdmin[Attempt]
else:  # ModelAdmin is generic for the type checker only
    _Base = admin.ModelAdmin


#: Orders a history index holds, so a page walks it and stops (see :mod:`.listing`).
#: Newest first along the primary key (unfiltered), or along mysqlq_att_message
#: (message_id, id) for one message's trace.
NEWEST_FIRST = ("-id",)
#: Most recently finished first along (outcome | task_name | queue, finished_at, id).
FINISHED_ORDER = ("-finished_at", "-id")
#: The same along mysqlq_att_finished (finished_at, queue, outcome, task_name, id) for a
#: date range: every column of that index, so the walk needs no sort.
WINDOW_ORDER = ("-finished_at", "-queue", "-outcome", "-task_name", "-id")


def search(term: str) -> tuple[Q, bool]:
    """What the search box finds, and whether it is a task's rows (maybe many).

    A number is a message id (its trace); other text is a task's full name. Each is one
    index lookup: a substring search would read every row of the history.
    """
    term = term.strip()
    if term.isascii() and term.isdigit():
        found = row_id(term)
        return (Q(message_id=found) if found is not None else Q(pk__in=[])), False
    return Q(task_name=term), True


def history_ordering(params: MultiValueDict[str, Any]) -> tuple[str, ...]:
    """The order of the history list: the one the index of its narrowest filter holds."""
    searched = text(params, SEARCH_VAR)
    if given(params, "message_id") or (searched and not search(searched)[1]):
        return NEWEST_FIRST
    if given(params, "outcome__exact", "task", "queue") or searched:
        return FINISHED_ORDER
    if given(params, "finished_at__gte", "finished_at__lt"):
        return WINDOW_ORDER
    return NEWEST_FIRST


#: History rows one "Replay" action takes at most (each is a copy enqueued on its own);
#: more is a job for ``queuepipeline replay``, which works in batches.
REPLAY_CAP = 1_000
#: Past this many rows, one summary line instead of one line per row.
REPLAY_LINES = 10


@admin.action(description="Replay: enqueue a copy of each selected finished message",
              permissions=["replay"])
def replay_selected(modeladmin: AttemptAdmin, request: HttpRequest,
                    queryset: QuerySet[Any]) -> None:
    ids = [int(i) for i in queryset.values_list("pk", flat=True)[:REPLAY_CAP + 1]]
    if len(ids) > REPLAY_CAP:
        modeladmin.message_user(
            request, f"Replay takes at most {REPLAY_CAP:,} history rows, and this selection "
            "holds more: nothing was replayed. Narrow the filter (outcome, task, date), or "
            "use manage.py queuepipeline replay, which works through any number in batches.",
            messages.ERROR)
        return
    if len(ids) <= REPLAY_LINES:
        for attempt_id in ids:
            modeladmin.replay_one(request, attempt_id)
        return
    outcomes = [modeladmin.replay_quietly(request, attempt_id) for attempt_id in ids]
    copies = [new_id for new_id, _ in outcomes if new_id is not None]
    refusals = [reason for new_id, reason in outcomes if new_id is None]
    if copies:
        modeladmin.message_user(request, f"Replayed {len(copies):,} history rows as new "
                                f"messages #{min(copies)} to #{max(copies)}.",
                                messages.SUCCESS)
    if refusals:
        modeladmin.message_user(request, f"{len(refusals):,} rows were not replayed; the "
                                f"first: {refusals[0]}", messages.WARNING)


@admin.register(Attempt)
class AttemptAdmin(DatabaseMixin, ReadOnlyAdminMixin, _Base):
    list_display = ("id", "message_link", "queue", "task_name", "attempt", "outcome", "by",
                    "started_at", "finished_at", "duration", "error_class")
    list_filter = (DatabaseFilter, "outcome", HistoryTaskFilter, HistoryQueueFilter, "finished_at")
    search_fields = ("=message_id", "=task_name")
    search_help_text = "A message id (its trace), or a task's full name (exact)."
    ordering = NEWEST_FIRST
    # Each list is in the order its filter's index holds (get_ordering); a column's
    # order would sort every match.
    sortable_by = ()
    list_per_page = 50
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER  # a count per choice: a scan per choice
    paginator = CappedPaginator
    actions = [replay_selected]
    change_form_template = "admin/django_mysqlq/attempt/change_form.html"
    fields = ("message_link", "queue", "task_name", "attempt", "outcome", "priority", "by",
              "host", "pid", "connection_id", "thread", "enqueued_at", "started_at",
              "finished_at", "error_class", "error_message", "traceback_text", "result",
              "payload", "replayed_from")
    readonly_fields = fields

    def has_replay_permission(self, request: HttpRequest) -> bool:
        return actions.allowed(request, actions.REPLAY)

    def get_ordering(self, request: HttpRequest) -> tuple[str, ...]:
        return history_ordering(request.GET)

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[Any],
                           search_term: str) -> tuple[QuerySet[Any], bool]:
        if not search_term.strip():
            return queryset, False
        return queryset.filter(search(search_term)[0]), False

    @admin.display(description="message", ordering="message_id")
    def message_link(self, obj: Attempt) -> str:
        # Ids are per database: on another one, both links name it (else #N is the default's).
        database = databases.shown_suffix()
        trace = reverse("admin:django_mysqlq_attempt_changelist") \
            + f"?message_id={obj.message_id}" + database.replace("?", "&")
        page = reverse("admin:django_mysqlq_message_change", args=[obj.message_id]) + database
        return format_html('<a href="{}">#{}</a> (<a href="{}">trace</a>)', page,
                           obj.message_id, trace)

    @admin.display(description="by")
    def by(self, obj: Attempt) -> str:
        return obj.actor or obj.worker_id or "-"

    @admin.display(description="duration")
    def duration(self, obj: Attempt) -> str:
        if obj.started_at is None or obj.finished_at is None:  # (None: a zero date)
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

    def change_context(self, request: HttpRequest, object_id: str) -> dict[str, Any]:
        found = row_id(object_id)
        attempt = Attempt.objects.filter(pk=found).first() if found is not None else None
        return {
            "can_replay": (attempt is not None and bool(attempt.payload)
                           and actions.allowed(request, actions.REPLAY)),
            "replay_url": reverse("admin:django_mysqlq_attempt_replay", args=[object_id])
            + databases.suffix(request),
            "message_exists": attempt is not None and Message.objects.filter(
                pk=attempt.message_id).exists(),
        }

    def replay_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """POST: replay the history row of the page's database (``?database=``); go to
        the copy's page, on its queue's database."""
        if not (self.has_view_permission(request) and actions.allowed(request, actions.REPLAY)):
            raise PermissionDenied
        back = reverse("admin:django_mysqlq_attempt_change", args=[object_id]) \
            + databases.suffix(request)
        if request.method != "POST":
            return HttpResponseRedirect(back)
        found = row_id(object_id)
        if found is None:
            raise Http404("History ids are numbers.")
        with routing.on_alias(databases.selected(request)):
            new_id = self.replay_one(request, found)
            queue = Attempt.objects.filter(pk=object_id).values_list("queue", flat=True) \
                .first()
        if new_id is None or queue is None:
            return HttpResponseRedirect(back)
        target = routing.alias_for_queue(queue)
        return HttpResponseRedirect(
            reverse("admin:django_mysqlq_message_change", args=[new_id])
            + ("" if target == get_settings().DATABASE else f"?{databases.PARAMETER}={target}"))

    def replay_one(self, request: HttpRequest, attempt_id: int) -> int | None:
        new_id, refused = self.replay_quietly(request, attempt_id)
        if new_id is None:
            self.message_user(request, refused, messages.WARNING)
        else:
            self.message_user(request, f"Replayed history row {attempt_id} as message "
                              f"#{new_id}.", messages.SUCCESS)
        return new_id

    def replay_quietly(self, request: HttpRequest, attempt_id: int) -> tuple[int | None, str]:
        """(the copy's id, "") or (None, why the row can't be replayed)."""
        try:
            return ops.replay(attempt_id, actions.who(request)), ""
        except (LookupError, ValueError) as exc:
            return None, str(exc)
