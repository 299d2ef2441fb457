# A parallel-for in native code, for kernels split over the cores: no Python between the
# caller's call and the last block's end.
#
# The pool is a few dozen lines of LLVM IR (codegen/emit_helpers.py, where its protocol is
# described), compiled once per process by the driver's compiler (runtime/native_code.py)
# and run by pool_size() - 1 threads made with pthread_create; the calling thread is the
# last worker. Workers spin briefly, then sleep on a futex; a caller that finds the pool
# taken (another Python thread's kernel, or a kernel running on a worker of the Python pool
# that splits too) runs its kernel whole on its own thread instead: nothing ever waits for
# the pool to become free.
#
# The workers never touch Python objects, so they need no GIL and the caller releases it
# for the whole job (a ctypes call). At process exit they are asleep in futex or running a
# block; the code they run is never freed (the engine is kept alive on purpose), so an
# interpreter shutdown cannot pull it from under them. A forked child has no workers: its
# caller claims every block itself.

from __future__ import annotations

import ctypes
import os
import platform
import threading
from collections.abc import Sequence

from xlapy.backends.cpu.runtime.native_code import native_code
from xlapy.backends.cpu.runtime.pool import pool_size

MAX_ARGS = 24
"""Kernels with more buffer arguments than this run on the Python pool instead."""
SPIN = 4000
"""Pause instructions a worker spins for before it sleeps (a few microseconds)."""
NATIVE_POOL_ENV = "XLAPY_NATIVE_POOL"
"""Environment variable: 0 runs split kernels on the Python pool (run_blocks) instead."""

_FUTEX = {"x86_64": (202, "pause"), "aarch64": (98, "yield")}


class NativePool:
    """The compiled pool and its started workers (see the file comment)."""

    def __init__(self, workers: int, futex: int, relax: str):
        start_at, run_at = native_code().parallel_for(futex, relax, MAX_ARGS, SPIN)
        start = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_int64)(start_at)
        self._run = ctypes.CFUNCTYPE(
            ctypes.c_int32, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
            ctypes.c_int64,
        )(run_at)  # fmt: skip
        self.run_address: int = run_at
        """For native callers (a native while loop): `i32 xp_run(i64 kernel, i64 args,
        i64 nargs, i64 extent, i64 blocks)`, what `run` calls (args: the address of an
        array of `nargs` pointers)."""
        self.workers = start(workers)

    def run(self, function: int, pointers: Sequence[int], extent: int, blocks: int) -> bool:
        """The kernel at address `function` on `pointers` over [0, extent), cut into
        `blocks` blocks over the workers and the calling thread; False when the pool was
        taken and the calling thread ran it whole."""
        if not 0 < len(pointers) <= MAX_ARGS or not 0 < blocks < 1 << 20 or extent < 0:
            raise ValueError(
                f"native pool: {len(pointers)} arguments, {blocks} blocks, extent {extent}"
            )
        blocks = max(1, min(blocks, extent))
        args = (ctypes.c_int64 * len(pointers))(*pointers)
        return self._run(function, ctypes.addressof(args), len(pointers), extent, blocks) == 0


_lock = threading.Lock()
_made: list[NativePool | None] = []  # the process's pool once made (None: it has none)


def native_pool() -> NativePool | None:
    """The process's native pool, started on first use (once, whichever threads ask at the
    same time); None with one thread, on machines it has no futex numbers for, or when
    $XLAPY_NATIVE_POOL is 0."""
    if _made:
        return _made[0]
    with _lock:
        if not _made:
            _made.append(_make())
        return _made[0]


def _make() -> NativePool | None:
    if os.environ.get(NATIVE_POOL_ENV, "1").strip() == "0" or pool_size() < 2:
        return None
    found = _FUTEX.get(platform.machine())
    if found is None or platform.system() != "Linux":
        return None
    return NativePool(pool_size() - 1, *found)
