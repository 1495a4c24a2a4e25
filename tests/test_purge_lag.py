"""Purge lag is visible: the history list length and the oldest open transaction, in the
broker, the worker's summary, ``queuestats`` and the dashboard, with a warning past a
threshold.

A real REPEATABLE READ snapshot is held open on its own connection (what a
``mysqldump --single-transaction`` does) while messages are deleted.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import MySQLdb
import pytest
from django.core.management import call_command
from django.db import connection, connections

from django_mysqlq import broker
from django_mysqlq.broker.overview import _history_metric
from django_mysqlq.models import Message
from tests.conftest import wait_for
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

DASHBOARD = "/admin/django_mysqlq/queuestate/"
#: Autocommit deletes run while the snapshot is open: each leaves one undo log in history.
DELETES = 60


@dataclass
class Snapshot:
    connection_id: int
    opened: float  # monotonic, once the snapshot exists on the server

    def held(self) -> int:
        """Whole seconds it has certainly been open on the server's clock."""
        return int(time.monotonic() - self.opened)


@contextmanager
def open_snapshot() -> Iterator[Snapshot]:
    """A consistent snapshot held open on another connection, as a backup or report does."""
    params = connection.settings_dict
    raw = MySQLdb.connect(host=params["HOST"], port=int(params["PORT"]), user=params["USER"],
                          password=params["PASSWORD"], database=params["NAME"])
    try:
        cursor = raw.cursor()
        cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        cursor.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
        cursor.execute("SELECT COUNT(*) FROM mysqlq_message")
        cursor.fetchall()
        yield Snapshot(raw.thread_id(), time.monotonic())
    finally:
        raw.close()


def delete_some_messages() -> None:
    handles = tasks.record.enqueue_many([[f"m{i}"] for i in range(DELETES)])
    for handle in handles:  # one autocommit transaction each
        Message.objects.filter(pk=handle.id).delete()


def hold_for(snapshot: Snapshot, seconds: int) -> None:
    wait_for(lambda: snapshot.held() >= seconds, seconds + 5, message="the snapshot to age")


def lag_thresholds(settings, length: int = 0, seconds: float = 0) -> None:
    settings.MYSQLQ = {**settings.MYSQLQ, "PURGE_LAG_WARNING": length,
                       "PURGE_LAG_WARNING_SECONDS": seconds}


def test_an_open_snapshot_is_reported_with_its_age_and_who_holds_it(settings):
    with open_snapshot() as snapshot:
        delete_some_messages()
        hold_for(snapshot, 2)
        held = snapshot.held()
        lag = broker.purge_lag()
    assert lag.visible
    assert lag.oldest is not None and lag.oldest.seconds >= held >= 2
    # Nothing committed after the snapshot can be purged: every delete is still there.
    assert lag.history_length is not None and lag.history_length >= DELETES
    if lag.oldest.connection_id == snapshot.connection_id:  # else an older one elsewhere
        assert lag.oldest.user == connection.settings_dict["USER"] and lag.oldest.host
    assert f"history_len={lag.history_length} oldest_trx={lag.oldest.seconds}s" == lag.fields()

    lag_thresholds(settings)  # both warnings off
    assert lag.warning() is None
    lag_thresholds(settings, seconds=1)
    warning = lag.warning()
    assert warning is not None
    assert f"a transaction has been open for {lag.oldest.seconds}s" in warning
    assert f"connection {lag.oldest.connection_id}" in warning
    assert f"KILL {lag.oldest.connection_id}" in warning
    assert "replica" in warning and "mysqldump --single-transaction" in warning
    lag_thresholds(settings, length=DELETES - 1)
    warning = lag.warning()
    assert warning is not None and "history list length" in warning
    assert "open for" not in warning.split(".")[0]  # only the length passed its threshold


def test_the_age_is_right_whatever_the_session_time_zone():
    """trx_started is the server's system local time, not the session's: an age computed
    against NOW() in a '+05:00' session was off by the zones' difference (11 hours here)."""

    def ages_in_three_zones() -> dict[str, tuple[int, int]] | None:
        ages = {}
        with connection.cursor() as cursor:
            try:
                for zone in ("SYSTEM", "+05:00", "-08:00"):
                    cursor.execute("SET time_zone = %s", [zone])
                    oldest = broker.purge_lag().oldest
                    assert oldest is not None  # ours at least
                    ages[zone] = (oldest.connection_id, oldest.seconds)
            finally:
                cursor.execute("SET time_zone = DEFAULT")
        # Other sessions on the server come and go: judge three reads of one transaction.
        return ages if len({owner for owner, _ in ages.values()}) == 1 else None

    with open_snapshot() as snapshot:
        hold_for(snapshot, 2)
        ages = wait_for(ages_in_three_zones, 10, message="three reads of one transaction")
        held = snapshot.held()
    seconds = [age for _, age in ages.values()]  # type: ignore[union-attr]
    assert max(seconds) - min(seconds) <= 1
    assert min(seconds) >= 2 and held >= 2


