"""The docs name every table ``migrate`` creates (docs/install.md said four of 13)."""

from __future__ import annotations

import re
from pathlib import Path

from django.apps import apps

DOCS = Path(__file__).resolve().parent.parent / "docs"


def created_tables() -> set[str]:
    return {model._meta.db_table for model in apps.get_app_config("django_mysqlq").get_models()
            if model._meta.managed}


def test_install_md_lists_every_table_migrate_creates():
    text = DOCS.joinpath("install.md").read_text()
    paragraph = text[text.index("Then create the queue's tables"):]
    paragraph = paragraph[:paragraph.index("```")]
    tables = created_tables()
    assert set(re.findall(r"`(mysqlq_\w+)`", paragraph)) == tables
    assert f"`migrate` creates {len(tables)}" in " ".join(paragraph.split())


def test_security_md_grants_every_table():
    text = " ".join(DOCS.joinpath("security.md").read_text().split())
    section = text[text.index("## Database privileges"):]
    named = set(re.findall(r"`(mysqlq_\w+)`", section))
    assert created_tables() <= named
    assert "on every `mysqlq_*` table" in section
