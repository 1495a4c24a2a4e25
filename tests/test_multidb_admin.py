"""The admin with queues on two servers: every list shows the rows of the database its
"database" filter names (ids are per database: a message #N may live on both), and every
action acts on that database only, with no ``DATABASE_ROUTERS`` entry installed.

The default database is the main server (3306), ``queues_b`` the second one (3407, started
by the session as in tests/test_multidb.py). Rows with the same id are made on both
wherever a list or an action could confuse them.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.test import Client

from django_mysqlq import broker, routing
from django_mysqlq.messages import AttemptResult
from django_mysqlq.models import Attempt, Message, Schedule
from tests import multidb_support as mdb
from tests.operator_support import RUNNER, claim_only, make_dead, user
from tests.testapp import tasks

pytestmark = [pytest.mark.django_db(transaction=True, databases="__all__")]

B = mdb.ALIAS_B
QUEUE_B = "mdb_b"
ADMIN = "/admin/django_mysqlq"


@pytest.fixture(autouse=True)
def queues_on_two_servers(second_server: None, settings: Any) -> Iterator[None]:
    settings.MYSQLQ = {**settings.MYSQLQ, "QUEUES": {QUEUE_B: {"DATABASE": B}}}
    for table in ("message", "attempt", "worker", "schedule", "queue", "gate", "rate"):
        mdb.query(B, f"DELETE FROM mysqlq_{table}")  # B is not flushed between tests
    assert not any(isinstance(r, routing.QueueRouter) or "QueueRouter" in str(r)
                   for r in django_settings.DATABASE_ROUTERS)  # no router needed
    yield


def page(client: Client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    return response.content.decode()


def same_id_on_default(message_id: int, label: str = "twin") -> None:
    """Make a ready message with ``message_id`` on the default database too."""
    pad = tasks.record.enqueue(label)
    if pad.id == message_id:
        return
    if not Message.objects.using("default").filter(pk=message_id).exists():
        twin = Message.objects.using("default").get(pk=pad.id)
        twin.pk = message_id
        twin.save(using="default", force_insert=True)
    Message.objects.using("default").filter(pk=pad.id).delete()


def dead_on_b(label: str) -> int:
    """A message on B that failed its last attempt, as a worker leaves it."""
    handle = tasks.always_fails.using(queue=QUEUE_B).enqueue(label)
    with routing.on_alias(B):
        message = claim_only(handle.id, QUEUE_B)
        broker.fail(message, RUNNER, AttemptResult(
            started_at=broker.database_now(), error_class="ValueError",
            error_message=f"boom {label}", traceback="Traceback ..."), retry=False)
    return handle.id


def link(message_id: int, database: str = "") -> str:
    suffix = f"?database={database}" if database else ""
    return f"{ADMIN}/message/{message_id}/change/{suffix}"


def test_the_messages_list_and_its_filters_show_the_database_chosen(root: Client) -> None:
    dead_on_b("only on b")
    on_b = tasks.record.using(queue=QUEUE_B).enqueue("on b")
    same_id_on_default(on_b.id)
    listing = page(root, f"{ADMIN}/message/?database={B}")
    assert f"{ADMIN}/message/{on_b.id}/change/?_changelist_filters=database%3D{B}" in listing \
        or f"/message/{on_b.id}/change/" in listing
    assert QUEUE_B in listing
    # The queue filter offers B's queues, the database filter both aliases, B selected.
    assert f"?database={B}&amp;queue={QUEUE_B}" in listing
    assert 'queue=default"' not in listing
    assert f'<li class="selected">\n    <a href="?database={B}"' in listing \
        or f'class="selected"><a href="?database={B}"' in listing.replace("\n", "") \
        or _selected_choice(listing) == B
    default = page(root, f"{ADMIN}/message/")
    assert QUEUE_B not in results(default) and "<td" in results(default)
    assert _selected_choice(default) == "default"
    # The task filter's choices come from B: a task only B holds is offered there only.
    dead_list = page(root, f"{ADMIN}/deadmessage/?database={B}")
    assert "task=tests.testapp.tasks.always_fails" in dead_list
    assert "task=tests.testapp.tasks.always_fails" not in page(root, f"{ADMIN}/deadmessage/")
    # Search on B finds B's row by id (one index lookup on B).
    found = page(root, f"{ADMIN}/message/?database={B}&q={on_b.id}")
    assert QUEUE_B in results(found) and f"/message/{on_b.id}/change/" in results(found)


def results(html: str) -> str:
    """The rows of a list page (its result table)."""
    return html.split('id="result_list"')[1].split("</table>")[0] \
        if 'id="result_list"' in html else ""


def _selected_choice(html: str) -> str:
    """The alias the database filter marks selected."""
    import re

    block = html.split("By database")[1].split("</ul>")[0] if "By database" in html \
        else html.split(" database ")[1].split("</ul>")[0]
    found = re.search(r'class="selected">\s*<a href="\?database=([\w]+)', block)
    assert found, block
    return found.group(1)


def test_a_message_page_shows_its_own_databases_row_trace_and_buttons(root: Client) -> None:
    dead = dead_on_b("trace on b")
    same_id_on_default(dead, "a twin on default")
    detail = page(root, link(dead, B))
    assert QUEUE_B in detail and "boom trace on b" in detail  # B's row and B's trace
    assert f"/message/{dead}/act/requeue/?database={B}" in detail
    confirm = page(root, f"{ADMIN}/message/{dead}/act/cancel/?database={B}")
    assert f'<a href="{link(dead, B)}" class="button cancel-link">' in confirm
    twin = page(root, link(dead))
    assert "boom trace on b" not in twin and QUEUE_B not in twin
    # The dead list's rows link to the message page on their own database.
    entry = root.get(f"{ADMIN}/deadmessage/{dead}/change/?database={B}")
    assert entry.status_code == 302 and entry["Location"] == link(dead, B)


def test_history_links_keep_the_database(root: Client) -> None:
    """#N, "trace" and a trace row's link on B lead to B's rows, not the default
    database's same ids."""
    dead = dead_on_b("linked on b")
    same_id_on_default(dead, "a twin on default")
    [attempt] = Attempt.objects.using(B).filter(message_id=dead).values_list("pk", flat=True)
    message_page = f'href="/admin/django_mysqlq/message/{dead}/change/?database={B}"'
    trace = f'href="/admin/django_mysqlq/attempt/?message_id={dead}&amp;database={B}"'
    history = page(root, f"{ADMIN}/attempt/?database={B}")
    assert message_page in history and trace in history
    detail = page(root, f"{ADMIN}/attempt/{attempt}/change/?database={B}")
    assert message_page in detail and trace in detail
    row = f'href="/admin/django_mysqlq/attempt/{attempt}/change/?database={B}"'
    assert row in page(root, link(dead, B))


