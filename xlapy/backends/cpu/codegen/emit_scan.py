# Prefix scans written as reduce-window, as one native kernel for any reducer computation.
#
# JAX lowers cumsum / cumprod / cummax / cumlogsumexp (and their reverse forms and gradients)
# along an axis of length n to a reduce-window whose window spans w >= n elements of that
# axis with w - 1 elements of padding on one side, stride 1 and size-1 windows elsewhere
# (window_thunk._scan_axis recognises it). Forward (low padding), output i folds
# init, x[0], ..., x[i]; the interpreter's rule folds them in that order (padding left out),
# so does this kernel: out[first] = f(init, x[first]), then out[i] = f(out[i - 1], x[i]),
# bit for bit the rule's result for every reducer. Reverse (high padding), output i folds
# init, x[i], ..., x[n-1]; the kernel runs the same recurrence from the other end,
# out[i] = f(out[i + 1], x[i]): the same result for max/min and integers, a float sum or
# product folded from the other end (last bits may differ, as they do in XLA's own rewrite
# of scans into blocked associative scans; like XLA, a reverse scan takes the reducer to be
# associative and commutative, as reduce-window's semantics allow). A reduce-window of
# size-1 windows without padding (out = f(init, x)) is the same kernel with a scan axis of
# length 1.
#
# Variadic reduce-windows (several inputs and inits, a tuple reducer) scan all inputs
# together: the reducer takes (acc_0..acc_k-1, x_0..x_k-1) as the rule calls it.
#
# In physical (major-to-minor) order an operand is [O outer positions][n scan][M inner], so
# element (o, i, j) sits at o*n*M + i*M + j. The kernel's outer range counts tiles of
# (RB outer positions) x (CB inner positions); each tile runs the scan over i with the
# other two loops inside: when M is large the innermost loop runs over contiguous inner
# positions (RB = 1) and vectorizes; when M is small (a scan along the minor dimension,
# M = 1) a tile holds RB rows whose recurrences are independent, so their chains overlap
# in the pipeline instead of one long serial chain: rows take turns of 16 steps (one cache
# line each; rows a power of two apart share cache sets, so one step per turn would keep
# evicting them) where the reducer is one op, and of one step where it is longer (its
# chain's latency then dominates, and one step of each row fits the out-of-order window).
# Tiles are independent: a thunk may split the range over the pool. The kernel is
#
#   void f(i8* out_0..out_k-1, i8* x_0..x_k-1, i8* init_0..init_k-1, i64 start, i64 end)
#
# with noalias pointers (the thunk gives any overlapping output a scratch buffer). Its object
# is cached under scan_description (jit.kernel.described_kernel): a warm compile neither
# emits the IR nor waits for LLVM.

from __future__ import annotations

import math

from llvmlite import ir

from xlapy.backends.cpu.codegen.common import (
    I64,
    SYMBOL,
    KernelSpec,
    UnsupportedForCodegen,
    check_type,
    mem_type,
)
from xlapy.backends.cpu.codegen.emitter import KernelEmitter, supported
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.shapes import Shape

_ROWS = 8
"""Outer positions per tile when the scan axis is (nearly) minor: independent chains."""
_CHUNK = 16
"""Scan steps each of those rows takes before the next row's turn (a cache line of f32),
for a reducer of one op; a longer one (cumlogsumexp's) takes one step per row in turn, so
the rows' long dependency chains overlap in the pipeline."""
_VECTOR_MIN = 16
"""Inner positions from which a tile runs one outer position over a block of them."""
_COLUMNS = 1024
"""Inner positions per tile in that case."""


def scan_window(instr: HloInstruction) -> tuple[int | None, bool] | None:
    """(axis, reverse) of a reduce-window that is a prefix scan over `axis`, (None, False)
    for a reduce-window of size-1 windows (out = f(init, x)), else None."""
    window = instr.window_or_none
    k = len(instr.operands) // 2
    if window is None or k == 0:
        return None
    dims = instr.operands[0].shape.dims
    if len(window.dims) != len(dims):
        return None
    found: tuple[int | None, bool] = (None, False)
    for a, (d, n) in enumerate(zip(window.dims, dims, strict=True)):
        if d.stride != 1 or d.window_dilation != 1 or d.base_dilation != 1 or d.reversal:
            return None
        if d.size == 1 and d.pad_low == 0 and d.pad_high == 0:
            continue
        if found[0] is not None or d.size < n:
            return None
        if d.pad_low == d.size - 1 and d.pad_high == 0:
            found = (a, False)
        elif d.pad_high == d.size - 1 and d.pad_low == 0:
            found = (a, True)
        else:
            return None
    return found


