# Dots: BLAS on the arena (DotThunk), and the fast library path for the others.
#
# DotThunk: a dot of f32/f64/c64/c128 operands with a result of the same type. Without a
# batch, and where each operand's slice reads as one matrix (its dims merge into rows and
# columns with one stride each, as stored or transposed), it is one cblas gemm on arena
# addresses planned at compile time (cblas_gemm below; a column-major result is computed
# as its transpose), so a run only adds the allocation bases: ~1 us of Python per dot, not
# the ~5 us of building NumPy views. Other f32/f64/complex dots go to NumPy's matmul on
# views of the slices (transpose flags instead of copies wherever the contraction allows).
# Mixed precision and integer dots run as a rule thunk with the fast path below.
# Every BLAS call runs with one OpenBLAS thread; a large product may be split into blocks
# of rows, of columns when it is wider than tall (each block then packs only its part of
# the right operand; column blocks start on 64-byte lines), or of the batch, over the
# kernel pool, so BLAS's own threads never compete with the pool, and a busy machine
# degrades to one core instead of 5-15x. Whether a dot splits is learned per dot from its
# run times (thunk.SplitChoice): the hand-off to a worker costs tens of microseconds and,
# with the other core busy, splitting gains nothing.
#
# Planned gemms run natively: a product's tiles, or a batch of products whose matrices
# each read as BLAS matrices one fixed batch stride apart, are one table of gemms (GemmList)
# that a native kernel (codegen/emit_helpers.py's gemm list) runs, over the native pool
# (runtime/native_pool.py) when split: no Python per tile or batch item, no GIL hand-off,
# and OpenBLAS set to one thread inside the kernel on each worker. A batch run whole is the
# same kernel on the calling thread (one native call for the whole batch, not NumPy's
# matmul loop). Every tile sums its k products in the gemm's own order, so results do not
# depend on the thread count as far as OpenBLAS's kernel does not depend on the tile's
# size.
#
# Fast library dots for the cases DotThunk leaves to a rule thunk: mixed element types
# (bf16 x bf16 -> f32, f16 -> f32, bf16 -> bf16, ...) and integer dots (s8 x s8 -> s32, ...).
#
# The interpreter accumulates floats in f32 (f64 when the result or an operand is f64) and
# integers in 64 bits, wrapping to the result width at the end. The fast path picks a *work*
# dtype that gives the same numbers with BLAS:
#
# - floats and complex: the accumulation dtype itself (sgemm / dgemm / cgemm / zgemm); only
#   the order of the additions differs from the rule's;
# - integers: float32 (sgemm) when every partial sum is an integer below 2**24 in magnitude,
#   which `max|a| * max|b| * k < 2**24` guarantees (k products per sum; s8 x s8 up to
#   k = 1024), float64 (dgemm) below 2**53, so the float sums are exact and the result is the
#   rule's bit for bit; otherwise int64 (NumPy's own integer loop, modular like the rule's).
#
# Operands are brought into [batch, m, k] @ [batch, k, n] order with one conversion copy
# each (the copy the conversion needs anyway; supported_types keeps to the operand types
# whose plain NumPy cast is the interpreter's conversion), so BLAS gets unit-stride matrices;
# a strided operand reaching np.matmul would make NumPy use its slow non-BLAS loop. The
# product goes straight into the result when the result is row-major in the work dtype.
#
# Threads: OpenBLAS's own threads spin-wait for each other, and on a machine whose cores are
# busy with other work (or with xlapy's kernel pool) a multithreaded sgemm runs 5-15x slower
# than a one-thread one (measured: f32 [8192x144] @ [144x32], 2 cores under load, 9 ms with
# 2 BLAS threads, 0.9 ms with 1). So these paths run every BLAS call with one OpenBLAS thread
# (`openblas_set_num_threads_local`, set around the call and restored) and get parallelism
# the way kernels do: a large product is split into row blocks run on the kernel pool, one
# block inline on the calling thread; a block no worker has started by the time the caller is
# done with its own is taken back and run inline, so the caller never waits on queued work.
#
# cblas_gemm and raw_gemm expose OpenBLAS's gemm on raw addresses, for DotThunk's planned
# products and for those np.matmul cannot express (accumulating into a strided block of an
# existing result, see conv_thunk.py). They are called through cffi with addresses as plain
# ints: ~1 us a call, against ~2 us through ctypes with argtypes and ~1 us for np.matmul's
# own dispatch.
#
# Subnormals: XLA:CPU runs its dots with the MXCSR's flush-to-zero and denormals-are-zero
# bits set (`jax.jit(jnp.dot)` of 1e-20 * 1e-20 terms is 0), and so do compiled kernels here
# by default (codegen/emitter.py). A dot of a program compiled with denormals="flush" (the
# default) does the same on x86: its gemm is called through a small native wrapper (one per
# element type, `flushing_gemm`) that sets FTZ/DAZ, calls
# OpenBLAS's gemm on the same thread and restores the caller's MXCSR, so subnormal inputs
# read as zero and subnormal products, partial sums and results become zero, at no cost but
# two MXCSR writes a call; np.matmul paths run between the same two writes
# (`flushing(body)`). Every BLAS call of these paths runs on the thread that set the bits
# (one OpenBLAS thread, see above), so OpenBLAS's own threads never compute with the
# caller's mode. Native loops call the wrapper in place of the gemm. Off x86 and with
# denormals="ieee", dots keep IEEE subnormals.

from __future__ import annotations

import ctypes
import functools
import glob
import itertools
import math
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import cffi
import numpy as np

from xlapy.backends.cpu.runtime.loadable import loadable
from xlapy.backends.cpu.runtime.native_code import native_code
from xlapy.backends.cpu.runtime.native_pool import native_pool
from xlapy.backends.cpu.runtime.pool import even_blocks, pool_size, run_blocks
from xlapy.backends.cpu.runtime.thunk import (
    NS_PER_FLOP,
    BufferSlice,
    ExecutionContext,
    SplitChoice,
    Thunk,
)
from xlapy.backends.interpreter.rules.contraction import (
    accumulation_dtype,
    to_result,
)
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.types import PrimitiveType

