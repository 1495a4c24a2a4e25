"""Every statement the broker sends is a named constant, and each is named once.

A reader looking for "the claim" or "the ack" finds it in one place, as SQL. Read from the
source with ``ast``: a string literal inside a function that begins with an SQL verb is a
statement written where it is sent; two constants with the same text are one statement
named twice.
"""

from __future__ import annotations

import ast
import importlib
import re
from collections import defaultdict
from pathlib import Path

BROKER = Path(__file__).resolve().parent.parent / "django_mysqlq" / "broker"
VERB = re.compile(r"^\s*(SELECT|UPDATE|INSERT|DELETE|REPLACE|START\s+TRANSACTION|COMMIT|"
                  r"ROLLBACK|DO|KILL|SET|SHOW|WITH)\b")  # the package writes its SQL in capitals
#: Functions that build a fragment of a statement, not a statement: a derived table of
#: parameter rows (``(SELECT %s AS id UNION ALL SELECT %s)``) joined into named ones.
FRAGMENT_BUILDERS = {"base.rows_table"}


def literal_text(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(part.value if isinstance(part, ast.Constant) else "{}"
                       for part in node.values)
    return None


def inline_statements(source: str, module: str) -> list[str]:
    """``module:line text`` of each statement written inside a function."""
    found = []
    for function in ast.walk(ast.parse(source)):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if f"{module}.{function.name}" in FRAGMENT_BUILDERS:
            continue
        parts = {id(part) for node in ast.walk(function) if isinstance(node, ast.JoinedStr)
                 for part in node.values}  # an f-string's pieces: read as the whole
        for node in ast.walk(function):
            text = literal_text(node)
            if text is not None and VERB.match(text) and id(node) not in parts:
                found.append(f"{module}:{node.lineno} {text.strip()[:60]}")
    return sorted(set(found))


def named_statements() -> dict[str, list[str]]:
    """Each statement's text (whitespace folded) and the constants that define it."""
    texts: dict[str, list[str]] = defaultdict(list)
    for path in sorted(BROKER.glob("*.py")):
        module_name = "django_mysqlq.broker" + ("" if path.stem == "__init__" else f".{path.stem}")
        module = importlib.import_module(module_name)
        for node in ast.parse(path.read_text()).body:
            targets = (node.targets if isinstance(node, ast.Assign)
                       else [node.target] if isinstance(node, ast.AnnAssign) else [])
            for target in targets:
                value = getattr(module, getattr(target, "id", ""), None)
                if isinstance(value, str) and VERB.match(value):
                    texts[" ".join(value.split())].append(f"{path.stem}.{target.id}")  # type: ignore[attr-defined]
    return texts


def test_the_reader_finds_an_inline_statement() -> None:
    source = (
        'TABLE = "t"\n'
        'NAMED_SQL = "SELECT 1"\n'
        "def f(cursor, table):\n"
        "    cursor.execute(NAMED_SQL)\n"
        '    cursor.execute(f"DELETE FROM {table} WHERE id = %s", [1])\n'
        '    cursor.execute("COMMIT")\n'
    )
    assert inline_statements(source, "m") == ["m:5 DELETE FROM {} WHERE id = %s", "m:6 COMMIT"]


def test_no_broker_statement_is_written_where_it_is_sent() -> None:
    inline = [line for path in sorted(BROKER.glob("*.py"))
              for line in inline_statements(path.read_text(), path.stem)]
    assert not inline, "statements to name as module constants:\n" + "\n".join(inline)


def test_each_broker_statement_is_named_once() -> None:
    texts = named_statements()
    assert len(texts) > 50  # the reader found the statements at all
    twice = {names[0]: names for names in texts.values() if len(names) > 1}
    assert not twice, f"one statement under several names: {twice}"
