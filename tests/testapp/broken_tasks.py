"""A task module whose import fails, as one with a missing dependency does
(tests/test_settings_checks.py: django_mysqlq.E005)."""

import not_an_installed_dependency  # noqa: F401
