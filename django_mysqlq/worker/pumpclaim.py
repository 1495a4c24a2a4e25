"""The worker's side of a pump that claims for it (``TopicDuty.pump(claimer=…)``).

A member with room to run deliveries lets its group's pump insert them already claimed
(``broker.pump_claiming``) instead of claiming them afterwards. Its room is the claim's,
taken half a batch ahead: a pump takes longer than a claim, and the task threads would
otherwise run dry meanwhile; the claims held stay within the claim's bound
(``max(concurrency, claim batch)``). Only for groups whose queue no task queue precedes
in the worker's claim order (``--groups`` members; a worker of every queue claims
``default`` first, so its groups' deliveries are pumped ready and claimed after it, as
before). Bookkeeping only, no SQL.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..messages import ClaimedMessage

if TYPE_CHECKING:
    from .loop import Worker


class PumpClaimer:
    """Reserves a worker's room for a pump's claim and takes what it claimed."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.id = worker.id

    def pump_room(self, queue: str) -> int:
        """How many deliveries of ``queue`` the worker takes now (reserved from its
        ``--max-tasks`` budget); 0 without room; -1 when it claims nothing of ``queue``
        (paused): the group is then pumped by its window."""
        worker = self.worker
        active = worker._active
        if queue not in active:
            return -1
        # Queues are claimed in the worker's order: a task queue served before this group
        # keeps its turn (the group's deliveries are then pumped ready and claimed after).
        groups = {spec.queue for spec in worker.topics.specs}
        if any(ahead not in groups for ahead in active[:active.index(queue)]):
            return -1
        options, in_flight = worker.options, worker.holdings.in_flight
        wanted = min(options.claim_batch,
                     max(options.concurrency, options.claim_batch) - in_flight)
        if in_flight >= options.concurrency and wanted < options.claim_batch // 2:
            return 0
        if wanted <= 0 or worker._over_memory() or worker.gate.solo_pending:
            return 0
        return worker.budget.reserve(wanted)

    def pump_took(self, messages: list[ClaimedMessage], reserved: int) -> None:
        """The pump claimed ``messages`` of the ``reserved`` ones (``[]`` if it failed)."""
        self.worker.budget.give_back(reserved - len(messages))
        if messages:
            self.worker.holdings.add(messages)