def test_bulk_actions_act_on_the_lists_database_only(root: Client) -> None:
    dead_a = make_dead(label="stays dead on a")
    dead = dead_on_b("requeued on b")
    same_id_on_default(dead)
    twin = Message.objects.using("default").get(pk=dead).status
    response = root.post(f"{ADMIN}/deadmessage/?database={B}",
                         {"action": "retry_dead", "_selected_action": [str(dead)],
                          "database": B})
    assert response.status_code == 302
    assert mdb.query(B, "SELECT status FROM mysqlq_message WHERE id=%s", [dead]) == [("ready",)]
    assert Message.objects.using("default").get(pk=dead).status == twin  # untouched
    assert Message.objects.using("default").get(pk=dead_a).status == "dead"
    # Cancel from B's list: only B's row goes.
    response = root.post(f"{ADMIN}/message/?database={B}",
                         {"action": "cancel", "_selected_action": [str(dead)],
                          "confirmed": "yes", "database": B})
    assert response.status_code in (200, 302)
    assert mdb.query(B, "SELECT COUNT(*) FROM mysqlq_message WHERE id=%s", [dead]) == [(0,)]
    assert Message.objects.using("default").filter(pk=dead).exists()
    assert Attempt.objects.using(B).filter(message_id=dead, outcome="cancelled").exists()
    assert not Attempt.objects.using("default").filter(message_id=dead,
                                                       outcome="cancelled").exists()