def _order(shape: Shape) -> tuple[int, ...]:
    return tuple(shape.layout_or_default.minor_to_major)


def scan_reason(instr: HloInstruction) -> str | None:
    """None when `instr` (a reduce-window) can be a native scan kernel, else why not."""
    k = len(instr.operands) // 2
    if k == 0 or len(instr.operands) != 2 * k:
        return "reduce-window needs inputs and as many inits"
    if scan_window(instr) is None:
        return "not a prefix scan (strides, dilation or a pooling window)"
    reducer = instr.to_apply_or_none
    if reducer is None:
        return "reduce-window needs to_apply"
    xs, inits = instr.operands[:k], instr.operands[k:]
    outs = [s for _, s in instr.shape.leaves()]
    if len(outs) != k:
        return "one output per input"
    first = xs[0].shape
    if not first.is_array or 0 in first.dims:
        return "an empty or non-array operand"
    for x, init, out in zip(xs, inits, outs, strict=True):
        if not (x.shape.is_array and init.shape.is_array and out.is_array):
            return "a tuple or token operand"
        if init.shape.rank != 0:
            return "the init is not a scalar"
        if x.shape.dims != first.dims or out.dims != first.dims:
            return "inputs and outputs of different dimensions"
        if _order(x.shape) != _order(first) or _order(out) != _order(first):
            return "inputs and outputs in different layouts"
        if x.shape.element_type != out.element_type:
            return "an output of another element type than its input"
        if init.shape.element_type != out.element_type:
            return "an init of another element type than its input"
        try:
            check_type(instr, x.shape)
            check_type(instr, out)
        except UnsupportedForCodegen as e:
            return str(e)
    return supported(reducer)


