"""The messages admin through Django's test client: lists, filters, detail, actions, perms."""

from __future__ import annotations

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.test import Client
from django.urls import reverse

from django_mysqlq import broker
from django_mysqlq.models import Attempt, Message
from tests.conftest import wait_for
from tests.operator_support import claim_in_peer, claim_only, make_dead, user
from tests.testapp import tasks
from tests.testapp.rated_tasks import per_account

pytestmark = pytest.mark.django_db(transaction=True)

LIST = "/admin/django_mysqlq/message/"


def act_url(message_id: int, name: str) -> str:
    return reverse("admin:django_mysqlq_message_act", args=[message_id, name])


def bulk(client: Client, action: str, ids: list[int], url: str = LIST, **extra: str):
    return client.post(url, {"action": action, ACTION_CHECKBOX_NAME: ids, **extra},
                       follow=True)


def status(message_id: int) -> str | None:
    row = Message.objects.filter(pk=message_id).first()
    return None if row is None else row.status


# ------------------------------------------------------------------ pages


def test_the_admin_index_shows_stuck_and_dead_counts_one_click_away(root):
    make_dead(label="a")
    make_dead(label="b")
    page = root.get("/admin/").content.decode()
    assert 'id="mysqlq-box"' in page
    assert "Dead: 2" in page and "Stuck: 0" in page
    assert reverse("admin:django_mysqlq_deadmessage_changelist") in page
    assert reverse("admin:django_mysqlq_stuckmessage_changelist") in page
    assert reverse("admin:django_mysqlq_queuestate_changelist") in page


def test_the_list_filters_by_status_queue_task_and_stuck(root):
    dead = make_dead()
    ready = tasks.record.enqueue("r")
    other = tasks.on_other_queue.enqueue("o")

    def listed(query: str) -> set[int]:
        response = root.get(LIST + query)
        assert response.status_code == 200
        return {row.pk for row in response.context["cl"].result_list}

    assert listed("") == {dead, ready.id, other.id}
    assert listed("?status__exact=dead") == {dead}
    assert listed("?queue=other") == {other.id}
    assert listed("?task=tests.testapp.tasks.record") == {ready.id}
    assert listed("?stuck=yes") == set()
    assert listed(f"?q={ready.id}") == {ready.id}
    assert listed("?q=tests.testapp.tasks.always_fails") == {dead}  # a task's full name


def test_search_by_dedup_key(root):
    keyed = tasks.record.using(dedup_key="order-42").enqueue("k")
    tasks.record.enqueue("plain")
    response = root.get(LIST + "?q=order-42")
    assert [row.pk for row in response.context["cl"].result_list] == [keyed.id]


def test_the_detail_shows_pretty_arguments_and_the_attempt_trace(root):
    dead = make_dead(label="detail")
    broker.requeue([dead], broker.Operator("someone"))
    page = root.get(reverse("admin:django_mysqlq_message_change",
                                     args=[dead])).content.decode()
    assert "<pre class='mysqlq-json'>{\n  &quot;args&quot;: [\n    &quot;detail&quot;" in page
    assert 'id="trace"' in page
    assert "ValueError" in page and "boom detail" in page
    assert "Traceback (most recent call last)" in page
    assert RUNNER_ID in page and "someone" in page  # who ran it, who requeued it
    assert 'id="act-requeue"' in page and 'id="act-cancel"' in page


RUNNER_ID = "test-host:1:abc"


def test_stuck_view_lists_only_stuck_messages_with_the_reason(root):
    orphan = tasks.record.enqueue("orphan")
    claim_in_peer(orphan.id)
    wait_for(broker.stuck_messages, timeout=5, message="the peer to vanish")
    live = tasks.record.enqueue("live")
    claim_only(live.id)
    response = root.get(reverse("admin:django_mysqlq_stuckmessage_changelist"))
    assert [row.pk for row in response.context["cl"].result_list] == [orphan.id]
    assert "is gone" in response.content.decode()
    filtered = root.get(LIST + "?stuck=yes")
    assert [row.pk for row in filtered.context["cl"].result_list] == [orphan.id]
    detail = root.get(reverse("admin:django_mysqlq_message_change", args=[orphan.id]))
    assert 'id="act-release"' in detail.content.decode()
    live_detail = root.get(reverse("admin:django_mysqlq_message_change",
                                            args=[live.id]))
    assert 'id="act-release"' not in live_detail.content.decode()


def test_dead_view_lists_only_dead_messages(root):
    dead = make_dead()
    tasks.record.enqueue("r")
    response = root.get(reverse("admin:django_mysqlq_deadmessage_changelist"))
    assert [row.pk for row in response.context["cl"].result_list] == [dead]


# ------------------------------------------------------------------ bulk actions