_EXACT_F32, _EXACT_F64 = 1 << 24, 1 << 53
OPENBLAS_SERIAL_FLOPS = 2 * 4 * 65536
"""Products of at most this many flops (m*n*k <= 4 * 65536) OpenBLAS computes on one
thread of its own accord: no thread-count change is needed around them."""

PARALLEL_MIN_FLOPS = 1 << 23
"""Products with fewer multiply-adds (x2) than this run on the calling thread alone."""


@functools.cache
def _openblas_paths() -> tuple[str | None, ...]:
    here = os.path.dirname(np.__file__)
    found = glob.glob(os.path.join(here, os.pardir, "numpy.libs", "*openblas*.so*"))
    return (*sorted(found), None)


def _openblas_symbol(names: tuple[str, ...]):
    """(library path, name, ctypes function) for the first of `names` exported by OpenBLAS
    (NumPy's bundled copy first, then the process), or None."""
    for path in _openblas_paths():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in names:
            fn = getattr(lib, name, None)
            if fn is not None:
                return path, name, fn
    return None


@functools.cache
def _ffi_function(names: tuple[str, ...], signature: str):
    """The first of `names` that OpenBLAS exports, through cffi: `signature` is its C
    declaration with `{name}` for the name, and every pointer declared `uintptr_t`, so plain
    Python ints pass without conversion objects (a cffi call costs ~0.5 us; ctypes with
    argtypes ~2 us for a gemm's 14 arguments). None when no OpenBLAS is found."""
    found = _openblas_symbol(names)
    if found is None:
        return None
    path, name, _ = found
    ffi = cffi.FFI()
    ffi.cdef(signature.format(name=name, index="int64_t" if name.endswith("64_") else "int"))
    return getattr(ffi.dlopen(path), name)


@functools.cache
def cblas_gemm_address(dtype: np.dtype) -> tuple[int, bool] | None:
    """(the address of the cblas gemm that cblas_gemm(dtype) calls, whether its sizes are
    64-bit), for native code that calls it (a native while loop); None without one."""
    if dtype not in _GEMM_LETTERS:
        return None
    letter = _GEMM_LETTERS[dtype][0]
    found = _openblas_symbol((f"scipy_cblas_{letter}gemm64_", f"cblas_{letter}gemm64_",
                              f"cblas_{letter}gemm"))  # fmt: skip
    if found is None:
        return None
    _, name, fn = found
    return ctypes.cast(fn, ctypes.c_void_p).value or 0, name.endswith("64_")


@functools.cache
def blas_thread_setter():
    """OpenBLAS's `openblas_set_num_threads_local(n) -> previous`, or None."""
    return _ffi_function(("openblas_set_num_threads_local",), "int {name}(int);")


ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112
"""cblas's enums: row-major order; an operand as stored; an operand transposed."""
_GEMM_LETTERS = {np.dtype(np.float32): ("s", "float"), np.dtype(np.float64): ("d", "double")}


@functools.cache
def cblas_gemm(dtype: np.dtype):
    """OpenBLAS's cblas `?gemm(order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta,
    c, ldc)` for float32 / float64 with addresses as ints (enums: ROW_MAJOR, NO_TRANS, TRANS),
    or None when `dtype` has none or no OpenBLAS is loaded."""
    if dtype not in _GEMM_LETTERS:
        return None
    letter, scalar = _GEMM_LETTERS[dtype]
    names = (f"scipy_cblas_{letter}gemm64_", f"cblas_{letter}gemm64_", f"cblas_{letter}gemm")
    signature = (
        "void {name}(int, int, int, {index}, {index}, {index}, SCALAR, uintptr_t, {index},"
        " uintptr_t, {index}, SCALAR, uintptr_t, {index});"
    ).replace("SCALAR", scalar)
    return _ffi_function(names, signature)


@functools.cache
def raw_gemm(dtype: np.dtype):
    """OpenBLAS's row-major `C = A @ B + beta * C` for float32 / float64 on raw addresses, as
    `gemm(m, n, k, a, lda, b, ldb, beta, c, ldc, trans_a=False)` (leading dimensions in
    elements; with `trans_a`, A is stored as its [k, m] transpose), or None when `dtype` has
    none or no OpenBLAS is loaded. For products that np.matmul cannot express: accumulating
    into a strided block of an existing result."""
    fn = cblas_gemm(dtype)
    if fn is None:
        return None

    def gemm(m: int, n: int, k: int, a: int, lda: int, b: int, ldb: int, beta: float,
             c: int, ldc: int, trans_a: bool = False) -> None:  # fmt: skip
        ta = TRANS if trans_a else NO_TRANS
        fn(ROW_MAJOR, ta, NO_TRANS, m, n, k, 1.0, a, lda, b, ldb, beta, c, ldc)

    return gemm


# -- subnormals: FTZ/DAZ around BLAS (see the file comment) ------------------------------
_X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


@functools.cache
def _mxcsr_flush():
    """(`flush() -> previous`: sets the MXCSR's FTZ/DAZ bits on the calling thread;
    `set(previous)`: restores the MXCSR) as cffi functions (x86 only)."""
    flush, set_ = native_code().mxcsr_flush()
    ffi = cffi.FFI()
    return ffi.cast("int32_t(*)(void)", flush), ffi.cast("void(*)(int32_t)", set_)


def flushing(body):
    """`body(lo, hi)` run with the MXCSR's FTZ/DAZ bits set on the calling thread (x86; off
    x86 `body` itself), the caller's mode restored after it, also when it raises."""
    if not _X86:
        return body
    flush, restore = _mxcsr_flush()

    def run(lo: int, hi: int) -> None:
        previous = flush()
        try:
            body(lo, hi)
        finally:
            restore(previous)

    return run


