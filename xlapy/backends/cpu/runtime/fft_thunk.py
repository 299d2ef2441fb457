# FFT thunks: HLO's fft (FFT, IFFT, RFFT, IRFFT over the innermost 1 to 3 dims) on the arena.
#
# Through DUCC (ducc0.fft: the FFT library XLA:CPU runs its FFTs with, pocketfft's
# successor): its c2c, r2c and c2r read the operand's slice and write the result's slice
# where they lie, in any layout (strided logical views), in the operand's precision, with
# no copy of either. ducc0 is a dependency (pyproject.toml); where it cannot be imported,
# or with the compile option fft_library="scipy", the thunk runs scipy.fft instead
# (xlapy/backends/fft.py, the interpreter's rule) and copies its result into the slice. So
# does a thunk whose operand and result share bytes (ducc0 wants them apart).
#
# Passes and threads. A transform runs as a plan of ducc calls ("passes") fixed by its
# shape. A small one (fewer than THREADED_MIN_ELEMENTS elements in or out) is one call over
# all its axes on the calling thread. A larger one is one call per axis (the last axis
# first, from the operand into the result, then the other axes in place on the result; an
# IRFFT's complex axes first, into a scratch buffer of the operand's shape kept per thread,
# its real axis last: the order of a c2r), and each pass
# is cut along its longest other dim into blocks over the process's worker pool
# (pool.split_parts: its cost model, the pass's estimated one-thread time against the
# measured cost of a hand-off, decides how many blocks, at most one per core the process
# may use; pool.run_blocks: the caller takes back any block no worker has started, so a
# busy machine degrades to one thread, never to waiting). ducc always runs with nthreads=1:
# its own thread pool would compete with xlapy's for the same cores.
#
# Blocks hold whole groups of SIMD lines: ducc transforms `vlen` lines at once (8 single /
# 4 double precision lines with AVX2, twice that with AVX-512) and the lines left over one
# at a time, 3x slower for long lines; so a block boundary falls only where the lines
# before it are a multiple of vlen, which also makes every line take the same path (the
# same bits) however the pass is cut, for row-major operands. The inverse transforms' 1/N
# is applied per pass (1/n of its axis); the plan, fixed by the shape, fixes the result.

from __future__ import annotations

import functools
import math
import os
import sys
import threading
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from xlapy.backends.cpu.runtime.pool import even_blocks, pool_size, run_blocks, split_parts
from xlapy.backends.cpu.runtime.thunk import BufferSlice, ExecutionContext, Thunk
from xlapy.backends.fft import THREADED_MIN_ELEMENTS, check, result_shape, transform
from xlapy.ir.instruction import HloInstruction

LIBRARIES = ("ducc0", "scipy")
"""What the compile option fft_library may name (ducc0, the default, falls back to scipy
where it cannot be imported)."""

SECONDS_PER_POINT = {4: 0.25e-9, 8: 0.5e-9}
"""One-thread seconds per point and log2 of the axis length of a complex pass, by the size
of a real element (single, double precision): ducc0 on a 2-core x86 (2026-11-27)."""
SMOOTH_PRIMES = (2, 3, 5, 7, 11)
HARD_LENGTH_FACTOR = 4.0
"""An axis whose length has a prime factor above 11 runs ducc's slower generic or
Bluestein passes: about this many times the time per point."""


_UNRESOLVED = object()
"""A thunk's library before its first run: ducc0 is imported then, not when compiling."""


DUCC_PSABI_LEVEL = "3"
"""The widest x86-64 feature level of ducc0's kernels xlapy lets it pick: 3, AVX2 (PyPI's
ducc0 carries builds for levels 1, 3 and 4 and takes the widest the CPU has). XLA:CPU's own
ducc is compiled for AVX-class vectors; on an AMD EPYC with AVX-512 (2-core KVM,
2026-11-27) ducc0 0.42's level-4 build ran single-precision transforms along the
contiguous axis at half the speed of its level-3 build (r2c of 1024 x 1024 f32: 1.93 vs
0.93 ms; c2c 4.99 vs 2.14 ms), double precision within 10%. A user's own
DUCC0_MAX_PSABI_LEVEL is respected, and so is a ducc0 the process imported before."""


def ducc_psabi_level() -> str:
    """DUCC_PSABI_LEVEL, or 2 (SSE4.2: PyPI's ducc0 then runs its level-1 build) where
    $XLAPY_CPU_MAX_ISA (jit/engine.py) caps the process below AVX2: ducc0 picks its build
    once per process, when imported, so the compile option max_isa does not reach it."""
    level = os.environ.get("XLAPY_CPU_MAX_ISA", "").strip().upper().replace(".", "_")
    return "2" if level in ("SSE4_2", "SSE42", "AVX") else DUCC_PSABI_LEVEL


