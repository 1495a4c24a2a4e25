"""Messages admin: the list an operator filters, the detail with the trace, the actions.

Read-only as far as Django's forms go (no add, change or delete): every change is an
operator action from :mod:`.actions`, which goes through the broker.
"""

from __future__ import annotations

import contextvars
import datetime as dt
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import SEARCH_VAR
from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.datastructures import MultiValueDict
from django.utils.html import format_html
from django.utils.http import urlencode

from .. import broker, ops, routing
from ..limits import row_id
from ..models import CLAIM_INDEX, Attempt, DeadMessage, Message, MessageStatus, StuckMessage
from . import actions, databases, payloads
from .actions import ACTIONS, Action, outside_request_transaction
from .databases import DatabaseFilter, DatabaseMixin
from .filters import DeadQueueFilter, DeadTaskFilter, QueueFilter, StuckFilter, TaskFilter
from .gates import gate_holders, gate_label, holds_or_waits
from .indexhints import IndexOrder, along, pin
from .listing import COUNT_CAP, CappedPaginator, capped_count, given, text
from .readonly import ReadOnlyAdminMixin

if TYPE_CHECKING:
    _Base = admin.ModelAdmin[Message]
else:  # ModelAdmin is generic for the type checker only
    _Base = admin.ModelAdmin


#: Orders a list's index holds, so a page walks it and stops (see :mod:`.listing`); the
#: list's statements name that index (:mod:`.indexhints`).
#: The claim index (queue, status, priority DESC, id): what a queue's workers take next.
CLAIM_ORDER = IndexOrder(Message, ("status", "-priority", "id"), CLAIM_INDEX)
#: mysqlq_msg_task (task_name, status, id).
TASK_ORDER = IndexOrder(Message, ("status", "id"), "mysqlq_msg_task")
#: mysqlq_msg_due (status, run_at, id), backwards: the most recently due first.
DUE_ORDER = IndexOrder(Message, ("-run_at", "-id"), "mysqlq_msg_due")
NEWEST_FIRST = IndexOrder(Message, ("-id",))
#: Characters of an error a list row shows: its first line, cut here with an ellipsis.
ERROR_WIDTH = 120


def first_line(text: str, width: int = ERROR_WIDTH) -> str:
    """The first non-blank line of ``text``, at most ``width`` characters; an ellipsis
    says there is more (another line, or the rest of this one) on the message's page."""
    lines = text.strip().splitlines()
    if not lines:
        return ""
    line = lines[0].strip()
    if len(line) > width:
        return line[:width - 1].rstrip() + "\u2026"
    return line + (" \u2026" if len(lines) > 1 else "")


def search(term: str) -> tuple[Q, bool]:
    """What the search box finds, and whether it is a task's messages (maybe many).

    A number is a message id (or a numeric dedup key); other text is a dedup key if a
    message has it. Either, when no message has it, is an ordered subject or concurrency
    key if one has that (``ordered_by="order_id"`` makes keys like "42"), then a rate-limit
    key; other text is then a task's full name. Each is one index lookup: a substring
    search would read every row of a million-message table.
    """
    term = term.strip()
    if term.isascii() and term.isdigit():
        found = row_id(term)  # (None: longer than any id, still a key's text)
        by_id = (Q(pk=found) if found is not None else Q(pk__in=[])) | Q(dedup_key=term)
        if Message.objects.filter(by_id).exists() or \
                not Message.objects.filter(gate_key=term).exists():
            return by_id, False
        return Q(gate_key=term), False
    if Message.objects.filter(dedup_key=term).exists():
        return Q(dedup_key=term), False
    if Message.objects.filter(gate_key=term).exists():
        return Q(gate_key=term), False
    if Message.objects.filter(rate_key=term).exclude(task_name=term).exists():
        return Q(rate_key=term), False  # a rate-limit key (a task-wide one is its name)
    return Q(task_name=term), True


