"""Test rig: a worker process that stops dead inside one of its own transactions.

Loaded by tests/settings.py in a worker subprocess when ``MYSQLQ_TEST_STALL_AT`` is set
(a regular expression). The first statement of the process whose SQL matches it runs;
then its thread writes ``MYSQLQ_TEST_STALL_FILE`` and sleeps for good, its transaction
still open and its row locks held, so the test can kill -9 the process at exactly that
step (tests/test_topic_kill_steps.py). With ``MYSQLQ_TEST_STALL_QUERY`` (one SQL
statement), the thread first runs it on the same connection and writes its rows as the
marker's third line: what that session looked like right after the step
(tests/test_isolation.py reads its isolation level). Test code only: the library is not patched; the
statement is observed through Django's own ``execute_wrapper`` hook.
"""

from __future__ import annotations

import os
import re
import threading
import time
from typing import Any

from django.db.backends.signals import connection_created

_fired = threading.Lock()


def _stall_after(pattern: re.Pattern[str], marker: str, query: str | None) -> Any:
    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        result = execute(sql, params, many, context)
        if pattern.search(sql) and _fired.acquire(blocking=False):
            seen = ""
            if query:
                cursor = context["cursor"].cursor  # the driver's: past the wrappers
                cursor.execute(query)
                seen = repr(cursor.fetchall())
            # Written whole, then renamed: the test never reads half a marker.
            with open(f"{marker}.part", "w") as out:
                out.write(f"{os.getpid()} {threading.current_thread().name}\n"
                          f"{' '.join(sql[:300].split())}\n{seen}\n")
            os.replace(f"{marker}.part", marker)
            while True:  # the process is killed here
                time.sleep(60)
        return result
    return wrapper


def install() -> None:
    pattern = re.compile(os.environ["MYSQLQ_TEST_STALL_AT"])
    wrapper = _stall_after(pattern, os.environ["MYSQLQ_TEST_STALL_FILE"],
                           os.environ.get("MYSQLQ_TEST_STALL_QUERY"))

    def hook(sender: Any, connection: Any, **kwargs: Any) -> None:
        if wrapper not in connection.execute_wrappers:
            connection.execute_wrappers.append(wrapper)

    connection_created.connect(hook, weak=False)