def test_bulk_requeue_skips_running_messages(root):
    dead = make_dead()
    running = tasks.record.enqueue("running")
    claim_only(running.id)
    page = bulk(root, "requeue", [dead, running.id]).content.decode()
    assert "Requeued 1 message(s)" in page and "1 skipped" in page
    assert (status(dead), status(running.id)) == ("ready", "claimed")
    assert Attempt.objects.filter(message_id=dead, outcome="requeued",
                                  actor="admin:root").exists()


def test_bulk_requeue_resetting_attempts(root):
    dead = make_dead()
    bulk(root, "requeue_reset", [dead])
    assert Message.objects.get(pk=dead).attempts == 0


def test_bulk_retry_dead_leaves_other_statuses_alone(root):
    dead = make_dead()
    scheduled = tasks.record.using(delay=3600).enqueue("later")
    bulk(root, "retry_dead", [dead, scheduled.id])
    assert (status(dead), status(scheduled.id)) == ("ready", "scheduled")
    assert Message.objects.get(pk=dead).attempts == 0


def test_bulk_cancel_asks_for_confirmation_first(root):
    first, second = (tasks.record.enqueue(x).id for x in "ab")
    page = bulk(root, "cancel", [first, second]).content.decode()
    assert "are you sure?" in page and f"#{first}" in page
    assert Message.objects.count() == 2
    page = bulk(root, "cancel", [first, second], confirmed="yes").content.decode()
    assert "Cancelled 2 message(s)" in page
    assert not Message.objects.exists()
    assert Attempt.objects.filter(outcome="cancelled", actor="admin:root").count() == 2


def test_no_take_me_back_returns_to_where_the_action_came_from(root):
    """A bulk action's confirmation goes back to its list, filters kept; a message's
    button's to the message's page."""
    import re

    def back(page: str) -> str:
        return re.search(r'<a href="([^"]*)" class="button cancel-link">', page).group(1)

    handle = tasks.on_other_queue.enqueue("o")
    filtered = bulk(root, "cancel", [handle.id], url=LIST + "?queue=other").content.decode()
    assert back(filtered) == LIST + "?queue=other"
    dead = make_dead()
    dead_list = "/admin/django_mysqlq/deadmessage/?task=tests.testapp.tasks.always_fails"
    assert back(bulk(root, "cancel", [dead], url=dead_list).content.decode()) == dead_list
    single = root.get(act_url(handle.id, "cancel")).content.decode()
    assert back(single) == f"/admin/django_mysqlq/message/{handle.id}/change/"
    assert status(handle.id) == "ready" and status(dead) == "dead"  # nothing done


def test_bulk_change_priority_takes_the_new_value(root):
    handle = tasks.record.enqueue("p")
    page = bulk(root, "priority", [handle.id]).content.decode()
    assert 'name="priority"' in page
    bulk(root, "priority", [handle.id], confirmed="yes", priority="77")
    assert Message.objects.get(pk=handle.id).priority == 77
    page = bulk(root, "priority", [handle.id], confirmed="yes",
                priority="500").content.decode()
    assert "-100 to 100" in page
    assert Message.objects.get(pk=handle.id).priority == 77


def confirm_form(page: str) -> list[tuple[str, str]]:
    """The fields a browser sends back from a confirmation page's form."""
    import re

    form = page[page.index('<form method="post">'):]
    form = form[:form.index("</form>")]
    return re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', form)


@pytest.mark.parametrize("name, extra", [("cancel", {}), ("priority", {"priority": "9"})])
def test_a_bulk_action_over_1500_selected_messages_is_confirmed_and_done(root, name, extra):
    """"Select all" of 1,500 messages: the confirmation sends the selection back in a
    form under Django's DATA_UPLOAD_MAX_NUMBER_FIELDS (1,000), not one field per id."""
    from urllib.parse import urlencode

    handles = tasks.record.enqueue_many([("many",)] * 1500)
    page = root.post(LIST, {"action": name, "select_across": "1", "index": "0",
                            ACTION_CHECKBOX_NAME: [handles[0].id]}).content.decode()
    assert "are you sure?" in page
    fields = [(k, v) for k, v in confirm_form(page) if k != "csrfmiddlewaretoken"]
    response = root.post(LIST, urlencode([*fields, *extra.items()]),
                         content_type="application/x-www-form-urlencoded", follow=True)
    assert response.status_code == 200  # not 400 (TooManyFieldsSent), nothing done
    if name == "cancel":
        assert "Cancelled 1500 message(s)" in response.content.decode()
        assert not Message.objects.exists()
    else:
        assert Message.objects.filter(priority=9).count() == 1500