@contextmanager
def user_without_process() -> Iterator[None]:
    """This thread's default connection, as a user with every right on the test database
    but PROCESS (the usual application user)."""
    name = f"mysqlq_np_{connection.settings_dict['NAME'][-8:]}"
    database = connection.settings_dict["NAME"]
    with connection.cursor() as cursor:
        cursor.execute(f"DROP USER IF EXISTS '{name}'@'%'")
        cursor.execute(f"CREATE USER '{name}'@'%' IDENTIFIED BY 'pw'")
        cursor.execute(f"GRANT ALL ON `{database}`.* TO '{name}'@'%'")
    own = connections["default"]
    limited = own.copy()
    limited.settings_dict.update(USER=name, PASSWORD="pw")
    connections["default"] = limited  # this thread only
    try:
        yield
    finally:
        limited.close()
        connections["default"] = own
        with connection.cursor() as cursor:
            cursor.execute(f"DROP USER IF EXISTS '{name}'@'%'")


def test_without_the_process_privilege_the_age_is_unknown_not_an_error(settings):
    with open_snapshot():
        delete_some_messages()
        with user_without_process():
            lag = broker.purge_lag()
            with connection.cursor() as cursor:
                hidden_metric = _history_metric(cursor)
    assert (lag.visible, lag.oldest) == (False, None)
    # MariaDB's status variable needs no privilege; the deletes are all still there.
    assert lag.history_length is not None and lag.history_length >= DELETES
    assert lag.fields().endswith("oldest_trx=unknown")
    assert "unknown (needs the PROCESS privilege)" in lag.describe()
    assert hidden_metric is None  # MySQL 8's INNODB_METRICS fallback: hidden, not an error
    lag_thresholds(settings, length=DELETES - 1, seconds=1)
    warning = lag.warning()
    assert warning is not None and "history list length" in warning
    assert "can't see which transaction" in warning and "PROCESS" in warning


def test_the_history_metric_fallback_reads_the_same_figure():
    """MySQL 8 has no Innodb_history_list_length: INNODB_METRICS stands in (MariaDB has both)."""
    with connection.cursor() as cursor:
        metric = _history_metric(cursor)
    assert isinstance(metric, int) and metric >= 0


def test_queuestats_and_the_dashboard_show_the_lag_and_warn(settings, root):
    lag_thresholds(settings, seconds=1)
    with open_snapshot() as snapshot:
        hold_for(snapshot, 2)
        out = io.StringIO()
        call_command("queuestats", stdout=out)
        table = out.getvalue()
        out = io.StringIO()
        call_command("queuestats", "--json", stdout=out)
        data = json.loads(out.getvalue())["purge_lag"]
        page = root.get(DASHBOARD + "?refresh=0").content.decode()
        held = snapshot.held()
    assert "purge lag: InnoDB history list length" in table
    assert "WARNING: Purge lag: a transaction has been open for" in table
    assert data["transactions_visible"] is True
    assert data["oldest_transaction_seconds"] >= 2 and held >= 2
    assert isinstance(data["history_length"], int)
    assert data["oldest_transaction"]["connection_id"] > 0
    assert "replica" in data["warning"]
    assert 'id="purge-lag" class="errornote"' in page
    assert "oldest open transaction" in page and "Purge lag: a transaction has been open" in page


@pytest.mark.worker
def test_the_worker_summary_shows_the_lag_and_warns(start_worker):
    with open_snapshot():
        worker = start_worker(env={"MYSQLQ_TEST_SUMMARY": "0.3",
                                   "MYSQLQ_TEST_PURGE_LAG_SECONDS": "1"})
        wait_for(lambda: "Purge lag:" in worker.output(), 30,
                 message="the worker to warn of purge lag")
    output = worker.output()
    summary = next(line for line in output.splitlines() if "oldest_trx=" in line)
    assert "history_len=" in summary and " rate=" in summary
    warning = next(line for line in output.splitlines() if "Purge lag:" in line)
    assert "a transaction has been open for" in warning and "replica" in warning


@pytest.mark.parametrize("value, fragment", [
    ({"PURGE_LAG_WARNING": -1}, "must be an integer from 0"),
    ({"PURGE_LAG_WARNING": 1.5}, "must be an integer"),
    ({"PURGE_LAG_WARNING": True}, "must be an integer"),
    ({"PURGE_LAG_WARNING_SECONDS": "300"}, "finite number of seconds"),
    ({"PURGE_LAG_WARNING_SECONDS": -5}, "finite number of seconds from 0"),
])
def test_bad_thresholds_are_refused_with_the_rule(settings, value, fragment):
    from django_mysqlq.checks import check_settings

    settings.MYSQLQ = value
    [error] = check_settings()
    assert error.id == "django_mysqlq.E001" and fragment in error.msg


def test_zero_turns_either_warning_off(settings):
    from django_mysqlq.conf import get_settings

    settings.MYSQLQ = {"PURGE_LAG_WARNING": 0, "PURGE_LAG_WARNING_SECONDS": 0}
    conf = get_settings()
    lag = broker.PurgeLag(10**9, broker.OldestTransaction(1, 10**6), visible=True)
    assert lag.warning(conf) is None


def test_a_long_history_with_no_long_transaction_blames_none(settings):
    from django_mysqlq.conf import get_settings

    settings.MYSQLQ = {"PURGE_LAG_WARNING": 1000, "PURGE_LAG_WARNING_SECONDS": 300}
    young = broker.PurgeLag(5000, broker.OldestTransaction(7, 2, "app", "h"), visible=True)
    warning = young.warning(get_settings())
    assert warning is not None and "history list length is 5,000" in warning
    assert "no transaction has been open over 300s (the oldest: connection 7" in warning
    assert "KILL" not in warning and "innodb_purge_threads" in warning
    idle = broker.PurgeLag(5000, None, visible=True)
    assert "no transaction is open now" in (idle.warning(get_settings()) or "")
