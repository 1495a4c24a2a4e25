"""``drain()``'s topic part: the consumer groups it delivers to, pumped as a worker pumps.

The groups are this process's group subscriptions (the task modules imported first, as a
worker does, when the drain may deliver to a group: ``queues`` not given, or naming a
``group:`` queue; a drain of other queues imports nothing), those whose queue
(``group:<group>``) ``drain(queues=...)`` names, or all of them. Each topic is set up the
first time it has something to deliver (its row, or a message waiting for its offset):
every group this process knows on it gets its row, at its ``start``, *before* anything is
given an offset, so a ``start="latest"`` group gets the messages published before the
drain that had no offset yet (offsets are given by readers, lazily: in a test with no
worker, none has one). A topic with neither is left alone: a drain of other queues writes
no topic or group row.

The pump itself is the worker's (``broker.pump_group(sequence=True)``): it gives the
topic's waiting messages their offsets and inserts the deliveries, within the window,
in the group's queue, where the drain claims them like any message.
"""

from __future__ import annotations

from collections.abc import Sequence

from . import broker
from .conf import get_settings
from .registry import import_task_modules
from .topicnames import group_of_queue
from .topics import Subscription, subscriptions
from .worker.topics import group_spec

__all__ = ["GroupPumps"]


class GroupPumps:
    """The groups one ``drain()`` delivers to, on the topics' database (``alias``)."""

    def __init__(self, alias: str, queues: Sequence[str] | None) -> None:
        if queues is None or any(group_of_queue(q) is not None for q in queues):
            import_task_modules()  # the subscriptions a worker would know
        self.alias = alias
        known = [s for s in subscriptions.groups() if s.task is not None]
        wanted = known if queues is None else [s for s in known if s.queue in set(queues)]
        self.specs = [group_spec(s) for s in wanted]
        #: Every group this process knows on each drained topic (made together: see above).
        self._all: dict[str, list[Subscription]] = {}
        for subscription in known:
            if any(spec.topic == subscription.topic for spec in self.specs):
                self._all.setdefault(subscription.topic, []).append(subscription)
        self._ready: set[str] = set()

    @property
    def queues(self) -> list[str]:
        return [spec.queue for spec in self.specs]

    def pump(self) -> int:
        """Set up the topics that have something to deliver and pump each group once;
        return the deliveries made."""
        conf = get_settings()
        made = 0
        for spec in self.specs:
            if not self._set_up(spec.topic):
                continue
            made += broker.pump_group(spec, conf.TOPIC_PUMP_BATCH, conf.TOPIC_WINDOW,
                                      self.alias, sequence=True).made
        return made

    def _set_up(self, topic: str) -> bool:
        """Whether ``topic`` is set up: made now if it has a row or a message waiting
        for its offset (its row, then every known group's, before any offset is given)."""
        if topic in self._ready:
            return True
        if not (broker.topic_exists(topic, self.alias)
                or broker.has_unsequenced(topic, self.alias)):
            return False
        broker.ensure_topic(topic, self.alias)
        for subscription in self._all[topic]:
            broker.create_group(group_spec(subscription), self.alias)
        self._ready.add(topic)
        return True
