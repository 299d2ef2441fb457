# Library thunks: operations the kernel emitter does not generate code for, run on NumPy views
# of the executable's memory.
#
# - DotThunk: a dot of f32/f64/c64/c128 operands with a result of the same type. Without a
#   batch, and where each operand's slice reads as one matrix (its dims merge into rows and
#   columns with one stride each, as stored or transposed), it is one cblas gemm on arena
#   addresses planned at compile time (lib_dot.cblas_gemm; a column-major result is computed
#   as its transpose), so a run only adds the allocation bases: ~1 us of Python per dot, not
#   the ~5 us of building NumPy views. Other f32/f64/complex dots go to NumPy's matmul on
#   views of the slices (transpose flags instead of copies wherever the contraction allows).
#   Mixed precision and integer dots go through RuleThunk, whose fast path is lib_dot.py.
#   Every BLAS call runs with one OpenBLAS thread; a large product may be split into blocks
#   of rows, of columns when it is wider than tall (each block then packs only its part of
#   the right operand; column blocks start on 64-byte lines), or of the batch, over the
#   kernel pool, so BLAS's own threads never compete with the pool, and a busy machine
#   degrades to one core instead of 5-15x. Whether a dot splits is learned per dot from its
#   run times (thunks.SplitChoice): the hand-off to a worker costs tens of microseconds and,
#   with the other core busy, splitting gains nothing.
# - DynamicUpdateSliceThunk: writes only the update's window; when buffer assignment put the
#   result on its operand (in place) nothing else moves.
# - CustomCallThunk: C targets get pointers into the arena with the nested pointer-table
#   layout; aliased outputs are the operand's bytes. Python and typed-FFI targets (and
#   XLA-internal targets) go through the interpreter's rule.
# - RuleThunk: everything else (sort, fft, rng, reduce-window, convolution, the gathers and
#   scatters the emitters decline, ...) evaluates the interpreter's per-opcode rule on views
#   of the operands' slices and stores the value in the instruction's slices. Where a fast
#   NumPy implementation fits the instruction (FAST_PLANNERS: recognized sort comparators,
#   topk, prefix-scan and pooling reduce-windows, row gathers and scatters, convolutions as
#   im2col + matmul; see the lib_* modules), the thunk runs that instead, writing straight
#   into the result's views; a fast path may decline at run time (a NaN key under a float
#   compare, say) and the rule runs.

from __future__ import annotations

import functools
import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from xlapy.backends.base import replace_leaf
from xlapy.backends.cpu.jit.kernel import even_blocks, pool_size, run_blocks
from xlapy.backends.cpu.runtime.conv_thunk import plan_convolution
from xlapy.backends.cpu.runtime.dot_thunk import (
    NO_TRANS,
    OPENBLAS_SERIAL_FLOPS,
    PARALLEL_MIN_FLOPS,
    ROW_MAJOR,
    TRANS,
    blas_thread_setter,
    cblas_gemm,
    one_blas_thread,
    plan_dot,
)
from xlapy.backends.cpu.runtime.indexing_thunk import plan_gather, plan_scatter
from xlapy.backends.cpu.runtime.sort_thunk import plan_sort, plan_topk, plan_xla_topk
from xlapy.backends.cpu.runtime.thunk import (
    BufferSlice,
    ExecutionContext,
    SplitChoice,
    Thunk,
    ValueTree,
)
from xlapy.backends.cpu.runtime.window_thunk import plan_reduce_window, plan_select_and_scatter
from xlapy.backends.interpreter.registry import rule_for
from xlapy.errors import CustomCallError, EvaluationError
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.opcodes import Opcode
from xlapy.ir.types import PrimitiveType

P = PrimitiveType
_BLAS_TYPES = frozenset({P.F32, P.F64, P.C64, P.C128})

# opcode -> planner(instr) returning fast(values, result views, ctx) -> bool (False: declined)
FAST_PLANNERS = {
    Opcode.SORT: plan_sort,
    Opcode.TOPK: plan_topk,
    Opcode.REDUCE_WINDOW: plan_reduce_window,
    Opcode.SELECT_AND_SCATTER: plan_select_and_scatter,
    Opcode.GATHER: plan_gather,
    Opcode.SCATTER: plan_scatter,
    Opcode.CONVOLUTION: plan_convolution,
    Opcode.DOT: plan_dot,
}
# XLA-internal custom-call target -> planner
FAST_CUSTOM_CALL_PLANNERS = {"TopK": plan_xla_topk}


