"""The worker: claims messages and runs them on threads (see :mod:`.loop`)."""

from .loop import Worker
from .options import WorkerOptions

__all__ = ["Worker", "WorkerOptions"]
