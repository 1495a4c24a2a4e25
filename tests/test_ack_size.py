"""Acks never exceed the server's limits (issue 10, item 4).

History rows carry payload copies, results and tracebacks; an ack batch of large rows
used to go out as one multi-row INSERT past ``max_allowed_packet``, and a result nested
too deeply for the ``result`` column's ``JSON_VALID`` check was refused (error 4025).
Both were taken for outages: the batch was retried for two minutes, then left to be
recovered and run again, over and over. Everything here runs against the real server.

Some tests plan for a smaller packet than the server's by setting the limit the broker
cached for the test's connection (the value it would have read from a server configured
so); the server itself still receives and checks every statement. Timeouts are liveness
bounds, never performance assertions.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from django_mysqlq import broker
from django_mysqlq.broker import history, packets
from django_mysqlq.messages import AttemptResult, ClaimedMessage, Runner
from django_mysqlq.models import Attempt, Message
from django_mysqlq.worker.executor import execute
from tests.burst import expected_status
from tests.packet_support import server_packet
from tests.testapp import tasks
from tests.testapp.models import Ledger

pytestmark = pytest.mark.django_db(transaction=True)

RUNNER = Runner(worker_id="test:acks", host="test", pid=1, thread="test")
MiB = 2**20


def claim_all(count: int | None = None) -> list[ClaimedMessage]:
    return broker.claim(["default"], count or 1000, RUNNER.worker_id, lease_seconds=60)


def ok(value: Any) -> AttemptResult:
    return AttemptResult(started_at=timezone.now(), result=value)


@contextlib.contextmanager
def statements_sent() -> Iterator[list[bytes]]:
    """The bytes of every statement this connection sends meanwhile, as the driver built them."""
    sent: list[bytes] = []

    def record(execute, sql, params, many, context):
        try:
            return execute(sql, params, many, context)
        finally:
            sent.append(bytes(context["cursor"].cursor.cursor._executed or b""))

    try:
        with connection.execute_wrapper(record):
            yield sent
    finally:
        connection.close()  # a statement may have left it dead: the next starts clean


def assume_packet(size: int) -> None:
    """Plan as if this connection's server allowed ``size``-byte packets."""
    connection.ensure_connection()
    setattr(connection.connection, packets.MAX_PACKET_ATTRIBUTE, size)


def history_inserts(sent: list[bytes]) -> list[bytes]:
    return [s for s in sent if s.lstrip().startswith(b"INSERT INTO mysqlq_attempt")]


# --------------------------------------------------------------------------- sizes


def test_the_packet_limit_is_read_from_the_server_once_per_connection(
        django_assert_num_queries):
    expected = server_packet()
    connection.close()
    connection.ensure_connection()
    with django_assert_num_queries(1):
        assert packets.max_packet() == expected
    with django_assert_num_queries(0):
        assert packets.max_packet() == expected
    connection.close()
    connection.ensure_connection()
    with django_assert_num_queries(1):  # a new connection asks again
        assert packets.max_packet() == expected


@pytest.mark.parametrize("text", [
    "", "plain", 'quo"te', "back\\slash", "new\nline\r", "nul\0", "ctrl-z\x1a", "it's",
    "caf\u00e9 \u4e2d\u6587 \U0001f600", '"' * 10_000, "\\" * 9_000 + "x" * 3_000,
    "\u00e9" * 20_000, ('{"k": "v\\n"}' * 2_000),
])
def test_escaped_size_is_never_below_what_the_driver_sends(text):
    connection.ensure_connection()
    sent = len(connection.connection.literal(text))
    assert packets.escaped_size(text) >= sent
    if len(text) >= 4096:
        assert packets.escaped_size(text) == sent  # long strings are measured, not bounded


def test_split_by_size_keeps_each_part_within_room_and_row_count():
    sizes = [300, 300, 500, 100, 900, 50, 50, 50]
    parts = packets.split_by_size(list(range(len(sizes))), sizes, room=1000, max_rows=3)
    assert [i for part in parts for i in part] == list(range(len(sizes)))
    for part in parts:
        assert len(part) <= 3
        assert sum(sizes[i] for i in part) <= 1000 or len(part) == 1
    assert packets.split_by_size([], [], room=10, max_rows=5) == []


# --------------------------------------------------------------------------- acks by size


