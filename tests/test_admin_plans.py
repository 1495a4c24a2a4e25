"""Every admin page and list filter reads along an index and stops (EXPLAIN), so each stays
cheap at a million messages and a million history rows (timings: bench/dashboard.py).

The pages are the benchmark's own list (``bench.dashboard.pages``), on its data shape
(``bench.dashboard.fill``) at a small size; each statement a page runs on the queue's
tables is explained, and the index the page's rows come from is pinned.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from bench.dashboard import fill, pages
from django_mysqlq.broker import operate, overview, topic_overview
from tests.plan_support import costly, explain, tables

pytestmark = pytest.mark.django_db(transaction=True)

#: The index the rows of each list page come from (its ``LIMIT 50`` statement).
ROWS_FROM = {
    "messages": "PRIMARY",
    "messages, page 50": "PRIMARY",
    "messages, status ready": "mysqlq_msg_due",
    "messages, status dead": "mysqlq_msg_due",
    "messages, status blocked": "mysqlq_msg_due",
    "messages, queue q1": "mysqlq_msg_claim",
    "messages, queue q1 ready": "mysqlq_msg_claim",
    "messages, queue (none)": "mysqlq_msg_claim",
    "messages, task task_7": "mysqlq_msg_task",
    "messages, task (none)": "mysqlq_msg_task",
    "messages, search task name": "mysqlq_msg_task",
    "blocked list": "mysqlq_msg_due",
    "blocked list, queue q1": "mysqlq_msg_claim",
    "blocked list, task task_9": "mysqlq_msg_task",
    "messages, search subject": "mysqlq_msg_gate",
    "dead list": "mysqlq_msg_due",
    "dead list, queue q0 (none)": "mysqlq_msg_claim",
    "dead list, task task_9": "mysqlq_msg_task",
    "history": "PRIMARY",
    "history, page 50": "PRIMARY",
    "history, outcome failed": "mysqlq_att_outcome",
    "history, outcome cancelled (none)": "mysqlq_att_outcome",
    "history, task task_7": "mysqlq_att_task",
    "history, task retired (old)": "mysqlq_att_task",
    "history, queue q1": "mysqlq_att_queue",
    "history, queue q-old (old)": "mysqlq_att_queue",
    "history, finished today": "mysqlq_att_finished",
    "history, finished past 7 days": "mysqlq_att_finished",
    "history, one message's trace": "mysqlq_att_message",
    "history, search message id": "mysqlq_att_message",
    "history, search task name": "mysqlq_att_task",
}


@pytest.fixture
def filled():
    """The benchmark's tables at 20,000 history rows and 10,000 messages."""
    fill(20_000, 7.0, 10_000)


#: Statements that read all they match by design, pinned in test_operator_plans.py: the
#: claimed messages (as many as run at once) and the dashboard's last hour of history;
#: and the topics ranked by their last publish (one row a topic, one dive each into
#: mysqlq_tmsg_published, sorted: the topics are few beside their messages).
BOUNDED_BY_DESIGN = (" ".join(operate.STUCK_CANDIDATES_SQL.split()),
                     " ".join(overview.HISTORY_WINDOW_SQL.split())[:60],
                     " ".join(topic_overview.TOPICS_SQL.split())[:60])


def statements(client: Any, url: str) -> tuple[list[str], bool]:
    """The statements on the queue's tables one load of ``url`` runs, and whether the
    page is a list that fits one page (its rows statement then has no LIMIT)."""
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200, url
    changelist = (response.context or {}).get("cl")
    one_page = changelist is not None and not changelist.multi_page
    return [q["sql"] for q in captured.captured_queries
            if "mysqlq_" in q["sql"] and q["sql"].lstrip().upper().startswith("SELECT")
            ], one_page


#: The statement reading a list page's rows: every column, in the page's order.
ROWS = re.compile(r"^SELECT `(mysqlq_\w+)`\.`id`, `\1`\.`\w+`, .* ORDER BY ", re.S)


def rows_statement(sqls: list[str]) -> str:
    [sql] = [s for s in sqls if ROWS.match(s)]
    return sql


def test_every_admin_page_reads_along_an_index_and_stops(root, filled):
    problems: dict[str, list[str]] = {}
    for name, url in pages().items():
        sqls, one_page = statements(root, url)
        for sql in sqls:
            if " ".join(sql.split()).startswith(BOUNDED_BY_DESIGN):
                continue
            # A list that fits one page reads its rows without a LIMIT: as many as its
            # (capped) count just found, at most a page.
            found = costly(sql, limited=True if one_page and ROWS.match(sql) else None)
            if found:
                problems.setdefault(name, []).append(f"{found}: {sql[:300]}")
    assert not problems, "\n".join(f"{name}: {found}" for name, all_found in problems.items()
                                   for found in all_found)


def test_each_list_takes_its_rows_from_its_filters_index(root, filled):
    urls = pages()
    chosen = {}
    for name in ROWS_FROM:
        sql = rows_statement(statements(root, urls[name])[0])
        chosen[name] = next(t.get("key") for t in tables(explain(sql))
                            if t["table_name"].startswith("mysqlq_"))
    assert chosen == ROWS_FROM


