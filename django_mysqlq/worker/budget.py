"""``--max-tasks``: how many messages the whole process may still claim.

One process serving queues on several databases runs one worker per database; the budget
is the process's, shared by them (``--max-tasks 10`` means ten tasks, not ten per
database). A worker reserves before it claims and gives back what the claim did not find,
so two workers never claim past it together.
"""

from __future__ import annotations

import threading


class TaskBudget:
    """The process's ``--max-tasks`` (None: no limit), thread-safe."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self._taken = 0
        self._lock = threading.Lock()

    def reserve(self, wanted: int) -> int:
        """Take up to ``wanted`` from what is left; how many were taken."""
        if self.limit is None:
            return wanted
        with self._lock:
            granted = max(0, min(wanted, self.limit - self._taken))
            self._taken += granted
            return granted

    def give_back(self, unused: int) -> None:
        """Return reserved tasks the claim did not use."""
        if self.limit is None or unused <= 0:
            return
        with self._lock:
            self._taken -= unused

    @property
    def spent(self) -> bool:
        """Whether the process has claimed all it may (never, without a limit)."""
        if self.limit is None:
            return False
        with self._lock:
            return self._taken >= self.limit
