# Pooling: a reduce-window with any window (max-pool, avg-pool, their gradients' padded and
# dilated forms) as one native kernel, for any reducer computation.
#
# The interpreter's rule folds, per output element, init and then the window's elements in
# row-major order of the window offsets, leaving out the ones that fall on padding or between
# the elements of a base-dilated operand. The kernel does exactly that, so its results are
# the rule's bit for bit (the reducer is inlined by call_scalar, which rounds f16 / bf16
# after every op as the rule's NumPy types do; max / min are IEEE maximum / minimum as in
# every kernel, so a NaN's payload and max(-0, +0) may differ from NumPy's): window offsets
# run in logical row-major order
# whatever the layout, and an offset is skipped where, along some dim, its position
#
#   p = o * stride + k * window_dilation - pad_low
#
# is outside [0, (n - 1) * base_dilation] or not a multiple of base_dilation; the element it
# reads is p / base_dilation.
#
# Operand and results share one layout. Their trailing physical dims whose window is one
# element (size 1, stride 1, no padding or dilation: each output reads its own position
# there; the feature dim of NHWC pooling) form a contiguous run of C elements in both: the
# kernel's outer range counts output "rows" (every other output position), and for each row
# and valid window offset the innermost loop folds a run of C inputs into the C outputs of the
# row, contiguous on both sides, which LLVM vectorizes. The row's outputs hold the
# accumulators (they stay in L1). Without such dims (C = 1: NCHW pooling, whose minor dim is
# windowed) the accumulators are registers (allocas that LLVM promotes). Rows are
# independent, so a thunk may split the outer range over the pool (KernelThunk: pool_size()
# even blocks of rows).
#
# Variadic reduce-windows (k inputs and inits, a reducer of 2k parameters) fold all inputs
# together. The kernel is
#
#   void f(i8* out_0..out_k-1, i8* x_0..x_k-1, i8* init_0..init_k-1, i64 start, i64 end)
#
# with noalias pointers (a thunk gives an overlapping output a scratch buffer).

from __future__ import annotations

import itertools
import math

from llvmlite import ir

from xlapy.backends.cpu.codegen.common import (
    I1,
    I64,
    SYMBOL,
    KernelSpec,
    UnsupportedForCodegen,
    check_type,
    mem_type,
    reg_type,
)
from xlapy.backends.cpu.codegen.emitter import KernelEmitter, supported
from xlapy.backends.cpu.codegen.ir_release import released_text
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.shapes import Shape

_UNROLL_OFFSETS = 64
"""Windows with at most this many offsets are emitted unrolled (constant offsets, checks
folded where the geometry decides them); larger ones as loops over the window dims."""


def _trivial(d) -> bool:
    return (
        d.size == 1
        and d.stride == 1
        and not (d.pad_low or d.pad_high)
        and d.window_dilation == 1
        and d.base_dilation == 1
    )


def _order(shape: Shape) -> tuple[int, ...]:
    """Logical dims in physical major-to-minor order."""
    return tuple(reversed(shape.layout_or_default.minor_to_major))


def window_reason(instr: HloInstruction) -> str | None:
    """None when `instr` (a reduce-window) can be a native pooling kernel, else why not."""
    k = len(instr.operands) // 2
    if k == 0 or len(instr.operands) != 2 * k:
        return "reduce-window needs inputs and as many inits"
    window, reducer = instr.window_or_none, instr.to_apply_or_none
    if window is None or reducer is None:
        return "reduce-window needs a window and to_apply"
    xs, inits = instr.operands[:k], instr.operands[k:]
    outs = [s for _, s in instr.shape.leaves()]
    if len(outs) != k:
        return "one output per input"
    first = xs[0].shape
    if not first.is_array or len(window.dims) != first.rank:
        return "a non-array operand or a window of another rank"
    if any(d.reversal for d in window.dims):
        return "a reversed window"
    if any(d.size < 1 or d.stride < 1 or d.window_dilation < 1 or d.base_dilation < 1
           for d in window.dims):  # fmt: skip
        return "a window of non-positive size, stride or dilation"
    if 0 in first.dims or 0 in outs[0].dims:
        return "an empty operand or result"
    for x, init, out in zip(xs, inits, outs, strict=True):
        if not (x.shape.is_array and init.shape.is_array and out.is_array):
            return "a tuple or token operand"
        if init.shape.rank != 0:
            return "the init is not a scalar"
        if x.shape.dims != first.dims or out.dims != outs[0].dims:
            return "inputs (outputs) of different dimensions"
        if _order(x.shape) != _order(first) or _order(out) != _order(first):
            return "inputs and outputs in different layouts"
        if x.shape.element_type != out.element_type or init.shape.element_type != out.element_type:
            return "an output or init of another element type than its input"
        try:
            check_type(instr, x.shape)
            check_type(instr, out)
        except UnsupportedForCodegen as e:
            return str(e)
    return supported(reducer)


