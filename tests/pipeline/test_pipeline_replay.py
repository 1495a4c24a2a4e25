"""``queuepipeline replay``: copies of the originals, linked to them, never twice."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from django_mysqlq.models import Attempt, Message

from .support import NOW, seed_history

pytestmark = [pytest.mark.spark, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def failed() -> list[Attempt]:
    """Seeded history as workers leave it for replay: a message's final row is its last
    (the seed gives each message two rows, the second one after a final first one too,
    e.g. ``failed`` then ``lost``, and replay copies only messages whose latest row is
    final)."""
    rows = seed_history(64, start=NOW - dt.timedelta(hours=3), span=dt.timedelta(hours=2))
    final = {}
    for row in rows:
        if row.outcome in ("succeeded", "failed", "cancelled"):
            final.setdefault(row.message_id, row.id)
    Attempt.objects.filter(pk__in=[row.id for row in rows if row.message_id in final
                                   and row.id > final[row.message_id]]).delete()
    return [row for row in Attempt.objects.filter(outcome="failed").order_by("id")]


def test_dry_run_then_replay_then_rerun(spark, failed, capsys, root):
    call_command("queuepipeline", "replay", "--since", "1d", "--dry-run")
    out = capsys.readouterr().out
    assert f"{len(failed)} message(s) would be replayed" in out
    assert Message.objects.count() == 0
    call_command("queuepipeline", "replay", "--since", "1d")
    assert f"Replayed {len(failed)} message(s)" in capsys.readouterr().out
    copies = {message.dedup_key: message for message in Message.objects.all()}
    assert len(copies) == len(failed)
    for original in failed:
        copy = copies[f"replay:{original.message_id}"]
        assert (copy.task_name, copy.queue, copy.priority, copy.payload) == (
            original.task_name, original.queue, original.priority, original.payload)
        link = Attempt.objects.get(message_id=copy.pk, outcome="replayed")
        assert link.replayed_from == original.message_id
        assert link.error_message.startswith(f"replayed from #{original.message_id}")
    # The admin's trace of a copy says where it came from.
    copy = copies[f"replay:{failed[0].message_id}"]
    page = root.get(f"/admin/django_mysqlq/message/{copy.pk}/change/")
    assert f"replayed from #{failed[0].message_id}" in page.content.decode()
    # Again with the same filter: nothing new, even once the copies are gone.
    Message.objects.all().delete()
    call_command("queuepipeline", "replay", "--since", "1d")
    assert "Replayed 0 message(s)" in capsys.readouterr().out
    assert Message.objects.count() == 0


def test_filters_and_archive_source(spark, failed, tmp_path: Path):
    from django_mysqlq.contrib.spark import archive, replay

    errors = {row.error_class for row in failed}
    picked = sorted(errors)[0]
    result = replay(spark, error_classes=[picked], tasks=[failed[0].task_name], dry_run=True)
    expected = {row.message_id for row in failed
                if row.error_class == picked and row.task_name == failed[0].task_name}
    assert result.matched == len(expected)
    # Archived history is replayed too, with --archive.
    archive(spark, str(tmp_path), dt.timedelta(0))
    assert not Attempt.objects.exists()
    assert replay(spark, dry_run=True).matched == 0
    result = replay(spark, archive=str(tmp_path))
    assert result.enqueued == len(failed)
    assert sorted(json.loads(m.payload)["args"][0] for m in Message.objects.all()) == sorted(
        json.loads(row.payload)["args"][0] for row in failed)


def test_only_final_outcomes_can_be_replayed(spark, failed):
    with pytest.raises(CommandError, match="only final rows keep"):
        call_command("queuepipeline", "replay", "--outcome", "retried")
    assert Message.objects.count() == 0


def test_the_command_line_filters_and_partition_rows(spark, failed, capsys, monkeypatch):
    """``--task``, ``--queue``, ``--error-class``, ``--since``/``--until`` pick what SQL
    would; ``--partition-rows`` reaches the read of live history (it was dropped)."""
    from django_mysqlq.contrib.spark import sources

    plans: list[int] = []
    real_plan = sources.plan

    def spy(*args, **kwargs):
        made = real_plan(*args, **kwargs)
        plans.append(made.partition_rows)
        return made

    monkeypatch.setattr(sources, "plan", spy)
    picked = next(row for row in failed if row.error_class)
    expected = {row.message_id for row in failed
                if (row.task_name, row.queue, row.error_class) == (
                    picked.task_name, picked.queue, picked.error_class)}
    until = (NOW + dt.timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%S")
    call_command("queuepipeline", "replay", "--task", picked.task_name, "--queue",
                 picked.queue, "--error-class", picked.error_class, "--since", "1d",
                 "--until", until, "--partition-rows", "1000", "--dry-run")
    out = capsys.readouterr().out
    assert f"{len(expected)} message(s) would be replayed" in out
    assert plans and set(plans) == {1000}
    assert Message.objects.count() == 0
    # A window that ended before the failures picks none of them.
    call_command("queuepipeline", "replay", "--error-class", picked.error_class,
                 "--until", (NOW - dt.timedelta(hours=4)).strftime("%Y-%m-%dT%H:%M:%S"),
                 "--dry-run")
    assert "0 message(s) would be replayed" in capsys.readouterr().out


def test_enqueue_refuses_partition_rows_it_would_ignore(tmp_path: Path):
    pytest.importorskip("pyspark")  # without it the command stops at its install hint first
    with pytest.raises(CommandError, match="--partition-rows splits reads"):
        call_command("queuepipeline", "enqueue", "--task", "tests.testapp.tasks.record",
                     "--input", str(tmp_path / "x.parquet"), "--partition-rows", "5000")


def _final(message_id: int, outcome: str, error_class: str, minutes: int) -> Attempt:
    finished = NOW - dt.timedelta(minutes=minutes)
    return Attempt(message_id=message_id, queue="default", task_name="tests.testapp.tasks.record",
                   attempt=1, outcome=outcome, priority=0, enqueued_at=finished,
                   started_at=None if outcome == "requeued" else finished,
                   finished_at=finished, worker_id="w", error_class=error_class,
                   error_message="boom" if error_class else "",
                   payload=json.dumps({"args": [f"m{message_id}"], "kwargs": {}})
                   if outcome != "requeued" else "")


def test_error_classes_as_workers_store_them_and_only_the_latest_final_row(spark, capsys):
    """Workers store ``builtins.TimeoutError``: ``--error-class TimeoutError`` (the docs'
    example) matches it, as does the stored name; a message that failed, was requeued
    and then succeeded is no longer a failed one."""
    Attempt.objects.bulk_create([
        _final(1, "failed", "builtins.TimeoutError", 50),
        _final(2, "failed", "shop.errors.Declined", 50),
        _final(3, "failed", "builtins.TimeoutError", 50),   # dead, requeued, then fine:
        _final(3, "requeued", "", 40),
        _final(3, "succeeded", "", 30),
        _final(4, "failed", "builtins.ValueError", 50),
    ])
    call_command("queuepipeline", "replay", "--error-class", "TimeoutError", "--since", "1d",
                 "--dry-run")
    out = capsys.readouterr().out
    assert "1 message(s) would be replayed (1 matched" in out, out
    assert '"message_id": 1' in out
    call_command("queuepipeline", "replay", "--error-class",
                 "builtins.TimeoutError,Declined", "--since", "1d")
    assert "Replayed 2 message(s)" in capsys.readouterr().out
    assert sorted(json.loads(m.payload)["args"][0] for m in Message.objects.all()) == [
        "m1", "m2"]
    call_command("queuepipeline", "replay", "--outcome", "succeeded", "--since", "1d",
                 "--dry-run")
    assert "1 message(s) would be replayed" in capsys.readouterr().out


def test_a_message_an_operator_replayed_by_hand_is_skipped(spark, failed, capsys, root):
    """The history page's Replay links its copy as the pipeline does: the pipeline's
    replay counts that original as replayed before and makes no second copy."""
    by_hand = failed[0]
    root.post(f"/admin/django_mysqlq/attempt/{by_hand.pk}/replay/")
    assert Message.objects.count() == 1
    call_command("queuepipeline", "replay", "--since", "1d")
    out = capsys.readouterr().out
    assert f"Replayed {len(failed) - 1} message(s) ({len(failed)} matched, 1 replayed " \
        "before)" in out, out
    assert not Message.objects.filter(dedup_key=f"replay:{by_hand.message_id}").exists()


def test_copies_of_a_rate_limited_or_gated_task_are_refused(spark, capsys):
    """The bulk insert writes plain rows: copies of a task with a rate limit, a gate or a
    unique period would run unthrottled, unordered or twice; the replay is refused and
    writes nothing, and the other tasks' messages replay with --task."""
    import tests.testapp.gated
    import tests.testapp.rated_tasks  # noqa: F401  (registers the tasks below)
    from django_mysqlq.contrib.spark import PipelineError, replay

    rows = [_final(1, "failed", "builtins.ValueError", 50),
            _final(2, "failed", "builtins.ValueError", 50),
            _final(3, "failed", "builtins.ValueError", 50)]
    rows[1].task_name = "tests.testapp.rated_tasks.per_minute"
    rows[2].task_name = "tests.testapp.gated.ordered_step"
    Attempt.objects.bulk_create(rows)
    since = NOW - dt.timedelta(days=1)
    with pytest.raises(PipelineError, match=r"rate_limit='100/m'.*ordered_by|ordered_by.*"
                       r"rate_limit='100/m'"):
        replay(spark, since=since)
    assert Message.objects.count() == 0
    assert replay(spark, since=since, tasks=["tests.testapp.tasks.record"]).enqueued == 1
    assert [m.task_name for m in Message.objects.all()] == ["tests.testapp.tasks.record"]


