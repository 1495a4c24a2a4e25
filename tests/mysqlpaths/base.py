"""Django's MySQL backend on MariaDB, told the server is MySQL: the library's MySQL branches.

No MySQL 8 server can be installed on the test machine (Debian 12 ships none, and no PyPI
or npm package bundles one), so the code paths the library takes on MySQL (no ``INSERT …
RETURNING``, no ``SET STATEMENT``, no ``max_statement_time``, no ``@@in_transaction``) are
run against MariaDB through this backend: ``DATABASES[...]['ENGINE'] = 'tests.mysqlpaths'``
(``MYSQLQ_TEST_ENGINE`` in a worker subprocess's environment).
"""

from __future__ import annotations

from django.db.backends.mysql import base


class DatabaseWrapper(base.DatabaseWrapper):
    @property  # type: ignore[override]
    def mysql_is_mariadb(self) -> bool:
        return False
