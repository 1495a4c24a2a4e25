"""Recovery must neither stall on one locked row nor take a claim its owner just renewed.

A producer that keeps its transaction open after enqueuing to a concurrency key holds that
key's gate row. A sweep that waited on it (eight lock waits, then an error) never recovered
the fleet's other lost claims, and its worker, the leader, treated it as an outage and
claimed nothing, round after round. Now that one message is skipped for the round.

Between the sweep's read of the claims and its lock of one, the owner may reconnect and
renew the claim (a new owner connection, a new lease): the sweep must see that and leave it.
"""

from __future__ import annotations

import importlib
import logging
import threading

import pytest
from django.db import connection, connections

from django_mysqlq import broker
from django_mysqlq.broker.subjects import GateRef
from django_mysqlq.models import Message
from tests.conftest import raw_connection, wait_for
from tests.subject_support import status
from tests.testapp import gated, tasks

pytestmark = pytest.mark.django_db(transaction=True)

#: The module (``broker.recover`` is its function of that name).
recovery = importlib.import_module("django_mysqlq.broker.recover")

#: The row-lock wait a worker's control connection keeps (``locked.short_wait``).
CONTROL_CONNECTION_WAIT = 1


def in_peer(function, *args):
    """Run ``function`` on a connection of its own, closed afterwards (a peer that died)."""
    box: dict = {}

    def run():
        try:
            box["value"] = function(*args)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return box["value"]


def peer_claim():
    return broker.claim(["default"], 10, "dead-peer", lease_seconds=30)


def short_session_wait() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SET SESSION innodb_lock_wait_timeout = %s", [CONTROL_CONNECTION_WAIT])


def test_a_gate_held_by_a_stranger_skips_that_claim_and_the_sweep_goes_on(caplog):
    keyed = [gated.limited_step.enqueue("k", seq, "t").id for seq in (1, 2)]  # limit 2
    plain = tasks.record.enqueue("a").id
    assert sorted(m.id for m in in_peer(peer_claim)) == sorted([*keyed, plain])
    short_session_wait()
    stranger = raw_connection()
    try:
        with stranger.cursor() as cursor:
            # A producer's transaction left open after enqueuing to the same key.
            cursor.execute("START TRANSACTION")
            cursor.execute("SELECT id FROM mysqlq_gate WHERE id = %s FOR UPDATE",
                           [GateRef("default", False, "k").id])
            assert cursor.fetchall()
        with caplog.at_level(logging.WARNING, logger="django_mysqlq"):
            # Polled: the server drops the peer's closed connection within moments.
            assert wait_for(broker.recover, timeout=20, message="a recovery") == [plain]
            assert status(*keyed) == ["claimed", "claimed"]
            assert broker.recover() == []  # still locked: skipped again, said once
        skips = [r for r in caplog.records if "skipped" in r.getMessage()]
        assert len(skips) == 1, [r.getMessage() for r in caplog.records]
        assert f"#{keyed[0]}, #{keyed[1]}" in skips[0].getMessage()
        assert "INNODB_TRX" in skips[0].getMessage()
        with stranger.cursor() as cursor:
            cursor.execute("COMMIT")
    finally:
        stranger.close()
    # The next round, once the stranger is done.
    assert sorted(broker.recover()) == keyed
    assert status(*keyed, plain) == ["ready", "ready", "ready"]


def test_a_claim_renewed_after_the_sweep_read_it_is_left_to_its_owner():
    handle = tasks.record.enqueue("a")
    [claimed] = in_peer(peer_claim)  # its connection closes: the owner looks gone
    alias = broker.default_alias()
    server_start = broker.connection_identity()[1]

    def read():
        with connection.cursor() as cursor:
            return recovery._lost_claims(cursor, "connection", server_start)

    [lost] = wait_for(read, timeout=20, message="the sweep's read to find the claim")
    # The owner reconnects and its heartbeat renews the claim on its new connection.
    renewed_on = in_peer(lambda: (broker.renew_leases([(claimed.id, claimed.claim_token)],
                                                      30),
                                  broker.connection_identity()[0]))
    assert renewed_on[0] == 1
    assert recovery._recover_one(alias, *lost) is None  # (the outcome when recovered)
    row = Message.objects.get(pk=handle.id)
    assert (row.status, row.claim_token, row.losses) == ("claimed", claimed.claim_token, 0)
    assert row.owner_connection == renewed_on[1]
