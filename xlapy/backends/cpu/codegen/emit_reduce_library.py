# Plain reductions as kernels generic in their extents: the kernel library's reductions.
#
# A reduce of one f32 or f64 array by add, maximum or minimum compiles, per shape, into a
# kernel whose LLVM time (16-70 ms) is above XLA's whole compile of such a program. The
# kernels here do the same work with the extents and strides as run-time data, so that a
# few kernels (compiled once per machine: jit/kernel_library.py) serve every plain reduce
# of every program and a program made of one needs no LLVM at all.
#
# Fused sums. A fusion summing x * y (x * x: a sum of squares, a gradient norm) or
# (x - c)^2 with c one value per output (a variance: layer norm's, a column variance) runs
# a kernel of the same menu with that prologue computed per element (PROLOGUES); the matcher
# (fused_reduce_library_kernel) takes exactly those fusions and leaves every other to its
# per-shape kernel. Each element is computed by the fused computation's operations in its
# order (no contraction into FMA), so the columns order gives the per-shape kernel's bits;
# the rows order sums in its own blocks (below), like the plain sums, and differs from the
# per-shape kernel's 256-element blocks in the last bits only.
#
# Geometry. Any reduce whose input, read in its layout from the major end with extent-1
# dims left out, is one run of kept dims, one run of reduced dims and one run of kept dims
# (each run possibly empty) is a [P, R, Q] -> [P, Q] reduction: the runs merge into one
# dim each, with one element stride each in the input (s_p, s_r, s_q) and in the output
# (o_p, o_q; the output's layout must keep each kept run mergeable). Row sums are [P, R,
# 1], column sums [1, R, Q], middle-axis sums [P, R, Q], full sums [1, R, 1]; other
# patterns (reduced dims on both sides of a kept one) keep the per-shape kernel.
#
# Two loop orders, one kernel each per element type and reducer (the menu, `menu`):
#
#   rows     one output element per step of the outer range (P x Q of them); its R
#            elements (contiguous: Q = 1 in this order, so R is the input's minor run) are
#            folded as U vectors of V lanes per step into U vector accumulators, merged into
#            one vector, its lanes halved into one (as emit_gemv's lane_sum), then the
#            < U x V elements left one by one.
#   columns  the input is contiguous along Q: a step of the outer range is a vector of V
#            adjacent outputs of one p (P x ceil(Q / V) steps); a range of them is cut into
#            tiles of at most MAX_TILE outputs of one p (a whole run: whole rows; a split
#            run: its part of them, not narrower tiles); the R rows stream through
#            per-output accumulators on the stack (whole vectors, then the < V outputs
#            left as scalars), as the per-shape column kernel (codegen/elemental.py) does.
#
# Accuracy: sums are blocked: level-0 accumulators take BLOCK steps, BLOCKS level-0 flushes
# make a level-1 partial, level-1 partials go into the total, so a serial chain is at most
# BLOCK, BLOCKS or steps / (BLOCK x BLOCKS) long. Maximum and minimum are llvm.maximum /
# llvm.minimum folds (NaN if any element is NaN, +0 above -0) computed with three cheap
# accumulators, as codegen/elemental.py's emit_float_extremum does: a compare-and-select
# that ignores NaN and the sign of zero, an any-NaN mask, and the AND (maximum) or OR
# (minimum) of the elements' bits, whose sign bit fixes the sign of a zero result. The init
# value (the reduce's second operand, read from its buffer) is combined last; an empty
# reduction (R = 0) gives the init exactly. Each output is folded by one step in one fixed
# order, so any split of the outer range gives the same bits. The kernel is
#
#   void f(i8* noalias out, i8* noalias x, i8* noalias init, i64* noalias params,
#          i64 start, i64 end)
#
# with `params` the i64 block PARAMS names (`reduce_params`), and flushes subnormals like the
# other kernels. A kernel with a prologue has no init pointer (the init is in `params`) and
# a second input pointer (y, or c) after x only for "mul" and "sqdiff".

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from llvmlite import ir

from xlapy.backends.cpu.codegen.common import F32, F64, I32, I64, SYMBOL, mem_type
from xlapy.backends.cpu.codegen.elemental import simple_reducer
from xlapy.backends.cpu.codegen.emit_gemv import splat
from xlapy.backends.cpu.codegen.emitter import StandaloneKernelEmitter
from xlapy.backends.cpu.codegen.ir_release import released_text
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.opcodes import Opcode
from xlapy.ir.shapes import merged_stride
from xlapy.ir.types import PrimitiveType
from xlapy.passes.reshape_to_bitcast import reshape_is_bitcast, transpose_is_bitcast

