"""Test rig: a worker process that notes, at each of its claims, whether its row says parked.

Loaded by tests/settings.py in a worker subprocess when ``MYSQLQ_TEST_CLAIM_WATCH`` names a
file: before each claim statement of the process (the plain claim, the claim by ids, the
throttled claim: ``SET status = 'claimed', claim_token``), the same connection reads
whether the worker's row says it listens there (parked, for producers' wake-ups to
``KILL QUERY`` it), and the file gets a line ``listening=<0|1>``; every other statement
of the process gets a line ``-``, so the file also counts them
(tests/test_parked_claims.py). Test code only: the library is not patched; the statement
is observed through Django's own ``execute_wrapper`` hook.
"""

from __future__ import annotations

import os
import re
from typing import Any

from django.db.backends.signals import connection_created

CLAIM = re.compile(r"SET\s+status\s*=\s*'claimed',\s*claim_token")
LISTENING_SQL = ("SELECT COUNT(*) FROM mysqlq_worker "
                 "WHERE listening = 1 AND connection_id = CONNECTION_ID()")


def _watch(path: str) -> Any:
    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        line = "-"
        if CLAIM.search(sql):
            cursor = context["cursor"].cursor  # the driver's: past the wrappers
            cursor.execute(LISTENING_SQL)
            (listening,) = cursor.fetchone()
            line = f"listening={int(listening)}"
        with open(path, "a") as out:
            out.write(f"{line}\n")
        return execute(sql, params, many, context)
    return wrapper


def install() -> None:
    wrapper = _watch(os.environ["MYSQLQ_TEST_CLAIM_WATCH"])

    def hook(sender: Any, connection: Any, **kwargs: Any) -> None:
        if wrapper not in connection.execute_wrappers:
            connection.execute_wrappers.append(wrapper)

    connection_created.connect(hook, weak=False)
