"""Rate-limit keys in the admin: each key's limit, when its next message may start, and
how many wait throttled for it (read-only: the rows are the workers' bookkeeping)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from django.contrib import admin
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from ..models import Message, MessageStatus, RateLimit
from . import databases
from .databases import DatabaseFilter, DatabaseMixin
from .listing import Count
from .readonly import ReadOnlyAdminMixin

if TYPE_CHECKING:
    _Base = admin.ModelAdmin[RateLimit]
else:  # ModelAdmin is generic for the type checker only
    _Base = admin.ModelAdmin

#: Throttled messages counted per key at most (a count walks the key's index entries).
COUNT_CAP = 10_000


@admin.register(RateLimit)
class RateLimitAdmin(DatabaseMixin, ReadOnlyAdminMixin, _Base):
    list_display = ("rate_key", "queue", "rate_limit", "next_start", "waiting")
    list_filter = (DatabaseFilter, "queue")
    search_fields = ("=rate_key",)
    ordering = ("next_at",)
    list_per_page = 50
    readonly_fields = ("queue", "rate_key", "rate_limit", "next_start", "waiting",
                       "changed_at")
    fields = readonly_fields

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm("django_mysqlq.view_ratelimit") or \
            request.user.has_perm("django_mysqlq.view_message")

    @admin.display(description="next start may be", ordering="next_at")
    def next_start(self, obj: RateLimit) -> str:
        left = (obj.next_at - timezone.now()).total_seconds()
        return "now" if left <= 0 else f"in {left:.1f}s ({obj.next_at:%H:%M:%S} UTC)"

    @admin.display(description="throttled messages")
    def waiting(self, obj: RateLimit) -> str:
        count = len(Message.objects.filter(rate_key=obj.rate_key, queue=obj.queue,
                                           status=MessageStatus.THROTTLED)
                    .values_list("pk", flat=True)[:COUNT_CAP])
        shown = str(Count(count, capped=count == COUNT_CAP))  # "10,000+"
        return format_html('<a href="{}?{}">{}</a>', reverse(
            "admin:django_mysqlq_message_changelist"), throttled_query(obj), shown)


def throttled_query(obj: RateLimit) -> str:
    """The messages list's query for the key's throttled messages, on the page's database:
    filters, not a search (the search box reads a number as an id and a task-wide key as
    its task's every message)."""
    return urlencode({**databases.shown_parameters(), "queue": obj.queue,
                      "status__exact": MessageStatus.THROTTLED, "rate_key": obj.rate_key})
