"""The queue dashboard, as the "Queues" entry of the admin, with pause and resume.

One page load runs a handful of indexed statements (``ops.dashboard``), with message
counts capped at ``COUNT_CAP``; the page reloads itself every ``REFRESH_SECONDS``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.http import urlencode

from .. import broker, routing, views
from ..conf import get_settings
from ..models import QueueState
from ..tasks import QUEUE_NAME_MAX
from . import actions, databases
from .listing import COUNT_CAP
from .readonly import ReadOnlyAdminMixin

if TYPE_CHECKING:
    _Base = admin.ModelAdmin[QueueState]
else:  # ModelAdmin is generic for the type checker only
    _Base = admin.ModelAdmin

REFRESH_SECONDS = 10
CHART_WIDTH, CHART_HEIGHT = 600, 120


def chart(per_minute: list[int], failures: list[int]) -> list[dict[str, float]]:
    """Bars of the throughput chart: x, height and failed height, in SVG units."""
    peak = max([*per_minute, 1])
    width = CHART_WIDTH / max(len(per_minute), 1)
    return [
        {"x": round(i * width, 1), "w": round(width - 1, 1),
         "h": round(CHART_HEIGHT * count / peak, 1),
         "y": round(CHART_HEIGHT - CHART_HEIGHT * count / peak, 1),
         "fh": round(CHART_HEIGHT * failed / peak, 1),
         "fy": round(CHART_HEIGHT - CHART_HEIGHT * failed / peak, 1),
         "count": count, "ago": len(per_minute) - 1 - i}
        for i, (count, failed) in enumerate(zip(per_minute, failures, strict=True))
    ]


def database_links(alias: str) -> dict[str, str]:
    """``db_query`` starts a link's query ("database=<alias>&"), ``db_suffix`` is a whole
    one ("?database=<alias>"): both empty on ``MYSQLQ['DATABASE']``."""
    if alias == get_settings().DATABASE:
        return {"db_query": "", "db_suffix": ""}
    query = urlencode({databases.PARAMETER: alias})
    return {"db_query": f"{query}&", "db_suffix": f"?{query}"}


@admin.register(QueueState)
class QueueDashboardAdmin(ReadOnlyAdminMixin, _Base):
    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm("django_mysqlq.view_message")

    def get_urls(self) -> list[URLPattern]:
        return [
            path("pause/", self.admin_site.admin_view(self.pause_view),
                 name="django_mysqlq_queuestate_pause"),
            *super().get_urls(),
        ]

    def changelist_view(self, request: HttpRequest,
                        extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        alias = databases.selected(request)
        [view] = views.dashboards(count_cap=COUNT_CAP, only=alias)
        data = view.dashboard
        aliases = routing.queue_aliases()
        context = {
            "database": alias if len(aliases) > 1 or view.lag is not None else "",
            "databases": aliases if len(aliases) > 1 else (),
            "read_from": view.read,
            "replica_lag": view.lag,
            # The links to lists with a database filter, and the refresh links, keep it.
            **database_links(alias),
            **self.admin_site.each_context(request),
            "title": "Queue dashboard",
            "opts": self.opts,
            "data": data,
            "bars": chart(data.per_minute, data.failures_per_minute),
            "chart_width": CHART_WIDTH,
            "chart_height": CHART_HEIGHT,
            "refresh": 0 if request.GET.get("refresh") == "0" else REFRESH_SECONDS,
            "can_pause": actions.allowed(request, actions.PAUSE),
            "messages_url": reverse("admin:django_mysqlq_message_changelist"),
            "blocked_url": reverse("admin:django_mysqlq_blockedmessage_changelist"),
            **(extra_context or {}),
        }
        return TemplateResponse(request, "admin/django_mysqlq/queuestate/dashboard.html",
                                context)

    def pause_view(self, request: HttpRequest) -> HttpResponse:
        """POST queue=<name>, paused=1|0: workers follow within about a second."""
        if not actions.allowed(request, actions.PAUSE):
            raise PermissionDenied
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        queue = request.POST.get("queue", "")
        paused = request.POST.get("paused") == "1"
        if not queue or len(queue) > QUEUE_NAME_MAX:
            self.message_user(request, "Give the name of the queue to pause or resume.",
                              messages.ERROR)
        else:
            broker.set_paused(queue, paused, actions.who(request))
            self.message_user(request, f"Queue {queue} {'paused' if paused else 'resumed'}: "
                              "workers follow within about a second.", messages.SUCCESS)
        alias = routing.alias_for_queue(queue) if queue else get_settings().DATABASE
        back = reverse("admin:django_mysqlq_queuestate_changelist")
        return HttpResponseRedirect(back if alias == get_settings().DATABASE
                                    else f"{back}?{databases.PARAMETER}={alias}")
