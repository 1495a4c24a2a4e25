"""Encoding of task arguments: JSON only, checked one argument at a time."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from .exceptions import ArgumentEncodingError, PayloadDecodeError, PayloadTooLarge

#: What json.dumps raises on values it can't encode (RecursionError: nested too deeply).
_ENCODING_ERRORS = (TypeError, ValueError, RecursionError)
_CONTAINERS = (dict, list, tuple)
#: One encoder for every payload (json.dumps with options builds a new one per call).
_ENCODER = json.JSONEncoder(allow_nan=False, separators=(",", ":"))
#: Deepest nesting of a topic message's payload (lists and dicts within one another): a
#: worker parses it with ``json.loads`` inside its own call stack, and CPython refuses a
#: document nested about 1,000 levels deep or more (the exact depth varies with the
#: version and the stack in use), so a deeper payload would publish and then fail in
#: every group (dead, ``PayloadDecodeError``) and every broadcast handler.
MAX_PUBLISHED_DEPTH = 500
#: The same for one task argument (its payload wraps it two levels deeper): a deeper one
#: would enqueue and then die in the worker, unparsed.
MAX_ARGUMENT_DEPTH = MAX_PUBLISHED_DEPTH


def _non_string_key(value: Any) -> object | None:
    """The first dict key that isn't a str (JSON would silently turn it into one)."""
    stack = [value]
    seen: set[int] = set()  # a cyclic value is refused later by json.dumps, not looped on
    while stack:
        item = stack.pop()
        if isinstance(item, dict | list | tuple):
            if id(item) in seen:
                continue
            seen.add(id(item))
        if isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    return key if key is not None else "None"
                stack.append(child)
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return None


def _nested_past(value: Any, limit: int) -> bool:
    """Whether ``value`` nests lists and dicts within one another more than ``limit``
    levels deep. A walk with a stack of its own (a value nested past Python's recursion
    limit is measured too) that stops at the first container past the limit; a cycle
    counts as not deep, for the encoder to refuse it by name."""
    leave = object()
    stack: list[tuple[Any, int]] = [(value, 1)]
    path: set[int] = set()
    while stack:
        item, depth = stack.pop()
        if item is leave:
            path.discard(depth)
            continue
        if not isinstance(item, dict | list | tuple) or id(item) in path:
            continue
        if depth > limit:
            return True
        path.add(id(item))
        stack.append((leave, id(item)))
        stack.extend((child, depth + 1)
                     for child in (item.values() if isinstance(item, dict) else item))
    return False


def _check_argument(task_name: str, label: str, value: Any) -> None:
    key = _non_string_key(value)
    if key is not None:
        raise ArgumentEncodingError(
            f"{label} of task {task_name!r} can't be encoded as JSON: the dict key {key!r} "
            "isn't a string, and JSON would turn it into one, so the task would get a "
            "different value. Use str keys: pass a primary key or a plain dict with str keys."
        )
    try:
        json.dumps(value, allow_nan=False)
    except _ENCODING_ERRORS as exc:
        raise ArgumentEncodingError(
            f"{label} of task {task_name!r} can't be encoded as JSON ({exc}). "
            "Task arguments must be JSON values (str, int, float, bool, None, list, dict "
            "with str keys): pass a primary key or a plain dict instead of the object."
        ) from exc