def test_a_damaged_selection_acts_on_nothing(root):
    handle = tasks.record.enqueue("kept")
    response = root.post(LIST, {"action": "cancel", "confirmed": "yes",
                                "_selected_ids": f"{handle.id},x٣"}, follow=True)
    assert response.status_code == 200
    assert "select them again" in response.content.decode()
    assert status(handle.id) == "ready"


def test_bulk_release_frees_only_claims_whose_owner_is_gone(root):
    orphan = tasks.record.enqueue("orphan")
    claim_in_peer(orphan.id)
    wait_for(broker.stuck_messages, timeout=5, message="the peer to vanish")
    live = tasks.record.enqueue("live")
    claim_only(live.id)
    page = bulk(root, "release", [orphan.id, live.id]).content.decode()
    assert "Released 1 stuck claim(s)" in page and "1 refused" in page
    assert (status(orphan.id), status(live.id)) == ("ready", "claimed")


def test_bulk_actions_work_from_the_dead_entry_point(root):
    dead = make_dead()
    bulk(root, "requeue", [dead],
         url=reverse("admin:django_mysqlq_deadmessage_changelist"))
    assert status(dead) == "ready"


# ------------------------------------------------------------------ one-message buttons


def test_the_message_buttons_requeue_cancel_and_prioritise(root):
    dead = make_dead()
    response = root.post(act_url(dead, "requeue"))
    assert response.status_code == 302 and status(dead) == "ready"
    # Cancel needs the confirmation: a first POST only shows it.
    assert "are you sure?" in root.get(act_url(dead, "cancel")).content.decode()
    root.post(act_url(dead, "cancel"))
    assert status(dead) == "ready"
    response = root.post(act_url(dead, "cancel"), {"confirmed": "yes"})
    assert response.status_code == 302 and status(dead) is None

    handle = tasks.record.enqueue("p")
    root.post(act_url(handle.id, "priority"), {"confirmed": "yes", "priority": "-3"})
    assert Message.objects.get(pk=handle.id).priority == -3


def test_a_throttled_message_page_offers_cancel_and_change_priority(root):
    # docs/operations.md: both apply to throttled messages, as the broker allows.
    handle = per_account.enqueue("acct", 1, "admin")
    assert status(handle.id) == "throttled"
    page = root.get(reverse("admin:django_mysqlq_message_change", args=[handle.id]))
    content = page.content.decode()
    assert 'id="act-cancel"' in content and 'id="act-priority"' in content
    assert 'id="act-requeue"' not in content
    response = root.post(act_url(handle.id, "priority"), {"confirmed": "yes", "priority": "7"})
    assert response.status_code == 302
    assert (status(handle.id), Message.objects.get(pk=handle.id).priority) == ("throttled", 7)
    response = root.post(act_url(handle.id, "cancel"), {"confirmed": "yes"})
    assert response.status_code == 302 and status(handle.id) is None


def test_unknown_action_or_id_is_404(root):
    assert root.post(act_url(1, "explode")).status_code == 404
    assert root.post("/admin/django_mysqlq/message/abc/act/requeue/").status_code == 404


# ------------------------------------------------------------------ filter-wide requeue


def test_requeue_all_dead_matching_the_filter(root):
    dead_default = make_dead(label="d1")
    dead_default_2 = make_dead(label="d2")
    other_dead = make_dead(task=tasks.record, label="d3")  # dead, but another task
    ready = tasks.record.enqueue("r")
    url = reverse("admin:django_mysqlq_message_requeue_matching")
    listing = root.get(LIST + "?task=tests.testapp.tasks.always_fails").content.decode()
    assert url + "?task=tests.testapp.tasks.always_fails" in listing
    page = root.get(url + "?task=tests.testapp.tasks.always_fails").content.decode()
    assert "2 dead message(s) match" in page
    response = root.post(url + "?task=tests.testapp.tasks.always_fails",
                                  {"reset": "yes"})
    assert response.status_code == 302
    assert {status(dead_default), status(dead_default_2), status(ready.id)} == {"ready"}
    assert Message.objects.get(pk=dead_default).attempts == 0
    assert status(other_dead) == "dead"
    # A filter that matches nothing dead requeues nothing.
    root.post(url + "?queue=other")
    assert status(other_dead) == "dead"


def test_requeue_all_dead_matching_offers_nothing_when_none_match_and_says_when_more(root):
    """The page's count is a capped count (its text may end in "+"): its number decides
    the button (none for 0) and the ellipsis after the first 20."""
    url = reverse("admin:django_mysqlq_message_requeue_matching")
    empty = root.get(url + "?queue=other").content.decode()
    assert "0 dead message(s) match" in empty
    assert 'id="confirm"' not in empty and "Requeue 0" not in empty
    assert "Back to the list" in empty
    handles = tasks.always_fails.enqueue_many([("many",)] * 21)
    Message.objects.filter(pk__in=[h.id for h in handles]).update(status="dead")
    page = root.get(url).content.decode()
    assert "Requeue 21 dead message(s)" in page and "<li>\u2026</li>" in page


