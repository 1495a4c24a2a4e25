"""Every statement that moves a message, one module per stage of its life.

Nothing else in the package writes the queue tables. Statements are raw SQL where the
ORM can't say them (``UPDATE … ORDER BY … LIMIT``, ``FORCE INDEX``, ``CONNECTION_ID()``),
always parameterised, each named once in the module of its stage, and all times come
from the database clock (``UTC_TIMESTAMP(6)``) so that producers and workers on hosts
with skewed clocks agree on what is due.

Delivery is at-least-once: a claim is one autocommit ``UPDATE … LIMIT n`` stamped with
the claimer's connection id, the server's start time and a fresh token; the batch is read
back by the token. Ack deletes the message and writes its history row in one transaction,
guarded by the token so a late ack never touches a message a peer has since recovered.

``enqueue``    insert in the caller's transaction, wake parked workers after commit
``dedup_lock`` producers of one dedup key insert it one at a time (a named lock)
``claim``      the claim ``UPDATE … LIMIT`` and its read-back
``settle``     ack, retry, dead, release of unstarted messages
``promote``    scheduled messages that are due become ready
``lockwait``   bounded lock waits for housekeeping (a stranger's table or row lock)
``recover``    leases, and the claims of vanished workers back to the queue
``leader``     who sweeps: a named lock, or a lease row on a Galera cluster
``cluster``    what changes on a Galera cluster (per-node ids, locks and process lists)
``park``       idle workers' wait, producers' wake-ups
``workers``    the workers table
``operate``    operator actions (admin, CLI)
``overview``   read-only counts for the dashboard and the CLI
``purge``      retention: history, dead messages, stopped workers' rows
``subjects``   gates of ordered subjects and concurrency keys: slots, blocked messages
``held``       subjects held by dead heads, their release, the repair of gate counters
``schedules``  recurring tasks: schedule rows, each occurrence enqueued once
``pipeline``   what the Spark pipeline reads (id bounds, the partitions' SELECTs)
``archive``    the archive's source check and exact deletes
``fanout``     bulk enqueue from Spark executors (keyed rows, none twice)
``replay``     bulk replay, each copy linked to its original
``unique``     dedup keys kept taken for a period after success (``unique_for``)
``rates``      global rate limits: rate keys' rows, the claim of throttled messages
``topics``     topics: publish, and the sequencer that gives committed rows their offsets
``topic_ops``  topics for operators: positions and lag
``topic_reset`` topics for operators: reset a group's position
``topic_drop`` topics for operators: retire (drop) a group
``topic_lookup``  topics for operators: lookup and trace
``topic_replay`` replay a range of a topic into one group
``topic_retention`` deletes a topic's oldest messages in short batches
``topic_overview`` monitoring: topics' publish volume, group handlers past their timeout
``kept``       a topic's first kept offset, checked (one set by hand past the last)
``oversized``  stored messages too big for a delivery or a broadcast read
``deliveries`` consumer groups: their rows, the pump that turns messages into deliveries
``delivery_insert`` the pump's INSERT of deliveries (the first few claimed by its member)
``group_ahead`` a group's position past its topic's end: set back by its pump, shown
``dead_letter`` a group's dead deliveries: listed, requeued
``topic_problems`` why a group's pump can't go on, kept on its row for operators
``usage``      whether a queue or task name appears in the tables (operators' typos)

This package re-exports what the worker, the admin and the commands call, so they
write ``broker.claim(...)``.
"""

from ..messages import AttemptResult, ClaimedMessage, NewMessage, Runner