def test_the_stuck_list_and_release_act_on_b(root: Client) -> None:
    handle = tasks.record.using(queue=QUEUE_B).enqueue("stuck on b")
    with routing.on_alias(B):
        claimed = claim_only(handle.id, QUEUE_B)
        broker.mark_started([(claimed, broker.database_now())])
    # Make its lease run out: the claim's connection (this thread's) is alive, so only
    # an expired lease makes it stuck and releasable.
    mdb.query(B, "UPDATE mysqlq_message SET lease_expires_at = NOW(6) - INTERVAL 1 MINUTE "
              "WHERE id=%s", [handle.id])
    stuck = page(root, f"{ADMIN}/stuckmessage/?database={B}")
    assert f"/stuckmessage/{handle.id}/change/" in stuck
    assert f"/stuckmessage/{handle.id}/change/" not in page(root, f"{ADMIN}/stuckmessage/")
    response = root.post(f"{ADMIN}/stuckmessage/?database={B}",
                         {"action": "release", "_selected_action": [str(handle.id)],
                          "database": B})
    assert response.status_code == 302
    [(status,)] = mdb.query(B, "SELECT status FROM mysqlq_message WHERE id=%s", [handle.id])
    assert status in ("ready", "scheduled")


def test_a_live_claim_on_b_is_not_stuck_even_when_the_page_reads_a_replica(
        root: Client, settings: Any) -> None:
    settings.MYSQLQ = {**settings.MYSQLQ, "READ_DATABASE": {B: mdb.ALIAS_R}}
    handle = tasks.record.using(queue=QUEUE_B).enqueue("alive on b")
    with routing.on_alias(B):
        claim_only(handle.id, QUEUE_B)  # this thread's connection to B: alive
    mdb.wait_replicated()
    listing = page(root, f"{ADMIN}/message/?database={B}")
    assert f"/message/{handle.id}/change/" in listing  # read from the replica
    # Liveness is judged on B (the replica's process list does not hold B's connections).
    assert f"/stuckmessage/{handle.id}/change/" not in page(
        root, f"{ADMIN}/stuckmessage/?database={B}")
    assert "act/release/" not in page(root, link(handle.id, B))


def test_the_dashboard_and_queuestats_judge_stuck_and_purge_lag_on_b_not_its_replica(
        root: Client, settings: Any) -> None:
    """Read from the replica, the dashboard's counts are the replica's; but a claim's
    owner is alive in B's process list (never the replica's), and the transaction holding
    purge back is B's: naming a replica connection would send a KILL to the wrong one."""
    import json
    import re
    from io import StringIO

    from django.core.management import call_command

    settings.MYSQLQ = {**settings.MYSQLQ, "READ_DATABASE": {B: mdb.ALIAS_R}}
    handle = tasks.record.using(queue=QUEUE_B).enqueue("alive on b")
    with routing.on_alias(B):
        claim_only(handle.id, QUEUE_B)  # this thread's connection to B: alive
    mdb.wait_replicated()
    holder = mdb.raw(B)
    try:
        cursor = holder.cursor()
        cursor.execute("SELECT CONNECTION_ID()")
        (holder_id,) = cursor.fetchone()
        cursor.execute("START TRANSACTION")
        cursor.execute("SELECT COUNT(*) FROM mysqlq_queue FOR UPDATE")
        dashboard = page(root, f"{ADMIN}/queuestate/?database={B}&refresh=0")
        assert re.search(r'id="stuck-count">(\d+)<', dashboard).group(1) == "0"
        out = StringIO()
        call_command("queuestats", "--json", "--database", B, stdout=out)
        data = json.loads(out.getvalue())
        assert data["read_from"] == mdb.ALIAS_R
        assert data["stuck"] == 0
        assert data["purge_lag"]["oldest_transaction"]["connection_id"] == holder_id
    finally:
        holder.rollback()
        holder.close()


def test_the_blocked_list_and_its_subject_actions_on_b(root: Client) -> None:
    from tests.testapp import gated

    first = gated.ordered_dies.using(queue=QUEUE_B).enqueue("k1", 1, "blk")
    second = gated.ordered_dies.using(queue=QUEUE_B).enqueue("k1", 2, "blk")
    with routing.on_alias(B):
        claimed = claim_only(first.id, QUEUE_B)
        broker.fail(claimed, RUNNER, AttemptResult(
            started_at=broker.database_now(), error_class="ValueError",
            error_message="dead head", traceback=""), retry=False)
    blocked = page(root, f"{ADMIN}/blockedmessage/?database={B}")
    assert f"/blockedmessage/{second.id}/change/" in blocked
    # The holder's link keeps the database.
    assert f"/message/{first.id}/change/?database={B}" in blocked
    assert f"/blockedmessage/{second.id}/change/" not in page(root, f"{ADMIN}/blockedmessage/")
    response = root.post(f"{ADMIN}/blockedmessage/?database={B}",
                         {"action": "release_subject", "_selected_action": [str(second.id)],
                          "confirmed": "yes", "database": B})
    assert response.status_code in (200, 302)
    assert mdb.query(B, "SELECT status FROM mysqlq_message WHERE id=%s", [second.id]) \
        == [("ready",)]


