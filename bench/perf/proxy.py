"""A TCP relay between worker processes and MariaDB that counts the commands they send.

``SHOW GLOBAL STATUS LIKE 'Questions'`` counts every session of the server; on a shared
server the other sessions' hundreds of statements per second bury the few an idle worker
sends. Relaying the workers' connections through here counts exactly theirs: every
client packet with sequence number 0 starts a command (``COM_QUERY``, ``COM_PING``...).
Plain-text protocol only: a client that switches to TLS is detected and fails the count.
"""

from __future__ import annotations

import collections
import contextlib
import re
import socket
import threading

COMMANDS = {0x01: "COM_QUIT", 0x02: "COM_INIT_DB", 0x03: "COM_QUERY", 0x0E: "COM_PING",
            0x09: "COM_STATISTICS", 0x16: "COM_STMT_PREPARE", 0x17: "COM_STMT_EXECUTE",
            0x11: "COM_CHANGE_USER", 0x1F: "COM_RESET_CONNECTION"}
#: Capability flag a client sets in its SSL request (a 32-byte packet, sequence 1).
CLIENT_SSL = 0x0800


#: MariaDB's per-statement variables (``SET STATEMENT lock_wait_timeout = 2 FOR SELECT
#: …``): the statement's shape is what follows them.
_STATEMENT_VARIABLES = re.compile(r"^\s*SET\s+STATEMENT\s+.*?\bFOR\s+", re.S | re.I)


def _shape(sql: bytes) -> str:
    """A statement's first words, e.g. ``UPDATE mysqlq_worker SET last_heartbeat =``."""
    text = _STATEMENT_VARIABLES.sub("", sql[:400].decode(errors="replace"), count=1)
    return " ".join(text.split()[:5])


class CountingProxy:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._counts: collections.Counter[str] = collections.Counter()
        self._statements: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self.tls_seen = False
        self.connections = 0
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    def snapshot(self) -> tuple[collections.Counter[str], collections.Counter[str]]:
        """``(commands by type, COM_QUERY statements by their first words)`` so far."""
        with self._lock:
            return collections.Counter(self._counts), collections.Counter(self._statements)

    def close(self) -> None:
        """Cut every relayed connection and refuse new ones."""
        with contextlib.suppress(OSError):
            # Wakes the thread blocked in accept(): close() alone leaves that call able
            # to take one more connection.
            self._listener.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._listener.close()
        for sock in list(self._sockets):
            # shutdown() ends the TCP connection at once; close() alone waits for the
            # relay thread blocked in recv() on it, and the server keeps the session (and
            # whatever it holds: a named lock, row locks) open meanwhile.
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                return
            server.settimeout(None)
            self._sockets += [client, server]
            self.connections += 1
            threading.Thread(target=self._relay, args=(server, client), daemon=True).start()
            threading.Thread(target=self._count_and_relay, args=(client, server),
                             daemon=True).start()

    @staticmethod
    def _relay(source: socket.socket, target: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                target.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, target):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def _count_and_relay(self, source: socket.socket, target: socket.socket) -> None:
        buffer = b""
        parsing = True
        try:
            while data := source.recv(65536):
                target.sendall(data)
                if not parsing:
                    continue
                buffer += data
                while len(buffer) >= 4:
                    length = int.from_bytes(buffer[:3], "little")
                    if len(buffer) < 4 + length:
                        break
                    sequence, payload = buffer[3], buffer[4:4 + length]
                    buffer = buffer[4 + length:]
                    if sequence == 1 and length == 32 and \
                            int.from_bytes(payload[:4], "little") & CLIENT_SSL:
                        self.tls_seen, parsing = True, False
                        break
                    if sequence == 0 and payload:
                        name = COMMANDS.get(payload[0], f"0x{payload[0]:02x}")
                        with self._lock:
                            self._counts[name] += 1
                            if payload[0] == 0x03:
                                self._statements[_shape(payload[1:])] += 1
        except OSError:
            pass
        finally:
            for sock in (source, target):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
