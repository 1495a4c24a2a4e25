"""The topics table of ``queuestats`` and the admin dashboard, column by column: last
offset, kept, and the messages published in the last 1, 5 and 60 minutes each differ
here (messages aged by hand, the oldest deleted as retention does), and the topics come
busiest first (the last hour's count), not by name, last publish or last minute."""

from __future__ import annotations

import io
import json
import re
from html.parser import HTMLParser

import pytest
from django.core.management import call_command
from django.db import connection

from tests.topic_ops_support import forget_before, publish

pytestmark = pytest.mark.django_db(transaction=True)

#: zebra's offsets by age: 1-5 two hours old (1-3 then deleted), 6-7 half an hour,
#: 8-10 three minutes, 11-12 ten seconds. So: last offset 12, kept 9, 1m 2, 5m 5, 60m 7.
AGED = [(1, 5, "2 HOUR"), (6, 7, "30 MINUTE"), (8, 10, "3 MINUTE"), (11, 12, "10 SECOND")]
#: (last offset, kept, 1m, 5m, 60m): zebra first, its last hour the busier; aardvark
#: comes first by name, by last publish (newest) and by last minute (3 to zebra's 2).
ZEBRA = ("12", "9", "2", "5", "7")
AARDVARK = ("3", "3", "3", "3", "3")


@pytest.fixture
def topics() -> dict[str, str]:
    """The two topics; their last publish times, as queuestats writes them."""
    publish("zebra", 12)
    with connection.cursor() as cursor:
        for first, last, ago in AGED:
            cursor.execute(
                "UPDATE mysqlq_topic_message SET published_at = UTC_TIMESTAMP(6) - INTERVAL "
                f"{ago} WHERE topic = 'zebra' AND msg_offset BETWEEN %s AND %s",
                [first, last])
    forget_before("zebra", 4)  # retention deleted the three oldest
    publish("aardvark", 3)
    with connection.cursor() as cursor:
        cursor.execute("SELECT topic, MAX(published_at) FROM mysqlq_topic_message "
                       "GROUP BY topic")
        newest = {name: f"{when:%Y-%m-%d %H:%M:%S} UTC" for name, when in cursor.fetchall()}
    assert newest["aardvark"] > newest["zebra"]
    return newest


def test_queuestats_gives_each_column_its_own_count_busiest_first(topics) -> None:
    out = io.StringIO()
    call_command("queuestats", stdout=out)
    lines = out.getvalue().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("topic "))
    assert re.split(r"\s{2,}", lines[start]) == [
        "topic", "last-offset", "kept", "1m", "5m", "60m", "msg/s", "last-publish",
        "(busiest first)"]
    end = next((i for i in range(start, len(lines)) if not lines[i]), len(lines))
    rows = [re.split(r"\s{2,}", line) for line in lines[start + 1:end]]
    assert rows == [["zebra", *ZEBRA, "0.03", topics["zebra"]],
                    ["aardvark", *AARDVARK, "0.05", topics["aardvark"]]]
    out = io.StringIO()
    call_command("queuestats", "--json", stdout=out)
    data = json.loads(out.getvalue())["topics"]
    assert [(t["topic"], t["last_offset"], t["first_offset"], t["kept"], t["published"])
            for t in data] == [
        ("zebra", 12, 4, 9, {"1m": 2, "5m": 5, "60m": 7}),
        ("aardvark", 3, 1, 3, {"1m": 3, "5m": 3, "60m": 3})]


class TopicRows(HTMLParser):
    """The cells' texts of each row of the dashboard's topics table, by the row's id."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[str, list[str]] = {}
        self.order: list[str] = []
        self.row: str | None = None
        self.cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        name = dict(attrs).get("id") or ""
        if tag == "tr" and name.startswith("topic-"):
            self.row = name
            self.order.append(name)
            self.rows[name] = []
        elif tag == "td" and self.row is not None:
            self.cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self.row is not None and self.cell is not None:
            self.rows[self.row].append("".join(self.cell).strip())
            self.cell = None
        elif tag == "tr":
            self.row = None

    def handle_data(self, data: str) -> None:
        if self.cell is not None:
            self.cell.append(data)


def test_the_dashboard_gives_each_column_its_own_count_busiest_first(root, topics) -> None:
    page = root.get("/admin/django_mysqlq/queuestate/?refresh=0").content.decode()
    table = TopicRows()
    table.feed(page)
    assert table.order == ["topic-zebra", "topic-aardvark"]
    # topic, last offset, kept, last publish, 1 min, 5 min, 60 min, msg/s
    for name, counts, rate in (("zebra", ZEBRA, "0.03"), ("aardvark", AARDVARK, "0.05")):
        cells = table.rows[f"topic-{name}"]
        assert len(cells) == 8, cells
        assert (cells[0], *cells[1:3], *cells[4:8]) == (name, *counts, rate), cells
