"""Topics in the admin: the topics list (volume, last publish) and the topic messages
list with its lookups (topic + offset, key or publish time) and a message's trace: which
groups handled it, when, on which worker, with which outcome (replays marked)."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, QueryDict
from django.urls import reverse
from django.utils.html import format_html
from django.utils.http import urlencode

from .. import broker, ops
from ..limits import row_id
from ..models import TopicMessage, TopicState
from . import payloads
from .databases import DatabaseMixin
from .filters import MAX_CHOICES
from .listing import CappedPaginator, given, without_blank
from .readonly import ReadOnlyAdminMixin

if TYPE_CHECKING:
    _TopicBase = admin.ModelAdmin[TopicState]
    _MessageBase = admin.ModelAdmin[TopicMessage]
else:  # ModelAdmin is generic for the type checker only
    _TopicBase = _MessageBase = admin.ModelAdmin


#: The lookup's publish-time fields and what the page calls them.
TIME_FIELDS = {"published_at__gte": "Published from", "published_at__lt": "until"}


def can_view(request: HttpRequest) -> bool:
    return request.user.has_perm("django_mysqlq.view_message")


@admin.register(TopicState)
class TopicStateAdmin(DatabaseMixin, ReadOnlyAdminMixin, _TopicBase):
    list_display = ("name", "last_offset", "first_offset", "kept", "sequenced_at",
                    "created_at", "links")
    ordering = ("name",)
    search_fields = ("=name",)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return can_view(request)

    @admin.display(description="messages kept")
    def kept(self, obj: TopicState) -> int:
        return max(0, obj.last_offset - obj.first_offset + 1)

    @admin.display(description="")
    def links(self, obj: TopicState) -> str:
        query = urlencode({"topic": obj.name})
        return format_html('<a href="{}?{}">groups</a> · <a href="{}?{}">messages</a>',
                           reverse("admin:django_mysqlq_topicgroup_changelist"), query,
                           reverse("admin:django_mysqlq_topicmessage_changelist"), query)


class TopicFilter(admin.SimpleListFilter):
    title = "topic"
    parameter_name = "topic"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        names = TopicState.objects.order_by("name").values_list("name", flat=True)
        return [(name, name) for name in names[:MAX_CHOICES]]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(topic=self.value()) if self.value() else queryset


@admin.register(TopicMessage)
class TopicMessageAdmin(DatabaseMixin, ReadOnlyAdminMixin, _MessageBase):
    """Look messages up: ``?topic=orders`` and ``offset=N``, ``key=K`` or
    ``published_at__gte=…&published_at__lt=…`` (each one index range, read a page at a
    time with a capped count)."""

    list_display = ("id", "topic", "offset", "key", "published_at", "payload_start")
    list_filter = (TopicFilter,)
    sortable_by = ()
    list_per_page = 50
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    paginator = CappedPaginator
    change_list_template = "admin/django_mysqlq/topicmessage/change_list.html"
    change_form_template = "admin/django_mysqlq/topicmessage/change_form.html"
    fields = ("id", "topic", "offset", "key", "published_at", "sequenced_at", "payload_text")
    readonly_fields = fields
    #: The lookup form's fields: a blank one is no lookup (the form sends them all).
    lookup_fields = ("topic", "offset", "key", "published_at__gte", "published_at__lt")

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return can_view(request)

    def changelist_view(self, request: HttpRequest,
                        extra_context: dict[str, Any] | None = None) -> HttpResponse:
        """Drop the form's blank fields before the changelist reads them as filters (here,
        not in the page, so a hand-written ``?offset=&key=k`` works too)."""
        params, refused = utc_times(without_blank(request.GET, self.lookup_fields))
        for message in refused:
            self.message_user(request, message, messages.ERROR)
        request.GET = params  # type: ignore[assignment]
        return super().changelist_view(request, extra_context)

    def get_ordering(self, request: HttpRequest) -> tuple[str, ...]:
        if given(request.GET, "topic"):
            if given(request.GET, "key"):
                return ("-offset",)  # mysqlq_tmsg_key (topic, key, offset), newest first
            if given(request.GET, "published_at__gte", "published_at__lt"):
                return ("published_at", "id")  # mysqlq_tmsg_published
            return ("-offset",)  # mysqlq_tmsg_offset
        return ("-id",)

    @admin.display(description="payload")
    def payload_start(self, obj: TopicMessage) -> str:
        return obj.payload[:100] + ("\u2026" if len(obj.payload) > 100 else "")

    @admin.display(description="payload")
    def payload_text(self, obj: TopicMessage) -> str:
        return payloads.json_block(
            obj.payload, deep_advice="handlers can't get it either: a group's delivery of it goes "
            "dead at once (then its on_dead applies), broadcast listeners skip it")

    def change_context(self, request: HttpRequest, object_id: str) -> dict[str, Any]:
        pk = row_id(object_id)
        message = TopicMessage.objects.filter(pk=pk).first() if pk is not None else None
        deliveries: list[dict[str, Any]] = []
        missing: list[broker.NoDelivery] = []
        if message is not None and message.offset is not None:
            traces = broker.trace(message.topic, [message.offset])
            found = traces.get(message.offset, [])
            deliveries = [{"d": d, "replay": d.replay} for d in found]
            sequenced = {message.offset: message.sequenced_at}
            missing = broker.without_delivery(message.topic, sequenced, traces)[message.offset]
        return {"deliveries": deliveries, "no_delivery": missing}


def utc_times(params: QueryDict) -> tuple[QueryDict, list[str]]:
    """``params`` with its publish times read as ``queuetopic lookup --since`` reads them
    (a duration ago, ``2h``, or an ISO time, UTC without an offset) and written with
    their offset, ``+00:00``; and what was refused, each dropped from the lookup. The
    changelist would read a naive time in ``TIME_ZONE``: an hour or more from the CLI's."""
    if not any(name in params for name in TIME_FIELDS):
        return params, []
    kept, refused = params.copy(), []
    for name, label in TIME_FIELDS.items():
        if name not in params:
            continue
        value = str(params.get(name, "")).strip()
        try:
            kept[name] = ops.parse_since(value).astimezone(dt.UTC).isoformat(sep=" ")
        except ValueError as exc:
            kept.pop(name)
            refused.append(f"{label} {value!r} is not applied: {exc}.")
    kept._mutable = False
    return kept, refused
