"""Database errors no retry can fix: the worker exits at once and says what to do.

A worker started before ``migrate`` would otherwise retry its registration forever, and a
``--burst`` job would never end. Which errors end a worker:

* the queue's tables, columns or indexes are missing (``broker.SCHEMA_ERRORS``):
  always, at start or later, daemon or ``--burst``;
* the database is unknown, or the login or a grant is refused (``broker.SETUP_ERRORS``):
  at start, and at any time in ``--burst``. A daemon that already ran rides them out like
  an outage, logging an ERROR each time: a password or grant being changed under it is
  fixed without restarting every worker.
"""

from __future__ import annotations

import re

from django.conf import settings

from .. import broker
from ..conf import get_settings
from ..exceptions import WorkerCannotRun

#: Exit status of a worker the database can't serve until someone acts (``EX_CONFIG``).
EXIT_CANNOT_RUN = 78

#: The attribute :func:`ran_on` sets on an error: the alias its statements ran on.
_ALIAS_NOTE = "mysqlq_alias"
#: A topic table in the server's text: those live on ``MYSQLQ['DATABASE']`` only.
_TOPIC_TABLE = re.compile(r"\bmysqlq_topic(?:_[a-z]+)?\b")


def ran_on(exc: BaseException, alias: str) -> None:
    """Note that ``exc`` came from statements on ``alias``, not this thread's database
    (the topics' database, from a worker of another one), for :func:`describe`."""
    if not hasattr(exc, _ALIAS_NOTE):
        setattr(exc, _ALIAS_NOTE, alias)


def _alias_of(exc: BaseException, server_text: str, fallback: str | None) -> str:
    """The alias whose tables or login failed: the one noted on the error, the topics'
    for a topic table, else ``fallback`` (a command's ``--database``), else this
    thread's (a worker's own database)."""
    noted = getattr(exc, _ALIAS_NOTE, None)
    if isinstance(noted, str):
        return noted
    if _TOPIC_TABLE.search(server_text):
        return get_settings().DATABASE
    return fallback or broker.default_alias()


def _migrate_command(alias: str) -> str:
    return "manage.py migrate" + ("" if alias == "default" else f" --database {alias}")


def describe(exc: BaseException, then: str = "start the worker again",
             database: str | None = None) -> str | None:
    """What is wrong and what to do, for an error no retry can fix; None for any other.
    ``then`` ends the advice after a migrate (a command says "run this command again");
    ``database``: the alias the statements ran on when the caller knows it (a command's
    ``--database``: its error arrives after the command left that database)."""
    code = broker.error_code(exc)
    if code is None or not (broker.is_schema_error(exc) or broker.is_setup_error(exc)):
        return None
    server_text = str(exc.args[1]) if len(exc.args) > 1 else str(exc)
    alias = _alias_of(exc, server_text, database)
    what = f"(error {code}: {server_text})"
    settings_dict = settings.DATABASES.get(alias, {})
    name = settings_dict.get("NAME", "?")
    if code == 1146:
        return (f"The queue's tables are missing from database {name!r} {what}: run "
                f"`{_migrate_command(alias)}` then {then}.")
    if code in (1054, 1176):
        return (f"The queue's tables in database {name!r} are older than this code {what}: "
                f"run `{_migrate_command(alias)}` then {then}.")
    if code == 1049:
        return (f"Database {name!r} does not exist on the server {what}: create it (or fix "
                f"DATABASES[{alias!r}]['NAME']), then run `{_migrate_command(alias)}`.")
    if code in (1142, 1143):
        return (f"The database user lacks a privilege the worker needs {what}: grant it "
                f"SELECT, INSERT, UPDATE and DELETE on the queue's tables in {name!r}.")
    return (f"The database server refused the login or the database {what}: check USER, "
            f"PASSWORD and HOST in DATABASES[{alias!r}] and the user's grants on {name!r}.")


def check(exc: BaseException, *, started: bool, burst: bool) -> None:
    """Raise ``WorkerCannotRun`` if ``exc`` must end the worker (see the module's rules)."""
    problem = describe(exc)
    if problem is None:
        return
    if broker.is_schema_error(exc) or not started or burst:
        raise WorkerCannotRun(problem, EXIT_CANNOT_RUN) from exc
