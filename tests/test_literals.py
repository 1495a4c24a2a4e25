"""Statements escaped once per distinct value send exactly what the driver would."""

from __future__ import annotations

import datetime as dt
import decimal

import pytest
from django.db import connection

from django_mysqlq.broker.literals import escaped, execute_escaped

pytestmark = pytest.mark.django_db

VALUES = [
    "plain", "it's", 'a "quote"', "back\\slash", "100% %s %%", "ünïcødé ✓ 🚀", "", "\x00nul",
    None, 0, 1, -7, 2**63 - 1, True, False, 1.5, float("1e-300"),
    decimal.Decimal("12.3400"), dt.date(2026, 11, 25), dt.datetime(2026, 11, 25, 1, 2, 3, 456),
    dt.datetime(2026, 11, 25, 1, 2, 3, tzinfo=dt.UTC), dt.timedelta(seconds=3.5),
    b"utf-8 bytes", "plain", 1, True,  # repeats take the memo
]


def test_the_text_is_what_the_driver_binds():
    sql = "SELECT " + ", ".join(["%s"] * len(VALUES)) + ", '%%'"
    with connection.cursor() as cursor:
        driver = cursor.cursor.cursor._mogrify(sql, VALUES)  # the bytes it would send
        ours = escaped(cursor, sql, VALUES)
        assert ours is not None and ours.encode() == driver
        cursor.execute(ours)
        row = cursor.fetchone()
    assert row[:8] == ("plain", "it's", 'a "quote"', "back\\slash", "100% %s %%",
                       "ünïcødé ✓ 🚀", "", "\x00nul")
    assert row[-1] == "%"


def test_true_and_one_are_not_one_memo_entry():
    with connection.cursor() as cursor:
        assert escaped(cursor, "SELECT %s, %s, %s, %s", [1, True, 1.0, "1"]) == \
            "SELECT 1, 1, 1.0e0, '1'"


def test_bytes_that_are_not_text_go_through_the_driver():
    blob = b"\xff\xfe\x00raw"
    with connection.cursor() as cursor:
        assert escaped(cursor, "SELECT %s", [blob]) is None
        execute_escaped(cursor, "SELECT HEX(%s)", [blob])
        assert cursor.fetchone()[0] == blob.hex().upper()
