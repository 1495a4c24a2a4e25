"""Topics: publish messages; consumer groups and broadcast subscribers handle them.

::

    orders = Topic("orders")

    @orders.subscribe(group="billing")          # once per message among the group's workers
    def bill(event: TopicEvent) -> None: ...

    @orders.subscribe(broadcast=True)           # in every live worker process
    def forget_cached_order(event: TopicEvent) -> None: ...

    orders.publish({"id": 7}, key="customer-42")  # joins the current transaction

A group subscription is also a task (named ``topic:<topic>:<group>``, in the queue
``group:<group>``) that workers run like any other: see docs/streams.md.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import inspect
import itertools
import threading
import types
from collections.abc import Callable, Iterable
from typing import Any

from asgiref.sync import sync_to_async

from . import limits, payload, retries
from .conf import get_settings
from .exceptions import InvalidTaskOptions
from .gating import HOLD, NO_GATE, ON_DEAD, SKIP
from .registry import qualified_name, registry, unnamed_problem
from .tasks import QueueTask
from .topicnames import (
    KEY_MAX,
    LATEST,
    STARTS,
    delivery_task_name,
    group_problem,
    group_queue,
    topic_problem,
)

Handler = Callable[["TopicEvent"], Any]


@dataclasses.dataclass(frozen=True)
class TopicEvent:
    """One topic message, as a handler receives it."""

    topic: str
    offset: int
    key: str | None
    payload: Any
    published_at: dt.datetime
    #: The consumer group handling it; None in a broadcast handler.
    group: str | None = None


def _checked(problem: str | None) -> None:
    if problem is not None:
        raise InvalidTaskOptions(problem)


def _key(topic: str, key: object) -> str | None:
    if key is None:
        return None
    if isinstance(key, int) and not isinstance(key, bool):
        key = str(key)
    if not isinstance(key, str) or not key or len(key) > KEY_MAX or not limits.is_utf8(key):
        raise InvalidTaskOptions(
            f"The key of a message to topic {topic!r} must be a non-empty string (or an "
            f"integer) of at most {KEY_MAX} characters in valid UTF-8, not {key!r}.")
    return key


def _many_problem(what: str, given: object) -> str | None:
    """publish_many() takes a list (any iterable) of payloads or keys: not a single
    string, dict or number, which would be taken apart or fail in the middle."""
    if isinstance(given, Iterable) and not isinstance(given, str | bytes | dict):
        return None
    return (f"publish_many() takes {what} as a list (one per message), not "
            f"{type(given).__name__} {given!r:.60}: to publish one message, use "
            "publish(value, key=...).")


@dataclasses.dataclass(frozen=True)
class Subscription:
    """A handler subscribed to a topic: in a consumer group, or broadcast."""

    topic: str
    handler: Handler
    #: The consumer group (None for a broadcast subscription).
    group: str | None
    #: Where the group begins when it is created (``latest`` or ``earliest``).
    start: str = LATEST
    #: The task workers run for the group's deliveries (None for broadcast).
    task: QueueTask[Any, Any] | None = None
    #: Whether a dead delivery holds its key's later messages (``hold``) or not (``skip``).
    on_dead: str = SKIP

    @property
    def broadcast(self) -> bool:
        return self.group is None

    @property
    def queue(self) -> str | None:
        return group_queue(self.group) if self.group is not None else None


class SubscriptionRegistry:
    """Every subscription this process declared (filled as task modules are imported)."""

    def __init__(self) -> None:
        self._groups: dict[tuple[str, str], Subscription] = {}
        self._broadcast: list[Subscription] = []
        self._lock = threading.Lock()

    def add(self, subscription: Subscription) -> None:
        """Add ``subscription``; the same handler declared again with the same options
        (a module reloaded) replaces the old one, anything else on its slot is refused."""
        with self._lock:
            if subscription.group is None:
                for index, old in enumerate(self._broadcast):
                    if old.topic == subscription.topic and _same_name(old, subscription):
                        _check_reload(old, subscription)
                        self._broadcast[index] = subscription
                        return
                    if old.topic == subscription.topic and _same_source(old, subscription):
                        _refuse_two_names(old, subscription)
                self._broadcast.append(subscription)
                return
            key = (subscription.topic, subscription.group)
            existing = self._groups.get(key)
            if existing is not None:
                _check_reload(existing, subscription)
            self._groups[key] = subscription

    def groups(self) -> list[Subscription]:
        with self._lock:
            return sorted(self._groups.values(), key=lambda s: (s.topic, s.group or ""))

    def broadcast(self) -> list[Subscription]:
        with self._lock:
            return list(self._broadcast)

    def group_queues(self, topic: str) -> list[str]:
        """The queues of the groups subscribed to ``topic`` (a publish wakes them)."""
        with self._lock:
            return [group_queue(group) for (name, group) in self._groups if name == topic]

    def remove(self, subscription: Subscription) -> None:
        """Forget a subscription (tests)."""
        with self._lock:
            if subscription.group is None:
                self._broadcast = [s for s in self._broadcast if s is not subscription]
            else:
                self._groups.pop((subscription.topic, subscription.group), None)


def _same_name(old: Subscription, new: Subscription) -> bool:
    return qualified_name(old.handler) == qualified_name(new.handler)


def _options(subscription: Subscription) -> tuple[object, ...]:
    task = subscription.task
    return (subscription.start, subscription.on_dead) + (() if task is None else (
        task.max_attempts, task.retry_schedule, task.timeout))


def _code(handler: Handler) -> object:
    return getattr(inspect.unwrap(handler), "__code__", None)


def _same_source(old: Subscription, new: Subscription) -> bool:
    """Whether two handlers of other names come from one definition in one file: a module
    imported under two names (its directory on ``sys.path`` as well as its package). Their
    own qualified names then differ by module alone: two handlers under a decorator that
    copies their names but sets no ``__wrapped__`` share the wrapper's code, and are not
    one function."""
    if getattr(old.handler, "__qualname__", None) != getattr(new.handler, "__qualname__", None):
        return False
    a, b = _code(old.handler), _code(new.handler)
    return (isinstance(a, types.CodeType) and isinstance(b, types.CodeType)
            and (a.co_filename, a.co_firstlineno, a.co_qualname)
            == (b.co_filename, b.co_firstlineno, b.co_qualname))


def _refuse_two_names(old: Subscription, new: Subscription) -> None:
    where = "broadcast" if new.group is None else f"group {new.group!r}"
    raise InvalidTaskOptions(
        f"Topic {new.topic!r} is subscribed twice by {where} with one function imported "
        f"under two module names: {qualified_name(old.handler)} and "
        f"{qualified_name(new.handler)} (its directory is on sys.path as well as its "
        "package?). Import the module by one name only; run twice, every message would be "
        "handled twice.")


def _check_reload(old: Subscription, new: Subscription) -> None:
    """Allow only a reload: the same handler (by module and name, a module reloaded
    compiles it anew) with the same options. Two functions of one definition (made in a
    loop or a factory) share their code and would silently replace each other."""
    where = (f"Topic {new.topic!r} is subscribed twice by "
             + ("broadcast" if new.group is None else f"group {new.group!r}"))
    if not _same_name(old, new) and _same_source(old, new):
        _refuse_two_names(old, new)
    if not _same_name(old, new):
        raise InvalidTaskOptions(
            f"{where}: with {qualified_name(old.handler)} and {qualified_name(new.handler)}. "
            "A group has one handler per topic: use another group name, or one handler "
            "that does both.")
    if old.handler is not new.handler and _code(old.handler) is _code(new.handler):
        raise InvalidTaskOptions(
            f"{where}: with two functions named {qualified_name(new.handler)} (made in a "
            "loop or a factory?), the second would silently replace the first. Give each "
            "its own group (or, for broadcast, one handler that does both).")
    if _options(old) != _options(new):
        raise InvalidTaskOptions(
            f"{where}: {qualified_name(new.handler)} with other options than before "
            "(start, on_dead, max_attempts, retry_backoff, timeout). Subscribe it once, "
            "with the options it should have.")


subscriptions = SubscriptionRegistry()


def _deliver(topic: str, group: str, handler: Handler) -> Callable[..., Any]:
    """The function the group's task runs: builds the event, calls the handler."""

    def event(value: Any, offset: int, key: str | None, published_at: str | None
              ) -> TopicEvent:
        if published_at is None:
            raise ValueError(
                f"Message {topic}@{offset} has no publish time: its published_at in "
                "mysqlq_topic_message was changed by hand to a zero date. Set it to a real "
                "time, then requeue this delivery.")
        return TopicEvent(topic=topic, offset=offset, key=key, payload=value,
                          published_at=dt.datetime.fromisoformat(published_at), group=group)

    if inspect.iscoroutinefunction(handler):
        async def deliver_async(value: Any, *, offset: int, key: str | None = None,
                                published_at: str | None) -> Any:
            return await handler(event(value, offset, key, published_at))

        function: Callable[..., Any] = deliver_async
    else:
        def deliver(value: Any, *, offset: int, key: str | None = None,
                    published_at: str | None) -> Any:
            return handler(event(value, offset, key, published_at))

        function = deliver
    function.__module__ = handler.__module__
    function.__qualname__ = f"{handler.__qualname__}[{topic}:{group}]"
    return function