def plan_fast(instr: HloInstruction):
    """The fast implementation of `instr` (see the file comment), or None."""
    if instr.opcode is Opcode.CUSTOM_CALL:
        planner = FAST_CUSTOM_CALL_PLANNERS.get(instr.attrs.get("custom_call_target", ""))
    else:
        planner = FAST_PLANNERS.get(instr.opcode)
    if planner is None:
        return None
    try:
        return planner(instr)
    except Exception:  # an instruction a planner misreads keeps the interpreter's rule
        return None


def _tree_lines(label: str, tree: ValueTree, path: str = "") -> list[str]:
    if isinstance(tree, tuple):
        return [line for i, t in enumerate(tree) for line in _tree_lines(label, t, f"{path}{i}.")]
    if tree is None:
        return []
    return [f"{label}{{{path.rstrip('.')}}}: {tree}"]


class RuleThunk(Thunk):
    """The interpreter's rule for the instruction, on views of the arena."""

    kind = "library"

    def __init__(self, instr: HloInstruction, operands: list[ValueTree], result: ValueTree, why):
        self.instr, self.operands, self.result, self.why = instr, operands, result, why
        self.rule = rule_for(instr.opcode)
        self.fast = plan_fast(instr) if _all_arrays(result) else None

    def run(self, ctx: ExecutionContext) -> None:
        values = [ctx.read(t) for t in self.operands]
        if self.fast is not None:
            with np.errstate(all="ignore"):
                if self.fast(values, ctx.read(self.result), ctx):
                    return
        try:
            out = self.rule(self.instr, values, ctx.interpreter)
        except EvaluationError as e:
            if self.instr.name in str(e):
                raise
            raise EvaluationError(f"{self.instr.name}: {e}") from e
        ctx.write(self.result, out, self.instr.name)

    def describe(self) -> list[str]:
        if self.fast is not None:
            head = f"library {self.instr.name} = {self.instr.opcode.text} (fast NumPy path)"
        else:
            head = f"library {self.instr.name} = {self.instr.opcode.text} (interpreter rule"
            head += f": {self.why})" if self.why else ")"
        lines = [head]
        for i, t in enumerate(self.operands):
            lines += _tree_lines(f"in{i}", t)
        return lines + _tree_lines("out", self.result)


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


