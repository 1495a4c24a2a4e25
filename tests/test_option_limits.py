"""Option values the database can't hold, or that make no sense, are refused up front.

Every case raises ``InvalidTaskOptions`` (or the MYSQLQ check ``E001``) naming the
option, the value and the valid range, at decoration or at ``.using()``: never a raw
``ValueError``, ``OverflowError`` or ``DataError`` from deep inside an enqueue. The
property tests throw any float, int or timedelta at each option: it either enqueues or
is refused that way.
"""

from __future__ import annotations

import datetime as dt
import math

import pytest
from django.utils import timezone
from hypothesis import HealthCheck, example, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from django_mysqlq import InvalidTaskOptions, queue_task
from django_mysqlq.checks import check_settings
from django_mysqlq.models import Message
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

#: The documented longest delay, backoff, timeout or interval: 100 years of 365.25 days.
HUNDRED_YEARS = 3_155_760_000
#: The documented largest max_attempts.
MOST_ATTEMPTS = 1_000_000

HYPOTHESIS = hypothesis_settings(
    max_examples=60, deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def module_level() -> None:
    """A function to decorate (never registered under its own name twice: see name=)."""


def decorate(**options: object) -> object:
    return queue_task(name="tests.limits.probe", **options)(module_level)  # type: ignore[call-overload]


# --------------------------------------------------------------------------- decorator


@pytest.mark.parametrize(("option", "value", "expected"), [
    ("max_attempts", 2**40, "from 1 to 1000000"),
    ("max_attempts", MOST_ATTEMPTS + 1, "from 1 to 1000000"),
    ("max_attempts", 0, "from 1 to 1000000"),
    ("retry_backoff", math.inf, "from 0 to 3155760000"),
    ("retry_backoff", math.nan, "from 0 to 3155760000"),
    ("retry_backoff", -1, "from 0 to 3155760000"),
    ("retry_backoff", 1e300, "from 0 to 3155760000"),
    ("timeout", math.inf, "3155760000"),
    ("timeout", -math.inf, "3155760000"),
    ("timeout", math.nan, "3155760000"),
    ("timeout", 0, "3155760000"),
])
def test_decorator_options_out_of_range_are_refused_naming_option_value_and_range(
        option, value, expected):
    with pytest.raises(InvalidTaskOptions) as caught:
        decorate(**{option: value})
    text = str(caught.value)
    assert option in text and repr(value) in text and expected in text, text


def test_the_largest_documented_values_enqueue_and_are_stored_exactly():
    task = decorate(max_attempts=MOST_ATTEMPTS, retry_backoff=HUNDRED_YEARS,
                    timeout=HUNDRED_YEARS)
    handle = task.using(delay=HUNDRED_YEARS).enqueue()
    message = Message.objects.get(pk=handle.id)
    assert (message.max_attempts, message.retry_backoff, message.timeout, message.status) == (
        MOST_ATTEMPTS, HUNDRED_YEARS, HUNDRED_YEARS, "scheduled")
    assert message.run_at.year >= timezone.now().year + 99


# --------------------------------------------------------------------------- delay, run_at


@pytest.mark.parametrize("delay", [
    math.nan, math.inf, -math.inf, -1, -0.5, 3e11, HUNDRED_YEARS + 1, 10**400,
    dt.timedelta(days=999_999_999), dt.timedelta(seconds=-1), dt.timedelta(days=36_600),
])
def test_delays_out_of_range_are_refused_naming_the_range(delay):
    with pytest.raises(InvalidTaskOptions, match=r"delay must be .*3155760000") as caught:
        tasks.record.using(delay=delay)
    assert repr(delay) in str(caught.value)


def far_offset(hours: int) -> dt.timezone:
    return dt.timezone(dt.timedelta(hours=hours))


@pytest.mark.parametrize("run_at", [
    dt.datetime(1, 1, 1, tzinfo=far_offset(5)),  # before year 1 in UTC
    dt.datetime(9999, 12, 31, 23, tzinfo=far_offset(-5)),  # after 9999 in UTC
    dt.datetime(9999, 12, 31, 23, tzinfo=dt.UTC),  # the database could hold it: too far
    dt.datetime.max.replace(tzinfo=dt.UTC),
])
def test_run_at_out_of_range_is_refused(run_at):
    with pytest.raises(InvalidTaskOptions,
                       match=r"run_at must lie between year 1 .*100 years from now") as caught:
        tasks.record.using(run_at=run_at)
    assert repr(run_at) in str(caught.value)


def test_run_at_in_the_distant_past_is_ready_now():
    handle = tasks.record.using(run_at=dt.datetime(1, 1, 1, 5, tzinfo=far_offset(5))) \
        .enqueue("old")
    assert Message.objects.get(pk=handle.id).status == "ready"


# --------------------------------------------------------------------------- properties


def enqueues_or_refuses(make: object) -> None:
    """``make()`` either enqueues (and the row is what was asked) or refuses cleanly."""
    try:
        handle = make()  # type: ignore[operator]
    except InvalidTaskOptions:
        return
    Message.objects.filter(pk=handle.id).delete()


NUMBERS = st.one_of(st.floats(), st.integers(), st.integers(min_value=-2**70, max_value=2**70))
DURATIONS = st.one_of(NUMBERS, st.timedeltas())


@HYPOTHESIS
@given(delay=DURATIONS)
@example(delay=3e11)
@example(delay=dt.timedelta.max)
@example(delay=2**63)
def test_any_delay_enqueues_or_is_refused(delay):
    enqueues_or_refuses(lambda: tasks.record.using(delay=delay).enqueue("d"))


@HYPOTHESIS
@given(moment=st.datetimes(timezones=st.timezones()))
@example(moment=dt.datetime.min.replace(tzinfo=far_offset(23)))
def test_any_run_at_enqueues_or_is_refused(moment):
    enqueues_or_refuses(lambda: tasks.record.using(run_at=moment).enqueue("r"))


@HYPOTHESIS
@given(option=st.sampled_from(["max_attempts", "retry_backoff", "timeout"]), value=NUMBERS)
@example(option="max_attempts", value=2**40)
@example(option="retry_backoff", value=math.inf)
@example(option="timeout", value=math.nan)
def test_any_decorator_number_enqueues_or_is_refused(option, value):
    def make() -> object:
        return decorate(**{option: value}).enqueue()  # type: ignore[attr-defined]

    enqueues_or_refuses(make)


# --------------------------------------------------------------------------- MYSQLQ


@pytest.mark.parametrize(("value", "fragment"), [
    ({"LEASE_SECONDS": 1e300}, "LEASE_SECONDS"),
    ({"LEASE_SECONDS": math.inf}, "LEASE_SECONDS"),
    ({"GRACE_SECONDS": 10**400}, "GRACE_SECONDS"),
    ({"POLL_SECONDS": 1e12}, "POLL_SECONDS"),
    ({"RETRY_BACKOFF": math.nan}, "RETRY_BACKOFF"),
    ({"RETRY_BACKOFF": 1e20}, "RETRY_BACKOFF"),
    ({"RETRY_BACKOFF_MAX": 1e300}, "RETRY_BACKOFF_MAX"),
    ({"SUMMARY_SECONDS": 1e300}, "SUMMARY_SECONDS"),
    ({"MAX_ATTEMPTS": 2**40}, "from 1 to 1000000"),
    ({"BATCH_SIZE": 10**12}, "BATCH_SIZE"),
    ({"ACK_BATCH_SIZE": 10**12}, "ACK_BATCH_SIZE"),
    ({"MAX_PAYLOAD_BYTES": 2**40}, "MAX_PAYLOAD_BYTES"),
    ({"DEFAULT_QUEUE": "a,b"}, "without commas"),
    ({"DEFAULT_QUEUE": " padded"}, "surrounding whitespace"),
    ({"DEFAULT_QUEUE": "caf\udce9"}, "UTF-8"),
    ({"DEAD_RETENTION_SECONDS": math.nan}, "DEAD_RETENTION_SECONDS"),
    ({"DEAD_RETENTION_SECONDS": 0}, "DEAD_RETENTION_SECONDS"),
    ({"WORKER_RETENTION_SECONDS": 1e300}, "WORKER_RETENTION_SECONDS"),
    ({"WORKER_RETENTION_SECONDS": "7d"}, "WORKER_RETENTION_SECONDS"),
])
def test_settings_out_of_range_are_E001(settings, value, fragment):
    settings.MYSQLQ = value
    [error] = check_settings()
    assert error.id == "django_mysqlq.E001"
    assert fragment in error.msg, error.msg


def test_retention_settings_default_and_accept_none(settings):
    from django_mysqlq.conf import get_settings

    settings.MYSQLQ = {}
    conf = get_settings()
    assert (conf.DEAD_RETENTION_SECONDS, conf.WORKER_RETENTION_SECONDS) == (None, 7 * 86400)
    settings.MYSQLQ = {"DEAD_RETENTION_SECONDS": 30 * 86400, "WORKER_RETENTION_SECONDS": None}
    assert check_settings() == []
    conf = get_settings()
    assert (conf.DEAD_RETENTION_SECONDS, conf.WORKER_RETENTION_SECONDS) == (30 * 86400, None)


# --------------------------------------------------------------------------- worker queues


@pytest.mark.parametrize("queue", ["caf\udce9", "x" * 65, ""])
def test_a_worker_refuses_queue_names_that_can_never_be_queues(queue):
    from django_mysqlq.worker import WorkerOptions

    with pytest.raises(ValueError, match="without commas or surrounding whitespace"):
        WorkerOptions.build([queue])


@pytest.mark.parametrize("group", ["a:b", "g" * 59])
def test_a_worker_refuses_group_names_that_can_never_be_groups(group):
    from django.core.management import call_command
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match=r"--groups: A consumer group name must be .* at "
                       r"most 58 characters, without commas, colons"):
        call_command("runqueueworker", "--groups", f"billing,{group}", "--burst")


@pytest.mark.parametrize(("options", "fragment"), [
    ({"burst_wait": math.nan}, "burst_wait"),
    ({"burst_wait": math.inf}, "burst_wait"),
    ({"burst_wait": 1e300}, "burst_wait"),
    ({"batch": 10**12}, "from 1 to 10000"),
])
def test_worker_options_the_database_cant_hold_are_refused(options, fragment):
    from django_mysqlq.worker import WorkerOptions

    with pytest.raises(ValueError, match=fragment):
        WorkerOptions.build(["default"], **options)
