"""Topics in the admin: the topics, groups and topic messages lists, the trace, reset and
replay from a group's page (permission, POST, recorded), the group dead letter."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.test import Client
from django.urls import reverse
from django.utils.http import urlencode

from django_mysqlq.models import Message, MessageStatus, TopicDelivery, TopicGroup
from tests.operator_support import user
from tests.topic_ops_support import group, handle, publish

pytestmark = pytest.mark.django_db(transaction=True)

TOPICS = "/admin/django_mysqlq/topicstate/"
GROUPS = "/admin/django_mysqlq/topicgroup/"
MESSAGES = "/admin/django_mysqlq/topicmessage/"


@pytest.fixture
def orders():
    from django_mysqlq import broker

    billing = group("orders", "billing")
    group("orders", "audit", start="latest")
    publish("orders", 4, key="alice")
    publish("orders", 2, start=4)
    broker.pump(billing, batch=100, window=100)
    handle(billing, 2)  # alice's first, then offset 5 (keyless)
    handle(billing, 1, fail=True)  # one more: dead
    return billing


def test_topics_list_shows_volume_and_links(root, orders) -> None:
    page = root.get(TOPICS).content.decode()
    assert "orders" in page and f"{GROUPS}?topic=orders" in page
    response = root.get(TOPICS)
    [row] = response.context["cl"].result_list
    assert (row.last_offset, row.first_offset) == (6, 1)


class ListRows(HTMLParser):
    """An admin changelist's rows: each a dict of its ``field-<name>`` cells' texts."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[dict[str, str]] = []
        self.field: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        classes = (dict(attrs).get("class") or "").split()
        if tag == "tr":
            self.rows.append({})
        elif tag in ("td", "th") and self.rows:
            self.field = next((c.removeprefix("field-") for c in classes
                               if c.startswith("field-")), None)
            if self.field is not None:
                self.rows[-1][self.field] = ""

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th"):
            self.field = None

    def handle_data(self, data: str) -> None:
        if self.field is not None:
            self.rows[-1][self.field] += data.strip()


def list_rows(page: str, key: str) -> dict[str, dict[str, str]]:
    """The rows of a changelist page by their ``key`` field."""
    parser = ListRows()
    parser.feed(page)
    return {row[key]: row for row in parser.rows if key in row}


def test_groups_list_shows_position_lag_and_a_dead_letter_link(root, orders) -> None:
    response = root.get(GROUPS + "?topic=orders")
    assert response.status_code == 200
    page = response.content.decode()
    rows = list_rows(page, "group_name")
    # billing: position 6, 3 deliveries waiting (the dead one is no lag); audit: 6 behind
    assert {name: (row["position"], row["last_offset"], row["lag"], row["dead_letter"])
            for name, row in rows.items()} == {"billing": ("6", "6", "3", "1"),
                                               "audit": ("0", "6", "6", "0")}
    dead = reverse("admin:django_mysqlq_deadmessage_changelist") + \
        "?task=topic%3Aorders%3Abilling"
    assert dead in page
    listed = root.get(dead)
    assert [m.id for m in listed.context["cl"].result_list] == list(
        Message.objects.filter(status=MessageStatus.DEAD).values_list("id", flat=True))


def test_topic_messages_lookup_and_trace(root, orders) -> None:
    def offsets(query: str) -> list[int]:
        response = root.get(MESSAGES + query)
        assert response.status_code == 200
        return [m.offset for m in response.context["cl"].result_list]

    assert offsets("?topic=orders") == [6, 5, 4, 3, 2, 1]
    assert offsets("?topic=orders&offset=3") == [3]
    assert offsets("?topic=orders&key=alice") == [4, 3, 2, 1]
    since = "published_at__gte=2000-01-01+00:00:00%2B00:00"
    assert offsets(f"?topic=orders&{since}") == [1, 2, 3, 4, 5, 6]
    assert offsets(f"?topic=orders&{since.replace('gte', 'lt')}") == []
    message_id = TopicDelivery.objects.get(group_name="billing", offset=1).message_id
    from django_mysqlq.models import TopicMessage
    row = TopicMessage.objects.get(topic="orders", offset=1)
    page = root.get(reverse("admin:django_mysqlq_topicmessage_change", args=[row.pk]))
    text = page.content.decode()
    assert 'id="topic-trace"' in text and "succeeded" in text and "test-host:1:abc" in text
    assert f"#{message_id}" in text
    dead_id = Message.objects.get(status=MessageStatus.DEAD).pk
    dead_offset = TopicDelivery.objects.get(message_id=dead_id).offset
    dead_row = TopicMessage.objects.get(topic="orders", offset=dead_offset)
    text = root.get(reverse("admin:django_mysqlq_topicmessage_change",
                            args=[dead_row.pk])).content.decode()
    assert "dead" in text and "handler broke" in text