# The bulk replay module first: importing it later (a Spark executor in this process, a
# test) would bind ``broker.replay`` to it in place of the operator's replay() below.
from . import replay as _bulk_replay  # noqa: F401
from .base import (
    ATTEMPT_TABLE,
    LOCK_ERRORS,
    MESSAGE_TABLE,
    QUEUE_TABLE,
    WORKER_TABLE,
    bind_alias,
    close_if_broken,
    connection_lost,
    default_alias,
    ensure_usable,
    error_code,
    finish_by,
    is_lock_wait,
    is_refusal,
    is_schema_error,
    is_setup_error,
    on_alias,
    send_robust,
    stats,
    was_interrupted,
)
from .claim import READ_CLAIMED_SQL, claim, claim_sql, claim_sql_for
from .dead_letter import dead_deliveries, requeue_dead
from .defer import Deferral, defer
from .deliveries import (
    GroupSpec,
    create_group,
    group_behind,
    position,
    pump,
    pump_claiming,
    pump_claims_supported,
    pump_group,
)
from .delivery_insert import PumpClaim
from .enqueue import enqueue
from .held import (
    Holder,
    Repair,
    dead_heads,
    gates_of,
    holders,
    release_subjects,
    release_subjects_promoting,
    repair_gates,
    requeue_heads,
)
from .isolation import own_connection
from .leader import RECOVERY_LOCK_SQL, RECOVERY_UNLOCK_SQL, is_recovery_leader
from .leader import resign as resign_recovery_lead
from .leaks import (
    Mark,
    activity_marks,
    close_broken_connections,
    close_open_transactions,
    initialized_connections,
    transaction_left_open,
    unchanged_since,
)
from .lockwait import bounded_lock_waits
from .operate import (
    Operator,
    RateOfCopy,
    Stuck,
    cancel,
    paused_queues,
    release_stuck,
    replay,
    requeue,
    set_paused,
    set_priority,
    stuck_messages,
)
from .oversized import ReadMessage, read_after
from .overview import (
    HistoryBucket,
    OldestTransaction,
    PurgeLag,
    QueueOverview,
    WorkerTroubles,
    has_pending,
    history_window,
    purge_lag,
    queue_counts,
    queue_names,
    queue_overview,
    queues_holding,
    status_counts,
    worker_troubles,
    workers_alive,
)
from .park import idle_wait, listen, ready_floor, wake
from .promote import promote_due, promote_limited
from .pumped import Pumped, group_row_free
from .purge import (
    count_dead_before,
    count_history_before,
    count_workers_before,
    purge_dead_batch,
    purge_history_batch,
    purge_workers_batch,
)
from .rates import (
    IDLE_KEY_SECONDS,
    claim_throttled,
    purge_idle_rate_keys,
    repair_rate_keys,
    seconds_to_next_start,
)
from .recover import claims_held, recover, release_strays, renew_leases
from .schedules import DeclaredSchedule, Fired, Synced
from .schedules import add_missing as add_missing_schedules
from .schedules import fire_due as fire_due_schedules
from .schedules import prune as prune_schedules
from .schedules import run_now as run_schedule_now
from .schedules import set_paused as set_schedules_paused
from .schedules import sync as sync_schedules
from .session import connection_identity, connection_session, database_now, wakeups_possible
from .settle import (
    ack,
    ack_many,
    ack_within,
    fail,
    mark_started,
    release,
    retry_delay,
)
from .subjects import GateRef
from .topic_drop import DropIncomplete, DropResult, drop_group
from .topic_lookup import Lookup, NoDelivery, lookup, trace, without_delivery
from .topic_ops import GroupState, TopicOffsetError, groups, topic_bounds
from .topic_overview import Overran, TopicVolume, overran_deliveries, topic_volumes
from .topic_problems import clear_pump_problem, note_pump_problem
from .topic_replay import ReplayIncomplete, ReplayResult, replay_range
from .topic_reset import ResetIncomplete, ResetResult, ResetTarget, reset_group
from .topic_retention import prune_topic_batch, topic_names
from .topics import (
    ensure_topic,
    has_unsequenced,
    last_offset,
    newest_message_id,
    publish,
    sequence,
    sequence_unread,
    topic_exists,
    try_sequence,
)
from .unique import free_unique_keys, purge_unique_keys_batch
from .unserved import (
    UnservedQueue,
    describe_unserved,
    served_queues,
    unserved_from,
    unserved_queues,
)
from .usage import queue_has_rows, task_has_history, task_has_messages
from .workers import deregister_worker, heartbeat_worker, mark_stale_workers, register_worker