@functools.cache
def _ducc0() -> ModuleType | None:
    """ducc0 imported with its kernel level capped at ducc_psabi_level() (ducc0 reads
    DUCC0_MAX_PSABI_LEVEL once, when it is first imported: the variable is set for that
    import only, and the process's environment is left as it was); None where ducc0 cannot
    be imported."""
    if "ducc0" in sys.modules or "DUCC0_MAX_PSABI_LEVEL" in os.environ:
        try:
            import ducc0
        except ImportError:
            return None
        return ducc0
    os.environ["DUCC0_MAX_PSABI_LEVEL"] = ducc_psabi_level()
    try:
        import ducc0
    except ImportError:
        return None
    finally:
        del os.environ["DUCC0_MAX_PSABI_LEVEL"]
    return ducc0


@functools.cache
def ducc_fft() -> ModuleType | None:
    """ducc0.fft, or None where ducc0 cannot be imported (the thunks then run scipy.fft)."""
    if _ducc0() is None:
        return None
    import ducc0.fft

    return ducc0.fft


@functools.cache
def vector_lines(real_itemsize: int) -> int:
    """How many lines ducc transforms at once (its SIMD width in real elements of that size
    on this CPU); 16 where ducc0 does not say."""
    if _ducc0() is None:
        return 16
    try:
        import ducc0.misc

        single, double = ducc0.misc.native_vector_lengths()
    except (ImportError, AttributeError, ValueError, TypeError):
        return 16
    return max(1, int(single if real_itemsize == 4 else double))


def _hard(n: int) -> bool:
    for p in SMOOTH_PRIMES:
        while n > 1 and n % p == 0:
            n //= p
    return n > 1


