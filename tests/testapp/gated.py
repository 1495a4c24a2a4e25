"""Ordered and concurrency-limited tasks for tests/test_subjects*.py: each run writes its
start and end to :class:`GateRun`, from which order per subject and the limit per key are
proven (tests/gate_ledger.py)."""

import os
import random
import threading
import time

from django_mysqlq import queue_task

from .models import GateRun

#: Messages of one key of ``limited_step`` that may run at once.
LIMIT = 2


def _edge(label: str, key: str, seq: int, edge: str, outcome: str = "") -> None:
    GateRun.objects.create(label=label, key=key, seq=seq, edge=edge, outcome=outcome,
                           at=time.time(), pid=os.getpid(),
                           thread=threading.current_thread().name)


def _run(label: str, key: str, seq: int, sleep_ms: int, fail_rate: float) -> int:
    _edge(label, key, seq, "start")
    time.sleep(sleep_ms / 1000)
    if fail_rate and random.random() < fail_rate:
        _edge(label, key, seq, "end", "failed")
        raise RuntimeError(f"random failure of {key}#{seq}")
    _edge(label, key, seq, "end", "ok")
    return seq


@queue_task(ordered_by="key", max_attempts=20, retry_backoff=0.02)
def ordered_step(key: str, seq: int, label: str, sleep_ms: int = 0,
                 fail_rate: float = 0.0) -> int:
    return _run(label, key, seq, sleep_ms, fail_rate)


@queue_task(concurrency_key="key", concurrency_limit=LIMIT, max_attempts=20,
            retry_backoff=0.02)
def limited_step(key: str, seq: int, label: str, sleep_ms: int = 0,
                 fail_rate: float = 0.0) -> int:
    return _run(label, key, seq, sleep_ms, fail_rate)


@queue_task(ordered_by="key", max_attempts=3, retry_backoff=0.3)
def ordered_fails_first(key: str, seq: int, label: str, failures: int) -> int:
    """Fails its first ``failures`` runs (counted in the ledger), then succeeds."""
    done = GateRun.objects.filter(label=label, key=key, seq=seq, edge="start").count()
    _edge(label, key, seq, "start")
    if done < failures:
        _edge(label, key, seq, "end", "failed")
        raise RuntimeError(f"{key}#{seq} fails run {done + 1}")
    _edge(label, key, seq, "end", "ok")
    return seq


@queue_task(ordered_by="key", max_attempts=1)
def ordered_dies(key: str, seq: int, label: str) -> None:
    """Always fails, on its only attempt: a dead head that holds its subject."""
    _edge(label, key, seq, "start")
    _edge(label, key, seq, "end", "failed")
    raise RuntimeError(f"{key}#{seq} dies")


@queue_task(ordered_by="key", on_dead="skip", max_attempts=1)
def ordered_dies_skipping(key: str, seq: int, label: str) -> None:
    """Always fails on its only attempt, and its subject goes on without it."""
    _edge(label, key, seq, "start")
    _edge(label, key, seq, "end", "failed")
    raise RuntimeError(f"{key}#{seq} dies")


@queue_task(ordered_by="key", max_attempts=5, retry_backoff=0)
def ordered_sleeps(key: str, seq: int, label: str, seconds: float) -> int:
    """Sleeps long enough to be killed while it runs."""
    _edge(label, key, seq, "start")
    time.sleep(seconds)
    _edge(label, key, seq, "end", "ok")
    return seq


@queue_task(ordered_by="key", atomic=True)
def ordered_atomic(key: str, seq: int, label: str) -> int:
    """Its ack commits with its body (``ack_within``)."""
    _edge(label, key, seq, "start")
    _edge(label, key, seq, "end", "ok")
    return seq


@queue_task(ordered_by="key", takes_context=True)
def ordered_with_context(context, key: str, seq: int) -> str | None:
    """Its subject comes from ``key``, not from the context the worker passes first."""
    return context.subject
