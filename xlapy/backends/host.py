"""What the host offers the library calls that run outside generated code (LAPACK, FFT):
the number of cores this process may use."""

from __future__ import annotations

import functools
import os

from xlapy.errors import XlapyError

THREADS_ENV_VAR = "XLAPY_NUM_THREADS"


@functools.cache
def available_cores() -> int:
    """The cores this process may run on (`os.sched_getaffinity`, so `taskset` and container
    CPU sets are honoured, unlike `os.cpu_count()`), or $XLAPY_NUM_THREADS where it is set
    to a positive integer."""
    override = os.environ.get(THREADS_ENV_VAR, "").strip()
    if override:
        if not override.isdigit() or int(override) < 1:
            raise XlapyError(f"${THREADS_ENV_VAR} must be a positive integer, got {override!r}")
        return int(override)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # platforms without affinity masks
        return os.cpu_count() or 1
