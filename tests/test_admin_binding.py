"""A detail page binds its queue database once: ``DatabaseMixin.change_view`` binds it
and calls the admin's ``change_context`` inside, so an admin adding context doesn't wrap
the view a second time (and its own reads see the page's database)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.urls import reverse

from django_mysqlq import broker, routing
from django_mysqlq.admin import databases
from django_mysqlq.admin.attempts import AttemptAdmin
from django_mysqlq.admin.messages import MessageAdmin
from django_mysqlq.admin.topicgroups import TopicGroupAdmin
from django_mysqlq.admin.topics import TopicMessageAdmin
from django_mysqlq.conf import get_settings
from django_mysqlq.models import Attempt, TopicGroup, TopicMessage
from tests.operator_support import make_dead
from tests.testapp import tasks
from tests.topic_ops_support import group, handle, publish

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def bindings(monkeypatch) -> list[str]:
    """The alias bound by each ``databases.within`` call, and (after a ``|``) the one bound
    while an admin's ``change_context`` ran."""
    seen: list[str] = []
    within = databases.within

    def counting(request: Any, view: Callable[[], Any]) -> Any:
        seen.append(databases.selected(request))
        return within(request, view)

    monkeypatch.setattr(databases, "within", counting)
    for admin_class in (MessageAdmin, TopicMessageAdmin, TopicGroupAdmin, AttemptAdmin):
        context = admin_class.change_context

        def recording(self: Any, request: Any, object_id: str,
                      _context: Callable[..., dict[str, Any]] = context) -> dict[str, Any]:
            seen.append(f"|{routing.bound_alias()}")
            return _context(self, request, object_id)

        monkeypatch.setattr(admin_class, "change_context", recording)
    return seen


def topic_rows() -> tuple[int, int]:
    billing = group("orders", "billing")
    publish("orders", 2, key="alice")
    broker.pump(billing, batch=10, window=10)
    handle(billing, 1)
    row = TopicGroup.objects.get(topic="orders", group_name="billing")
    return TopicMessage.objects.filter(topic="orders").order_by("offset")[0].pk, row.pk


def test_each_detail_page_binds_its_database_once(root, bindings) -> None:
    default = get_settings().DATABASE
    dead = make_dead()  # first: it claims the one ready message of its queue
    message = tasks.record.enqueue("bound").id
    history = Attempt.objects.filter(message_id=dead).order_by("-id")[0].pk
    topic_message, topic_group = topic_rows()
    pages = {
        "message": (reverse("admin:django_mysqlq_message_change", args=[message]),
                    "Attempt trace"),
        "attempt": (reverse("admin:django_mysqlq_attempt_change", args=[history]),
                    "always_fails"),
        "topic message": (reverse("admin:django_mysqlq_topicmessage_change",
                                  args=[topic_message]), "billing"),
        "topic group": (reverse("admin:django_mysqlq_topicgroup_change",
                                args=[topic_group]), "orders"),
    }
    for name, (url, shown) in pages.items():
        bindings.clear()
        response = root.get(url)
        assert response.status_code == 200, name
        assert shown in response.content.decode(), name
        # One binding, and the admin's own reads inside it (on the alias's replica, if any).
        assert bindings == [default, f"|{routing.read_alias(default)}"], name


def test_a_page_s_own_context_still_reaches_its_template(root) -> None:
    """What ``change_context`` returns is the template's: the message page's actions."""
    message = tasks.record.enqueue("buttons").id
    response = root.get(reverse("admin:django_mysqlq_message_change", args=[message]))
    assert response.status_code == 200
    assert [action.name for action, _url in response.context["buttons"]]
    assert response.context["trace"] is not None
