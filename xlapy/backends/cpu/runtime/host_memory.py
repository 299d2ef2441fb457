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
import threading
import weakref

import numpy as np

MAPPED_BYTES = 1 << 22
"""Buffers of this many bytes or more are mapped (NumPy's huge-page threshold)."""

_U8 = np.dtype(np.uint8)
_PRIVATE = {"flags": mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS} if hasattr(mmap, "MAP_PRIVATE") else {}
"""Private, as malloc's memory: mmap's default for fd -1 is MAP_SHARED, which a fork()ed
child would share with its parent (and which the kernel backs with shmem)."""


RECYCLED_BYTES = 1 << 28
"""Released mappings kept for reuse, at most this many bytes in all: a program run again
gets its arenas and outputs back with their pages already mapped. Without reuse every run
of a program with a 4 MiB output paid about 2 ms of page faults (1,024 first touches) that
malloc's reuse of freed memory never paid: elementwise programs ran 5-7x slower."""

_free: dict[int, list[mmap.mmap]] = {}
_free_bytes = 0
_lock = threading.Lock()


def _release(mapping: mmap.mmap) -> None:
    """Called when the last array viewing `mapping` is going: keep it for reuse while the
    budget allows, else let it go. Not `mapping.close()`: the finalizer runs while the
    dying array still holds its buffer export, and closing then raised BufferError
    ("cannot close exported pointers exist", an unraisable exception in a finalizer: 45 of
    them failed JAX's sparse_bcoo_bcsr_test under pytest); the mapping unmaps itself when
    that export and this last reference are gone."""
    global _free_bytes
    size = len(mapping)
    with _lock:
        if _free_bytes + size <= RECYCLED_BYTES:
            _free.setdefault(size, []).append(mapping)
            _free_bytes += size


def empty_bytes(size: int) -> np.ndarray:
    """A writable uint8 array of `size` bytes (contents undefined).

    The array keeps its mapping alive; when the last array viewing it is collected the
    mapping is kept for the next request of the same size (RECYCLED_BYTES in all) or
    goes back to the system."""
    global _free_bytes
    if size < MAPPED_BYTES:
        return np.empty(size, _U8)
    mapping = None
    with _lock:
        stack = _free.get(size)
        if stack:
            mapping = stack.pop()
            _free_bytes -= size
    if mapping is None:
        mapping = mmap.mmap(-1, size, **_PRIVATE)
    array = np.frombuffer(mapping, _U8)
    weakref.finalize(array, _release, mapping).atexit = False
    return array
