"""How far a read replica is behind (``MYSQLQ['READ_DATABASE']``): what the dashboard and
``queuestats`` show beside counts read there.

``SHOW SLAVE STATUS`` (MariaDB; ``SHOW REPLICA STATUS`` on MySQL 8.0.22+) needs the
``SLAVE MONITOR`` / ``REPLICATION CLIENT`` privilege. When it can't be read, or the alias
is no replica at all, the lag is unknown and said so (never shown as 0).
"""

from __future__ import annotations

import dataclasses

from django.db import DatabaseError

from .base import connection_for

REPLICA_STATUS_SQL = "SHOW SLAVE STATUS"
REPLICA_STATUS_SQL_MYSQL = "SHOW REPLICA STATUS"


@dataclasses.dataclass(frozen=True)
class ReplicaLag:
    """The replica's delay behind its source, or why it is unknown."""

    alias: str
    #: Seconds behind the source (``Seconds_Behind_Master``); None: unknown (``problem``).
    seconds: int | None
    #: Why ``seconds`` is None: not a replica, replication stopped, no privilege.
    problem: str = ""

    def describe(self) -> str:
        if self.seconds is not None:
            return f"replica {self.alias}: {self.seconds}s behind"
        return f"replica {self.alias}: lag unknown ({self.problem})"

    def as_json(self) -> dict[str, object]:
        return {"alias": self.alias, "seconds": self.seconds, "problem": self.problem}


def replica_lag(alias: str) -> ReplicaLag:
    """Read the replication status of the server behind ``alias``."""
    connection = connection_for(alias)
    try:
        with connection.cursor() as cursor:
            mariadb = connection.mysql_is_mariadb  # type: ignore[attr-defined]
            cursor.execute(REPLICA_STATUS_SQL if mariadb else REPLICA_STATUS_SQL_MYSQL)
            names = [column[0] for column in cursor.description or ()]
            row = cursor.fetchone()
    except DatabaseError as exc:
        return ReplicaLag(alias, None, f"can't read the replication status: {exc.args[-1]}; "
                          "grant SLAVE MONITOR (MariaDB) or REPLICATION CLIENT (MySQL)")
    if row is None:
        return ReplicaLag(alias, None, "not a replica: it replicates from no source")
    status = dict(zip(names, row, strict=False))
    sql_running = status.get("Slave_SQL_Running", status.get("Replica_SQL_Running"))
    io_running = status.get("Slave_IO_Running", status.get("Replica_IO_Running"))
    if sql_running != "Yes" or io_running != "Yes":
        error = status.get("Last_SQL_Error") or status.get("Last_IO_Error") or ""
        return ReplicaLag(alias, None, f"replication is stopped (IO {io_running}, SQL "
                          f"{sql_running}){': ' + str(error)[:200] if error else ''}")
    behind = status.get("Seconds_Behind_Master", status.get("Seconds_Behind_Source"))
    if behind is None:
        return ReplicaLag(alias, None, "the server does not say how far behind it is")
    return ReplicaLag(alias, int(behind))
