"""Queue rows change only through the broker (actions, workers, purge), never admin forms."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest


class ReadOnlyAdminMixin:
    """No add, change or delete in the admin: a form save would bypass the queue's rules.

    Put it before ``ModelAdmin`` in the bases. Deleting goes through an operator action
    (cancel) or ``manage.py queuepurge``, which record what they did.
    """

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
