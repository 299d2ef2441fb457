# Pooling as kernels generic in their geometry: the kernel library's reduce-windows.
#
# The pooling kernel of codegen/emit_window.py is compiled per window and shape (25-30 ms of
# LLVM each, more than XLA's compile of a whole pooling program: XLA:CPU's reduce-window is
# an emitted loop too, but LLVM's work on it is smaller than ours). The kernels here run any
# reduce-window of one f32 or f64 array by add, maximum or minimum with the geometry read
# from a parameter block at run time, so a few objects per machine (jit/kernel_library.py)
# serve every such pooling and a program needs no LLVM for it.
#
# Geometry, as emit_window's: operand and result share one layout; their trailing physical
# dims whose window is one element form a contiguous run of `run` elements in both (the
# features of NHWC pooling; 1 for NCHW). The other dims, at most MAX_DIMS of them, are the
# row dims, taken in logical order (after one-element dims that pad them to MAX_DIMS, so
# that the innermost loops are the windowed dims'): the outer
# range counts output rows (every position of the row dims). Per row dim the block holds its
# output and input sizes, element strides in the input and the result, and its window's size,
# stride, window dilation, base dilation and low padding.
#
# Fold order, as emit_window's and the interpreter's rule: init, then the window's elements
# in logical row-major order of the window offsets, leaving out those on padding or between
# the elements of a base-dilated operand; the reducer is emitted by call_scalar from the same
# reducer computation, so the results are the per-shape kernel's bit for bit. A window
# offset along a dim is tested once, in the loop over that dim, and a row dim's whole inner
# nest is skipped where it reads padding. With run = 1 the accumulator is a register; else
# the run goes in chunks of V elements, each folded over the whole window in a vector
# register (masked loads and store for the last chunk; the reducer's instruction on vectors:
# lane by lane what call_scalar emits), so no accumulator goes through memory (keeping them
# in the row's outputs measured 3.5x slower on NHWC max pooling). Rows are independent: any split of
# the outer range gives the same bits. The kernel is
#
#   void f(i8* noalias out, i8* noalias x, i8* noalias init, i64* noalias params,
#          i64 start, i64 end)
#
# with `params` the i64 block `window_params` gives; subnormals are flushed like the other
# kernels'.

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from llvmlite import ir

from xlapy.backends.cpu.codegen.common import I1, I32, I64, SYMBOL, mem_type
from xlapy.backends.cpu.codegen.elemental import simple_reducer
from xlapy.backends.cpu.codegen.emit_window import _order, _strides, _trivial, window_reason
from xlapy.backends.cpu.codegen.emitter import KernelEmitter
from xlapy.ir.computation import HloComputation
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.opcodes import Opcode
from xlapy.ir.types import PrimitiveType

MAX_DIMS = 4
"""Row dims (dims outside the contiguous run) a library pooling kernel takes."""

DIM_WORDS = ("o", "n", "xs", "ys", "size", "stride", "wdil", "bdil", "pad")
"""The parameter block's words per row dim: output and input sizes, element strides in the
input and the result, the window's size, stride, window dilation, base dilation and low
padding. The block is `run`, then MAX_DIMS groups of these, logical order."""

OPS = {Opcode.ADD: "add", Opcode.MAXIMUM: "maximum", Opcode.MINIMUM: "minimum"}
TYPES = {PrimitiveType.F32: "f32", PrimitiveType.F64: "f64"}


@dataclass(frozen=True, slots=True)
class WindowKernel:
    """One pooling kernel of the library: an element type and a reducer."""

    dtype: str  # "f32" or "f64"
    op: str  # "add", "maximum" or "minimum"
    lanes: int  # V: elements of this type in one vector register

    @property
    def name(self) -> str:
        """A short readable name (dumps, the library listing)."""
        return f"window_{self.dtype}_{self.op}"

    def description(self, flush_denormals: bool) -> str:
        """A text that determines the kernel's IR (with the sources: a cache key)."""
        return f"window-library v1 {'ftz' if flush_denormals else 'ieee'} {self!r}"


