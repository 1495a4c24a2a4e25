"""When the control loop's periodic duties are next due."""

from __future__ import annotations

import dataclasses
import time

from ..conf import QueueSettings


@dataclasses.dataclass
class Due:
    """Monotonic times at which the control loop's periodic duties are next due."""

    beat: float
    #: Next check that the claims waiting here are still ours (while some wait).
    verify: float
    mark: float
    recovery: float
    stale_check: float
    promote: float
    summary: float
    paused_check: float

    @classmethod
    def starting_now(cls, settings: QueueSettings) -> Due:
        now = time.monotonic()
        summary = now + settings.SUMMARY_SECONDS if settings.SUMMARY_SECONDS else float("inf")
        # Sweep at once: a restarted worker frees its previous life's claims.
        return cls(beat=now + settings.HEARTBEAT_SECONDS, verify=now, mark=now, recovery=now,
                   stale_check=now, promote=now, summary=summary, paused_check=now)
