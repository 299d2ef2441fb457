"""Native helpers the runtime runs but does not compile: the parallel-for of native_pool.py
and the MXCSR wrappers of dot_thunk.py. The driver (the package's __init__) installs a
compiler for them (jit/native_helpers.py), so runtime modules import neither codegen nor
jit, and get entry points the way thunks get their kernels."""

from __future__ import annotations

from typing import Protocol

import numpy as np


class NativeCode(Protocol):
    """What the runtime asks of the compiler of its helpers (addresses of native code that
    stays mapped for the life of the process)."""

    def parallel_for(self, futex: int, relax: str, max_args: int, spin: int) -> tuple[int, int]:
        """(xp_start, xp_run) of a new parallel-for (see native_pool.py)."""
        ...

    def mxcsr_flush(self) -> tuple[int, int]:
        """(`int32 flush()`: sets FTZ/DAZ, answers the MXCSR before; `void set(int32)`:
        restores it) (x86)."""
        ...

    def flushing_gemm(self, dtype: np.dtype, gemm: int, wide: bool) -> int:
        """The cblas gemm at `gemm` wrapped with FTZ/DAZ set around it (x86)."""
        ...

    def gemm_list(self, dtype: np.dtype, gemm: int, wide: bool, setter: int, flush: bool) -> int:
        """`void f(table, a, b, c, lo, hi)`: gemms lo..hi-1 of a table, each calling the
        gemm at `gemm` (the flushing gemm when `flush`), with OpenBLAS on one thread
        through `setter` when nonzero (codegen/emit_helpers.py's gemm list)."""
        ...


_installed: list[NativeCode] = []


def install(code: NativeCode) -> None:
    """Make `code` the compiler of the runtime's helpers (the driver does this once)."""
    _installed[:] = [code]


def native_code() -> NativeCode:
    """The installed compiler; raises when the runtime is used without its driver."""
    if not _installed:
        raise RuntimeError(
            "the CPU runtime's native helpers need a compiler: import xlapy.backends.cpu "
            "(its driver installs one)"
        )
    return _installed[0]