def message_ordering(params: MultiValueDict[str, Any], *, dead_only: bool = False
                     ) -> IndexOrder:
    """The order of a message list: the one the index of its narrowest filter holds."""
    if given(params, "stuck"):  # a primary-key list of the few stuck messages
        return NEWEST_FIRST
    if given(params, "queue"):
        return CLAIM_ORDER
    searched = text(params, SEARCH_VAR)
    if given(params, "task") or (searched and search(searched)[1]):
        return TASK_ORDER
    if given(params, "status__exact") or dead_only:
        return DUE_ORDER
    return NEWEST_FIRST


def _bulk(action: Action) -> Any:
    """A Django admin action running ``action`` on the selected messages."""
    def run(modeladmin: MessageAdmin, request: HttpRequest,
            queryset: QuerySet[Any]) -> HttpResponse | None:
        ids = list(queryset.values_list("pk", flat=True)[:COUNT_CAP + 1])
        if len(ids) > COUNT_CAP:
            modeladmin.message_user(
                request, f"A bulk action takes at most {COUNT_CAP:,} messages, and this "
                "selection holds more. Narrow the filter, or use \"Requeue all dead "
                "matching this filter\" or manage.py queuerequeue / queuecancel, which "
                "work through any number in batches.", messages.ERROR)
            return None
        if action.confirm and request.POST.get("confirmed") != "yes":
            # "No, take me back": the list the action came from, its filters kept.
            return modeladmin.confirmation(request, action, ids, bulk=True,
                                           back=request.get_full_path())
        modeladmin.run_action(request, action, ids)
        return None

    run.__name__ = action.name
    permission = {actions.REQUEUE: "requeue", actions.CANCEL: "cancel",
                  actions.PRIORITY: "priority", actions.RELEASE: "release",
                  actions.RELEASE_SUBJECT: "release_subject"}[action.permission]
    return admin.action(description=f"{action.label} (selected)",
                        permissions=[permission])(run)


