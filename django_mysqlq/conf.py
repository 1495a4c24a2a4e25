"""The one place that reads ``settings.MYSQLQ``.

Every other module asks :func:`get_settings` and gets a validated, frozen
:class:`QueueSettings`, or :class:`SettingsError` listing every problem. The
system check ``django_mysqlq.E001`` reports the same problems, all at once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Literal

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from . import cron, limits, payload, retries

LivenessMode = Literal["connection", "lease"]
LogFormat = Literal["text", "json"]
LOG_FORMATS: tuple[LogFormat, ...] = ("text", "json")

SETTING_NAME = "MYSQLQ"
#: Largest BATCH_SIZE and ACK_BATCH_SIZE: rows per claim or ack statement.
MAX_BATCH = 10_000
#: Largest MAX_PAYLOAD_BYTES: the server's largest max_allowed_packet (1 GiB).
MAX_PAYLOAD_BYTES = 2**30


@dataclasses.dataclass(frozen=True)
class QueueSettings:
    """All knobs of the queue, with their defaults."""

    #: Database alias that holds the queue tables (enqueue joins its transactions): the
    #: alias of every queue that ``QUEUES`` or a router does not place elsewhere.
    DATABASE: str = "default"
    #: Per-queue settings: ``{"emails": {"DATABASE": "queues_b"}}`` puts a queue's messages,
    #: history and workers on another alias (docs/scaling.md). Wins over a router's
    #: ``db_for_queue``.
    QUEUES: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    #: Alias the read-only views (admin lists, dashboard, ``queuestats``, the pipeline's
    #: reads) use: a replica of the queue database ``DATABASE``; or a dict, queue alias ->
    #: its replica's alias. None: each alias is read where it lives. Never used by a
    #: claim, an ack or an operator action.
    READ_DATABASE: str | Mapping[str, str] | None = None
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
    #: at most this many finished-but-unacked tasks: task threads wait while this many
    #: successes are unacked.
    ACK_BATCH_SIZE: int = 20
    #: Longest a success waits for its batch to fill before it is acked anyway.
    ACK_DELAY_SECONDS: float = 0.02
    #: Seconds a stopping worker waits for running tasks before it gives up on them.
    GRACE_SECONDS: float = 30.0
    #: Seconds between the worker's one-line summaries in the log (0 turns them off).
    SUMMARY_SECONDS: float = 60.0
    #: Format of the log handler ``runqueueworker`` installs when the project's ``LOGGING``
    #: shows nothing of ``django_mysqlq``: ``text`` or ``json`` (one object per line, for
    #: log shippers). ``runqueueworker --log-format`` overrides it.
    LOG_FORMAT: LogFormat = "text"
    #: InnoDB history list length past which the worker summary, ``queuestats`` and the
    #: dashboard warn of purge lag (0 turns that warning off).
    PURGE_LAG_WARNING: int = 100_000
    #: Age in seconds of the oldest open transaction past which they warn (0: off).
    PURGE_LAG_WARNING_SECONDS: float = 300.0
    #: Largest encoded payload (args + kwargs as JSON) accepted at enqueue.
    MAX_PAYLOAD_BYTES: int = 1_000_000
    #: Times a message whose task a worker doesn't know (a rolling deploy: an old worker
    #: claimed a new task's message) is given back for later, 5 s then doubling up to
    #: 5 minutes apart (12: about 35 minutes), before it goes dead. Its attempts are kept.
    UNKNOWN_TASK_RETRIES: int = 12
    #: Modules to import at worker start besides every installed app's ``tasks`` module.
    TASK_MODULES: tuple[str, ...] = ()
    #: Dead messages that died longer ago than this many seconds are deleted by the
    #: recovery leader (history keeps a ``cancelled`` row with their arguments). None:
    #: keep them until an operator acts.
    DEAD_RETENTION_SECONDS: float | None = None
    #: Rows of stopped workers last heard from longer ago than this are deleted by the
    #: recovery leader. None: keep them forever.
    WORKER_RETENTION_SECONDS: float | None = 7 * 86400.0
    #: Whole seconds a worker's housekeeping step (retention, repairs, promotion,
    #: schedules) and its throttled claim wait for a table or row lock another session
    #: holds (``lock_wait_timeout``, ``innodb_lock_wait_timeout``); past that the step is
    #: skipped until the next round, so claims, heartbeats and recovery go on.
    UPKEEP_LOCK_WAIT_SECONDS: int = 2
    #: Test mode: ``enqueue()`` runs the task in this process once the enqueuing transaction
    #: commits, touching no queue table, so tests run on SQLite or PostgreSQL too.
    IMMEDIATE: bool = False
    #: In test mode, a task's exception is raised in the code that enqueued it (at the
    #: commit). False: it is logged and kept in the handle's state instead.
    IMMEDIATE_RAISE: bool = True
    #: Recurring tasks declared in settings: ``{name: {"task": "app.tasks.fn", "cron":
    #: "0 3 * * *", "tz": "Europe/Paris", "catch_up": "latest", "args": [], "kwargs": {}}}``
    #: (task and cron required). See docs/schedules.md.
    SCHEDULES: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    #: A schedule's occurrence enqueued at most this many seconds late is on time; one
    #: older was missed (no worker ran) and follows the schedule's ``catch_up`` policy.
    SCHEDULE_GRACE_SECONDS: float = 60.0
    # Topics (``Topic("orders")``): see docs/streams.md.
    #: Attempts of a consumer group's delivery before it goes to the group's dead letter:
    #: the first and 16 retries, as in the EMS article.
    TOPIC_MAX_ATTEMPTS: int = 17
    #: Seconds before the n-th retry of a delivery, the last one repeating: 10 s to 2 h.
    TOPIC_RETRY_BACKOFF: tuple[float, ...] = (
        10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200)
    #: Topic messages one pump step turns into deliveries of one group.
    TOPIC_PUMP_BATCH: int = 500
    #: Deliveries a group may have ready, or scheduled (retries) while its handler fails
    #: (none of the newest attempts in its queue succeeded),
    #: before its pump pauses (keeps the queue table small however far behind a group
    #: is: the rest wait in the topic); the retries of a group whose handler works, and
    #: its blocked deliveries, stop it at 10 times this (``broker.group_window``).
    TOPIC_WINDOW: int = 1000
    #: Seconds between two reads of a topic by a worker's broadcast thread.
    TOPIC_BROADCAST_POLL_SECONDS: float = 0.2
    #: Topic messages published longer ago than this are deleted by the recovery leader
    #: (in small batches, oldest offset first, moving the topic's ``first_offset``).
    #: None: keep them forever.
    TOPIC_RETENTION_SECONDS: float | None = 7 * 86400.0
    #: Also keep a message until every consumer group of its topic has turned it into a
    #: delivery (its position passed it). False: time alone decides (a group far behind
    #: then skips what was deleted).
    TOPIC_RETENTION_WAIT_FOR_GROUPS: bool = True
    # The Spark pipeline (``queuepipeline``, the ``spark`` extra): see docs/pipeline.md.
    #: The JDBC driver jar Spark loads (``spark.jars``): Debian's libmariadb-java by
    #: default. "" adds none (a cluster that ships its own, or ``spark.jars.packages``).
    SPARK_JDBC_JAR: str = "/usr/share/java/mariadb-java-client.jar"
    #: The JDBC driver class in that jar.
    SPARK_JDBC_DRIVER: str = "org.mariadb.jdbc.Driver"
    #: Most database connections one pipeline stage opens at once (reads and writes).
    SPARK_MAX_CONNECTIONS: int = 4
    #: Primary-key ids per read partition: each partition is one short SELECT.
    SPARK_PARTITION_ROWS: int = 100_000
    #: The local driver JVM's class-data-sharing archive: "auto" (a file in
    #: ~/.cache/django-mysqlq, written by the first local session), a path, or "" for none.
    SPARK_CLASS_ARCHIVE: str = "auto"


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

    def check(name: str, problem: Callable[[object, str], str | None]) -> None:
        if name in values:
            found = problem(values[name], f"MYSQLQ[{name!r}]")
            if found:
                problems.append(found)

    def seconds(zero: bool) -> Callable[[object, str], str | None]:
        return lambda value, option: limits.seconds_problem(value, option, zero=zero)

    def whole(high: int) -> Callable[[object, str], str | None]:
        return lambda value, option: limits.whole_problem(value, option, 1, high)

    for name in ("LEASE_SECONDS", "HEARTBEAT_SECONDS", "RECOVERY_SECONDS", "POLL_SECONDS",
                 "GRACE_SECONDS", "RETRY_BACKOFF_MAX", "ACK_DELAY_SECONDS"):
        check(name, seconds(zero=False))
    check("RETRY_BACKOFF", seconds(zero=True))
    check("SUMMARY_SECONDS", seconds(zero=True))
    check("MAX_ATTEMPTS", limits.max_attempts_problem)
    check("BATCH_SIZE", whole(MAX_BATCH))
    check("ACK_BATCH_SIZE", whole(MAX_BATCH))
    check("MAX_PAYLOAD_BYTES", whole(MAX_PAYLOAD_BYTES))
    check("DEAD_RETENTION_SECONDS", limits.optional_seconds_problem)
    check("WORKER_RETENTION_SECONDS", limits.optional_seconds_problem)
    check("UPKEEP_LOCK_WAIT_SECONDS", whole(3600))
    check("DEFAULT_QUEUE", limits.queue_problem)
    check("DEFAULT_PRIORITY", limits.priority_problem)
    check("PURGE_LAG_WARNING_SECONDS", seconds(zero=True))
    check("PURGE_LAG_WARNING", lambda value, option: limits.whole_problem(
        value, option, 0, 2**63 - 1))
    check("UNKNOWN_TASK_RETRIES", lambda value, option: limits.whole_problem(
        value, option, 0, 1000))

    check("TOPIC_MAX_ATTEMPTS", limits.max_attempts_problem)
    check("TOPIC_PUMP_BATCH", whole(MAX_BATCH))
    check("TOPIC_WINDOW", whole(1_000_000))
    check("TOPIC_BROADCAST_POLL_SECONDS", seconds(zero=False))
    check("TOPIC_RETENTION_SECONDS", limits.optional_seconds_problem)
    if "TOPIC_RETRY_BACKOFF" in values:
        try:
            values["TOPIC_RETRY_BACKOFF"] = retries.backoff_schedule(values["TOPIC_RETRY_BACKOFF"])
        except ValueError as exc:
            problems.append(f"MYSQLQ['TOPIC_RETRY_BACKOFF']: {exc}")

    check("SPARK_MAX_CONNECTIONS", whole(1000))
    check("SPARK_PARTITION_ROWS", lambda value, option: limits.whole_problem(
        value, option, 1000, 100_000_000))
    for name in ("SPARK_JDBC_JAR", "SPARK_JDBC_DRIVER", "SPARK_CLASS_ARCHIVE"):
        if name in values and not isinstance(values[name], str):
            problems.append(f"MYSQLQ[{name!r}] must be a string, not {values[name]!r}.")
    for name in ("WAKEUP", "DETECT_PROXY", "IMMEDIATE", "IMMEDIATE_RAISE",
                 "TOPIC_RETENTION_WAIT_FOR_GROUPS"):
        if name in values and not isinstance(values[name], bool):
            problems.append(f"MYSQLQ[{name!r}] must be True or False, not {values[name]!r}.")
    if "LOG_FORMAT" in values and values["LOG_FORMAT"] not in LOG_FORMATS:
        problems.append(
            f"MYSQLQ['LOG_FORMAT'] must be 'text' or 'json', not {values['LOG_FORMAT']!r}."
        )
    if "LIVENESS" in values and values["LIVENESS"] not in ("connection", "lease"):
        problems.append(
            f"MYSQLQ['LIVENESS'] must be 'connection' or 'lease', not {values['LIVENESS']!r}."
        )
    database = values.get("DATABASE", "default")
    if not isinstance(database, str) or not database or len(database) > 1000:
        problems.append("MYSQLQ['DATABASE'] must be a non-empty string of at most 1000 "
                        f"characters, not {database!r}.")
    if "QUEUES" in values:
        queues = _queues(values["QUEUES"], problems)
        if queues is not None:
            values["QUEUES"] = queues
    read = values.get("READ_DATABASE")
    if read is not None and not (
            (isinstance(read, str) and 0 < len(read) <= 1000)
            or (isinstance(read, Mapping) and all(
                isinstance(key, str) and key and isinstance(value, str) and value
                for key, value in read.items()))):
        problems.append("MYSQLQ['READ_DATABASE'] must be None, a database alias, or a dict "
                        f"of queue alias -> replica alias, not {read!r}.")
    elif isinstance(read, Mapping):
        values["READ_DATABASE"] = dict(read)
    if "TASK_MODULES" in values:
        modules = values["TASK_MODULES"]
        if not isinstance(modules, list | tuple) or not all(isinstance(m, str) for m in modules):
            problems.append("MYSQLQ['TASK_MODULES'] must be a list of dotted module paths.")
        else:
            values["TASK_MODULES"] = tuple(modules)

    check("SCHEDULE_GRACE_SECONDS", seconds(zero=True))
    if "SCHEDULES" in values:
        schedules = _schedules(values["SCHEDULES"], problems)
        if schedules is not None:
            values["SCHEDULES"] = schedules

    lease = values.get("LEASE_SECONDS", QueueSettings.LEASE_SECONDS)
    beat = values.get("HEARTBEAT_SECONDS", QueueSettings.HEARTBEAT_SECONDS)
    if not problems and beat * 2 > lease:
        problems.append(
            f"MYSQLQ['HEARTBEAT_SECONDS'] ({beat}) must be at most half of "
            f"MYSQLQ['LEASE_SECONDS'] ({lease}), or live workers lose their claims."
        )
    return values, problems


#: Keys of one ``MYSQLQ['QUEUES']`` entry.
QUEUE_KEYS = ("DATABASE",)


def _queues(raw: object, problems: list[str]) -> dict[str, dict[str, Any]] | None:
    """``MYSQLQ['QUEUES']`` checked entry by entry (whether each alias exists is the system
    check's business, E010)."""
    if not isinstance(raw, Mapping):
        problems.append("MYSQLQ['QUEUES'] must be a dict of queue name -> {'DATABASE': "
                        f"alias}}, not {type(raw).__name__}.")
        return None
    found: dict[str, dict[str, Any]] = {}
    for name, entry in raw.items():
        where = f"MYSQLQ['QUEUES'][{name!r}]"
        problem = limits.queue_problem(name, "A queue name in MYSQLQ['QUEUES']")
        if problem is not None:
            problems.append(problem)
            continue
        if not isinstance(entry, Mapping):
            problems.append(f"{where} must be a dict such as {{'DATABASE': 'queues_b'}}, not "
                            f"{entry!r}.")
            continue
        unknown = sorted(str(key) for key in entry if key not in QUEUE_KEYS)
        if unknown:
            problems.append(f"{where}: unknown key(s) {', '.join(unknown)} (keys: "
                            f"{', '.join(QUEUE_KEYS)}).")
            continue
        database = entry.get("DATABASE")
        if database is not None and (not isinstance(database, str) or not database
                                     or len(database) > 1000):
            problems.append(f"{where}['DATABASE'] must be a database alias, not {database!r}.")
            continue
        found[name] = dict(entry)
    return found


SCHEDULE_KEYS = ("task", "cron", "tz", "catch_up", "args", "kwargs")


def _schedules(raw: object, problems: list[str]) -> dict[str, dict[str, Any]] | None:
    """``MYSQLQ['SCHEDULES']`` checked entry by entry (whether each task exists is the
    system check's business: tasks are imported later)."""
    if not isinstance(raw, Mapping):
        problems.append("MYSQLQ['SCHEDULES'] must be a dict of schedule name -> {'task': "
                        f"..., 'cron': ...}}, not {type(raw).__name__}.")
        return None
    found: dict[str, dict[str, Any]] = {}
    for name, entry in raw.items():
        where = f"MYSQLQ['SCHEDULES'][{name!r}]"
        if not isinstance(name, str) or not name or len(name) > 255 \
                or not limits.is_utf8(name):
            problems.append(f"{where}: a schedule name must be a non-empty string of at "
                            "most 255 characters.")
            continue
        if not isinstance(entry, Mapping):
            problems.append(f"{where} must be a dict with 'task' and 'cron', not {entry!r}.")
            continue
        unknown = sorted(str(key) for key in entry if key not in SCHEDULE_KEYS)
        missing = [key for key in ("task", "cron") if key not in entry]
        if unknown or missing:
            problems.append(f"{where}: " + "; ".join(
                ([f"unknown key(s) {', '.join(unknown)}"] if unknown else [])
                + ([f"missing {', '.join(missing)}"] if missing else []))
                + f" (keys: {', '.join(SCHEDULE_KEYS)}; task and cron required).")
            continue
        if not isinstance(entry["task"], str) or not entry["task"]:
            problems.append(f"{where}['task'] must be a registered task's name such as "
                            f"'shop.tasks.report', not {entry['task']!r}.")
            continue
        try:
            declared = cron.declare(where, entry["cron"], entry.get("tz"),
                                    entry.get("catch_up", cron.SKIP), entry.get("args", ()),
                                    entry.get("kwargs"))
            payload.encode(entry["task"], declared.args, declared.kwargs, MAX_PAYLOAD_BYTES)
        except (cron.CronError, ValueError, TypeError) as exc:
            problems.append(str(exc).replace("cron_args", "'args'")
                            .replace("cron_kwargs", "'kwargs'").replace("cron_tz", "'tz'"))
            continue
        found[name] = {"task": entry["task"], "cron": declared.cron, "tz": declared.tz,
                       "catch_up": declared.catch_up, "args": list(declared.args),
                       "kwargs": declared.kwargs}
    return found


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
