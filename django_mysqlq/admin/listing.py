"""How the big lists stay cheap at a million rows.

A list page reads about one page of rows, never the table: its count stops at
:data:`COUNT_CAP` (the page then says "10,000+"), and its order is one that the index
of its filter already holds, so the server walks that index and stops after 50 rows
instead of sorting every match. Which order serves which filter is the model admin's
``get_ordering``; this module has what they share.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import QueryDict
from django.utils.functional import cached_property

if TYPE_CHECKING:
    _Pages = Paginator[Any]
else:  # Paginator is generic for the type checker only
    _Pages = Paginator

#: Rows a list counts at most; past it, the list says "10,000+" and pages stop there.
COUNT_CAP = 10_000


class CappedPaginator(_Pages):
    """Counts at most :data:`COUNT_CAP` + 1 rows, along the filter's index.

    ``SELECT COUNT(*) FROM (SELECT id … LIMIT 10001)``: a few milliseconds whatever the
    table holds, where an exact ``COUNT(*)`` of 700,000 ready messages takes a quarter
    of a second. ``capped`` tells the templates to add the "+".
    """

    capped = False

    @cached_property
    def count(self) -> int:
        if not isinstance(self.object_list, QuerySet):  # the admin always pages a QuerySet
            return len(self.object_list)
        counted = capped_count(self.object_list)
        self.capped = counted.capped
        return counted.value


@dataclasses.dataclass(frozen=True)
class Count:
    """A count that may have stopped at a cap: shown as "10,000+" then."""

    value: int
    capped: bool = False

    def __str__(self) -> str:
        return f"{self.value:,}+" if self.capped else f"{self.value:,}"


def capped_count(queryset: QuerySet[Any]) -> Count:
    """How many rows ``queryset`` holds, reading at most :data:`COUNT_CAP` + 1 of them."""
    counted = queryset.order_by()[:COUNT_CAP + 1].count()
    return Count(min(counted, COUNT_CAP), counted > COUNT_CAP)


def given(params: Mapping[str, Any], *names: str) -> bool:
    """Whether the request filters on any of these parameters (a non-empty value)."""
    return any(params.get(name) not in (None, "") for name in names)


def without_blank(params: QueryDict, names: tuple[str, ...]) -> QueryDict:
    """``params`` without the blank values of ``names``: a GET form sends every field,
    and the changelist would filter on an empty one (``offset=''`` fails, the page
    redirects to ``?e=1``; ``key=''`` finds nothing)."""
    if not any(not value.strip() for name in names for value in params.getlist(name)):
        return params
    kept = params.copy()
    for name in names:
        values = [value for value in params.getlist(name) if value.strip()]
        if values:
            kept.setlist(name, values)
        else:
            kept.pop(name, None)
    kept._mutable = False
    return kept


def text(params: Mapping[str, Any], name: str) -> str:
    """A request parameter's text, stripped ("" when absent)."""
    value = params.get(name, "")
    return value.strip() if isinstance(value, str) else ""
