"""History, workers and dashboard admin pages through Django's test client."""

from __future__ import annotations

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.urls import reverse

from django_mysqlq import broker
from django_mysqlq.models import Attempt, Message
from tests.operator_support import OPERATOR, RUNNER, claim_only, make_dead
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

HISTORY = "/admin/django_mysqlq/attempt/"
WORKERS = "/admin/django_mysqlq/worker/"
DASHBOARD = "/admin/django_mysqlq/queuestate/"


def succeed(label: str, task=tasks.record) -> int:
    handle = task.enqueue(label)
    message = claim_only(handle.id, task.queue)
    broker.ack(message, RUNNER, broker.AttemptResult(started_at=broker.database_now()))
    return handle.id


# ------------------------------------------------------------------ history


def test_history_lists_and_filters_by_outcome_task_queue_and_date(root):
    done = succeed("ok")
    dead = make_dead()
    other = succeed("o", task=tasks.on_other_queue)

    def listed(query: str) -> set[int]:
        response = root.get(HISTORY + query)
        assert response.status_code == 200
        return {row.message_id for row in response.context["cl"].result_list}

    assert listed("") == {done, dead, other}
    assert listed("?outcome__exact=failed") == {dead}
    assert listed("?task=tests.testapp.tasks.always_fails") == {dead}
    assert listed("?queue=other") == {other}
    assert listed(f"?message_id={done}") == {done}
    assert listed("?finished_at__gte=2000-01-01+00:00:00%2B00:00"
                  "&finished_at__lt=2001-01-01+00:00:00%2B00:00") == set()
    assert listed("?finished_at__gte=2000-01-01+00:00:00%2B00:00") == {done, dead, other}
    page = root.get(HISTORY).content.decode()
    assert reverse("admin:django_mysqlq_message_change", args=[dead]) in page


def test_history_detail_links_to_the_message_and_replays(root):
    done = succeed("again")
    row = Attempt.objects.get(message_id=done)
    page = root.get(reverse("admin:django_mysqlq_attempt_change", args=[row.pk])).content
    assert b'id="replay"' in page and b"this history is all that is left" in page
    response = root.post(reverse("admin:django_mysqlq_attempt_replay", args=[row.pk]))
    copy = Message.objects.get()
    assert response.status_code == 302
    assert response["Location"] == reverse("admin:django_mysqlq_message_change", args=[copy.pk])
    assert copy.payload == row.payload and copy.status == "ready"
    assert Attempt.objects.get(message_id=copy.pk).actor == "admin:root"


def test_history_bulk_replay_and_rows_without_arguments(root):
    dead = make_dead()
    broker.requeue([dead], OPERATOR)
    final, requeued = Attempt.objects.filter(message_id=dead).order_by("id")
    page = root.post(HISTORY, {"action": "replay_selected",
                               ACTION_CHECKBOX_NAME: [final.pk, requeued.pk]},
                     follow=True).content.decode()
    assert "Replayed history row" in page and "only the final row" in page
    assert Message.objects.count() == 2  # the requeued original and one copy


def test_history_bulk_replay_refuses_past_its_cap_and_sums_up_many_rows(root, monkeypatch):
    """Past the cap nothing is replayed (not silently the first rows), with the batch tool
    named; past a few rows one summary line, not one line per row."""
    from django_mysqlq.admin import attempts

    monkeypatch.setattr(attempts, "REPLAY_CAP", 3)
    monkeypatch.setattr(attempts, "REPLAY_LINES", 2)
    done = [succeed(label) for label in "abcd"]
    rows = list(Attempt.objects.filter(message_id__in=done).values_list("pk", flat=True))
    page = root.post(HISTORY, {"action": "replay_selected", "select_across": "1",
                               ACTION_CHECKBOX_NAME: rows[:1]}, follow=True).content.decode()
    assert "at most 3 history rows" in page and "queuepipeline replay" in page
    assert not Message.objects.exists()
    page = root.post(HISTORY, {"action": "replay_selected", ACTION_CHECKBOX_NAME: rows[:3]},
                     follow=True).content.decode()
    assert Message.objects.count() == 3
    assert "Replayed 3 history rows as new messages" in page
    assert "Replayed history row" not in page


