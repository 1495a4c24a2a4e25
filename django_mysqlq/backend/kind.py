"""What marks a Tasks backend as this queue's, below every other module of the package.

The worker's side (``attempts``, ``lookup``) must recognise a ``MySQLQueueBackend``
without importing ``core``, which imports the worker's side for the test mode: the
backend class inherits this marker, and they check for it.
"""

from __future__ import annotations


class RunsOnThisQueue:
    """A Tasks backend whose messages this queue's workers run."""
