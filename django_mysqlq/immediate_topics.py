"""``MYSQLQ['IMMEDIATE']`` for topics: a publish writes no table; once the publishing
transaction commits, this process calls the handlers it knows for the topic.

Each group handler this process subscribed gets every message once, through the group's
task, as a worker runs a delivery (one attempt, ``task_started`` / ``task_finished``, the
payload's JSON round trip); then each broadcast handler gets it (``group`` None).
``topic_published`` is sent at the commit, before any handler runs. A failing handler is
not retried: with ``MYSQLQ['IMMEDIATE_RAISE']`` (the default) the first exception is raised
in the publishing code once every handler ran, otherwise it is logged.
"""

from __future__ import annotations

import datetime as dt
import functools
import itertools
import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from . import awaiting, immediate, payload
from .conf import get_settings
from .messages import NewMessage
from .signals import topic_published

if TYPE_CHECKING:
    from .topics import Subscription

logger = logging.getLogger("django_mysqlq")

#: The offsets given in this process, counted from 1 per topic (no row ever holds them).
_offsets: dict[str, itertools.count[int]] = {}
_offsets_lock = threading.Lock()


def _next_offset(topic: str) -> int:
    with _offsets_lock:
        return next(_offsets.setdefault(topic, itertools.count(1)))


def publish(topic: str, rows: Sequence[tuple[str | None, str]],
            handlers: Callable[[], tuple[list[Subscription], list[Subscription]]],
            event: Callable[..., Any]) -> int:
    """Run ``rows`` (``(key, payload JSON)``, already checked) through this process's
    handlers of ``topic`` after the commit; return an id for the first (0 for none).
    ``handlers()`` gives the topic's group and broadcast subscriptions at the commit,
    ``event`` makes a broadcast handler's event (both from ``topics``, which imports
    this module)."""
    if not rows:
        return 0
    ids = [immediate.new_id() for _ in rows]
    published_at = timezone.now().astimezone(dt.UTC)
    callback = functools.partial(_deliver_all, topic, list(rows), published_at, handlers,
                                 event)
    immediate._after_commit(get_settings().DATABASE, callback)
    return ids[0]


def _deliver_all(topic: str, rows: list[tuple[str | None, str]], published_at: dt.datetime,
                 handlers: Callable[[], tuple[list[Subscription], list[Subscription]]],
                 event: Callable[..., Any]) -> None:
    """Committed: give offsets, send ``topic_published``, call the handlers."""
    from .broker import send_robust

    offsets = [_next_offset(topic) for _ in rows]
    send_robust(topic_published, topic, count=len(rows))
    groups, listeners = handlers()
    first_error: BaseException | None = None
    for offset, (key, text) in zip(offsets, rows, strict=True):
        for group in groups:
            error = _run_group(group, offset, key, text, published_at)
            first_error = first_error or error
        if listeners:  # one event for them all, as a worker's broadcast reader makes it
            [value], _ = payload.decode(f'{{"args":[{text}]}}')
            heard = event(topic=topic, offset=offset, key=key, payload=value,
                          published_at=published_at)
            for listener in listeners:
                error = _run_broadcast(listener, heard)
                first_error = first_error or error
    if first_error is not None and get_settings().IMMEDIATE_RAISE:
        raise first_error


def _run_group(group: Subscription, offset: int, key: str | None, text: str,
               published_at: dt.datetime) -> BaseException | None:
    """One delivery to ``group``, run as its worker runs one (one attempt)."""
    from .broker.deliveries import delivery_payload

    task = group.task
    assert task is not None
    message = NewMessage(
        task_name=task.name, queue=task.queue, priority=0,
        payload=delivery_payload(text, offset, key, published_at), run_at=None, delay=0.0,
        max_attempts=task.max_attempts, retry_backoff=task.retry_backoff,
        timeout=task.timeout, dedup_key=None)
    record = immediate.ImmediateRecord(id=immediate.new_id(), task_name=task.name,
                                       queue=task.queue, enqueued_at=timezone.now(),
                                       run_at=None)
    return immediate.run_one(task, message, record)


def _run_broadcast(listener: Subscription, heard: Any) -> BaseException | None:
    """One broadcast handler's call of the message's event ``heard``."""
    try:
        awaiting.call(listener.handler, heard)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # the handler's boundary, as on a worker
        if not get_settings().IMMEDIATE_RAISE:
            logger.error("Broadcast handler %s failed on %s@%d (immediate mode).",
                         getattr(listener.handler, "__qualname__", listener.handler),
                         heard.topic, heard.offset, exc_info=exc)
        return exc
    return None


def reset() -> None:
    """Start every topic's offsets at 1 again (tests)."""
    with _offsets_lock:
        _offsets.clear()

