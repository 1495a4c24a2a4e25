"""Rows changed by hand into what the driver can't read as a date: MariaDB's default
sql_mode stores '0000-00-00 00:00:00', which MySQLdb returns as None. The pages and
commands an operator opens to look at such a row must show it, not fail (a 500, a
traceback, a worker that can't start). Also a time zone that is a folder of tzdata, and
a requeue of a row whose attempts counter is at its column's maximum."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command

from django_mysqlq import Topic, broker, cron
from django_mysqlq.broker.claim import ATTEMPTS_MAX
from django_mysqlq.models import Attempt, Message, Worker
from tests.conftest import raw_connection
from tests.operator_support import OPERATOR
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

ZERO = "0000-00-00 00:00:00"


def zero(table: str, column: str, where: str, *params: object) -> None:
    conn = raw_connection()
    try:
        cursor = conn.cursor()
        cursor.execute("SET SESSION sql_mode = ''")
        cursor.execute(f"UPDATE {table} SET {column} = %s WHERE {where}", [ZERO, *params])
        assert cursor.rowcount >= 1
    finally:
        conn.close()


def test_zero_dates_leave_every_operator_page_and_command_working(root) -> None:
    legacy = tasks.record.using(queue="legacy").enqueue("nobody serves legacy").id
    dead = tasks.record.enqueue("dead one").id
    Message.objects.filter(pk=dead).update(status="dead")
    zero("mysqlq_message", "enqueued_at", "id IN (%s, %s)", legacy, dead)
    broker.register_worker("w-zero", "h", 1, ["default"], 1)
    zero("mysqlq_worker", "last_heartbeat", "id = %s", "w-zero")
    finished = tasks.record.enqueue("finished").id
    [claimed] = broker.claim(["default"], 1, "w-x", lease_seconds=30)
    assert claimed.id == finished
    from django_mysqlq.messages import AttemptResult, Runner

    runner = Runner(worker_id="w-x", host="h", pid=1, thread="t")
    broker.ack(claimed, runner, AttemptResult(started_at=broker.database_now()))
    zero("mysqlq_attempt", "finished_at", "message_id = %s", finished)

    # A worker's start reports unserved queues: the zero date's age is unknown, not a crash.
    [found] = broker.unserved_queues()
    assert found.queue == "legacy" and found.oldest_seconds is None
    out = io.StringIO()
    call_command("queuestats", stdout=out)
    assert "legacy" in out.getvalue()
    for page in ("/admin/django_mysqlq/queuestate/", "/admin/django_mysqlq/deadmessage/",
                 "/admin/django_mysqlq/message/", "/admin/django_mysqlq/attempt/",
                 "/admin/django_mysqlq/worker/"):
        assert root.get(page).status_code == 200, page
    assert Worker.objects.get(id="w-zero").last_heartbeat is None


def test_a_requeue_without_a_reset_at_the_attempts_maximum_is_no_error() -> None:
    """max_attempts = GREATEST(max_attempts, attempts + 1) passed INT UNSIGNED's range:
    strict mode refused the statement (a 500 in the admin, a traceback that stopped
    queuerequeue's later batches). The claim buries such a row again, saying to reset."""
    message = tasks.record.enqueue("at max").id
    Message.objects.filter(pk=message).update(status="dead", attempts=ATTEMPTS_MAX)
    assert broker.requeue([message], OPERATOR) == [message]
    row = Message.objects.get(pk=message)
    assert (row.status, row.max_attempts) == ("ready", ATTEMPTS_MAX)


def test_a_time_zone_that_is_a_folder_of_tzdata_is_refused_not_raised() -> None:
    for folder in ("America", "Etc", "Europe"):
        problem = cron.zone_problem(folder)
        assert problem is not None and "is not a time zone" in problem


def test_lookup_shows_a_message_whose_publish_time_is_a_zero_date() -> None:
    Topic("zeroed").publish({"n": 1})
    broker.sequence("zeroed")
    zero("mysqlq_topic_message", "published_at", "topic = %s", "zeroed")
    out = io.StringIO()
    call_command("queuetopic", "lookup", "--topic", "zeroed", "--offset", "1", stdout=out)
    assert "zeroed@1 key=None published - (a zero date: changed by hand)" in out.getvalue()
    out = io.StringIO()
    call_command("queuetopic", "lookup", "--topic", "zeroed", "--offset", "1", "--json",
                 stdout=out)
    assert json.loads(out.getvalue())["messages"][0]["published_at"] is None
    assert Attempt.objects.count() == 0


@pytest.mark.parametrize("digits", [20, 4301])
def test_a_number_longer_than_any_id_in_a_search_or_url_is_no_error(root, digits) -> None:
    """int() of 4,301 digits or more raises ValueError: the message and history lists'
    search and the history, topic message and group pages gave a 500."""
    long = "9" * digits
    tasks.record.enqueue("kept")
    for page in (f"/admin/django_mysqlq/message/?q={long}",
                 f"/admin/django_mysqlq/attempt/?q={long}"):
        response = root.get(page)
        assert response.status_code == 200, page
    for page in (f"/admin/django_mysqlq/attempt/{long}/change/",
                 f"/admin/django_mysqlq/topicmessage/{long}/change/",
                 f"/admin/django_mysqlq/topicgroup/{long}/change/"):
        assert root.get(page).status_code in (302, 404), page


def test_the_dashboard_links_a_troubled_worker_whose_id_has_an_underscore(root) -> None:
    """The admin reads ``_XX`` in an address as an escaped character: a worker id from a
    host named like ``BOX_3A1`` (an underscore, then two hex digits) linked to no worker."""
    import re

    broker.register_worker("BOX_3A1:7:ab", "BOX_3A1", 7, ["default"], 1)
    broker.heartbeat_worker("BOX_3A1:7:ab", 0, 0, False, "upkeep step 'purge' failing")
    page = root.get("/admin/django_mysqlq/queuestate/").content.decode()
    [link] = re.findall(r'<div id="worker-troubles".*?<a href="([^"]+)"', page, re.S)
    followed = root.get(link)
    assert followed.status_code == 200 and "BOX_3A1:7:ab" in followed.content.decode()
