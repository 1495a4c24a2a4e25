"""Operator operations on topics, shared by ``manage.py queuetopic`` and the admin.

Reset and replay change a group (through the broker, recorded on the group's row as
``changed_at``/``changed_by`` and logged), drop retires one (logged); lookups and traces
are reads.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

from django.db import DataError

from . import broker
from .broker import Operator
from .conf import get_settings
from .log import one_line
from .registry import import_task_modules
from .topicnames import delivery_task_name, group_queue
from .topics import subscriptions


def group_spec(topic: str, group: str) -> broker.GroupSpec:
    """How replayed deliveries are made: the subscription's options when this process
    declares it, else the settings' defaults (attempts, first backoff, no timeout). The
    task modules are imported first, as a worker does: a web process serving the admin
    may not have imported the handlers' module yet (a replay of an ``on_dead="hold"``
    group then made deliveries that held nothing, with no timeout)."""
    import_task_modules()
    for subscription in subscriptions.groups():
        if (subscription.topic, subscription.group) == (topic, group) and subscription.task:
            task = subscription.task
            return broker.GroupSpec(
                topic=topic, group=group, queue=task.queue, task_name=task.name,
                on_dead=subscription.on_dead, max_attempts=task.max_attempts,
                retry_backoff=task.retry_backoff, timeout=task.timeout,
                start=subscription.start)
    conf = get_settings()
    return broker.GroupSpec(
        topic=topic, group=group, queue=group_queue(group),
        task_name=delivery_task_name(topic, group), on_dead="skip",
        max_attempts=conf.TOPIC_MAX_ATTEMPTS, retry_backoff=float(conf.TOPIC_RETRY_BACKOFF[0]),
        timeout=None)


def parse_time(text: str) -> dt.datetime:
    """An ISO date/time (UTC when it has no offset)."""
    try:
        value = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"expected an ISO date/time like 2026-11-23T08:00 (UTC unless it "
                         f"has an offset), not {text!r}") from None
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


def reset(topic: str, group: str, target: broker.ResetTarget, who: Operator,
          names: dict[str, str] | None = None) -> broker.ResetResult:
    """Reset the group; a refusal names the other targets as ``names`` says (the
    admin's words by default, ``broker.topic_ops.CLI_NAMES`` for the command)."""
    return broker.reset_group(topic, group, target, who, names=names)


def drop(topic: str, group: str, who: Operator) -> broker.DropResult:
    """Retire the group: its waiting and dead deliveries cancelled, its links and row
    deleted (running ones finish)."""
    return broker.drop_group(topic, group, who)


def drop_summary(done: broker.DropResult) -> str:
    """What a drop did, said by the command."""
    running = (f"; {done.running} running deliveries left to finish (one that fails "
               "afterwards waits for a retry with no handler: cancel it)"
               if done.running else "; none was running")
    return (f"Dropped group {done.group!r} of topic {done.topic!r} (position "
            f"{done.position}): {done.cancelled_waiting} waiting deliveries cancelled, "
            f"{done.cancelled_dead} dead deliveries cancelled, {done.links_deleted} delivery "
            f"links deleted{running}. A worker still running its subscription makes the "
            "group again at its start: remove the subscription from the code and deploy "
            "first.")


def reset_cancelled(done: broker.ResetResult, replay_with: Callable[[int, int], str],
                    reset_to: Callable[[int], str] = lambda first: f"reset to offset {first}"
                    ) -> str:
    """How many waiting deliveries a reset cancelled, and when some were at offsets at or
    before its new position, that those won't run: their offsets, and how to replay
    them (``replay_with(first, last)``: the command's or the admin's way). A replay runs
    after the group's later deliveries, so where the skipped ones run right up to the new
    position it names the reset that keeps publish order (``reset_to(first)``). Said by
    the command and the admin alike, after the positions."""
    said = f"{done.cancelled} waiting deliveries cancelled"
    if not done.skipped:
        return f"{said}."
    which = ("it" if done.cancelled == 1 else f"all {done.skipped}"
             if done.skipped == done.cancelled else f"{done.skipped} of them")
    one = done.skipped == 1
    before = (f"{'is' if one else 'are'} before offset {done.new_position + 1}, the next "
              "one the group gets,")
    gone = done.skipped_gone
    if done.skipped_offsets is None:
        return _come_again(done, f"{said}: {which} {before} and will not run: retention "
                                 "deleted their messages, so no replay brings them back")
    first, last = done.skipped_offsets
    span = f"offset {first}" if first == last else f"offsets {first}-{last}"
    if done.skipped_gaps:
        span += ", not every one between"
    linked = done.skipped - gone  # with an offset: replayable
    replay = f"{replay_with(first, last)} if {'it' if linked == 1 else 'they'} should" + (
        "; the range's other offsets would run again too" if done.skipped_gaps else "")
    if gone:
        return _come_again(done, f"{said}: {which} {before} and will not run: "
                                 f"{linked} of them ({span}) can be replayed "
                                 f"with {replay}, {gone} cannot (retention deleted their "
                                 "messages)")
    if last == done.new_position and not done.skipped_gaps:
        replay += (f"; a replay runs {'it' if one else 'them'} after the group's later "
                   f"deliveries: for publish order, each key's too, {reset_to(first)} "
                   "instead")
    return _come_again(done, f"{said}: {which} ({span}) {before} and will not run "
                             f"(replay {'it' if one else 'them'} with {replay})")


def _come_again(done: broker.ResetResult, said: str) -> str:
    """``said``, then how many of the cancelled deliveries the group gets again."""
    other = done.cancelled - done.skipped
    return f"{said}; the other {other} come again." if other else f"{said}."


def reset_summary(done: broker.ResetResult, target: broker.ResetTarget) -> str:
    """What a reset to a time did when no message was published at or after it yet (the
    group is set to the latest offset); empty otherwise. Said by the command and the
    admin alike."""
    if not done.none_at_or_after_time or target.to_time is None:
        return ""
    return (f"No message was published at or after {target.to_time.isoformat()} yet: the "
            f"group is set to the latest offset {done.new_position}; it gets what is "
            "published from now on.")


def replay(topic: str, group: str, first: int, last: int,
           who: Operator) -> broker.ReplayResult:
    """Replay ``first..last`` into the group. A message of the range whose delivery the
    server refuses (a key stored by hand past what a delivery's ordered subject takes)
    is a ValueError saying so: the command and the admin show it (it was a traceback)."""
    try:
        return broker.replay_range(group_spec(topic, group), first, last, who)
    except DataError as exc:
        raise ValueError(
            f"Offsets {first}..{last} of topic {topic!r} could not be replayed into group "
            f"{group!r}: the server refused a delivery ({one_line(str(exc))}). A message of "
            "the range was most likely changed by hand (a key longer than a delivery's "
            "ordered subject takes): see queuetopic lookup, and replay around it.") from exc


def replay_shortfall(done: broker.ReplayResult) -> str:
    """When a replay made fewer deliveries than its range has offsets (their messages
    deleted while it ran, by retention, or before it by hand): how many offsets were
    missing and the first kept offset now; empty otherwise. Said by the command and the
    admin alike, after the count of deliveries."""
    if not done.missing:
        return ""
    kept = ("" if done.first_kept is None
            else f"; the topic keeps offsets from {done.first_kept} now")
    return (f"{done.missing} of the {done.last - done.first + 1} offsets had no message to "
            f"replay (deleted while the replay ran, by retention, or before it by hand), so "
            f"they got no delivery{kept}.")


def no_match(topic: str, offset: int | None) -> str:
    """What a lookup that found nothing says: for an offset, whether retention deleted it
    or it was not given out yet (or the topic is unknown)."""
    if offset is None:
        return "No message matches."
    bounds = broker.topic_bounds(topic)
    if bounds is None:
        return (f"No message matches: no message of topic {topic!r} has an offset yet (or "
                "no such topic).")
    first, last = bounds
    if offset < first:
        kept = f"it keeps offsets {first} to {last}" if first <= last else "it keeps none now"
        return (f"No message matches: retention deleted the messages of topic {topic!r} "
                f"before offset {first} ({kept}).")
    if offset > last:
        return (f"No message matches: topic {topic!r} has given offsets up to {last} so "
                "far.")
    return "No message matches."
