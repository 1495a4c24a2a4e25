"""Ordered subjects and concurrency keys as tasks declare them, and the gate of one call.

``@queue_task(ordered_by=..., on_dead=..., concurrency_key=..., concurrency_limit=...)`` is
checked once, when the task is declared; ``.using(subject=...)`` and
``.using(concurrency_key=...)`` per call. A call's key is one of its arguments (bound as
the call binds them, defaults included) or what a function of the arguments returns: a
string, or an integer turned into one. Imports nothing of the package but ``limits`` and
``exceptions``, so ``models`` and ``tasks`` can both use it.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from . import limits
from .exceptions import InvalidTaskOptions

#: How a message passes its gate (``models.GateMode`` has the same values).
HOLD = "hold"
SKIP = "skip"
LIMIT = "limit"
ON_DEAD = (HOLD, SKIP)

#: Where a call's key comes from: an argument's name, or a function of the arguments.
KeySource = str | Callable[..., object]


@dataclasses.dataclass(frozen=True)
class TaskGate:
    """A task's gate as declared: where a call's key comes from, and how it passes."""

    #: An argument's name, a function of the call's arguments, or None: the key is the
    #: task-wide ``fixed_key``, or given per call.
    source: KeySource | None = None
    ordered: bool = False
    on_dead: str = HOLD
    #: Messages of one key at once (None: the task has no concurrency limit).
    limit: int | None = None
    #: The one key of a task-wide limit (``concurrency_limit`` without a key).
    fixed_key: str | None = None
    signature: inspect.Signature | None = None


NO_GATE = TaskGate()

#: A call's gate: (key, mode, limit).
CallGate = tuple[str, str, int]


def _fail(task: str, problem: str) -> InvalidTaskOptions:
    return InvalidTaskOptions(f"{task}: {problem}")


def _source(func: Callable[..., Any], source: object, option: str, task: str,
            takes_context: bool = False) -> tuple[KeySource, inspect.Signature | None]:
    """Check an argument name (it must be a parameter) or a function. With
    ``takes_context`` the first parameter is the worker's, not the caller's."""
    if callable(source):
        return source, None
    if not isinstance(source, str) or not source:
        raise _fail(task, f"{option} must be the name of one of the task's arguments or a "
                          f"function of its arguments, not {source!r}.")
    signature = inspect.signature(func)
    if takes_context:
        signature = signature.replace(parameters=list(signature.parameters.values())[1:])
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD
                    for p in signature.parameters.values())
    if source not in signature.parameters and not takes_any:
        raise _fail(task, f"{option}={source!r} names no argument of "
                          f"{func.__name__}{signature}; give one of "
                          f"{', '.join(signature.parameters) or '(none)'}, or a function.")
    return source, signature


def declare(func: Callable[..., Any], task: str, *, ordered_by: object = None,
            on_dead: object = None, concurrency_key: object = None,
            concurrency_limit: object = None, takes_context: bool = False) -> TaskGate:
    """Check a task's gate options; return its gate (``NO_GATE`` if it declares none).

    ``on_dead`` left out (None) is ``"hold"``; given, it must mean something."""
    given = on_dead is not None
    on_dead = HOLD if on_dead is None else on_dead
    if on_dead not in ON_DEAD:
        raise _fail(task, f"on_dead must be 'hold' (a dead head holds its subject until an "
                          f"operator requeues it or releases the subject) or 'skip' (the "
                          f"subject goes on without it), not {on_dead!r}.")
    if ordered_by is not None and (concurrency_key is not None
                                   or concurrency_limit is not None):
        raise _fail(task, "a message passes one gate: give ordered_by (one at a time per "
                          "subject, in order) or concurrency_key/concurrency_limit (N at "
                          "once per key, in no set order), not both.")
    if given and concurrency_limit is not None and ordered_by is None:
        raise _fail(task, f"on_dead={on_dead!r} means nothing with concurrency_limit: a dead "
                          "concurrency-limited message always frees its slot (a key keeps "
                          "no order to hold), and such a task takes no subject. Leave "
                          "on_dead out, or declare ordered_by=... instead of the limit if a "
                          "dead message should hold the ones after it.")
    if ordered_by is not None:
        source, signature = _source(func, ordered_by, "ordered_by", task, takes_context)
        return TaskGate(source, True, str(on_dead), 1, None, signature)
    if concurrency_limit is None:
        if concurrency_key is not None:
            raise _fail(task, "concurrency_key needs concurrency_limit=N: how many messages "
                              "of one key may run at once.")
        return TaskGate(on_dead=str(on_dead))
    problem = limits.whole_problem(concurrency_limit, "concurrency_limit", 1,
                                   limits.CONCURRENCY_LIMIT_MAX)
    if problem is not None:
        raise _fail(task, problem)
    assert isinstance(concurrency_limit, int)
    if concurrency_key is None:  # one limit for the whole task
        return TaskGate(None, False, str(on_dead), concurrency_limit, task[-255:], None)
    source, signature = _source(func, concurrency_key, "concurrency_key", task,
                                takes_context)
    return TaskGate(source, False, str(on_dead), concurrency_limit, None, signature)


def checked_key(value: object, option: str) -> str:
    """A key as stored: a non-empty string (an integer becomes one) of at most
    ``GATE_KEY_MAX`` characters, in valid UTF-8."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if (not isinstance(value, str) or not value or len(value) > limits.GATE_KEY_MAX
            or not limits.is_utf8(value)):
        raise InvalidTaskOptions(
            f"{option} must be a non-empty string (or an integer) of at most "
            f"{limits.GATE_KEY_MAX} characters in valid UTF-8, not {value!r}; convert the "
            "value, or give a function that returns such a key.")
    return value


