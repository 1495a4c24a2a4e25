"""What an enqueue refuses up front, so that nothing it accepts fails later: an argument
nested deeper than a worker parses back, and a message whose row alone would pass the
server's ``max_allowed_packet`` (the server would refuse the INSERT and close the
connection, the caller's transaction with it)."""

from __future__ import annotations

import pytest
from django.db import transaction

from django_mysqlq import ArgumentEncodingError, PayloadTooLarge
from django_mysqlq.broker.enqueue import INSERT_ROW_BYTES
from django_mysqlq.broker.packets import PACKET_HEADROOM, refuse_past_packet, row_room
from django_mysqlq.models import Message
from django_mysqlq.payload import MAX_ARGUMENT_DEPTH, decode
from tests.packet_support import nested, server_packet
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

MiB = 2**20


def test_an_argument_nested_deeper_than_a_worker_parses_is_refused_by_name():
    # 1,400 levels encode (the encoder stops about 1,500) but don't parse back in a worker:
    # before, the enqueue took them and the message died unparsed (PayloadDecodeError).
    # (Python 3.11's encoder already stops short of 1,400: its own refusal, also by name.)
    too_deep = (rf"is nested more than {MAX_ARGUMENT_DEPTH} levels deep.*flatten it"
                r"|can't be encoded as JSON \(maximum recursion")
    for depth in (MAX_ARGUMENT_DEPTH + 1, 1_400):
        with pytest.raises(ArgumentEncodingError,
                           match=rf"Positional argument 0 of task '.*echo' ({too_deep})"):
            tasks.echo.enqueue(nested(depth))
        with pytest.raises(ArgumentEncodingError,
                           match=rf"Argument 'value' of task .* ({too_deep})"):
            tasks.echo.enqueue(value={"rows": nested(depth)})
    with pytest.raises(ArgumentEncodingError, match="nested more than"):
        tasks.echo.enqueue(nested(MAX_ARGUMENT_DEPTH + 1))  # past the limit, under encoders'
    with pytest.raises(ArgumentEncodingError, match=r"Positional argument 0 .* nested"):
        tasks.echo.enqueue_many([(1,), (nested(MAX_ARGUMENT_DEPTH + 1),)])
    assert not Message.objects.exists()


def test_an_argument_at_the_depth_limit_is_taken_and_parses_back():
    deepest = nested(MAX_ARGUMENT_DEPTH - 1, {"a": 1})  # 500 containers
    handle = tasks.echo.enqueue(deepest)
    args, _ = decode(Message.objects.get(pk=handle.id).payload)
    assert args == [deepest]
    # Many brackets but shallow (the walk runs, and finds nothing): taken.
    wide = [[i] for i in range(5_000)]
    assert tasks.echo.enqueue(wide).id


def test_a_message_over_max_allowed_packet_is_refused_and_the_transaction_goes_on(settings):
    """Only a site that raised MAX_PAYLOAD_BYTES near the packet can make one: before, the
    server refused the INSERT (1153) and closed the connection."""
    settings.MYSQLQ = {**settings.MYSQLQ, "MAX_PAYLOAD_BYTES": 64 * MiB}
    packet = server_packet()
    with transaction.atomic():
        kept = tasks.echo.enqueue("before")
        for size in (packet - 1_000, packet + 1_000):
            with pytest.raises(PayloadTooLarge,
                               match=r"task '.*echo' take \d+ bytes.*max_allowed_packet"):
                tasks.echo.enqueue("x" * size)
        with pytest.raises(PayloadTooLarge, match="max_allowed_packet"):
            tasks.echo.enqueue_many([("small",), ("x" * packet,)])
        after = tasks.echo.enqueue("after")  # the connection and the transaction live on
    assert sorted(Message.objects.values_list("pk", flat=True)) == sorted([kept.id, after.id])


def test_the_largest_message_the_packet_takes_is_stored_whole(settings):
    settings.MYSQLQ = {**settings.MYSQLQ, "MAX_PAYLOAD_BYTES": 64 * MiB}
    packet = server_packet()
    room = max(packet // 2, packet - PACKET_HEADROOM)
    names = 4 * (len(tasks.echo.queue) + len(tasks.echo.name))
    wrapper = '{"args":[""],"kwargs":{}}'  # as sent: its 6 quotes escaped, and 2 around
    largest = room - INSERT_ROW_BYTES - names - (len(wrapper) + 6 + 2)
    handle = tasks.echo.enqueue("x" * largest)
    args, _ = decode(Message.objects.get(pk=handle.id).payload)
    assert len(args[0]) == largest


def test_enqueue_and_publish_share_one_refusal_of_what_passes_the_packet():
    """``refuse_past_packet`` finds the largest row, takes the caller's ``reserved`` bytes
    off the room, and names the row in the caller's words."""
    room, packet = row_room("default"), server_packet()
    words = {"room_for": "one row", "send": "pass"}

    def subject(index: int) -> str:
        return f"Row {index} takes"

    refuse_past_packet([], "default", subject, **words)
    refuse_past_packet([1, room], "default", subject, **words)
    with pytest.raises(PayloadTooLarge) as refused:
        refuse_past_packet([1, room + 1, room + 5, 3], "default", subject, **words)
    assert str(refused.value) == (
        f"Row 2 takes {room + 5} bytes in a statement, and the server's max_allowed_packet "
        f"({packet} bytes) leaves {room} for one row: store large data in a table or file "
        "and pass its key, or raise max_allowed_packet on the server (and keep "
        "MYSQLQ['MAX_PAYLOAD_BYTES'] under it).")
    with pytest.raises(PayloadTooLarge, match=rf"^Row 0 takes .* leaves {room - 20} for"):
        refuse_past_packet([room - 10], "default", subject, reserved=20, **words)
