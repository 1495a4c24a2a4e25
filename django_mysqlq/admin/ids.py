"""Row ids typed into the admin (a search box, a page's URL): digits a BIGINT holds."""

from __future__ import annotations

BIGINT_MAX = 2**63 - 1


def row_id(text: str) -> int | None:
    """``text`` as a row id, or None: ASCII digits that a BIGINT holds. (``int()`` of 4,301
    digits or more raises ValueError: a 500 from a search box; past BIGINT no row has
    the id anyway.)"""
    if not (text.isascii() and text.isdigit()) or len(text) > 19:
        return None
    value = int(text)
    return value if value <= BIGINT_MAX else None