def _blocks(extent: int, parts: int, quantum: int) -> list[tuple[int, int]]:
    if extent < 2 * quantum:
        return even_blocks(extent, parts)
    bounds = [0, *(extent * p // parts // quantum * quantum for p in range(1, parts)), extent]
    return [(lo, hi) for lo, hi in itertools.pairwise(bounds) if hi > lo]


class DotThunk(Thunk):
    """dot -> one cblas gemm on arena addresses, or matmul into the result slice (see the
    file comment)."""

    kind = "blas"

    def __init__(self, instr: HloInstruction, lhs: BufferSlice, rhs: BufferSlice, out):
        self.instr, self.lhs, self.rhs, self.out = instr, lhs, rhs, out
        a = instr.attrs
        lb = tuple(a.get("lhs_batch_dims") or ())
        rb = tuple(a.get("rhs_batch_dims") or ())
        lc = tuple(a.get("lhs_contracting_dims") or ())
        rc = tuple(a.get("rhs_contracting_dims") or ())
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
        self._fn = cblas_gemm(out.shape.dtype)
        self._gemm = self._plan_gemm(out) if self._fn is not None else None
        splits = self.flops >= PARALLEL_MIN_FLOPS and max(b, m, n) > 1
        self.split_choice = SplitChoice() if splits else None
        self._parts = pool_size()

    def _plan_gemm(self, out: BufferSlice) -> _GemmPlan | None:
        if self.b != 1 or 0 in (self.m, self.n, self.k):
            return None
        if out.overlaps(self.lhs) or out.overlaps(self.rhs):
            return None  # np.matmul copies an overlapping operand first; BLAS would not
        rank = out.shape.rank
        res = _MatrixView.of(out, range(rank), (1, self.m, self.n))
        return _GemmPlan.of(self._a, self._c, res)

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

    def _run(self, ctx: ExecutionContext, split: bool) -> None:
        if self._gemm is not None:
            self._run_gemm(ctx, split)
        else:
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
        elif not split:
            one_blas_thread(rows, 0, m)
        elif n >= m:  # short and wide: each block packs only its columns of rhs
            blocks = _blocks(n, self._parts, _BLOCK_QUANTUM)
            run_blocks(lambda lo, hi: one_blas_thread(columns, lo, hi), blocks)
        else:
            blocks = even_blocks(m, self._parts)
            run_blocks(lambda lo, hi: one_blas_thread(rows, lo, hi), blocks)

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
        if self.flops <= OPENBLAS_SERIAL_FLOPS:
            body(0, units)
        elif not split or units < 2:
            one_blas_thread(body, 0, units)
        else:
            blocks = even_blocks(units, self._parts)
            run_blocks(lambda lo, hi: one_blas_thread(body, lo, hi), blocks)

    def describe(self) -> list[str]:
        how = "cblas gemm" if self._gemm is not None else "matmul"
        if self.split_choice is not None:
            how += f", split x{self._parts} when faster"
        return [
            f"blas {self.instr.name} = dot [{self.b}x{self.m}x{self.k}] @ [{self.k}x{self.n}]"
            f" ({how})",
            f"lhs: {self.lhs}",
            f"rhs: {self.rhs}",
            f"out: {self.out}",
        ]


class DynamicUpdateSliceThunk(Thunk):
    """Copies the operand into the result unless they share bytes, then writes the update
    at the clamped start indices."""

    kind = "library"

    def __init__(self, instr, operand: BufferSlice, update: BufferSlice, starts, out):
        self.instr, self.operand, self.update, self.starts, self.out = (
            instr,
            operand,
            update,
            tuple(starts),
            out,
        )
        self.in_place = operand.same_bytes(out)

    def run(self, ctx: ExecutionContext) -> None:
        if not self.in_place:
            np.copyto(ctx.view(self.out), ctx.view(self.operand))
        update = ctx.view(self.update)
        window = []
        for s, dim, size in zip(self.starts, self.out.shape.dims, update.shape, strict=True):
            begin = min(max(int(ctx.physical(s).reshape(())), 0), dim - size)
            window.append(slice(begin, begin + size))
        ctx.view(self.out)[tuple(window)] = update

    def describe(self) -> list[str]:
        note = "in place" if self.in_place else "copy, then update"
        return [
            f"library {self.instr.name} = dynamic-update-slice ({note})",
            f"operand: {self.operand}",
            f"update: {self.update}",
            f"out: {self.out}",
        ]


class CustomCallThunk(Thunk):
    """A C target called on arena pointers (see the file comment); others use the rule."""

    kind = "custom-call"

    def __init__(self, instr, operands: list[ValueTree], result: ValueTree, aliases):
        self.instr, self.operands, self.result = instr, operands, result
        self.target_name = instr.attrs.get("custom_call_target")
        config = instr.attrs.get("backend_config")
        self.opaque = config.text if config is not None else ""
        self.fallback = RuleThunk(instr, operands, result, "")
        # (operand number, operand index, result tree leaf) for each aliased output
        self.aliases = aliases
        leaves = [leaf for leaf in _leaves(result) if leaf is not None]
        self.unaliased = [leaf for leaf in leaves if not any(leaf is a[2] for a in aliases)]

    def run(self, ctx: ExecutionContext) -> None:
        from xlapy.backends.custom_calls import call_cpu_c_target, find

        target = find(self.target_name, "Host", ctx.state.get("custom_calls"))
        if not target.api_version.is_c:
            self.fallback.run(ctx)
            return
        operands = [_physical_tree(ctx, t) for t in self.operands]
        for number, index, out in self.aliases:
            src = _at(self.operands[number], index)
            if not src.same_bytes(out):
                ctx.copy(src, out)
            operands[number] = replace_leaf(operands[number], index, ctx.physical(out))
        for leaf in self.unaliased:
            ctx.physical(leaf).fill(0)
        try:
            call_cpu_c_target(target, operands, _physical_tree(ctx, self.result), self.opaque)
        except CustomCallError as e:
            raise CustomCallError(
                f"{self.instr.name}: custom-call target {self.target_name!r} failed: {e}"
            ) from e

    def describe(self) -> list[str]:
        lines = [f"custom-call {self.instr.name} -> {self.target_name!r}"]
        for i, t in enumerate(self.operands):
            lines += _tree_lines(f"in{i}", t)
        return lines + _tree_lines("out", self.result)


def _all_arrays(tree: ValueTree) -> bool:
    return all(leaf is not None for leaf in _leaves(tree))


def _leaves(tree: ValueTree) -> list:
    if isinstance(tree, tuple):
        return [leaf for t in tree for leaf in _leaves(t)]
    return [tree]


def _at(tree: ValueTree, index) -> ValueTree:
    for i in index:
        tree = tree[i]
    return tree


def _physical_tree(ctx: ExecutionContext, tree: ValueTree):
    if isinstance(tree, tuple):
        return tuple(_physical_tree(ctx, t) for t in tree)
    if tree is None:
        return None
    return ctx.physical(tree)