def test_the_lookup_form_s_blank_fields_are_no_lookup(root, orders) -> None:
    """The GET form sends every field: ``offset=''`` made the changelist fail (``?e=1``)
    and ``key=''`` would look for an empty key; blank fields are ignored now."""
    def offsets(query: str) -> list[int]:
        response = root.get(MESSAGES + query)
        assert response.status_code == 200, response.get("Location")
        return [m.offset for m in response.context["cl"].result_list]

    blank = {"topic": "orders", "offset": "", "key": "", "published_at__gte": "",
             "published_at__lt": " "}
    assert offsets("?" + urlencode(blank)) == [6, 5, 4, 3, 2, 1]
    assert offsets("?" + urlencode({**blank, "offset": "3"})) == [3]
    assert offsets("?" + urlencode({**blank, "key": "alice"})) == [4, 3, 2, 1]
    since = {**blank, "published_at__gte": "2000-01-01 00:00:00+00:00"}
    assert offsets("?" + urlencode(since)) == [1, 2, 3, 4, 5, 6]
    page = root.get(MESSAGES + "?" + urlencode({**blank, "offset": "3"}))
    assert "offset=&amp;" not in page.content.decode()  # nor in its links


def test_the_lookup_reads_a_naive_publish_time_as_utc_as_the_cli_does(root, orders,
                                                                       settings) -> None:
    """With TIME_ZONE = "Europe/Paris", ``published_at__gte=2026-11-24 08:00`` was 07:00
    UTC (the changelist's reading) where ``queuetopic lookup --since 2026-11-24T08:00`` and
    the group page's reset read 08:00 UTC: an hour apart. The lookup reads it as UTC now,
    takes a duration ago too, and refuses anything else saying why."""
    import datetime as dt
    import json
    from io import StringIO

    from django.core.management import call_command

    from django_mysqlq.models import TopicMessage

    settings.TIME_ZONE = "Europe/Paris"
    base = dt.datetime(2026, 11, 24, 7, 0, tzinfo=dt.UTC)
    for offset in range(1, 7):  # 07:15, 07:30, ... 08:30 UTC
        TopicMessage.objects.filter(topic="orders", offset=offset).update(
            published_at=base + dt.timedelta(minutes=15 * offset))

    def offsets(**query: str) -> tuple[list[int], str]:
        response = root.get(MESSAGES + "?" + urlencode({"topic": "orders", **query}),
                            follow=True)
        assert response.status_code == 200, response.redirect_chain
        return [m.offset for m in response.context["cl"].result_list], \
            response.content.decode()

    out = StringIO()
    call_command("queuetopic", "lookup", "--topic", "orders", "--since", "2026-11-24T08:00",
                 "--json", stdout=out)
    cli = sorted(m["offset"] for m in json.loads(out.getvalue())["messages"])
    assert cli == [4, 5, 6]
    assert offsets(published_at__gte="2026-11-24 08:00")[0] == cli
    found, page = offsets(published_at__gte="2026-11-24T08:00",
                          published_at__lt="2026-11-24 08:30")
    assert found == [4, 5]
    assert 'value="2026-11-24 08:00:00+00:00"' in page  # the form says what it read
    # A time with its offset is that time (09:00 in Paris is 08:00 UTC).
    assert offsets(published_at__gte="2026-11-24 09:00+01:00")[0] == cli
    TopicMessage.objects.filter(topic="orders", offset=6).update(
        published_at=dt.datetime.now(dt.UTC) - dt.timedelta(hours=1))
    assert offsets(published_at__gte="2h")[0] == [6]  # a duration ago, as the CLI's
    assert offsets(published_at__lt="2h")[0] == [1, 2, 3, 4, 5]
    found, page = offsets(published_at__gte="yesterday")
    assert found == [6, 5, 4, 3, 2, 1]  # not applied, and said so
    assert "Published from &#x27;yesterday&#x27; is not applied: expected a duration" in page