def test_history_workers_and_schedules_lists_on_b(root: Client) -> None:
    dead = dead_on_b("history on b")
    history = page(root, f"{ADMIN}/attempt/?database={B}")
    assert "boom history on b" in history or f"{dead}" in history
    assert f"queue={QUEUE_B}" in history  # the history's queue filter reads B
    assert f"queue={QUEUE_B}" not in page(root, f"{ADMIN}/attempt/")
    with routing.on_alias(B):
        broker.register_worker("b-host:7:w", "b-host", 7, [QUEUE_B], 1)
    workers = page(root, f"{ADMIN}/worker/?database={B}")
    assert "b-host:7:w" in workers
    assert "b-host:7:w" not in page(root, f"{ADMIN}/worker/")
    now = dt.datetime.now(dt.UTC)
    Schedule.objects.using(B).create(
        name="nightly-b", source="code", task_name="tests.testapp.tasks.record",
        queue=QUEUE_B, max_attempts=1, retry_backoff=1, payload="{}", cron="0 3 * * *",
        timezone="UTC", catch_up="latest", created_at=now, declared_at=now,
        last_message_id=dead)
    schedules = page(root, f"{ADMIN}/schedule/?database={B}")
    assert "nightly-b" in schedules
    assert f"?message_id={dead}&amp;database={B}" in schedules
    assert "nightly-b" not in page(root, f"{ADMIN}/schedule/")
    response = root.post(f"{ADMIN}/schedule/?database={B}",
                         {"action": "pause_selected", "_selected_action": ["nightly-b"],
                          "database": B})
    assert response.status_code == 302
    assert Schedule.objects.using(B).get(name="nightly-b").paused is True


def test_the_dashboards_pause_acts_on_the_queues_database_and_comes_back_to_it(
        root: Client) -> None:
    response = root.post(f"{ADMIN}/queuestate/pause/", {"queue": QUEUE_B, "paused": "1"})
    assert response.status_code == 302 and response["Location"].endswith(f"?database={B}")
    assert broker.paused_queues(B) == {QUEUE_B}
    assert broker.paused_queues("default") == set()
    assert "paused" in page(root, response["Location"])
    broker.set_paused(QUEUE_B, False, broker.Operator("test"))


def test_the_rate_keys_list_shows_b_and_links_to_b_s_throttled_messages(root: Client) -> None:
    from tests.testapp.rated_tasks import per_account

    ids = {per_account.using(queue=QUEUE_B).enqueue("acct-b", seq, "b").id for seq in range(2)}
    keys = page(root, f"{ADMIN}/ratelimit/?database={B}")
    assert "acct-b" in keys and "acct-b" not in page(root, f"{ADMIN}/ratelimit/")
    link = f"{ADMIN}/message/?database={B}&amp;queue={QUEUE_B}&amp;status__exact=throttled" \
        "&amp;rate_key=acct-b"
    assert f'href="{link}">2<' in keys
    response = root.get(link.replace("&amp;", "&"))
    assert {m.pk for m in response.context["cl"].result_list} == ids


