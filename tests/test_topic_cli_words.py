"""What ``queuetopic`` and ``queuestats`` say: the last run's time in a trace, the topics'
last publish, and errors that name the options to fix (a review of docs/streams.md
against the commands)."""

from __future__ import annotations

import io
import json
import re

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from django_mysqlq import broker
from django_mysqlq.messages import AttemptResult
from tests.operator_support import OPERATOR, RUNNER
from tests.topic_ops_support import claim, group, handle, publish

pytestmark = pytest.mark.django_db(transaction=True)


def run(command: str, *args: str) -> str:
    out = io.StringIO()
    call_command(command, *args, stdout=out)
    return out.getvalue()


def test_a_trace_gives_the_last_run_s_time_not_a_later_requeue_s() -> None:
    """docs/streams.md: the time after the state is that of the last run. A dead delivery
    requeued later showed the requeue's time."""
    made = group("orders", "billing")
    publish("orders", 1)
    broker.pump(made, batch=100, window=100)
    [dead] = handle(made, 1, fail=True)
    with connection.cursor() as cursor:  # the run an hour before the requeue
        cursor.execute("UPDATE mysqlq_attempt SET finished_at = finished_at - INTERVAL 1 HOUR"
                       " WHERE message_id = %s", [dead])
        cursor.execute("SELECT finished_at FROM mysqlq_attempt WHERE message_id = %s", [dead])
        [(ran,)] = cursor.fetchall()
    assert broker.requeue([dead], OPERATOR) == [dead]
    [message] = json.loads(run("queuetopic", "lookup", "--topic", "orders", "--offset", "1",
                               "--json"))["messages"]
    [delivery] = message["deliveries"]
    assert delivery["handled_at"].startswith(ran.strftime("%Y-%m-%dT%H:%M:%S"))
    assert f" at {ran:%Y-%m-%d %H:%M:%S}" in run("queuetopic", "lookup", "--topic", "orders",
                                                  "--offset", "1")


def test_queuestats_shows_each_topic_s_last_publish_and_a_rate_of_two_decimals() -> None:
    publish("orders", 1)
    broker.sequence("orders")
    with connection.cursor() as cursor:
        cursor.execute("SELECT MAX(published_at) FROM mysqlq_topic_message")
        [(last,)] = cursor.fetchall()
    text = run("queuestats")
    lines = text.splitlines()
    [header] = [line for line in lines if line.startswith("topic ")]
    [row] = [line for line in lines if line.startswith("orders ")]
    assert re.split(r"\s{2,}", row) == ["orders", "1", "1", "1", "1", "1", "0.02",
                                        f"{last:%Y-%m-%d %H:%M:%S} UTC"]
    # The columns line up (they were joined with two spaces, whatever their widths).
    assert header.index("msg/s") + len("msg/s") == row.index("0.02") + len("0.02")
    assert header.index("last-publish") + len("last-publish") == len(row)
    [topic] = json.loads(run("queuestats", "--json"))["topics"]
    assert topic["rate_per_second"] == 0.02
    assert topic["last_publish"].startswith(f"{last:%Y-%m-%dT%H:%M:%S}")


@pytest.mark.parametrize(("args", "says"), [
    (("lookup", "--topic", "orders"), "an offset (--offset), a key (--key, with "
     "--since/--until or --before-offset to go back further) or a time range (--since "
     "and/or --until)"),
    (("lookup", "--topic", "orders", "--offset", "1", "--key", "k"), "Look messages up by "
     "one of:"),
    (("lookup", "--topic", "orders", "--offset", "1", "--limit", "5000"),
     "1 to 1000 messages (--limit), not 5000"),
    (("lookup", "--topic", "orders", "--since", ""), "expected a duration (2h, 3d) or an ISO "
     "date/time"),
    (("reset", "billing", "--topic", "orders", "--to-time", ""), "expected a duration (2h, "
     "3d) or an ISO date/time"),
    (("replay", "--group", "nosuch", "--topic", "orders", "--from-offset", "1", "--to-offset", "1"),
     "has no consumer group 'nosuch' (a group is created by the first worker that runs its "
     "handler; manage.py queuetopic groups lists them)"),
    (("replay", "--group", "billing", "--topic", "orders", "--from-offset", "2",
      "--to-offset", "1"),
     "its first offset must be at most its last (--from-offset, --to-offset)"),
])
def test_errors_name_what_to_give(args: tuple[str, ...], says: str) -> None:
    group("orders", "billing")
    publish("orders", 2)
    with pytest.raises(CommandError) as raised:
        run("queuetopic", *args)
    assert says in str(raised.value)


