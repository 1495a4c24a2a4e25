"""Where a run happened: the machine, the versions, the server's relevant variables."""

from __future__ import annotations

import dataclasses
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import django

from django_mysqlq.conf import get_settings

from . import db
from .workers import ROOT


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def machine() -> dict[str, Any]:
    return {"nproc": os.cpu_count(), "memory_gib": _memory_gib(), "cpu_model": _cpu_model(),
            "platform": platform.platform(), "hostname": platform.node()}


def versions(conn: Any) -> dict[str, Any]:
    dirty = _git("status", "--porcelain", "--untracked-files=no", "--", "django_mysqlq")
    return {
        "python": sys.version.split()[0], "django": django.get_version(),
        "mysqlclient": _version("mysqlclient"), "matplotlib": _version("matplotlib"),
        "mariadb": db.scalar(conn, "SELECT VERSION()"),
        "django_mysqlq_commit": _git("rev-parse", "HEAD"),
        "django_mysqlq_dirty": bool(dirty) if dirty != "unknown" else None,
    }


def queue_settings() -> dict[str, Any]:
    return dataclasses.asdict(get_settings())
