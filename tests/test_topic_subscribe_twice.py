"""Subscribing twice to one slot (a topic and group, or a topic's broadcast): a module
reloaded replaces its handlers silently; two functions of one definition (a loop, a
factory), or one handler with other options, are refused instead of one silently
replacing the other; broadcast handlers are told apart by name, not by object."""

from __future__ import annotations

import functools
import importlib
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from django_mysqlq import Topic, queue_task, tasks, topics
from django_mysqlq.exceptions import InvalidTaskOptions
from django_mysqlq.registry import TaskRegistry
from django_mysqlq.topics import SubscriptionRegistry, TopicEvent

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[SubscriptionRegistry]:
    """A registry of this test's own, so its subscriptions don't reach other tests."""
    own = SubscriptionRegistry()
    monkeypatch.setattr(topics, "subscriptions", own)
    monkeypatch.setattr(topics, "registry", TaskRegistry())
    yield own


def made(tag: str) -> Any:
    def handler(event: TopicEvent) -> None:
        print(tag, event)
    return handler


def test_two_functions_of_one_definition_on_one_group_are_refused() -> None:
    orders = Topic("orders")
    orders.subscribe(group="billing")(made("a"))
    with pytest.raises(InvalidTaskOptions, match=r"'orders' is subscribed twice by group "
                                                  r"'billing'.*loop or a factory"):
        orders.subscribe(group="billing")(made("b"))


def test_two_functions_of_one_definition_in_broadcast_are_refused(fresh) -> None:
    orders = Topic("orders")
    orders.subscribe(broadcast=True)(made("a"))
    with pytest.raises(InvalidTaskOptions, match=r"subscribed twice by broadcast"):
        orders.subscribe(broadcast=True)(made("b"))
    assert len(fresh.broadcast()) == 1


def test_the_same_handler_with_other_options_is_refused(fresh) -> None:
    handler = made("a")
    orders = Topic("orders")
    orders.subscribe(group="billing", max_attempts=3)(handler)
    orders.subscribe(group="billing", max_attempts=3)(handler)  # the same again: fine
    for options in ({"max_attempts": 4}, {"timeout": 5}, {"on_dead": "hold"},
                    {"start": "earliest"}, {"max_attempts": 3, "retry_backoff": [1]}):
        with pytest.raises(InvalidTaskOptions, match=r"group 'billing'.*other options"):
            orders.subscribe(group="billing", **options)(handler)
    (kept,) = fresh.groups()
    assert kept.task is not None and kept.task.max_attempts == 3


def test_another_handler_on_the_group_is_refused_as_before() -> None:
    orders = Topic("orders")
    orders.subscribe(group="billing")(made("a"))

    def other(event: TopicEvent) -> None: ...

    with pytest.raises(InvalidTaskOptions, match=r"one handler per topic"):
        orders.subscribe(group="billing")(other)


@pytest.fixture
def module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    (tmp_path / "reloaded_handlers.py").write_text(textwrap.dedent("""
        from django_mysqlq import Topic

        @Topic("orders").subscribe(group="billing", max_attempts=3)
        def bill(event): ...

        @Topic("orders").subscribe(broadcast=True)
        def forget(event): ...
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield importlib.import_module("reloaded_handlers")
    sys.modules.pop("reloaded_handlers", None)


def test_a_reloaded_module_replaces_its_handlers_silently(fresh, module) -> None:
    reloaded = importlib.reload(module)
    (group,) = fresh.groups()
    (broadcast,) = fresh.broadcast()  # once, not twice: it would run twice per message
    assert group.handler is reloaded.bill and broadcast.handler is reloaded.forget


class Callable_:
    def __call__(self, event: TopicEvent) -> None: ...


def plain(event: TopicEvent, tag: str = "") -> None: ...


@pytest.mark.parametrize("handler", [functools.partial(plain, tag="x"), Callable_()],
                         ids=["partial", "callable-object"])
@pytest.mark.parametrize("how", [{"group": "billing"}, {"broadcast": True}])
def test_a_handler_without_a_name_is_refused_saying_to_wrap_it(handler, how, fresh) -> None:
    with pytest.raises(InvalidTaskOptions, match=r"topic 'orders'.*has none: wrap it in a def"):
        Topic("orders").subscribe(**how)(handler)
    assert fresh.groups() == [] and fresh.broadcast() == []


def test_queue_task_refuses_one_without_a_name_unless_given_one(monkeypatch) -> None:
    monkeypatch.setattr(tasks, "registry", TaskRegistry())
    with pytest.raises(InvalidTaskOptions, match=r"has none: pass name=\.\.\. to @queue_task"):
        queue_task(functools.partial(plain, tag="x"))
    named = queue_task(functools.partial(plain, tag="x"), name="plain.x")
    assert queue_task(functools.partial(plain, tag="y"), name="plain.x").name == named.name


@pytest.fixture
def two_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A handlers module reachable as ``twicepkg.twice_named`` and as ``twice_named`` (its
    directory on sys.path as well as its package's)."""
    package = tmp_path / "twicepkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "twice_named.py").write_text(textwrap.dedent("""
        from django_mysqlq import Topic

        @Topic("orders").subscribe(broadcast=True)
        def forget(event): ...
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(package))
    yield package
    for name in ("twicepkg.twice_named", "twicepkg", "twice_named"):
        sys.modules.pop(name, None)


def test_a_broadcast_handler_imported_under_two_module_names_is_refused(fresh,
                                                                        two_names) -> None:
    """Before, the second import added a second broadcast subscription (another name):
    every message ran the handler twice in each process."""
    importlib.import_module("twicepkg.twice_named")
    with pytest.raises(InvalidTaskOptions, match=r"subscribed twice by broadcast with one "
                       r"function imported under two module names: twicepkg\.twice_named\."
                       r"forget and twice_named\.forget"):
        importlib.import_module("twice_named")
    assert len(fresh.broadcast()) == 1


def test_a_group_handler_imported_under_two_module_names_says_so(fresh, two_names) -> None:
    (two_names / "twice_named.py").write_text(textwrap.dedent("""
        from django_mysqlq import Topic

        @Topic("orders").subscribe(group="billing")
        def bill(event): ...
        """))
    importlib.import_module("twicepkg.twice_named")
    with pytest.raises(InvalidTaskOptions, match=r"imported under two module names"):
        importlib.import_module("twice_named")


def named_like(handler: Any) -> Any:
    """A decorator that copies the handler's names but sets no ``__wrapped__``: every
    handler under it shares the wrapper's code."""
    def wrapper(event: TopicEvent) -> None:
        handler(event)
    wrapper.__name__ = handler.__name__
    wrapper.__qualname__ = handler.__qualname__
    wrapper.__module__ = handler.__module__
    return wrapper


def test_two_broadcast_handlers_under_a_name_copying_decorator_are_both_kept(fresh) -> None:
    """They were refused as "one function imported under two module names": the check
    compared the wrapper's code, which they share; a worker importing them didn't start."""
    orders = Topic("orders")

    def forget_orders(event: TopicEvent) -> None: ...

    def forget_users(event: TopicEvent) -> None: ...

    orders.subscribe(broadcast=True)(named_like(forget_orders))
    orders.subscribe(broadcast=True)(named_like(forget_users))
    assert sorted(s.handler.__name__ for s in fresh.broadcast()) == [
        "forget_orders", "forget_users"]