def test_every_dashboard_link_to_a_list_with_a_database_filter_keeps_b(
        root: Client, settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers, stuck, the refresh links, a worker's troubles, an overran handler's #id,
    the recurring tasks, a group's dead count and the top failing tasks: each opens B's
    rows (the same ids on the default database are other rows)."""
    import html
    import re
    from types import SimpleNamespace

    dead_on_b("failing on b")  # the top failing task
    with routing.on_alias(B):
        broker.register_worker("b-host:8:w", "b-host", 8, [QUEUE_B], 1)
    mdb.query(B, "UPDATE mysqlq_worker SET troubles='keeps failing' WHERE id='b-host:8:w'")
    overran = tasks.record.using(queue=QUEUE_B).enqueue("overran").id
    mdb.query(B, "UPDATE mysqlq_message SET queue='group:g', status='claimed', timeout=1, "
              "started_at=UTC_TIMESTAMP(6) - INTERVAL 1 MINUTE, claimed_at=started_at, "
              "worker_id='b-host:8:w' WHERE id=%s", [overran])
    now = dt.datetime.now(dt.UTC)
    Schedule.objects.using(B).create(
        name="hourly-b", source="code", task_name="tests.testapp.tasks.record",
        queue=QUEUE_B, max_attempts=1, retry_backoff=1, payload="{}", cron="0 * * * *",
        timezone="UTC", catch_up="latest", created_at=now, declared_at=now)
    group = SimpleNamespace(topic="t", group="g", position=0, lag_shown="0",
                            oldest_age_seconds=None, task_name="group:g", dead=1,
                            pump_problem="")
    monkeypatch.setattr(broker, "groups", lambda *args, **kwargs: [group])
    dashboard = page(root, f"{ADMIN}/queuestate/?database={B}")
    links = [html.unescape(href) for href in re.findall(r'href="([^"]*)"', dashboard)]
    wanted = [f"{ADMIN}/worker/?database={B}&state=alive", f"{ADMIN}/stuckmessage/?database={B}",
              f"?database={B}&refresh=0", f"{ADMIN}/worker/b-host:8:w/change/?database={B}",
              f"{ADMIN}/message/{overran}/change/?database={B}",
              f"{ADMIN}/schedule/?database={B}",
              f"{ADMIN}/deadmessage/?database={B}&task=group%3Ag",
              f"{ADMIN}/attempt/?database={B}&task=tests.testapp.tasks.always_fails"]
    for link in wanted:
        assert link.replace(":8:", "_3A8_3A") in links or link in links, (link, links)
    assert f"?database={B}" in page(root, f"{ADMIN}/queuestate/?database={B}&refresh=0") \
        .split("Auto-refresh")[0].rsplit("<a ", 1)[1]


def test_topic_pages_read_the_default_database(root: Client) -> None:
    for url in ("topicstate", "topicmessage", "topicgroup"):
        assert page(root, f"{ADMIN}/{url}/") != ""


def test_a_user_with_view_permission_only_sees_b_but_cannot_act(client: Client) -> None:
    dead = dead_on_b("viewer")
    client.force_login(user("viewer_b"))
    assert f"/deadmessage/{dead}/change/" in page(client, f"{ADMIN}/deadmessage/?database={B}")
    response = client.post(f"{ADMIN}/message/{dead}/act/requeue/?database={B}", {})
    assert response.status_code == 403
    assert mdb.query(B, "SELECT status FROM mysqlq_message WHERE id=%s", [dead]) == [("dead",)]


def test_a_consumer_group_queue_on_another_database_is_refused(settings: Any) -> None:
    from django.core.checks import run_checks

    settings.MYSQLQ = {**settings.MYSQLQ, "QUEUES": {"group:billing": {"DATABASE": B}}}
    assert "django_mysqlq.E012" in {e.id for e in run_checks()}
    settings.MYSQLQ = {**settings.MYSQLQ, "QUEUES": {QUEUE_B: {"DATABASE": B}}}
    assert "django_mysqlq.E012" not in {e.id for e in run_checks()}


def test_the_search_reads_keys_on_the_page_s_database(root: Client) -> None:
    """Which key a search term is (dedup, ordered subject, rate-limit) is decided on the
    list's database: a key only B's messages have finds them on B's list."""
    on_b = tasks.record.using(queue=QUEUE_B).enqueue("keyed on b").id
    other = tasks.record.using(queue=QUEUE_B).enqueue("rated on b").id
    same_id_on_default(on_b)
    same_id_on_default(other)
    mdb.query(B, "UPDATE mysqlq_message SET dedup_key='dedup-b', gate_key='subject-b' "
              "WHERE id=%s", [on_b])
    mdb.query(B, "UPDATE mysqlq_message SET rate_key='rate-b' WHERE id=%s", [other])
    for term, wanted in (("dedup-b", on_b), ("subject-b", on_b), ("rate-b", other)):
        response = root.get(f"{ADMIN}/message/?database={B}&q={term}")
        assert response.status_code == 200
        assert [m.pk for m in response.context["cl"].result_list] == [wanted], term
        assert not root.get(f"{ADMIN}/message/?q={term}").context["cl"].result_list
