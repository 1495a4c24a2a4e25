"""Index hints for the admin's lists: a list's rows come from the index that holds its
order, whatever the optimizer's sampled statistics say.

A list is in the order the index of its narrowest filter holds, so that a page walks that
index and stops (:mod:`.listing`). The optimizer usually agrees, but not always: the
blocked messages of one task are ordered (status, id) along ``mysqlq_msg_task``
(task_name, status); with both columns equal to constants that order is just ``id``, and
MariaDB's ORDER BY … LIMIT heuristic may then walk the primary key instead, expecting to
meet a page of matches early. When the task's blocked messages are the newest, it reads
every older message first (all of them at a million). Which plan wins is decided by
sampled statistics, so it changed between two loads of the same page.

Django has no index hints. :func:`pin` marks a queryset with an :class:`IndexOrder` (an
order and the index holding it), and on MySQL and MariaDB its statements name that index
(``FORCE INDEX``) when they are plain reads of the model's table that the index serves
whole: every condition is a column of the index equal to a value, the columns before the
order's are among them, and the statement is in that order or in none (a count, an
``exists()``). The mark survives ``clone()``, filtering, slicing and counting; any other
statement (an update, a join, a search by id or by another column, another order) is left
to the optimizer, as before, and so is any backend but Django's own MySQL one.

``FORCE INDEX`` rather than ``IGNORE INDEX FOR ORDER BY (PRIMARY)``: in that case the
optimizer's first choice was ``mysqlq_msg_due`` (status, run_at), which finds the same
rows but sorts every one; only its ORDER BY reconsideration moved it to the task's index.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from django.db.backends.mysql.compiler import SQLCompiler as MySQLCompiler
from django.db.models import Field, Model, QuerySet
from django.db.models.expressions import Col
from django.db.models.lookups import Exact
from django.db.models.sql import Query
from django.db.models.sql.datastructures import BaseTable
from django.db.models.sql.where import AND, WhereNode

_QS = TypeVar("_QS", bound=QuerySet[Any])


@dataclasses.dataclass(frozen=True)
class IndexOrder:
    """An order of ``model``'s rows (``order_by`` fields) and the index that holds it,
    by name (``None``: the primary key, which needs no hint).

    Checked when made: the order's columns are consecutive columns of the index (InnoDB
    ends each key with the primary key), all in the index's directions or all reversed
    (a backward walk), so the two cannot drift apart.
    """

    model: type[Model]
    fields: tuple[str, ...]
    index: str | None = None
    #: Columns a statement must compare to a value for the index to hold the order.
    prefix: tuple[str, ...] = dataclasses.field(init=False, default=())
    #: Columns a statement may compare to a value: the index's own.
    columns: tuple[str, ...] = dataclasses.field(init=False, default=())

    def __post_init__(self) -> None:
        meta = self.model._meta
        declared = [] if self.index is None else [
            (_column(self.model, name), order == "DESC")
            for name, order in _fields_of(self.model, self.index)]
        key = declared + [(meta.pk.column, False)] * (meta.pk.column not in dict(declared))
        names = [column for column, _ in key]
        wanted = [(_column(self.model, f.lstrip("-")), f.startswith("-")) for f in self.fields]
        start = names.index(wanted[0][0]) if wanted and wanted[0][0] in names else -1
        walked = key[start:start + len(wanted)] if start >= 0 else []
        forward = [d == w for (_, d), (_, w) in zip(walked, wanted, strict=False)]
        if [c for c, _ in walked] != [c for c, _ in wanted] or len(set(forward)) != 1:
            raise ValueError(f"{self.index or 'the primary key'} of {meta.label} does not "
                             f"hold the order {self.fields}")
        object.__setattr__(self, "prefix", tuple(names[:start]))
        object.__setattr__(self, "columns", tuple(c for c, _ in declared) or (meta.pk.column,))


def _column(model: type[Model], name: str) -> str:
    field = model._meta.get_field(name)
    if not isinstance(field, Field) or not field.column:
        raise ValueError(f"{model._meta.label}.{name} is not a column")
    return field.column


def _fields_of(model: type[Model], index: str) -> list[tuple[str, str]]:
    """(field name, "DESC" or "") of each part of ``model``'s index ``index``."""
    found = [i for i in model._meta.indexes if i.name == index]
    if not found or not found[0].fields_orders:
        raise ValueError(f"{model._meta.label} has no index {index!r} on fields")
    return list(found[0].fields_orders)


