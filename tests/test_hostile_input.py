"""Hostile and broken input: the enqueue API and real workers must not crash or lose work.

Every case ends in one of two ways: a clear error at enqueue (the exception type, and a
message that says what to do), or one dead message that records why. Worker cases put
good messages before and after the bad ones and check that all of them succeeded and that
the ``--burst`` worker exits 0: the bad message must neither crash the worker nor hold
up its neighbours.

Each case here was first written as a strict xfail against the bug it exposed, then fixed;
the git history of this file keeps the bug reports.

Timeouts below are liveness bounds (how long to wait before calling a test failed),
never performance assertions.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
from typing import Any

import pytest
from django.db import DatabaseError, connection
from hypothesis import HealthCheck, example, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from django_mysqlq import (
    ArgumentEncodingError,
    InvalidTaskOptions,
    PayloadTooLarge,
    QueueTask,
    broker,
    payload,
)
from django_mysqlq.models import Attempt, Message
from tests.burst import assert_dead, assert_succeeded, enqueue_good, run_burst
from tests.testapp import tasks
from tests.testapp.models import Ledger

pytestmark = pytest.mark.django_db(transaction=True)

#: A shorter bound for cases that used to wedge the worker: fail fast if they regress.
STUCK_PATIENCE = 12.0

#: Strings that break naive SQL building, %-formatting, escaping or encodings.
NASTY_STRINGS = [
    "'; DROP TABLE mysqlq_message; --",
    "\"; DROP TABLE mysqlq_message; --",
    "' OR '1'='1",
    "` OR 1=1 #",
    "%s",
    "%%s",
    "%(x)s",
    "{0}{x}",
    "\\",
    "\\'",
    "\\0",
    "\\u0000",
    "\x00",
    "a\x00b",
    "\r\n\t\x1b[31m",
    "\u2028\u2029",
    "_%",
    "é",
    "ß",
    "İ",
    "😀",
    "👩‍👩‍👧",
    "\U0010ffff",
    "\ufeff",
    "NULL",
    "null",
    "",
]


# --------------------------------------------------------------------------- helpers


def nested_list(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


def corrupt(message_id: int, **columns: object) -> None:
    """Overwrite columns of a queued message, as a hostile or buggy writer would."""
    assert Message.objects.filter(pk=message_id).update(**columns) == 1


# --------------------------------------------------------------------------- enqueue: arguments


class Opaque:
    pass


@pytest.mark.parametrize("value", [
    Opaque(),
    {1, 2},
    frozenset({"a"}),
    b"bytes",
    bytearray(b"x"),
    dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
    dt.date(2024, 1, 1),
    decimal.Decimal("1.10"),
    float("nan"),
    float("inf"),
    -float("inf"),
    1 + 2j,
    {(1, 2): "tuple key"},
    ["ok", {"nested": object()}],
    10 ** 5000,  # more digits than Python will convert to text
], ids=lambda value: type(value).__name__)
def test_an_unencodable_argument_is_refused_naming_it_and_nothing_is_written(value):
    good = enqueue_good("before")
    with pytest.raises(ArgumentEncodingError) as positional:
        tasks.echo.enqueue(value)
    with pytest.raises(ArgumentEncodingError) as keyword:
        tasks.echo.enqueue(value=value)
    with pytest.raises(ArgumentEncodingError) as bulk:
        tasks.echo.enqueue_many([("fine",), tasks.echo.call("fine"), (value,)])
    for info in (positional, keyword, bulk):
        text = str(info.value)
        assert isinstance(info.value, TypeError)  # what json.dumps callers expect
        assert "can't be encoded as JSON" in text
        assert "pass a primary key or a plain dict" in text  # what to do instead
        assert "'tests.testapp.tasks.echo'" in text
    assert "Positional argument 0" in str(positional.value)
    assert "Argument 'value'" in str(keyword.value)
    assert list(Message.objects.values_list("pk", flat=True)) == [good]


def test_a_cyclic_argument_is_refused_naming_it():
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ArgumentEncodingError, match=r"Argument 'value'.*Circular reference"):
        tasks.echo.enqueue(value=loop)
    assert not Message.objects.exists()


def test_a_too_deeply_nested_argument_is_refused_with_a_clear_error():
    with pytest.raises(ArgumentEncodingError, match=r"Positional argument 0"):
        tasks.echo.enqueue(nested_list(5_000))
    assert not Message.objects.exists()


def test_tuples_become_lists_and_values_round_trip_as_json():
    """Document-by-test: JSON has no tuple, so the task receives a list."""
    positional = tasks.describe.enqueue((1, "two", (3,)))
    keyword = tasks.describe.enqueue(value=(None, True))
    assert Message.objects.get(pk=positional.id).decoded_payload() == {
        "args": [[1, "two", [3]]], "kwargs": {}}
    assert Message.objects.get(pk=keyword.id).decoded_payload() == {
        "args": [], "kwargs": {"value": [None, True]}}


@pytest.mark.parametrize("value", [
    {1: 2},
    {True: 1},
    {None: 1},
    {1.5: 1},
    {1: "int key", "1": "str key"},
], ids=["int", "bool", "none", "float", "colliding"])
def test_a_dict_with_non_str_keys_is_refused(value):
    with pytest.raises(ArgumentEncodingError, match=r"Positional argument 0"):
        tasks.echo.enqueue(value)
    assert not Message.objects.exists()


@pytest.mark.parametrize("value", [
    *NASTY_STRINGS,
    "\ud800",  # a lone surrogate: not valid Unicode text, yet a valid JSON escape
    {"'; DROP TABLE mysqlq_message; --": "%(x)s", "\x00": ["\\", "😀"]},
    [-0.0, 2 ** 64, -(2 ** 63) - 1, 1e308, 5e-324],
])
def test_nasty_values_round_trip_exactly_through_the_stored_payload(value):
    positional = tasks.echo.enqueue(value)
    keyword = tasks.echo.enqueue(value=value)
    for handle, expected in ((positional, ([value], {})), (keyword, ([], {"value": value}))):
        stored = Message.objects.get(pk=handle.id).payload
        assert stored.isascii()  # every non-ASCII character travels as a \u escape
        assert payload.decode(stored) == expected


# --------------------------------------------------------------------------- enqueue: size


def encoded_size(*args, **kwargs) -> int:
    return len(payload.encode("t", args, kwargs, 10 ** 9).encode())


def test_a_payload_over_max_payload_bytes_is_refused_and_nothing_is_written(settings):
    limit = 1_000
    settings.MYSQLQ = {**settings.MYSQLQ, "MAX_PAYLOAD_BYTES": limit}
    overhead = encoded_size("")
    at_limit = "x" * (limit - overhead)
    assert encoded_size(at_limit) == limit

    good = tasks.echo.enqueue(at_limit)  # exactly at the limit: accepted
    assert Message.objects.get(pk=good.id).payload == json.dumps(
        {"args": [at_limit], "kwargs": {}}, separators=(",", ":"))
    with pytest.raises(PayloadTooLarge) as info:
        tasks.echo.enqueue(at_limit + "x")
    text = str(info.value)
    assert isinstance(info.value, ValueError)
    assert f"encode to {limit + 1} bytes" in text
    assert "MYSQLQ['MAX_PAYLOAD_BYTES'] (1000)" in text
    assert "Store large data in a table or file and pass its key" in text
    # Bulk: one item over the limit writes none of them.
    with pytest.raises(PayloadTooLarge):
        tasks.echo.enqueue_many([("small",), (at_limit + "x",), ("small",)])
    # The limit counts encoded bytes: each "é" is the six ASCII bytes of its \u escape.
    with pytest.raises(PayloadTooLarge):
        tasks.echo.enqueue("é" * ((limit - overhead) // 6 + 1))
    assert list(Message.objects.values_list("pk", flat=True)) == [good.id]


@pytest.mark.worker
def test_a_payload_at_the_default_limit_runs_and_round_trips(start_worker):
    limit = 1_000_000  # MAX_PAYLOAD_BYTES default; the test settings keep it
    value = "'%s\\" * ((limit - encoded_size("")) // 5)  # 5 bytes: the backslash doubles
    value += "x" * (limit - encoded_size(value))
    assert encoded_size(value) == limit
    before = enqueue_good("before")
    big = tasks.echo.enqueue(value)
    after = enqueue_good("after")
    counts, _ = run_burst(start_worker)
    assert counts["succeeded"] == 3
    assert_succeeded(before, big.id, after)
    attempt = Attempt.objects.get(message_id=big.id)
    assert attempt.result == value
    assert json.loads(attempt.payload) == {"args": [value], "kwargs": {}}


def test_enqueue_many_of_payloads_under_the_limit_is_accepted():
    value = "x" * 900_000
    try:
        handles = tasks.echo.enqueue_many([(value,)] * 20)
    except DatabaseError:
        connection.close()  # the server may have dropped the connection
        raise
    assert Message.objects.filter(pk__in=[h.id for h in handles]).count() == 20


# --------------------------------------------------------------------------- enqueue: options


#: Fragments mixed into generated names: quoting, escaping, formatting, SQL, encodings.
NAME_FRAGMENTS = st.sampled_from([s for s in NASTY_STRINGS if s] + [
    "'", '"', "`", ";", "--", "/*", "*/", "#", "%", "%%", "%(", ")s", "\\%", "\\_", " ",
    "\t", "\x00", "\x7f", "ä", "中文", "\U0001d518", "🎉", "\U0001f600",
])
#: Any text that is valid Unicode (hypothesis leaves out surrogates by default).
ANY_TEXT = st.text(min_size=1, max_size=20)


def hostile_names(max_size: int) -> st.SearchStrategy[str]:
    return (st.lists(st.one_of(NAME_FRAGMENTS, ANY_TEXT), min_size=1, max_size=6)
            .map("".join).filter(lambda name: 1 <= len(name) <= max_size))


def queue_names() -> st.SearchStrategy[str]:
    """Hostile queue names, less what queue names may not hold (commas, outer whitespace)."""
    return hostile_names(64).map(lambda name: name.replace(",", ";").strip()).filter(bool)


HYPOTHESIS = hypothesis_settings(
    max_examples=40, deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@HYPOTHESIS
@given(queue=queue_names(), dedup_key=hostile_names(255), argument=hostile_names(100))
@example(queue="'; DROP TABLE mysqlq_message; --", dedup_key="%(x)s%s\\", argument="%s")
@example(queue="a\x00b", dedup_key="\x00", argument="\x00")
@example(queue="😀" * 64, dedup_key="🎉" * 255, argument="👩‍👩‍👧")
@example(queue="q\tq", dedup_key=" k,", argument=" ")
def test_hostile_queue_names_and_dedup_keys_round_trip_and_are_claimed(
        queue, dedup_key, argument):
    handle = tasks.echo.using(queue=queue, dedup_key=dedup_key).enqueue(argument)
    try:
        message = Message.objects.get(pk=handle.id)
        assert (message.queue, message.dedup_key) == (queue, dedup_key)
        assert payload.decode(message.payload) == ([argument], {})
        # The same key again is a duplicate: same message, nothing written.
        assert tasks.echo.using(queue=queue, dedup_key=dedup_key).enqueue("dup").id == handle.id
        claimed = broker.claim([queue], 10, "w", lease_seconds=30)
        assert [(c.id, c.queue) for c in claimed] == [(handle.id, queue)]
        assert payload.decode(claimed[0].payload) == ([argument], {})
    finally:
        Message.objects.filter(pk=handle.id).delete()
    assert not Message.objects.exists()


@HYPOTHESIS
@given(queue=st.one_of(st.just(""), st.text(min_size=65, max_size=80),
                       st.binary(min_size=1, max_size=10), st.integers(), st.lists(st.text()),
                       hostile_names(60).map(lambda name: name[:30] + "," + name[30:])))
def test_invalid_queue_names_are_refused(queue):
    """Too long, empty, not text, or holding a comma (worker queue lists are comma-separated)."""
    with pytest.raises(InvalidTaskOptions, match="queue must be a non-empty string of at most 64"):
        tasks.echo.using(queue=queue)


@HYPOTHESIS
@given(key=st.one_of(st.just(""), st.text(min_size=256, max_size=300),
                     st.binary(min_size=1, max_size=10), st.integers(), st.floats()))
def test_invalid_dedup_keys_are_refused(key):
    with pytest.raises(InvalidTaskOptions,
                       match="dedup_key must be a non-empty string of at most 255"):
        tasks.echo.using(dedup_key=key)


@pytest.mark.parametrize("option", ["queue", "dedup_key"])
def test_a_name_with_a_lone_surrogate_is_refused_with_a_clear_error(option):
    name = "caf\udce9"
    with pytest.raises(InvalidTaskOptions, match=option):
        task = tasks.echo.using(queue=name) if option == "queue" else tasks.echo.using(
            dedup_key=name)
        task.enqueue("x")
    assert not Message.objects.exists()


@pytest.mark.parametrize(("first", "second"), [
    ("Key", "key"), ("resume", "résumé"), ("k", "k "), ("😀", "🎉"), ("ß", "s")])
def test_distinct_dedup_keys_never_deduplicate_each_other(first, second):
    one = tasks.echo.using(dedup_key=first).enqueue(1)
    two = tasks.echo.using(dedup_key=second).enqueue(2)
    assert one.id != two.id
    assert sorted(Message.objects.values_list("dedup_key", flat=True), key=str) == sorted(
        [first, second])


@pytest.mark.parametrize(("mine", "other"), [
    ("Reports", "reports"), ("rêports", "reports"), ("reports ", "reports"), ("😀", "🎉")])
def test_a_claim_takes_only_messages_of_the_exact_queue_named(mine, other):
    theirs = tasks.echo.using(queue=other).enqueue("theirs")
    claimed = broker.claim([mine], 10, "w", lease_seconds=30)
    assert [c.id for c in claimed] == []
    assert Message.objects.get(pk=theirs.id).status == "ready"


@pytest.mark.parametrize("queue", [" padded", "padded ", "\tq", "q\n"])
def test_queue_names_a_worker_could_not_serve_are_refused(queue):
    with pytest.raises(InvalidTaskOptions):
        tasks.echo.using(queue=queue)


# --------------------------------------------------------------------------- worker: bad rows


@pytest.mark.worker
def test_unknown_task_names_are_deferred_alone_and_import_nothing(start_worker):
    """Never run, never imported; given back for a worker that knows them (a rolling
    deploy: tests/test_deploys.py), here on their last deferral, so they die."""
    before = enqueue_good("before")
    names = [
        "this.main",  # importing the stdlib module `this` would print the Zen of Python
        "os.system",
        "builtins.eval",
        "django_mysqlq.broker.recover",
        "tests.testapp.tasks.Ledger",  # a real attribute of a task module, not a task
        "tests.testapp.tasks.record ",  # a registered name plus a space
        "TESTS.TESTAPP.TASKS.RECORD",
        "'; DROP TABLE mysqlq_message; --",
        "",
    ]
    bad = {}
    for name in names:
        bad[name] = tasks.record.enqueue("should-not-run").id
        corrupt(bad[name], task_name=name, deferrals=12)
    after = enqueue_good("after")
    counts, output = run_burst(start_worker)
    assert (counts["succeeded"], counts["dead"], counts["retried"]) == (2, len(names), 0)
    assert_succeeded(before, after)
    for name, message_id in bad.items():
        message = assert_dead(message_id, ["failed"], "django_mysqlq.exceptions.UnknownTask")
        assert f"No task named {name!r} is registered in this worker" in message.last_error
        assert "MYSQLQ['TASK_MODULES']" in message.last_error  # what to do
    assert "Beautiful is better than ugly" not in output
    assert sorted(Ledger.objects.values_list("label", flat=True)) == ["after", "before"]


BAD_PAYLOADS = {
    "empty": ("", "not valid JSON"),
    "truncated": ('{"args": [', "not valid JSON"),
    "single quotes": ("{'args': []}", "not valid JSON"),
    "raw NUL in a string": ('{"args": ["\x00"], "kwargs": {}}', "not valid JSON"),
    "byte order mark": ('\ufeff{"args": [], "kwargs": {}}', "not valid JSON"),
    "trailing garbage": ('{"args": [], "kwargs": {}}; DROP TABLE x', "not valid JSON"),
    "huge integer": ('{"args": [1' + "0" * 5000 + '], "kwargs": {}}', "not valid JSON"),
    "null": ("null", "must be a JSON object"),
    "list": ('["a"]', "must be a JSON object"),
    "string": ('"{\\"args\\": []}"', "must be a JSON object"),
    "number": ("42", "must be a JSON object"),
    "args a string": ('{"args": "abc", "kwargs": {}}', "must be a JSON object"),
    "args an object": ('{"args": {"0": "a"}, "kwargs": {}}', "must be a JSON object"),
    "args null": ('{"args": null}', "must be a JSON object"),
    "kwargs a list": ('{"args": [], "kwargs": [["label", "a"]]}', "must be a JSON object"),
    "kwargs a string": ('{"args": ["a"], "kwargs": "x"}', "must be a JSON object"),
}


@pytest.mark.worker
def test_corrupt_payloads_die_alone_with_the_reason(start_worker):
    before = enqueue_good("before")
    bad = {}
    for case, (text, _) in BAD_PAYLOADS.items():
        bad[case] = tasks.record.enqueue(case).id
        corrupt(bad[case], payload=text)
        assert Message.objects.get(pk=bad[case]).payload == text  # stored as written
    after = enqueue_good("after")
    counts, _ = run_burst(start_worker)
    assert (counts["succeeded"], counts["dead"], counts["retried"]) == (2, len(bad), 0)
    assert_succeeded(before, after)
    for case, (_, reason) in BAD_PAYLOADS.items():
        message = assert_dead(bad[case], ["failed"],
                              "django_mysqlq.exceptions.PayloadDecodeError")
        assert reason in message.last_error, case
    assert sorted(Ledger.objects.values_list("label", flat=True)) == ["after", "before"]


@pytest.mark.worker
def test_arguments_that_dont_fit_the_signature_fail_like_any_error_with_retries(start_worker):
    before = enqueue_good("before")
    cases = {
        "unknown keyword": '{"args": ["a"], "kwargs": {"nope": 1}}',
        "keyword twice": '{"args": ["a"], "kwargs": {"label": "b"}}',
        "empty keyword": '{"args": ["a"], "kwargs": {"": 1}}',
        "keyword with NUL": '{"args": ["a"], "kwargs": {"val\\u0000ue": 1}}',
        "SQL keyword": '{"args": ["a"], "kwargs": {"\'; DROP TABLE x; --": 1}}',
        "missing argument": '{"args": [], "kwargs": {}}',
        "too many": '{"args": ["a", 1, 2, 3], "kwargs": {}}',
        "no keys at all": "{}",
    }
    bad = {}
    for case, text in cases.items():
        bad[case] = tasks.record.enqueue(case).id  # record: 3 attempts, backoff 0.1 s
        corrupt(bad[case], payload=text)
    after = enqueue_good("after")
    counts, _ = run_burst(start_worker, "--concurrency", "2")
    assert (counts["succeeded"], counts["retried"], counts["dead"]) == (
        2, 2 * len(cases), len(cases))
    assert_succeeded(before, after)
    for case, message_id in bad.items():
        message = assert_dead(message_id, ["retried", "retried", "failed"], "builtins.TypeError")
        assert "record()" in message.last_error, case
    assert sorted(Ledger.objects.values_list("label", flat=True)) == ["after", "before"]


@pytest.mark.worker
def test_a_too_deeply_nested_payload_dies_alone(start_worker):
    before = enqueue_good("before")
    bad = tasks.record.enqueue("deep").id
    corrupt(bad, payload='{"args": [' + "[" * 100_000 + "]" * 100_000 + '], "kwargs": {}}')
    after = enqueue_good("after")
    run_burst(start_worker, patience=STUCK_PATIENCE)
    assert_succeeded(before, after)
    message = assert_dead(bad, ["failed"], "django_mysqlq.exceptions.PayloadDecodeError")
    assert "nest" in message.last_error.lower() or "recursion" in message.last_error.lower()


@pytest.mark.worker
def test_a_retry_after_very_many_attempts_is_scheduled_not_crashed(start_worker):
    """2 ** 1500 overflows a float: the delay must still come out as RETRY_BACKOFF_MAX."""
    before = enqueue_good("before")
    bad = tasks.always_fails.enqueue("many").id
    corrupt(bad, attempts=1_500, max_attempts=1_502, retry_backoff=0.000001)
    after = enqueue_good("after")
    run_burst(start_worker, patience=STUCK_PATIENCE)
    assert_succeeded(before, after)
    message = Message.objects.get(pk=bad)
    assert message.status == "scheduled", message.last_error
    assert [a.outcome for a in Attempt.objects.for_message(bad)] == ["retried"]
    with connection.cursor() as cursor:
        cursor.execute("SELECT TIMESTAMPDIFF(SECOND, UTC_TIMESTAMP(6), run_at) "
                       "FROM mysqlq_message WHERE id = %s", [bad])
        (delay,) = cursor.fetchone()
    cap = 3600  # RETRY_BACKOFF_MAX's default
    assert cap - 120 <= delay <= cap


# --------------------------------------------------------------------------- worker: values


@pytest.mark.worker
def test_nasty_arguments_reach_the_task_exactly(start_worker):
    values = [*NASTY_STRINGS,
              {"'; DROP TABLE mysqlq_message; --": "%(x)s", "\x00": ["\\", "😀", None]},
              [-0.0, 2 ** 64, -(2 ** 63) - 1, 1e308, 5e-324, True, None],
              "'" * 10_000]
    before = enqueue_good("before")
    handles = tasks.echo.enqueue_many([(value,) for value in values])
    keyword = tasks.echo.enqueue(value="'; DROP TABLE mysqlq_message; --")
    after = enqueue_good("after")
    counts, _ = run_burst(start_worker, "--concurrency", "2")
    assert counts["succeeded"] == len(values) + 3
    assert_succeeded(before, after, keyword.id, *(h.id for h in handles))
    for handle, value in zip(handles, values, strict=True):
        assert Attempt.objects.get(message_id=handle.id).result == value
    assert Attempt.objects.get(message_id=keyword.id).result == (
        "'; DROP TABLE mysqlq_message; --")


@pytest.mark.worker
def test_odd_json_values_reach_the_task_as_json_made_them(start_worker):
    """Document-by-test: tuples arrive as lists; a lone surrogate arrives intact."""
    tuple_arg = tasks.describe.enqueue((1, (2, 3)))
    surrogate = tasks.describe.enqueue("caf\udce9")
    counts, _ = run_burst(start_worker)
    assert counts["succeeded"] == 2
    assert Attempt.objects.get(message_id=tuple_arg.id).result == {
        "type": "list", "ascii": "[1, [2, 3]]"}
    assert Attempt.objects.get(message_id=surrogate.id).result == {
        "type": "str", "ascii": "'caf\\udce9'"}


@pytest.mark.worker
def test_a_result_with_a_lone_surrogate_does_not_wedge_the_worker(start_worker):
    before = enqueue_good("before")
    odd = tasks.echo.enqueue("caf\udce9")
    after = enqueue_good("after")
    run_burst(start_worker, patience=STUCK_PATIENCE)
    assert_succeeded(before, after, odd.id)


@pytest.mark.worker
def test_an_error_message_with_a_lone_surrogate_is_recorded(start_worker):
    before = enqueue_good("before")
    odd = tasks.fails_on_undecodable_name.enqueue("undecodable")
    after = enqueue_good("after")
    run_burst(start_worker, patience=STUCK_PATIENCE)
    assert_succeeded(before, after)
    message = assert_dead(odd.id, ["retried", "failed"], "builtins.ValueError")
    assert "can't process caf" in message.last_error


@pytest.mark.worker
def test_a_too_deeply_nested_result_is_dropped_like_any_unencodable_result(start_worker):
    before = enqueue_good("before")
    deep = tasks.returns_nested.enqueue(5_000)
    after = enqueue_good("after")
    run_burst(start_worker, patience=STUCK_PATIENCE)
    assert_succeeded(before, after, deep.id)
    assert Attempt.objects.get(message_id=deep.id).result is None


@pytest.mark.worker
def test_a_result_over_max_allowed_packet_does_not_wedge_the_worker(start_worker):
    before = enqueue_good("before")
    big = tasks.returns_big_string.enqueue(20 * 2 ** 20)
    after = enqueue_good("after")
    run_burst(start_worker, patience=STUCK_PATIENCE)
    assert_succeeded(before, after)
    assert not Message.objects.filter(pk=big.id, status="claimed").exists()


# --------------------------------------------------------------------------- worker: hostile tasks


#: (task, error class recorded, last_error written; {label} is the task's argument)
BASE_EXCEPTION_TASKS: list[tuple[QueueTask[Any, Any], str, str]] = [
    (tasks.raises_keyboard_interrupt, "builtins.KeyboardInterrupt", "{label}"),
    (tasks.async_raises_keyboard_interrupt, "builtins.KeyboardInterrupt", "{label}"),
    (tasks.raises_custom_base_exception, "tests.testapp.tasks.CustomBaseError", "{label}"),
    (tasks.raises_generator_exit, "builtins.GeneratorExit", "{label}"),
    (tasks.calls_sys_exit, "builtins.SystemExit", "3"),
    (tasks.raises_system_exit, "builtins.SystemExit", "bye {label}"),
]


@pytest.mark.worker
def test_base_exceptions_and_exits_in_tasks_are_failed_attempts(start_worker):
    before = enqueue_good("before")
    bad = {}
    for task, _, _ in BASE_EXCEPTION_TASKS:
        label = task.name.rsplit(".", 1)[-1]
        bad[label] = task.enqueue(label).id
    after = enqueue_good("after")
    counts, output = run_burst(start_worker, "--concurrency", "2")
    n = len(BASE_EXCEPTION_TASKS)
    assert (counts["succeeded"], counts["retried"], counts["dead"]) == (2, n, n)
    assert_succeeded(before, after)
    for task, error_class, error in BASE_EXCEPTION_TASKS:
        label = task.name.rsplit(".", 1)[-1]
        message = assert_dead(bad[label], ["retried", "failed"], error_class)
        assert message.last_error == f"{error_class}: {error.format(label=label)}"
        assert Ledger.objects.filter(label=label).count() == 2  # it really ran twice
    assert "Unexpected error" not in output


@pytest.mark.worker
def test_an_unprintable_exception_is_a_failed_attempt(start_worker):
    before = enqueue_good("before")
    odd = tasks.raises_unprintable.enqueue("unprintable")
    after = enqueue_good("after")
    run_burst(start_worker, patience=STUCK_PATIENCE)
    assert_succeeded(before, after)
    assert_dead(odd.id, ["retried", "failed"], "tests.testapp.tasks.UnprintableError")


@pytest.mark.worker
def test_tasks_that_close_or_kill_their_connection_are_acked(start_worker):
    before = enqueue_good("before")
    closing = [tasks.closes_connection.enqueue(f"close{i}").id for i in range(2)]
    raw = [tasks.closes_raw_connection.enqueue(f"raw{i}").id for i in range(2)]
    killed = [tasks.kills_own_connection.enqueue(f"kill{i}").id for i in range(2)]
    after = enqueue_good("after")
    counts, _ = run_burst(start_worker, "--concurrency", "1")
    assert counts["succeeded"] == 8
    assert_succeeded(before, after, *closing, *raw, *killed)
    assert Ledger.objects.count() == 8


@pytest.mark.worker
def test_an_atomic_task_that_closes_its_connection_fails_and_rolls_back(start_worker):
    before = enqueue_good("before")
    odd = tasks.atomic_closes_raw_connection.enqueue("atomic-close")
    after = enqueue_good("after")
    run_burst(start_worker, "--concurrency", "1")
    assert_succeeded(before, after)
    message = Message.objects.get(pk=odd.id)
    assert message.status == "dead"
    assert [a.outcome for a in Attempt.objects.for_message(odd.id)] == ["retried", "failed"]
    assert not Ledger.objects.filter(label="atomic-close").exists()


@pytest.mark.worker
def test_a_task_that_leaves_autocommit_off_fails_and_does_not_hold_up_the_others(start_worker):
    """Its uncommitted write is rolled back, so the attempt can't count as a success."""
    before = enqueue_good("before")
    odd = tasks.leaves_autocommit_off.enqueue("autocommit-off")
    after = [enqueue_good(f"after{i}") for i in range(3)]
    run_burst(start_worker, "--concurrency", "1")
    assert_succeeded(before, *after)
    message = assert_dead(odd.id, ["retried", "failed"],
                          "django_mysqlq.exceptions.TransactionLeftOpen")
    assert "rolled back" in message.last_error
    assert sorted(Ledger.objects.values_list("label", flat=True)) == [
        "after0", "after1", "after2", "before"]