def test_an_ack_batch_past_the_packet_is_split_into_statements_that_fit():
    """The issue's case in one process: about 22 MB of escaped results in one ack batch."""
    limit = server_packet()
    tasks.returns_quotes.enqueue_many([[450_000]] * 12)
    batch = claim_all()
    assert len(batch) == 12
    with statements_sent() as sent:
        owned = broker.ack_many([(m, RUNNER, ok('"' * 450_000)) for m in batch])
    assert owned == {m.id for m in batch}
    inserts = history_inserts(sent)
    assert len(inserts) > 1
    assert max(len(s) for s in sent) < limit
    assert not Message.objects.exists()
    rows = Attempt.objects.filter(message_id__in=owned)
    assert rows.count() == 12
    assert all(row.result == '"' * 450_000 for row in rows)


def test_statements_shrink_with_a_smaller_packet_limit():
    tasks.returns_quotes.enqueue_many([[300_000]] * 6)
    batch = claim_all()
    assume_packet(2 * MiB)
    with statements_sent() as sent:
        owned = broker.ack_many([(m, RUNNER, ok('"' * 300_000)) for m in batch])
    assert owned == {m.id for m in batch}
    assert max(len(s) for s in sent) < 2 * MiB
    assert len(history_inserts(sent)) >= 3  # 1.2 MB escaped per row: one row a statement
    assert all(row.result == '"' * 300_000 for row in Attempt.objects.all())


def test_a_row_too_big_for_a_packet_drops_its_result_then_its_payload(settings, caplog):
    settings.MYSQLQ = {**settings.MYSQLQ, "MAX_PAYLOAD_BYTES": 4 * MiB}
    big = tasks.returns_quotes.enqueue(0, "p" * (1_500_000)).id
    small = tasks.returns_quotes.enqueue(1).id
    batch = {m.id: m for m in claim_all()}
    assume_packet(1 * MiB)
    with caplog.at_level(logging.WARNING, "django_mysqlq"), statements_sent() as sent:
        owned = broker.ack_many([(batch[big], RUNNER, ok("r" * 700_000)),
                                 (batch[small], RUNNER, ok('"'))])
    assert owned == {big, small}
    assert max(len(s) for s in sent) < 1 * MiB
    trimmed = Attempt.objects.get(message_id=big)
    assert (trimmed.outcome, trimmed.result, trimmed.payload) == ("succeeded", None, "")
    kept = Attempt.objects.get(message_id=small)
    assert kept.result == '"' and json.loads(kept.payload)["args"] == [1]
    text = caplog.text
    assert f"#{big}" in text and "history keeps no result" in text
    assert "history keeps no copy of its payload" in text


def test_a_dead_rows_payload_copy_too_big_for_a_packet_is_dropped(settings, caplog):
    settings.MYSQLQ = {**settings.MYSQLQ, "MAX_PAYLOAD_BYTES": 4 * MiB}
    handle = tasks.returns_quotes.enqueue(0, "p" * 1_500_000)
    [message] = claim_all()
    assume_packet(1 * MiB)
    failure = AttemptResult(started_at=timezone.now(), error_class="builtins.ValueError",
                            error_message="no", traceback="Traceback ...")
    with caplog.at_level(logging.WARNING, "django_mysqlq"), statements_sent() as sent:
        assert broker.fail(message, RUNNER, failure, retry=False) == "failed"
    assert max(len(s) for s in sent) < 1 * MiB
    row = Attempt.objects.get(message_id=handle.id)
    assert (row.outcome, row.error_class, row.payload) == ("failed", "builtins.ValueError", "")
    assert Message.objects.get(pk=handle.id).status == "dead"
    assert "history keeps no copy of its payload" in caplog.text