def _row_at(message_id: int, outcome: str, finished: dt.datetime) -> Attempt:
    row = _final(message_id, outcome, "builtins.ValueError" if outcome == "failed" else "", 0)
    row.finished_at = row.enqueued_at = finished
    row.started_at = None if outcome in ("requeued", "skipped") else finished
    if outcome == "skipped":
        row.payload = ""
    return row


def test_a_message_whose_latest_row_is_later_or_not_final_or_live_is_not_copied(spark):
    """The window bounds when a message's *latest* row finished, over all its history:
    a message that went dead in the window but was requeued and succeeded after it, or
    that was requeued and waits (or runs) again, is not a failed one to copy (the copy
    would run it twice: a double charge)."""
    from django_mysqlq.contrib.spark import replay
    from tests.testapp.tasks import record

    base = 900_000  # history-only originals, far from the live messages' ids
    since, until = NOW - dt.timedelta(days=3), NOW - dt.timedelta(days=1)
    in_window, after = NOW - dt.timedelta(days=2), NOW - dt.timedelta(hours=20)
    waiting = record.enqueue("requeued, waiting again").id   # live in mysqlq_message
    running = record.enqueue("back in the queue, no history row yet").id
    Attempt.objects.bulk_create([
        _row_at(base + 1, "failed", in_window),              # dead: copied
        _row_at(base + 2, "failed", in_window),              # dead, requeued and succeeded
        _row_at(base + 2, "requeued", after),                # after the window
        _row_at(base + 2, "succeeded", after + dt.timedelta(minutes=5)),
        _row_at(base + 3, "failed", in_window),              # dead, then its subject's
        _row_at(base + 3, "skipped", after),                 # head skipped: still dead, copied
        _row_at(waiting, "failed", in_window),        # requeued in the window: pending
        _row_at(waiting, "requeued", in_window + dt.timedelta(hours=1)),
        _row_at(running, "failed", in_window),        # live, whatever history says
    ])
    result = replay(spark, since=since, until=until, dry_run=True)
    assert sorted(row["message_id"] for row in result.sample) == [base + 1, base + 3]
    assert result.matched == 2
    # --outcome succeeded over all history: message 2's latest row.
    picked = replay(spark, outcomes=["succeeded"], dry_run=True)
    assert [row["message_id"] for row in picked.sample] == [base + 2]
    # A window that holds only its failure picks nothing either.
    assert replay(spark, outcomes=["succeeded"], since=since, until=until,
                  dry_run=True).matched == 0


