"""The queue box on the admin index: stuck, dead and ready counts, one click away."""

from __future__ import annotations

from typing import Any

from django import template
from django.db import DatabaseError

from .. import broker
from ..models import MessageStatus

register = template.Library()


@register.inclusion_tag("admin/django_mysqlq/index_box.html", takes_context=True)
def mysqlq_index_box(context: dict[str, Any]) -> dict[str, Any]:
    request = context.get("request")
    if request is None or not request.user.has_perm("django_mysqlq.view_message"):
        return {"show": False}
    try:
        overview = broker.queue_overview()
        stuck = len(broker.stuck_messages())
    except DatabaseError:  # the index must still render when the queue tables are missing
        return {"show": True, "error": True}
    total = {status: sum(q.counts.get(status, 0) for q in overview.values())
             for status in (MessageStatus.READY, MessageStatus.DEAD, MessageStatus.CLAIMED)}
    return {"show": True, "stuck": stuck, "dead": total[MessageStatus.DEAD],
            "ready": total[MessageStatus.READY], "claimed": total[MessageStatus.CLAIMED]}
