"""The project's own tests, run by Django's test runner on SQLite or PostgreSQL with the
test mode on (tests/test_non_mysql.py starts them in a subprocess)."""

from django.db import connection, transaction
from django.test import TestCase, TransactionTestCase
from django.test.utils import CaptureQueriesContext

from django_mysqlq import TaskArgumentError

from . import tasks
from .models import Order


class InATestCase(TestCase):
    def test_a_view_that_enqueues_in_its_transaction(self):
        with self.captureOnCommitCallbacks(execute=True):
            order = tasks.place_order(10)
        order.refresh_from_db()
        self.assertTrue(order.paid)

    def test_autocommit_code_runs_the_task_at_once_and_touches_no_queue_table(self):
        order = Order.objects.create(total=3)
        with CaptureQueriesContext(connection) as queries:
            handle = tasks.mark_paid.enqueue(order.pk)
        self.assertEqual(handle.state().result, order.pk)
        self.assertEqual(handle.status, "succeeded")
        self.assertFalse([q for q in queries.captured_queries if "mysqlq_" in q["sql"]])

    def test_a_failing_task_raises_here(self):
        with self.assertRaisesMessage(ValueError, "order 7 refused"):
            tasks.refuse.enqueue(7)

    def test_a_wrong_call_raises_at_once(self):
        with self.assertRaises(TaskArgumentError):
            tasks.mark_paid.enqueue()


class WithCommits(TransactionTestCase):
    def test_the_task_runs_after_the_commit(self):
        order = tasks.place_order(5)
        order.refresh_from_db()
        self.assertTrue(order.paid)

    def test_a_publish_runs_the_topic_handlers_after_the_commit(self):
        order = Order.objects.create(total=9)
        tasks.HEARD.clear()
        with CaptureQueriesContext(connection) as queries, transaction.atomic():
            tasks.orders.publish({"id": order.pk}, key=order.pk)
            self.assertEqual(tasks.HEARD, [])
        self.assertEqual([(group, value) for group, _, value in tasks.HEARD],
                         [("billing", {"id": order.pk}), (None, {"id": order.pk})])
        order.refresh_from_db()
        self.assertTrue(order.paid)
        self.assertFalse([q for q in queries.captured_queries if "mysqlq_" in q["sql"]])

    def test_a_django_task(self):
        if not hasattr(tasks, "total_of"):
            self.skipTest("no Tasks framework")
        order = Order.objects.create(total=42)
        result = tasks.total_of.enqueue(order.pk)
        self.assertEqual(result.return_value, 42)
        self.assertEqual(tasks.total_of.get_result(result.id).return_value, 42)
