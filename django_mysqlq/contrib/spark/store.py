"""Files through Hadoop's FileSystem API: one code path for a local directory, HDFS,
``s3a://`` or ``abfs://`` (whatever the session's Hadoop configuration can reach).

A local directory with a local master (the driver sees every file the executors wrote)
takes Python's own file calls instead: each Hadoop call is a round trip to the JVM, and
listing, checking and renaming a batch's files took about half a second of the
archive's each batch that way (docs/performance.md).
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import unquote, urlparse

from pyspark.sql import SparkSession


class Store:
    """The file system of one root path, as the session's JVM sees it."""

    def __init__(self, spark: SparkSession, root: str) -> None:
        context = spark.sparkContext
        self._jvm: Any = context._jvm
        self.root = root.rstrip("/") or "/"
        self._fs: Any = self._path(self.root).getFileSystem(
            context._jsc.hadoopConfiguration())
        # No ".name.crc" files beside what this writes on a local disk.
        self._fs.setWriteChecksum(False)
        self.local = (str(self._fs.getUri().getScheme()) == "file"
                      and str(context.master).startswith("local"))

    def os_path(self, path: str) -> str | None:
        """``path`` as this machine's file path, when the files are local (else None)."""
        if not self.local:
            return None
        if path.startswith("file:"):
            return unquote(urlparse(path).path)
        return None if "://" in path else path

    def _path(self, path: str) -> Any:
        return self._jvm.org.apache.hadoop.fs.Path(path)

    def qualified(self, path: str) -> str:
        return str(self._fs.makeQualified(self._path(path)).toString())

    def exists(self, path: str) -> bool:
        if (local := self.os_path(path)) is not None:
            return os.path.exists(local)
        return bool(self._fs.exists(self._path(path)))

    def mkdirs(self, path: str) -> None:
        self._fs.mkdirs(self._path(path))

    def delete(self, path: str) -> None:
        self._fs.delete(self._path(path), True)

    def list_dir(self, path: str) -> list[str]:
        """Names directly under ``path`` (none if it does not exist)."""
        if not self.exists(path):
            return []
        return sorted(str(status.getPath().getName())
                      for status in self._fs.listStatus(self._path(path)))

    def list_files(self, path: str) -> list[str]:
        """Paths of every file under ``path``, relative to it, recursively."""
        if (local := self.os_path(path)) is not None:
            return _local_files(local)
        if not self.exists(path):
            return []
        base = self.qualified(path).rstrip("/") + "/"
        found = []
        files = self._fs.listFiles(self._path(path), True)
        while files.hasNext():
            full = str(files.next().getPath().toString())
            found.append(full[len(base):] if full.startswith(base) else full)
        return sorted(found)

    def rename(self, source: str, target: str) -> bool:
        """Move a file, making the target's directory; False if the source is gone."""
        source_path, target_path = self.os_path(source), self.os_path(target)
        if source_path is not None and target_path is not None:
            if not os.path.exists(source_path):
                return False
            os.makedirs(os.path.dirname(target_path) or ".", exist_ok=True)
            os.rename(source_path, target_path)
            return True
        if not self.exists(source):
            return False
        parent = self._path(target).getParent()
        if parent is not None:
            self._fs.mkdirs(parent)
        return bool(self._fs.rename(self._path(source), self._path(target)))

    def write_text(self, path: str, text: str) -> None:
        """Write a small file whole: to a temporary name, then renamed into place (a
        reader sees the old file or the new one, never half of it)."""
        temporary = f"{path}.tmp"
        stream = self._fs.create(self._path(temporary), True)
        try:
            stream.write(bytearray(text.encode()))
        finally:
            stream.close()
        if self.exists(path):
            self._fs.delete(self._path(path), False)
        if not self._fs.rename(self._path(temporary), self._path(path)):
            raise OSError(f"could not rename {temporary} to {path}")

    def read_text(self, path: str) -> str:
        stream = self._fs.open(self._path(path))
        try:
            chunks = []
            buffer = self._jvm.java.io.ByteArrayOutputStream()
            self._jvm.org.apache.hadoop.io.IOUtils.copyBytes(stream, buffer, 65536, False)
            chunks.append(bytes(buffer.toByteArray()))
        finally:
            stream.close()
        return b"".join(chunks).decode()


    def sync_tree(self, path: str, up_to: str) -> None:
        """On a local disk: fsync every file and directory under ``path``, and the
        directories above it up to ``up_to``, so the files and the entries naming them
        survive a power cut (the archive deletes rows once they are there). Elsewhere
        (HDFS, object stores) a closed file is the file system's to keep: nothing."""
        local = self.os_path(path)
        if local is None or not os.path.exists(local):
            return
        directories = []
        for directory, _, names in os.walk(local):
            for name in names:
                _fsync(os.path.join(directory, name))
            directories.append(directory)
        for directory in reversed(directories):
            _fsync(directory)
        self._sync_above(local, up_to)

    def sync_files(self, paths: list[str], up_to: str) -> None:
        """On a local disk: fsync the files, then their directories and those above up
        to ``up_to`` (see :meth:`sync_tree`)."""
        directories: set[str] = set()
        for path in paths:
            local = self.os_path(path)
            if local is None:
                return
            _fsync(local)
            directories.update(self._above(local, up_to))
        # Deepest first: a new directory's entry in its parent is synced after it.
        for directory in sorted(directories, key=len, reverse=True):
            _fsync(directory)

    def _sync_above(self, local: str, up_to: str) -> None:
        for directory in self._above(local, up_to):
            _fsync(directory)

    def _above(self, local: str, up_to: str) -> list[str]:
        """The directories from ``local``'s own up to ``up_to`` (inclusive)."""
        top = os.path.abspath(self.os_path(up_to) or up_to)
        directory = os.path.dirname(os.path.abspath(local))
        found = []
        while True:
            found.append(directory)
            parent = os.path.dirname(directory)
            if directory == top or parent == directory or not directory.startswith(top):
                return found
            directory = parent


def _fsync(path: str) -> None:
    """Flush a file's data, or a directory's entries, to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _local_files(root: str) -> list[str]:
    """What Hadoop's local file system lists under ``root``: every file, recursively,
    relative to it, but its checksum files (``.name.crc``)."""
    found = []
    for directory, _, names in os.walk(root):
        relative = os.path.relpath(directory, root)
        for name in names:
            if name.startswith(".") and name.endswith(".crc"):
                continue
            found.append(name if relative == "." else f"{relative}/{name}".replace(os.sep, "/"))
    return sorted(found)