class _WindowEmitter(KernelEmitter):
    """Emits the pooling loops of one reduce-window; the reducer goes through call_scalar."""

    def __init__(self, instr: HloInstruction, flush_denormals: bool):
        self.instr = instr
        self.reducer = instr.to_apply
        super().__init__(self.reducer, SYMBOL, (), flush_denormals)
        self.k = len(instr.operands) // 2
        x = instr.operands[0].shape
        out = next(s for _, s in instr.shape.leaves())
        self.types = [o.shape.element_type for o in instr.operands[: self.k]]
        self.window = instr.window.dims
        order = _order(x)
        # trailing physical dims with one-element windows: the contiguous run
        t = len(order)
        while t > 0 and _trivial(self.window[order[t - 1]]):
            t -= 1
        self.row_dims = order[:t]  # logical dims a row index runs over, major first
        self.run = math.prod(out.dims[d] for d in order[t:])
        self.rows = math.prod(out.dims[d] for d in self.row_dims)
        self.in_dims, self.out_dims = x.dims, out.dims
        self.x_strides = _strides(x)
        self.out_strides = _strides(out)
        # window offsets run in logical row-major order (the rule's fold order)
        self.windowed = sorted(d for d in self.row_dims if not _trivial(self.window[d]))

    def emit(self) -> KernelSpec:
        k = self.k
        names = [f"out{i}" for i in range(k)] + [f"x{i}" for i in range(k)]
        names += [f"init{i}" for i in range(k)]
        fn, body = self.begin_function(names, set())
        b = self.b
        ptrs = [b.bitcast(arg, mem_type(t).as_pointer()) for arg, t in zip(fn.args, self.types * 3)]
        self.out, self.x, init_ptrs = ptrs[:k], ptrs[k : 2 * k], ptrs[2 * k :]
        self.inits = [
            self.from_mem(b.load(p), t) for p, t in zip(init_ptrs, self.types, strict=True)
        ]
        if self.run == 1:
            self.accs = [self.alloca(reg_type(t), f"acc{i}") for i, t in enumerate(self.types)]
        with self.loop(fn.args[3 * k], fn.args[3 * k + 1], "row") as row:
            self._row(row)
        self.end_function(body)
        outs = tuple(s for _, s in self.instr.shape.leaves())
        return KernelSpec(
            self.name,
            released_text(self.module),
            outs,
            tuple(o.shape for o in self.instr.operands),
            self.rows,
        )

    def _row(self, row) -> None:
        b = self.b
        c = lambda v: ir.Constant(I64, v)  # noqa: E731
        # the row's output coordinates along the row dims, and the row's output offset
        coords: dict[int, ir.Value] = {}
        rest = row
        for d in reversed(self.row_dims):
            n = self.out_dims[d]
            coords[d] = b.urem(rest, c(n)) if d != self.row_dims[0] else rest
            rest = b.udiv(rest, c(n))
        out_at = c(0)
        for d in self.row_dims:
            out_at = b.add(out_at, b.mul(coords[d], c(self.out_strides[d])), flags=["nsw"])
        # where each window's first element sits, per windowed dim: o * stride - pad_low
        base = {
            d: b.sub(b.mul(coords[d], c(self.window[d].stride)), c(self.window[d].pad_low))
            for d in self.windowed
        }
        x_at = c(0)
        for d in self.row_dims:
            if d not in base:
                x_at = b.add(x_at, b.mul(coords[d], c(self.x_strides[d])), flags=["nsw"])
        self._init(out_at)
        offsets = math.prod(self.window[d].size for d in self.windowed)
        if offsets <= _UNROLL_OFFSETS:
            for offset in itertools.product(*(range(self.window[d].size) for d in self.windowed)):
                self._offset(dict(zip(self.windowed, (c(o) for o in offset), strict=True)),
                             base, x_at, out_at)  # fmt: skip
        else:
            self._nest(0, {}, base, x_at, out_at)
        self._finish(out_at)

    def _nest(self, level: int, at: dict, base, x_at, out_at) -> None:
        if level == len(self.windowed):
            self._offset(at, base, x_at, out_at)
            return
        d = self.windowed[level]
        with self.loop(ir.Constant(I64, 0), ir.Constant(I64, self.window[d].size), "w") as o:
            self._nest(level + 1, {**at, d: o}, base, x_at, out_at)

    def _offset(self, at: dict, base, x_at, out_at) -> None:
        """Fold the window elements at window offset `at` (per windowed dim) into the row."""
        b = self.b
        c = lambda v: ir.Constant(I64, v)  # noqa: E731
        ok: ir.Value = ir.Constant(I1, 1)
        for d in self.windowed:
            w = self.window[d]
            p = b.add(base[d], b.mul(at[d], c(w.window_dilation)))
            last = (self.in_dims[d] - 1) * w.base_dilation
            inside = b.and_(b.icmp_signed(">=", p, c(0)), b.icmp_signed("<=", p, c(last)))
            if w.base_dilation > 1:
                on_grid = b.icmp_signed("==", b.srem(p, c(w.base_dilation)), c(0))
                inside = b.and_(inside, on_grid)
                p = b.sdiv(p, c(w.base_dilation))
            ok = b.and_(ok, inside)
            x_at = b.add(x_at, b.mul(p, c(self.x_strides[d])))
        with b.if_then(ok):
            self._fold(x_at, out_at)

    def _init(self, out_at) -> None:
        if self.run == 1:
            for acc, v in zip(self.accs, self.inits, strict=True):
                self.b.store(v, acc)
            return
        with self.loop(ir.Constant(I64, 0), ir.Constant(I64, self.run), "init") as j:
            at = self.b.add(out_at, j)
            for p, t, v in zip(self.out, self.types, self.inits, strict=True):
                self.b.store(self.to_mem(v, t), self.b.gep(p, [at], True))

    def _fold(self, x_at, out_at) -> None:
        b = self.b
        if self.run == 1:
            xs = [self.from_mem(b.load(b.gep(p, [x_at], True)), t)
                  for p, t in zip(self.x, self.types, strict=True)]  # fmt: skip
            accs = [b.load(a) for a in self.accs]
            for acc, v in zip(self.accs, self._apply(accs, xs), strict=True):
                b.store(v, acc)
            return
        with self.loop(ir.Constant(I64, 0), ir.Constant(I64, self.run), "run") as j:
            src, dst = b.add(x_at, j), b.add(out_at, j)
            xs = [self.from_mem(b.load(b.gep(p, [src], True)), t)
                  for p, t in zip(self.x, self.types, strict=True)]  # fmt: skip
            accs = [self.from_mem(b.load(b.gep(p, [dst], True)), t)
                    for p, t in zip(self.out, self.types, strict=True)]  # fmt: skip
            for p, t, v in zip(self.out, self.types, self._apply(accs, xs), strict=True):
                b.store(self.to_mem(v, t), b.gep(p, [dst], True))

    def _finish(self, out_at) -> None:
        if self.run != 1:
            return
        for p, t, acc in zip(self.out, self.types, self.accs, strict=True):
            self.b.store(self.to_mem(self.b.load(acc), t), self.b.gep(p, [out_at], True))

    def _apply(self, accs, xs) -> list:
        result = self.call_scalar(self.reducer, [*accs, *xs])
        results = list(result) if isinstance(result, tuple) else [result]
        if len(results) != self.k:
            raise UnsupportedForCodegen(
                f"{self.instr.name}: the reducer returns {len(results)} values for {self.k} inputs"
            )
        return results


