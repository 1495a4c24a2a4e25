"""The one place that reads ``settings.MYSQLQ``.

Every other module asks :func:`get_settings` and gets a validated, frozen
:class:`QueueSettings`, or :class:`SettingsError` listing every problem. The
system check ``django_mysqlq.E001`` reports the same problems, all at once.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, Literal

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

LivenessMode = Literal["connection", "lease"]

SETTING_NAME = "MYSQLQ"


@dataclasses.dataclass(frozen=True)
class QueueSettings:
    """All knobs of the queue, with their defaults."""

    #: Database alias that holds the queue tables (enqueue joins its transactions).
    DATABASE: str = "default"
    #: ``connection``: a claim is lost when its owner's connection id is gone from the
    #: process list, or the server restarted, or the lease ran out. ``lease``: only the
    #: lease counts (for ProxySQL / RDS Proxy, where connection ids are not the client's).
    LIVENESS: LivenessMode = "connection"
    #: Check each connection for a proxy or pooler in between (the server sees it from
    #: another port than this end's): then this process uses lease liveness and polling,
    #: whatever LIVENESS and WAKEUP say. False trusts connection ids (an SSH tunnel).
    DETECT_PROXY: bool = True
    #: Seconds a claim stays valid without a heartbeat renewing it.
    LEASE_SECONDS: float = 30.0
    #: Seconds between a worker's heartbeats (renews its leases and its workers row).
    HEARTBEAT_SECONDS: float = 5.0
    #: Seconds between recovery sweeps (one worker, the holder of a named lock, sweeps).
    RECOVERY_SECONDS: float = 2.0
    #: Idle workers park in ``SELECT SLEEP()`` and producers wake them with ``KILL QUERY``
    #: after commit. Needs direct connections (no proxy) and one database user, or the
    #: CONNECTION ADMIN / SUPER privilege. False: idle workers poll every POLL_SECONDS.
    WAKEUP: bool = True
    #: Longest sleep between two empty claims; idle workers back off up to this.
    POLL_SECONDS: float = 1.0
    #: Defaults for ``@queue_task`` options not given on the decorator.
    DEFAULT_QUEUE: str = "default"
    DEFAULT_PRIORITY: int = 0
    MAX_ATTEMPTS: int = 3
    #: Base delay in seconds of the exponential backoff between attempts.
    RETRY_BACKOFF: float = 2.0
    #: Upper bound of a single retry delay, in seconds.
    RETRY_BACKOFF_MAX: float = 3600.0
    #: Messages claimed by one statement (bounds what a crash can re-run).
    BATCH_SIZE: int = 10
    #: Successes acked together in one transaction; 1 acks each at once. A crash re-runs
    #: at most twice this many finished-but-unacked tasks.
    ACK_BATCH_SIZE: int = 20
    #: Longest a success waits for its batch to fill before it is acked anyway.
    ACK_DELAY_SECONDS: float = 0.02
    #: Seconds a stopping worker waits for running tasks before it gives up on them.
    GRACE_SECONDS: float = 30.0
    #: Seconds between the worker's one-line summaries in the log (0 turns them off).
    SUMMARY_SECONDS: float = 60.0
    #: Largest encoded payload (args + kwargs as JSON) accepted at enqueue.
    MAX_PAYLOAD_BYTES: int = 1_000_000
    #: Modules to import at worker start besides every installed app's ``tasks`` module.
    TASK_MODULES: tuple[str, ...] = ()


_FIELDS = {f.name: f for f in dataclasses.fields(QueueSettings)}


class SettingsError(ValueError):
    """One or more ``MYSQLQ`` entries are invalid."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("; ".join(problems))