def test_history_is_read_only_and_replay_needs_its_permission(root, viewer):
    done = succeed("x")
    row = Attempt.objects.get(message_id=done)
    assert root.post(reverse("admin:django_mysqlq_attempt_delete", args=[row.pk]),
                     {"post": "yes"}).status_code == 403
    assert viewer.post(reverse("admin:django_mysqlq_attempt_replay",
                               args=[row.pk])).status_code == 403
    page = viewer.get(reverse("admin:django_mysqlq_attempt_change", args=[row.pk])).content
    assert b'id="replay"' not in page
    assert not Message.objects.exists()


# ------------------------------------------------------------------ workers


def test_workers_show_alive_stale_and_stopped(root):
    broker.register_worker("alive-1", "host-a", 11, ["default"], 4)
    broker.register_worker("stale-1", "host-b", 12, ["emails"], 2)
    broker.register_worker("gone-1", "host-c", 13, ["default"], 1)
    broker.deregister_worker("gone-1", processed=5, failed=1)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE mysqlq_worker SET last_heartbeat = last_heartbeat - "
                       "INTERVAL 1 HOUR WHERE id = 'stale-1'")
    broker.heartbeat_worker("alive-1", processed=42, failed=3)

    def listed(query: str) -> dict[str, str]:
        response = root.get(WORKERS + query)
        admin_ = response.context["cl"].model_admin
        return {w.id: admin_.state(w) for w in response.context["cl"].result_list}

    assert listed("") == {"alive-1": "alive", "stale-1": "stale", "gone-1": "stopped"}
    assert listed("?state=alive") == {"alive-1": "alive"}
    assert listed("?state=stale") == {"stale-1": "stale"}
    page = root.get(WORKERS).content.decode()
    for text in ("host-a", "42", "emails"):
        assert text in page


# ------------------------------------------------------------------ dashboard


def test_dashboard_counts_throughput_failures_and_workers(root):
    for label in "abc":
        succeed(label)
    make_dead(label="d")
    tasks.record.enqueue("waiting")
    tasks.record.using(delay=3600).enqueue("later")
    broker.register_worker("w-1", "h", 1, ["default"], 1)
    response = root.get(DASHBOARD)
    assert response.status_code == 200
    data = response.context["data"]
    [default] = [q for q in data.queues if q.name == "default"]
    assert (default.ready, default.scheduled, default.claimed, default.dead) == (1, 1, 0, 1)
    assert default.throughput == {1: 4, 5: 4, 60: 4}
    assert default.failure_rate == 0.25
    assert default.oldest_ready_seconds is not None
    assert data.top_failing == [("tests.testapp.tasks.always_fails", 1)]
    assert data.workers_alive == 1 and data.per_minute[-1] == 4
    page = response.content.decode()
    assert '<meta http-equiv="refresh"' in page and 'id="chart"' in page
    assert "?queue=default&amp;status__exact=dead" in page
    assert "25%" in page


def test_dashboard_pause_and_resume(root, viewer):
    tasks.record.enqueue("x")
    url = reverse("admin:django_mysqlq_queuestate_pause")
    assert viewer.post(url, {"queue": "default", "paused": "1"}).status_code == 403
    assert broker.paused_queues() == set()
    assert b'value="Pause"' not in viewer.get(DASHBOARD).content
    assert root.get(url).status_code == 405
    response = root.post(url, {"queue": "default", "paused": "1"}, follow=True)
    assert broker.paused_queues() == {"default"}
    assert "paused" in response.content.decode() and b'value="Resume"' in response.content
    root.post(url, {"queue": "default", "paused": "0"})
    assert broker.paused_queues() == set()


def test_dashboard_needs_view_permission():
    client = Client()
    client.force_login(User.objects.create_user("nobody", password="pw", is_staff=True))
    assert client.get(DASHBOARD).status_code == 403


def test_dashboard_refresh_can_be_turned_off(root):
    page = root.get(DASHBOARD + "?refresh=0").content.decode()
    assert "http-equiv" not in page


def test_the_history_list_never_counts_the_whole_table(root):
    from django.test.utils import CaptureQueriesContext

    succeed("a")
    make_dead()

    def counts(query: str) -> list[str]:
        with CaptureQueriesContext(connection) as captured:
            assert root.get(HISTORY + query).status_code == 200
        return [q["sql"] for q in captured.captured_queries
                if "COUNT(" in q["sql"] and "mysqlq_attempt" in q["sql"]]

    for query in ("", "?outcome__exact=failed"):
        [count] = counts(query)
        assert "LIMIT 10001" in count  # stops at the cap: "10,000+"
    assert "WHERE" in counts("?outcome__exact=failed")[0]