@pytest.mark.worker
def test_a_task_that_leaves_an_atomic_block_open_does_not_poison_its_thread(start_worker):
    before = enqueue_good("before")
    odd = tasks.leaves_atomic_block_open.enqueue("atomic-open")
    after = [enqueue_good(f"after{i}") for i in range(3)]
    run_burst(start_worker, "--concurrency", "1", patience=STUCK_PATIENCE)
    assert_succeeded(before, *after)
    assert_dead(odd.id, ["retried", "failed"], "django_mysqlq.exceptions.TransactionLeftOpen")
    assert not Ledger.objects.filter(label="atomic-open").exists()  # never committed


@pytest.mark.worker
def test_an_atomic_task_that_leaves_an_inner_block_open_is_rolled_back_with_its_ack(
        start_worker):
    """The ack was written inside the same transaction: it must roll back too."""
    before = enqueue_good("before")
    odd = tasks.atomic_leaves_inner_block_open.enqueue("atomic-inner-open")
    after = enqueue_good("after")
    run_burst(start_worker, "--concurrency", "1", patience=STUCK_PATIENCE)
    assert_succeeded(before, after)
    assert_dead(odd.id, ["retried", "failed"], "django_mysqlq.exceptions.TransactionLeftOpen")
    assert not Ledger.objects.filter(label="atomic-inner-open").exists()
