"""Which TCP client ports a process holds, read from ``/proc`` (Linux only).

The server's process list shows each connection's client ``host:port``; a worker's
sockets, matched by inode, give its ports, hence its connection ids: the control
connection, the task threads', the acker's and the ledger's alike.
"""

from __future__ import annotations

import contextlib
import os


def _socket_inodes(pid: int) -> set[int]:
    inodes: set[int] = set()
    fd_dir = f"/proc/{pid}/fd"
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
        for name in os.listdir(fd_dir):
            with contextlib.suppress(OSError):
                target = os.readlink(os.path.join(fd_dir, name))
                if target.startswith("socket:["):
                    inodes.add(int(target[8:-1]))
    return inodes


def _tcp_entries(pid: int) -> list[tuple[int, int]]:
    """``(local port, inode)`` of the TCP sockets in the process's network namespace."""
    entries = []
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}") as lines:
                next(lines, None)  # the header
                for line in lines:
                    fields = line.split()
                    if len(fields) < 10:
                        continue
                    port = int(fields[1].rsplit(":", 1)[1], 16)
                    entries.append((port, int(fields[9])))
        except (FileNotFoundError, ProcessLookupError):
            continue
    return entries


def client_ports(pid: int) -> set[int]:
    """Local ports of the TCP sockets ``pid`` holds (empty if it is gone)."""
    inodes = _socket_inodes(pid)
    if not inodes:
        return set()
    return {port for port, inode in _tcp_entries(pid) if inode in inodes}
