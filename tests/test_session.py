"""The server's start time, as a broker connection measures it, whatever its session.

A claim carries its owner's connection id and the server's start time; recovery takes a
claim made before the server restarted. Measured through the session time zone, the start
of a connection opened in a DST fall-back hour was an hour early, so peers took its live
claims. The DST tests need the server's time zone tables (``.ci/setup`` loads them).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection, connections

from django_mysqlq import broker
from django_mysqlq.broker import session
from django_mysqlq.models import Message
from tests.testapp import tasks

pytestmark = [pytest.mark.django_db(transaction=True)]

ZONE = "America/New_York"
#: 01:30 on the fall-back days, first (EDT) and second (EST) time round.
FALL_BACK = {"2025 EDT": 1762061400, "2025 EST": 1762065000,
             "2027 EDT": 1825565400, "2027 EST": 1825569000}
#: A lease outliving the session clocks used here, so only the server-start rule can act.
LONG_LEASE = 5 * 365 * 86400.0


@pytest.fixture(autouse=True)
def _restore_clock_offset() -> Iterator[None]:
    """Sessions with a fixed ``timestamp`` skew the measured clock offset: put it back."""
    saved = session._clock_offset
    yield
    session._clock_offset = saved


@pytest.fixture
def time_zone_tables() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT CONVERT_TZ('2025-01-01 00:00:00', 'UTC', %s)", [ZONE])
        if cursor.fetchone()[0] is None:
            pytest.fail("The server has no time zone tables: run .ci/setup (it loads them "
                        "with mariadb-tzinfo-to-sql).")


def _open_session(time_zone: str, timestamp: int | None = None) -> None:
    """Reconnect this thread's connection with the given session clock settings."""
    connection.close()
    with connection.cursor() as cursor:
        cursor.execute("SET time_zone = %s", [time_zone])
        if timestamp is not None:
            cursor.execute("SET timestamp = %s", [timestamp])


@pytest.mark.parametrize("moment", FALL_BACK)
def test_the_server_start_ignores_the_session_time_zone(time_zone_tables, moment):
    _open_session("+00:00")
    _, utc_start = broker.connection_identity()
    _open_session(ZONE, FALL_BACK[moment])
    with connection.cursor() as cursor:
        cursor.execute("SELECT UNIX_TIMESTAMP(NOW(6)) - @@timestamp")
        old_error = int(cursor.fetchone()[0])
    _, dst_start = broker.connection_identity()
    connection.close()
    # The old measurement went through the session time zone: an hour off the second
    # time round.
    assert old_error == (-3600 if moment.endswith("EST") else 0)
    # Uptime has a one-second resolution and is read by its own statement.
    assert abs(dst_start - utc_start) <= 1


def _claim_in_thread(setup: Callable[[], None], claimed: list[Any],
                     done: threading.Event) -> threading.Thread:
    """Claim one message on a thread's own connection and keep it open until ``done``."""
    def run() -> None:
        try:
            setup()
            claimed.extend(broker.claim(["default"], 1, "worker-x", LONG_LEASE))
        finally:
            ready.set()
            done.wait(30)
            connections.close_all()

    ready = threading.Event()
    thread = threading.Thread(target=run)
    thread.start()
    ready.wait(30)
    return thread


def test_recovery_takes_no_live_claim_across_a_dst_fall_back_hour(time_zone_tables):
    """Claims from a normal and a fall-back-hour session survive sweeps from either."""
    for index in range(2):
        tasks.record.enqueue(f"m{index}")
    dst_second_time = FALL_BACK["2027 EST"]
    claimed: list[Any] = []
    done = threading.Event()
    threads = [
        _claim_in_thread(lambda: _open_session("+00:00"), claimed, done),
        _claim_in_thread(lambda: _open_session(ZONE, dst_second_time), claimed, done),
    ]
    try:
        assert len(claimed) == 2
        _open_session("+00:00")
        assert broker.recover() == []
        _open_session(ZONE, dst_second_time)
        assert broker.recover() == []
        connection.close()
        assert Message.objects.filter(status="claimed").count() == 2
    finally:
        done.set()
        for thread in threads:
            thread.join()


def test_a_server_without_a_clock_is_measured_by_this_host_s_clock_with_one_warning(caplog):
    monkey_warned = session._warned_no_server_clock
    session._warned_no_server_clock = False
    try:
        with caplog.at_level(logging.WARNING, logger="django_mysqlq"):
            assert session.server_start(None, 100, 2_000_000_000.6) == 1_999_999_900
            assert session.server_start(None, 100, 2_000_000_000.6) == 1_999_999_900
        warnings = [r for r in caplog.records if "no current time" in r.getMessage()]
        assert len(warnings) == 1
        assert "NTP" in warnings[0].getMessage()
    finally:
        session._warned_no_server_clock = monkey_warned


def test_an_uptime_wrapped_by_a_session_clock_before_the_server_start_is_signed():
    # Uptime = session clock - server start, sent unsigned: 5 s early wraps to 2**64 - 5.
    assert session.server_start(1_000.0, 2**64 - 5, 1_000.0) == 1_005


def test_a_start_up_to_a_minute_apart_is_the_same_server_beyond_it_a_restart():
    handle = tasks.record.enqueue("a")
    [claimed] = broker.claim(["default"], 1, "worker-x", 30)
    _, server_start = broker.connection_identity()
    Message.objects.filter(pk=handle.id).update(owner_server_start=server_start - 59)
    assert broker.recover() == []  # a slow measurement, not a restart
    Message.objects.filter(pk=handle.id).update(owner_server_start=server_start - 61)
    assert broker.recover() == [claimed.id]