def menu(lanes: int) -> tuple[WindowKernel, ...]:
    """Every pooling kernel of the library for vector registers of `lanes` f32 elements."""
    return tuple(
        WindowKernel(t, op, max(lanes // 2, 1) if t == "f64" else lanes)
        for t in TYPES.values()
        for op in OPS.values()
    )


def window_library_kernel(
    instr: HloInstruction, lanes: int
) -> tuple[WindowKernel, tuple[int, ...]] | str:
    """The library kernel (for vector registers of `lanes` f32 elements) and parameter
    block that run reduce-window `instr`, or why none does."""
    if instr.opcode is not Opcode.REDUCE_WINDOW or len(instr.operands) != 2:
        return "not a reduce-window of one array"
    reason = window_reason(instr)
    if reason is not None:
        return reason
    x = instr.operands[0].shape
    t = x.element_type
    if t not in TYPES:
        return f"element type {t} (the library has {', '.join(TYPES.values())})"
    op = simple_reducer(instr.to_apply)
    if op not in OPS:
        return "a reducer other than add, maximum or minimum of its two parameters"
    window = instr.window.dims
    order = _order(x)
    t_run = len(order)
    while t_run > 0 and _trivial(window[order[t_run - 1]]):
        t_run -= 1
    rows = sorted(order[:t_run])
    if len(rows) > MAX_DIMS:
        return f"more than {MAX_DIMS} dims outside the contiguous run"
    out = instr.shape
    run = math.prod(out.dims[d] for d in order[t_run:])
    xs, ys = _strides(x), _strides(out)
    words = [run, *[1, 1, 0, 0, 1, 1, 1, 1, 0] * (MAX_DIMS - len(rows))]  # outermost: once a row
    for d in rows:
        w = window[d]
        words += [out.dims[d], x.dims[d], xs[d], ys[d], w.size, w.stride, w.window_dilation,
                  w.base_dilation, w.pad_low]  # fmt: skip
    v = max(lanes // 2, 1) if t is PrimitiveType.F64 else lanes
    return WindowKernel(TYPES[t], OPS[op], v), tuple(words)


def window_extent(params: tuple[int, ...]) -> int:
    """The kernel's outer range: output rows (the product of the row dims' output sizes)."""
    return math.prod(params[1 + k * len(DIM_WORDS)] for k in range(MAX_DIMS))


@functools.cache
def _reducer(kernel: WindowKernel) -> HloComputation:
    from xlapy.ir.parser import parse_module

    text = f"""HloModule {kernel.name}
ENTRY r {{
  a = {kernel.dtype}[] parameter(0)
  b = {kernel.dtype}[] parameter(1)
  ROOT c = {kernel.dtype}[] {kernel.op}(a, b)
}}"""
    entry = parse_module(text).entry
    assert entry is not None, "the text has an entry"
    return entry


class _Emitter(KernelEmitter):
    def __init__(self, kernel: WindowKernel, flush_denormals: bool):
        self.reducer = _reducer(kernel)
        super().__init__(self.reducer, SYMBOL, (), flush_denormals)
        self.t = PrimitiveType.F32 if kernel.dtype == "f32" else PrimitiveType.F64
        self.op, self.lanes = kernel.op, kernel.lanes
        scalar = mem_type(self.t)
        self.vty = ir.VectorType(scalar, kernel.lanes)
        suffix = f"v{kernel.lanes}{kernel.dtype}"
        mask = ir.VectorType(I1, kernel.lanes)
        vp = self.vty.as_pointer()
        load = ir.FunctionType(self.vty, [vp, I32, mask, self.vty])
        self.masked_load = ir.Function(self.module, load, f"llvm.masked.load.{suffix}.p0")
        store = ir.FunctionType(ir.VoidType(), [self.vty, vp, I32, mask])
        self.masked_store = ir.Function(self.module, store, f"llvm.masked.store.{suffix}.p0")
        self.align = ir.Constant(I32, 4 if kernel.dtype == "f32" else 8)
        if kernel.op != "add":
            ext = ir.FunctionType(self.vty, [self.vty, self.vty])
            self.vector_extremum = ir.Function(self.module, ext, f"llvm.{kernel.op}.{suffix}")

    def emit_ir(self) -> str:
        fn, body = self.begin_function(["out", "x", "init", "params"], set())
        b = self.b
        ptr = mem_type(self.t).as_pointer()
        self.out, self.x = b.bitcast(fn.args[0], ptr), b.bitcast(fn.args[1], ptr)
        self.init = b.load(b.bitcast(fn.args[2], ptr), name="init")
        words = b.bitcast(fn.args[3], I64.as_pointer())

        def word(i: int, name: str):
            return b.load(b.gep(words, [ir.Constant(I64, i)], True), name=name)

        self.run = word(0, "run")
        self.dims = [
            {w: word(1 + k * len(DIM_WORDS) + j, f"{w}{k}") for j, w in enumerate(DIM_WORDS)}
            for k in range(MAX_DIMS)
        ]
        self.acc = self.alloca(mem_type(self.t), "acc")
        self.vacc = self.alloca(self.vty, "vacc")
        # the first row's coordinates by division, the next ones' by counting (a division
        # by a run-time size per dim and row cost more than a small window's folds)
        self.coords = [self.alloca(I64, f"c{k}") for k in range(MAX_DIMS)]
        rest = fn.args[4]
        for k in reversed(range(MAX_DIMS)):
            b.store(b.urem(rest, self.dims[k]["o"]), self.coords[k])
            rest = b.udiv(rest, self.dims[k]["o"])
        with self.loop(fn.args[4], fn.args[5], "row"):
            self._row()
            self._advance(MAX_DIMS - 1)
        self.end_function(body)
        return str(self.module)

    def _advance(self, k: int) -> None:
        """The next row's coordinates: dim k counts up, wrapping into dim k - 1."""
        b = self.b
        v = b.add(b.load(self.coords[k]), ir.Constant(I64, 1))
        wrap = b.icmp_unsigned("==", v, self.dims[k]["o"])
        b.store(b.select(wrap, ir.Constant(I64, 0), v), self.coords[k])
        if k > 0:
            with b.if_then(wrap):
                self._advance(k - 1)

    def _row(self) -> None:
        b = self.b
        zero = ir.Constant(I64, 0)
        coords = [b.load(c) for c in self.coords]
        out_at = zero
        for k in range(MAX_DIMS):
            out_at = b.add(out_at, b.mul(coords[k], self.dims[k]["ys"]))
        bases = [b.sub(b.mul(coords[k], d["stride"]), d["pad"]) for k, d in enumerate(self.dims)]
        one = b.icmp_unsigned("==", self.run, ir.Constant(I64, 1))
        with b.if_else(one) as (scalar, vector):
            with scalar:
                b.store(self.init, self.acc)
                self._nest(0, bases, zero, lambda x_at: self._fold_scalar(x_at))
                b.store(b.load(self.acc), b.gep(self.out, [out_at], True))
            with vector:
                self._chunks(bases, out_at)

    def _nest(self, k: int, bases, x_at, fold) -> None:
        """The loops over the window offsets of row dims k.. (logical row-major order), each
        skipping the offsets that read padding or fall between base-dilated elements."""
        if k == MAX_DIMS:
            fold(x_at)
            return
        b, d = self.b, self.dims[k]
        zero, one = ir.Constant(I64, 0), ir.Constant(I64, 1)
        last = b.mul(b.sub(d["n"], one), d["bdil"])
        with self.loop(zero, d["size"], f"w{k}", unroll=1) as w:
            p = b.add(bases[k], b.mul(w, d["wdil"]))
            inside = b.and_(b.icmp_signed(">=", p, zero), b.icmp_signed("<=", p, last))
            dilated = b.icmp_unsigned(">", d["bdil"], one)
            with b.if_then(inside):
                entry = b.block
                with b.if_then(dilated):
                    on_grid = b.icmp_signed("==", b.srem(p, d["bdil"]), zero)
                    q = b.sdiv(p, d["bdil"])
                    grid = b.block
                phi_ok = b.phi(ir.IntType(1))
                phi_ok.add_incoming(ir.Constant(ir.IntType(1), 1), entry)
                phi_ok.add_incoming(on_grid, grid)
                phi_p = b.phi(I64)
                phi_p.add_incoming(p, entry)
                phi_p.add_incoming(q, grid)
                with b.if_then(phi_ok):
                    at = b.add(x_at, b.mul(phi_p, d["xs"]))
                    self._nest(k + 1, bases, at, fold)

    def _apply(self, acc, x):
        return self.call_scalar(self.reducer, [acc, x])

    def _fold_scalar(self, x_at) -> None:
        b = self.b
        x = b.load(b.gep(self.x, [x_at], True))
        b.store(self._apply(b.load(self.acc), x), self.acc)

    def _chunks(self, bases, out_at) -> None:
        """The row's run in chunks of V elements, each folded over the whole window in a
        vector register (the last chunk's lanes past the run masked off)."""
        b, v = self.b, self.lanes
        zero = ir.Constant(I64, 0)
        lanes = ir.Constant(ir.VectorType(I64, v), list(range(v)))
        splat = b.insert_element(ir.Constant(self.vty, ir.Undefined), self.init, zero)
        init = b.shuffle_vector(splat, ir.Constant(self.vty, ir.Undefined),
                                ir.Constant(ir.VectorType(I32, v), [0] * v))  # fmt: skip
        with self.loop(zero, self.run, "chunk", step=v, unroll=1) as j:
            left = b.insert_element(ir.Constant(ir.VectorType(I64, v), ir.Undefined),
                                    b.sub(self.run, j), zero)  # fmt: skip
            left = b.shuffle_vector(left, ir.Constant(ir.VectorType(I64, v), ir.Undefined),
                                    ir.Constant(ir.VectorType(I32, v), [0] * v))  # fmt: skip
            mask = b.icmp_signed("<", lanes, left)
            b.store(init, self.vacc)

            def fold(x_at):
                ptr = b.bitcast(b.gep(self.x, [b.add(x_at, j)], True), self.vty.as_pointer())
                x = b.call(self.masked_load, [ptr, self.align, mask, init])
                b.store(self._vector_op(b.load(self.vacc), x), self.vacc)

            self._nest(0, bases, zero, fold)
            ptr = b.bitcast(b.gep(self.out, [b.add(out_at, j)], True), self.vty.as_pointer())
            b.call(self.masked_store, [b.load(self.vacc), ptr, self.align, mask])

    def _vector_op(self, acc, x):
        """The reducer on vectors: the instruction call_scalar emits for it (fadd, or
        llvm.maximum / llvm.minimum), lane by lane the same results."""
        if self.op == "add":
            return self.b.fadd(acc, x)
        return self.b.call(self.vector_extremum, [acc, x])


def emit_window_kernel(kernel: WindowKernel, flush_denormals: bool = True) -> str:
    """The LLVM IR of the library's pooling kernel `kernel` (see the file comment)."""
    return _Emitter(kernel, flush_denormals).emit_ir()
