# Fast library dots for the cases DotThunk leaves to the interpreter: mixed element types
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
# existing result, see lib_conv.py). They are called through cffi with addresses as plain
# ints: ~1 us a call, against ~2 us through ctypes with argtypes and ~1 us for np.matmul's
# own dispatch.

from __future__ import annotations

import ctypes
import functools
import glob
import math
import os

import cffi
import numpy as np

from xlapy.backends.cpu.jit.kernel import even_blocks, pool_size, run_blocks
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


def plan_dot(instr: HloInstruction):
    """A fast dot for mixed-precision and integer dots (see the file comment), or None."""
    if len(instr.operands) != 2 or not instr.shape.is_array or not supported_types(instr):
        return None
    lhs, rhs = instr.operands
    a = instr.attrs
    lb, rb = tuple(a.get("lhs_batch_dims") or ()), tuple(a.get("rhs_batch_dims") or ())
    lc, rc = tuple(a.get("lhs_contracting_dims") or ()), tuple(a.get("rhs_contracting_dims") or ())
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
