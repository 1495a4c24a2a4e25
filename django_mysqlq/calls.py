"""Checking an enqueue call against the task function's signature, before anything is written.

A call that can't bind (a missing argument, one too many, an unknown keyword) would only
fail on the worker, after the enqueuing transaction committed; here it raises at once.
The signature is read once per function. A call is first checked against a summary of it
(a few set and dict look-ups, cheap enough for ``enqueue_many()`` of thousands); only a
call that summary refuses goes through ``Signature.bind``, which words the problem.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .exceptions import TaskArgumentError

_P = inspect.Parameter


@dataclasses.dataclass(frozen=True)
class _Shape:
    """What a call must satisfy, read from one signature."""

    signature: inspect.Signature
    #: Names that take positional arguments, in order, and where each sits.
    positional: tuple[str, ...]
    index: dict[str, int]
    #: Leading positional parameters without a default.
    required_positional: int
    positional_only: frozenset[str]
    #: Names a keyword argument may use (not positional-only ones).
    keywords: frozenset[str]
    required_keyword_only: tuple[str, ...]
    var_positional: bool
    var_keyword: bool

    @classmethod
    def of(cls, signature: inspect.Signature) -> _Shape:
        params = list(signature.parameters.values())
        positional = tuple(p.name for p in params
                           if p.kind in (_P.POSITIONAL_ONLY, _P.POSITIONAL_OR_KEYWORD))
        required = 0
        for p in params:
            if p.kind not in (_P.POSITIONAL_ONLY, _P.POSITIONAL_OR_KEYWORD) \
                    or p.default is not _P.empty:
                break
            required += 1
        return cls(
            signature=signature, positional=positional,
            index={name: i for i, name in enumerate(positional)},
            required_positional=required,
            positional_only=frozenset(p.name for p in params if p.kind is _P.POSITIONAL_ONLY),
            keywords=frozenset(p.name for p in params
                               if p.kind in (_P.POSITIONAL_OR_KEYWORD, _P.KEYWORD_ONLY)),
            required_keyword_only=tuple(p.name for p in params if p.kind is _P.KEYWORD_ONLY
                                        and p.default is _P.empty),
            var_positional=any(p.kind is _P.VAR_POSITIONAL for p in params),
            var_keyword=any(p.kind is _P.VAR_KEYWORD for p in params),
        )

    def accepts(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
        """True only for calls that bind; False sends the call to ``Signature.bind``."""
        given = len(args)
        if given > len(self.positional) and not self.var_positional:
            return False
        for name in self.positional[given:self.required_positional]:
            if name not in kwargs or name in self.positional_only:
                return False
        for key in kwargs:
            if key in self.keywords:
                if self.index.get(key, given) < given:
                    return False  # given twice: by position and by keyword
            elif not self.var_keyword:
                return False
        return all(name in kwargs for name in self.required_keyword_only)


#: (function, skip_first) -> its shape, or None where Python can't tell a signature.
_shapes: dict[tuple[Callable[..., Any], bool], _Shape | None] = {}


def _shape_of(func: Callable[..., Any], skip_first: bool) -> _Shape | None:
    key = (func, skip_first)
    try:
        return _shapes[key]
    except KeyError:
        pass
    try:
        signature: inspect.Signature | None = inspect.signature(func)
    except (TypeError, ValueError):  # some builtins and C callables have none
        signature = None
    if signature is not None and skip_first:
        signature = signature.replace(parameters=list(signature.parameters.values())[1:])
    shape = _shapes[key] = None if signature is None else _Shape.of(signature)
    return shape


def check_call(task_name: str, func: Callable[..., Any], args: Sequence[Any],
               kwargs: Mapping[str, Any], *, skip_first: bool = False,
               where: str = "") -> None:
    """Raise :class:`TaskArgumentError` if ``func(*args, **kwargs)`` can't bind.

    ``skip_first``: the framework passes the first parameter itself (Django's
    ``takes_context``).
    """
    shape = _shape_of(func, skip_first)
    if shape is None or shape.accepts(args, kwargs):
        return
    try:
        shape.signature.bind(*args, **kwargs)
    except TypeError as exc:
        problem = _unknown_keywords(shape.signature, kwargs) or str(exc)
        raise TaskArgumentError(
            f"{where}Task {task_name!r} can't be called with these arguments: {problem}. It "
            f"takes {_shown(shape.signature)}; nothing was enqueued."
        ) from None


def _unknown_keywords(signature: inspect.Signature, kwargs: Mapping[str, Any]) -> str:
    """Keywords the function has no parameter of that name for (bind names a missing
    argument first, which hides a misspelt keyword: ``order=1`` for ``order_id``)."""
    params = signature.parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return ""
    unknown = [name for name in kwargs if name not in signature.parameters]
    if not unknown:
        return ""
    listed = ", ".join(repr(name) for name in unknown)
    if len(unknown) == 1:
        return f"got an unexpected keyword argument {listed}"
    return f"got unexpected keyword arguments {listed}"


def _shown(signature: inspect.Signature) -> str:
    text = str(signature.replace(return_annotation=inspect.Signature.empty))
    return text if len(text) <= 300 else text[:297] + "..."