class _ScanEmitter(KernelEmitter):
    """Emits the scan loops of one reduce-window; the reducer goes through call_scalar."""

    unroll_outer_loops = True  # the rows of a tile overlap their chains once unrolled

    def __init__(self, instr: HloInstruction, flush_denormals: bool):
        self.instr = instr
        self.reducer = instr.to_apply
        super().__init__(self.reducer, SYMBOL, (), flush_denormals)
        self.k = len(instr.operands) // 2
        shape = instr.operands[0].shape
        self.types = [x.shape.element_type for x in instr.operands[: self.k]]
        axis, self.reverse = scan_window(instr) or (None, False)
        major_to_minor = tuple(reversed(_order(shape)))
        if axis is None:  # size-1 windows: a scan of length 1 over every element
            self.outer, self.n, self.inner = 1, 1, shape.num_elements
        else:
            p = major_to_minor.index(axis)
            self.outer = math.prod(shape.dims[d] for d in major_to_minor[:p])
            self.n = shape.dims[axis]
            self.inner = math.prod(shape.dims[d] for d in major_to_minor[p + 1 :])
        if self.inner >= _VECTOR_MIN:
            self.rows, self.cols = 1, min(self.inner, _COLUMNS)
            self.chunk = max(self.n - 1, 1)
        else:
            self.rows, self.cols = min(self.outer, _ROWS), self.inner
            one_op = len(self.reducer.instructions) <= 2 * self.k + 1
            self.chunk = _CHUNK if one_op else 1
        self.col_tiles = -(-self.inner // self.cols)
        self.extent = -(-self.outer // self.rows) * self.col_tiles

    def emit(self) -> KernelSpec:
        k = self.k
        names = [f"out{i}" for i in range(k)] + [f"x{i}" for i in range(k)]
        names += [f"init{i}" for i in range(k)]
        fn, body = self.begin_function(names, set())
        b = self.b
        ptrs = [b.bitcast(arg, mem_type(t).as_pointer()) for arg, t in zip(fn.args, self.types * 3)]
        self.out, self.x, init_ptrs = ptrs[:k], ptrs[k : 2 * k], ptrs[2 * k :]
        inits = [self.from_mem(b.load(p), t) for p, t in zip(init_ptrs, self.types, strict=True)]
        c = lambda v: ir.Constant(I64, v)  # noqa: E731
        with self.loop(fn.args[3 * k], fn.args[3 * k + 1], "tile") as tile:
            row_tile = b.udiv(tile, c(self.col_tiles))
            col_tile = b.urem(tile, c(self.col_tiles))
            o0 = b.mul(row_tile, c(self.rows))
            o1 = self._min(b.add(o0, c(self.rows)), c(self.outer))
            j0 = b.mul(col_tile, c(self.cols))
            j1 = self._min(b.add(j0, c(self.cols)), c(self.inner))
            first = self.n - 1 if self.reverse else 0
            self._step(o0, o1, j0, j1, c(first), None, inits)
            if self.n > 1:
                with self.loop(c(0), c(-(-(self.n - 1) // self.chunk)), "chunk") as chunk:
                    s0 = b.add(b.mul(chunk, c(self.chunk)), c(1))
                    s1 = self._min(b.add(s0, c(self.chunk)), c(self.n))
                    with self.loop(o0, o1, "row") as o, self.loop(s0, s1, "step") as s:
                        i = b.sub(c(self.n - 1), s) if self.reverse else s
                        back = self.inner if self.reverse else -self.inner
                        self._step(o, None, j0, j1, i, back, inits)
        self.end_function(body)
        outs = tuple(s for _, s in self.instr.shape.leaves())
        return KernelSpec(
            self.name,
            str(self.module),
            outs,
            tuple(o.shape for o in self.instr.operands),
            self.extent,
        )

    def _min(self, a, b_):
        return self.b.select(self.b.icmp_signed("<", a, b_), a, b_)

    def _step(self, o0, o1, j0, j1, i, back: int | None, inits) -> None:
        """out[o, i, j] = f(previous, x[o, i, j]) over rows [o0, o1) (row o0 alone when o1
        is None) and columns [j0, j1); previous is the output one step back along the scan
        (`back` elements away), or the init on the first step."""
        if o1 is None:
            self._row(o0, j0, j1, i, back, inits)
            return
        with self.loop(o0, o1, "row") as o:
            self._row(o, j0, j1, i, back, inits)

    def _row(self, o, j0, j1, i, back: int | None, inits) -> None:
        b = self.b
        c = lambda v: ir.Constant(I64, v)  # noqa: E731
        row = b.add(b.mul(o, c(self.n * self.inner)), b.mul(i, c(self.inner)))
        with self.loop(j0, j1, "col") as j:
            at = b.add(row, j)
            xs = [
                self.from_mem(b.load(b.gep(p, [at], True)), t)
                for p, t in zip(self.x, self.types, strict=True)
            ]
            if back is None:
                accs = list(inits)
            else:
                prev = b.add(at, c(back))
                accs = [
                    self.from_mem(b.load(b.gep(p, [prev], True)), t)
                    for p, t in zip(self.out, self.types, strict=True)
                ]
            result = self.call_scalar(self.reducer, [*accs, *xs])
            results = result if isinstance(result, tuple) else (result,)
            if len(results) != self.k:
                raise UnsupportedForCodegen(
                    f"{self.instr.name}: the reducer returns {len(results)} values "
                    f"for {self.k} inputs"
                )
            for p, t, v in zip(self.out, self.types, results, strict=True):
                b.store(self.to_mem(v, t), b.gep(p, [at], True))


def scan_description(instr: HloInstruction, flush_denormals: bool = True) -> str:
    """A text that determines the IR emit_scan makes for `instr` (a cache key): its
    operand and result shapes with layouts, window and reducer."""
    shapes = " ".join(o.shape.to_text() for o in instr.operands)
    return (
        f"scan v1 {'ftz' if flush_denormals else 'ieee'} {shapes} -> {instr.shape.to_text()} "
        f"window={instr.window!r}\n{instr.to_apply.to_text()}"
    )


def scan_signature(instr: HloInstruction) -> tuple[tuple[Shape, ...], tuple[Shape, ...], int]:
    """(outputs, params, outer extent) of `instr`'s scan kernel, without emitting it."""
    emitter = _ScanEmitter(instr, True)
    outs = tuple(s for _, s in instr.shape.leaves())
    return outs, tuple(o.shape for o in instr.operands), emitter.extent


def emit_scan(instr: HloInstruction, flush_denormals: bool = True) -> KernelSpec:
    """The LLVM IR of `instr`'s scan kernel (see the file comment); the caller has checked
    scan_reason. `flush_denormals` as the other kernels (emitter.denormals_flushed)."""
    return _ScanEmitter(instr, flush_denormals).emit()
