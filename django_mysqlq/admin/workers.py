"""Workers admin: who is running, where, and whether its heartbeat is fresh."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from .. import broker
from ..conf import get_settings
from ..models import Worker
from .databases import DatabaseFilter, DatabaseMixin
from .readonly import ReadOnlyAdminMixin

if TYPE_CHECKING:
    _Base = admin.ModelAdmin[Worker]
else:  # ModelAdmin is generic for the type checker only
    _Base = admin.ModelAdmin


def _fresh_since() -> dt.datetime:
    return broker.database_now() - dt.timedelta(seconds=get_settings().LEASE_SECONDS)


class AliveFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("alive", "alive"), ("stale", "stale (no heartbeat within a lease)"),
                ("stopped", "stopped")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        fresh = _fresh_since()
        if self.value() == "alive":
            return queryset.filter(stopped_at__isnull=True, last_heartbeat__gt=fresh)
        if self.value() == "stale":
            return queryset.filter(stopped_at__isnull=True, last_heartbeat__lte=fresh)
        if self.value() == "stopped":
            return queryset.filter(stopped_at__isnull=False)
        return queryset


@admin.register(Worker)
class WorkerAdmin(DatabaseMixin, ReadOnlyAdminMixin, _Base):
    list_display = ("id", "state", "host", "pid", "queues", "concurrency", "started_at",
                    "last_heartbeat", "processed", "failed", "trouble")
    list_filter = (DatabaseFilter, AliveFilter, "host")
    search_fields = ("id", "host", "=pid")
    ordering = ("-last_heartbeat",)

    @admin.display(description="troubles")
    def trouble(self, obj: Worker) -> str:
        """The first thing failing in it (all of them on the worker's page), or '-'."""
        if not obj.troubles or obj.stopped_at is not None:
            return "-"
        lines = obj.troubles.split("\n")
        more = f" (and {len(lines) - 1} more)" if len(lines) > 1 else ""
        return f"{lines[0]}{more}"

    @admin.display(description="state")
    def state(self, obj: Worker) -> str:
        if obj.stopped_at is not None:
            return "stopped"
        if obj.last_heartbeat is None:  # a zero date changed by hand (the driver reads None)
            return "stale"
        return "alive" if obj.last_heartbeat > _fresh_since() else "stale"
