"""The Java runtime Spark's gateway would start, checked before it does: without one (or
with one too old) PySpark fails with its own gateway error ("Java gateway process exited
before sending its port number") instead of saying what to install.

It looks where ``spark-class`` looks: ``$JAVA_HOME/bin/java`` when ``JAVA_HOME`` is set,
else ``java`` on the ``PATH``; and reads the version from ``java -version`` (a few
hundredths of a CPU second).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping

from .errors import PipelineError

#: What to do about it, in every message.
INSTALL = ("On Debian or Ubuntu: apt-get install openjdk-17-jre-headless; elsewhere "
           "install a Java {minimum}+ runtime and set JAVA_HOME to its directory (or put "
           "its bin/ on the PATH).")
#: ``openjdk version "17.0.15" 2025-04-15``, ``java version "1.8.0_351"``.
VERSION = re.compile(r'version "(\d+)(?:\.(\d+))?')
SECONDS = 30.0


def minimum_version() -> int:
    """The Java release this PySpark needs: 17 for PySpark 4, 8 before."""
    from pyspark.version import __version__

    major = __version__.split(".")[0]
    return 17 if not major.isdigit() or int(major) >= 4 else 8


def find(environ: Mapping[str, str] | None = None) -> str:
    """The ``java`` Spark would start; raise :class:`PipelineError` when there is none."""
    environ = os.environ if environ is None else environ
    home = environ.get("JAVA_HOME")
    if home:
        java = os.path.join(home, "bin", "java")
        if os.access(java, os.X_OK):
            return java
        raise PipelineError(
            f"JAVA_HOME is {home}, but {java} is not there (or not executable): Spark "
            f"can't start. Set JAVA_HOME to a Java runtime's directory, or unset it to use "
            f"the java on the PATH. {INSTALL.format(minimum=minimum_version())}")
    found = shutil.which("java", path=environ.get("PATH", os.defpath))
    if found is None:
        raise PipelineError(
            f"The data pipeline needs a Java {minimum_version()}+ runtime to start Spark, "
            "and found none: JAVA_HOME is not set and there is no java on the PATH. "
            + INSTALL.format(minimum=minimum_version()))
    return found


def version_of(java: str) -> int | None:
    """The release of ``java`` (8, 11, 17, 21 …) from ``java -version``; None when the
    output names none."""
    try:
        done = subprocess.run([java, "-version"], capture_output=True, text=True,
                              timeout=SECONDS, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PipelineError(f"{java} -version did not run ({exc}): Spark can't start with "
                            f"it. {INSTALL.format(minimum=minimum_version())}") from None
    found = VERSION.search(done.stderr + done.stdout)
    if found is None:
        return None
    major = int(found.group(1))
    return int(found.group(2) or 0) if major == 1 else major  # "1.8" is Java 8


def check(environ: Mapping[str, str] | None = None) -> str:
    """The ``java`` Spark would start, if it is there and recent enough for this PySpark;
    else raise :class:`PipelineError` saying what to install."""
    java = find(environ)
    minimum = minimum_version()
    found = version_of(java)
    if found is not None and found < minimum:
        raise PipelineError(
            f"{java} is Java {found}; this PySpark needs Java {minimum} or later. "
            + INSTALL.format(minimum=minimum))
    return java
