"""The manager of the queue's models: it follows the thread's bound queue database."""

from __future__ import annotations

from typing import TypeVar

from django.db import models

from .routing import bound_alias

_M = TypeVar("_M", bound=models.Model)


class BoundManager(models.Manager[_M]):
    """The manager of every queue model: its queries go to the thread's bound queue
    database (``routing.on_alias``: an admin page binds the database it shows, a worker's
    threads theirs), so no ``DATABASE_ROUTERS`` entry is needed for them. Unbound, or
    with ``.using()``, Django's routers decide as for any model."""

    def get_queryset(self) -> models.QuerySet[_M]:
        queryset = super().get_queryset()
        alias = bound_alias()
        return queryset.using(alias) if alias and self._db is None else queryset
