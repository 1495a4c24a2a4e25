"""An operator's replay (the history page's button, ``ops.replay``) links its copy to the
original (``replayed_from``) as ``queuepipeline replay`` does, so the pipeline's replay
skips an original an operator already replayed by hand, and the copy's trace says
"replayed from #N". Checked on the statements the pipeline runs (its Spark read of the
links, its executors' skip), without starting Spark."""

from __future__ import annotations

import MySQLdb
import pytest
from django.db import connection
from django.urls import reverse

from django_mysqlq import broker
from django_mysqlq.broker import fanout, pipeline
from django_mysqlq.broker.replay import ReplayCopy, insert_replays, replay_key
from django_mysqlq.messages import NewMessage
from django_mysqlq.models import Attempt, Message
from tests.operator_support import OPERATOR
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def linked_originals() -> set[int]:
    """What the pipeline's Spark side reads as replayed: ``REPLAYED_SELECT`` over the id
    range ``replayed_bounds`` gives (one slice: every partition together)."""
    bounds = pipeline.replayed_bounds()
    if bounds is None:
        return set()
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT replayed_from FROM {pipeline.REPLAYED_SELECT} "
                       "WHERE id >= %s AND id <= %s", list(bounds))
        return {int(row[0]) for row in cursor.fetchall()}


def pipeline_copies(original: Attempt) -> int:
    """What the pipeline's executor inserts for ``original``: a fresh connection, as a
    Spark partition has."""
    from django_mysqlq.contrib.spark.database import database

    conn = MySQLdb.connect(**database().connect_args)
    try:
        room = fanout.prepare(conn)
        copy = ReplayCopy(message=NewMessage(
            task_name=original.task_name, queue=original.queue, priority=original.priority,
            payload=original.payload, run_at=None, delay=0.0, max_attempts=3,
            retry_backoff=1.0, timeout=None, dedup_key=replay_key(original.message_id)),
            original=original.message_id, source_row=original.pk)
        return insert_replays(conn, [copy], room, OPERATOR)
    finally:
        conn.close()


def test_a_replay_from_the_history_page_is_linked_and_the_pipeline_skips_it(root):
    handle = tasks.record.enqueue("again", value=3)
    other = tasks.record.enqueue("not replayed by hand")
    broker.cancel([handle.id, other.id], OPERATOR)
    source = Attempt.objects.get(message_id=handle.id, outcome="cancelled")
    response = root.post(reverse("admin:django_mysqlq_attempt_replay", args=[source.pk]),
                         follow=True)
    assert response.status_code == 200
    [copy] = Message.objects.all()
    link = Attempt.objects.get(message_id=copy.pk, outcome="replayed")
    assert link.replayed_from == handle.id
    assert link.error_message == f"replayed from #{handle.id} (history row {source.pk})"
    page = root.get(reverse("admin:django_mysqlq_message_change", args=[copy.pk]))
    assert f"replayed from #{handle.id}" in page.content.decode()
    # The pipeline's read of the links sees it; its executor skips that original ...
    assert linked_originals() == {handle.id}
    assert pipeline_copies(source) == 0
    assert Message.objects.count() == 1
    # ... and still copies one nobody replayed, linked the same way.
    untouched = Attempt.objects.get(message_id=other.id, outcome="cancelled")
    assert pipeline_copies(untouched) == 1
    assert linked_originals() == {handle.id, other.id}


def test_the_pipeline_s_copy_is_not_replayed_again_by_its_next_run_either():
    """Both paths write the same link: a copy the operator replayed through the broker
    and one the pipeline made are both skipped by the pipeline's next run."""
    from django_mysqlq import ops

    handle = tasks.record.enqueue("by the broker")
    broker.cancel([handle.id], OPERATOR)
    source = Attempt.objects.get(message_id=handle.id, outcome="cancelled")
    new_id = ops.replay(source.pk, OPERATOR)
    assert Attempt.objects.get(message_id=new_id, outcome="replayed").replayed_from == \
        handle.id
    assert pipeline_copies(source) == 0
