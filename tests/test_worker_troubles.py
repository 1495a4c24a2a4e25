"""What keeps failing in a worker, on its row: said once in the log, and shown beside the
worker (``queuestats``, the dashboard, the admin) from its next heartbeat until it works
again. (With a real worker: the broadcast test in tests/test_topics_workers.py.)"""

from __future__ import annotations

import datetime as dt
import json
import threading
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import OperationalError, connection

from django_mysqlq import broker
from django_mysqlq.conf import get_settings
from django_mysqlq.log import Failures
from django_mysqlq.models import Worker
from django_mysqlq.worker import troubles
from django_mysqlq.worker.topics import TopicDuty
from django_mysqlq.worker.upkeep import Housekeeping, RateWatch

pytestmark = pytest.mark.django_db(transaction=True)

WORKERS = "/admin/django_mysqlq/worker/"
DASHBOARD = "/admin/django_mysqlq/queuestate/"
LOCKED = OperationalError(1205, "Lock wait timeout exceeded; try restarting transaction")


def _overflow() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 9223372036854775807 + 1")  # 1690, out of range


def test_failures_keep_since_when_and_the_latest_error_until_it_works() -> None:
    failures: Failures[str] = Failures()
    before = dt.datetime.now(dt.UTC)
    assert failures.failed("a", OperationalError(1264, "first\nline two"))
    assert not failures.failed("a", OperationalError(1264, "second"))  # same kind: not said
    [episode] = failures.episodes()
    assert episode.key == "a" and episode.since >= before
    assert episode.error == "(1264, 'second')"
    since = episode.since
    failures.failed("b", RuntimeError("x" * 1000))
    assert [e.key for e in failures.episodes()] == ["a", "b"]  # oldest first
    assert failures.episodes()[0].since == since  # the first failure's time stays
    assert len(failures.episodes()[1].error) < 400  # cut, on one line
    assert failures.recovered("a")
    assert [e.key for e in failures.episodes()] == ["b"]
    failures.failed("a", LOCKED)
    assert failures.episodes()[-1].since > since  # a new episode


def test_a_worker_s_troubles_name_each_failing_thing_and_empty_once_it_works() -> None:
    housekeeping = Housekeeping("w1", 5)
    duty = TopicDuty([], threading.Event(), get_settings())
    assert troubles.now(housekeeping, duty) == ""
    assert housekeeping.step("overflow", "t", _overflow) is None
    duty.trouble.failed(broker.GroupSpec(
        topic="orders", group="billing", queue="group:billing",
        task_name="topic:orders:billing", on_dead="skip", max_attempts=3,
        retry_backoff=0.1, timeout=None, start="earliest"), LOCKED.__class__(1264, "range"))
    lines = troubles.now(housekeeping, duty).split("\n")
    assert len(lines) == 2, lines
    assert lines[0].startswith("upkeep step 'overflow' failing since ")
    assert "UTC: (1690, " in lines[0]
    assert lines[1].startswith("the pump of group 'billing' of topic 'orders' failing since ")
    assert lines[1].endswith("UTC: (1264, 'range')")
    assert housekeeping.step("overflow", "t", lambda: 1) == 1
    assert troubles.now(housekeeping, duty).startswith("the pump of group 'billing'")


def test_many_troubles_are_cut_to_the_row_s_room_and_counted() -> None:
    text = troubles.fit([f"thing {n} failing since then: " + "x" * 90 for n in range(100)])
    assert len(text) <= troubles.TROUBLES_MAX_CHARS
    last = text.split("\n")[-1]
    assert last.startswith("… and ") and last.endswith(" more (the worker's log has them)")
    kept = len(text.split("\n")) - 1
    assert last == f"… and {100 - kept} more (the worker's log has them)"


def test_an_error_text_the_column_cannot_store_is_escaped_not_a_failed_heartbeat() -> None:
    # A lone surrogate (os.fsdecode of a bad file name, in an error's text): the driver
    # can't encode it, and the heartbeat that writes the line would fail at every beat.
    housekeeping = Housekeeping("w-s", 5)
    housekeeping.failing.failed("archive", OperationalError("no file /tmp/\udcff.parquet"))
    text = troubles.now(housekeeping, TopicDuty([], threading.Event(), get_settings()))
    assert text.endswith("UTC: no file /tmp/\\udcff.parquet"), text
    broker.register_worker("w-s", "h", 1, ["default"], 1)
    broker.heartbeat_worker("w-s", 0, 0, False, text)
    assert Worker.objects.get(id="w-s").troubles == text


def test_the_heartbeat_writes_them_and_the_dashboard_shows_live_workers_only(root) -> None:
    broker.register_worker("w-ok", "h", 1, ["default"], 1)
    broker.register_worker("w-bad", "h", 2, ["default"], 1)
    broker.register_worker("w-gone", "h", 3, ["default"], 1)
    broker.heartbeat_worker("w-bad", 0, 0, False, "upkeep step 'purge' failing since x: y\n"
                            "the broadcast read of topic 'config' failing since x: z")
    broker.heartbeat_worker("w-gone", 0, 0, False, "upkeep step 'purge' failing since x: y")
    broker.deregister_worker("w-gone", 0, 0)  # stopped: nothing failing in it now
    assert Worker.objects.get(id="w-gone").troubles == ""
    [found] = broker.worker_troubles()
    assert found.worker_id == "w-bad" and len(found.lines) == 2
    out = StringIO()
    call_command("queuestats", stdout=out)
    assert ("WARNING: worker w-bad: the broadcast read of topic 'config' failing since x: z"
            in out.getvalue())
    out = StringIO()
    call_command("queuestats", "--json", stdout=out)
    assert json.loads(out.getvalue())["worker_troubles"] == [
        {"worker": "w-bad", "troubles": found.lines}]
    page = root.get(DASHBOARD).content.decode()
    assert 'id="worker-troubles"' in page and "topic &#x27;config&#x27; failing" in page
    listing = root.get(WORKERS).content.decode()
    assert "upkeep step &#x27;purge&#x27; failing since x: y (and 1 more)" in listing
    broker.heartbeat_worker("w-bad", 0, 0, False, "")  # it works again
    assert broker.worker_troubles() == []
    assert 'id="worker-troubles"' not in root.get(DASHBOARD).content.decode()


def test_a_rate_table_held_by_a_stranger_is_a_trouble_until_a_read_goes_through() -> None:
    housekeeping = Housekeeping("w1", 5)
    duty = TopicDuty([], threading.Event(), get_settings())
    rates = RateWatch("w1", 1)
    assert troubles.now(housekeeping, duty, rates) == ""
    rates.locked()
    rates.locked()  # (the same episode: its start stays)
    assert troubles.now(housekeeping, duty, rates).startswith(
        "mysqlq_rate locked by another session since ")
    assert housekeeping.step("overflow", "t", _overflow) is None
    lines = troubles.now(housekeeping, duty, rates).split("\n")
    assert [line.split(" ")[0] for line in lines] == ["upkeep", "mysqlq_rate"]
    rates.cleared()
    assert troubles.now(housekeeping, duty, rates).startswith("upkeep step 'overflow'")
    assert "mysqlq_rate" not in troubles.now(housekeeping, duty, rates)
