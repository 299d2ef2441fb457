"""Fresh host memory for the CPU runtime's buffers: arenas, outputs, scratch.

A large buffer is an anonymous memory mapping of ordinary 4 KiB pages, not a NumPy
allocation. NumPy marks every array of 4 MiB or more with madvise(MADV_HUGEPAGE); under the
Linux default `transparent_hugepage/defrag = madvise`, the first touch of each 2 MiB of
such memory may stop the faulting thread to compact physical memory. On a busy machine
that made the first call of a big program cost several times its later calls, all of it
system time: drawing 1e8 Bernoulli samples (JAX's random_lax_test), 4.3-5.0 s of system
time for the 1.5 GB program and 8-9 s for the 3.9 GB one, against 1.0 and 1.6 s with plain
pages (XLA:CPU, whose allocator does not ask for huge pages, spends 1.5-3 s). Plain pages are
what XLA's own CPU buffers get; small buffers keep NumPy's allocator (malloc, no madvise).
"""

from __future__ import annotations

import mmap

import numpy as np

MAPPED_BYTES = 1 << 22
"""Buffers of this many bytes or more are mapped (NumPy's huge-page threshold)."""

_U8 = np.dtype(np.uint8)
_PRIVATE = {"flags": mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS} if hasattr(mmap, "MAP_PRIVATE") else {}
"""Private, as malloc's memory: mmap's default for fd -1 is MAP_SHARED, which a fork()ed
child would share with its parent (and which the kernel backs with shmem)."""


def empty_bytes(size: int) -> np.ndarray:
    """A writable uint8 array of `size` bytes (contents undefined; large ones read as 0).

    The array keeps its mapping alive; the memory goes back to the system when the last
    array viewing it is collected."""
    if size < MAPPED_BYTES:
        return np.empty(size, _U8)
    return np.frombuffer(mmap.mmap(-1, size, **_PRIVATE), _U8)
