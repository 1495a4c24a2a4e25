"""The queue's database as Spark reaches it: from Django's ``DATABASES``, nowhere else.

The driver and the JVM read through JDBC (a ``jdbc:mysql://`` URL, so Spark applies its
MySQL dialect, served by the MariaDB Connector/J jar named in ``MYSQLQ['SPARK_JDBC_JAR']``);
Python executors write through ``MySQLdb`` with the same host, user and password.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from django.db import connections

from ...conf import get_settings
from ...routing import alias_for_queue
from .errors import PipelineError

#: Rows the JDBC driver streams per round trip (it would buffer a whole partition).
FETCH_SIZE = 10_000
#: What each JDBC connection runs first: the broker's isolation level, and a bound on
#: any one statement so a partition can never turn into a long-running read.
SESSION_INIT = ("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")


@dataclasses.dataclass(frozen=True)
class Database:
    """How Spark (JDBC) and its Python executors (``MySQLdb``) reach one Django database."""

    alias: str
    url: str
    user: str
    password: str = dataclasses.field(repr=False)
    driver: str
    #: ``MySQLdb.connect()`` arguments for executors (a plain dict: it is pickled).
    connect_args: dict[str, Any] = dataclasses.field(repr=False)

    @property
    def identity(self) -> str:
        """``host:port/name``: the database an archive root belongs to."""
        args = self.connect_args
        return (f"{args.get('unix_socket') or args.get('host')}:{args.get('port', '')}/"
                f"{args['database']}")

    def jdbc_properties(self) -> dict[str, str]:
        """Properties of every JDBC read (Spark redacts the password in plans and logs)."""
        return {"user": self.user, "password": self.password, "driver": self.driver,
                "fetchsize": str(FETCH_SIZE), "sessionInitStatement": SESSION_INIT}


def database(alias: str | None = None) -> Database:
    """The ``Database`` of a Django alias (default: the queue's, ``MYSQLQ['DATABASE']``)."""
    alias = alias or get_settings().DATABASE
    if alias not in connections.settings:
        known = ", ".join(sorted(connections.settings)) or "none"
        raise PipelineError(f"--database {alias!r} is not in DATABASES (known: {known}).")
    conf = connections[alias].settings_dict
    if "mysql" not in conf["ENGINE"]:
        raise PipelineError(f"Database {alias!r} uses {conf['ENGINE']}; the pipeline reads "
                            "MySQL or MariaDB only (django.db.backends.mysql).")
    options = dict(conf.get("OPTIONS") or {})
    host = conf.get("HOST") or "localhost"
    port = int(conf.get("PORT") or 3306)
    name = conf["NAME"]
    query = ["permitMysqlScheme"]
    connect: dict[str, Any] = {
        "user": conf.get("USER") or "", "password": conf.get("PASSWORD") or "",
        "database": name, "charset": options.get("charset", "utf8mb4"),
    }
    socket = options.get("unix_socket") or (host if host.startswith("/") else None)
    if socket:
        query.append(f"localSocket={quote(socket)}")
        connect["unix_socket"] = socket
        host = "localhost"
    else:
        connect.update(host=host, port=port)
    for key in ("ssl", "ssl_mode", "connect_timeout"):
        if key in options:
            connect[key] = options[key]
    if options.get("ssl") or options.get("ssl_mode"):
        query.append("useSsl=true")
    settings = get_settings()
    return Database(alias=alias, url=f"jdbc:mysql://{host}:{port}/{quote(name)}?"
                    + "&".join(query), user=connect["user"], password=connect["password"],
                    driver=settings.SPARK_JDBC_DRIVER, connect_args=connect)


def queues_alias(queues: Sequence[str], database_alias: str | None) -> str | None:
    """The alias a job on ``queues`` uses: ``--database``, else the queues' own alias when
    ``--queue`` names queues of one database (``MYSQLQ['QUEUES'][q]['DATABASE']`` or a
    router), else None (``MYSQLQ['DATABASE']``)."""
    if database_alias is not None or not queues:
        return database_alias
    aliases = sorted({alias_for_queue(queue) for queue in queues})
    if len(aliases) > 1:
        raise PipelineError(f"--queue names queues on several databases ({', '.join(aliases)}):"
                            " run the job once per database, each with its own queues.")
    return aliases[0]