PARAMS = ("p", "r", "q", "s_p", "s_r", "s_q", "o_p", "o_q", "units", "init")
"""The parameter block's i64 words, in order: the extents P, R, Q, the input's element
strides along them, the output's along P and Q, the outer range's units per p (rows
order: Q outputs; columns order: ceil(Q / V) vectors of outputs), and the init value's bits
(read by the kernels with a prologue only; plain kernels read it from its buffer)."""

OPS = {Opcode.ADD: "add", Opcode.MAXIMUM: "max", Opcode.MINIMUM: "min"}
"""The reducers the library has kernels for."""

TYPES = {PrimitiveType.F32: "f32", PrimitiveType.F64: "f64"}
"""The element types it has kernels for (input, init and result all of it)."""

PROLOGUES = ("x", "fx", "neg", "cvt_bf16", "cvt_f16", "sq", "mul", "sqdiff")
"""What a kernel folds, per element of the [P, R, Q] index space: "x" the input itself (a
plain reduce); in a fusion: "fx" the input itself (read through a reshape or transpose that
moves no element), "neg" -a, "cvt_bf16" / "cvt_f16" a bf16 or f16 input widened to f32
(exact: JAX's f32 sums of bf16 arrays), "sq" a * a (one load: a sum of squares), "mul" a * b
(two inputs read at the same offsets), "sqdiff" (a - c) * (a - c) with c one value per
output (read at the output's offset: a fused variance's (x - mean)^2). Kernels with a
prologue (all but "x") sum f32 only (add; JAX's default type: f64 fusions keep their
per-shape kernels rather than double the library) and take the init from the parameter
block (a fusion's init is a constant inside it, no buffer)."""

TWO_INPUTS = ("mul", "sqdiff")
"""The prologues that read a second input."""

WIDENED = {"cvt_bf16": PrimitiveType.BF16, "cvt_f16": PrimitiveType.F16}
"""The prologues that read a narrower input, and its type."""

UNROLL = 4
"""Vectors folded per step of the rows order (U: independent accumulators)."""

BLOCK = 32
"""Steps folded into a level-0 partial sum before it is flushed (see the file comment)."""

BLOCKS = 16
"""Level-0 flushes per level-1 partial."""

REGISTER_VECTORS = {"add": 8, "max": 4, "min": 4}
"""Columns order: a tile of at most this many whole vectors keeps its accumulators in
registers (a sum's level-0 partials; a maximum's three accumulators per vector), else they
live in arrays on the stack."""

MAX_TILE = 1024
"""Most outputs per tile of the columns order (the size of its stack accumulators; whole
rows of up to 4 KiB of f32 stream through them, as the per-shape column kernel's
VECTOR_TILE: narrow tiles of long rows read a new page per row and measured 2x slower)."""


@dataclass(frozen=True, slots=True)
class ReduceKernel:
    """One reduction kernel of the library (see the file comment)."""

    dtype: str  # "f32" or "f64"
    op: str  # "add", "max" or "min"
    columns: bool  # the loop order: columns (contiguous along Q) or rows
    lanes: int  # V: elements of this type in one vector register
    prologue: str = "x"  # what is folded (PROLOGUES)

    @property
    def name(self) -> str:
        """A short readable name (dumps, the library listing)."""
        fold = "" if self.prologue == "x" else f"_{self.prologue}"
        return f"reduce_{self.dtype}_{self.op}{fold}_{'cols' if self.columns else 'rows'}"

    def description(self, flush_denormals: bool) -> str:
        """A text that determines the kernel's IR (with the sources: a cache key)."""
        return f"reduce-library v1 {'ftz' if flush_denormals else 'ieee'} {self!r}"

    def emit(self, flush_denormals: bool) -> str:
        """The kernel's LLVM IR, its function named SYMBOL."""
        return emit_reduce_kernel(self, flush_denormals)


