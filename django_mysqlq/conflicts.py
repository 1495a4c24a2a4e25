"""Your own transactions, run again when they lose a conflict: deadlocks, and on a Galera
cluster certification conflicts.

``enqueue()`` joins the caller's transaction, so on MariaDB Galera Cluster the caller's
``COMMIT`` may fail with a deadlock error (1213) when another node committed a change to a
row the transaction wrote (a business row, or a message's dedup key) after it began.
Nothing of the transaction is kept, messages included; Django raises the error and does
not retry. :func:`retry_on_conflict` runs a function in its own transaction and runs it
again, whole, on 1213 or a lock wait timeout (1205)::

    from django_mysqlq.conflicts import retry_on_conflict

    @retry_on_conflict()
    def place_order(cart_id: int) -> int:
        order = Order.objects.create(...)
        send_confirmation.enqueue(order.pk)   # in the same transaction
        return order.pk

The function must be safe to run again from the start (it is: its earlier run left
nothing), and must be called outside ``transaction.atomic()``: inside one, the outer
transaction is lost with the conflict and only its owner can start it again.
"""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from django.db import DEFAULT_DB_ALIAS, OperationalError, connections, transaction

P = ParamSpec("P")
T = TypeVar("T")

#: Deadlock (a certification conflict on Galera) and lock wait timeout.
CONFLICTS = frozenset({1213, 1205})
#: Longest pause before a new try, in seconds (the pauses grow from 10 ms with jitter).
LONGEST_PAUSE = 0.5


def retry_on_conflict(using: str | None = None, attempts: int = 5
                      ) -> Callable[[Callable[P, T]], Callable[P, T]]:
    """Decorate a function to run in ``transaction.atomic(using)``, again on a conflict.

    Up to ``attempts`` runs in all, with a short jittered pause between them; the last
    conflict is raised as it came. Any other error is raised at once.
    """
    if not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 1:
        raise ValueError(f"retry_on_conflict(attempts=...) must be a whole number of at "
                         f"least 1, not {attempts!r}.")
    alias = using or DEFAULT_DB_ALIAS

    def decorate(func: Callable[P, T]) -> Callable[P, T]:
        @functools.wraps(func)
        def run(*args: P.args, **kwargs: P.kwargs) -> T:
            if connections[alias].in_atomic_block:
                raise RuntimeError(
                    f"{func.__qualname__} is decorated with @retry_on_conflict but was "
                    f"called inside transaction.atomic() on {alias!r}: a conflict there "
                    "loses the outer transaction, which only its owner can run again. "
                    "Call it outside any atomic() block, or decorate the outermost function.")
            for attempt in range(attempts):
                try:
                    with transaction.atomic(using=alias):
                        return func(*args, **kwargs)
                except OperationalError as exc:
                    code = exc.args[0] if exc.args else None
                    if code not in CONFLICTS or attempt == attempts - 1:
                        raise
                time.sleep(random.uniform(0, min(LONGEST_PAUSE, 0.01 * 2**attempt)))
            raise AssertionError("unreachable")

        return run

    return decorate
