"""A stored JSON payload as an admin page shows it: laid out with indents, or, when it
can't be, the stored text as it is under a note saying why (not valid JSON, nested too
deeply for the parser, too long to lay out). Message and topic message pages use it."""

from __future__ import annotations

import json

from django.utils.html import format_html

#: Characters of stored text laid out with indents (1 MB, the default
#: ``MAX_PAYLOAD_BYTES``); longer text is shown as stored: parsing and re-indenting many
#: megabytes takes the page seconds and its memory several times the text.
LAYOUT_LIMIT = 1_000_000


def _raw(note: str, text: str) -> str:
    return format_html("<p class='help mysqlq-payload-note'>{} The stored text:</p>"
                       "<pre class='mysqlq-raw'>{}</pre>", note, text)


def json_block(text: str, *, sort_keys: bool = False, deep_advice: str = "") -> str:
    """``text`` (a stored payload) as HTML. ``deep_advice``, in brackets after "Nested too
    deeply to lay out", says what to do with such a payload."""
    if len(text) > LAYOUT_LIMIT:
        return _raw(f"Too long to lay out ({len(text):,} characters, over "
                    f"{LAYOUT_LIMIT:,}).", text)
    try:
        laid_out = json.dumps(json.loads(text), indent=2, ensure_ascii=False,
                              sort_keys=sort_keys)
    except RecursionError:
        return _raw("Nested too deeply to lay out"
                    + (f" ({deep_advice})." if deep_advice else "."), text)
    except ValueError as exc:  # also a number too long for int(): over 4,300 digits
        return _raw(f"Not valid JSON ({exc}).", text)
    return format_html("<pre class='mysqlq-json'>{}</pre>", laid_out)