def encode(
    task_name: str, args: Sequence[Any], kwargs: Mapping[str, Any], max_bytes: int
) -> str:
    """Return the payload text, or raise naming the first argument that can't be encoded."""
    try:
        text = _ENCODER.encode({"args": list(args), "kwargs": dict(kwargs)})
        # Only containers can hide a non-str dict key; most calls pass scalars.
        bad_keys = (
            any(isinstance(value, _CONTAINERS) for value in (*args, *kwargs.values()))
            and _non_string_key([list(args), list(kwargs.values())]) is not None
        )
    except _ENCODING_ERRORS:
        bad_keys = True
    if bad_keys:
        for index, value in enumerate(args):
            _check_argument(task_name, f"Positional argument {index}", value)
        for key, value in kwargs.items():
            _check_argument(task_name, f"Argument {key!r}", value)
        raise ArgumentEncodingError(f"The arguments of task {task_name!r} can't be encoded "
                                    "as JSON.")
    # A document with fewer brackets than the limit can't nest past it: most payloads
    # are checked by this count alone (in C), without a walk.
    if text.count("[") + text.count("{") > MAX_ARGUMENT_DEPTH:
        _check_depths(task_name, args, kwargs)
    size = len(text.encode())
    if size > max_bytes:
        raise PayloadTooLarge(
            f"The arguments of task {task_name!r} encode to {size} bytes, over "
            f"MYSQLQ['MAX_PAYLOAD_BYTES'] ({max_bytes}). Store large data in a table or file "
            "and pass its key, or raise the setting."
        )
    return text


def _refuse_too_deep(label: str, value: Any, limit: int, reader: str, instead: str
                     ) -> None:
    """Raise, naming ``label``, if ``value`` nests past ``limit`` (what ``reader`` parses)."""
    if isinstance(value, _CONTAINERS) and _nested_past(value, limit):
        raise ArgumentEncodingError(
            f"{label} is nested more than {limit} levels deep (lists and dicts within one "
            f"another), deeper than {reader} can parse back: flatten it (a list of rows "
            f"rather than rows within rows), or store it in a table or file and {instead}.")


def _check_depths(task_name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    """Refuse, by name, the first argument nested deeper than a worker parses back."""
    labelled = [*((f"Positional argument {i}", v) for i, v in enumerate(args)),
                *((f"Argument {k!r}", v) for k, v in kwargs.items())]
    for label, value in labelled:
        _refuse_too_deep(f"{label} of task {task_name!r}", value, MAX_ARGUMENT_DEPTH,
                         "a worker", "pass its key")


def decode(text: str) -> tuple[list[Any], dict[str, Any]]:
    """Parse a stored payload back into ``(args, kwargs)``."""
    try:
        data = json.loads(text)
    except (TypeError, ValueError, RecursionError) as exc:
        raise PayloadDecodeError(f"payload is not valid JSON: {exc}") from exc
    if isinstance(data, dict):
        args, kwargs = data.get("args", []), data.get("kwargs", {})
        if isinstance(args, list) and isinstance(kwargs, dict):
            return list(args), dict(kwargs)
    raise PayloadDecodeError(
        'payload must be a JSON object {"args": [...], "kwargs": {...}}'
    )


def encode_published(topic: str, value: Any, max_bytes: int) -> str:
    """The JSON text of a topic message's payload, or the error a task argument would get
    (worded for the topic); nothing is written when it raises."""
    label = f"The payload of a message to topic {topic!r}"
    key = _non_string_key(value) if isinstance(value, _CONTAINERS) else None
    if key is not None:
        raise ArgumentEncodingError(
            f"{label} can't be encoded as JSON: the dict key {key!r} isn't a string, and JSON "
            "would turn it into one, so handlers would get a different value. Use str keys.")
    _refuse_too_deep(label, value, MAX_PUBLISHED_DEPTH, "a handler's worker",
                     "publish its key")
    try:
        text = _ENCODER.encode(value)
    except _ENCODING_ERRORS as exc:
        raise ArgumentEncodingError(
            f"{label} can't be encoded as JSON ({exc}). Payloads must be JSON values (str, "
            "int, float, bool, None, list, dict with str keys): publish a primary key or a "
            "plain dict instead of the object.") from exc
    size = len(text.encode())
    if size > max_bytes:
        raise PayloadTooLarge(
            f"{label} encodes to {size} bytes, over MYSQLQ['MAX_PAYLOAD_BYTES'] "
            f"({max_bytes}). Store large data in a table or file and publish its key, or "
            "raise the setting.")
    return text
