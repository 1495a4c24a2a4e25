"""Admin pages that must not fail or leak: a payload nested too deeply, too long or not
readable (a message's or a topic message's), "Release stuck claim" under
``ATOMIC_REQUESTS``, and action pages for staff who may act but not view."""

from __future__ import annotations

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.auth.models import Permission, User
from django.db import connections
from django.test import Client
from django.urls import reverse

from django_mysqlq import broker
from django_mysqlq.admin.actions import ACTIONS
from django_mysqlq.models import Message
from tests import multidb_support as mdb
from tests.conftest import wait_for
from tests.operator_support import claim_in_peer, make_dead
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def page(message_id: int) -> str:
    return reverse("admin:django_mysqlq_message_change", args=[message_id])


def act_url(message_id: int, name: str) -> str:
    return reverse("admin:django_mysqlq_message_act", args=[message_id, name])


def status(message_id: int) -> str | None:
    row = Message.objects.filter(pk=message_id).first()
    return None if row is None else row.status


# ------------------------------------------------------------------ deep payloads


@pytest.mark.parametrize("payload", [
    "[" * 100_000,  # not even closed
    '{"args": [' + "[" * 100_000 + "]" * 100_000 + '], "kwargs": {}}',
])
def test_a_payload_nested_too_deeply_shows_its_raw_text_and_a_note(root, payload):
    handle = tasks.record.enqueue("deep")
    assert Message.objects.filter(pk=handle.id).update(payload=payload) == 1
    response = root.get(page(handle.id))
    assert response.status_code == 200
    body = response.content.decode()
    assert "Nested too deeply" in body
    raw = body[body.index("<pre class='mysqlq-raw'>"):]
    assert "[" * 100_000 in raw[:raw.index("</pre>")]
    assert "Attempt trace" in body  # the rest of the page is there


# ------------------------------------------------------------------ ATOMIC_REQUESTS


@pytest.fixture
def atomic_requests(monkeypatch):
    """Every request in a transaction, as ``DATABASES[...]['ATOMIC_REQUESTS'] = True`` does,
    on the databases the project configured. (The two-server tests add their aliases at run
    time, after the admin's URLs exempted every configured database: no project does that.)"""
    for alias in connections:
        if alias in mdb.PORTS:
            continue
        monkeypatch.setitem(connections[alias].settings_dict, "ATOMIC_REQUESTS", True)


def orphan() -> int:
    """A message claimed by a connection that then closed: stuck, and releasable."""
    handle = tasks.record.enqueue("orphan")
    claim_in_peer(handle.id)
    wait_for(lambda: [s for s in broker.stuck_messages() if s.id == handle.id],
             timeout=5, message="the peer to vanish")
    return handle.id


def test_the_release_button_works_under_atomic_requests(root, atomic_requests):
    stuck = orphan()
    response = root.post(act_url(stuck, "release"))
    assert response.status_code == 302
    assert status(stuck) == "ready"


@pytest.mark.parametrize("changelist", ["stuckmessage", "message"])
def test_bulk_release_works_under_atomic_requests(root, atomic_requests, changelist):
    stuck = orphan()
    response = root.post(reverse(f"admin:django_mysqlq_{changelist}_changelist"),
                         {"action": "release", ACTION_CHECKBOX_NAME: [stuck]}, follow=True)
    assert "Released 1 stuck claim(s)" in response.content.decode()
    assert status(stuck) == "ready"


def test_other_actions_still_work_under_atomic_requests(root, atomic_requests):
    dead = make_dead()
    assert root.post(act_url(dead, "requeue")).status_code == 302
    assert status(dead) == "ready"


# ------------------------------------------------------------------ action without view


@pytest.fixture
def actor():
    """Staff holding every action permission, but not the one to view messages."""
    account = User.objects.create_user("actor", password="pw", is_staff=True)
    account.user_permissions.add(*Permission.objects.filter(
        content_type__app_label="django_mysqlq",
        codename__in=["requeue_message", "cancel_message", "change_priority",
                      "release_message", "replay_attempt"]))
    client = Client()
    client.force_login(account)
    return client


