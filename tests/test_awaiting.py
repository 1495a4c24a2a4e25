"""A task function or topic handler runs to its end however it is async: a coroutine
function, an async function under a plain decorator, an object with ``async __call__``.
(With a real worker: test_worker_basic's wrapped async task.)"""

from __future__ import annotations

import functools
import threading
from typing import Any

from django_mysqlq import awaiting


def _plain(func: Any) -> Any:
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return func(*args, **kwargs)

    return wrapper


async def _double(value: int) -> int:
    return 2 * value


class _AsyncCallable:
    def __init__(self) -> None:
        self.ran = False

    async def __call__(self, value: int) -> int:
        self.ran = True
        return value + 1


def test_every_kind_of_async_callable_is_awaited_and_sync_ones_just_called() -> None:
    assert awaiting.call(lambda value: value * 3, 2) == 6
    assert awaiting.call(_double, 4) == 8
    assert awaiting.call(_plain(_double), value=5) == 10
    instance = _AsyncCallable()
    assert awaiting.call(instance, 1) == 2 and instance.ran


def test_the_awaited_body_s_sync_to_async_calls_come_back_to_the_calling_thread() -> None:
    from asgiref.sync import sync_to_async

    async def where() -> str:
        return await sync_to_async(lambda: threading.current_thread().name)()

    caller = threading.current_thread().name
    assert awaiting.call(where) == caller
    assert awaiting.call(_plain(where)) == caller