@pytest.mark.parametrize("result_mb", [17, 24])
def test_a_statement_the_server_refuses_as_too_large_is_split_and_retried(
        settings, caplog, result_mb):
    """The backstop: a packet limit over-estimated (here, on purpose) costs a retry, no ack.

    MariaDB answers a statement a little past its packet limit with error 1153 and one far
    past it by dropping the connection (2006); either way the ack is split and retried.
    """
    settings.MYSQLQ = {**settings.MYSQLQ, "MAX_PAYLOAD_BYTES": 64 * MiB}
    tasks.returns_quotes.enqueue_many([[1]] * 3)
    batch = claim_all()
    assume_packet(4 * server_packet())
    results = [ok("r" * result_mb * 10**6), ok("small"), ok("r" * 2 * 10**6)]
    with caplog.at_level(logging.WARNING, "django_mysqlq"):
        owned = broker.ack_many([(m, RUNNER, r) for m, r in zip(batch, results, strict=True)])
    assert owned == {m.id for m in batch}
    assert "refused as too large" in caplog.text
    by_id = {row.message_id: row.result for row in Attempt.objects.all()}
    assert by_id[batch[0].id] is None  # too big for the real packet: dropped at last
    assert by_id[batch[1].id] == "small"
    assert by_id[batch[2].id] == "r" * 2 * 10**6


# --------------------------------------------------------------------------- JSON depth


def nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


def test_results_as_deep_as_json_valid_accepts_are_kept_and_deeper_ones_dropped(caplog):
    tasks.returns_quotes.enqueue_many([[1]] * 2)
    deepest, too_deep = claim_all()
    with caplog.at_level(logging.WARNING, "django_mysqlq"):
        owned = broker.ack_many([(deepest, RUNNER, ok(nested(history.MAX_JSON_DEPTH))),
                                 (too_deep, RUNNER, ok(nested(history.MAX_JSON_DEPTH + 1)))])
    assert owned == {deepest.id, too_deep.id}
    assert Attempt.objects.get(message_id=deepest.id).result == nested(history.MAX_JSON_DEPTH)
    assert Attempt.objects.get(message_id=too_deep.id).result is None
    assert f"#{too_deep.id} is nested" in caplog.text


def test_a_result_the_json_check_refuses_at_the_ack_is_dropped_and_the_ack_lands(
        monkeypatch, caplog):
    """Backstop for 4025: had the depth check let a result through, the ack still lands."""
    monkeypatch.setattr(history, "MAX_JSON_DEPTH", 1000)
    tasks.returns_quotes.enqueue_many([[1]] * 2)
    deep, fine = claim_all()
    with caplog.at_level(logging.WARNING, "django_mysqlq"):
        owned = broker.ack_many([(deep, RUNNER, ok(nested(40))), (fine, RUNNER, ok([1]))])
    assert owned == {deep.id, fine.id}
    assert Attempt.objects.get(message_id=deep.id).result is None
    assert "JSON check" in caplog.text


def test_an_int_past_a_doubles_range_is_dropped_from_the_result_and_the_ack_lands(caplog):
    """MySQL 8's JSON column refuses a number a double can't hold (error 3140); MariaDB
    keeps JSON as text and would store it. Dropped on both, before the statement."""
    handle = tasks.returns_factorial.enqueue(200)
    kept = tasks.returns_factorial.enqueue(170)  # 7.3e306: a double holds it
    with caplog.at_level(logging.WARNING, "django_mysqlq"):
        for message in claim_all():
            assert execute(message, RUNNER, threading.Event()) == "succeeded"
    assert not Message.objects.exists()
    assert Attempt.objects.get(message_id=handle.id).result is None
    assert Attempt.objects.get(message_id=kept.id).result == math.factorial(170)
    assert f"#{handle.id} holds an integer" in caplog.text
    assert f"#{kept.id} " not in caplog.text


def test_a_result_the_server_refuses_as_invalid_json_is_dropped_and_the_ack_lands(
        monkeypatch, caplog):
    """Backstop for MySQL's 3140 (the JSON column's own parser), as for 4025: had the
    client's check let a result through, the ack still lands, without it."""
    from django.db import OperationalError

    monkeypatch.setattr(history, "beyond_double", lambda value: False)
    tasks.returns_quotes.enqueue_many([[1]] * 2)
    big, fine = claim_all()
    refused: list[str] = []

    def mysql_json(execute, sql, params, many, context):
        if "788657867364790503" in str(sql) + str(params):  # factorial(200)'s JSON
            refused.append(sql)
            raise OperationalError(3140, "Invalid JSON text: \"Number too big to be stored "
                                         "in double.\" at position 0 in value for column "
                                         "'mysqlq_attempt.result'.")
        return execute(sql, params, many, context)

    with caplog.at_level(logging.WARNING, "django_mysqlq"), \
            connection.execute_wrapper(mysql_json):
        owned = broker.ack_many([(big, RUNNER, ok(math.factorial(200))),
                                 (fine, RUNNER, ok([1]))])
    assert refused and owned == {big.id, fine.id}
    assert Attempt.objects.get(message_id=big.id).result is None
    assert Attempt.objects.get(message_id=fine.id).result is None  # the batch's, all dropped
    assert "refused by the database" in caplog.text


