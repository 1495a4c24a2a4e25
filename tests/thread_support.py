"""Running a test's body in a thread of its own, on a ``default`` connection made from
changed settings (another isolation level, port or socket), closed when it ends."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from django.db import connections


def in_thread_with_default(body: Callable[[], Any], *, options: dict[str, Any] | None = None,
                           **database: Any) -> Any:
    """``body()``'s result (or its exception, raised here) from a thread whose ``default``
    connection uses these DATABASES entries, its OPTIONS updated with ``options``."""
    result: list[Any] = []

    def run() -> None:
        default = connections["default"]
        settings = {**default.settings_dict, **database}
        if options:
            settings["OPTIONS"] = {**settings["OPTIONS"], **options}
        connections["default"] = type(default)(settings, alias="default")
        try:
            result.append(body())
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            result.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "the body still runs after 60 s"
    if isinstance(result[0], BaseException):
        raise result[0]
    return result[0]
