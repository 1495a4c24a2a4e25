"""The MariaDB server the run restarts: which one, how to stop it and start it again.

By default the machine's server (Debian's: ``/usr/sbin/mariadbd``, pid file
``/run/mysqld/mysqld.pid``, its options from ``/etc/mysql``). A private server, on a
machine other users share, is named by the environment (``python -m bench.chaos``'s
``--server``, ``--pid-file`` and ``--server-args`` set them):

* ``MYSQLQ_CHAOS_SERVER``: the ``mariadbd`` binary started again after the shutdown (a
  copy of its own, so the pid file check can't mistake another server for it);
* ``MYSQLQ_CHAOS_PID_FILE``: the pid file that server writes;
* ``MYSQLQ_CHAOS_SERVER_ARGS``: its command-line options (shell words), e.g.
  ``--defaults-file=/tmp/chaos/my.cnf``.

The server is reached at the chaos database's host and port (``MYSQLQ_CHAOS_HOST``,
``…_PORT``), where the shutdown is sent.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import subprocess
import time
from collections.abc import Callable

from django.conf import settings

from .admin import HarnessError

DEFAULT_SERVER = "/usr/sbin/mariadbd"
#: Debian's pid file: other mariadbd processes on the machine (a second instance,
#: cluster nodes) are not the one the run restarts.
DEFAULT_PID_FILE = "/run/mysqld/mysqld.pid"


@dataclasses.dataclass(frozen=True)
class Server:
    binary: str
    pid_file: str
    args: tuple[str, ...]
    host: str
    port: int
    user: str
    password: str

    @classmethod
    def from_environment(cls) -> Server:
        conf = settings.DATABASES["default"]
        return cls(binary=os.environ.get("MYSQLQ_CHAOS_SERVER") or DEFAULT_SERVER,
                   pid_file=os.environ.get("MYSQLQ_CHAOS_PID_FILE") or DEFAULT_PID_FILE,
                   args=tuple(shlex.split(os.environ.get("MYSQLQ_CHAOS_SERVER_ARGS", ""))),
                   host=str(conf["HOST"]), port=int(str(conf["PORT"])), user=str(conf["USER"]),
                   password=str(conf["PASSWORD"]))

    def admin(self) -> list[str]:
        command = ["mariadb-admin", f"--host={self.host}", f"--port={self.port}",
                   f"--user={self.user}", "--connect-timeout=2"]
        if self.password:
            command.append(f"--password={self.password}")
        return command

    def answers(self) -> bool:
        result = subprocess.run([*self.admin(), "ping"], capture_output=True, timeout=30)
        return result.returncode == 0

    def process_exists(self) -> bool:
        result = subprocess.run(["start-stop-daemon", "--status", "--pidfile", self.pid_file,
                                 "--exec", self.binary], capture_output=True, timeout=30)
        return result.returncode == 0

    def start(self) -> None:
        subprocess.run(["start-stop-daemon", "--start", "--oknodo", "--background",
                        "--pidfile", self.pid_file, "--exec", self.binary,
                        *(["--", *self.args] if self.args else [])],
                       check=True, capture_output=True, timeout=30)

    def describe(self) -> str:
        return f"{self.binary} (pid file {self.pid_file}) at {self.host}:{self.port}"


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise HarnessError(f"Timed out after {timeout:.0f}s waiting for {what}.")
        time.sleep(0.2)


def check_restartable() -> None:
    """Before a run that will restart the server: is the named process the one answering
    on the chaos port? (A wrong pid file would restart nothing, or the wrong server.)"""
    server = Server.from_environment()
    if not server.process_exists():
        raise HarnessError(
            f"No running {server.binary} with the pid file {server.pid_file}: the run could "
            "not restart the server it uses. Set --server/--pid-file/--server-args (or "
            "MYSQLQ_CHAOS_SERVER/_PID_FILE/_SERVER_ARGS), or pass --no-restart.")


def restart_server(timeout: float = 60.0) -> tuple[float, float]:
    """Shut MariaDB down cleanly and start it again; return (shutdown sent, answering)."""
    server = Server.from_environment()
    down_at = time.time()
    result = subprocess.run([*server.admin(), "shutdown"], capture_output=True, timeout=60)
    if result.returncode != 0:
        raise HarnessError(f"mariadb-admin shutdown failed: {result.stderr.decode().strip()}")
    try:
        _wait(lambda: not server.answers(), timeout, "MariaDB to stop answering")
        _wait(lambda: not server.process_exists(), timeout, "the old MariaDB process to exit")
    finally:
        ensure_server_running(timeout)
    return down_at, time.time()


def ensure_server_running(timeout: float = 60.0) -> None:
    """Start MariaDB if it doesn't answer (after its old process is gone)."""
    server = Server.from_environment()
    if server.answers():
        return
    _wait(lambda: not server.process_exists(), timeout, "the old MariaDB process to exit")
    server.start()
    _wait(server.answers, timeout, "MariaDB to answer after its restart")
