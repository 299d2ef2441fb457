# Compiled kernels as Python callables.
#
# A Kernel owns the loaded native code of one emitted computation. `kernel(*arrays)` takes
# logical NumPy arrays, lays each out physically as its parameter's layout says, runs the
# whole outer range and returns logical arrays. `kernel.run_raw(pointers, start, end)` is the
# entry a thunk executor uses on buffers it already owns. ctypes releases the GIL during the
# call, so chunks of one kernel run in parallel in a thread pool (`run_parallel`).
#
# Oversubscription: the pool has one thread per core; a caller mixing kernels with BLAS calls
# should cap BLAS at one thread inside pool workers (OMP_NUM_THREADS / threadpoolctl), or run
# BLAS calls outside the pool, so the two never compete for the same cores.

from __future__ import annotations

import ctypes
import functools
import itertools
import os
import re
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from xlapy.backends.cpu import jit
from xlapy.backends.cpu.emitter import KernelSpec, emit_kernel
from xlapy.errors import XlapyError
from xlapy.ir.computation import HloComputation
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.opcodes import Opcode
from xlapy.ir.shapes import Shape


def _major_to_minor(shape: Shape) -> tuple[int, ...]:
    return tuple(reversed(shape.layout_or_default.minor_to_major))


def to_physical(x: np.ndarray, shape: Shape) -> np.ndarray:
    """The dense buffer of logical array `x` laid out as `shape`'s layout says."""
    arr = np.asarray(x, dtype=shape.dtype)
    return np.ascontiguousarray(np.transpose(arr, _major_to_minor(shape)))


def from_physical(buf: np.ndarray, shape: Shape) -> np.ndarray:
    """The logical (row-major) array of the dense buffer `buf` of `shape`."""
    if shape.rank == 0:
        return np.asarray(buf).reshape(())
    return np.ascontiguousarray(np.transpose(buf, np.argsort(_major_to_minor(shape))))


def _physical_dims(shape: Shape) -> tuple[int, ...]:
    return tuple(shape.dims[d] for d in _major_to_minor(shape))


SYMBOL = "xla_kernel"
"""The symbol every kernel is compiled under: kernels are emitted without the names of their
instructions, so structurally equal computations give the same IR text, share one disk cache
entry and, within a process, one loaded object. Dumps show the kernel's own name instead."""

_loaded: dict[str, tuple[jit.LoadedObject, bool]] = {}
_loaded_lock = threading.Lock()


def clear_loaded_objects() -> None:
    """Forget the objects loaded in this process (see compiler.clear_kernel_cache)."""
    with _loaded_lock:
        _loaded.clear()


def _load(ir_text: str, use_cache: bool) -> tuple[jit.LoadedObject, bool]:
    with _loaded_lock:
        hit = _loaded.get(ir_text) if use_cache else None
    if hit is not None:
        return hit[0], True
    obj = jit.compile_object(ir_text, use_cache)
    entry = (jit.LoadedObject(obj.data), obj.from_cache)
    if not use_cache:
        return entry
    with _loaded_lock:
        return _loaded.setdefault(ir_text, entry)