def _equalities(node: WhereNode, alias: str) -> set[str] | None:
    """The columns of ``alias`` that ``node`` compares to a value, when it is nothing but
    such comparisons joined by AND; None for anything else."""
    if node.connector != AND or node.negated:
        return None
    found: set[str] = set()
    for child in node.children:
        if isinstance(child, WhereNode):
            inner = _equalities(child, alias)
            if inner is None:
                return None
            found |= inner
        elif isinstance(child, Exact) and isinstance(child.lhs, Col) \
                and child.lhs.alias == alias and child.lhs.target.column \
                and not hasattr(child.rhs, "resolve_expression"):
            found.add(child.lhs.target.column)
        else:
            return None
    return found


class PinnedQuery(Query):
    """A query that reads along :attr:`pinned`'s index when it can (see the module)."""

    pinned: IndexOrder | None = None

    def hinted_index(self) -> str | None:
        """The index this statement is to read, or None if that index doesn't serve it
        whole (or nothing is pinned)."""
        order = self.pinned
        if order is None or order.index is None:
            return None
        if len(self.alias_map) != 1 or self.extra_tables or self.extra_order_by \
                or self.combinator or self.distinct or self.group_by is not None:
            return None
        [(alias, table)] = self.alias_map.items()
        # The index's own table (a proxy model's too), not a join or a derived table.
        if not isinstance(table, BaseTable) or table.table_name != order.model._meta.db_table:
            return None
        ordering = tuple(dict.fromkeys(self.order_by))  # the admin repeats its order
        if ordering != order.fields and (ordering or (self.default_ordering
                                                      and self.get_meta().ordering)):
            return None
        filtered = _equalities(self.where, alias)
        if filtered is None or not set(order.prefix) <= filtered <= set(order.columns):
            return None
        return order.index

    def get_compiler(self, using: str | None = None, connection: Any | None = None,
                     elide_empty: bool = True) -> Any:
        compiler = super().get_compiler(using, connection, elide_empty)
        if self.pinned is None or type(compiler) is not MySQLCompiler:
            return compiler  # another backend, or a wrapper's own compiler: left alone
        return _PinningCompiler(self, compiler.connection, compiler.using, elide_empty)


class _PinningCompiler(MySQLCompiler):
    """MySQL's compiler, adding a :class:`PinnedQuery`'s hint after its one table."""

    def get_from_clause(self) -> tuple[list[str], Any]:
        result, params = super().get_from_clause()
        index = self.query.hinted_index() if isinstance(self.query, PinnedQuery) else None
        if index is not None and len(result) == 1:
            result = [f"{result[0]} FORCE INDEX ({self.connection.ops.quote_name(index)})"]
        return result, params


def pin(queryset: _QS, order: IndexOrder) -> _QS:
    """``queryset``, its statements reading along ``order``'s index where that index serves
    them whole (an order along the primary key leaves it as it is)."""
    if order.index is None:
        return queryset
    pinned = queryset.all()
    query = pinned.query.chain(PinnedQuery)
    assert isinstance(query, PinnedQuery)
    query.pinned = order
    pinned.query = query
    return pinned


def along(queryset: _QS, order: IndexOrder) -> _QS:
    """``queryset`` in ``order``, read along its index (:func:`pin`)."""
    return pin(queryset.order_by(*order.fields), order)