def menu(lanes: int) -> tuple[ReduceKernel, ...]:
    """Every reduction kernel of the library for vector registers of `lanes` f32 elements."""
    plain = [(op, "x") for op in OPS.values()]
    fused = [("add", prologue) for prologue in PROLOGUES[1:]]
    return tuple(
        ReduceKernel(dtype, op, columns, max(lanes // 2, 1) if dtype == "f64" else lanes, fold)
        for dtype in TYPES.values()
        for op, fold in (*plain, *fused)
        if dtype == "f32" or fold == "x"
        for columns in (False, True)
    )


@dataclass(frozen=True, slots=True)
class ReduceGeometry:
    """A reduce as [P, R, Q] -> [P, Q] with element strides (see the file comment)."""

    p: int
    r: int
    q: int
    s_p: int
    s_r: int
    s_q: int
    o_p: int
    o_q: int

    @property
    def columns(self) -> bool:
        """Does it run in the columns order (Q > 1: the input contiguous along Q, its minor
        run), else the rows order (R the minor run, contiguous)?"""
        return self.q > 1


def reduce_library_kernel(
    instr: HloInstruction, lanes: int
) -> tuple[ReduceKernel, ReduceGeometry] | str:
    """The library kernel and geometry that run reduce `instr`, or why none does (a reduce
    in a fusion: the kind and geometry, its operands checked by fused_reduce_library_kernel)."""
    if instr.opcode is not Opcode.REDUCE or len(instr.operands) != 2:
        return "not a reduce of one array"
    x, init = instr.operands
    if not (x.shape.is_array and init.shape.is_array and instr.shape.is_array):
        return "a tuple operand or result"
    t = x.shape.element_type
    if t not in TYPES or init.shape.element_type is not t or instr.shape.element_type is not t:
        return f"element type {t} (the library has {', '.join(TYPES.values())})"
    op = simple_reducer(instr.to_apply)
    if op not in OPS:
        return "a reducer other than add, maximum or minimum of its two parameters"
    geometry = reduce_geometry(instr)
    if isinstance(geometry, str):
        return geometry
    if (geometry.s_q if geometry.columns else geometry.s_r) != 1:  # the minor run is
        return "the minor run of the input is not contiguous"  # (never, for dense layouts)
    v = max(lanes // 2, 1) if t is PrimitiveType.F64 else lanes
    return ReduceKernel(TYPES[t], OPS[op], geometry.columns, v), geometry


@dataclass(frozen=True, slots=True)
class FusedReduce:
    """A fusion run by a library kernel with a prologue: the kernel, the geometry of its
    reduce, the fusion operands the kernel reads (its x, then its second input if it has
    one) and the init's bits (its parameter block's last word)."""

    kernel: ReduceKernel
    geometry: ReduceGeometry
    operands: tuple[int, ...]
    init_bits: int


def fused_reduce_library_kernel(fusion: HloInstruction, lanes: int) -> FusedReduce | str:
    """The library kernel with a prologue (PROLOGUES) that runs `fusion`, or why none does.
    Exact: the fused computation must be, from its root, a sum by add (f32, the init a
    constant) of x, -x, convert(x) (bf16 or f16 to f32), x * y or (x - broadcast(c))^2,
    each of x, y a fusion parameter read in the reduce input's shape and layout (itself or a
    reshape or transpose that moves no element), c a parameter in the result's shape and
    layout (likewise) broadcast along the reduced dims; anything else keeps the per-shape
    kernel."""
    comp = fusion.calls
    root = comp.root if comp is not None else None
    if root is None or root.opcode is not Opcode.REDUCE or len(root.operands) != 2:
        return "not a fusion of one reduce of one array"
    found = reduce_library_kernel(root, lanes)
    if isinstance(found, str):
        return found
    kernel, geometry = found
    if kernel.op != "add":
        return "a fused reduce other than a sum"
    if kernel.dtype != "f32":
        return "a fused reduce in f64 (the library's fused sums are f32's)"
    body, init = root.operands
    if init.opcode is not Opcode.CONSTANT or init.literal is None:
        return "the init is not a constant"
    if fusion.shape != root.shape:
        return "the fusion's result is not its reduce's"
    operands: tuple[int, ...]
    one = _one_input(body)
    if one is not None:
        operands, prologue = (one[0],), one[1]
    elif body.opcode is not Opcode.MULTIPLY:
        return "the fused element is not one the library computes (x, -x, convert, x * y)"
    elif (a := body.operands[0]) is body.operands[1] and a.opcode is Opcode.SUBTRACT:
        x, per = _stream(a.operands[0], body.shape), _broadcast_per_output(a.operands[1], root)
        if x is None or per is None:
            return "a fused (x - c)^2 whose x or c is not read as the library reads them"
        if geometry.columns and geometry.o_q != 1:
            return "a fused (x - c)^2 whose result is not contiguous along its minor run"
        operands, prologue = (x, per), "sqdiff"
    else:
        x, y = _stream(body.operands[0], body.shape), _stream(body.operands[1], body.shape)
        if x is None or y is None:
            return "a fused product of operands not read in the reduce input's layout"
        operands, prologue = ((x,), "sq") if x == y else ((x, y), "mul")
    width = 64 if kernel.dtype == "f64" else 32
    value = init.literal.array
    assert value is not None
    raw = int(value.reshape(()).view(f"u{width // 8}"))
    bits = raw - (1 << 64) if raw >= 1 << 63 else raw
    return FusedReduce(
        ReduceKernel(kernel.dtype, "add", kernel.columns, kernel.lanes, prologue),
        geometry,
        operands,
        bits,
    )


def _parameter_in(node: HloInstruction, shape) -> int | None:
    """The fusion parameter number that `node` reads with every element at its offset in
    `shape` (dims, layout and type): the parameter itself, or a reshape of it that moves
    no element; else None."""
    if node.shape != shape:
        return None
    if (node.opcode is Opcode.RESHAPE and reshape_is_bitcast(node)) or (
        node.opcode is Opcode.TRANSPOSE and transpose_is_bitcast(node)
    ):
        node = node.operands[0]
    if node.opcode is not Opcode.PARAMETER:
        return None
    return node.parameter_number


def _stream(node: HloInstruction, shape) -> int | None:
    """The fusion parameter read as the reduce's input is (see _parameter_in)."""
    return _parameter_in(node, shape)


def _one_input(body: HloInstruction) -> tuple[int, str] | None:
    """(fusion parameter, prologue) of a fused element of one input: the input read through
    a reshape or transpose that moves no element, its negation, or its widening from bf16 /
    f16 to f32; else None."""
    x = _stream(body, body.shape)
    if x is not None:
        return x, "fx"
    if len(body.operands) != 1:
        return None
    operand = body.operands[0]
    if body.opcode is Opcode.NEGATE:
        x = _stream(operand, body.shape)
        return None if x is None else (x, "neg")
    if body.opcode is not Opcode.CONVERT or body.shape.element_type is not PrimitiveType.F32:
        return None
    for prologue, t in WIDENED.items():
        if operand.shape.element_type is t:
            x = _stream(operand, body.shape.with_element_type(t))
            return None if x is None else (x, prologue)
    return None


def _broadcast_per_output(node: HloInstruction, reduce: HloInstruction) -> int | None:
    """The fusion parameter c of `node` = broadcast(c) along `reduce`'s reduced dims, c in
    the reduce result's shape and layout (so read at the output's offset); else None."""
    if node.opcode is not Opcode.BROADCAST:
        return None
    src = reduce.operands[0].shape
    kept = tuple(d for d in range(src.rank) if d not in set(reduce.dimensions))
    if tuple(node.dimensions) != kept:
        return None
    return _parameter_in(node.operands[0], reduce.shape)


def reduce_geometry(instr: HloInstruction) -> ReduceGeometry | str:
    """`instr` (a reduce of one array) as [P, R, Q] -> [P, Q], or why it is not one."""
    src, out = instr.operands[0].shape, instr.shape
    reduced = set(instr.dimensions)
    kept = [d for d in range(src.rank) if d not in reduced]
    physical = [d for d in reversed(src.layout_or_default.minor_to_major) if src.dims[d] != 1]
    runs = [(k, list(g)) for k, g in itertools.groupby(physical, lambda d: d in reduced)]
    pattern = [is_reduced for is_reduced, _ in runs]
    groups: dict[str, list[int]] = {"p": [], "r": [], "q": []}
    if pattern in ([], [True], [False]):
        names = ["p"] if pattern == [False] else ["r"]
    elif pattern == [False, True]:
        names = ["p", "r"]
    elif pattern == [True, False]:
        names = ["r", "q"]
    elif pattern == [False, True, False]:
        names = ["p", "r", "q"]
    else:
        return "reduced dims on both sides of a kept one in the layout"
    for name, (_, dims) in zip(names, runs, strict=False):
        groups[name] = dims
    extent = {k: math.prod(src.dims[d] for d in dims) for k, dims in groups.items()}
    strides = [merged_stride(src, groups[k]) for k in ("p", "r", "q")]
    strides += [merged_stride(out, [kept.index(d) for d in groups[k]]) for k in ("p", "q")]
    known = [x for x in strides if x is not None]
    if len(known) != len(strides):
        return "the result's layout does not keep the input's order of kept dims"
    return ReduceGeometry(extent["p"], extent["r"], extent["q"], *known)


def reduce_params(g: ReduceGeometry, kernel: ReduceKernel, init_bits: int = 0) -> tuple[int, ...]:
    """The parameter block (PARAMS) of `g` for `kernel` (`init_bits`: the init's bits, for
    a kernel with a prologue)."""
    units = -(-g.q // kernel.lanes) if kernel.columns else g.q
    return (g.p, g.r, g.q, g.s_p, g.s_r, g.s_q, g.o_p, g.o_q, units, init_bits)


def reduce_extent(params: tuple[int, ...]) -> int:
    """The kernel's outer range for parameter block `params`: outputs (rows order) or
    vectors of outputs (columns order), P x `units`."""
    return params[0] * params[PARAMS.index("units")]


class _Fold:
    """One reducer's accumulator state on values of one type (scalar or vector): a tuple of
    values (add: the sum; maximum / minimum: the best, an any-NaN mask, the bits folded)."""

    def __init__(self, em: _ReduceEmitter, ty):
        self.em, self.b, self.ty = em, em.b, ty
        vector = isinstance(ty, ir.VectorType)
        scalar = ty.element if vector else ty
        width = 64 if scalar is F64 else 32
        self.ity = ir.VectorType(ir.IntType(width), ty.count) if vector else ir.IntType(width)
        self.sign = 1 << (width - 1)
        self.op = em.k.op

    def _const(self, ty, value):
        if isinstance(ty, ir.VectorType):
            return ir.Constant(ty, [value] * ty.count)
        return ir.Constant(ty, value)

    def types(self) -> list:
        return [self.ty] if self.op == "add" else [self.ty, self.ity, self.ity]

    def identity(self) -> list:
        if self.op == "add":
            return [self._const(self.ty, 0.0)]
        is_max = self.op == "max"
        best = self._const(self.ty, -math.inf if is_max else math.inf)
        return [best, self._const(self.ity, 0), self._const(self.ity, -1 if is_max else 0)]

    def step(self, state: list, x) -> list:
        b = self.b
        if self.op == "add":
            return [b.fadd(state[0], x)]
        best, nan, bits = state
        beyond = b.fcmp_ordered(">" if self.op == "max" else "<", x, best, flags=("nnan", "nsz"))
        best = b.select(beyond, x, best)
        nan = b.or_(nan, b.sext(b.fcmp_unordered("uno", x, x), self.ity))
        bits = (b.and_ if self.op == "max" else b.or_)(bits, b.bitcast(x, self.ity))
        return [best, nan, bits]

    def merge(self, a: list, c: list) -> list:
        b = self.b
        if self.op == "add":
            return [b.fadd(a[0], c[0])]
        beyond = b.fcmp_ordered(">" if self.op == "max" else "<", c[0], a[0], flags=("nnan",))
        best = b.select(beyond, c[0], a[0])
        bits = (b.and_ if self.op == "max" else b.or_)(a[2], c[2])
        return [best, b.or_(a[1], c[1]), bits]

    def finish(self, state: list):
        """The reduction's value from its state (without the init)."""
        if self.op == "add":
            return state[0]
        b = self.b
        best, nan, bits = state
        zero = b.bitcast(b.and_(bits, self._const(self.ity, self.sign)), self.ty)
        is_zero = b.fcmp_ordered("==", best, self._const(self.ty, 0.0))
        value = b.select(is_zero, zero, best)
        any_nan = b.icmp_signed("!=", nan, self._const(self.ity, 0))
        return b.select(any_nan, self._const(self.ty, math.nan), value)

    def with_init(self, init, value):
        """`value` combined with the init (the reducer applied once more)."""
        if self.op == "add":
            return self.b.fadd(init, value)
        ty = self.ty
        scalar = ty.element if isinstance(ty, ir.VectorType) else ty
        suffix = "f64" if scalar is F64 else "f32"
        if isinstance(ty, ir.VectorType):
            suffix = f"v{ty.count}{suffix}"
        name = f"llvm.{'maximum' if self.op == 'max' else 'minimum'}.{suffix}"
        module = self.em.module
        fn = module.globals.get(name) or ir.Function(module, ir.FunctionType(ty, [ty, ty]), name)
        return self.b.call(fn, [init, value])


class _ReduceEmitter(StandaloneKernelEmitter):
    def __init__(self, k: ReduceKernel, flush_denormals: bool):
        super().__init__(SYMBOL, flush_denormals)
        self.k = k
        self.scalar = F64 if k.dtype == "f64" else F32
        self.vty = ir.VectorType(self.scalar, k.lanes)
        self.align = 8 if k.dtype == "f64" else 4
        narrow = WIDENED.get(k.prologue)
        self.xty = self.scalar if narrow is None else mem_type(narrow)
        self.x_align = self.align if narrow is None else 2

    @staticmethod
    def c(v: int) -> ir.Constant:
        return ir.Constant(I64, v)

    def _at(self, base, index):
        return self.b.gep(base, [index], inbounds=True)

    def _load(self, index, vector: bool, base=None):
        """The element (vector of V elements) at offset `index` of x (or `base`), in x's
        memory type."""
        ptr = self._at(self.x if base is None else base, index)
        if vector:
            ty = self.vty if base is not None else ir.VectorType(self.xty, self.k.lanes)
            return self.b.load(self.b.bitcast(ptr, ty.as_pointer()), align=self.x_align)
        return self.b.load(ptr)

    def _value(self, index, vector: bool, c=None):
        """The prologue's value at input offset `index` (`c`: the output's per-output
        value, for "sqdiff"): the operations and their order are the fused computation's,
        so each element is the per-shape kernel's bits."""
        b, x = self.b, self._load(index, vector)
        if self.k.prologue == "neg":
            return b.fneg(x)
        if self.k.prologue == "cvt_f16":
            return b.fpext(x, self.vty if vector else self.scalar)
        if self.k.prologue == "cvt_bf16":  # as the per-shape kernel's from_mem
            wide = ir.VectorType(I32, self.k.lanes) if vector else I32
            shift = ir.Constant(wide, [16] * self.k.lanes if vector else 16)
            return b.bitcast(b.shl(b.zext(x, wide), shift), self.vty if vector else self.scalar)
        if self.k.prologue == "sq":
            return b.fmul(x, x)
        if self.k.prologue == "mul":
            return b.fmul(x, self._load(index, vector, self.second))
        if self.k.prologue == "sqdiff":
            d = b.fsub(x, c)
            return b.fmul(d, d)
        return x

    def _per_output(self, out_at, vector: bool):
        """The per-output value c at output offset `out_at` ("sqdiff"; else None); a
        vector reads V adjacent outputs (the matcher asks o_q = 1 of the columns order)."""
        if self.k.prologue != "sqdiff":
            return None
        return self._load(out_at, vector, self.second)

    def _slots(self, fold: _Fold, name: str) -> list:
        return [self.alloca(t, f"{name}{i}") for i, t in enumerate(fold.types())]

    def _set(self, slots, values) -> None:
        for slot, v in zip(slots, values, strict=True):
            self.b.store(v, slot)

    def _get(self, slots) -> list:
        return [self.b.load(s) for s in slots]

    def emit_ir(self) -> str:
        second = ["init"] if self.k.prologue == "x" else ["y"] * (self.k.prologue in TWO_INPUTS)
        names = ["out", "x", *second, "params"]
        fn, body = self.begin_function(names, set())
        b = self.b
        self.y = b.bitcast(fn.args[0], self.scalar.as_pointer())
        self.x = b.bitcast(fn.args[1], self.xty.as_pointer())
        self.second = b.bitcast(fn.args[2], self.scalar.as_pointer()) if second else None
        words = b.bitcast(fn.args[len(names) - 1], I64.as_pointer())
        start, end = fn.args[len(names)], fn.args[len(names) + 1]
        self.p = {n: b.load(b.gep(words, [self.c(i)]), name=n) for i, n in enumerate(PARAMS)}
        if self.k.prologue == "x":
            self.init = b.load(self.second)
        else:  # the init's bits in the parameter block
            bits = self.p["init"] if self.k.dtype == "f64" else b.trunc(self.p["init"], I32)
            self.init = b.bitcast(bits, self.scalar)
        self.empty = b.icmp_signed("==", self.p["r"], self.c(0))
        if self.k.columns:
            self._columns(start, end)
        else:
            self._rows(start, end)
        self.end_function(body)
        return released_text(self.module)

    # -- blocked folding -------------------------------------------------------------------
    def _blocked(self, count, body, clear, flush) -> None:
        """body(lo, hi) over steps [0, count): for sums in the blocks of the file comment
        (`clear(k)` resets level k, `flush(k)` adds level k into the one above; level 2 is
        the total), else straight into the total."""
        if self.k.op != "add":
            body(self.c(0), count)
            return
        b, c = self.b, self.c
        span = BLOCK * BLOCKS
        with self.loop(c(0), count, "super", step=span) as c1:
            clear(1)
            hi1 = self._min(b.add(c1, c(span)), count)
            with self.loop(c1, hi1, "block", step=BLOCK) as c0:
                clear(0)
                body(c0, self._min(b.add(c0, c(BLOCK)), hi1))
                flush(0)
            flush(1)

    def _fold_in_levels(self, fold: _Fold, name: str, count: int, steps, body) -> list:
        """`count` accumulators folded over steps [0, steps) through _blocked's levels:
        `body(lo, hi, target)` folds steps [lo, hi) into `target` (one slot list per
        accumulator); returns the totals' slots (level 2)."""
        levels = [[self._slots(fold, f"{name}{n}_{i}") for i in range(count)] for n in range(3)]
        for level in levels:
            for slots in level:
                self._set(slots, fold.identity())
        target = levels[0] if self.k.op == "add" else levels[2]

        def clear(n):
            for slots in levels[n]:
                self._set(slots, fold.identity())

        def flush(n):
            for low, high in zip(levels[n], levels[n + 1], strict=True):
                self._set(high, fold.merge(self._get(high), self._get(low)))

        self._blocked(steps, lambda lo, hi: body(lo, hi, target), clear, flush)
        return levels[2]

    def _min(self, x, y):
        return self.b.select(self.b.icmp_signed("<", x, y), x, y)

    def _max(self, x, y):
        return self.b.select(self.b.icmp_signed(">", x, y), x, y)

    def _result(self, fold: _Fold, value):
        """The output value: `value` with the init, or the init itself when R = 0."""
        init = self.init
        if isinstance(fold.ty, ir.VectorType):
            init = splat(self.b, self.vty, self.k.lanes, init)
        return self.b.select(self.empty, init, fold.with_init(init, value))

    # -- rows order --------------------------------------------------------------------------
    def _rows(self, start, end) -> None:
        b, p = self.b, self.p
        with self.loop(start, end, "out") as t:
            pi = b.sdiv(t, p["q"])
            qi = b.sub(t, b.mul(pi, p["q"]))
            base = b.add(b.mul(pi, p["s_p"]), b.mul(qi, p["s_q"]))
            out_at = b.add(b.mul(pi, p["o_p"]), b.mul(qi, p["o_q"]))
            sfold = _Fold(self, self.scalar)
            total = self._slots(sfold, "total")
            self._set(total, self._row_vectors(base, self._per_output(out_at, False)))
            value = self._result(sfold, sfold.finish(self._get(total)))
            b.store(value, self._at(self.y, out_at))

    def _row_vectors(self, base, per_output) -> list:
        """The state of folding x[base + i], i in [0, R): U vectors a step, then the rest
        (`per_output`: the output's c, "sqdiff")."""
        b, c, k = self.b, self.c, self.k
        fold = _Fold(self, self.vty)
        width = UNROLL * k.lanes
        steps = b.sdiv(self.p["r"], c(width))
        splat_c = None if per_output is None else splat(b, self.vty, k.lanes, per_output)

        def body(lo, hi, target):
            with self.loop(lo, hi, "step") as s:
                at = b.add(base, b.mul(s, c(width)))
                for u in range(UNROLL):
                    x = self._value(b.add(at, c(u * k.lanes)), True, splat_c)
                    self._set(target[u], fold.step(self._get(target[u]), x))

        totals = self._fold_in_levels(fold, "u", UNROLL, steps, body)
        merged = self._get(totals[0])
        for slots in totals[1:]:
            merged = fold.merge(merged, self._get(slots))
        state = self._lanes(fold, merged)
        sfold = _Fold(self, self.scalar)
        rest = self._slots(sfold, "rest")
        self._set(rest, state)
        with self.loop(b.mul(steps, c(width)), self.p["r"], "tail") as i:
            x = self._value(b.add(base, i), False, per_output)
            self._set(rest, sfold.step(self._get(rest), x))
        return self._get(rest)

    def _lanes(self, fold: _Fold, state: list) -> list:
        """A vector state folded across its lanes (halves merged until one lane is left)."""
        b, lanes = self.b, self.k.lanes
        width = lanes
        while width > 1:
            half = width // 2
            mask = list(range(half, width)) * 2 + [0] * (lanes - width)
            mask_c = ir.Constant(ir.VectorType(I32, lanes), mask)
            high = [b.shuffle_vector(v, ir.Constant(v.type, ir.Undefined), mask_c) for v in state]
            state = fold.merge(state, high)
            width = half
        return [b.extract_element(v, ir.Constant(I32, 0)) for v in state]

    # -- columns order -----------------------------------------------------------------------
    def _columns(self, start, end) -> None:
        b, c, k, p = self.b, self.c, self.k, self.p
        vfold, sfold = _Fold(self, self.vty), _Fold(self, self.scalar)
        nvec = MAX_TILE // k.lanes
        used = range(3) if k.op == "add" else (2,)  # the levels a fold uses (_blocked)
        vec_levels = {
            n: [
                self.alloca(ir.ArrayType(t, nvec), f"v{n}.{i}") for i, t in enumerate(vfold.types())
            ]
            for n in used
        }
        sca_levels = {
            n: [
                self.alloca(ir.ArrayType(t, k.lanes), f"s{n}.{i}")
                for i, t in enumerate(sfold.types())
            ]
            for n in used
        }

        def slot(arrays, i):
            return [b.gep(a, [ir.Constant(I32, 0), i], inbounds=True) for a in arrays]

        units, step = p["units"], MAX_TILE // k.lanes
        some = b.icmp_signed("<", start, end)
        p_first = b.sdiv(start, units)
        p_end = b.add(b.sdiv(b.sub(end, c(1)), units), c(1))
        with self.loop(p_first, b.select(some, p_end, p_first), "p") as pi:
            row0 = b.mul(pi, units)
            lo = self._max(b.sub(start, row0), c(0))
            hi = self._min(b.sub(end, row0), units)
            with self.loop(lo, hi, "tile", step=step) as u0:
                u1 = self._min(b.add(u0, c(step)), hi)
                q0 = b.mul(u0, c(k.lanes))
                width = b.sub(self._min(b.mul(u1, c(k.lanes)), p["q"]), q0)
                vectors = b.sdiv(width, c(k.lanes))
                first = b.mul(vectors, c(k.lanes))  # the first output left to scalars
                base = b.add(b.mul(pi, p["s_p"]), q0)
                out0 = b.add(b.mul(pi, p["o_p"]), b.mul(q0, p["o_q"]))

                def array_path():

                    def each(arrays_v, arrays_s, action_v, action_s):
                        with self.loop(c(0), vectors, "vec") as v:
                            action_v(v, slot(arrays_v, v))
                        with self.loop(first, width, "col") as j:
                            action_s(j, slot(arrays_s, b.sub(j, first)))

                    def clear(n):
                        each(
                            vec_levels[n],
                            sca_levels[n],
                            lambda v, s: self._set(s, vfold.identity()),
                            lambda j, s: self._set(s, sfold.identity()),
                        )

                    for n in used:
                        clear(n)
                    target_n = 0 if k.op == "add" else 2

                    def body(lo, hi):
                        with self.loop(lo, hi, "row") as r:
                            row = b.add(base, b.mul(r, p["s_r"]))

                            def vector_step(v, s):
                                at = b.mul(v, c(k.lanes))
                                per = self._per_output(b.add(out0, at), True)
                                x = self._value(b.add(row, at), True, per)
                                self._set(s, vfold.step(self._get(s), x))

                            def scalar_step(j, s):
                                per = self._per_output(b.add(out0, b.mul(j, p["o_q"])), False)
                                x = self._value(b.add(row, j), False, per)
                                self._set(s, sfold.step(self._get(s), x))

                            each(
                                vec_levels[target_n], sca_levels[target_n], vector_step, scalar_step
                            )

                    def flush(n):
                        def up(fold):
                            def action(_, s):
                                low, high = s[: len(s) // 2], s[len(s) // 2 :]
                                self._set(high, fold.merge(self._get(high), self._get(low)))

                            return action

                        each(
                            vec_levels[n] + vec_levels[n + 1],
                            sca_levels[n] + sca_levels[n + 1],
                            up(vfold),
                            up(sfold),
                        )

                    self._blocked(p["r"], body, clear, flush)

                    def store_vector(v, s):
                        value = self._result(vfold, vfold.finish(self._get(s)))
                        at = b.add(out0, b.mul(b.mul(v, c(k.lanes)), p["o_q"]))
                        for lane in range(k.lanes):
                            element = b.extract_element(value, ir.Constant(I32, lane))
                            b.store(element, self._at(self.y, b.add(at, b.mul(c(lane), p["o_q"]))))

                    def store_scalar(j, s):
                        value = self._result(sfold, sfold.finish(self._get(s)))
                        b.store(value, self._at(self.y, b.add(out0, b.mul(j, p["o_q"]))))

                    each(vec_levels[2], sca_levels[2], store_vector, store_scalar)

                whole = b.icmp_signed("==", first, width)
                case = b.select(whole, vectors, c(0))  # 0 (and above REGISTER_VECTORS): arrays
                merge = self.fn.append_basic_block("tile.merge")
                arrays = self.fn.append_basic_block("tile.arrays")
                switch = b.switch(case, arrays)
                for count in range(1, REGISTER_VECTORS[k.op] + 1):
                    block = self.fn.append_basic_block(f"tile.{count}")
                    switch.add_case(c(count), block)
                    b.position_at_end(block)
                    self._columns_in_registers(base, out0, count)
                    b.branch(merge)
                b.position_at_end(arrays)
                array_path()
                b.branch(merge)
                b.position_at_end(merge)

    def _columns_in_registers(self, base, out0, count: int) -> None:
        """A tile of `count` whole vectors of outputs, its accumulators in registers."""
        b, c, k, p = self.b, self.c, self.k, self.p
        fold = _Fold(self, self.vty)
        per = [self._per_output(b.add(out0, c(i * k.lanes)), True) for i in range(count)]

        def body(lo, hi, target):
            with self.loop(lo, hi, "row") as r:
                row = b.add(base, b.mul(r, p["s_r"]))
                for i in range(count):
                    x = self._value(b.add(row, c(i * k.lanes)), True, per[i])
                    self._set(target[i], fold.step(self._get(target[i]), x))

        for i, slots in enumerate(self._fold_in_levels(fold, "v", count, p["r"], body)):
            value = self._result(fold, fold.finish(self._get(slots)))
            at = b.add(out0, b.mul(c(i * k.lanes), p["o_q"]))
            for lane in range(k.lanes):
                element = b.extract_element(value, ir.Constant(I32, lane))
                b.store(element, self._at(self.y, b.add(at, b.mul(c(lane), p["o_q"]))))


def emit_reduce_kernel(kernel: ReduceKernel, flush_denormals: bool = True) -> str:
    """The LLVM IR of library kernel `kernel`, its function named SYMBOL: pointer arguments
    (out, x, init, params)."""
    return _ReduceEmitter(kernel, flush_denormals).emit_ir()