def _lookup_options() -> set[str]:
    import argparse

    from django_mysqlq.management.commands.queuetopic import Command

    parser = Command().create_parser("manage.py", "queuetopic")
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return {name for action in sub.choices["lookup"]._actions
            for name in action.option_strings}


@pytest.mark.parametrize("given", [[], ["--offset", "1", "--key", "k"],
                                   ["--offset", "1", "--since", "1h"],
                                   ["--since", "1h", "--before-offset", "5"]])
def test_lookup_s_refusal_names_only_the_options_lookup_has(given: list[str]) -> None:
    """It said ``--offset, with --to-offset for a range``: lookup has no --to-offset."""
    import re

    with pytest.raises(CommandError) as raised:
        run("queuetopic", "lookup", "--topic", "orders", *given)
    named = set(re.findall(r"--[a-z][a-z-]*", str(raised.value)))
    assert named and named <= _lookup_options(), (named, str(raised.value))


#: A date and time as the text outputs print them (to the minute or the second) with no
#: zone after it: UTC, or a schedule's own zone ("16:33:51 CST", in queuestats' schedules
#: section when an earlier test left schedules in the table).
PRINTED_TIME = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d(?::\d\d)?(?![\d:]| [A-Z]{2,5}\b)")


def test_every_time_the_topic_commands_print_says_it_is_utc() -> None:
    """The lookup's publish, run and next-try times, the trace's "moved past it by … at",
    the groups table's ``changed`` and ``queuestats``' last publish were printed without
    a zone (UTC, unlike what queueschedule, queuepurge, queuepipeline and the pump
    problem's "since" print): each now ends in ``UTC``. ``--json`` stays ISO 8601 with
    ``+00:00``."""
    made = group("orders", "billing")
    publish("orders", 4)
    broker.pump(made, batch=2, window=100)
    first, second = claim(made, 2)
    broker.fail(first, RUNNER, AttemptResult(
        started_at=broker.database_now(), error_class="RuntimeError",
        error_message="card declined", traceback="..."), retry=True, retry_in=600)
    broker.ack(second, RUNNER, AttemptResult(started_at=broker.database_now()))
    traced = run("queuetopic", "lookup", "--topic", "orders", "--since", "1h")
    assert " published " in traced and ", next try at " in traced and " at " in traced
    [message, *_] = json.loads(run("queuetopic", "lookup", "--topic", "orders", "--since",
                                   "1h", "--json"))["messages"]
    [delivery] = message["deliveries"]
    assert message["published_at"].endswith("+00:00")
    assert delivery["next_try_at"].endswith("+00:00")
    broker.reset_group("orders", "billing", broker.ResetTarget(to_offset=4), OPERATOR)
    blamed = run("queuetopic", "lookup", "--topic", "orders", "--offset", "3")
    assert "moved past it by" in blamed
    listed = run("queuetopic", "groups")
    stats = run("queuestats")
    for text, times in ((traced, 7), (blamed, 2), (listed, 1), (stats, 1)):
        assert len(re.findall(r"\d{4}-\d\d-\d\d \d\d:\d\d", text)) >= times, text
        assert not PRINTED_TIME.findall(text), text