@functools.cache
def flushing_gemm_address(dtype: np.dtype) -> tuple[int, bool] | None:
    """(the address of a native function with the signature of the cblas gemm that
    cblas_gemm(dtype) calls, which calls it with the MXCSR's FTZ/DAZ bits set and restores
    the caller's MXCSR; whether its sizes are 64-bit), or None off x86 or without OpenBLAS."""
    found = cblas_gemm_address(dtype)
    if found is None or not _X86:
        return None
    address, wide = found
    return native_code().flushing_gemm(dtype, address, wide), wide


@functools.cache
def flushing_gemm(dtype: np.dtype):
    """cblas_gemm(dtype) with subnormals flushed (flushing_gemm_address), or None."""
    found = flushing_gemm_address(dtype)
    if found is None:
        return None
    scalar = _GEMM_LETTERS[dtype][1]
    index = "int64_t" if found[1] else "int"
    signature = (
        f"void(*)(int, int, int, {index}, {index}, {index}, {scalar}, uintptr_t, {index},"
        f" uintptr_t, {index}, {scalar}, uintptr_t, {index})"
    )
    return cffi.FFI().cast(signature, found[0])


@functools.cache
def _blas_setter_address() -> int:
    """The address of OpenBLAS's `openblas_set_num_threads_local`, or 0 without one."""
    found = _openblas_symbol(("openblas_set_num_threads_local",))
    return (ctypes.cast(found[2], ctypes.c_void_p).value or 0) if found is not None else 0


_GemmListCall = ctypes.CFUNCTYPE(None, *[ctypes.c_int64] * 6)


@functools.cache
def gemm_list_kernel(dtype: np.dtype, flush: bool):
    """(address, ctypes function) of the native gemm-list kernel for float32 / float64
    (codegen/emit_helpers.py; `flush`: through the flushing gemm), or None without
    OpenBLAS's gemm for `dtype`."""
    found = flushing_gemm_address(dtype) if flush else cblas_gemm_address(dtype)
    if found is None:
        return None
    address = native_code().gemm_list(dtype, *found, _blas_setter_address(), flush)
    return address, _GemmListCall(address)


class GemmList:
    """Row-major gemms `C_e = A_e @ B_e` (the order, transposes, depth and leading
    dimensions shared; each gemm's byte offsets from three base addresses, rows and
    columns), run by the native gemm-list kernel: whole on the calling thread, or in blocks
    of gemms over the native pool (the Python pool without one), OpenBLAS on one thread
    per gemm either way."""

    __slots__ = ("_address", "_call", "_table_at", "count", "table")

    def __init__(self, kernel, trans: tuple[bool, bool], k: int, lds: tuple[int, int, int],
                 entries: Sequence[tuple[int, int, int, int, int]]):  # fmt: skip
        """`kernel`: gemm_list_kernel(dtype, flush); `entries`: (a offset, b offset,
        c offset, rows, columns) per gemm, offsets in bytes."""
        ta, tb = (TRANS if t else NO_TRANS for t in trans)
        head = [ROW_MAJOR, ta, tb, k, *lds]
        self.table = np.array([*head, *itertools.chain.from_iterable(entries)], np.int64)
        self.count = len(entries)
        self._address, self._call = kernel
        self._table_at = self.table.ctypes.data

    def run(self, a: int, b: int, c: int, blocks: int = 1) -> None:
        """Every gemm on the matrices at bases `a`, `b`, `c`, cut into `blocks` blocks."""
        count, table, call = self.count, self._table_at, self._call
        blocks = min(blocks, count)
        if blocks > 1:
            native = native_pool()
            if native is not None:
                native.run(self._address, (table, a, b, c), count, blocks)
                return
            run_blocks(lambda lo, hi: call(table, a, b, c, lo, hi), even_blocks(count, blocks))
            return
        call(table, a, b, c, 0, count)


def one_blas_thread(body, lo: int, hi: int) -> None:
    """`body(lo, hi)` with OpenBLAS limited to the calling thread (see the file comment)."""
    setter = blas_thread_setter()
    if setter is None:
        body(lo, hi)
        return
    previous = setter(1)
    try:
        body(lo, hi)
    finally:
        setter(previous)


def split_run(units: int, flops: float, body) -> None:
    """`body(lo, hi)` over [0, units): in row blocks on the kernel pool when `flops` is large
    (kernel.run_blocks: the caller runs one and takes back any no worker started), every
    block with one BLAS thread (see the file comment)."""
    if flops <= OPENBLAS_SERIAL_FLOPS:
        body(0, units)  # OpenBLAS runs these on the calling thread by itself
        return
    if flops < PARALLEL_MIN_FLOPS or units < 2:
        one_blas_thread(body, 0, units)
        return
    parts = pool_size()
    run_blocks(lambda lo, hi: one_blas_thread(body, lo, hi), even_blocks(units, parts))


def supported_types(instr: HloInstruction) -> bool:
    """Whether the fast contractions handle `instr`'s element types: float or complex
    operands with a float or complex result, or integer operands with an integer result."""
    result = instr.shape.element_type
    types = [op.shape.element_type for op in instr.operands]
    if result.is_pred or any(t.is_pred for t in types):
        return False
    if result.is_integral:
        return all(t.is_integral for t in types)
    return result.is_floating_or_complex and all(t.is_floating_or_complex for t in types)


def _magnitude(x: np.ndarray) -> int:
    if x.size == 0:
        return 0
    return max(abs(int(x.min())), abs(int(x.max())))


def work_dtype(acc: np.dtype, a: np.ndarray, b: np.ndarray, terms: int) -> np.dtype:
    """The dtype to multiply in (see the file comment) for operands `a`, `b` whose products
    are summed `terms` at a time, accumulating in `acc`."""
    if acc.kind not in "iu":
        return acc
    bound = _magnitude(a) * _magnitude(b) * max(terms, 1)
    if bound < _EXACT_F32:
        return np.dtype(np.float32)
    if bound < _EXACT_F64:
        return np.dtype(np.float64)
    return acc


