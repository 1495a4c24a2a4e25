"""Consumer groups in the admin: position, lag (messages, oldest unhandled), dead letter
(a link to the dead messages of the group's task, requeueable there), and the operator
actions: reset to an offset, a time, the earliest or latest message; replay a range.

Both actions need the ``change_topicgroup`` permission, a POST, and are recorded on the
group's row (``changed_at``, ``changed_by``) and logged by the broker.
"""

from __future__ import annotations

import contextvars
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.http import urlencode

from .. import broker, ops, topicops
from ..limits import row_id
from ..models import TopicGroup
from ..topicnames import delivery_task_name
from . import actions, databases
from .databases import DatabaseMixin
from .readonly import ReadOnlyAdminMixin
from .topics import TopicFilter, can_view

if TYPE_CHECKING:
    _Base = admin.ModelAdmin[TopicGroup]
else:  # ModelAdmin is generic for the type checker only
    _Base = admin.ModelAdmin

#: Reset and replay need this (a default permission of the model: no migration).
CHANGE_GROUP = "change_topicgroup"

#: The lag of the groups on the page being rendered (one read per page).
_states_now: contextvars.ContextVar[dict[tuple[str, str], broker.GroupState]] = \
    contextvars.ContextVar("mysqlq_group_states_now")


#: The bulk reset reads the selected groups this many at a time (walked by id); up to
#: this many selected, each reset gets its own message, more get one that counts them
#: (a refusal always has its own).
BULK_BATCH = 100
SAY_EACH = 10


def _bulk_reset(edge: str) -> Any:
    def run(modeladmin: TopicGroupAdmin, request: HttpRequest,
            queryset: QuerySet[Any]) -> None:
        """Reset every selected group (it reset only the first 100, silently)."""
        target = broker.ResetTarget(edge=edge)
        say_each = queryset.count() <= SAY_EACH
        reset = cancelled = last = 0
        skipped: list[broker.ResetResult] = []  # the resets that skipped some
        while batch := list(queryset.filter(pk__gt=last).order_by("pk")[:BULK_BATCH]):
            for row in batch:
                done = modeladmin.reset(request, row, target, say=say_each)
                if done is not None:
                    reset, cancelled = reset + 1, cancelled + done.cancelled
                    skipped += [done] if done.skipped else []
            last = batch[-1].pk
        if reset and not say_each:
            modeladmin.message_user(request, f"{reset} groups reset to the {edge} message; "
                                    f"{cancelled} waiting deliveries cancelled"
                                    f"{_skipped_in_bulk(skipped)}.",
                                    messages.WARNING if skipped else messages.SUCCESS)

    run.__name__ = f"reset_{edge}"
    return admin.action(description=f"Reset to the {edge} message (selected groups)",
                        permissions=["reset"])(run)


def _skipped_in_bulk(skipped: list[broker.ResetResult]) -> str:
    """What the bulk reset's one message adds when some groups' cancelled deliveries were
    at offsets at or before their new position (they will not run): how many, and the
    groups (the first :data:`SAY_EACH`; the log names each)."""
    if not skipped:
        return ""

    def at(done: broker.ResetResult) -> str:
        bounds = done.skipped_offsets
        gone = (f", {done.skipped_gone} of them deleted by retention (no replay brings "
                "those back)" if done.skipped_gone else "")
        if bounds is None:  # retention deleted all their messages
            return gone
        where = (f" at offset {bounds[0]}" if bounds[0] == bounds[1] else
                 f" at offsets {bounds[0]}-{bounds[1]}")
        if done.skipped_gaps:
            where += (", not every one between: a replay of the range runs its other "
                      "offsets again too")
        return where + gone

    named = [f"{done.topic} / {done.group}: {done.skipped}{at(done)}"
             for done in skipped[:SAY_EACH]]
    more = (f"; and {len(skipped) - SAY_EACH} more groups, which the log names"
            if len(skipped) > SAY_EACH else "")
    return (f": {sum(done.skipped for done in skipped)} of them were before their group's "
            f"new position and will not run ({', '.join(named)}{more}); replay them from "
            "each group's page if they should")