def _strides(shape: Shape) -> list[int]:
    strides = [0] * shape.rank
    step = 1
    for d in shape.layout_or_default.minor_to_major:
        strides[d] = step
        step *= shape.dims[d]
    return strides


def window_description(instr: HloInstruction, flush_denormals: bool = True) -> str:
    """A text that determines the IR emit_window makes for `instr` (a cache key): its
    operand and result shapes with layouts, window and reducer."""
    shapes = " ".join(o.shape.to_text() for o in instr.operands)
    return (
        f"window v1 {'ftz' if flush_denormals else 'ieee'} {shapes} -> "
        f"{instr.shape.to_text()} window={instr.window!r}\n"
        f"{instr.to_apply.to_text()}"
    )


def window_signature(instr: HloInstruction) -> tuple[tuple[Shape, ...], tuple[Shape, ...], int]:
    """(outputs, params, outer extent) of `instr`'s pooling kernel, without emitting it."""
    emitter = _WindowEmitter(instr, True)
    outs = tuple(s for _, s in instr.shape.leaves())
    return outs, tuple(o.shape for o in instr.operands), emitter.rows


def emit_window(instr: HloInstruction, flush_denormals: bool = True) -> KernelSpec:
    """The LLVM IR of `instr`'s pooling kernel (see the file comment); the caller has
    checked window_reason."""
    return _WindowEmitter(instr, flush_denormals).emit()