@admin.register(Message)
class MessageAdmin(DatabaseMixin, ReadOnlyAdminMixin, _Base):
    list_display = ["id", "queue", "task_name", "status_label", "priority", "attempts_label",
                    "age", "owner", "run_at"]
    list_filter = [DatabaseFilter, QueueFilter, "status", TaskFilter, StuckFilter]
    search_fields = ("=id", "=dedup_key", "=task_name")
    search_help_text = ("A message id, a dedup key, an ordered subject or concurrency key, or a "
                        "task's full name (exact).")
    ordering = NEWEST_FIRST.fields
    # Each list is in the order its filter's index holds (get_ordering); a column's
    # order would sort every match.
    sortable_by = ()
    list_per_page = 50
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER  # a count per choice: a scan per choice
    paginator = CappedPaginator
    actions = [_bulk(action) for action in ACTIONS.values()]
    change_form_template = "admin/django_mysqlq/message/change_form.html"
    change_list_template = "admin/django_mysqlq/message/change_list.html"
    fields = ("id", "queue", "task_name", "status", "priority", "attempts", "max_attempts",
              "arguments", "enqueued_at", "run_at", "retry_backoff", "timeout", "dedup_key",
              "unique_for", "rate_key", "gate", "owner", "claimed_at", "lease_expires_at",
              "last_error_text")
    readonly_fields = fields

    # ------------------------------------------------------------- permissions
    # (No add/change/delete: ReadOnlyAdminMixin. "Cancel" is the way out, through the
    # broker and history.)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm("django_mysqlq.view_message")

    def has_requeue_permission(self, request: HttpRequest) -> bool:
        return actions.allowed(request, actions.REQUEUE)

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return actions.allowed(request, actions.CANCEL)

    def has_priority_permission(self, request: HttpRequest) -> bool:
        return actions.allowed(request, actions.PRIORITY)

    def has_release_permission(self, request: HttpRequest) -> bool:
        return actions.allowed(request, actions.RELEASE)

    def has_release_subject_permission(self, request: HttpRequest) -> bool:
        return actions.allowed(request, actions.RELEASE_SUBJECT)

    # ------------------------------------------------------------- list

    def list_order(self, request: HttpRequest) -> IndexOrder:
        """This list's order and the index holding it, for its filters."""
        return message_ordering(request.GET)

    def get_ordering(self, request: HttpRequest) -> tuple[str, ...]:
        return self.list_order(request).fields

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        # The list's rows and count along its order's index (actions on selected ids,
        # detail pages: along the primary key, unhinted).
        return pin(super().get_queryset(request), self.list_order(request))

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[Any],
                           search_term: str) -> tuple[QuerySet[Any], bool]:
        if not search_term.strip():
            return queryset, False
        return queryset.filter(search(search_term)[0]), False

    # ------------------------------------------------------------- columns

    @admin.display(description="status", ordering="status")
    def status_label(self, obj: Message) -> str:
        return obj.status

    @admin.display(description="attempts")
    def attempts_label(self, obj: Message) -> str:
        """Attempts spent of those allowed. A requeue grants at least one more (see
        ``broker.requeue``), so only a row requeued by an older version spends more."""
        if obj.attempts > obj.max_attempts:
            return f"{obj.attempts} (max {obj.max_attempts}, requeued)"
        return f"{obj.attempts}/{obj.max_attempts}"

    @admin.display(description="last error")
    def last_error_line(self, obj: Message) -> str:
        return first_line(obj.last_error) or "-"

    @admin.display(description="age", ordering="enqueued_at")
    def age(self, obj: Message) -> str:
        if obj.enqueued_at is None:  # a zero date changed by hand (the driver reads None)
            return "-"
        return _duration((broker.database_now() - obj.enqueued_at).total_seconds())

    @admin.display(description="owner (worker, connection)")
    def owner(self, obj: Message) -> str:
        if obj.status != MessageStatus.CLAIMED:
            return "-"
        return f"{obj.worker_id} conn {obj.owner_connection}"

    @admin.display(description="arguments")
    def arguments(self, obj: Message) -> str:
        return payloads.json_block(
            obj.payload, sort_keys=True, deep_advice="workers fail such a message: cancel it, "
            "or enqueue it again with flatter arguments")

    @admin.display(description="subject / concurrency key")
    def gate(self, obj: Message) -> str:
        return gate_label(obj)

    @admin.display(description="last error")
    def last_error_text(self, obj: Message) -> str:
        return format_html("<pre>{}</pre>", obj.last_error) if obj.last_error else "-"

    # ------------------------------------------------------------- pages

    def get_urls(self) -> list[URLPattern]:
        return outside_request_transaction([
            path("requeue-dead-matching/", self.admin_site.admin_view(self.requeue_matching),
                 name="django_mysqlq_message_requeue_matching"),
            path("<path:object_id>/act/<str:name>/", self.admin_site.admin_view(self.act),
                 name="django_mysqlq_message_act"),
            *super().get_urls(),
        ])

    def change_context(self, request: HttpRequest, object_id: str) -> dict[str, Any]:
        # The message, its trace and whether it is stuck: all on the page's database.
        try:
            message_id = int(object_id)
        except ValueError:
            raise Http404("Message ids are numbers.") from None
        stuck = {s.id: s for s in databases.stuck_messages()}.get(message_id)
        message = Message.objects.using(broker.default_alias()).filter(pk=message_id).first()
        buttons = []
        if message is not None:
            for action in ACTIONS.values():
                if message.status in action.statuses and actions.allowed(request,
                                                                          action.permission):
                    if action.name == "release" and (stuck is None or not stuck.releasable):
                        continue
                    if action.on_heads and not holds_or_waits(message):
                        continue
                    buttons.append((action, reverse("admin:django_mysqlq_message_act",
                                                    args=[message_id, action.name])
                                    + databases.suffix(request)))
        return {
            "trace": Attempt.objects.using(broker.default_alias()).for_message(message_id)[:500],
            "stuck": stuck,
            "buttons": buttons,
            "holders": gate_holders(message) if message is not None else None,
            "database_suffix": databases.suffix(request),  # the trace rows' links keep it
        }

    def act(self, request: HttpRequest, object_id: str, name: str) -> HttpResponse:
        """One action on one message: GET shows the confirmation, POST runs it (on the
        message's own database, ``?database=``)."""
        with routing.on_alias(databases.selected(request)):
            response = self._act(request, object_id, name)
            if isinstance(response, TemplateResponse):
                response.render()
        return response

    def _act(self, request: HttpRequest, object_id: str, name: str) -> HttpResponse:
        action = ACTIONS.get(name)
        if action is None:
            raise Http404(f"No action {name!r}.")
        # The confirmation shows task names and arguments: acting needs seeing too.
        if not (self.has_view_permission(request)
                and actions.allowed(request, action.permission)):
            raise PermissionDenied
        try:
            message_id = int(object_id)
        except ValueError:
            raise Http404("Message ids are numbers.") from None
        back = reverse("admin:django_mysqlq_message_change", args=[message_id]) \
            + databases.suffix(request)
        if request.method != "POST" or (action.confirm and request.POST.get("confirmed") != "yes"):
            return self.confirmation(request, action, [message_id], bulk=False, back=back)
        done = self.run_action(request, action, [message_id])
        if action.name == "cancel" and done:
            return HttpResponseRedirect(reverse("admin:django_mysqlq_message_changelist")
                                        + databases.suffix(request))
        return HttpResponseRedirect(back)

    def run_action(self, request: HttpRequest, action: Action, ids: Sequence[int]) -> list[int]:
        priority = None
        if action.needs_priority:
            try:
                priority = int(request.POST.get("priority", ""))
            except ValueError:
                self.message_user(request, "Give the new priority as a whole number from "
                                  "-100 to 100.", messages.ERROR)
                return []
        try:
            done, skipped = actions.perform(action, ids, request, priority)
        except ValueError as exc:
            self.message_user(request, str(exc), messages.ERROR)
            return []
        if done:
            self.message_user(request, action.done.format(n=len(done)), messages.SUCCESS)
        if skipped:
            self.message_user(request, action.skipped.format(n=skipped), messages.WARNING)
        return done

    def confirmation(self, request: HttpRequest, action: Action, ids: Sequence[int], *,
                     bulk: bool, back: str) -> HttpResponse:
        context = {
            **self.admin_site.each_context(request),
            "title": f"{action.label}: are you sure?",
            "opts": self.opts,
            "action": action,
            "targets": Message.objects.using(broker.default_alias())
            .filter(pk__in=list(ids)).order_by("pk")[:100],
            "ids": list(ids),
            "missing": len(ids) - Message.objects.using(broker.default_alias())
            .filter(pk__in=list(ids)).count(),
            "bulk": bulk,
            "back": back,
            "selected_ids": actions.SELECTED_IDS,
        }
        return TemplateResponse(request, "admin/django_mysqlq/message/confirm.html", context)

    def requeue_matching(self, request: HttpRequest) -> HttpResponse:
        """"Requeue all dead matching this filter": the changelist's filters, dead only, on
        the list's database."""
        return databases.within(request, lambda: self._requeue_matching(request))

    def _requeue_matching(self, request: HttpRequest) -> HttpResponse:
        if not (self.has_view_permission(request)
                and actions.allowed(request, actions.REQUEUE)):
            raise PermissionDenied
        try:
            changelist = self.get_changelist_instance(request)
        except IncorrectLookupParameters:
            raise Http404("Unknown filter; go back to the list and filter again.") from None
        matching = changelist.get_queryset(request)
        dead = along(matching.filter(status=MessageStatus.DEAD),
                     message_ordering(request.GET, dead_only=True))
        query = request.GET.urlencode()
        back = reverse("admin:django_mysqlq_message_changelist") + (f"?{query}" if query else "")
        if request.method == "POST":  # walked by id in batches: any number, bounded statements
            done, seen = ops.requeue_dead_of(matching, actions.who(request),
                                             reset_attempts=request.POST.get("reset") == "yes")
            self.message_user(request, f"Requeued {len(done)} dead message(s) matching the "
                              "filter.", messages.SUCCESS)
            if len(done) < seen:
                self.message_user(request, f"{seen - len(done)} changed meanwhile and "
                                  "were left alone.", messages.WARNING)
            return HttpResponseRedirect(back)
        context = {
            **self.admin_site.each_context(request),
            "title": "Requeue all dead messages matching this filter?",
            "opts": self.opts,
            "count": capped_count(dead),
            "targets": dead[:20],
            "back": back,
        }
        return TemplateResponse(request, "admin/django_mysqlq/message/requeue_matching.html",
                                context)

    def changelist_view(self, request: HttpRequest,
                        extra_context: dict[str, Any] | None = None) -> HttpResponse:
        context = dict(extra_context or {})
        refused = actions.take_selection(request)
        if refused is not None:
            return refused
        query = [(k, str(v)) for k, v in request.GET.items() if k not in ("p", "o")]
        context["requeue_matching_url"] = (
            reverse("admin:django_mysqlq_message_requeue_matching")
            + (f"?{urlencode(query)}" if query else "")
        ) if actions.allowed(request, actions.REQUEUE) else None
        return super().changelist_view(request, context)


