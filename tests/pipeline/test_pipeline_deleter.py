"""The archive's deleter thread, with a stand-in delete function (no Spark, no MySQL): a
failed delete must reach the driver, never leave it blocked on the deleter's queue while
it holds the archive's named lock."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

pytest.importorskip("pyspark")

from django_mysqlq.contrib.spark import archiving
from django_mysqlq.contrib.spark.errors import PipelineError

#: Generous: the driver's call must end long before this (it ends within a second).
HANG = 30.0


def _record(number: int) -> dict[str, Any]:
    return {"kind": "history", "batch": f"history-{number}"}


@pytest.mark.parametrize("then", ["submit", "finish"])
def test_a_failed_delete_with_the_next_batch_queued_raises_instead_of_hanging(
        monkeypatch, then: str):
    deleting, fail = threading.Event(), threading.Event()

    def delete(control: Any, record: dict[str, Any], ids: list[int], alias: str,
               delete_batch: int, try_drop: bool = True) -> int:
        if record["batch"] == "history-1":
            deleting.set()
            assert fail.wait(HANG)
            raise RuntimeError("Lost connection to server during query")
        return len(ids)

    monkeypatch.setattr(archiving.batches, "delete", delete)
    deleter = archiving.Deleter(None, "default", 100, None)  # type: ignore[arg-type]
    deleter.start()
    deleter.submit(_record(1), [1, 2])
    assert deleting.wait(HANG)
    deleter.submit(_record(2), [3, 4])  # waits in the queue: the deleter is busy with 1
    outcome: list[BaseException | None] = []

    def driver() -> None:
        try:
            if then == "submit":
                deleter.submit(_record(3), [5, 6])
            else:
                deleter.finish()
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001  (checked below)
            outcome.append(exc)

    caller = threading.Thread(target=driver, daemon=True)
    caller.start()
    # Let the call reach the queue before batch 1 fails (a call that starts after the
    # failure is refused by its first check and would not show a hang).
    time.sleep(1.0)
    fail.set()
    caller.join(HANG)
    assert not caller.is_alive(), f"{then}() hung on the deleter's full queue"
    assert isinstance(outcome[0], PipelineError)
    assert "Deleting archived rows failed" in str(outcome[0])
    deleter.join(HANG)
    assert not deleter.is_alive()


def test_a_stopped_deleter_is_stopped_again_without_blocking(monkeypatch):
    """The driver's ``finally`` stops the deleter after any error; a deleter that died
    with a batch in its queue must not block that either."""
    def delete(*args: Any, **kwargs: Any) -> int:
        raise RuntimeError("boom")

    monkeypatch.setattr(archiving.batches, "delete", delete)
    deleter = archiving.Deleter(None, "default", 100, None)  # type: ignore[arg-type]
    deleter.start()
    deleter.submit(_record(1), [1])
    deleter.join(HANG)
    deleter.work.put((_record(2), [2], False))  # as if queued just before it died
    stopper = threading.Thread(target=deleter.stop, daemon=True)
    stopper.start()
    stopper.join(HANG)
    assert not stopper.is_alive()
