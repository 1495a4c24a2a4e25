"""Named locks scoped to the schema fit MySQL's 64 characters whatever the database's
name: MySQL refuses a longer one (error 3057), and the recovery lock's refusal stopped
every worker's sweep, and with it every claim. (MariaDB takes longer names: the length
is what is checked here.)"""

from __future__ import annotations

import pytest

from django_mysqlq.broker.base import RECOVERY_LOCK_NAME, schema_lock_name
from tests.conftest import raw_connection

pytestmark = pytest.mark.django_db(transaction=True)

LONG = "q" * 64  # the longest name a database may have


def _name_in(database: str, expression: str) -> str:
    conn = raw_connection()
    try:
        cursor = conn.cursor()
        cursor.execute(f"CREATE DATABASE IF NOT EXISTS `{database}`")
        cursor.execute(f"USE `{database}`")
        cursor.execute(f"SELECT {expression}")
        return str(cursor.fetchone()[0])
    finally:
        try:
            conn.cursor().execute(f"DROP DATABASE IF EXISTS `{database}`")
        finally:
            conn.close()


def test_a_long_database_name_is_hashed_into_the_lock_name_and_a_short_one_kept() -> None:
    long_name = _name_in(LONG, RECOVERY_LOCK_NAME)
    assert len(long_name) <= 64 and long_name.startswith("django_mysqlq:recover:")
    assert LONG not in long_name
    edge = "e" * 42  # 22 + 42 = 64: still the name itself
    assert _name_in(edge, RECOVERY_LOCK_NAME) == f"django_mysqlq:recover:{edge}"
    archive = _name_in(LONG, schema_lock_name("mysqlq_archive:"))
    assert len(archive) <= 64 and archive != long_name
    # Two long names that share their first 42 characters get two locks.
    assert _name_in(LONG[:-1] + "z", RECOVERY_LOCK_NAME) != long_name
