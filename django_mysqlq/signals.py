"""Signals, named in the past tense like Django's own.

They are sent by the process where the event happened: ``message_enqueued`` by
the producer (after the enqueuing transaction commits), the others by the worker.
"""

from __future__ import annotations

from django.dispatch import Signal

#: sender: the task; kwargs: ``message_ids``.
message_enqueued = Signal()
#: sender: the task; kwargs: ``message_id``, ``attempt``.
task_started = Signal()
#: sender: the task; kwargs: ``message_id``, ``attempt``, ``outcome``, ``error`` (or None).
task_finished = Signal()
#: sender: the worker; kwargs: ``message_id``, ``attempt``, ``seconds`` (run so far).
#: Sent once when a running task passes its ``timeout``.
task_overran = Signal()
#: sender: None; kwargs: ``message_ids`` (claims of vanished workers given back).
messages_recovered = Signal()
#: sender: the worker; kwargs: none.
worker_started = Signal()
#: sender: the worker; kwargs: none.
worker_stopped = Signal()
#: sender: the topic's name; kwargs: ``count`` (messages published by the transaction's
#: ``publish()``/``publish_many()`` call, sent after it commits, by the publisher).
topic_published = Signal()
#: sender: the topic's name; kwargs: ``group``, ``count`` (messages turned into deliveries of the
#: group by a worker's pump).
topic_pumped = Signal()
#: sender: the topic's name; kwargs: ``group``, ``message_id`` (the delivery), ``offset``,
#: ``seconds`` (run so far), ``timeout``. Sent once by the worker running a group's
#: handler when it passes its ``timeout`` (besides ``task_overran``), with a log line.
topic_handler_overran = Signal()
#: A consumer group's pump stopped where a member can't go on by itself (its pump fails,
#: a message too big for a delivery): sender the topic
#: name; ``group``, ``problem`` (what ``queuetopic groups`` shows). Sent by each member
#: once per cause, with an error log line (an alert hook).
topic_group_stopped = Signal()
