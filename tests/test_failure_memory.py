"""``log.Failures``: a lasting failure said once per kind of error, and its end once."""

from __future__ import annotations

from django.db import OperationalError

from django_mysqlq.log import Failures, error_kind


def test_each_kind_of_error_is_new_once_until_the_thing_works_again() -> None:
    failures: Failures[str] = Failures()
    out_of_range = OperationalError(1264, "Out of range value for column 'last_offset'")
    lock_wait = OperationalError(1205, "Lock wait timeout exceeded")
    assert failures.failed("orders", out_of_range)
    assert not failures.failed("orders", OperationalError(1264, "other text, same kind"))
    assert failures.failed("orders", lock_wait)
    assert not failures.failed("orders", out_of_range)  # (flapping between two kinds)
    assert failures.failed("audit", out_of_range)  # (each thing has its own)
    assert "orders" in failures and failures.keys() == ["orders", "audit"]
    assert failures.kinds("orders") == {("OperationalError", 1264), ("OperationalError", 1205)}
    assert failures.kinds("unknown") == frozenset()
    assert failures.recovered("orders")
    assert not failures.recovered("orders")
    assert "orders" not in failures
    assert failures.failed("orders", out_of_range)  # a new episode is said again


def test_the_kind_is_the_class_and_the_servers_code() -> None:
    assert error_kind(OperationalError(1264, "x")) == ("OperationalError", 1264)
    assert error_kind(OperationalError("no code")) == ("OperationalError", None)
    assert error_kind(ValueError()) == ("ValueError", None)
