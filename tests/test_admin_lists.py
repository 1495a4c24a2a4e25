"""The big lists' rules: counts stop at a cap ("10,000+"), search finds by id, dedup key or
a task's full name, and each filter lists rows in the order its index holds."""

from __future__ import annotations

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.urls import reverse

from django_mysqlq import broker
from django_mysqlq.admin import dashboard, listing, messages
from django_mysqlq.models import Attempt, Message
from django_mysqlq.templatetags import mysqlq_admin
from tests.operator_support import RUNNER, claim_only, make_dead
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

LIST = reverse("admin:django_mysqlq_message_changelist")
HISTORY = reverse("admin:django_mysqlq_attempt_changelist")


@pytest.fixture
def cap_of_three(monkeypatch):
    """Counts stop at 3, as they stop at 10,000 on a real backlog."""
    for module in (listing, messages, dashboard, mysqlq_admin):
        monkeypatch.setattr(module, "COUNT_CAP", 3)
    monkeypatch.setattr(messages.MessageAdmin, "list_per_page", 2)


def listed(client, url: str) -> list[int]:
    response = client.get(url)
    assert response.status_code == 200
    return [row.pk for row in response.context["cl"].result_list]


def succeed(label: str, task=tasks.record) -> int:
    handle = task.enqueue(label)
    message = claim_only(handle.id, task.queue)
    broker.ack(message, RUNNER, broker.AttemptResult(started_at=broker.database_now()))
    return handle.id


# ------------------------------------------------------------------ capped counts


def test_counts_stop_at_the_cap_and_say_so(root, cap_of_three):
    for label in "abcde":
        tasks.record.enqueue(label)
    response = root.get(LIST)
    page = response.content.decode()
    assert response.context["cl"].result_count == 3 and response.context["cl"].paginator.capped
    assert ">3+</span> messages" in page and "pages stop at the cap" in page
    assert "Select all <span" in page  # the select-all link says "3+" too
    searched = root.get(LIST + "?q=tests.testapp.tasks.record").content.decode()
    assert ">3+</span> results" in searched
    small = root.get(LIST + "?q=999999").content.decode()
    assert "0 results" in small and "3+" not in small


def test_counts_have_thousands_separators_capped_or_not(root, monkeypatch):
    """"1,500 messages", "Select all 1,500", and "1,000+" when capped, as the dashboard
    and the docs say it (not "1000+")."""
    from django_mysqlq.admin import rates
    from tests.testapp.rated_tasks import per_account

    monkeypatch.setattr(listing, "COUNT_CAP", 2000)
    tasks.record.enqueue_many([("many",)] * 1500)
    page = root.get(LIST).content.decode()
    assert "1,500 messages" in page and "Select all 1,500 messages" in page
    monkeypatch.setattr(listing, "COUNT_CAP", 1000)
    page = root.get(LIST).content.decode()
    assert ">1,000+</span> messages" in page
    assert "Select all <span" in page and ">1,000+</span> messages</a>" in page
    assert ">1,000+</span> results" in root.get(LIST + "?q=tests.testapp.tasks.record") \
        .content.decode()
    monkeypatch.setattr(rates, "COUNT_CAP", 1000)
    per_account.enqueue_many([("acct-1k", seq, "many") for seq in range(1000)])
    assert ">1,000+</a>" in root.get("/admin/django_mysqlq/ratelimit/").content.decode()


def test_a_bulk_action_over_the_cap_is_refused_and_points_to_the_batch_tools(root,
                                                                            cap_of_three):
    ids = [tasks.record.enqueue(label).id for label in "abcde"]
    response = root.post(LIST, {"action": "requeue", "select_across": "1",
                                ACTION_CHECKBOX_NAME: ids[:1]}, follow=True)
    page = response.content.decode()
    assert "at most 3 messages" in page and "queuerequeue" in page
    assert not Attempt.objects.exists()  # nothing was requeued


def test_the_index_box_and_the_dashboard_cap_their_counts(root, cap_of_three):
    make_dead()
    for label in "abcde":
        tasks.record.enqueue(label)
    assert "Ready: 3+" in root.get("/admin/").content.decode()
    response = root.get(reverse("admin:django_mysqlq_queuestate_changelist"))
    [default] = [q for q in response.context["data"].queues if q.name == "default"]
    assert (default.ready, default.capped) == (3, frozenset({"ready"}))
    assert ">3+</a>" in response.content.decode()