class Topic:
    """A named stream of messages. Cheap to create: it holds only the name."""

    def __init__(self, name: str) -> None:
        _checked(topic_problem(name))
        self.name = name

    def __repr__(self) -> str:
        return f"Topic({self.name!r})"

    # ------------------------------------------------------------------ publish

    def publish(self, value: Any, *, key: str | int | None = None) -> int:
        """Publish one message in the caller's transaction; return its row id.

        It exists exactly when that transaction commits, and gets its offset right after
        (from the first worker that reads the topic). ``value`` must be a JSON value
        (else :class:`ArgumentEncodingError`, nothing written); messages of one ``key``
        are handled in order within each group. With ``MYSQLQ['IMMEDIATE']`` nothing is
        written: this process's handlers of the topic run after the commit instead.
        """
        text = payload.encode_published(self.name, value, get_settings().MAX_PAYLOAD_BYTES)
        return self._publish([(_key(self.name, key), text)])

    def publish_many(self, values: Iterable[Any], *,
                     keys: Iterable[str | int | None] | None = None) -> int:
        """Publish many messages with multi-row inserts (split to fit the server's
        ``max_allowed_packet``), in the caller's transaction; return how many. Every
        payload is encoded first: one that can't be writes none of them."""
        _checked(_many_problem("values", values) or (
            None if keys is None else _many_problem("keys", keys)))
        limit = get_settings().MAX_PAYLOAD_BYTES
        texts = [payload.encode_published(self.name, value, limit) for value in values]
        # (One key past the values at most: an endless iterable must not hang the call.)
        given = [None] * len(texts) if keys is None else list(
            itertools.islice(keys, len(texts) + 1))
        if len(given) != len(texts):
            counted = len(given) if len(given) < len(texts) else f"more than {len(texts)}"
            raise InvalidTaskOptions(
                f"publish_many() got {len(texts)} payloads but {counted} keys: give "
                "one key (or None) per payload.")
        key_list = [_key(self.name, key) for key in given]
        self._publish(list(zip(key_list, texts, strict=True)))
        return len(texts)

    async def apublish(self, value: Any, *, key: str | int | None = None) -> int:
        """:meth:`publish` from async code (through ``sync_to_async``): it commits at once
        unless it runs inside a transaction, as ``aenqueue`` does."""
        return await sync_to_async(self.publish)(value, key=key)

    async def apublish_many(self, values: Iterable[Any], *,
                            keys: Iterable[str | int | None] | None = None) -> int:
        """:meth:`publish_many` from async code (through ``sync_to_async``)."""
        return await sync_to_async(self.publish_many)(values, keys=keys)

    def _publish(self, rows: list[tuple[str | None, str]]) -> int:
        """Write checked rows, or, in the test mode (``MYSQLQ['IMMEDIATE']``), run them
        through this process's handlers after the commit, writing nothing."""
        from . import broker

        if get_settings().IMMEDIATE:
            from . import immediate_topics

            return immediate_topics.publish(self.name, rows, self._handlers, TopicEvent)
        return broker.publish(self.name, rows, subscriptions.group_queues(self.name))

    def _handlers(self) -> tuple[list[Subscription], list[Subscription]]:
        """This process's group (with their tasks) and broadcast subscriptions to it."""
        return ([s for s in subscriptions.groups() if s.topic == self.name and s.task is not None],
                [s for s in subscriptions.broadcast() if s.topic == self.name])

    # ------------------------------------------------------------------ subscribe

    def subscribe(self, *, group: str | None = None, broadcast: bool = False,
                  start: str = LATEST, max_attempts: int | None = None,
                  retry_backoff: Iterable[float] | None = None,
                  timeout: float | None = None, on_dead: str = SKIP,
                  ) -> Callable[[Handler], Handler]:
        """Register a handler of this topic's messages; it receives a :class:`TopicEvent`.

        ``group="billing"``: each message is handled once by one worker serving the group
        (at least once under crashes), messages of one key in order; a failure retries on
        ``retry_backoff`` (default ``MYSQLQ['TOPIC_RETRY_BACKOFF']``, 10 s … 2 h) up to
        ``max_attempts`` (default 17), then the delivery is dead in the group's dead letter.
        ``on_dead``: whether a dead delivery holds its key's later messages (``"hold"``) or
        not (``"skip"``, the default). ``start``: ``"latest"`` or ``"earliest"``, where
        the group begins when it is created. ``broadcast=True``: every live worker process
        runs the handler for every message published while it lives; no ack, no retry.
        """
        conf = get_settings()
        if broadcast is not True and broadcast is not False:
            raise InvalidTaskOptions(f"broadcast must be True or False, not {broadcast!r}.")
        if broadcast == (group is not None):
            raise InvalidTaskOptions(
                f"Topic {self.name!r}: give subscribe() either group='name' (each message "
                "once per group) or broadcast=True (every worker process), not "
                f"{'both' if broadcast else 'neither'}.")
        if broadcast:
            if (max_attempts, retry_backoff, timeout, on_dead, start) != (
                    None, None, None, SKIP, LATEST):
                raise InvalidTaskOptions(
                    f"Topic {self.name!r}: a broadcast subscription is never retried and "
                    "starts at the latest message: max_attempts, retry_backoff, timeout, "
                    "on_dead and start go with group=... only.")
        else:
            _checked(group_problem(group))
        if start not in STARTS:
            raise InvalidTaskOptions(f"start must be 'latest' or 'earliest', not {start!r}.")
        if on_dead not in ON_DEAD:
            raise InvalidTaskOptions(f"on_dead must be {HOLD!r} or {SKIP!r}, not {on_dead!r}.")
        attempts = conf.TOPIC_MAX_ATTEMPTS if max_attempts is None else max_attempts
        _checked(limits.max_attempts_problem(attempts))
        schedule = (conf.TOPIC_RETRY_BACKOFF if retry_backoff is None
                    else retries.backoff_schedule(
                        list(retry_backoff) if isinstance(retry_backoff, Iterable)
                        and not isinstance(retry_backoff, str | bytes) else retry_backoff))
        if timeout is not None:
            _checked(limits.seconds_problem(timeout, "timeout", zero=False))

        def decorate(handler: Handler) -> Handler:
            if not callable(handler):
                raise InvalidTaskOptions(f"subscribe() decorates a function, not {handler!r}.")
            _checked(unnamed_problem(handler, f"A subscription of topic {self.name!r}",
                                     "wrap it in a def (def handle(event): return "
                                     "other(event)) and subscribe that."))
            if group is None:
                subscriptions.add(Subscription(self.name, handler, None))
                return handler
            task: QueueTask[Any, Any] = QueueTask(
                func=_deliver(self.name, group, handler),
                name=delivery_task_name(self.name, group),
                queue=group_queue(group),
                priority=0,
                max_attempts=attempts,
                retry_backoff=float(schedule[0]),
                timeout=None if timeout is None else float(timeout),
                gate=NO_GATE,
                retry_schedule=tuple(schedule),
            )
            subscription = Subscription(self.name, handler, group, start, task, on_dead)
            subscriptions.add(subscription)
            registry.register(task)
            return handler

        return decorate

