# Compiles the runtime's native helpers (codegen/emit_helpers.py) and answers their entry
# points: the driver installs `JitNativeCode` into runtime/native_code.py, so the runtime
# runs this code without importing the compiler, as it runs kernels it is handed.
#
# The MXCSR wrappers, the flushing gemm and the gemm list are objects of the disk cache like
# kernels: they hold no address of this process; the gemm (and OpenBLAS's thread setter)
# they call are external symbols bound to this process's addresses before they are loaded
# (a fresh process with a dot loads them in well under a millisecond instead of ~10 ms of
# LLVM each). The parallel-for is compiled once per process (each pool gets its own
# globals). The code stays mapped for the life of the process (the pool's worker threads
# run it until the process ends).

from __future__ import annotations

import ctypes
import functools
import threading

import llvmlite.binding as llvm
import numpy as np

from xlapy.backends.cpu.codegen.emit_helpers import (
    BLAS_SETTER_SYMBOL,
    MXCSR_FLUSH_SYMBOL,
    MXCSR_SET_SYMBOL,
    flushing_gemm_ir,
    flushing_gemm_symbol,
    gemm_list_ir,
    gemm_list_symbol,
    gemm_target_symbol,
    mxcsr_flush_ir,
    mxcsr_set_ir,
    parallel_for_ir,
)
from xlapy.backends.cpu.jit.engine import (
    CodeHold,
    compile_object,
    host_target,
    new_target_machine,
    shared_engine,
)

_KEEP: list[object] = []  # engines and holds of the helpers' code, mapped for good
_lock = threading.Lock()
_bound: dict[str, int] = {}  # external symbol -> the address it was bound to


def _bind(symbol: str, address: int) -> None:
    """Bind the external `symbol` the helpers call to `address` (once per process: a
    loaded helper's calls were resolved against the first address, so another one is an
    error, not a silent rebinding)."""
    with _lock:
        bound = _bound.setdefault(symbol, address)
    if bound != address:
        raise RuntimeError(f"{symbol} is bound to {bound:#x}, asked again for {address:#x}")
    llvm.add_symbol(symbol, address)


def _load(ir_text: str, symbol: str) -> int:
    """Compile (or read from the disk cache) and load `ir_text`; the address of `symbol`,
    kept mapped for good. The external symbols it calls are bound already (_bind)."""
    obj = compile_object(ir_text, symbol=symbol)
    hold: CodeHold = shared_engine().load([(obj.key, obj.data)])[obj.key]
    with _lock:
        _KEEP.append(hold)
    return hold.address


class JitNativeCode:
    """The runtime's native helpers compiled in this process (runtime/native_code.py's
    NativeCode)."""

    def parallel_for(self, futex: int, relax: str, max_args: int, spin: int) -> tuple[int, int]:
        """(address of `xp_start(threads) -> started`, address of `xp_run(fn, args, nargs,
        extent, blocks) -> 0, or 1 when the pool was taken`) of a freshly compiled pool
        (each call makes a separate pool with its own globals)."""
        target = host_target()
        llvm.initialize_native_asmparser()  # for the spin loops' pause / yield
        libc = ctypes.CDLL(None)
        for name in ("syscall", "pthread_create"):
            llvm.add_symbol(name, ctypes.cast(getattr(libc, name), ctypes.c_void_p).value)
        module = llvm.parse_assembly(parallel_for_ir(futex, relax, max_args, spin))
        module.triple = target.triple
        module.verify()
        engine = llvm.create_mcjit_compiler(module, new_target_machine())
        engine.finalize_object()
        # never freed: worker threads run this code until the process ends
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(engine))
        with _lock:
            _KEEP.append(engine)
        return engine.get_function_address("xp_start"), engine.get_function_address("xp_run")

    def mxcsr_flush(self) -> tuple[int, int]:
        """The addresses of `int32 flush()` (sets FTZ/DAZ, answers the MXCSR before) and
        `void set(int32)` (restores it)."""
        return _mxcsr_flush()

    def flushing_gemm(self, dtype: np.dtype, gemm: int, wide: bool) -> int:
        """The address of a wrapper of the cblas gemm at `gemm` that flushes subnormals."""
        return _flushing_gemm(np.dtype(dtype), gemm, wide)

    def gemm_list(self, dtype: np.dtype, gemm: int, wide: bool, setter: int, flush: bool) -> int:
        """The address of a gemm-list kernel calling the cblas gemm at `gemm` (the
        flushing gemm when `flush`; see codegen/emit_helpers.py), OpenBLAS limited to one
        thread by `setter` when nonzero."""
        return _gemm_list(np.dtype(dtype), gemm, wide, setter, flush)


@functools.cache
def _mxcsr_flush() -> tuple[int, int]:
    return _load(mxcsr_flush_ir(), MXCSR_FLUSH_SYMBOL), _load(mxcsr_set_ir(), MXCSR_SET_SYMBOL)


@functools.cache
def _flushing_gemm(dtype: np.dtype, gemm: int, wide: bool) -> int:
    _bind(gemm_target_symbol(dtype, wide, "blas"), gemm)
    return _load(flushing_gemm_ir(dtype, wide), flushing_gemm_symbol(dtype))


@functools.cache
def _gemm_list(dtype: np.dtype, gemm: int, wide: bool, setter: int, flush: bool) -> int:
    role = "flushing" if flush else "blas"
    _bind(gemm_target_symbol(dtype, wide, role), gemm)
    if setter:
        _bind(BLAS_SETTER_SYMBOL, setter)
    return _load(gemm_list_ir(dtype, wide, role, bool(setter)), gemm_list_symbol(dtype))