def test_queue_overview_counts_exactly_or_up_to_a_cap_with_the_oldest_ready():
    make_dead()
    low = tasks.record.using(priority=-5).enqueue("oldest, low priority").id
    for label in "abcd":
        tasks.record.using(priority=5).enqueue(label)
    tasks.on_other_queue.enqueue("o")
    exact = broker.queue_overview()
    assert exact["default"].counts == {"ready": 5, "dead": 1}
    assert exact["default"].capped == frozenset()
    assert exact["other"].counts == {"ready": 1}
    capped = broker.queue_overview(2)
    assert capped["default"].counts == {"ready": 2, "dead": 1}
    assert capped["default"].capped == frozenset({"ready"})
    assert capped["default"].oldest_ready_at == Message.objects.get(pk=low).enqueued_at
    assert broker.queue_names() == ["default", "other"]
    assert broker.status_counts(["ready", "dead", "claimed"], 4) == {
        "ready": (4, True), "dead": (1, False), "claimed": (0, False)}


# ------------------------------------------------------------------ search


def test_message_search_takes_an_id_a_dedup_key_or_a_full_task_name(root):
    plain = tasks.record.enqueue("plain").id
    keyed = tasks.record.using(dedup_key="order-42").enqueue("k").id
    numeric = tasks.on_other_queue.using(dedup_key="4242").enqueue("n").id
    assert listed(root, LIST + f"?q={plain}") == [plain]
    assert listed(root, LIST + "?q=order-42") == [keyed]
    assert listed(root, LIST + "?q=4242") == [numeric]
    assert sorted(listed(root, LIST + "?q=tests.testapp.tasks.record")) == [plain, keyed]
    # A part of a name finds nothing: that would read every row of a big table.
    assert listed(root, LIST + "?q=record") == []
    assert "full name" in root.get(LIST).content.decode()  # the help under the box


def test_history_search_takes_a_message_id_or_a_full_task_name(root):
    done = succeed("a")
    other = succeed("b", task=tasks.on_other_queue)
    assert {row.message_id for row in Attempt.objects.filter(
        pk__in=listed(root, HISTORY + f"?q={done}"))} == {done}
    found = listed(root, HISTORY + "?q=tests.testapp.tasks.on_other_queue")
    assert [Attempt.objects.get(pk=pk).message_id for pk in found] == [other]
    assert listed(root, HISTORY + "?q=on_other_queue") == []


# ------------------------------------------------------------------ orders


def test_each_message_filter_lists_in_the_order_of_its_index(root):
    dead = make_dead()
    first = tasks.record.enqueue("first").id
    urgent = tasks.record.using(priority=9).enqueue("urgent").id
    later = tasks.record.using(delay=3600).enqueue("later").id
    # No filter: newest first.
    assert listed(root, LIST) == [later, urgent, first, dead]
    # A queue: by status, then in the order workers take them (priority, then age).
    assert listed(root, LIST + "?queue=default") == [dead, urgent, first, later]
    # A task: by status, then oldest first.
    assert listed(root, LIST + "?task=tests.testapp.tasks.record") == [first, urgent, later]
    # A status: the most recently due first.
    assert listed(root, LIST + "?status__exact=ready") == [urgent, first]
    assert listed(root, reverse("admin:django_mysqlq_deadmessage_changelist")) == [dead]


def test_each_history_filter_lists_the_most_recently_finished_first(root):
    first = succeed("first")
    failed = make_dead()
    second = succeed("second")

    def messages_listed(query: str) -> list[int]:
        return [Attempt.objects.get(pk=pk).message_id for pk in listed(root, HISTORY + query)]

    assert messages_listed("") == [second, failed, first]
    assert messages_listed("?task=tests.testapp.tasks.record") == [second, first]
    assert messages_listed("?queue=default") == [second, failed, first]
    assert messages_listed("?outcome__exact=succeeded") == [second, first]
    assert messages_listed("?finished_at__gte=2000-01-01+00:00:00%2B00:00") == [
        second, failed, first]


def test_column_headers_do_not_resort_the_big_lists(root):
    make_dead()
    for url in (LIST, HISTORY):
        assert "sortable" not in root.get(url).content.decode()
