"""Checking an enqueue call against the task function's signature, before anything is written.

A call that can't bind (a missing argument, one too many, an unknown keyword) would only
fail on the worker, after the enqueuing transaction committed; here it raises at once.
The signature is read once per function: each later check is one ``Signature.bind``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .exceptions import TaskArgumentError

#: Function -> its signature, or None where Python can't tell one (then nothing is checked).
_signatures: dict[Callable[..., Any], inspect.Signature | None] = {}


def signature_of(func: Callable[..., Any], *, skip_first: bool = False) -> inspect.Signature | None:
    """The signature calls are checked against (without the first parameter when the
    framework passes it itself, as Django's ``takes_context`` does)."""
    key: Any = (func, skip_first)
    try:
        return _signatures[key]
    except KeyError:
        pass
    try:
        signature: inspect.Signature | None = inspect.signature(func)
    except (TypeError, ValueError):  # some builtins and C callables have none
        signature = None
    if signature is not None and skip_first:
        parameters = list(signature.parameters.values())[1:]
        signature = signature.replace(parameters=parameters)
    _signatures[key] = signature
    return signature


def check_call(task_name: str, func: Callable[..., Any], args: Sequence[Any],
               kwargs: Mapping[str, Any], *, skip_first: bool = False,
               where: str = "") -> None:
    """Raise :class:`TaskArgumentError` if ``func(*args, **kwargs)`` can't bind."""
    signature = signature_of(func, skip_first=skip_first)
    if signature is None:
        return
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise TaskArgumentError(
            f"{where}Task {task_name!r} can't be called with these arguments: {exc}. It "
            f"takes {_shown(signature)}; nothing was enqueued."
        ) from None


def _shown(signature: inspect.Signature) -> str:
    text = str(signature.replace(return_annotation=inspect.Signature.empty))
    return text if len(text) <= 300 else text[:297] + "..."
