"""Reading ``EXPLAIN FORMAT=JSON``: which index each table is read by, and what a plan
would cost on a million rows (full scans, sorts of every match)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from django.db import connection


def explain(sql: str, params: list[Any] | None = None) -> dict[str, Any]:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN FORMAT=JSON " + sql, params)
        return json.loads(cursor.fetchone()[0])


def tables(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        if "table_name" in node:
            yield node
        for value in node.values():
            yield from tables(value)
    elif isinstance(node, list):
        for value in node:
            yield from tables(value)


def access(sql: str, params: list[Any] | None = None) -> list[tuple[str, str | None, str]]:
    """(table, index, access type) of every table the statement reads."""
    return [(t["table_name"], t.get("key"), t["access_type"])
            for t in tables(explain(sql, params))]


#: Keys that find at most one row per value: a sort of what they find is a sort of a few.
UNIQUE_KEYS = {"PRIMARY", "dedup_key"}


def _keys(node: Any) -> list[str]:
    """Every index a table's access uses (several for an index merge)."""
    if isinstance(node, dict):
        found = [str(node["key"])] if "key" in node else []
        return found + [k for value in node.values() for k in _keys(value)]
    if isinstance(node, list):
        return [k for value in node for k in _keys(value)]
    return []


def _bounded(node: dict[str, Any]) -> bool:
    """Whether a table is read by unique keys only (ids or dedup keys given)."""
    keys = _keys(node)
    return node["access_type"] in ("const", "eq_ref", "range", "index_merge") \
        and bool(keys) and set(keys) <= UNIQUE_KEYS


#: Tables of one row per worker, per paused queue or per declared schedule: small by nature.
SMALL_TABLES = {"mysqlq_worker", "mysqlq_queue", "mysqlq_schedule"}


def costly(sql: str, params: list[Any] | None = None, *, limited: bool | None = None
           ) -> list[str]:
    """What makes a statement on the queue's tables grow with them; empty when nothing.

    A full table scan; a full index scan that filters (an index walked for its order
    must stop after LIMIT rows, so it may not skip rows it doesn't want); reading every
    match of a non-unique key (no LIMIT: an exact count, say); a sort or a temporary
    table, unless the rows come by unique keys (a list of ids). Loose index scans (one
    dive per distinct value) are fine. ``limited``: the statement reads a bounded number
    of matches though it has no LIMIT (default: whether it has one).
    """
    plan = explain(sql, params)
    if limited is None:
        limited = " LIMIT " in sql.upper()
    found = []
    queue_tables = [t for t in tables(plan) if t["table_name"].startswith("mysqlq_")
                    and t["table_name"] not in SMALL_TABLES]
    for node in queue_tables:
        name, kind, key = node["table_name"], node["access_type"], node.get("key")
        if kind == "ALL":
            found.append(f"{name}: full table scan")
        elif node.get("using_index_for_group_by"):
            continue
        elif kind == "index" and "attached_condition" in node:
            found.append(f"{name}: walks {key} skipping the rows it filters out")
        elif not limited and not _bounded(node):
            found.append(f"{name}: reads every row it matches on {key} (no LIMIT)")
    text = json.dumps(plan)
    if ("filesort" in text or "temporary_table" in text) \
            and not all(_bounded(node) for node in queue_tables):
        found.append("sorts or groups every matching row")
    return found
