"""The operator commands refuse option values that make no sense with a one-line error
that says what is accepted, instead of taking them for "nothing to do" or a traceback."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest
from django.core.management import CommandError, call_command

pytestmark = pytest.mark.django_db(transaction=True)


def run(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def on_command_line(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "django", *args], env=env,
                          capture_output=True, text=True, timeout=60)


# --------------------------------------------------------------------------- queuehistory


@pytest.mark.parametrize(("option", "value", "high"), [
    ("--rows-per-partition", "0", "9223372036854775807"),
    ("--rows-per-partition", "-5", "9223372036854775807"),
    ("--rows-per-partition", "1.5", "9223372036854775807"),
    ("--ahead", "0", "8192"),
    ("--ahead", "-3", "8192"),
])
def test_queuehistory_partition_refuses_counts_below_1(option, value, high):
    """Not "Nothing to do": the broker refuses them, and so does the command, up front."""
    args = ["--rows-per-partition", "100"] if option == "--ahead" else []
    with pytest.raises(CommandError, match=f"argument {option}: expected a whole number "
                                           f"from 1 to {high}, not '{value}'"):
        run("queuehistory", "partition", *args, f"{option}={value}")


def test_queuehistory_partition_refuses_ahead_0_on_the_command_line(worker_env):
    done = on_command_line(worker_env, "queuehistory", "partition", "--ahead", "0")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "argument --ahead: expected a whole number from 1 to 8192, not '0'" in done.stderr
