"""``queuetopic lookup`` past its limit: a key's older messages (``--before-offset``, or
``--key`` with ``--since``/``--until``) and a time range's later ones, as it says."""

from __future__ import annotations

import datetime as dt
import io
import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_mysqlq import Topic, broker
from django_mysqlq.broker import topic_lookup
from django_mysqlq.models import TopicMessage

pytestmark = pytest.mark.django_db(transaction=True)

KEY = "customer-42"


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("queuetopic", "lookup", "--topic", "orders", *args, stdout=out)
    return out.getvalue()


def offsets(*args: str) -> list[int]:
    return [m["offset"] for m in json.loads(run(*args, "--json"))["messages"]]


@pytest.fixture
def keyed() -> None:
    """Offsets 1-12 of key customer-42, 13-14 of another key."""
    Topic("orders").publish_many([{"n": i} for i in range(14)],
                                 keys=[KEY] * 12 + ["other"] * 2)
    broker.sequence("orders")


def test_a_keys_older_messages_past_the_largest_limit_are_reached(keyed, monkeypatch) -> None:
    """A key with more messages than LOOKUP_MAX showed the newest ones only and said
    "Narrow the range or raise --limit" though --limit was at its largest and --key
    with --since/--until was refused: the older ones could not be looked up."""
    monkeypatch.setattr(topic_lookup, "LOOKUP_MAX", 5)
    first = run("--key", KEY, "--limit", "5")
    assert [line.split()[0] for line in first.splitlines()[:5]] == [
        f"orders@{n}" for n in (12, 11, 10, 9, 8)]
    assert (f"More messages of key '{KEY}' match: only the newest 5 are shown, down to "
            "offset 8. For the older ones, run the same lookup with --before-offset 8.") in first
    assert "raise --limit" not in first  # it is at its largest
    assert json.loads(run("--key", KEY, "--limit", "5", "--json"))["next"] == {
        "before_offset": 8}
    assert offsets("--key", KEY, "--limit", "5", "--before-offset", "8") == [7, 6, 5, 4, 3]
    last = run("--key", KEY, "--limit", "5", "--before-offset", "3")
    assert [line.split()[0] for line in last.splitlines()] == ["orders@2", "orders@1"]
    below_limit = run("--key", KEY, "--limit", "3")
    assert "--before-offset 10, or raise --limit (up to 5)." in below_limit
    data = json.loads(run("--key", KEY, "--limit", "3", "--before-offset", "2", "--json"))
    assert ([m["offset"] for m in data["messages"]], data["truncated"], data["next"]) == (
        [1], False, None)


def test_a_key_with_a_time_range(keyed) -> None:
    TopicMessage.objects.filter(topic="orders", offset__lte=6).update(
        published_at=dt.datetime.now(dt.UTC) - dt.timedelta(days=2))
    assert offsets("--key", KEY, "--until", "1d") == [6, 5, 4, 3, 2, 1]
    assert offsets("--key", KEY, "--since", "1d") == [12, 11, 10, 9, 8, 7]
    assert offsets("--key", KEY, "--since", "3d", "--until", "1d", "--limit", "4") == [
        6, 5, 4, 3]
    assert offsets("--key", KEY, "--until", "1d", "--before-offset", "3") == [2, 1]
    assert offsets("--key", "other", "--until", "1d") == []


def test_a_time_ranges_later_messages_are_reached_from_the_last_shown(keyed) -> None:
    text = run("--since", "1h", "--limit", "10")
    data = json.loads(run("--since", "1h", "--limit", "10", "--json"))
    last = data["messages"][-1]
    assert data["truncated"] and data["next"] == {"since": last["published_at"],
                                                  "after_id": last["id"]}
    assert (f"For the later ones, run the same lookup with --since {last['published_at']} "
            f"--after-id {last['id']}") in text
    later = offsets("--since", last["published_at"], "--after-id", str(last["id"]))
    assert later == [11, 12, 13, 14]  # after the last shown, none again


def follow(*args: str, pages: int = 40) -> list[int]:
    """The offsets of every page, from the first lookup following ``next`` till it is
    absent (at most ``pages`` pages: a ``next`` that doesn't move on would loop)."""
    seen: list[int] = []
    extra: list[str] = []
    for _ in range(pages):
        data = json.loads(run(*args, *extra, "--json"))
        seen += [m["offset"] for m in data["messages"]]
        if data["next"] is None:
            return seen
        extra = [item for name, value in data["next"].items()
                 for item in (f"--{name.replace('_', '-')}", str(value))]
    raise AssertionError(f"next still given after {pages} pages: {len(seen)} offsets seen, "
                         f"{len(set(seen))} of them different")


def test_a_time_ranges_pages_visit_messages_of_one_instant_once_each() -> None:
    """publish_many() gives its rows one publish time: a next page from the last shown's
    time (--since T) showed the same first 100 again, and `next` looped forever; the
    messages past them were out of reach. Paged on (time, id), each comes once."""
    before = (dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)).isoformat()
    Topic("orders").publish_many([{"n": i} for i in range(150)])
    broker.sequence("orders")
    assert TopicMessage.objects.filter(topic="orders").values("published_at").distinct(
        ).count() == 1
    assert sorted(follow("--since", before)) == list(range(1, 151))
    assert sorted(follow("--since", before, "--limit", "7")) == list(range(1, 151))
    until = (dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5)).isoformat()
    assert sorted(follow("--since", before, "--until", until, "--limit", "60")) == list(
        range(1, 151))


def test_after_id_needs_a_time_range_from_since(keyed) -> None:
    with pytest.raises(CommandError, match="--after-id pages through a time range"):
        run("--until", "1h", "--after-id", "5")
    with pytest.raises(CommandError, match="--after-id pages through a time range"):
        run("--key", KEY, "--since", "1h", "--after-id", "5")


def test_before_offset_needs_a_key_and_a_lower_bound_above_1(keyed) -> None:
    with pytest.raises(CommandError, match="--before-offset pages through a key"):
        run("--since", "1h", "--before-offset", "5")
    with pytest.raises(CommandError, match="--before-offset must be 2 or more"):
        run("--key", KEY, "--before-offset", "1")
    with pytest.raises(CommandError, match="one of"):
        run("--offset", "3", "--key", KEY)


def test_a_long_payload_is_cut_saying_so_and_json_says_why_nothing_matched() -> None:
    Topic("longone").publish({"note": "x" * 300, "tail": "END"}, key="long")
    broker.sequence("longone")
    out = lookup_on("--topic", "longone", "--key", "long")
    assert "… (" in out and "chars; --json for all)" in out and "END" not in out
    whole = json.loads(lookup_on("--topic", "longone", "--key", "long", "--json"))
    assert whole["reason"] is None and whole["messages"][0]["payload"].endswith('"END"}')
    missing = json.loads(lookup_on("--topic", "longone", "--offset", "9", "--json"))
    assert missing["messages"] == []
    assert missing["reason"] == ("No message matches: topic 'longone' has given offsets up "
                                 "to 1 so far.")
    unknown = json.loads(lookup_on("--topic", "nosuch", "--offset", "1", "--json"))
    assert "no message of topic 'nosuch' has an offset yet" in unknown["reason"]


def lookup_on(*args: str) -> str:
    out = io.StringIO()
    call_command("queuetopic", "lookup", *args, stdout=out)
    return out.getvalue()
