"""Which queue database an admin page shows, when queues live on several.

A page names its database with ``?database=<alias>`` (the list's "database" filter sets it;
a message's page and its action buttons keep it); without one it shows
``MYSQLQ['DATABASE']``. List and detail pages read the alias's replica when
``MYSQLQ['READ_DATABASE']`` names one; actions always run on the alias itself. The page
binds that alias on its thread (``routing.on_alias``) while it is built and rendered, so
the broker's statements and, through :class:`~django_mysqlq.routing.QueueRouter` or the
querysets below, the ORM's go there.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from .. import broker, routing
from ..conf import get_settings

if TYPE_CHECKING:
    from django.contrib.admin.filters import _ListFilterChoices

PARAMETER = "database"

#: The alias of the page being built on this thread (for links made far from the
#: request: a holder's link, a schedule's last message).
_shown = threading.local()


def selected(request: HttpRequest) -> str:
    """The queue alias this request is about (an unknown one falls back to the default)."""
    given = request.GET.get(PARAMETER) or request.POST.get(PARAMETER)
    if not given:
        filters = parse_qs(request.GET.get("_changelist_filters", ""))
        given = (filters.get(PARAMETER) or [""])[0]
    return given if given in routing.queue_aliases() else get_settings().DATABASE


def is_action(request: HttpRequest) -> bool:
    return request.method == "POST"


def within(request: HttpRequest, view: Callable[[], HttpResponse]) -> HttpResponse:
    """Run and render ``view`` with this request's alias bound: its replica to look, the
    alias itself to act (a POST)."""
    alias = selected(request)
    previous = getattr(_shown, "alias", None)
    _shown.alias = alias
    try:
        with routing.on_alias(alias if is_action(request) else routing.read_alias(alias)):
            response = view()
            if isinstance(response, TemplateResponse):
                response.render()  # lazily evaluated querysets read while the alias is bound
    finally:
        _shown.alias = previous
    return response


def stuck_messages() -> list[broker.Stuck]:
    """The stuck claims of the page's database, judged on that database itself even when
    the page reads a replica: liveness is the source's process list, not the replica's."""
    with routing.on_alias(getattr(_shown, "alias", None)):
        return broker.stuck_messages()


def shown_parameters() -> dict[str, str]:
    """``{"database": <alias>}`` for a link's query to a list of the page being built
    (empty on the default database, or outside a page)."""
    alias = getattr(_shown, "alias", None)
    return {} if alias in (None, get_settings().DATABASE) else {PARAMETER: alias}


def shown_suffix() -> str:
    """``?database=<alias>`` for a link to a row of the page being built (empty on the
    default database, or outside a page)."""
    return "".join(f"?{PARAMETER}={alias}" for alias in shown_parameters().values())


def suffix(request: HttpRequest) -> str:
    """``?database=<alias>`` for links and forms of a page not on the default database."""
    alias = selected(request)
    return "" if alias == get_settings().DATABASE else f"?{PARAMETER}={alias}"


class DatabaseFilter(admin.SimpleListFilter):
    """Which queue database the list shows (offered when queues live on several)."""

    title = "database"
    parameter_name = PARAMETER

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        aliases = routing.queue_aliases()
        return [(alias, alias) for alias in aliases] if len(aliases) > 1 else []

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        alias = selected(request)
        return queryset.using(alias if is_action(request) else routing.read_alias(alias))

    def value(self) -> str | None:
        # No parameter shows MYSQLQ['DATABASE']: that choice is the selected one then.
        return super().value() or get_settings().DATABASE

    def choices(self, changelist: Any) -> Iterator[_ListFilterChoices]:
        # One database at a time (ids are per database): no "All" choice.
        for lookup, title in self.lookup_choices:
            yield {
                "selected": self.value() == str(lookup),
                "query_string": changelist.get_query_string(
                    {self.parameter_name: lookup}),
                "display": title,
            }


class DatabaseMixin:
    """Binds the page's database around the list and detail views (put it first); a
    detail page's own context comes from :meth:`change_context`, called while bound."""

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        queryset: QuerySet[Any] = super().get_queryset(request)  # type: ignore[misc]
        alias = selected(request)
        return queryset.using(alias if is_action(request) else routing.read_alias(alias))

    def changelist_view(self, request: HttpRequest,
                        extra_context: dict[str, Any] | None = None) -> HttpResponse:
        parent = super().changelist_view  # type: ignore[misc]
        return within(request, lambda: parent(request, extra_context))

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:
        parent = super().change_view  # type: ignore[misc]

        def view() -> HttpResponse:
            context = dict(extra_context or {})
            context.update(self.change_context(request, object_id))
            return parent(request, object_id, form_url, context)  # type: ignore[no-any-return]

        return within(request, view)

    def change_context(self, request: HttpRequest, object_id: str) -> dict[str, Any]:
        """What a detail page adds to its template's context, read with the page's database
        bound (override it rather than ``change_view``: the page binds its alias once)."""
        return {}