def test_reset_and_replay_from_the_group_page(root, orders) -> None:
    row = TopicGroup.objects.get(group_name="billing")
    page = root.get(reverse("admin:django_mysqlq_topicgroup_change", args=[row.pk]))
    assert b'id="reset-form"' in page.content and b'id="group-lag"' in page.content
    operate = reverse("admin:django_mysqlq_topicgroup_operate", args=[row.pk])
    assert root.get(operate).status_code == 405
    response = root.post(operate, {"op": "reset", "to": "offset", "value": "5"}, follow=True)
    assert "position 6 -&gt; 4" in response.content.decode()
    row.refresh_from_db()
    assert row.position == 4 and row.changed_by == "admin:root"
    response = root.post(operate, {"op": "reset", "to": "offset", "value": "99"}, follow=True)
    assert "has no offset 99 yet" in response.content.decode()
    response = root.post(operate, {"op": "replay", "first": "1", "last": "2"}, follow=True)
    assert "2 new deliveries" in response.content.decode()
    assert TopicDelivery.objects.filter(group_name="billing", offset=1).count() == 2
    response = root.post(operate, {"op": "replay", "first": "3", "last": "1"}, follow=True)
    assert "is empty" in response.content.decode()
    # A blank or non-numeric bound is said in the form's terms, not as int()'s error.
    response = root.post(operate, {"op": "replay", "first": "", "last": "x"}, follow=True)
    text = response.content.decode()
    assert "as whole numbers" in text and "invalid literal" not in text
    response = root.post(operate, {"op": "reset", "to": "time", "value": "nonsense"},
                         follow=True)
    assert "ISO date" in response.content.decode()


class FormNesting(HTMLParser):
    """The ids of the forms opened inside another form (a browser drops those)."""

    def __init__(self) -> None:
        super().__init__()
        self.open: list[str] = []
        self.nested: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "form":
            name = dict(attrs).get("id") or "?"
            if self.open:
                self.nested.append(name)
            self.open.append(name)

    def handle_endtag(self, tag: str) -> None:
        if tag == "form" and self.open:
            self.open.pop()


def test_the_group_page_s_forms_are_not_inside_its_change_form(root, orders) -> None:
    """The reset and replay forms sat inside ``topicgroup_form``: the browser dropped
    them, and Reset posted the read-only change form (403)."""
    row = TopicGroup.objects.get(group_name="billing")
    page = root.get(reverse("admin:django_mysqlq_topicgroup_change", args=[row.pk]))
    forms = FormNesting()
    forms.feed(page.content.decode())
    assert forms.nested == [] and forms.open == []
    text = page.content.decode()
    assert text.index('id="topicgroup_form"') < text.index('id="reset-form"')


def test_bulk_reset_to_latest(root, orders) -> None:
    ids = list(TopicGroup.objects.values_list("pk", flat=True))
    root.post(GROUPS, {"action": "reset_latest", ACTION_CHECKBOX_NAME: ids})
    assert set(TopicGroup.objects.values_list("position", flat=True)) == {6}
    assert not Message.objects.filter(status__in=("ready", "blocked")).exists()


