"""enqueue() checks the call against the function's signature and raises at once, naming
the task, before anything is written (tests/test_tasks_backend.py covers Django's @task)."""

from __future__ import annotations

import inspect

import pytest
from asgiref.sync import async_to_sync
from hypothesis import given, settings
from hypothesis import strategies as st

from django_mysqlq import QueueError, TaskArgumentError
from django_mysqlq.models import Message
from tests.testapp import tasks
from tests.testapp import testing_tasks as tt

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("args, kwargs, problem", [
    ((), {}, "missing a required argument: 'label'"),
    (("a", 1, 2), {}, "too many positional arguments"),
    (("a",), {"valeu": 1}, "got an unexpected keyword argument 'valeu'"),
    (("a",), {"label": "b"}, "multiple values for argument 'label'"),
])
def test_a_call_that_does_not_fit_raises_at_once_naming_the_task(args, kwargs, problem):
    with pytest.raises(TaskArgumentError) as caught:
        tasks.record.enqueue(*args, **kwargs)
    text = str(caught.value)
    assert text.startswith("Task 'tests.testapp.tasks.record' can't be called with these "
                           f"arguments: {problem}.")
    assert "It takes (label: str, value: int | None = None); nothing was enqueued." in text
    assert isinstance(caught.value, TypeError) and isinstance(caught.value, QueueError)
    assert not Message.objects.exists()


def test_keyword_only_and_variadic_signatures():
    tt.echo.enqueue("x", 1, 2, 3, flag=True)
    tt.keyword_only.enqueue(account=1)
    with pytest.raises(TaskArgumentError, match="too many positional arguments"):
        tt.keyword_only.enqueue(1)
    # Python 3.12 says "keyword-only", 3.11 doesn't.
    with pytest.raises(TaskArgumentError,
                       match=r"missing a required (keyword-only )?argument: 'account'"):
        tt.keyword_only.enqueue(dry_run=True)
    assert Message.objects.count() == 2


def test_using_and_async_enqueue_check_too():
    with pytest.raises(TaskArgumentError, match="missing a required argument"):
        tasks.record.using(priority=5).enqueue()
    with pytest.raises(TaskArgumentError, match="unexpected keyword argument 'nope'"):
        async_to_sync(tasks.record.aenqueue)("a", nope=1)
    with pytest.raises(TaskArgumentError, match="missing a required argument: 'label'"):
        tt.async_echo.enqueue()
    assert not Message.objects.exists()


def test_call_checks_where_the_call_is_built():
    with pytest.raises(TaskArgumentError, match=r"^Task 'tests.testapp.tasks.record' can't be "
                                                r"called with these arguments: missing"):
        tasks.record.call()


def test_enqueue_many_names_the_item_and_writes_none():
    with pytest.raises(TaskArgumentError, match=r"^Item 2 of enqueue_many\(\): Task "
                                                r"'tests.testapp.tasks.record' can't be "
                                                "called with these arguments: too many"):
        tasks.record.enqueue_many([("a",), ("b", 1), ("c", 1, 2)])
    with pytest.raises(TaskArgumentError, match=r"^Item 1 of enqueue_many\(\): .*'nope'"):
        # A TaskCall built by hand (not by .call()) is checked as it is enqueued.
        from django_mysqlq.tasks import TaskCall

        tasks.record.enqueue_many([tasks.record.call("a"), TaskCall(("b",), {"nope": 1})])
    assert not Message.objects.exists()
    handles = tasks.record.enqueue_many([tasks.record.call("a", value=1), ("b",)])
    assert len(handles) == Message.objects.count() == 2


def test_a_call_made_for_another_task_is_checked_again():
    call = tt.echo.call("label", flag=True)
    with pytest.raises(TaskArgumentError, match=r"'tests.testapp.tasks.record'.*'flag'"):
        tasks.record.enqueue_many([call])


# ------------------------------------------------------------- the fast check is exact

_KINDS = [inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD,
          inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.KEYWORD_ONLY,
          inspect.Parameter.VAR_KEYWORD]


@st.composite
def signatures(draw):
    names = draw(st.lists(st.sampled_from("abcdef"), unique=True, max_size=6))
    parameters = []
    seen_default = False
    for name in names:
        kind = draw(st.sampled_from(_KINDS))
        if parameters and _KINDS.index(kind) < _KINDS.index(parameters[-1].kind):
            kind = parameters[-1].kind
        if kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD) and \
                any(p.kind is kind for p in parameters):
            continue
        if kind is inspect.Parameter.VAR_KEYWORD and parameters and \
                parameters[-1].kind is inspect.Parameter.VAR_KEYWORD:
            continue
        default = inspect.Parameter.empty
        if kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
            if seen_default or draw(st.booleans()):
                default, seen_default = 0, True
        elif kind is inspect.Parameter.KEYWORD_ONLY and draw(st.booleans()):
            default = 0
        parameters.append(inspect.Parameter(name, kind, default=default))
    return inspect.Signature(parameters)


@settings(max_examples=500, deadline=None)
@given(signature=signatures(), positional=st.integers(0, 6),
       keywords=st.lists(st.sampled_from("abcdefz"), unique=True, max_size=5))
def test_the_fast_check_agrees_with_signature_bind(signature, positional, keywords):
    """Python's own call is the reference: the summary never accepts a call a real function
    of that signature refuses, and check_call() raises exactly for the calls that fail.

    (Not Signature.bind: on Python 3.12.1 it refuses ``f(a=1)`` for ``def f(a=0, /, **c)``,
    which Python itself accepts, putting ``a`` in ``c``.)"""
    from django_mysqlq.calls import _Shape, check_call

    args, kwargs = tuple(range(positional)), dict.fromkeys(keywords, 1)
    namespace: dict[str, object] = {}
    exec(f"def func{signature}:\n    pass", namespace)
    func = namespace["func"]
    try:
        func(*args, **kwargs)
        binds = True
    except TypeError:
        binds = False
    if _Shape.of(signature).accepts(args, kwargs):
        assert binds, (signature, args, kwargs)
    try:
        check_call("t", func, args, kwargs)
        raised = False
    except TaskArgumentError:
        raised = True
    assert raised is not binds, (signature, args, kwargs)


def test_the_fast_check_takes_the_common_calls_itself():
    """Calls that bind in the usual shapes never need Signature.bind (the cheap path)."""
    from django_mysqlq.calls import _Shape

    shape = _Shape.of(inspect.signature(tt.echo.func))
    assert shape.accepts(("x",), {}) and shape.accepts(("x", 1, 2), {"flag": 1})
    shape = _Shape.of(inspect.signature(tasks.record.func))
    assert shape.accepts(("x",), {"value": 1}) and shape.accepts((), {"label": "x"})
    assert not shape.accepts((), {})


def test_a_misspelt_keyword_is_named_even_when_an_argument_is_missing_too():
    """``enqueue(lable="a")``: Python's bind says "missing 'label'" first; the unknown
    keyword is what the caller must see."""
    with pytest.raises(TaskArgumentError, match=r"arguments: got an unexpected keyword "
                                                r"argument 'lable'\. It takes \(label"):
        tasks.record.enqueue(lable="a")
    with pytest.raises(TaskArgumentError,
                       match="got unexpected keyword arguments 'lable', 'valeu'"):
        tasks.record.enqueue(lable="a", valeu=1)
    assert not Message.objects.exists()