@dataclass(frozen=True, slots=True)
class FftPass:
    """One ducc call of a plan: `op` (c2c, r2c, c2r) over `axes` of the logical arrays
    `src` and `dst` (each "in", "out" or "scratch"); `lastsize` is c2r's real length.
    `split`: the axis its blocks are cut along (None: one call), of `extent`, each index
    of which holds `lines` lines of the pass; `itemsize`: the bytes of a real element;
    `seconds`: its estimated one-thread time, which decides the blocks."""

    op: str
    axes: tuple[int, ...]
    src: str
    dst: str
    forward: bool
    inorm: int
    lastsize: int
    split: int | None = None
    extent: int = 1
    lines: int = 1
    itemsize: int = 8
    seconds: float = 0.0

    def call(self, fft: Any, src: np.ndarray, dst: np.ndarray) -> None:
        if self.op == "c2c":
            fft.c2c(src, axes=self.axes, forward=self.forward, inorm=self.inorm, out=dst)
        elif self.op == "r2c":
            fft.r2c(src, axes=self.axes, forward=True, inorm=0, out=dst)
        else:
            fft.c2r(src, axes=self.axes, lastsize=self.lastsize, forward=False, inorm=2,
                    out=dst, allow_overwriting_input=self.src == "scratch")  # fmt: skip

    def blocks(self) -> list[tuple[int, int]]:
        """The blocks of the split axis this pass runs as on this machine: one, or whole
        groups of ducc's SIMD lines cut by the pool's cost model (see the file comment)."""
        if self.split is None:
            return [(0, self.extent)]
        vlen = vector_lines(self.itemsize)
        granule = vlen // math.gcd(vlen, self.lines)  # indices holding a multiple of vlen lines
        groups = -(-self.extent // granule)
        parts = split_parts(groups, self.seconds)
        if parts == 1:
            return [(0, self.extent)]
        cut = even_blocks(groups, parts)
        return [(lo * granule, min(hi * granule, self.extent)) for lo, hi in cut]

    def run(self, fft: Any, src: np.ndarray, dst: np.ndarray) -> None:
        blocks = self.blocks()
        if len(blocks) == 1:
            self.call(fft, src, dst)
            return
        lead = (slice(None),) * (self.split or 0)

        def block(lo: int, hi: int) -> None:
            part = (*lead, slice(lo, hi))
            self.call(fft, src[part], dst[part])

        run_blocks(block, blocks)


def plan_passes(
    kind: str, dims: tuple[int, ...], lengths: tuple[int, ...], itemsize: int
) -> tuple[FftPass, ...]:
    """The ducc calls of a `kind` transform of an operand of logical dims `dims` (checked)
    with fft_length `lengths`, whose real elements take `itemsize` bytes (see the file
    comment)."""
    rank, k = len(dims), len(lengths)
    axes = tuple(range(rank - k, rank))
    out_dims = result_shape(kind, dims, lengths)
    forward = kind in ("FFT", "RFFT")
    inorm = 0 if forward else 2
    last = {"FFT": "c2c", "IFFT": "c2c", "RFFT": "r2c", "IRFFT": "c2r"}[kind]
    elements = max(math.prod(dims), math.prod(out_dims))
    if elements < THREADED_MIN_ELEMENTS or rank == 1:
        return (FftPass(last, axes, "in", "out", forward, inorm, lengths[-1]),)

    per_point = SECONDS_PER_POINT.get(itemsize, SECONDS_PER_POINT[8])

    def one(op: str, axis: int, src: str, dst: str) -> FftPass:
        n = lengths[axis - rank + k]
        shape = out_dims if src == "out" else dims  # a pass's other dims: its arrays' own
        split = max((a for a in range(rank) if a != axis), key=lambda a: shape[a])
        lines = math.prod(shape[a] for a in range(rank) if a not in (axis, split))
        seconds = elements * per_point * math.log2(max(n, 2))
        if _hard(n):
            seconds *= HARD_LENGTH_FACTOR
        return FftPass(op, (axis,), src, dst, forward, inorm, n, split, shape[split], lines,
                       itemsize, seconds)  # fmt: skip

    if kind == "IRFFT":
        passes, src = [], "in"
        for axis in reversed(axes[:-1]):
            passes.append(one("c2c", axis, src, "scratch"))
            src = "scratch"
        return (*passes, one("c2r", axes[-1], src, "out"))
    return (
        one(last, axes[-1], "in", "out"),
        *(one("c2c", axis, "out", "out") for axis in reversed(axes[:-1])),
    )


class FftThunk(Thunk):
    """One fft instruction on the arena (see the file comment). The shape contract is
    checked when the thunk is built (EvaluationError naming the instruction)."""

    kind = "library"
    IMAGE_DEFERRED = ()
    IMAGE_DETACHED = ("instr",)
    """It reads its instruction to load or run: a program image keeps a copy of it that
    shares nothing with the module (loadable.detached), so neither reads the module."""

    def __init__(
        self,
        instr: HloInstruction,
        operand: BufferSlice,
        result: BufferSlice,
        library: str = "ducc0",
    ):
        self.instr, self.operand, self.result = instr, operand, result
        self.fft_type = instr.fft_type
        self.lengths = tuple(instr.fft_length)
        shape = operand.shape
        dtype = check(instr.name, self.fft_type, shape.dims, shape.dtype, self.lengths)
        self.library = library
        self.shared_bytes = operand.overlaps(result)
        real = dtype.itemsize if dtype.kind == "f" else dtype.itemsize // 2
        self.passes = plan_passes(self.fft_type, shape.dims, self.lengths, real)
        self._reset()

    def _reset(self) -> None:
        self._fft: Any = _UNRESOLVED if self.wants_ducc else None  # None: scipy.fft
        self._local = threading.local()  # per thread: the IRFFT's scratch buffer

    @property
    def wants_ducc(self) -> bool:
        return self.library == "ducc0" and not self.shared_bytes

    def fft_module(self) -> Any:
        """ducc0.fft, or None for scipy.fft (ducc0 imported on first use: ~20 ms a process
        pays once, at its first run of an fft rather than in a compile)."""
        fft = self._fft
        if fft is _UNRESOLVED:
            fft = self._fft = ducc_fft()
        return fft

    def __getstate__(self) -> dict:
        """The thunk without the module and per-thread buffers a run uses (found and made
        again where it is unpickled)."""
        state = dict(self.__dict__)
        state.pop("_fft")
        state.pop("_local")
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._reset()

    def run(self, ctx: ExecutionContext) -> None:
        x, y = ctx.view(self.operand), ctx.view(self.result)
        fft = self._fft
        if fft is _UNRESOLVED:
            fft = self.fft_module()
        if fft is None:
            np.copyto(y, transform(self.fft_type, x, self.lengths, self.instr.name), casting="no")
            return
        if x.size == 0 or y.size == 0:
            y[...] = 0
            return
        arrays = {"in": x, "out": y}
        if self.passes[0].dst == "scratch":
            arrays["scratch"] = self._scratch(x)
        for p in self.passes:
            p.run(fft, arrays[p.src], arrays[p.dst])

    def _scratch(self, x: np.ndarray) -> np.ndarray:
        kept = getattr(self._local, "scratch", None)
        if kept is None:
            kept = self._local.scratch = np.empty(x.shape, x.dtype)
        return kept

    def how(self) -> str:
        """Which library runs the transform, and how (the listing's note)."""
        if self.fft_module() is None:
            if self.wants_ducc:
                return "scipy.fft: ducc0 is not importable"
            return "scipy.fft" + (": operand and result share bytes" if self.shared_bytes else "")
        split = sum(p.split is not None for p in self.passes)
        if not split:
            return "ducc0"
        return f"ducc0, {len(self.passes)} pass(es) split over the pool when worth it"

    def describe(self) -> list[str]:
        lengths = ",".join(map(str, self.lengths))
        return [
            f"library {self.instr.name} = fft {self.fft_type} fft_length={{{lengths}}} "
            f"({self.how()})",
            f"in0: {self.operand}",
            f"out: {self.result}",
        ]

    def cost(self) -> float:
        seconds = sum(p.seconds for p in self.passes)
        if not seconds:  # one call on the calling thread: a small transform
            elements = max(self.operand.shape.num_elements, self.result.shape.num_elements)
            seconds = elements * SECONDS_PER_POINT[8] * math.log2(max(2, math.prod(self.lengths)))
        return 2_000 + seconds * 1e9

    def runs_alone(self) -> bool:
        """Whether no pass may split (decided without importing ducc0 or measuring the
        pool: a compile does neither)."""
        if pool_size() < 2:
            return True
        if not self.wants_ducc:  # scipy.fft runs its own threads from that size
            elements = max(self.operand.shape.num_elements, self.result.shape.num_elements)
            return elements < THREADED_MIN_ELEMENTS
        return all(p.split is None or p.extent < 2 for p in self.passes)
