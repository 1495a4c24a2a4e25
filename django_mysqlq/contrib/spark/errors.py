"""The pipeline's one error type: every message says what was wrong and what to do."""

from __future__ import annotations

from ...exceptions import QueueError


class PipelineError(QueueError, ValueError):
    """Bad input to a pipeline job, found before anything was written."""
