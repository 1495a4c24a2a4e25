"""The admin for ordered subjects: blocked messages with the head holding them (a dead one
marked), and the operator's ways out: requeue the dead head, or release the subject."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.urls import reverse

from django_mysqlq import broker
from django_mysqlq.models import Attempt, Message
from tests.subject_support import RUNNER, claim, failed
from tests.test_admin_messages import act_url, bulk
from tests.testapp.gated import ordered_dies, ordered_step

pytestmark = pytest.mark.django_db(transaction=True)

BLOCKED = "/admin/django_mysqlq/blockedmessage/"


def held_subject(key: str = "order:7") -> tuple[int, list[int]]:
    """A subject whose head died (holding it) with two messages blocked behind it."""
    dead = ordered_dies.enqueue(key, 1, "admin").id
    rest = [ordered_step.enqueue(key, seq, "admin").id for seq in (2, 3)]
    [head] = claim()
    broker.fail(head, RUNNER, failed())
    return dead, rest


def statuses(*ids: int) -> list[str | None]:
    found = dict(Message.objects.filter(pk__in=ids).values_list("pk", "status"))
    return [found.get(i) for i in ids]


def test_the_blocked_list_shows_the_dead_head_that_holds_them(root):
    dead, rest = held_subject()
    page = root.get(BLOCKED).content.decode()
    for message_id in rest:
        assert f">{message_id}<" in page
    assert reverse("admin:django_mysqlq_message_change", args=[dead]) in page
    assert "<strong class='mysqlq-dead'>dead</strong>" in page
    assert "order:7" in page
    assert 'id="index-blocked">Blocked: 2<' in root.get("/admin/").content.decode()


def test_a_blocked_messages_page_says_what_it_waits_behind(root):
    dead, rest = held_subject()
    page = root.get(reverse("admin:django_mysqlq_message_change", args=[rest[0]])).content
    text = page.decode()
    assert 'id="gate-holders"' in text and f"#{dead}" in text and "Waiting behind" in text
    assert "ordered subject &#x27;order:7&#x27; (a dead head holds it)" in text
    assert 'id="act-release_subject"' in text and 'id="act-requeue_head"' in text
    # A plain message offers neither.
    plain = ordered_step.using(subject="other").enqueue("x", 1, "admin").id
    text = root.get(reverse("admin:django_mysqlq_message_change", args=[plain])).content
    assert b"act-release_subject" not in text


def test_release_the_subject_from_the_blocked_list(root):
    dead, rest = held_subject()
    page = bulk(root, "release_subject", [rest[1]], url=BLOCKED)
    assert "are you sure" in page.content.decode()
    page = bulk(root, "release_subject", [rest[1]], url=BLOCKED, confirmed="yes")
    assert "Released 1 subject(s)" in page.content.decode()
    assert statuses(dead, *rest) == ["dead", "ready", "blocked"]
    assert Attempt.objects.get(message_id=dead, outcome="skipped").actor == "admin:root"


def test_requeue_the_head_from_its_own_page(root):
    dead, rest = held_subject()
    root.post(act_url(dead, "requeue_head"))
    assert statuses(dead, *rest) == ["ready", "blocked", "blocked"]
    assert Message.objects.get(pk=dead).attempts == 0  # a full set again


def test_head_actions_on_a_subject_no_dead_head_holds_say_so(root):
    first, second = (ordered_step.enqueue("busy", seq, "admin").id for seq in (1, 2))
    page = bulk(root, "release_subject", [second], url=BLOCKED, confirmed="yes")
    assert "no dead head holds their subject" in page.content.decode()
    assert statuses(first, second) == ["ready", "blocked"]


def test_releasing_a_subject_needs_its_own_permission(viewer):
    dead, rest = held_subject()
    assert viewer.post(act_url(dead, "release_subject"), {"confirmed": "yes"}) \
        .status_code == 403
    assert statuses(dead, *rest) == ["dead", "blocked", "blocked"]


def test_search_finds_a_subjects_messages(root):
    dead, rest = held_subject("order:99")
    page = root.get("/admin/django_mysqlq/message/?q=order:99").content.decode()
    for message_id in (dead, *rest):
        assert f">{message_id}<" in page


def test_queuestats_shows_blocked_counts(capsys):
    held_subject()
    call_command("queuestats")
    out = capsys.readouterr().out
    header, row = out.splitlines()[:2]
    assert header.split()[4] == "blocked"
    assert row.split()[4] == "2"


def test_search_finds_a_numeric_subject_that_is_no_message_id(root):
    ids = [ordered_step.enqueue(98765432101, seq, "admin").id for seq in (1, 2)]
    page = root.get("/admin/django_mysqlq/message/?q=98765432101").content.decode()
    for message_id in ids:
        assert f">{message_id}<" in page


def test_the_queuesubject_command_shows_releases_and_requeues(capsys):
    from django.core.management.base import CommandError

    dead, rest = held_subject("order:5")
    call_command("queuesubject", "show", "order:5")
    out = capsys.readouterr().out
    assert "slots=1 active=1 blocked=2" in out and f"#{dead} (dead)" in out
    call_command("queuesubject", "requeue-head", "order:5")
    assert statuses(dead, *rest) == ["ready", "blocked", "blocked"]
    with pytest.raises(CommandError, match="No dead head holds"):
        call_command("queuesubject", "release", "order:5")
    [head] = claim()
    broker.fail(head, RUNNER, failed())  # dead again (its one attempt)
    capsys.readouterr()
    call_command("queuesubject", "release", "order:5")
    assert statuses(dead, *rest) == ["dead", "ready", "blocked"]
    assert capsys.readouterr().out.strip() == (
        f"Released subject 'order:5': dead head(s) #{dead} stay dead; the next message "
        f"(#{rest[0]}) runs now.")
    call_command("queuesubject", "show", "nothing-here")
    assert "nothing waits or runs" in capsys.readouterr().out


def test_releasing_a_subject_nothing_waits_behind_says_so(capsys):
    """Not 'the next message runs now': there is none."""
    dead = ordered_dies.enqueue("order:6", 1, "admin").id
    [head] = claim()
    broker.fail(head, RUNNER, failed())
    call_command("queuesubject", "release", "order:6")
    assert capsys.readouterr().out.strip() == (
        f"Released subject 'order:6': dead head(s) #{dead} stay dead; no message waits "
        "behind it: the subject's next message runs as soon as it is enqueued.")
    again = ordered_step.enqueue("order:6", 2, "admin").id
    assert statuses(dead, again) == ["dead", "ready"]