def test_bulk_reset_acts_on_every_selected_group_past_a_hundred(root, orders) -> None:
    """The action reset only the first 100 selected groups, silently: all 105 are reset
    now, each changed by the operator, and the message counts them all."""
    for n in range(103):
        group("orders", f"g{n:03}")
    ids = list(TopicGroup.objects.values_list("pk", flat=True))
    assert len(ids) == 105
    assert TopicGroup.objects.exclude(position=6).count() == 104  # billing is at 6
    response = root.post(GROUPS, {"action": "reset_latest", ACTION_CHECKBOX_NAME: ids},
                         follow=True)
    assert set(TopicGroup.objects.values_list("position", flat=True)) == {6}
    assert set(TopicGroup.objects.values_list("changed_by", flat=True)) == {"admin:root"}
    assert not Message.objects.filter(status__in=("ready", "blocked")).exists()
    said = [str(m) for m in response.context["messages"]]  # (billing's three waited)
    # ... at offsets 3, 4 and 6: before the latest, so skipped, and said so.
    assert said == ["105 groups reset to the latest message; 3 waiting deliveries "
                    "cancelled: 3 of them were before their group's new position and will "
                    "not run (orders / billing: 3 at offsets 3-6, not every one between: a "
                    "replay of the range runs its other offsets again too); replay them "
                    "from each group's page if they should."], said


def test_operating_needs_the_change_permission(orders) -> None:
    viewer = Client()
    viewer.force_login(user("viewer"))
    row = TopicGroup.objects.get(group_name="billing")
    assert viewer.get(GROUPS).status_code == 200
    page = viewer.get(reverse("admin:django_mysqlq_topicgroup_change", args=[row.pk]))
    assert page.status_code == 200 and b'id="reset-form"' not in page.content
    operate = reverse("admin:django_mysqlq_topicgroup_operate", args=[row.pk])
    assert viewer.post(operate, {"op": "reset", "to": "latest"}).status_code == 403
    assert TopicGroup.objects.get(pk=row.pk).position == 6
    operator = Client()
    operator.force_login(user("op", "change_topicgroup"))
    operator.post(operate, {"op": "reset", "to": "earliest"})
    assert TopicGroup.objects.get(pk=row.pk).position == 0


def test_dashboard_shows_topics_busiest_first_and_groups_lag(root, orders) -> None:
    group("quiet", "q")
    publish("quiet", 1)
    page = root.get("/admin/django_mysqlq/queuestate/?refresh=0").content.decode()
    assert 'id="topics"' in page and 'id="groups"' in page
    assert page.index('id="topic-orders"') < page.index('id="topic-quiet"')
    assert 'id="group-orders-billing"' in page and 'id="group-orders-audit"' in page
    assert "?task=topic%3Aorders%3Abilling" in page


def test_a_capped_unsequenced_count_shows_as_a_floor(root, monkeypatch) -> None:
    """More messages without an offset than the count's cap: the lag on the groups list,
    the group's page and the dashboard reads ``2+``, not a plain 2."""
    from django_mysqlq import Topic
    from django_mysqlq.broker import topic_ops

    monkeypatch.setattr(topic_ops, "UNSEQUENCED_COUNT_CAP", 2)
    group("orders", "billing", start="latest")
    Topic("orders").publish_many([{"n": n} for n in range(3)])  # no worker sequences them
    assert ">2+<" in root.get(GROUPS + "?topic=orders").content.decode()
    row = TopicGroup.objects.get(group_name="billing")
    page = root.get(reverse("admin:django_mysqlq_topicgroup_change", args=[row.pk]))
    assert ("lag 2+ messages (more: of the messages without an offset yet, 2 were counted)"
            in page.content.decode())
    page = root.get("/admin/django_mysqlq/queuestate/?refresh=0").content.decode()
    assert '<td class="num">0</td><td class="num">2+</td>' in page


def test_reset_to_a_time_takes_a_duration_ago_as_the_cli_does(root, orders) -> None:
    """``queuetopic reset --to-time`` takes ``2h`` (ago) as well as an ISO time: the group
    page's form takes the same, through the same parser, and says what it expects."""
    row = TopicGroup.objects.get(group_name="billing")
    operate = reverse("admin:django_mysqlq_topicgroup_operate", args=[row.pk])
    root.post(operate, {"op": "reset", "to": "latest"})
    assert TopicGroup.objects.get(pk=row.pk).position == 6
    response = root.post(operate, {"op": "reset", "to": "time", "value": " 2h "}, follow=True)
    assert "position 6 -&gt; 0" in response.content.decode()  # all published < 2h ago
    row.refresh_from_db()
    assert row.position == 0 and row.changed_by == "admin:root"
    for bad in ("2 hours", "h2", "yesterday", ""):
        response = root.post(operate, {"op": "reset", "to": "time", "value": bad},
                             follow=True)
        text = response.content.decode()
        assert "Reset to a time: expected a duration (2h, 3d) or an ISO date/time" in text
        assert TopicGroup.objects.get(pk=row.pk).position == 0
    page = root.get(reverse("admin:django_mysqlq_topicgroup_change", args=[row.pk]))
    assert b"to time (2h ago, or ISO; UTC)" in page.content


