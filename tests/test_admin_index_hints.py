"""The admin lists' index hints (django_mysqlq/admin/indexhints.py): which statements of a
pinned queryset name the index, which are left to the optimizer, and which orders an
index may be said to hold. The plans they give: tests/test_admin_plans.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from django.db.models import Count, F, Q
from django.test.utils import CaptureQueriesContext

from django_mysqlq.admin.indexhints import IndexOrder, along, pin
from django_mysqlq.admin.listing import capped_count
from django_mysqlq.admin.messages import CLAIM_ORDER, DUE_ORDER, NEWEST_FIRST, TASK_ORDER
from django_mysqlq.models import BlockedMessage, Message

pytestmark = pytest.mark.django_db

#: A task's messages (of one status): the task list's order and index.
TASK = IndexOrder(Message, ("status", "id"), "mysqlq_msg_task")
HINT = "FORCE INDEX (`mysqlq_msg_task`)"


def sql_of(run: Callable[[], Any]) -> list[str]:
    with CaptureQueriesContext(connection) as captured:
        run()
    return [q["sql"] for q in captured.captured_queries]


def blocked_of_task() -> Any:
    """A blocked list of one task, as the admin builds it."""
    return along(Message.objects.filter(task_name="app.tasks.t", status="blocked"), TASK)


def test_a_lists_rows_pages_and_counts_name_the_index():
    listed = blocked_of_task()
    runs = {
        "rows": lambda: list(listed[:50]),
        "a later page": lambda: list(listed[50:100]),
        "a clone": lambda: list(listed.all().using("default")[:50]),
        "count": listed.count,
        "capped count": lambda: capped_count(listed),
        "exists": listed.exists,
        "ids (an action on all matching)": lambda: list(
            listed.values_list("pk", flat=True)[:10001]),
        "a proxy model's list": lambda: list(
            pin(BlockedMessage.objects.filter(task_name="t", status="blocked")
                .order_by("status", "id"), TASK)[:50]),
        "its order again (the admin's)": lambda: list(listed.order_by("status", "id",
                                                                      "status", "id")),
        "the task alone": lambda: list(along(Message.objects.filter(task_name="t"), TASK)),
    }
    statements = {name: sql_of(run) for name, run in runs.items()}
    unhinted = {name: sqls for name, sqls in statements.items()
                if not sqls or not all(HINT in sql for sql in sqls)}
    assert unhinted == {}
    [sql] = sql_of(lambda: list(listed[:50]))
    assert f"FROM `mysqlq_message` {HINT} WHERE" in sql
    # As a subquery, its own statement is hinted, not the one it is in.
    [sql] = sql_of(lambda: list(Message.objects.filter(pk__in=listed.values("pk"))))
    sql = sql.replace("`U0`", "U0")  # Django 5.2 leaves the alias unquoted
    assert "FROM `mysqlq_message` WHERE `mysqlq_message`.`id` IN (SELECT U0.`id`" in sql
    assert f"FROM `mysqlq_message` U0 {HINT} WHERE" in sql


def test_statements_the_index_does_not_serve_whole_are_left_to_the_optimizer():
    listed = blocked_of_task()
    runs = {
        "selected ids (an action)": lambda: list(listed.filter(pk__in=[1, 2])),
        "one row by id": lambda: listed.filter(pk=1).first(),
        "another column": lambda: list(listed.filter(gate_key="subject-1")),
        "another lookup": lambda: list(listed.filter(queue__startswith="q")),
        "a negation": lambda: list(listed.exclude(queue="q1")),
        "OR": lambda: list(along(Message.objects.filter(
            Q(task_name="a") | Q(task_name="b")), TASK)),
        "a column for a value": lambda: list(listed.filter(queue=F("task_name"))),
        "a status without its task": lambda: list(along(Message.objects.filter(
            status="blocked"), TASK)),
        "another order": lambda: list(listed.order_by("-id")[:50]),
        "an order the sort adds to": lambda: list(listed.order_by("status", "id", "queue")),
        "grouped": lambda: list(listed.values("queue").annotate(n=Count("id"))),
        "distinct": lambda: list(listed.values("queue").distinct()),
        "an update": lambda: listed.update(priority=1),
        "the primary key's order": lambda: list(pin(Message.objects.all(),
                                                    IndexOrder(Message, ("-id",)))),
    }
    statements = {name: sql_of(run) for name, run in runs.items()}
    hinted = {name: sqls for name, sqls in statements.items()
              if not sqls or any("FORCE INDEX" in sql for sql in sqls)}
    assert hinted == {}


def test_the_lists_orders_are_held_by_their_indexes():
    assert (CLAIM_ORDER.prefix, CLAIM_ORDER.columns) == (
        ("queue",), ("queue", "status", "priority", "id"))
    assert (TASK_ORDER.prefix, TASK_ORDER.columns) == (("task_name",), ("task_name", "status"))
    assert (DUE_ORDER.prefix, DUE_ORDER.columns) == (("status",), ("status", "run_at"))
    assert (NEWEST_FIRST.prefix, NEWEST_FIRST.columns) == ((), ("id",))
    # Every key ends with the primary key: a task's messages of one status by id.
    assert IndexOrder(Message, ("id",), "mysqlq_msg_task").prefix == ("task_name", "status")


@pytest.mark.parametrize("fields,index", [
    (("status", "-id"), "mysqlq_msg_task"),  # directions mixed: a sort
    (("-run_at", "id"), "mysqlq_msg_due"),
    (("priority", "id"), "mysqlq_msg_task"),  # not a column of the index
    (("status", "id"), "mysqlq_msg_claim"),  # skips the priority
    (("-id",), "mysqlq_msg_nosuch"),
    (("task_name",), None),
    ((), "mysqlq_msg_task"),
])
def test_an_order_its_index_does_not_hold_is_refused(fields, index):
    with pytest.raises(ValueError, match=r"does not hold|no index"):
        IndexOrder(Message, fields, index)