def test_requeue_all_dead_matching_leaves_a_message_that_turned_ready_alone(root):
    """A dead message someone else requeued between the list's read and the lock (now
    ready) is not requeued again (its attempts would reset): it is counted as changed."""
    from django.db import connection

    from tests.conftest import raw_connection

    first, second = make_dead(label="d1"), make_dead(label="d2")
    stranger = raw_connection()
    moved: list[int] = []

    def requeued_elsewhere(execute, sql, params, many, context):
        if not moved and "FOR UPDATE" in sql and "gate_mode" in sql:
            stranger.cursor().execute(
                "UPDATE mysqlq_message SET status='ready' WHERE id=%s", [second])
            moved.append(second)
        return execute(sql, params, many, context)

    url = reverse("admin:django_mysqlq_message_requeue_matching")
    try:
        with connection.execute_wrapper(requeued_elsewhere):
            page = root.post(url + "?task=tests.testapp.tasks.always_fails",
                             follow=True).content.decode()
    finally:
        stranger.close()
    assert moved == [second]
    assert "Requeued 1 dead message(s)" in page and "1 changed meanwhile" in page
    assert Attempt.objects.filter(message_id=first, outcome="requeued").count() == 1
    assert not Attempt.objects.filter(message_id=second, outcome="requeued").exists()


def test_requeue_all_dead_matching_walks_in_batches_of_bounded_statements(root):
    """1,200 dead messages are requeued batch by batch: no statement carries every id
    (at a million, one would pass max_allowed_packet, and each batch re-sent them all)."""
    from django.db import connection

    handles = tasks.always_fails.enqueue_many([("many",)] * 1200)
    Message.objects.filter(pk__in=[h.id for h in handles]).update(status="dead")
    widest: list[int] = [0]

    def measure(execute, sql, params, many, context):
        widest[0] = max(widest[0], len(params or ()))
        return execute(sql, params, many, context)

    url = reverse("admin:django_mysqlq_message_requeue_matching")
    with connection.execute_wrapper(measure):
        page = root.post(url + "?status__exact=dead", follow=True).content.decode()
    assert "Requeued 1200 dead message(s)" in page
    assert Message.objects.filter(status="dead").count() == 0
    assert 0 < widest[0] <= 600


# ------------------------------------------------------------------ permissions, CSRF


@pytest.mark.parametrize("name", ["requeue", "requeue_reset", "retry_dead", "cancel",
                                  "priority", "release"])
def test_staff_without_the_permission_is_refused(viewer, name):
    dead = make_dead()
    response = viewer.post(act_url(dead, name), {"confirmed": "yes", "priority": "5"})
    assert response.status_code == 403
    assert f'value="{name}"' not in viewer.get(LIST).content.decode()  # not offered
    page = bulk(viewer, name, [dead], confirmed="yes", priority="5").content.decode()
    assert "message(s)" not in page and "are you sure" not in page
    row = Message.objects.get(pk=dead)
    assert (row.status, row.priority) == ("dead", 0)
    assert not Attempt.objects.filter(message_id=dead).exclude(outcome="failed").exists()


def test_staff_without_the_permission_sees_no_buttons_and_cant_requeue_matching(viewer):
    dead = make_dead()
    page = viewer.get(reverse("admin:django_mysqlq_message_change", args=[dead])).content
    assert b'id="act-' not in page
    assert b"requeue-matching" not in viewer.get(LIST).content
    url = reverse("admin:django_mysqlq_message_requeue_matching")
    assert viewer.post(url).status_code == 403
    assert status(dead) == "dead"


def test_each_permission_allows_its_own_action_only():
    client = Client()
    client.force_login(user("requeuer", "requeue_message"))
    dead = make_dead()
    assert client.post(act_url(dead, "cancel"), {"confirmed": "yes"}).status_code == 403
    assert client.post(act_url(dead, "requeue")).status_code == 302
    assert status(dead) == "ready"


def test_actions_need_a_csrf_token():
    client = Client(enforce_csrf_checks=True)
    client.force_login(user("root", superuser=True))
    dead = make_dead()
    assert client.post(act_url(dead, "requeue")).status_code == 403
    assert status(dead) == "dead"


def test_the_admin_never_offers_raw_add_change_or_delete(root):
    dead = make_dead()
    assert root.get(LIST + "add/").status_code == 403
    assert root.post(reverse("admin:django_mysqlq_message_delete",
                                      args=[dead]), {"post": "yes"}).status_code == 403
    assert status(dead) == "dead"