def test_reset_refusals_and_notes_speak_the_forms_words(root, orders) -> None:
    """The reset's refusals named the command's options (``--latest``, ``--earliest``):
    the page says its own choices; a time nothing was published at or after yet says the
    group is set to the latest offset; ``-2h`` says to write ``2h``."""
    import datetime as dt

    row = TopicGroup.objects.get(group_name="billing")
    operate = reverse("admin:django_mysqlq_topicgroup_operate", args=[row.pk])

    def said(**form: str) -> str:
        response = root.post(operate, {"op": "reset", **form}, follow=True)
        return " ".join(str(m) for m in response.context["messages"])

    text = said(to="offset", value="99")
    assert "has no offset 99 yet" in text and "or to the latest." in text
    assert "--" not in text
    text = said(to="offset", value="0")
    assert "has no offset 0: offsets start at 1. Reset to the earliest kept message, or to " \
        "an offset from 1 to 7" in text
    assert "--" not in text and "retention" not in text
    text = said(to="time", value="-2h")
    assert "Reset to a time: expected a duration ago without a dash: write 2h, not -2h" in text
    assert TopicGroup.objects.get(pk=row.pk).position == 6
    said(to="earliest")
    future = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=3)).replace(microsecond=0)
    text = said(to="time", value=future.isoformat())
    assert "position 0 -> 6" in text
    assert (f"No message was published at or after {future.isoformat()} yet: the group is "
            "set to the latest offset 6; it gets what is published from now on.") in text
    assert TopicGroup.objects.get(pk=row.pk).position == 6


def test_the_trace_names_a_group_past_an_offset_whose_link_row_is_missing(root,
                                                                          orders) -> None:
    from django_mysqlq.models import TopicMessage

    TopicDelivery.objects.filter(group_name="billing", offset=1).delete()  # by hand
    row = TopicMessage.objects.get(topic="orders", offset=1)
    text = root.get(reverse("admin:django_mysqlq_topicmessage_change",
                            args=[row.pk])).content.decode()
    assert 'id="topic-trace"' in text and "No group has received it yet" not in text
    assert "billing</td><td>-</td><td>no delivery record (its link row is missing)" in text
    assert "audit" not in text  # position 0: not past offset 1


def test_a_group_whose_pump_cant_go_on_says_why_on_every_page(root, orders) -> None:
    """A member noted the group's problem: the groups list, the group's page and the
    dashboard show it beside the lag it explains; the pump's next move clears it."""
    from django_mysqlq import broker

    problem = "its pump failed: (1264, \"Out of range value for column 'last_offset'\")"
    assert broker.note_pump_problem("orders", "audit", problem)
    listed = root.get(GROUPS + "?topic=orders").content.decode()
    assert 'class="pump-problem errornote"' in listed
    assert "stopped: its pump failed: (1264, &quot;Out of range value" in listed
    assert listed.count(">ok<") == 1  # billing
    row = TopicGroup.objects.get(group_name="audit")
    page = root.get(reverse("admin:django_mysqlq_topicgroup_change", args=[row.pk]))
    assert 'id="group-pump-problem"' in page.content.decode()
    assert "Its pump can't go on (since " in page.content.decode()
    dashboard = root.get("/admin/django_mysqlq/queuestate/?refresh=0").content.decode()
    assert dashboard.count('class="pump-problem"') == 1
    assert broker.pump(group("orders", "audit", start="latest"), batch=100, window=100)
    listed = root.get(GROUPS + "?topic=orders").content.decode()
    assert "pump-problem" not in listed and listed.count(">ok<") == 2