class _EntryPoint(MessageAdmin):
    """A proxy's list: the same columns and actions, one status pre-selected."""

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm("django_mysqlq.view_message")

    def changelist_view(self, request: HttpRequest,
                        extra_context: dict[str, Any] | None = None) -> HttpResponse:
        refused = actions.take_selection(request)
        if refused is not None:
            return refused
        context = dict(extra_context or {})
        context["requeue_matching_url"] = None
        return databases.within(
            request, lambda: admin.ModelAdmin.changelist_view(self, request, context))

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:
        return HttpResponseRedirect(reverse("admin:django_mysqlq_message_change",
                                            args=[object_id]) + databases.suffix(request))

    def get_urls(self) -> list[URLPattern]:
        return outside_request_transaction(admin.ModelAdmin.get_urls(self))


#: The stuck set of the request being rendered, so each row can say why it is stuck.
_stuck_now: contextvars.ContextVar[dict[int, broker.Stuck]] = contextvars.ContextVar(
    "mysqlq_stuck_now")


@admin.register(StuckMessage)
class StuckMessageAdmin(_EntryPoint):
    list_display = ["id", "queue", "task_name", "stuck_reason", "attempts_label",
                    "last_error_line", "owner", "claimed_at"]
    list_filter = [DatabaseFilter, QueueFilter, TaskFilter]

    def list_order(self, request: HttpRequest) -> IndexOrder:
        return NEWEST_FIRST  # a primary-key list of the few stuck messages

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        stuck = {s.id: s for s in databases.stuck_messages()}
        _stuck_now.set(stuck)
        return super().get_queryset(request).filter(pk__in=list(stuck))

    @admin.display(description="why stuck")
    def stuck_reason(self, obj: Message) -> str:
        stuck = _stuck_now.get({}).get(obj.pk)
        if stuck is None:
            return "-"
        return stuck.reason + ("" if stuck.releasable else " - not releasable")


@admin.register(DeadMessage)
class DeadMessageAdmin(_EntryPoint):
    list_display = ["id", "queue", "task_name", "attempts_label", "last_error_line",
                    "priority", "died", "age"]
    # Only queues and tasks that have dead messages (see filters).
    list_filter = [DatabaseFilter, DeadQueueFilter, DeadTaskFilter]

    @admin.display(description="died")
    def died(self, obj: Message) -> dt.datetime:
        return obj.run_at  # a message's death sets run_at to that moment

    def list_order(self, request: HttpRequest) -> IndexOrder:
        return message_ordering(request.GET, dead_only=True)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return super().get_queryset(request).filter(status=MessageStatus.DEAD)


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    if seconds < 172800:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"