def _derived(gate: TaskGate, func: Callable[..., Any], task: str, option: str,
             args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
    """The key of one call: its argument's value, or what the key function returns."""
    assert gate.source is not None
    return key_of(gate.source, gate.signature, func, task, option, args, kwargs)


def key_source(func: Callable[..., Any], source: object, option: str, task: str,
               takes_context: bool = False) -> tuple[KeySource, inspect.Signature | None]:
    """Check where another option's key comes from (``rating``: ``rate_limit_key``)."""
    return _source(func, source, option, task, takes_context)


def key_of(source: KeySource, signature: inspect.Signature | None, func: Callable[..., Any],
           task: str, option: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
    """The key of one call from ``source``: an argument's value, or what a function of the
    arguments returns."""
    if callable(source):
        return checked_key(source(*args, **kwargs), f"{task}: the key {option} returned")
    signature = signature or inspect.signature(func)
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise _fail(task, f"can't find the argument {source!r} that {option} names in this "
                          f"call ({exc}).") from None
    bound.apply_defaults()
    value = bound.arguments.get(source)
    if source not in signature.parameters:  # taken by **kwargs
        extra = [p.name for p in signature.parameters.values()
                 if p.kind is inspect.Parameter.VAR_KEYWORD]
        value = bound.arguments.get(extra[0], {}).get(source) if extra else None
    if value is None:
        raise _fail(task, f"the argument {source!r} that {option} names is None or missing "
                          "in this call: a message needs a key; pass one, or give "
                          ".using() an explicit key.")
    return checked_key(value, f"{task}: the argument {source!r} ({option})")


def for_call(gate: TaskGate, func: Callable[..., Any], task: str, args: Sequence[Any],
             kwargs: Mapping[str, Any], subject: str | None,
             concurrency_key: str | None) -> CallGate | None:
    """The gate one call passes: a per-call key wins over the task's own."""
    mode = gate.on_dead if gate.ordered or subject is not None else LIMIT
    if subject is not None:
        return subject, gate.on_dead, 1
    if concurrency_key is not None:
        assert gate.limit is not None  # checked by .using()
        return concurrency_key, LIMIT, gate.limit
    if gate.fixed_key is not None and gate.limit is not None:
        return gate.fixed_key, LIMIT, gate.limit
    if gate.source is None:
        return None
    option = "ordered_by" if gate.ordered else "concurrency_key"
    return _derived(gate, func, task, option, args, kwargs), mode, gate.limit or 1


def check_using(gate: TaskGate, task: str, subject: object, concurrency_key: object
                ) -> tuple[str | None, str | None]:
    """Check ``.using(subject=..., concurrency_key=...)`` against the task's gate."""
    if subject is not None and concurrency_key is not None:
        raise _fail(task, "give .using() a subject or a concurrency_key, not both: a message "
                          "passes one gate.")
    if subject is not None and gate.limit is not None and not gate.ordered:
        raise _fail(task, "this task has a concurrency limit; its messages pass their "
                          "concurrency key and can't also take an ordered subject (declare "
                          "another task with ordered_by, or without concurrency_limit).")
    if concurrency_key is not None and (gate.limit is None or gate.ordered):
        raise _fail(task, ".using(concurrency_key=...) needs a task declared with "
                          "concurrency_limit=N (and without ordered_by).")
    return (None if subject is None else checked_key(subject, "subject"),
            None if concurrency_key is None else checked_key(concurrency_key,
                                                             "concurrency_key"))


def unschedulable(gate: TaskGate, unique_for: int | None) -> tuple[str, str] | None:
    """The option that keeps a task from a schedule, and why (None: nothing does).

    A schedule's occurrences are inserted from its row, ready, with no gate and no dedup
    key (``broker.schedules``): a task's gate or uniqueness would not hold for them, and
    runs longer than the schedule's interval would overlap.
    """
    if gate.ordered:
        shown = repr(gate.source) if isinstance(gate.source, str) else "..."
        return (f"ordered_by={shown}", "its occurrences would be enqueued ready, past the "
                "subject's gate, so they would not wait for each other")
    if gate.limit is not None:
        return (f"concurrency_limit={gate.limit}", "its occurrences would be enqueued "
                "ready, past the gate, so runs longer than the schedule's interval would "
                "overlap")
    if unique_for is not None:
        return (f"unique_for={unique_for}", "its occurrences would be enqueued without a "
                "dedup key, so they would not be unique")
    return None