__all__ = [
    "ATTEMPT_TABLE",
    "IDLE_KEY_SECONDS",
    "LOCK_ERRORS",
    "MESSAGE_TABLE",
    "QUEUE_TABLE",
    "READ_CLAIMED_SQL",
    "RECOVERY_LOCK_SQL",
    "RECOVERY_UNLOCK_SQL",
    "WORKER_TABLE",
    "AttemptResult",
    "ClaimedMessage",
    "DeclaredSchedule",
    "Deferral",
    "DropIncomplete",
    "DropResult",
    "Fired",
    "GateRef",
    "GroupSpec",
    "GroupState",
    "HistoryBucket",
    "Holder",
    "Lookup",
    "Mark",
    "NewMessage",
    "NoDelivery",
    "OldestTransaction",
    "Operator",
    "Overran",
    "PumpClaim",
    "Pumped",
    "PurgeLag",
    "QueueOverview",
    "RateOfCopy",
    "ReadMessage",
    "Repair",
    "ReplayIncomplete",
    "ReplayResult",
    "ResetIncomplete",
    "ResetResult",
    "ResetTarget",
    "Runner",
    "Stuck",
    "Synced",
    "TopicOffsetError",
    "TopicVolume",
    "UnservedQueue",
    "WorkerTroubles",
    "ack",
    "ack_many",
    "ack_within",
    "activity_marks",
    "add_missing_schedules",
    "bind_alias",
    "bounded_lock_waits",
    "cancel",
    "claim",
    "claim_sql",
    "claim_sql_for",
    "claim_throttled",
    "claims_held",
    "clear_pump_problem",
    "close_broken_connections",
    "close_if_broken",
    "close_open_transactions",
    "connection_identity",
    "connection_lost",
    "connection_session",
    "count_dead_before",
    "count_history_before",
    "count_workers_before",
    "create_group",
    "database_now",
    "dead_deliveries",
    "dead_heads",
    "default_alias",
    "defer",
    "deregister_worker",
    "describe_unserved",
    "drop_group",
    "enqueue",
    "ensure_topic",
    "ensure_usable",
    "error_code",
    "fail",
    "finish_by",
    "fire_due_schedules",
    "free_unique_keys",
    "gates_of",
    "group_behind",
    "group_row_free",
    "groups",
    "has_pending",
    "has_unsequenced",
    "heartbeat_worker",
    "history_window",
    "holders",
    "idle_wait",
    "initialized_connections",
    "is_lock_wait",
    "is_recovery_leader",
    "is_refusal",
    "is_schema_error",
    "is_setup_error",
    "last_offset",
    "listen",
    "lookup",
    "mark_stale_workers",
    "mark_started",
    "newest_message_id",
    "note_pump_problem",
    "on_alias",
    "overran_deliveries",
    "own_connection",
    "paused_queues",
    "position",
    "promote_due",
    "promote_limited",
    "prune_schedules",
    "prune_topic_batch",
    "publish",
    "pump",
    "pump_claiming",
    "pump_claims_supported",
    "pump_group",
    "purge_dead_batch",
    "purge_history_batch",
    "purge_idle_rate_keys",
    "purge_lag",
    "purge_unique_keys_batch",
    "purge_workers_batch",
    "queue_counts",
    "queue_has_rows",
    "queue_names",
    "queue_overview",
    "queues_holding",
    "read_after",
    "ready_floor",
    "recover",
    "register_worker",
    "release",
    "release_strays",
    "release_stuck",
    "release_subjects",
    "release_subjects_promoting",
    "renew_leases",
    "repair_gates",
    "repair_rate_keys",
    "replay",
    "replay_range",
    "requeue",
    "requeue_dead",
    "requeue_heads",
    "reset_group",
    "resign_recovery_lead",
    "retry_delay",
    "run_schedule_now",
    "seconds_to_next_start",
    "send_robust",
    "sequence",
    "sequence_unread",
    "served_queues",
    "set_paused",
    "set_priority",
    "set_schedules_paused",
    "stats",
    "status_counts",
    "stuck_messages",
    "sync_schedules",
    "task_has_history",
    "task_has_messages",
    "topic_bounds",
    "topic_exists",
    "topic_names",
    "topic_volumes",
    "trace",
    "transaction_left_open",
    "try_sequence",
    "unchanged_since",
    "unserved_from",
    "unserved_queues",
    "wake",
    "wakeups_possible",
    "was_interrupted",
    "without_delivery",
    "worker_troubles",
    "workers_alive",
]
