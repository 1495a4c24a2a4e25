"""Unique jobs as tasks and calls declare them: a checked ``unique_for``, and the dedup
key a call gets when it gives none (its task and its arguments). Imports nothing of the
package but ``limits`` and ``exceptions``."""

from __future__ import annotations

import datetime as dt
import hashlib
import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from . import limits
from .exceptions import InvalidTaskOptions


def validate_unique_for(value: object, option: str = "unique_for") -> int:
    problem = limits.unique_for_problem(value, option)
    if problem is not None:
        raise InvalidTaskOptions(problem)
    assert isinstance(value, dt.timedelta | int)
    return limits.unique_for_seconds(value)


#: Prefix of the dedup key a unique task's call gets when it gives none.
DERIVED_KEY_PREFIX = "mysqlq:unique:"


def derived_dedup_key(task_name: str, func: Callable[..., Any], args: Sequence[Any],
                      kwargs: Mapping[str, Any], payload_text: str,
                      skip_first: bool = False) -> str:
    """The dedup key of a unique task's call without one: a digest of its task and its
    arguments as bound to the signature, defaults included, so ``f(1)``, ``f(x=1)`` and
    ``f(1, y=<its default>)`` are the same call (the encoded payload where the function
    has no signature to bind to)."""
    identity = payload_text
    try:
        signature = inspect.signature(func)
        if skip_first:
            signature = signature.replace(parameters=list(signature.parameters.values())[1:])
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        identity = json.dumps(bound.arguments, sort_keys=True, separators=(",", ":"),
                              default=_stable)
    except (TypeError, ValueError):
        pass  # no signature (some C callables): the payload as encoded
    digest = hashlib.sha256(f"{task_name}\x00{identity}".encode()).hexdigest()
    return f"{DERIVED_KEY_PREFIX}{digest}"


def _stable(value: Any) -> Any:
    """A default JSON can't encode (arguments given are JSON already), as the same text in
    every process: its ``repr``, unless that names a memory address (an ``object()``
    sentinel, a function) or follows the hash seed (a set): then its type, or its items
    sorted. (With ``repr`` alone, each web process made its own key for the same call,
    and duplicates got through.)"""
    if isinstance(value, (set, frozenset)):
        return sorted(repr(item) for item in value)
    text = repr(value)
    if " at 0x" in text:
        return f"<{type(value).__module__}.{type(value).__qualname__}>"
    return text