@admin.register(TopicGroup)
class TopicGroupAdmin(DatabaseMixin, ReadOnlyAdminMixin, _Base):
    list_display = ("topic", "group_name", "position", "last_offset", "lag", "oldest",
                    "dead_letter", "pumped_at", "pump", "changed")
    list_filter = (TopicFilter,)
    ordering = ("topic", "group_name")
    actions = [_bulk_reset("earliest"), _bulk_reset("latest")]
    change_form_template = "admin/django_mysqlq/topicgroup/change_form.html"
    fields = ("topic", "group_name", "queue", "start", "position", "created_at",
              "pumped_at", "pump_problem", "pump_problem_at", "changed_at", "changed_by",
              "moved_forward_at", "moved_forward_by")
    readonly_fields = fields

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return can_view(request)

    def has_reset_permission(self, request: HttpRequest) -> bool:
        return actions.allowed(request, CHANGE_GROUP)

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        changelist = super().get_changelist_instance(request)
        topics = {row.topic for row in changelist.result_list}
        states: dict[tuple[str, str], broker.GroupState] = {}
        for topic in topics:
            states.update({(s.topic, s.group): s for s in broker.groups(topic)})
        _states_now.set(states)
        return changelist

    def _state(self, obj: TopicGroup) -> broker.GroupState | None:
        return _states_now.get({}).get((obj.topic, obj.group_name))

    @admin.display(description="last offset")
    def last_offset(self, obj: TopicGroup) -> str:
        state = self._state(obj)
        return "-" if state is None else str(state.last_offset)

    @admin.display(description="lag (messages)")
    def lag(self, obj: TopicGroup) -> str:
        state = self._state(obj)
        if state is None:
            return "-"
        shown = f"{state.lag:,}+" if state.unsequenced_capped else f"{state.lag:,}"
        return f"{shown} (past end)" if state.past_end is not None else shown

    @admin.display(description="oldest unhandled")
    def oldest(self, obj: TopicGroup) -> str:
        state = self._state(obj)
        if state is None or state.oldest_age_seconds is None:
            return "-"
        if state.oldest_unhandled is None:  # not given an offset yet
            return f"{state.oldest_age_seconds:.0f}s"
        return f"#{state.oldest_unhandled}, {state.oldest_age_seconds:.0f}s"

    @admin.display(description="dead letter")
    def dead_letter(self, obj: TopicGroup) -> str:
        state = self._state(obj)
        count = 0 if state is None else state.dead
        url = reverse("admin:django_mysqlq_deadmessage_changelist") + "?" + urlencode(
            {"task": delivery_task_name(obj.topic, obj.group_name)})
        return format_html('<a class="dead-letter" href="{}">{}</a>', url, count)

    @admin.display(description="pump")
    def pump(self, obj: TopicGroup) -> str:
        """"ok", or "stopped" with what a member said (the whole of it on the group's
        page and in ``queuetopic groups``); "past the end" for a position past its
        topic's end that no member has set back yet."""
        state = self._state(obj)
        if not obj.pump_problem and state is not None and state.position_problem:
            return format_html('<span class="position-problem errornote" title="{}">past the '
                               'end: position {} &gt; last offset {}</span>',
                               state.position_problem, state.position, state.past_end)
        if not obj.pump_problem:
            return "ok"
        short = obj.pump_problem if len(obj.pump_problem) <= 80 else obj.pump_problem[:79] + "…"
        return format_html('<span class="pump-problem errornote" title="{}">stopped: {}</span>',
                           obj.pump_problem, short)

    @admin.display(description="changed by an operator")
    def changed(self, obj: TopicGroup) -> str:
        if obj.changed_at is None:
            return "-"
        return f"{obj.changed_at:%Y-%m-%d %H:%M:%S} by {obj.changed_by}"

    # ------------------------------------------------------------- pages

    def get_urls(self) -> list[URLPattern]:
        return actions.outside_request_transaction([
            path("<path:object_id>/operate/", self.admin_site.admin_view(self.operate),
                 name="django_mysqlq_topicgroup_operate"),
            *super().get_urls(),
        ])

    def change_context(self, request: HttpRequest, object_id: str) -> dict[str, Any]:
        row = self._row(object_id)
        found = broker.groups(row.topic, row.group_name)
        return {
            "state": found[0] if found else None,
            "can_operate": actions.allowed(request, CHANGE_GROUP),
            "operate_url": reverse("admin:django_mysqlq_topicgroup_operate", args=[row.pk])
            + databases.suffix(request),
            "dead_url": reverse("admin:django_mysqlq_deadmessage_changelist") + "?" + urlencode(
                {"task": delivery_task_name(row.topic, row.group_name)}),
            "messages_url": reverse("admin:django_mysqlq_topicmessage_changelist") + "?"
            + urlencode({"topic": row.topic}),
        }

    def _row(self, object_id: str) -> TopicGroup:
        found = row_id(object_id)
        row = TopicGroup.objects.filter(pk=found).first() if found is not None else None
        if row is None:
            raise Http404("No such consumer group.")
        return row

    def operate(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """POST op=reset (to=offset|time|earliest|latest, value) or op=replay (first, last),
        with the page's database bound (``?database=``, else ``MYSQLQ['DATABASE']``): the
        group's row is read and reset there, as the page showed it."""
        return databases.within(request, lambda: self._operate(request, object_id))

    def _operate(self, request: HttpRequest, object_id: str) -> HttpResponse:
        if not (self.has_view_permission(request) and actions.allowed(request, CHANGE_GROUP)):
            raise PermissionDenied
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        row = self._row(object_id)
        back = reverse("admin:django_mysqlq_topicgroup_change", args=[row.pk]) \
            + databases.suffix(request)
        post = request.POST
        try:
            if post.get("op") == "replay":
                done = topicops.replay(row.topic, row.group_name, *_range(
                    post.get("first", ""), post.get("last", "")), actions.who(request))
                shortfall = topicops.replay_shortfall(done)
                self.message_user(request, f"Replayed offsets {done.first}..{done.last} into "
                                  f"group {done.group}: {done.replayed} new deliveries."
                                  + (f" {shortfall}" if shortfall else ""),
                                  messages.WARNING if shortfall else messages.SUCCESS)
            else:
                self.reset(request, row, _target(post.get("to", ""), post.get("value", "")))
        except (ValueError, LookupError) as exc:
            self.message_user(request, str(exc), messages.ERROR)
        return HttpResponseRedirect(back)

    def reset(self, request: HttpRequest, row: TopicGroup, target: broker.ResetTarget,
              say: bool = True) -> broker.ResetResult | None:
        """Reset the group and say how (``say``; a refusal always); None if refused."""
        try:  # a refusal names the other targets in the form's words
            done = topicops.reset(row.topic, row.group_name, target, actions.who(request),
                                  names=broker.topic_ops.TARGET_NAMES)
        except (ValueError, LookupError) as exc:
            self.message_user(request, f"{row.topic} / {row.group_name}: {exc}", messages.ERROR)
            return None
        if not say:
            return done
        summary = topicops.reset_summary(done, target)
        cancelled = topicops.reset_cancelled(
            done, lambda first, last: f"the replay form of the group's page (from {first} "
            f"to {last})")
        self.message_user(request, f"Group {done.group} of {done.topic} reset to "
                          f"{target.describe()}: position {done.old_position} -> "
                          f"{done.new_position}; {cancelled}" + (f" {summary}" if summary
                                                               else ""),
                          messages.WARNING if done.skipped else messages.SUCCESS)
        return done


def _range(first: str, last: str) -> tuple[int, int]:
    try:
        return int(first), int(last)
    except ValueError:
        raise ValueError(f"Give the first and last offsets of a replay as whole numbers, "
                         f"not {first!r} and {last!r}.") from None


def _target(kind: str, value: str) -> broker.ResetTarget:
    if kind in ("earliest", "latest"):
        return broker.ResetTarget(edge=kind)
    if kind == "offset":
        try:
            return broker.ResetTarget(to_offset=int(value))
        except ValueError:
            raise ValueError(f"Give the offset as a whole number, not {value!r}.") from None
    if kind == "time":  # as queuetopic reset --to-time: a duration ago (2h) or ISO
        try:
            return broker.ResetTarget(to_time=ops.parse_since(value.strip()))
        except ValueError as exc:
            raise ValueError(f"Reset to a time: {exc}.") from None
    raise ValueError("Reset to an offset, a time, the earliest or the latest message.")
