"""Calling a task function or topic handler that may be async, however it is written.

``inspect.iscoroutinefunction`` misses an async function under a plain decorator (a
``functools.wraps`` wrapper that returns what it calls) and an object whose ``__call__``
is ``async def``. Called as plain functions, they return a coroutine that nobody awaits:
the body never runs, yet the attempt would count as a success.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import async_to_sync


def call(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``func(*args, **kwargs)`` run to its end, awaited if it is async or returns an
    awaitable. Through ``async_to_sync``, not ``asyncio.run``: its ``sync_to_async``
    database calls then come back to the calling thread and its connection."""
    if inspect.iscoroutinefunction(func):
        return async_to_sync(func)(*args, **kwargs)
    result = func(*args, **kwargs)
    if inspect.isawaitable(result):
        return async_to_sync(_awaited)(result)
    return result


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable
