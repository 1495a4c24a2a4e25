"""The operator's view over every queue database: one dashboard per alias that holds
queues, each read where ``MYSQLQ['READ_DATABASE']`` says (a replica), with that replica's
lag. The admin's dashboard and ``queuestats`` show these; nothing here writes."""

from __future__ import annotations

import dataclasses

from . import broker, ops, routing
from .broker.replica import ReplicaLag, replica_lag


@dataclasses.dataclass(frozen=True)
class DatabaseView:
    """One queue database's dashboard."""

    #: The alias that holds the queues (claims, acks, operator actions go there).
    alias: str
    #: The alias it was read from: ``alias``, or its replica.
    read: str
    dashboard: ops.Dashboard
    #: The replica's lag when ``read`` is a replica; None when read from ``alias`` itself.
    lag: ReplicaLag | None

    @property
    def title(self) -> str:
        where = f"database {self.alias}"
        if self.lag is not None:
            where += f" (read from {self.lag.describe()})"
        return where

    def as_json(self) -> dict[str, object]:
        return {"database": self.alias, "read_from": self.read,
                "replica_lag": self.lag.as_json() if self.lag is not None else None,
                **self.dashboard.as_json()}


def dashboards(top: int = 10, count_cap: int | None = None,
               only: str | None = None) -> list[DatabaseView]:
    """The dashboard of every queue database (or of ``only``), ``MYSQLQ['DATABASE']``
    first."""
    views = []
    for alias in (only,) if only else routing.queue_aliases():
        read = routing.read_alias(alias)
        lag = replica_lag(read) if read != alias else None
        with broker.on_alias(read):
            data = ops.dashboard(top, count_cap, queue_alias=alias)
        views.append(DatabaseView(alias, read, data, lag))
    return views
