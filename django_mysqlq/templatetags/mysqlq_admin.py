"""The queue box on the admin index (stuck, dead and ready counts, one click away), the
count filter of the dashboard, and the lists' count format."""

from __future__ import annotations

from typing import Any

from django import template
from django.db import DatabaseError

from .. import broker
from ..admin.listing import COUNT_CAP, Count
from ..models import MessageStatus
from ..ops import QueueStats

register = template.Library()


@register.inclusion_tag("admin/django_mysqlq/index_box.html", takes_context=True)
def mysqlq_index_box(context: dict[str, Any]) -> dict[str, Any]:
    request = context.get("request")
    if request is None or not request.user.has_perm("django_mysqlq.view_message"):
        return {"show": False}
    try:
        # Capped: the index renders on every admin visit, at any backlog.
        counts = broker.status_counts(
            [MessageStatus.READY, MessageStatus.DEAD, MessageStatus.CLAIMED,
             MessageStatus.BLOCKED], COUNT_CAP)
        stuck = len(broker.stuck_messages())
    except DatabaseError:  # the index must still render when the queue tables are missing
        return {"show": True, "error": True}
    shown = {status: Count(*counts[status]) for status in counts}
    return {"show": True, "stuck": Count(stuck), "dead": shown[MessageStatus.DEAD],
            "ready": shown[MessageStatus.READY], "claimed": shown[MessageStatus.CLAIMED],
            "blocked": shown[MessageStatus.BLOCKED]}


@register.filter
def count_of(stats: QueueStats, status: str) -> str:
    """A dashboard row's count of ``status``: "10,000+" when it stopped at the cap."""
    return str(Count(getattr(stats, status), status in stats.capped))


@register.filter
def thousands(value: Any) -> str:
    """A whole number with thousands separators ("10,000"), as every count of the queue's
    pages says it (a capped :class:`~django_mysqlq.admin.listing.Count` too), whatever
    ``USE_THOUSAND_SEPARATOR`` says; anything else as it is."""
    try:
        return f"{int(value):,}"
    except (TypeError, ValueError):
        return str(value)