@pytest.mark.parametrize("name", sorted(ACTIONS))
def test_an_action_permission_without_view_permission_gets_403_and_no_names(actor, name):
    dead = make_dead(label="secret-argument")
    for response in (actor.get(act_url(dead, name)),
                     actor.post(act_url(dead, name), {"priority": "5"})):
        assert response.status_code == 403
        body = response.content.decode()
        assert "always_fails" not in body and "secret-argument" not in body
    row = Message.objects.get(pk=dead)
    assert (row.status, row.priority) == ("dead", 0)


def test_requeue_matching_without_view_permission_is_403_and_shows_no_errors(actor):
    dead = make_dead(label="secret-error")
    url = reverse("admin:django_mysqlq_message_requeue_matching")
    for response in (actor.get(url), actor.post(url, {"reset": "yes"})):
        assert response.status_code == 403
        body = response.content.decode()
        assert "always_fails" not in body and "boom secret-error" not in body
    assert status(dead) == "dead"


def test_bulk_confirmation_without_view_permission_is_403(actor):
    dead = make_dead(label="secret-bulk")
    response = actor.post(reverse("admin:django_mysqlq_message_changelist"),
                          {"action": "cancel", ACTION_CHECKBOX_NAME: [dead]})
    assert response.status_code == 403
    assert "always_fails" not in response.content.decode()
    assert status(dead) == "dead"


# ------------------------------------------------------------------ topic message payloads


def topic_message_page(root, payload: str) -> str:
    from django_mysqlq.models import TopicMessage
    from tests.topic_ops_support import publish

    publish("hardening", 1)
    row = TopicMessage.objects.get(topic="hardening")
    assert TopicMessage.objects.filter(pk=row.pk).update(payload=payload) == 1
    response = root.get(reverse("admin:django_mysqlq_topicmessage_change", args=[row.pk]))
    assert response.status_code == 200
    body = response.content.decode()
    assert "Trace: deliveries to consumer groups" in body  # the rest of the page is there
    return body


def raw_block(body: str) -> str:
    raw = body[body.index("<pre class='mysqlq-raw'>"):]
    return raw[:raw.index("</pre>")]


@pytest.mark.parametrize("payload", [
    "[" * 100_000,
    '{"order": ' + "[" * 100_000 + "]" * 100_000 + "}",
])
def test_a_topic_message_nested_too_deeply_shows_its_raw_text_and_a_note(root, payload):
    body = topic_message_page(root, payload)
    assert "Nested too deeply to lay out (handlers can&#x27;t get it either" in body
    assert "[" * 100_000 in raw_block(body)


def test_a_topic_message_too_long_to_lay_out_is_shown_as_stored(root):
    from django_mysqlq.admin.payloads import LAYOUT_LIMIT

    payload = '{"blob": "' + "x" * LAYOUT_LIMIT + '"}'
    body = topic_message_page(root, payload)
    assert f"Too long to lay out ({len(payload):,} characters" in body
    assert raw_block(body).endswith("x" * 1000 + '&quot;}')
    assert "<pre class='mysqlq-json'>" not in body


def test_a_topic_message_with_a_number_too_long_to_read_says_why(root):
    payload = '{"total": 1' + "0" * 5000 + "}"
    body = topic_message_page(root, payload)
    assert "Not valid JSON (Exceeds the limit" in body
    assert "0" * 5000 in raw_block(body)


def test_the_message_page_shares_the_notes(root):
    """The message page's arguments go through the same helper: a long or unreadable
    payload gets the same note (and a too-deep one its own advice, tested above)."""
    handle = tasks.record.enqueue("long")
    payload = '{"args": [1' + "0" * 5000 + '], "kwargs": {}}'
    assert Message.objects.filter(pk=handle.id).update(payload=payload) == 1
    body = root.get(page(handle.id)).content.decode()
    assert "Not valid JSON (Exceeds the limit" in body
    assert "0" * 5000 in raw_block(body)
