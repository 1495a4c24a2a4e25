"""How a Django task is written into a queue message: its name and its payload.

A Django ``@task`` message is stored under ``"django.tasks:" + task.module_path``, so it
can never be mistaken for a ``@queue_task`` name, and its payload is the usual
``{"args": [...], "kwargs": {...}}`` plus the alias of the backend that enqueued it and,
when deferred, the ``run_after`` it was given. This module needs no Tasks framework.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Mapping, Sequence
from typing import Any

from .. import payload as payload_codec
from ..exceptions import PayloadDecodeError

#: Prefix of every Django task's message name.
DJANGO_TASK_PREFIX = "django.tasks:"
#: Longest message name the table holds (``Message.task_name``).
NAME_MAX = 255


def message_name(module_path: str) -> str:
    """The message name of the task whose function lives at ``module_path``."""
    return DJANGO_TASK_PREFIX + module_path


def is_django_task_name(name: str) -> bool:
    return name.startswith(DJANGO_TASK_PREFIX)


def module_path_of(name: str) -> str:
    """The function's module path in a Django task's message name."""
    if not is_django_task_name(name):
        raise ValueError(f"{name!r} is not a Django task's message name.")
    return name[len(DJANGO_TASK_PREFIX):]


@dataclasses.dataclass(frozen=True)
class DecodedPayload:
    args: list[Any]
    kwargs: dict[str, Any]
    #: Alias of the backend that enqueued the message (None in hand-written messages).
    backend: str | None
    run_after: dt.datetime | None


def encode(name: str, args: Sequence[Any], kwargs: Mapping[str, Any], backend: str,
           run_after: dt.datetime | None, max_bytes: int) -> str:
    """The payload text; raises ``ArgumentEncodingError`` naming a bad argument, or
    ``PayloadTooLarge``, exactly as ``@queue_task`` does."""
    payload_codec.encode(name, args, kwargs, max_bytes)  # names the bad argument; checks size
    document: dict[str, Any] = {"args": list(args), "kwargs": dict(kwargs), "backend": backend}
    if run_after is not None:
        document["run_after"] = run_after.isoformat()
    return json.dumps(document, allow_nan=False, separators=(",", ":"))


def decode(text: str) -> DecodedPayload:
    """Parse a payload; raises ``PayloadDecodeError`` as the worker does."""
    args, kwargs = payload_codec.decode(text)
    document = json.loads(text)
    backend = document.get("backend")
    run_after: dt.datetime | None = None
    raw_run_after = document.get("run_after")
    if isinstance(raw_run_after, str):
        try:
            run_after = dt.datetime.fromisoformat(raw_run_after)
        except ValueError as exc:
            raise PayloadDecodeError(f"run_after is not an ISO datetime: {exc}") from exc
    return DecodedPayload(args=args, kwargs=kwargs,
                          backend=backend if isinstance(backend, str) else None,
                          run_after=run_after)