#: Lists whose order, (status, id) along mysqlq_msg_task with both columns given, is
#: just ``id``: the order the primary key holds too.
TASK_AND_STATUS = {
    "blocked list, task task_9": "/admin/django_mysqlq/blockedmessage/?task=app.tasks.task_9",
    "dead list, task task_9": "/admin/django_mysqlq/deadmessage/?task=app.tasks.task_9",
    "messages, task task_9 blocked":
        "/admin/django_mysqlq/message/?task=app.tasks.task_9&status__exact=blocked",
}


def test_a_tasks_newest_messages_are_read_along_its_index(root, filled):
    """The choice that once failed CI, made certain: 1,000 more blocked and 1,000 more dead
    messages of task_9, all newer than the 10,000 others. Unhinted, MariaDB's ORDER BY …
    LIMIT heuristic walks the primary key for the blocked ones, expecting a page within a
    few hundred rows; it reads every older message first. The lists name their index."""
    with connection.cursor() as cursor:
        cursor.execute("""
            INSERT INTO mysqlq_message
              (queue, task_name, payload, status, priority, enqueued_at, run_at, attempts,
               max_attempts, retry_backoff, timeout, last_error, gate_key, gate_mode, gate_limit)
            SELECT 'q1', 'app.tasks.task_9', '{"args": [], "kwargs": {}}',
                   IF(seq % 2, 'blocked', 'dead'), 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), 1,
                   3, 2, NULL, '', CONCAT('burst-', seq DIV 10), 'hold', 1
              FROM seq_1_to_2000""")
        cursor.execute("ANALYZE TABLE mysqlq_message")
        cursor.fetchall()
    problems = {}
    for name, url in TASK_AND_STATUS.items():
        sqls, _ = statements(root, url)
        rows = rows_statement(sqls)
        [count] = [s for s in sqls if s.startswith("SELECT COUNT(*) FROM (SELECT")]
        for sql in (rows, count):
            keys = [t.get("key") for t in tables(explain(sql))
                    if t["table_name"].startswith("mysqlq_")]
            if keys != ["mysqlq_msg_task"] or costly(sql):
                problems[f"{name}: {sql[:60]}"] = f"{keys} {costly(sql)}"
    assert not problems


def test_the_check_catches_the_plans_that_were_slow_at_a_million_rows(filled):
    # The old task filter's choices, the old index box, history by -id on one queue, and a
    # substring search: each reads the whole table or index.
    assert costly("SELECT DISTINCT task_name FROM mysqlq_message IGNORE INDEX "
                  "(mysqlq_msg_task) ORDER BY task_name LIMIT 200")
    assert costly("SELECT queue, status, COUNT(*), MIN(id) FROM mysqlq_message FORCE INDEX "
                  "(mysqlq_msg_claim) GROUP BY queue, status")
    assert costly("SELECT id FROM mysqlq_attempt FORCE INDEX (PRIMARY) WHERE queue = 'q-old' "
                  "ORDER BY id DESC LIMIT 50")
    assert costly("SELECT id FROM mysqlq_attempt WHERE task_name LIKE '%task_7%' "
                  "ORDER BY id DESC LIMIT 50")
    assert costly("SELECT COUNT(*) FROM mysqlq_attempt WHERE outcome = 'succeeded'")
    assert costly("SELECT COUNT(*) FROM (SELECT id FROM mysqlq_attempt WHERE outcome = "
                  "'succeeded' LIMIT 10001) AS capped") == []


def test_the_dead_lists_filter_choices_take_one_dive_per_value(root, filled):
    """Its task choices are a loose index scan of mysqlq_msg_task (task_name, status):
    one dive per (task, dead); its queue choices one dive per queue into the claim index.
    Neither reads the dead messages themselves, nor needs an index of its own."""
    sqls, _ = statements(root, pages()["dead list"])
    [tasks_sql] = [s for s in sqls if "DISTINCT" in s and "`task_name`" in s]
    [queues_sql] = [s for s in sqls if "EXISTS" in s]
    task_plan = [t for t in tables(explain(tasks_sql)) if t["table_name"] == "mysqlq_message"]
    assert [(t["key"], t.get("using_index_for_group_by")) for t in task_plan] == [
        ("mysqlq_msg_task", True)]
    queue_plan = [t for t in tables(explain(queues_sql)) if t["table_name"] == "mysqlq_message"]
    assert queue_plan and {(t["key"], t["access_type"]) for t in queue_plan} == {
        ("mysqlq_msg_claim", "ref")}
    assert costly(tasks_sql) == [] and costly(queues_sql) == []
    # What they offer: the filled tables' dead messages (sequence numbers ending in 9)
    # are of task_9 and task_19, in q1 and q3 only.
    page = root.get(pages()["dead list"]).content.decode()
    assert sorted(set(re.findall(r'href="\?task=([^"&]+)"', page))) == [
        "app.tasks.task_19", "app.tasks.task_9"]
    assert sorted(set(re.findall(r'href="\?queue=([^"&]+)"', page))) == ["q1", "q3"]