def blas_ready(m: np.ndarray) -> np.ndarray:
    """`m` itself when its last two axes are a unit-stride matrix BLAS accepts, else a
    contiguous copy."""
    if m.ndim < 2 or m.size == 0:
        return m
    it = m.itemsize
    (r, c), (sr, sc) = m.shape[-2:], m.strides[-2:]
    if (sc == it or c == 1) and sr >= max(c, 1) * it and sr % it == 0:
        return m
    if (sr == it or r == 1) and sc >= max(r, 1) * it and sc % it == 0:
        return m
    return np.ascontiguousarray(m)


def from_work(y: np.ndarray, acc: np.dtype, result: PrimitiveType) -> np.ndarray:
    """A product computed in the work dtype, as the interpreter's result value."""
    if y.dtype != acc:  # exact float integers
        y = y.astype(np.int64)
        if acc != y.dtype:
            y = y.astype(acc)
    return to_result(y, result)


@functools.cache
def _contiguous_gemms(
    dtype: np.dtype, b: int, m: int, n: int, k: int, flops: float
) -> tuple[GemmList, int] | None:
    """(a gemm list, its block count) for `b` row-major products [m, k] @ [k, n] stored
    back to back, split like split_run (tiles over the pool's threads when `flops` is
    large); None without a gemm-list kernel for `dtype`."""
    if dtype not in _GEMM_LETTERS or 0 in (m, n, k):
        return None
    kernel = gemm_list_kernel(dtype, False)
    if kernel is None:
        return None
    parts = pool_size() if flops >= PARALLEL_MIN_FLOPS else 1
    row_parts, col_parts = tile_grid(m, n, -(-parts // b))
    rows, cols = even_blocks(m, row_parts), _blocks(n, col_parts, _BLOCK_QUANTUM)
    it = dtype.itemsize
    entries = [
        (
            it * (i * m * k + r0 * k),
            it * (i * k * n + c0),
            it * (i * m * n + r0 * n + c0),
            r1 - r0,
            c1 - c0,
        )
        for i in range(b)
        for (r0, r1), (c0, c1) in itertools.product(rows, cols)
    ]
    return GemmList(kernel, (False, False), k, (k, n, n), entries), parts


@loadable
def plan_dot(instr: HloInstruction):
    """A fast dot for mixed-precision and integer dots (see the file comment), or None."""
    if len(instr.operands) != 2 or not instr.shape.is_array or not supported_types(instr):
        return None
    lhs, rhs = instr.operands
    a = instr.dot_dimension_numbers
    lb, rb = a.lhs_batch, a.rhs_batch
    lc, rc = a.lhs_contracting, a.rhs_contracting
    ls, rs = lhs.shape.dims, rhs.shape.dims
    if len(lb) != len(rb) or len(lc) != len(rc):
        return None
    if any(ls[i] != rs[j] for i, j in zip((*lb, *lc), (*rb, *rc), strict=True)):
        return None
    lf = [d for d in range(len(ls)) if d not in lb and d not in lc]
    rf = [d for d in range(len(rs)) if d not in rb and d not in rc]
    b = math.prod(ls[d] for d in lb)
    m = math.prod(ls[d] for d in lf)
    k = math.prod(ls[d] for d in lc)
    n = math.prod(rs[d] for d in rf)
    dims = instr.shape.dims
    if math.prod(dims) != b * m * n or 0 in (b, m, n):
        return None
    lperm, rperm = [*lb, *lf, *lc], [*rb, *rc, *rf]
    result = instr.shape.element_type

    flops = 2.0 * b * m * k * n
    batched = b > 1

    def run(values, out, ctx) -> bool:
        x, y = values
        acc = accumulation_dtype(result, x, y)
        work = work_dtype(acc, x, y, k)
        xa = np.ascontiguousarray(x.transpose(lperm), dtype=work).reshape(b, m, k)
        ya = np.ascontiguousarray(y.transpose(rperm), dtype=work).reshape(b, k, n)
        direct = work == out.dtype and out.flags.c_contiguous
        prod = out.reshape(b, m, n) if direct else np.empty((b, m, n), work)

        gemms = _contiguous_gemms(work, b, m, n, k, flops)
        if gemms is not None:
            gemms[0].run(xa.ctypes.data, ya.ctypes.data, prod.ctypes.data, gemms[1])
        else:

            def block(lo: int, hi: int) -> None:
                if batched:
                    np.matmul(xa[lo:hi], ya[lo:hi], out=prod[lo:hi])
                else:
                    np.matmul(xa[0, lo:hi], ya[0], out=prod[0, lo:hi])

            split_run(b if batched else m, flops, block)
        if not direct:
            np.copyto(out, from_work(prod, acc, result).reshape(dims))
        return True

    return run


# -- DotThunk: BLAS on arena addresses ---------------------------------------------------
P = PrimitiveType
_BLAS_TYPES = frozenset({P.F32, P.F64, P.C64, P.C128})


def blas_dot_supported(instr: HloInstruction) -> bool:
    """Whether DotThunk handles `instr`: one element type in and out, BLAS-able."""
    t = instr.shape.element_type
    return t in _BLAS_TYPES and all(op.shape.element_type is t for op in instr.operands)


@dataclass(frozen=True, slots=True)
class _MatrixView:
    """How a dot operand's slice is seen as a [batch, rows, cols] array: its bytes as the
    physical dims, one transpose (the layout's and the dot's dimension order together),
    one reshape: a view wherever the contraction allows, as BLAS takes transpose flags."""

    allocation: int
    start: int
    end: int
    dtype: np.dtype
    physical: tuple[int, ...]
    perm: tuple[int, ...]
    shape: tuple[int, int, int]

    @staticmethod
    def of(s: BufferSlice, order: Sequence[int], shape: tuple[int, int, int]) -> _MatrixView:
        """`order`: the logical dims in the order the [batch, rows, cols] array wants them."""
        major_to_minor = tuple(reversed(s.shape.layout_or_default.minor_to_major))
        axis_of = {d: k for k, d in enumerate(major_to_minor)}  # logical dim -> physical axis
        return _MatrixView(
            s.allocation,
            s.offset,
            s.offset + s.size,
            s.shape.dtype,
            tuple(s.shape.dims[d] for d in major_to_minor),
            tuple(axis_of[d] for d in order),
            shape,
        )

    def array(self, memory) -> np.ndarray:
        raw = memory[self.allocation][self.start : self.end].view(self.dtype)
        return raw.reshape(self.physical).transpose(self.perm).reshape(self.shape)

    def strides(self) -> tuple[int, int, int] | None:
        """The element strides of the [batch, rows, cols] array when it is a view of the
        slice (else None: the reshape would copy)."""
        steps = [1] * len(self.physical)
        for axis in range(len(self.physical) - 2, -1, -1):
            steps[axis] = steps[axis + 1] * self.physical[axis + 1]
        axes = [(self.physical[p], steps[p]) for p in self.perm if self.physical[p] != 1]
        out = []
        for size in self.shape:
            extent, stride = 1, 0
            while extent < size and axes:
                dim, step = axes.pop(0)
                if extent > 1 and stride != step * dim:
                    return None  # the axes of one group do not merge into one stride
                extent, stride = extent * dim, step
            if extent != size:
                return None
            out.append(stride)
        return (out[0], out[1], out[2])

    def batched(self) -> tuple[np.ndarray, int, int] | None:
        """(the element offset of each batch item, the row stride, the column stride) when
        every item's [rows, cols] matrix is a view of the slice with one row and one column
        stride; the batch dims need not merge into one stride (JAX's attention batches
        over batch and heads that lie apart). None otherwise."""
        steps = [1] * len(self.physical)
        for axis in range(len(self.physical) - 2, -1, -1):
            steps[axis] = steps[axis + 1] * self.physical[axis + 1]
        axes = [(self.physical[p], steps[p]) for p in self.perm if self.physical[p] != 1]
        b, rows, cols = self.shape
        offsets, extent = np.zeros(1, np.int64), 1
        while extent < b and axes:
            dim, step = axes.pop(0)
            offsets = (offsets[:, None] + step * np.arange(dim, dtype=np.int64)).ravel()
            extent *= dim
        if extent != b:
            return None
        out = []
        for size in (rows, cols):
            extent, stride = 1, 0
            while extent < size and axes:
                dim, step = axes.pop(0)
                if extent > 1 and stride != step * dim:
                    return None
                extent, stride = extent * dim, step
            if extent != size:
                return None
            out.append(stride)
        return offsets, out[0], out[1]


@dataclass(frozen=True, slots=True)
class _BlasMatrix:
    """A [rows, cols] operand as row-major cblas takes it: its byte offset in its
    allocation, leading dimension, whether it is stored transposed, and the bytes one row
    and one column move (for blocks)."""

    allocation: int
    offset: int
    ld: int
    trans: bool
    row_bytes: int
    col_bytes: int

    @staticmethod
    def of(view: _MatrixView, transposed_ok: bool = True) -> _BlasMatrix | None:
        """The matrix of a batch-1 view, or None when BLAS cannot read it in place."""
        strides = view.strides()
        if strides is None:
            return None
        _, rows, cols = view.shape
        _, sr, sc = strides
        return _BlasMatrix.at(view, rows, cols, sr, sc, transposed_ok)

    @staticmethod
    def at(view: _MatrixView, rows: int, cols: int, sr: int, sc: int,
           transposed_ok: bool = True) -> _BlasMatrix | None:  # fmt: skip
        """The [rows, cols] matrix at the start of `view`'s slice with element strides
        `sr`, `sc`, or None when BLAS cannot read it in place."""
        it = view.dtype.itemsize
        if (cols == 1 or sc == 1) and (rows == 1 or sr >= cols):
            ld = sr if rows > 1 else max(cols, 1)
            return _BlasMatrix(view.allocation, view.start, ld, False, sr * it, sc * it)
        if transposed_ok and (rows == 1 or sr == 1) and (cols == 1 or sc >= rows):
            ld = sc if cols > 1 else max(rows, 1)
            return _BlasMatrix(view.allocation, view.start, ld, True, sr * it, sc * it)
        return None

    def transposed(self) -> _BlasMatrix:
        """The same bytes read as the [cols, rows] transpose."""
        return _BlasMatrix(
            self.allocation, self.offset, self.ld, not self.trans, self.col_bytes, self.row_bytes
        )


@dataclass(frozen=True, slots=True)
class _GemmPlan:
    """One cblas gemm `out = lhs @ rhs` ([m, k] @ [k, n]) on arena addresses; the result
    is always row-major (a column-major result is computed as its transpose)."""

    lhs: _BlasMatrix
    rhs: _BlasMatrix
    out: _BlasMatrix
    m: int
    n: int
    k: int

    @staticmethod
    def of(a: _MatrixView, c: _MatrixView, out: _MatrixView) -> _GemmPlan | None:
        """The plan for a batch-1 product, or None when an operand is no BLAS matrix."""
        lhs, rhs, res = _BlasMatrix.of(a), _BlasMatrix.of(c), _BlasMatrix.of(out)
        if lhs is None or rhs is None or res is None:
            return None
        _, m, k = a.shape
        n = c.shape[2]
        if not res.trans:
            return _GemmPlan(lhs, rhs, res, m, n, k)
        return _GemmPlan(rhs.transposed(), lhs.transposed(), res.transposed(), n, m, k)


_BLOCK_QUANTUM = 16
"""Column blocks start at multiples of this many elements, so each block's columns of the
right operand and the result start on a 64-byte line when the whole matrix does."""


def tile_grid(m: int, n: int, parts: int) -> tuple[int, int]:
    """(row blocks, column blocks) of an [m, n] product split into `parts` tiles: of the
    factorizations of `parts` (or fewer tiles when an extent is short), the one whose tiles
    pack the least of the operands. Each tile's gemm packs its rows of the left operand and
    its columns of the right one, k elements each, so it minimises m / rows + n / columns:
    a 512 x 512 product on 16 threads is 4 x 4 tiles (256 packed rows and columns per tile),
    not 16 column strips (544), and a short wide one stays in column strips."""
    best, best_packed = (1, 1), float("inf")
    for rows in range(1, min(parts, m) + 1):
        cols = min(parts // rows, n)
        packed = m / rows + n / cols
        tiles = rows * cols
        if tiles > best[0] * best[1] or (tiles == best[0] * best[1] and packed < best_packed):
            best, best_packed = (rows, cols), packed
    return best


def _blocks(extent: int, parts: int, quantum: int) -> list[tuple[int, int]]:
    if extent < 2 * quantum:
        return even_blocks(extent, parts)
    bounds = [0, *(extent * p // parts // quantum * quantum for p in range(1, parts)), extent]
    return [(lo, hi) for lo, hi in itertools.pairwise(bounds) if hi > lo]


class DotThunk(Thunk):
    """dot -> one cblas gemm on arena addresses, or matmul into the result slice (see the
    file comment)."""

    kind = "blas"

    def __init__(
        self, instr: HloInstruction, lhs: BufferSlice, rhs: BufferSlice, out, flush: bool = True
    ):
        """`flush`: subnormals flushed to zero, as XLA:CPU does (see the file comment)."""
        self.instr, self.lhs, self.rhs, self.out = instr, lhs, rhs, out
        self.flush = flush and _X86
        a = instr.dot_dimension_numbers
        lb, rb = a.lhs_batch, a.rhs_batch
        lc, rc = a.lhs_contracting, a.rhs_contracting
        ls, rs = lhs.shape.dims, rhs.shape.dims
        lf = [d for d in range(len(ls)) if d not in lb and d not in lc]
        rf = [d for d in range(len(rs)) if d not in rb and d not in rc]
        self.b = b = math.prod(ls[d] for d in lb)
        self.m = m = math.prod(ls[d] for d in lf)
        self.k = k = math.prod(ls[d] for d in lc)
        self.n = n = math.prod(rs[d] for d in rf)
        self.flops = 2 * b * m * n * k
        self._a = _MatrixView.of(lhs, [*lb, *lf, *lc], (b, m, k))
        self._c = _MatrixView.of(rhs, [*rb, *rc, *rf], (b, k, n))
        rank = out.shape.rank
        self._out = (
            _MatrixView.of(out, range(rank), (b, m, n))
            if out.shape.layout is None or out.shape.layout.is_default
            else None
        )
        dtype = out.shape.dtype
        self._fn = flushing_gemm(dtype) if self.flush else cblas_gemm(dtype)
        self._gemm = self._plan_gemm(out) if self._fn is not None else None
        self._batch = self._plan_batch(out) if self._fn is not None else None
        splits = self.flops >= PARALLEL_MIN_FLOPS and max(b, m, n) > 1
        self.split_choice = SplitChoice() if splits else None
        self._parts = pool_size()
        self._lists: dict[bool, GemmList] = {}  # whole / split gemm lists, made on first use

    def __getstate__(self) -> dict:
        """The thunk without its BLAS entry point and gemm lists (a process's addresses),
        which are made again when it is unpickled (a program image:
        jit/executable_cache.py)."""
        return {**self.__dict__, "_fn": None, "_lists": {}}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        dtype = self.out.shape.dtype
        self._fn = flushing_gemm(dtype) if self.flush else cblas_gemm(dtype)
        if self._fn is None:
            self._gemm = None

    def _plan_gemm(self, out: BufferSlice) -> _GemmPlan | None:
        if self.b != 1 or 0 in (self.m, self.n, self.k):
            return None
        if out.overlaps(self.lhs) or out.overlaps(self.rhs):
            return None  # np.matmul copies an overlapping operand first; BLAS would not
        rank = out.shape.rank
        res = _MatrixView.of(out, range(rank), (1, self.m, self.n))
        return _GemmPlan.of(self._a, self._c, res)

    def _plan_batch(self, out: BufferSlice) -> tuple[_GemmPlan, tuple[np.ndarray, ...]] | None:
        """A batched product as one gemm per batch item: (the plan of item 0, the byte
        offsets of every item's matrices from item 0's, for the plan's lhs, rhs and out), or
        None when an operand's items are no BLAS matrices."""
        if self.b == 1 or 0 in (self.m, self.n, self.k) or self._out is None:
            return None
        if out.overlaps(self.lhs) or out.overlaps(self.rhs):
            return None
        views = (self._a, self._c, self._out)
        found = [v.batched() for v in views]
        mats = [
            _BlasMatrix.at(v, v.shape[1], v.shape[2], f[1], f[2]) if f is not None else None
            for v, f in zip(views, found, strict=True)
        ]
        lhs, rhs, res = mats
        if lhs is None or rhs is None or res is None:
            return None
        it = out.shape.dtype.itemsize
        oa, oc, oo = (f[0] * it for f in found if f is not None)
        if not res.trans:
            return _GemmPlan(lhs, rhs, res, self.m, self.n, self.k), (oa, oc, oo)
        plan = _GemmPlan(rhs.transposed(), lhs.transposed(), res.transposed(), self.n, self.m,
                         self.k)  # fmt: skip
        return plan, (oc, oa, oo)  # the transposed product: the dot's rhs comes first

    def _gemm_list(self, split: bool) -> GemmList | None:
        """The planned product (or batch of products) as a gemm list: one gemm per batch
        item whole; split, tiles of tile_grid over the pool's threads (per batch item when
        the batch is shorter than the pool). None without a native gemm-list kernel."""
        made = self._lists.get(split)
        if made is not None:
            return made
        offsets: tuple[np.ndarray, ...]
        if self._gemm is not None:
            zero = np.zeros(1, np.int64)
            plan, offsets, b = self._gemm, (zero, zero, zero), 1
        elif self._batch is not None:
            (plan, offsets), b = self._batch, self.b
        else:
            return None
        kernel = gemm_list_kernel(self.out.shape.dtype, self.flush)
        if kernel is None:
            return None
        per_item = -(-self._parts // b) if split else 1
        row_parts, col_parts = tile_grid(plan.m, plan.n, per_item)
        rows = even_blocks(plan.m, row_parts)
        cols = _blocks(plan.n, col_parts, _BLOCK_QUANTUM)
        lhs, rhs, res = plan.lhs, plan.rhs, plan.out
        oa, ob, oc = (o.tolist() for o in offsets)
        entries = [
            (
                oa[i] + r0 * lhs.row_bytes,
                ob[i] + c0 * rhs.col_bytes,
                oc[i] + r0 * res.row_bytes + c0 * res.col_bytes,
                r1 - r0,
                c1 - c0,
            )
            for i in range(b)
            for (r0, r1), (c0, c1) in itertools.product(rows, cols)
        ]
        made = GemmList(kernel, (lhs.trans, rhs.trans), plan.k, (lhs.ld, rhs.ld, res.ld), entries)
        self._lists[split] = made
        return made

    def _run_list(self, ctx: ExecutionContext, split: bool) -> bool:
        """The product as a gemm list (see _gemm_list); False when it has none."""
        gemms = self._gemm_list(split)
        if gemms is None:
            return False
        plan = self._gemm
        if plan is None:
            assert self._batch is not None, "a gemm list has a plan"
            plan = self._batch[0]
        bases = ctx.bases
        gemms.run(
            bases[plan.lhs.allocation] + plan.lhs.offset,
            bases[plan.rhs.allocation] + plan.rhs.offset,
            bases[plan.out.allocation] + plan.out.offset,
            self._parts if split else 1,
        )
        return True

    def run(self, ctx: ExecutionContext) -> None:
        choice = self.split_choice
        if choice is None:
            self._run(ctx, False)
            return
        split = choice.next_split()
        start = time.perf_counter()
        self._run(ctx, split)
        choice.record(split, time.perf_counter() - start)

    def bind(self, ctx: ExecutionContext) -> Callable[[], object] | None:
        """A planned gemm as one pre-built call on `ctx`'s addresses (the whole product, as
        `_run_gemm` makes it unsplit); with a split choice, the choice still times every
        call and a call it wants split takes the general path."""
        whole = self._bind_whole(ctx)
        if whole is None:
            return functools.partial(self.run, ctx)
        choice = self.split_choice
        if choice is None:
            return whole
        clock, next_split, record = time.perf_counter, choice.next_split, choice.record
        run_gemm = self._run_gemm

        def call() -> None:
            split = next_split()
            start = clock()
            if split:
                run_gemm(ctx, True)
            else:
                whole()
            record(split, clock() - start)

        return call

    def _bind_whole(self, ctx: ExecutionContext) -> Callable[[], object] | None:
        """The unsplit gemm with its arguments bound, or None without a planned gemm."""
        if self._gemm is None or self._fn is None:
            return None
        gemm = functools.partial(self._fn, *self._gemm_args(ctx.bases))
        setter = blas_thread_setter()
        if self.flops <= OPENBLAS_SERIAL_FLOPS or setter is None:
            return gemm

        def one_thread() -> None:  # one_blas_thread without its call layers
            previous = setter(1)
            try:
                gemm()
            finally:
                setter(previous)

        return one_thread

    def native_gemm(
        self, max_flops: float = OPENBLAS_SERIAL_FLOPS
    ) -> tuple[int, bool, tuple] | None:
        """For native code calling this dot's gemm itself (a native while loop): (the gemm's
        address, whether its sizes are 64-bit, its arguments with (allocation, offset) pairs
        for the three matrices); None unless the dot is one planned gemm that runs whole on
        the calling thread (no split choice) with at most `max_flops` flops. Above
        OPENBLAS_SERIAL_FLOPS the caller must limit OpenBLAS to its own thread around the
        call (blas_thread_setter), as the runtime does for such a dot."""
        g = self._gemm
        if g is None or self.split_choice is not None or self.flops > max_flops:
            return None
        dtype = self.out.shape.dtype
        found = flushing_gemm_address(dtype) if self.flush else cblas_gemm_address(dtype)
        if found is None:
            return None
        lhs, rhs, out = g.lhs, g.rhs, g.out
        args = (
            ROW_MAJOR,
            TRANS if lhs.trans else NO_TRANS,
            TRANS if rhs.trans else NO_TRANS,
            g.m,
            g.n,
            g.k,
            (lhs.allocation, lhs.offset),
            lhs.ld,
            (rhs.allocation, rhs.offset),
            rhs.ld,
            (out.allocation, out.offset),
            out.ld,
        )
        return found[0], found[1], args

    def native_gemm_list(self) -> tuple[tuple[tuple[int, int], ...], int] | None:
        """For native code running this dot's batch as its gemm list (the whole list on the
        calling thread, as `_run_list` does unsplit): the (allocation, offset) of the first
        item's three matrices and the number of gemms; None unless the dot is a batch of
        planned gemms with no split choice and a gemm-list kernel exists. The kernel's and
        the list's addresses: `gemm_list_addresses()`, once the program runs."""
        if self._gemm is not None or self._batch is None or self.split_choice is not None:
            return None
        if gemm_list_kernel(self.out.shape.dtype, self.flush) is None:
            return None
        plan = self._batch[0]
        slots = tuple((m.allocation, m.offset) for m in (plan.lhs, plan.rhs, plan.out))
        return slots, self.b

    def gemm_list_addresses(self) -> tuple[int, int]:
        """(the gemm-list kernel's address, the address of this dot's whole gemm list)."""
        gemms = self._gemm_list(False)
        assert gemms is not None, "native_gemm_list answered for this dot"
        assert gemms.count == self.b, "a whole gemm list holds one gemm per batch item"
        return gemms._address, gemms.table.ctypes.data

    def _run(self, ctx: ExecutionContext, split: bool) -> None:
        if self._gemm is not None:
            self._run_gemm(ctx, split)
        elif self._batch is None or not self._run_list(ctx, split):
            self._run_matmul(ctx, split)

    def _gemm_args(self, bases) -> tuple:
        """The cblas gemm arguments of the whole product on memory at `bases`."""
        g = self._gemm
        assert g is not None
        lhs, rhs, out = g.lhs, g.rhs, g.out
        return (
            ROW_MAJOR,
            TRANS if lhs.trans else NO_TRANS,
            TRANS if rhs.trans else NO_TRANS,
            g.m,
            g.n,
            g.k,
            1.0,
            bases[lhs.allocation] + lhs.offset,
            lhs.ld,
            bases[rhs.allocation] + rhs.offset,
            rhs.ld,
            0.0,
            bases[out.allocation] + out.offset,
            out.ld,
        )

    def _run_gemm(self, ctx: ExecutionContext, split: bool) -> None:
        g, fn = self._gemm, self._fn
        assert g is not None
        lhs, rhs, out = g.lhs, g.rhs, g.out
        order, ta, tb, m, n, k, _, pa, lda, pb, ldb, _, pc, ldc = self._gemm_args(ctx.bases)

        def rows(lo: int, hi: int) -> None:
            a, c = pa + lo * lhs.row_bytes, pc + lo * out.row_bytes
            fn(order, ta, tb, hi - lo, n, k, 1.0, a, lda, pb, ldb, 0.0, c, ldc)

        def columns(lo: int, hi: int) -> None:
            b, c = pb + lo * rhs.col_bytes, pc + lo * out.col_bytes
            fn(order, ta, tb, m, hi - lo, k, 1.0, pa, lda, b, ldb, 0.0, c, ldc)

        if not split and self.flops <= OPENBLAS_SERIAL_FLOPS:
            rows(0, m)
            return
        if not split:
            one_blas_thread(rows, 0, m)
            return
        if self._run_list(ctx, True):
            return
        row_parts, col_parts = tile_grid(m, n, self._parts)
        if row_parts == 1:  # short and wide: each block packs only its columns of rhs
            blocks = _blocks(n, col_parts, _BLOCK_QUANTUM)
            run_blocks(lambda lo, hi: one_blas_thread(columns, lo, hi), blocks)
        elif col_parts == 1:
            blocks = even_blocks(m, row_parts)
            run_blocks(lambda lo, hi: one_blas_thread(rows, lo, hi), blocks)
        else:
            row_blocks = even_blocks(m, row_parts)
            col_blocks = _blocks(n, col_parts, _BLOCK_QUANTUM)
            tiles = list(itertools.product(row_blocks, col_blocks))

            def tile_range(lo: int, hi: int) -> None:
                for (r0, r1), (c0, c1) in tiles[lo:hi]:
                    a = pa + r0 * lhs.row_bytes
                    b = pb + c0 * rhs.col_bytes
                    c = pc + r0 * out.row_bytes + c0 * out.col_bytes
                    fn(order, ta, tb, r1 - r0, c1 - c0, k, 1.0, a, lda, b, ldb, 0.0, c, ldc)

            blocks = even_blocks(len(tiles), self._parts)
            run_blocks(lambda lo, hi: one_blas_thread(tile_range, lo, hi), blocks)

    def _run_matmul(self, ctx: ExecutionContext, split: bool) -> None:
        memory = ctx.memory
        a, c = self._a.array(memory), self._c.array(memory)
        b, m, n = self.b, self.m, self.n
        if self._out is None:  # a result in another layout: computed, then copied in
            result = np.empty((b, m, n), self.out.shape.dtype)
            self._split(split, b, lambda lo, hi: np.matmul(a[lo:hi], c[lo:hi], out=result[lo:hi]))
            np.copyto(ctx.view(self.out), result.reshape(self.out.shape.dims))
            return
        out = self._out.array(memory)
        if b == 1 and n > m:  # short and wide: each block packs part of c
            a0, c0, out0 = a[0], c[0], out[0]
            self._split(split, n, lambda lo, hi: np.matmul(a0, c0[:, lo:hi], out=out0[:, lo:hi]))
        elif b == 1:
            a0, c0, out0 = a[0], c[0], out[0]
            self._split(split, m, lambda lo, hi: np.matmul(a0[lo:hi], c0, out=out0[lo:hi]))
        else:
            self._split(split, b, lambda lo, hi: np.matmul(a[lo:hi], c[lo:hi], out=out[lo:hi]))

    def _split(self, split: bool, units: int, body) -> None:
        if self.flush:  # each block on its own thread: the bits are set per thread
            body = flushing(body)
        if self.flops <= OPENBLAS_SERIAL_FLOPS:
            body(0, units)
        elif not split or units < 2:
            one_blas_thread(body, 0, units)
        else:
            blocks = even_blocks(units, self._parts)
            run_blocks(lambda lo, hi: one_blas_thread(body, lo, hi), blocks)

    def describe(self) -> list[str]:
        how = (
            "cblas gemm"
            if self._gemm is not None
            else "cblas gemm per batch item"
            if self._batch is not None
            else "matmul"
        )
        how += ", subnormals flushed" if self.flush else ""
        if self.split_choice is not None:
            how += f", split x{self._parts} when faster"
        return [
            f"blas {self.instr.name} = dot [{self.b}x{self.m}x{self.k}] @ [{self.k}x{self.n}]"
            f" ({how})",
            f"lhs: {self.lhs}",
            f"rhs: {self.rhs}",
            f"out: {self.out}",
        ]

    def cost(self) -> float:
        return 2_000 + self.flops * NS_PER_FLOP

    def runs_alone(self) -> bool:
        return self.flops < PARALLEL_MIN_FLOPS
