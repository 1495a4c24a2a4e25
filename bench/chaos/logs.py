"""What the workers said: ERROR lines in their logs, grouped by message."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

#: ``asctime pid thread LEVEL logger: message`` (the chaos settings' format).
_LINE = re.compile(r"^\S+ \S+ \d+ \S+ (?P<level>[A-Z]+) (?P<logger>\S+): (?P<message>.*)$")


def _shape(message: str) -> str:
    """The message with numbers and ids blanked, so alike lines group together."""
    message = re.sub(r"[0-9a-f]{8,}", "X", message)
    return re.sub(r"\d+(\.\d+)?", "N", message)[:160]


def error_lines(log_dir: Path) -> dict[str, int]:
    counts: Counter[str] = Counter()
    for path in sorted(log_dir.glob("worker-*.log")):
        for line in path.read_text(errors="replace").splitlines():
            match = _LINE.match(line)
            if match and match["level"] in ("ERROR", "CRITICAL"):
                counts[_shape(match["message"])] += 1
    return dict(counts.most_common(20))
