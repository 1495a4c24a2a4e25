"""Behind a proxy or pooler, connection ids are the proxy's: lease liveness and polling.

A real TCP relay (``bench.perf.proxy.CountingProxy``) stands in for ProxySQL or RDS Proxy:
the server sees the relay's socket, not the client's, and the relay's backend connection
can be killed (rotated) while the client carries on.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection, connections

from bench.perf.proxy import CountingProxy
from django_mysqlq import broker
from django_mysqlq.broker import proxy as proxy_module
from django_mysqlq.models import Attempt, Message, Worker
from tests.conftest import wait_for
from tests.testapp import tasks
from tests.testapp.models import Ledger
from tests.thread_support import in_thread_with_default

pytestmark = [pytest.mark.django_db(transaction=True)]

WARNING = "goes through a proxy or pooler"


@pytest.fixture
def relay() -> Iterator[CountingProxy]:
    settings = connection.settings_dict
    proxy = CountingProxy(settings["HOST"] or "127.0.0.1", int(settings["PORT"] or 3306))
    yield proxy
    proxy.close()


@pytest.fixture
def fresh_warning() -> Iterator[None]:
    """The proxy warning is once per process: let this test see it again."""
    saved = proxy_module._warned
    proxy_module._warned = False
    yield
    proxy_module._warned = saved


def _in_thread(body: Callable[[], Any], **database: Any) -> Any:
    """Run ``body`` in a thread whose queue connection uses these DATABASES entries."""
    return in_thread_with_default(body, **database)


def _direct() -> bool:
    return broker.connection_session().direct


def test_direct_connections_are_trusted_over_tcp_and_over_the_unix_socket():
    with connection.cursor() as cursor:
        cursor.execute("SELECT @@socket")
        unix_socket = cursor.fetchone()[0]
    assert _in_thread(_direct) is True
    assert _in_thread(_direct, HOST=unix_socket) is True


def test_a_relay_is_detected_once_per_connection_with_one_warning(relay, fresh_warning,
                                                                  caplog):
    with caplog.at_level(logging.WARNING, logger="django_mysqlq"):
        assert _in_thread(_direct, PORT=relay.port) is False
        assert _in_thread(_direct, PORT=relay.port) is False
    warnings = [r.getMessage() for r in caplog.records if WARNING in r.getMessage()]
    assert len(warnings) == 1
    assert "stamps no owner connection" in warnings[0]
    assert "sends no KILL QUERY" in warnings[0]


def test_the_detection_can_be_turned_off(relay, settings):
    settings.MYSQLQ = {**settings.MYSQLQ, "DETECT_PROXY": False}
    assert _in_thread(_direct, PORT=relay.port) is True


def test_detect_proxy_must_be_a_boolean(settings):
    from django_mysqlq.checks import check_settings

    settings.MYSQLQ = {"DETECT_PROXY": "no"}
    [error] = check_settings()
    assert error.id == "django_mysqlq.E001"
    assert "MYSQLQ['DETECT_PROXY'] must be True or False, not 'no'." in error.msg


def test_a_producer_behind_a_relay_never_kills_a_listener(relay):
    """Even a listener row that names a live connection is left alone."""
    parked_id: list[int] = []
    slept: list[int] = []
    started = threading.Event()

    def park() -> None:
        try:
            with connections["default"].cursor() as cursor:
                cursor.execute("SELECT CONNECTION_ID()")
                parked_id.append(cursor.fetchone()[0])
                started.set()
                cursor.execute("SELECT SLEEP(2)")
                slept.append(cursor.fetchone()[0])  # 1 when a KILL QUERY cut it short
        finally:
            connections.close_all()

    sleeper = threading.Thread(target=park)
    sleeper.start()
    started.wait(10)
    with connection.cursor() as cursor:  # a parked worker's row, on the database clock
        cursor.execute(
            "INSERT INTO mysqlq_worker (id, host, pid, queues, concurrency, connection_id, "
            "started_at, last_heartbeat, listening, processed, failed) VALUES ('parked', "
            "'h', 1, 'proxied', 1, %s, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), 1, 0, 0)",
            [parked_id[0]])
    woken = _in_thread(lambda: broker.wake(["proxied"]), PORT=relay.port)
    sleeper.join()
    assert woken == 0
    assert slept == [0]


@pytest.mark.worker
def test_a_worker_behind_a_relay_claims_by_lease_polls_and_survives_a_rotation(
        relay, start_worker):
    worker = start_worker("--concurrency", "1", env={"MYSQLQ_TEST_PORT": str(relay.port)})
    row = wait_for(lambda: Worker.objects.filter(stopped_at__isnull=True).first(),
                   message="the worker to register")
    # An idle worker parks within milliseconds when it may: this one must poll.
    for _ in range(10):
        threading.Event().wait(0.1)
        row.refresh_from_db()
        assert not row.listening
    # A task thread that enqueues is a producer behind the relay too.
    tasks.enqueues_child.enqueue("parent")
    wait_for(lambda: Ledger.objects.filter(label="parent:child").exists(),
             message="the child task to run")

    message = tasks.slow.enqueue("slow", 3)
    wait_for(lambda: Ledger.objects.filter(label="slow:start").exists(),
             message="the slow task to start")
    claimed = Message.objects.get(id=message.id)
    assert claimed.status == "claimed"
    assert (claimed.owner_connection, claimed.owner_server_start) == (None, None)

    # Rotate the control connection's backend, then sweep from a direct connection
    # before the worker has reconnected.
    row.refresh_from_db()
    beat = row.last_heartbeat
    with connection.cursor() as cursor:
        cursor.execute("KILL CONNECTION %s", [row.connection_id])
    assert broker.recover() == []
    wait_for(lambda: Ledger.objects.filter(label="slow:end").exists(), timeout=20,
             message="the slow task to finish")
    wait_for(lambda: not Message.objects.filter(id=message.id).exists(),
             message="the slow task's ack")
    assert list(Attempt.objects.filter(message_id=message.id)
                .values_list("outcome", flat=True)) == ["succeeded"]
    row.refresh_from_db()
    assert row.last_heartbeat > beat  # still heartbeating after the rotation
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.output()
    assert worker.output().count(WARNING) == 1, worker.output()
