"""Unique keys in the admin: the dedup keys kept taken after a success (``unique_for``),
with when each frees itself, and the operator's action to free some at once."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from .. import broker
from ..models import UniqueKey
from . import actions
from .readonly import ReadOnlyAdminMixin

if TYPE_CHECKING:
    _Base = admin.ModelAdmin[UniqueKey]
else:  # ModelAdmin is generic for the type checker only
    _Base = admin.ModelAdmin


@admin.action(description="Free the selected keys now (the next enqueue makes a message)",
              permissions=["free"])
def free_keys(modeladmin: UniqueKeyAdmin, request: HttpRequest,
              queryset: QuerySet[Any]) -> None:
    ids = [str(key_id) for key_id in queryset.values_list("id", flat=True)[:1000]]
    freed = broker.free_unique_keys(ids)
    modeladmin.message_user(request, f"Freed {freed} key(s): the next enqueue of each makes "
                            "a new message.", messages.SUCCESS)


@admin.register(UniqueKey)
class UniqueKeyAdmin(ReadOnlyAdminMixin, _Base):
    list_display = ("dedup_key", "task_name", "queue", "succeeded", "expires_at", "state")
    list_filter = ("queue", "task_name")
    search_fields = ("=dedup_key", "=task_name")
    ordering = ("-expires_at",)
    actions = [free_keys]
    readonly_fields = ("dedup_key", "task_name", "queue", "succeeded", "succeeded_at",
                       "expires_at", "state")
    fields = readonly_fields

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm("django_mysqlq.view_uniquekey") or \
            request.user.has_perm("django_mysqlq.view_message")

    def has_free_permission(self, request: HttpRequest) -> bool:
        # Freeing a key lets a new message in, as cancelling its holder would.
        return actions.allowed(request, actions.CANCEL)

    @admin.display(description="state")
    def state(self, obj: UniqueKey) -> str:
        return "taken" if obj.expires_at > timezone.now() else "free (awaiting retention)"

    @admin.display(description="message that succeeded")
    def succeeded(self, obj: UniqueKey) -> str:
        if not obj.message_id:
            return "-"
        url = reverse("admin:django_mysqlq_attempt_changelist")
        return format_html('<a href="{}?message_id={}">#{}</a>', url, obj.message_id,
                           obj.message_id)