# --------------------------------------------------------------------------- real workers


def run_burst(start_worker, *args: str, env: dict[str, str] | None = None,
              patience: float = 60.0) -> tuple[dict[str, Any], str]:
    worker = start_worker("--burst", "--json-summary", "--burst-wait", "1", *args, env=env)
    try:
        status = worker.wait(timeout=patience)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the --burst worker was still running after {patience}s:\n"
                    f"{worker.output()[-3000:]}")
    output = worker.output()
    line = next((line for line in reversed(output.splitlines()) if line.startswith("{")), "")
    assert line, output[-3000:]
    summary = json.loads(line)
    assert status == expected_status(summary["dead"], args), output[-3000:]
    return summary, output


@pytest.mark.worker
def test_twenty_one_megabyte_results_in_one_ack_batch_are_acked_once(start_worker):
    """The issue's case: 20 results of about 1 MB (36 MB escaped), ACK_BATCH_SIZE=20."""
    labels = [f"big{i}" for i in range(20)]
    handles = tasks.returns_quotes.enqueue_many([[450_000, label] for label in labels])
    counts, output = run_burst(start_worker, "--concurrency", "20", "--batch", "20",
                               env={"MYSQLQ_TEST_ACK_BATCH": "20", "MYSQLQ_TEST_ACK_DELAY": "3"})
    assert counts["succeeded"] == 20, output[-3000:]
    for handle in handles:
        assert list(Attempt.objects.for_message(handle.id).values_list("outcome", flat=True)) \
            == ["succeeded"]
    assert not Message.objects.exists()
    for label in labels:  # no task ran twice
        assert Ledger.objects.filter(label=label).count() == 1
    assert "Database unavailable" not in output
    with connection.cursor() as cursor:
        cursor.execute("SELECT MIN(LENGTH(result)), MAX(LENGTH(result)) FROM mysqlq_attempt")
        assert cursor.fetchone() == (900_002, 900_002)


@pytest.mark.worker
def test_a_result_nested_40_levels_deep_succeeds_once_without_its_result(start_worker):
    before = tasks.record.enqueue("before").id
    deep = tasks.returns_nested.enqueue(39).id  # 39 wraps around [] : 40 levels
    after = tasks.record.enqueue("after").id
    counts, output = run_burst(start_worker)
    assert counts["succeeded"] == 3, output[-3000:]
    for message_id in (before, deep, after):
        assert list(Attempt.objects.for_message(message_id).values_list("outcome", flat=True)) \
            == ["succeeded"]
    assert Attempt.objects.get(message_id=deep).result is None
    assert f"#{deep} is nested 40 levels deep" in output


@pytest.mark.parametrize("outcome", ["succeeded", "retried"])
def test_a_history_rows_size_counts_every_value_as_the_general_measure_does(outcome):
    """``history.row_size`` measures only the text values of the known row layout (it runs
    per acked message); it must agree with ``packets.params_size`` over the whole row, so
    a column added to the row without updating the layout is caught here."""
    now = timezone.now()
    message = ClaimedMessage(
        id=7, queue="emails", task_name="tests.testapp.tasks.record", payload='{"a": "é\\\\"}',
        priority=3, attempt=2, max_attempts=5, retry_backoff=1.0, timeout=None,
        enqueued_at=now, claim_token="t" * 32, connection_id=None)
    runner = Runner(worker_id="host:1:abc", host="host", pid=1, thread="mysqlq-task-0")
    for value in ({"big": "x" * 9000}, "short", None):
        result = AttemptResult(started_at=now, error_class="builtins.ValueError",
                               error_message="bad 'input'\n" * 500, traceback="tb\\" * 3000,
                               result=value)
        for keep_payload in (True, False):
            params = history.attempt_params(message, outcome, runner, result, keep_payload)
            assert len(params) == history.ROW_VALUES
            assert history.row_size(params) == (packets.params_size(params)
                                                + len(history.ATTEMPT_ROW) + 2)