def test_the_executors_skip_an_original_that_is_live_again(transactional_db):
    """Checked again inside the insert's transaction: an original requeued after the
    driver picked it is not copied."""
    from django_mysqlq.broker import Operator, fanout
    from django_mysqlq.broker.replay import ReplayCopy, insert_replays, replay_key
    from django_mysqlq.contrib.spark.database import database
    from django_mysqlq.contrib.spark.executor import connect
    from django_mysqlq.messages import NewMessage
    from tests.testapp.tasks import record

    live = record.enqueue("requeued meanwhile").id

    def copy(original: int) -> ReplayCopy:
        return ReplayCopy(message=NewMessage(
            task_name="tests.testapp.tasks.record", queue="default", priority=0,
            payload=json.dumps({"args": [f"copy of {original}"], "kwargs": {}}),
            run_at=None, delay=0.0, max_attempts=1, retry_backoff=1.0, timeout=None,
            dedup_key=replay_key(original)), original=original, source_row=1)

    conn = connect(database().connect_args)
    try:
        room = fanout.prepare(conn)
        assert insert_replays(conn, [copy(live), copy(live + 1000)], room,
                              Operator(name="test")) == 1
    finally:
        conn.close()
    assert list(Message.objects.exclude(pk=live).values_list("dedup_key", flat=True)) == [
        replay_key(live + 1000)]
