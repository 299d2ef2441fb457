# Library thunks: operations the kernel emitter does not generate code for, run on NumPy views
# of the executable's memory.
#
# - DotThunk: a dot of f32/f64/c64/c128 operands with a result of the same type goes to
#   NumPy's matmul (an optimized BLAS: OpenBLAS in NumPy's wheels) writing straight into the
#   result's slice; the operands are transposed views, so BLAS sees the transpose flags
#   instead of copies wherever the contraction allows. Other dots (mixed precision, integers)
#   go through RuleThunk, whose fast path is lib_dot.py.
#   Every BLAS call runs with one OpenBLAS thread; a large product is split into blocks of
#   rows, of columns when it is wider than tall (each block then packs only its part of
#   the right operand), or of the batch, over the kernel pool (lib_dot.split_run), so
#   BLAS's own threads never compete with the pool, and a busy machine degrades to one
#   core instead of 5-15x.
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

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from xlapy.backends.base import replace_leaf
from xlapy.backends.cpu.lib_conv import plan_convolution
from xlapy.backends.cpu.lib_dot import plan_dot, split_run
from xlapy.backends.cpu.lib_indexing import plan_gather, plan_scatter
from xlapy.backends.cpu.lib_sort import plan_sort, plan_topk, plan_xla_topk
from xlapy.backends.cpu.lib_window import plan_reduce_window, plan_select_and_scatter
from xlapy.backends.cpu.thunks import BufferSlice, ExecutionContext, Thunk, ValueTree
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


class DotThunk(Thunk):
    """dot -> matmul into the result slice (see the file comment)."""

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

    def run(self, ctx: ExecutionContext) -> None:
        memory = ctx.memory
        a, c = self._a.array(memory), self._c.array(memory)
        b, m, n, flops = self.b, self.m, self.n, self.flops
        if self._out is None:  # a result in another layout: computed, then copied in
            result = np.empty((b, m, n), self.out.shape.dtype)
            split_run(b, flops, lambda lo, hi: np.matmul(a[lo:hi], c[lo:hi], out=result[lo:hi]))
            np.copyto(ctx.view(self.out), result.reshape(self.out.shape.dims))
            return
        out = self._out.array(memory)
        if b == 1 and n > m:  # short and wide: each block packs part of c
            a0, c0, out0 = a[0], c[0], out[0]
            split_run(n, flops, lambda lo, hi: np.matmul(a0, c0[:, lo:hi], out=out0[:, lo:hi]))
        elif b == 1:
            a0, c0, out0 = a[0], c[0], out[0]
            split_run(m, flops, lambda lo, hi: np.matmul(a0[lo:hi], c0, out=out0[lo:hi]))
        else:
            split_run(b, flops, lambda lo, hi: np.matmul(a[lo:hi], c[lo:hi], out=out[lo:hi]))

    def describe(self) -> list[str]:
        return [
            f"blas {self.instr.name} = dot [{self.b}x{self.m}x{self.k}] @ [{self.k}x{self.n}]",
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
