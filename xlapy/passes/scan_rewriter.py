"""reduce-window-rewriter: prefix scans written as reduce-window become blocked scans.

JAX lowers cumsum / cumprod / cummax / cummin / cumlogsumexp (and their reverse forms, and
the gradient of cumsum, a reverse cumsum) along an axis of length n to a reduce-window whose
window spans the whole axis: size n, stride 1, padding (n-1, 0) (or (0, n-1) when reversed),
every other window dimension trivial. Evaluated as written that folds n elements per output,
O(n^2). XLA's ReduceWindowRewriter accepts exactly these windows (and the exclusive forms
with padding n, whose output is one longer) and rewrites them into a two-level tree scan;
this pass does the same with a rewrite that leaves no reduce-window behind, only slices,
pads, reshapes, concatenates, broadcasts and the reducer's own elementwise ops, which loop
fusion turns into native kernels:

  inclusive scan of x along `axis` (length n), block length k:
    n <= k:  a chain along the axis, o_0 = x_0, o_j = f(o_{j-1}, x_j) (reverse:
             o_{n-1} = x_{n-1}, o_j = f(x_j, o_{j+1})), concatenated back together;
    n > k:   pad the axis to m*k with the init value (after the last element in scan order)
             and reshape it to [.., m, k, ..]; run the chain inside each block (the chain's
             last link is each block's total, [.., m, ..]); scan the m totals the same way
             (recursively: log_k(n) levels); shift them by one block into an exclusive scan
             (the init value enters at the start); combine f(carried, within-block) (reverse:
             f(within-block, carried)); reshape back and slice the padding off.

Work is O(n) per level and O(n) in all (the levels shrink by k), depth is O(k log_k n). The
chain keeps the reducer's operand order (accumulator left, later element right, as the
window fold does), so an associative reducer need not be commutative; variadic reducers
(tuples of arrays) go through the same chain component by component.

Soundness. The window fold starts from the init value and folds one init per padding
element, so a prefix scan is only equal to the window fold when the init value is an
identity of the reducer. The pass rewrites only then: a constant init that the table below
knows as the identity of a one-op reducer (0 for add, 1 for multiply, -inf / the least
integer for maximum, ...), or, for any other elementwise reducer, a constant for which
f(init, v) == v == f(v, init) on probe values (JAX's cumlogsumexp: -inf). Integer results
are exact (wrapping arithmetic is associative); floating-point sums and products are
re-associated, as XLA's rewrite re-associates them: they differ from the sequential window
fold by rounding only (the error bound of a blocked sum, smaller than the sequential one).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from xlapy.ir.attributes import Padding, SliceSpec
from xlapy.ir.computation import HloComputation
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.module import HloModule
from xlapy.ir.names import NameUniquer
from xlapy.ir.opcodes import Category, Opcode
from xlapy.ir.shapes import Layout, Shape
from xlapy.ir.types import PrimitiveType
from xlapy.passes.constant_folding import _FoldContext
from xlapy.passes.hlo_edit import Editor, reachable_computations
from xlapy.passes.pass_base import HloPass, register_pass

Op = Opcode


@dataclass(frozen=True, slots=True)
class ScanWindow:
    """What a prefix-scan reduce-window computes: along `axis` (of `length` elements),
    forward or `reverse`; `exclusive` windows have one more output (the init value first,
    or last when reversed)."""

    axis: int
    length: int
    reverse: bool
    exclusive: bool


def _trivial(d) -> bool:
    return (
        d.size == 1
        and d.stride == 1
        and d.pad_low == 0
        and d.pad_high == 0
        and d.window_dilation == 1
        and d.base_dilation == 1
        and not d.reversal
    )


def match_scan_window(instr: HloInstruction) -> ScanWindow | None:
    """The scan a reduce-window computes (XLA's conditions: one non-trivial window dimension
    of size n over an axis of length n, stride 1, no dilation or reversal, padding (n-1, 0)
    or (n, 0), or mirrored for reverse), or None."""
    if instr.opcode is not Op.REDUCE_WINDOW:
        return None
    half = len(instr.operands) // 2
    window = instr.window_or_none
    if half == 0 or window is None:
        return None
    dims = instr.operands[0].shape.dims
    if len(window.dims) != len(dims):
        return None
    axes = [a for a, d in enumerate(window.dims) if not _trivial(d)]
    if len(axes) != 1:
        return None
    (axis,) = axes
    n, d = dims[axis], window.dims[axis]
    if n < 1 or d.size != n or d.stride != 1 or d.window_dilation != 1 or d.base_dilation != 1:
        return None
    if d.reversal:
        return None
    if d.pad_high == 0 and d.pad_low in (n - 1, n) and d.pad_low > 0:
        return ScanWindow(axis, n, reverse=False, exclusive=d.pad_low == n)
    if d.pad_low == 0 and d.pad_high in (n - 1, n) and d.pad_high > 0:
        return ScanWindow(axis, n, reverse=True, exclusive=d.pad_high == n)
    return None


# -- is the init value an identity of the reducer? --------------------------------------------


def _constant_value(instr: HloInstruction) -> np.ndarray | None:
    """The scalar value of `instr` when it is a constant (possibly behind scalar
    broadcasts, reshapes, copies and bitcasts), else None."""
    while instr.opcode in (Op.BROADCAST, Op.RESHAPE, Op.COPY, Op.BITCAST):
        if not instr.operands[0].shape.is_array or instr.operands[0].shape.rank != 0:
            return None
        instr = instr.operands[0]
    if instr.opcode is not Op.CONSTANT or instr.literal is None:
        return None
    value = instr.literal.to_value()
    if not isinstance(value, np.ndarray) or value.shape != ():
        return None
    return value


def _table_identity(op: Opcode, et: PrimitiveType) -> object | None:
    """The identity of the one-op reducer `op` over `et` (None when not tabled)."""
    dt = et.dtype
    if et.is_pred:
        return {Op.AND: True, Op.OR: False, Op.XOR: False, Op.MAXIMUM: False, Op.MINIMUM: True}.get(
            op
        )
    if et.is_float:
        return {Op.ADD: 0.0, Op.MULTIPLY: 1.0, Op.MAXIMUM: -np.inf, Op.MINIMUM: np.inf}.get(op)
    if et.is_integral:
        info = np.iinfo(dt)
        table = {
            Op.ADD: 0,
            Op.MULTIPLY: 1,
            Op.MAXIMUM: info.min,
            Op.MINIMUM: info.max,
            Op.OR: 0,
            Op.XOR: 0,
            Op.AND: -1 if info.min < 0 else info.max,
        }
        return table.get(op)
    return None


def _elementwise_body(comp: HloComputation) -> bool:
    """Every instruction of `comp` can be applied to arrays position by position."""
    for instr in comp.instructions:
        if instr.opcode.category is Category.CONSTANT:
            continue
        if instr.opcode is Op.TUPLE and instr is comp.root_instruction():
            continue
        if not instr.opcode.is_elementwise or instr.has_side_effect:
            return False
        if not instr.shape.is_array or instr.shape.rank != 0:
            return False
    return True


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype:
        return False
    if a.dtype.kind == "f" or a.dtype.kind == "V" or "float" in str(a.dtype):
        af, bf = a.astype(np.float64), b.astype(np.float64)
        return bool(np.all((af == bf) | (np.isnan(af) & np.isnan(bf))))
    return bool(np.array_equal(a, b))


def _probes(et: PrimitiveType, rng: np.random.Generator) -> list[np.ndarray]:
    dt = et.dtype
    if et.is_pred:
        return [np.asarray(v, dt) for v in (False, True)]
    if et.is_integral:
        info = np.iinfo(dt)
        values = [0, 1, info.max, info.min, *rng.integers(info.min, info.max, 8, endpoint=True)]
        return [np.asarray(v, dt) for v in values]
    values = [0.0, -0.0, 1.0, -1.0, 0.5, 3.0, -7.25, *rng.standard_normal(8) * 10.0]
    return [np.asarray(v).astype(dt) for v in values]


def init_is_identity(reducer: HloComputation, inits: list[HloInstruction]) -> bool:
    """Whether the (constant) init values are an identity of `reducer` (see the module
    comment): by table for a one-op reducer, by probing for any other elementwise one."""
    values = [_constant_value(i) for i in inits]
    if any(v is None for v in values) or not _elementwise_body(reducer):
        return False
    root = reducer.root_instruction()
    params = reducer.parameters
    one_op = len(inits) == 1 and len(reducer.instructions) == 3 and len(params) == 2
    if one_op and sorted(map(id, root.operands)) == sorted(map(id, params)):
        identity = _table_identity(root.opcode, root.shape.element_type)
        if identity is not None:
            want = np.asarray(identity).astype(root.shape.dtype)
            return _same(np.asarray(values[0]).astype(root.shape.dtype), want)
    types = [i.shape.element_type for i in inits]
    rng = np.random.default_rng(0)
    columns = [_probes(et, rng) for et in types]
    count = min(len(c) for c in columns)
    ctx = _FoldContext()
    try:
        for j in range(count):
            probe = [c[j] for c in columns]
            for args in ([*values, *probe], [*probe, *values]):
                got = ctx.call(reducer, args)
                got = list(got) if isinstance(got, tuple) else [got]
                if not all(_same(g, p) for g, p in zip(got, probe, strict=True)):
                    return False
    except Exception:  # a reducer the rules cannot evaluate on scalars: leave it alone
        return False
    return True


# -- building the scan -------------------------------------------------------------------------


class _ScanBuilder:
    """Builds a scan's instructions just before the reduce-window it replaces."""

    def __init__(self, editor: Editor, anchor: HloInstruction, block: int):
        self.editor, self.anchor, self.block = editor, anchor, block
        half = len(anchor.operands) // 2
        self.inits = list(anchor.operands[half:])
        self.reducer: HloComputation = anchor.to_apply
        self.layouts = anchor.shape.is_array and anchor.shape.layout is not None
        self.layouts |= any(
            o.shape.is_array and o.shape.layout is not None for o in anchor.operands
        )

    # -- single instructions
    def shape(self, et: PrimitiveType, dims) -> Shape:
        dims = tuple(dims)
        layout = Layout.default(len(dims)) if self.layouts and dims else None
        return Shape.array(et, dims, layout)

    def emit(self, opcode, et, dims, operands, attrs=None, literal=None) -> HloInstruction:
        return self.editor.add(
            opcode,
            self.shape(et, dims),
            operands,
            attrs,
            before=self.anchor,
            literal=literal,
            name=f"{self.anchor.name}.scan",
        )

    def slice(self, x, axis: int, start: int, limit: int) -> HloInstruction:
        dims = x.shape.dims
        if start == 0 and limit == dims[axis]:
            return x
        spec = tuple((start, limit, 1) if a == axis else (0, n, 1) for a, n in enumerate(dims))
        out = (*dims[:axis], limit - start, *dims[axis + 1 :])
        return self.emit(Op.SLICE, x.shape.element_type, out, [x], {"slice": SliceSpec(spec)})

    def pad(self, x, axis: int, low: int, high: int, value) -> HloInstruction:
        if low == 0 and high == 0:
            return x
        dims = x.shape.dims
        spec = tuple((low, high, 0) if a == axis else (0, 0, 0) for a in range(len(dims)))
        out = (*dims[:axis], dims[axis] + low + high, *dims[axis + 1 :])
        attrs = {"padding": Padding(spec)}
        return self.emit(Op.PAD, x.shape.element_type, out, [x, value], attrs)

    def reshape(self, x, dims) -> HloInstruction:
        if tuple(dims) == x.shape.dims:
            return x
        return self.emit(Op.RESHAPE, x.shape.element_type, dims, [x])

    def concat(self, xs, axis: int) -> HloInstruction:
        if len(xs) == 1:
            return xs[0]
        dims = list(xs[0].shape.dims)
        dims[axis] = sum(x.shape.dims[axis] for x in xs)
        return self.emit(
            Op.CONCATENATE, xs[0].shape.element_type, dims, xs, {"dimensions": (axis,)}
        )

    def broadcast(self, x, dims, kept) -> HloInstruction:
        attrs = {"dimensions": tuple(kept)}
        return self.emit(Op.BROADCAST, x.shape.element_type, dims, [x], attrs)

    def apply(self, lhs: list[HloInstruction], rhs: list[HloInstruction]) -> list[HloInstruction]:
        """The reducer applied position by position to equally shaped arrays (its body
        cloned; scalar constants broadcast)."""
        dims = lhs[0].shape.dims
        values: dict[int, HloInstruction] = {}
        args = lhs + rhs
        for number, p in enumerate(self.reducer.parameters):
            values[id(p)] = args[number]
        root = self.reducer.root_instruction()
        for instr in self.reducer.post_order():
            if id(instr) in values or (instr is root and instr.opcode is Op.TUPLE):
                continue
            et = instr.shape.element_type
            if instr.opcode is Op.CONSTANT:
                scalar = self.emit(Op.CONSTANT, et, (), [], literal=instr.literal)
                values[id(instr)] = self.broadcast(scalar, dims, ()) if dims else scalar
                continue
            operands = [values[id(o)] for o in instr.operands]
            attrs = {k: v for k, v in instr.attrs.items() if k != "metadata"}
            values[id(instr)] = self.emit(instr.opcode, et, dims, operands, attrs)
        if root.opcode is Op.TUPLE:
            return [values[id(o)] for o in root.operands]
        return [values[id(root)]]

    # -- scans over lists of arrays (one per component of a variadic reduce-window)
    def chain(self, xs, axis: int, reverse: bool) -> list[list[HloInstruction]]:
        """The links o_0 .. o_{n-1} of the sequential scan along `axis` (each one wide)."""
        n = xs[0].shape.dims[axis]
        cols = [[self.slice(x, axis, j, j + 1) for x in xs] for j in range(n)]
        links: list[list[HloInstruction]] = [[] for _ in range(n)]
        order = range(n - 1, -1, -1) if reverse else range(n)
        prev: list[HloInstruction] | None = None
        for j in order:
            prev = (
                cols[j]
                if prev is None
                else (self.apply(cols[j], prev) if reverse else self.apply(prev, cols[j]))
            )
            links[j] = prev
        return links

    def inclusive(self, xs, axis: int, reverse: bool) -> list[HloInstruction]:
        """The inclusive scan of `xs` along `axis` (see the module comment)."""
        n = xs[0].shape.dims[axis]
        if n <= self.block:
            links = self.chain(xs, axis, reverse)
            return [self.concat([link[c] for link in links], axis) for c in range(len(xs))]
        k = self.block
        m = -(-n // k)
        extra = m * k - n
        low, high = (extra, 0) if reverse else (0, extra)
        xs = [self.pad(x, axis, low, high, v) for x, v in zip(xs, self.inits, strict=True)]
        dims = xs[0].shape.dims
        tiled = (*dims[:axis], m, k, *dims[axis + 1 :])
        blocks = [self.reshape(x, tiled) for x in xs]
        links = self.chain(blocks, axis + 1, reverse)
        within = [self.concat([link[c] for link in links], axis + 1) for c in range(len(xs))]
        totals_dims = (*dims[:axis], m, *dims[axis + 1 :])
        last = links[0] if reverse else links[-1]
        totals = [self.reshape(t, totals_dims) for t in last]
        scanned = self.inclusive(totals, axis, reverse)
        kept = [a for a in range(len(tiled)) if a != axis + 1]
        carried = []
        for s, v in zip(scanned, self.inits, strict=True):
            if reverse:
                shifted = self.pad(self.slice(s, axis, 1, m), axis, 0, 1, v)
            else:
                shifted = self.pad(self.slice(s, axis, 0, m - 1), axis, 1, 0, v)
            carried.append(self.broadcast(shifted, tiled, kept))
        combined = self.apply(within, carried) if reverse else self.apply(carried, within)
        flat = [self.reshape(c, dims) for c in combined]
        start = extra if reverse else 0
        return [self.slice(f, axis, start, start + n) for f in flat]

    def build(self, scan: ScanWindow) -> HloInstruction:
        half = len(self.anchor.operands) // 2
        xs = list(self.anchor.operands[:half])
        out = self.inclusive(xs, scan.axis, scan.reverse)
        if scan.exclusive:
            low, high = (0, 1) if scan.reverse else (1, 0)
            out = [self.pad(o, scan.axis, low, high, v) for o, v in zip(out, self.inits)]
        if not self.anchor.shape.is_tuple:
            return out[0]
        return self.editor.add(
            Op.TUPLE, self.anchor.shape, out, before=self.anchor, name=f"{self.anchor.name}.scan"
        )


def rewritable(instr: HloInstruction) -> ScanWindow | None:
    """The scan `instr` computes when this pass may rewrite it, else None."""
    scan = match_scan_window(instr)
    if scan is None:
        return None
    shapes = [o.shape for o in instr.operands]
    if any(not s.is_array or s.is_dynamic for s in shapes):
        return None
    if 0 in instr.operands[0].shape.dims:
        return None
    if scan.length == 1 and not scan.exclusive:
        return None  # one init and one element: nothing to gain
    half = len(instr.operands) // 2
    reducer = instr.to_apply_or_none
    if reducer is None or not init_is_identity(reducer, list(instr.operands[half:])):
        return None
    return scan


@register_pass
class ReduceWindowRewriter(HloPass):
    """Prefix-scan reduce-windows into blocked scans of `block` elements per block (see the
    module comment); every other reduce-window (pooling) is left alone. After `run`,
    `rewritten` counts the reduce-windows replaced."""

    name = "reduce-window-rewriter"

    def __init__(self, block: int = 8):
        if block < 2:
            raise ValueError(f"scan block length must be at least 2, got {block}")
        self.block = block
        self.rewritten = 0

    def run(self, module: HloModule) -> bool:
        namer = NameUniquer(module)
        self.rewritten = 0
        for comp in reachable_computations(module):
            editor = Editor(comp, namer)
            for instr in list(comp.instructions):
                scan = rewritable(instr)
                if scan is None:
                    continue
                new = _ScanBuilder(editor, instr, self.block).build(scan)
                editor.replace(instr, new)
                editor.remove(instr)
                self.rewritten += 1
        return self.rewritten > 0


__all__ = [
    "ReduceWindowRewriter",
    "ScanWindow",
    "init_is_identity",
    "match_scan_window",
]