def _validate(raw: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    problems: list[str] = []
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in _FIELDS:
            known = ", ".join(sorted(_FIELDS))
            problems.append(f"MYSQLQ[{key!r}] is not a known setting (known: {known}).")
            continue
        values[key] = value

    def positive(name: str, integer: bool = False, allow_zero: bool = False) -> None:
        if name not in values:
            return
        value = values[name]
        kind = int if integer else (int, float)
        if isinstance(value, bool) or not isinstance(value, kind) or not math.isfinite(value):
            expected = "an integer" if integer else "a finite number of seconds"
            problems.append(f"MYSQLQ[{name!r}] must be {expected}, not {value!r}.")
        elif value < 0 or (value == 0 and not allow_zero):
            bound = ">= 0" if allow_zero else "> 0"
            problems.append(f"MYSQLQ[{name!r}] must be {bound}, not {value!r}.")

    for name in ("LEASE_SECONDS", "HEARTBEAT_SECONDS", "RECOVERY_SECONDS", "POLL_SECONDS",
                 "GRACE_SECONDS", "RETRY_BACKOFF_MAX", "ACK_DELAY_SECONDS"):
        positive(name)
    positive("RETRY_BACKOFF", allow_zero=True)
    positive("SUMMARY_SECONDS", allow_zero=True)
    for name in ("MAX_ATTEMPTS", "BATCH_SIZE", "MAX_PAYLOAD_BYTES", "ACK_BATCH_SIZE"):
        positive(name, integer=True)

    for name in ("WAKEUP", "DETECT_PROXY"):
        if name in values and not isinstance(values[name], bool):
            problems.append(f"MYSQLQ[{name!r}] must be True or False, not {values[name]!r}.")
    if "LIVENESS" in values and values["LIVENESS"] not in ("connection", "lease"):
        problems.append(
            f"MYSQLQ['LIVENESS'] must be 'connection' or 'lease', not {values['LIVENESS']!r}."
        )
    for name, longest in (("DATABASE", 1000), ("DEFAULT_QUEUE", 64)):
        value = values.get(name, "x")
        if not isinstance(value, str) or not value or len(value) > longest:
            problems.append(
                f"MYSQLQ[{name!r}] must be a non-empty string of at most {longest} "
                f"characters, not {value!r}.")
    if "DEFAULT_PRIORITY" in values:
        value = values["DEFAULT_PRIORITY"]
        if isinstance(value, bool) or not isinstance(value, int) or not -100 <= value <= 100:
            problems.append(
                f"MYSQLQ['DEFAULT_PRIORITY'] must be an integer from -100 to 100, not {value!r}."
            )
    if "TASK_MODULES" in values:
        modules = values["TASK_MODULES"]
        if not isinstance(modules, list | tuple) or not all(isinstance(m, str) for m in modules):
            problems.append("MYSQLQ['TASK_MODULES'] must be a list of dotted module paths.")
        else:
            values["TASK_MODULES"] = tuple(modules)

    lease = values.get("LEASE_SECONDS", QueueSettings.LEASE_SECONDS)
    beat = values.get("HEARTBEAT_SECONDS", QueueSettings.HEARTBEAT_SECONDS)
    if not problems and beat * 2 > lease:
        problems.append(
            f"MYSQLQ['HEARTBEAT_SECONDS'] ({beat}) must be at most half of "
            f"MYSQLQ['LEASE_SECONDS'] ({lease}), or live workers lose their claims."
        )
    return values, problems


def load_settings() -> QueueSettings:
    """Read and validate ``settings.MYSQLQ``; raise :class:`SettingsError` if it is wrong."""
    raw = getattr(settings, SETTING_NAME, {})
    if not isinstance(raw, Mapping):
        raise SettingsError([f"settings.MYSQLQ must be a dict, not {type(raw).__name__}."])
    values, problems = _validate(raw)
    if problems:
        raise SettingsError(problems)
    return QueueSettings(**values)


_cache: list[QueueSettings] = []


def get_settings() -> QueueSettings:
    """The current settings, read once and re-read when ``MYSQLQ`` changes."""
    if not _cache:
        _cache.append(load_settings())
    return _cache[0]


@receiver(setting_changed)
def _forget_settings(*, setting: str, **kwargs: Any) -> None:
    if setting == SETTING_NAME:
        _cache.clear()