class Kernel:
    """A compiled kernel. Dumps: `llvm_ir` (as emitted), `optimized_ir`, `asm`."""

    def __init__(self, spec: KernelSpec, name: str | None = None, use_cache: bool = True):
        self.spec = spec
        self.name = name or spec.name
        self._loaded, self.from_cache = _load(spec.llvm_ir, use_cache)
        n = len(spec.outputs) + len(spec.params)
        proto = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * n), ctypes.c_int64, ctypes.c_int64)
        self._fn = proto(self._loaded.address(spec.name))

    @property
    def llvm_ir(self) -> str:
        """The emitted LLVM IR, the function named after the kernel."""
        if self.name == self.spec.name:
            return self.spec.llvm_ir
        return self.spec.llvm_ir.replace(f'@"{self.spec.name}"', f'@"{self.name}"').replace(
            f'ModuleID = "{self.spec.name}"', f'ModuleID = "{self.name}"'
        )

    @functools.cached_property
    def _optimized(self):
        return jit.optimize(self.llvm_ir)

    @property
    def optimized_ir(self) -> str:
        return str(self._optimized)

    @property
    def asm(self) -> str:
        return jit.assembly(self._optimized)

    @property
    def in_place(self) -> tuple[tuple[int, int], ...]:
        """(output leaf, parameter) pairs whose buffers the caller must make the same bytes:
        the kernel reads each such parameter through its output pointer and ignores the
        parameter's own pointer, so a thunk needs no scratch copy for them."""
        return self.spec.in_place

    @property
    def outer_extent(self) -> int:
        """The size of the range [start, end) the kernel's entry point splits on."""
        return self.spec.outer_extent

    def vector_types(self) -> set[str]:
        """LLVM vector types (`<8 x float>`) in the optimized IR: evidence of vectorization."""
        return set(re.findall(r"<\d+ x [a-z0-9]+>", self.optimized_ir))

    def run_raw(self, pointers: Sequence[int], start: int = 0, end: int | None = None) -> None:
        """Run rows [start, end) of the outer dimension on raw buffer addresses (outputs
        first, then parameters)."""
        self._fn(*pointers, start, self.outer_extent if end is None else end)

    def prepare(self, args: Sequence[np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """(output buffers, input buffers) in physical layout for logical `args`."""
        if len(args) != len(self.spec.params):
            raise XlapyError(
                f"kernel {self.name} takes {len(self.spec.params)} arguments, got {len(args)}"
            )
        inputs = []
        for i, (a, shape) in enumerate(zip(args, self.spec.params, strict=True)):
            arr = np.asarray(a)
            if arr.shape != shape.dims:
                raise XlapyError(
                    f"kernel {self.name}: argument {i} must be {shape.to_text(False)}, "
                    f"got {arr.dtype}{list(arr.shape)}"
                )
            inputs.append(to_physical(arr, shape))
        outputs = [np.empty(_physical_dims(s), s.dtype) for s in self.spec.outputs]
        return outputs, inputs

    @staticmethod
    def pointers(outputs, inputs) -> list[int]:
        return [a.ctypes.data for a in (*outputs, *inputs)]

    def finish(self, outputs) -> np.ndarray | tuple[np.ndarray, ...]:
        results = [from_physical(o, s) for o, s in zip(outputs, self.spec.outputs, strict=True)]
        return results[0] if len(results) == 1 else tuple(results)

    def __call__(self, *args: np.ndarray):
        """Run on logical arrays; returns the output (a tuple for several outputs)."""
        outputs, inputs = self.prepare(args)
        self.run_raw(self.pointers(outputs, inputs))
        return self.finish(outputs)


def compile_computation(
    comp: HloComputation,
    name: str = "xla_kernel",
    use_cache: bool = True,
    in_place: Sequence[tuple[int, int]] = (),
) -> Kernel:
    """Emit, optimize (or fetch from the disk cache) and load the kernel of `comp`.
    `in_place`: (output leaf, parameter) pairs that will be given the same bytes (see
    emitter.in_place_reason); the kernel reads those parameters through the outputs."""
    spec = emit_kernel(comp, SYMBOL, in_place)
    return Kernel(spec, _symbol(name), use_cache)


def _symbol(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", name) or "xla_kernel"


def wrap_instruction(instr: HloInstruction) -> HloComputation:
    """A computation whose parameters are `instr`'s operands and whose root is a copy of it."""
    params = [
        HloInstruction(f"p{i}", Opcode.PARAMETER, op.shape, parameter_number=i)
        for i, op in enumerate(instr.operands)
    ]
    clone = HloInstruction(
        instr.name, instr.opcode, instr.shape, params, instr.attrs, literal=instr.literal
    )
    return HloComputation(f"wrapped.{instr.name}", [*params, clone], clone)


def compile_instruction(instr: HloInstruction, use_cache: bool = True) -> Kernel:
    """Compile one unfused instruction (elementwise, shape op or reduce) as a kernel."""
    return compile_computation(wrap_instruction(instr), instr.name, use_cache)


@functools.cache
def default_pool() -> ThreadPoolExecutor:
    """The process-wide worker pool (one thread per core)."""
    return ThreadPoolExecutor(max_workers=os.cpu_count() or 1, thread_name_prefix="xlapy-cpu")


def run_blocks(body, blocks: Sequence[tuple[int, int]]) -> None:
    """`body(lo, hi)` for every block: the first on the calling thread, the others on the
    pool. A block no worker has started by the time the caller is done is taken back and
    run by the caller, so a busy pool (or a caller that is itself a pool worker) never
    waits on queued work: with the other cores taken the caller does everything itself,
    at the price of one submission per block."""
    if not blocks:
        return
    pool = default_pool()
    futures = [pool.submit(body, lo, hi) for lo, hi in blocks[1:]]
    try:
        body(*blocks[0])
    except BaseException:
        for f in futures:
            if not f.cancel():
                f.exception()
        raise
    for f, (lo, hi) in zip(futures, blocks[1:], strict=True):
        if f.cancel():
            body(lo, hi)
        else:
            f.result()


def run_parallel(kernel: Kernel, args: Sequence[np.ndarray], pool=None, chunks: int | None = None):
    """Run `kernel` on logical `args`, its outer range split into chunks across `pool`."""
    pool = pool or default_pool()
    outputs, inputs = kernel.prepare(args)
    ptrs = kernel.pointers(outputs, inputs)
    extent = kernel.outer_extent
    n = max(1, min(chunks or getattr(pool, "_max_workers", 1), extent))
    bounds = [extent * k // n for k in range(n + 1)]
    futures = [
        pool.submit(kernel.run_raw, ptrs, lo, hi)
        for lo, hi in itertools.pairwise(bounds)
        if hi > lo
    ]
    for f in futures:
        f.result()
    return kernel.finish(outputs)
