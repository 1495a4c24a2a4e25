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

from .exceptions import InvalidTaskOptions


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


def is_async(func: Callable[..., Any]) -> bool:
    """Whether calling ``func`` gives a coroutine, seen through plain decorators
    (``__wrapped__``) and ``async def __call__``: what a declaration check must refuse
    when the body can't be awaited (``atomic=True``)."""
    try:
        unwrapped = inspect.unwrap(func)
    except ValueError:  # a __wrapped__ cycle: judge the outer function alone
        unwrapped = func
    for candidate in (func, unwrapped):
        if inspect.iscoroutinefunction(candidate):
            return True
        if not inspect.isroutine(candidate) and not isinstance(candidate, type):
            call_method = inspect.getattr_static(type(candidate), "__call__", None)
            if call_method is not None and inspect.iscoroutinefunction(call_method):
                return True
    return False


def refuse_awaitable(value: Any, what: str) -> Any:
    """``value``, unless it is an awaitable, which is closed and refused: a body that must
    run here and now (inside a transaction) returned work that nobody would await."""
    if inspect.isawaitable(value):
        close = getattr(value, "close", None)
        if callable(close):
            close()  # no "never awaited" warning; its body never ran
        raise InvalidTaskOptions(
            f"{what} returned an awaitable ({type(value).__qualname__}), but atomic=True "
            "runs a plain function inside the ack's transaction, where nothing awaits it: "
            "its body did not run and its transaction was rolled back. Make the task a "
            "plain function, or drop atomic=True and use transaction.atomic() inside it.")
    return value


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable
