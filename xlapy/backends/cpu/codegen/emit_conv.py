# A direct 2-D convolution kernel: no im2col, no BLAS, output channels in vector registers.
#
# The caller (runtime/conv_thunk.py) brings the kernel (the convolution's right operand) to
# the packed form [K0, K1, C, Wo]: window positions, input features, output features padded
# with zeros to Wo, a multiple of the vector width V, the window reversed where it says so.
# The input and the result are read and written where they lie, through element strides
# fixed at compile time (any dimension labels, any layout):
#
#   x    x[n, h, w, c] at n*X0 + h*X1 + w*X2 + c*X3, h < H, w < W (the unpadded input)
#   out  out[n, i, j, o] at n*Y0 + i*Y1 + j*Y2 + o*Y3, its first O features written
#
# and out[n, i, j, o] = sum over (a, b, c) of xp[n, i*s0 + a*d0, j*s1 + b*d1, c] * w[a, b, c, o]
# (s: strides, d: window dilations), where xp is x dilated by the base dilation and padded
# (xp[n, t0, t1, c] = x[n, (t0 - p0) / e0, (t1 - p1) / e1, c] where that divides and lies
# inside x, else 0). A dim with padding or base dilation checks its reads: a window row
# that lies in padding is skipped. The library path that pads the input itself passes the
# padded buffer with no padding left to check.
#
# The kernel's outer range counts tiles of R consecutive output positions j of one output
# row (n, i); a tile holds R x NV vector accumulators (NV vectors of V output features) in
# registers through the whole reduction over (a, b, c): each step loads NV kernel vectors
# and R input scalars (broadcast) and does R x NV fused multiply-adds, so the loop is bound
# by the FMA units, not by loads (R x NV is chosen to fill the register file: 12
# accumulators with 16 registers, 24 with 32; a smaller R that divides the output row where
# one keeps 8 or more, see `tile`). Output features beyond NV x V run as further blocks over
# the same tile.
#
# The reduction is emitted once (its compile time is the kernel's: LLVM's loop strength
# reduction and instruction combining grow faster than the code). Its base pointer is one
# value per window row and its displacements constants, so it reads x directly or a copy:
# a tile whose reads along the last dim leave x (padding, base dilation, the part-filled
# last tile of a row) first stages the input it reads (every window row, `span` columns
# from its first, 0 outside x) in a stack buffer laid out with x's column stride (Staging:
# adjacent features copied a column at a time, adjacent columns by masked vector loads,
# else element by element), then runs the same reduction on it. The tiles that read x
# directly are a range of each row (`inner_tiles`), fixed at compile time. A part-filled
# last tile runs whole and stores only its positions inside the row, except in a `heavy`
# kernel (the packed kernel larger than L1, streamed once per tile), which keeps a copy of
# the reduction for that tile's positions. The loop over input features is unrolled by 2
# (LLVM's own choice unrolled it fully, doubling the kernel's optimized IR and its compile
# time; see _UNROLL_ALL_CHANNELS). A result whose features are not adjacent (Y3 > 1: NCHW)
# is stored lane by lane. Each output element is summed by one tile in one fixed order (a,
# b, c ascending), so any split of the range over threads gives the same bits. LLVM
# optimizes it with the JIT's light pipeline (jit/engine.py: O3 made the same inner loop at
# two to three times the cost). The kernel is
#
#   void f(i8* noalias out, i8* noalias x, i8* noalias w, i64 start, i64 end)
#
# Subnormals are flushed like the other kernels' (flush_denormals).

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from llvmlite import ir

from xlapy.backends.cpu.codegen.common import F32, I1, I8, I32, I64, SYMBOL
from xlapy.backends.cpu.codegen.emit_gemv import splat as splat_scalar
from xlapy.backends.cpu.codegen.emitter import StandaloneKernelEmitter
from xlapy.backends.cpu.codegen.ir_release import released_text

# The reduction over input features is unrolled by 2 (LLVM's own choice unrolls it fully up to
# some 16 features), except over so few features that the whole loop is a handful of steps.
_UNROLL_ALL_CHANNELS = 4

# A tile keeps at least this many accumulators when it is narrowed to divide the output row
# (FMA latency x FMA units: fewer leave the units idle).
_MIN_ACCUMULATORS = 8
_L1_BYTES = 32 << 10  # a packed kernel larger than this is `heavy`


@dataclass(frozen=True, slots=True)
class DirectConv:
    """The geometry a direct convolution kernel is compiled for (see the file comment)."""

    nb: int
    sizes: tuple[int, int]  # H, W: the input's spatial sizes as the kernel reads them
    pads: tuple[int, int]  # p0, p1: low padding (negative crops)
    base_dilations: tuple[int, int]  # e0, e1
    checked: tuple[bool, bool]  # whether reads along each spatial dim may leave x
    channels: int
    outs: tuple[int, int]
    ksizes: tuple[int, int]
    strides: tuple[int, int]
    dilations: tuple[int, int]
    features: int  # O: output features written per position
    x_strides: tuple[int, int, int, int]  # X0..X3, elements
    out_strides: tuple[int, int, int, int]  # Y0..Y3, elements
    vector: int  # V: f32 lanes of a vector register (8 with AVX2, 16 with AVX-512)
    registers: int  # vector registers of the target (16 or 32)

    @property
    def vectors(self) -> int:
        """Vectors of output features (the padded kernel's Wo / V)."""
        return -(-self.features // self.vector)

    @property
    def kernel_width(self) -> int:
        """Wo: the kernel's output features padded to whole vectors."""
        return self.vectors * self.vector

    def _tile_for(self, nv: int) -> int:
        budget = self.registers - nv - 2  # kernel vectors and a broadcast stay free
        return max(1, min(self.outs[1], budget // nv, 8))

    @property
    def block(self) -> int:
        """NV: vectors of output features per block, the one whose tiles do the most
        multiply-adds per load (a block of R positions and NV vectors: R x NV of them for
        R + NV loads; all blocks of a tile counted; ties: more positions per tile)."""
        choices = range(1, min(self.vectors, 4) + 1)

        def merit(nv: int) -> tuple[float, int]:
            r, blocks = self._tile_for(nv), -(-self.vectors // nv)
            return r * self.vectors / (blocks * r + self.vectors), r

        return max(choices, key=merit)

    @property
    def heavy(self) -> bool:
        """Whether the packed kernel outgrows the L1 cache (_L1_BYTES): every tile streams
        all of it, so fewer, wider tiles pay more than tiles that divide the row."""
        size = self.ksizes[0] * self.ksizes[1] * self.channels * self.kernel_width * 4
        return size > _L1_BYTES

    @property
    def tile(self) -> int:
        """R: output positions per tile: the most the register file holds (_tile_for), or,
        for a kernel that is not `heavy`, the largest smaller count that divides the output
        row while keeping at least _MIN_ACCUMULATORS accumulators."""
        nv = self.block
        most = self._tile_for(nv)
        if self.outs[1] % most == 0 or self.heavy:
            return most
        for r in range(most - 1, 0, -1):
            if r * nv < _MIN_ACCUMULATORS:
                break
            if self.outs[1] % r == 0:
                return r
        return most

    @property
    def short(self) -> int:
        """Positions of a row's last tile where a copy of the tile runs just them (a `heavy`
        kernel whose R does not divide the row), else 0: a last tile that is not full then
        runs whole and stores only its positions inside the row."""
        return self.outs[1] % self.tile if self.heavy else 0

    @property
    def tiles_per_row(self) -> int:
        return -(-self.outs[1] // self.tile)

    @property
    def extent(self) -> int:
        return self.nb * self.outs[0] * self.tiles_per_row

    def span(self, positions: int) -> int:
        """Input columns a tile of `positions` reads: (R - 1) * s1 + (K1 - 1) * d1 + 1."""
        return (positions - 1) * self.strides[1] + (self.ksizes[1] - 1) * self.dilations[1] + 1

    @property
    def inner_tiles(self) -> tuple[int, int]:
        """[lo, hi): the tiles of a row that read x directly, those whose reads along the
        last spatial dim all lie inside x, without base dilation (an empty range when none
        do); the others read a staged copy."""
        r, s, count = self.tile, self.strides[1], self.tiles_per_row
        spans = [self.span(r)] * (count - 1) + [self.span(self.short or r)]
        inner = [
            t
            for t in range(count)
            if self.base_dilations[1] == 1
            and t * r * s - self.pads[1] >= 0
            and t * r * s - self.pads[1] + spans[t] <= self.sizes[1]
        ]
        assert inner == list(range(inner[0], inner[-1] + 1)) if inner else True
        return (inner[0], inner[-1] + 1) if inner else (0, 0)

    @property
    def staging(self) -> Staging | None:
        """How tiles that do not read x directly stage their input, or None when every tile
        reads x directly."""
        if self.inner_tiles == (0, self.tiles_per_row):
            return None
        span, x2, x3 = self.span(self.tile), self.x_strides[2], self.x_strides[3]
        if x3 == 1 and x2 >= self.channels:
            return Staging("features", 1, span * x2, self.ksizes[0] * span * x2)
        if x2 == 1 and self.base_dilations[1] == 1:
            feature = -(-span // self.vector) * self.vector
            row = self.channels * feature
            return Staging("columns", feature, row, self.ksizes[0] * row)
        row = self.channels * span * x2
        return Staging("scalars", span * x2, row, self.ksizes[0] * row)

    @property
    def fits(self) -> bool:
        """Whether the staging buffer (if any) fits the stack budget, STAGE_LIMIT floats."""
        staging = self.staging
        return staging is None or staging.floats <= STAGE_LIMIT

    def description(self, flush_denormals: bool) -> str:
        """A text that determines the kernel's IR (a cache key)."""
        return f"direct conv v6 {'ftz' if flush_denormals else 'ieee'} {self!r}"


STAGE_LIMIT = 16384
"""Floats of the stack buffer a kernel may stage its edge tiles' input in (64 KB)."""


@dataclass(frozen=True, slots=True)
class Staging:
    """The stack buffer an edge tile's input is copied to: window row ka at ka * row,
    column col (from the tile's first) at col * X2 (as in x, so the reduction reads it at
    the same offsets), feature ci at ci * feature; `mode` says how the copy runs
    ("features": a copy of C adjacent floats per column; "columns": masked vector loads of
    a feature's adjacent columns; "scalars": element by element)."""

    mode: str
    feature: int
    row: int
    floats: int


def vector_shape(features: str) -> tuple[int, int]:
    """(f32 lanes, vector registers) for an LLVM target feature string."""
    if "+avx512f" in features.split(","):
        return 16, 32
    if "+avx" in features.split(","):
        return 8, 16
    return 4, 16


class _ConvEmitter(StandaloneKernelEmitter):
    def __init__(self, conv: DirectConv, flush_denormals: bool):
        super().__init__(SYMBOL, flush_denormals)
        self.conv = conv
        self.vty = ir.VectorType(F32, conv.vector)
        fma_type = ir.FunctionType(self.vty, [self.vty] * 3)
        self.fma = ir.Function(self.module, fma_type, f"llvm.fma.v{conv.vector}f32")

    def c(self, v: int) -> ir.Constant:
        return ir.Constant(I64, v)

    def emit_ir(self) -> str:
        cv, c = self.conv, self.c
        fn, body = self.begin_function(["out", "x", "w"], set())
        b = self.b
        self.out, self.x, self.w = (b.bitcast(a, F32.as_pointer()) for a in fn.args[:3])
        count = cv.block * cv.tile
        self.accs = [self.alloca(self.vty, f"acc{i}") for i in range(count)]
        staging = cv.staging
        if staging is not None:
            buf = self.alloca_builder.alloca(ir.ArrayType(F32, staging.floats), name="stage")
            buf.align = 32
            self.stage = self.alloca_builder.bitcast(buf, F32.as_pointer())
        lo, hi = cv.inner_tiles
        with self.loop(fn.args[3], fn.args[4], "tile") as unit:
            t = b.urem(unit, c(cv.tiles_per_row))
            row = b.udiv(unit, c(cv.tiles_per_row))
            i = b.urem(row, c(cv.outs[0]))
            n = b.udiv(row, c(cv.outs[0]))
            j0 = b.mul(t, c(cv.tile))
            col0 = b.sub(b.mul(j0, c(cv.strides[1])), c(cv.pads[1]))
            edge: ir.Value | bool = False  # whether the tile reads the staged copy
            if staging is not None and lo >= hi:
                edge = True
                self._stage(n, i, col0)
            elif staging is not None:
                edge = b.or_(b.icmp_unsigned("<", t, c(lo)), b.icmp_unsigned(">=", t, c(hi)))
                with b.if_then(edge):
                    self._stage(n, i, col0)
            last = None
            if cv.outs[1] % cv.tile:
                last = b.icmp_unsigned("==", t, c(cv.tiles_per_row - 1))
            if cv.short:
                with b.if_else(last) as (short, whole):
                    with short:
                        self._tile(n, i, j0, col0, edge, cv.short, None)
                    with whole:
                        self._tile(n, i, j0, col0, edge, cv.tile, None)
            else:
                self._tile(n, i, j0, col0, edge, cv.tile, last)
        self.end_function(body)
        return released_text(self.module)

    # -- staging the input of a tile that reads outside x (see the file comment) -----------
    def _stage(self, n, i, col0) -> None:
        """Copy the input a tile reads (window rows inside x; `span` columns from padded
        column `col0`) to the stack buffer in its layout, 0 where a column lies outside x."""
        cv, b, c = self.conv, self.b, self.c
        staging = cv.staging
        assert staging is not None
        x0, x1 = cv.x_strides[0], cv.x_strides[1]
        masks = self._column_masks(col0) if staging.mode == "columns" else None
        with self.loop(c(0), c(cv.ksizes[0]), "ska", unroll=1) as ka:
            t0 = b.sub(b.add(b.mul(i, c(cv.strides[0])), b.mul(ka, c(cv.dilations[0]))),
                       c(cv.pads[0]))  # fmt: skip
            inside = self._inside(t0, 0) if cv.checked[0] else None
            with self._maybe(inside):
                e = cv.base_dilations[0]
                h = b.udiv(t0, c(e)) if e > 1 else t0
                src = b.add(b.mul(n, c(x0)), b.mul(h, c(x1)))
                dst = b.mul(ka, c(staging.row))
                if staging.mode == "features":
                    self._stage_features(src, dst, col0)
                elif staging.mode == "columns":
                    self._stage_columns(src, dst, col0, masks)
                else:
                    self._stage_scalars(src, dst, col0)

    def _maybe(self, cond):
        """`with b.if_then(cond)`, or no condition when `cond` is None."""
        return self.b.if_then(cond) if cond is not None else contextlib.nullcontext()

    def _stage_features(self, src, dst, col0) -> None:
        """Features adjacent in x (X3 = 1): one copy (or zero fill) of C floats a column."""
        cv, b, c = self.conv, self.b, self.c
        x2, size = cv.x_strides[2], c(4 * cv.channels)
        i8p = I8.as_pointer()
        memcpy = self.module.declare_intrinsic("llvm.memcpy", [i8p, i8p, I64])
        memset = self.module.declare_intrinsic("llvm.memset", [i8p, I64])
        with self.loop(c(0), c(cv.span(cv.tile)), "scol", unroll=1) as col:
            t = b.add(col0, col)
            to = b.bitcast(b.gep(self.stage, [b.add(dst, b.mul(col, c(x2)))], True), i8p)
            with b.if_else(self._inside(t, 1)) as (inside, outside):
                with inside:
                    e = cv.base_dilations[1]
                    w = b.udiv(t, c(e)) if e > 1 else t
                    at = b.gep(self.x, [b.add(src, b.mul(w, c(x2)))], True)
                    b.call(memcpy, [to, b.bitcast(at, i8p), size, ir.Constant(I1, 0)])
                with outside:
                    b.call(memset, [to, ir.Constant(I8, 0), size, ir.Constant(I1, 0)])

    def _column_masks(self, col0) -> list:
        """Per vector of staged columns: which lanes' columns lie inside x (X2 = 1, no base
        dilation)."""
        cv, b = self.conv, self.b
        v = cv.vector
        lanes = ir.VectorType(I64, v)
        at = b.insert_element(ir.Constant(lanes, ir.Undefined), col0, ir.Constant(I32, 0))
        at = b.shuffle_vector(at, ir.Constant(lanes, ir.Undefined),
                              ir.Constant(ir.VectorType(I32, v), [0] * v))  # fmt: skip
        masks = []
        for k in range(-(-cv.span(cv.tile) // v)):
            cols = b.add(at, ir.Constant(lanes, [k * v + q for q in range(v)]))
            low = b.icmp_signed(">=", cols, ir.Constant(lanes, [0] * v))
            high = b.icmp_signed("<", cols, ir.Constant(lanes, [cv.sizes[1]] * v))
            masks.append(b.and_(low, high))
        return masks

    def _stage_columns(self, src, dst, col0, masks) -> None:
        """Columns adjacent in x (X2 = 1): per feature, masked vector loads of the span."""
        cv, b, c = self.conv, self.b, self.c
        staging = cv.staging
        assert staging is not None
        v = cv.vector
        vp = self.vty.as_pointer()
        mask_type = ir.VectorType(I1, v)
        load_type = ir.FunctionType(self.vty, [vp, I32, mask_type, self.vty])
        load = ir.Function(self.module, load_type, f"llvm.masked.load.v{v}f32.p0")
        zero = ir.Constant(self.vty, [0.0] * v)
        first = b.add(src, col0)
        with self.loop(c(0), c(cv.channels), "sch", unroll=1) as ch:
            at = b.add(first, b.mul(ch, c(cv.x_strides[3])))
            to = b.add(dst, b.mul(ch, c(staging.feature)))
            for k, mask in enumerate(masks):
                ptr = b.bitcast(b.gep(self.x, [b.add(at, c(k * v))]), vp)  # not inbounds
                value = b.call(load, [ptr, ir.Constant(I32, 4), mask, zero])
                out = b.bitcast(b.gep(self.stage, [b.add(to, c(k * v))], True), vp)
                b.store(value, out, align=4)

    def _stage_scalars(self, src, dst, col0) -> None:
        """Any other layout or base dilation: element by element."""
        cv, b, c = self.conv, self.b, self.c
        staging = cv.staging
        assert staging is not None
        x2, x3, e = cv.x_strides[2], cv.x_strides[3], cv.base_dilations[1]
        with self.loop(c(0), c(cv.channels), "sch", unroll=1) as ch:
            from_ch = b.add(src, b.mul(ch, c(x3)))
            to_ch = b.add(dst, b.mul(ch, c(staging.feature)))
            with self.loop(c(0), c(cv.span(cv.tile)), "scol", unroll=1) as col:
                t = b.add(col0, col)
                inside = self._inside(t, 1)
                w = b.select(inside, t, c(0))
                if e > 1:
                    w = b.udiv(w, c(e))
                s = b.load(b.gep(self.x, [b.add(from_ch, b.mul(w, c(x2)))], True))
                s = b.select(inside, s, ir.Constant(F32, 0.0))
                b.store(s, b.gep(self.stage, [b.add(to_ch, b.mul(col, c(x2)))], True))

    # -- the tile ------------------------------------------------------------------------
    def _tile(self, n, i, j0, col0, edge, r: int, last) -> None:
        """The blocks of a tile of `r` positions: those of whole vectors as a loop (the IR
        stays the same size however many output features there are), then the rest one by
        one; `last`: whether this is a row's last tile, whose positions past the row are
        not stored (None: all are)."""
        cv, b = self.conv, self.b
        nv = cv.block
        looped = (cv.features // cv.vector) // nv
        start = 0
        args = (n, i, j0, col0, edge, r, last)
        if looped >= 2:
            with self.loop(self.c(0), self.c(looped), "blk") as blk:
                self._block(*args, b.mul(blk, self.c(nv)), nv)
            start = looped * nv
        for first in range(start, cv.vectors, nv):
            self._block(*args, first, min(nv, cv.vectors - first))

    def _lane(self, first, q: int):
        """The lane of vector `first` + q: `first` a vector number, or an IR value of one
        (a looped block, whose vectors are all whole)."""
        lane = (first if isinstance(first, int) else 0) + q
        if isinstance(first, int):
            return ir.Constant(I64, lane * self.conv.vector)
        return self.b.mul(
            self.b.add(first, ir.Constant(I64, q)), ir.Constant(I64, self.conv.vector)
        )

    def _block(self, n, i, j0, col0, edge, r: int, last, first, nv: int) -> None:
        """Output positions [j0, j0 + r) of row (n, i), vectors [first, first + nv)
        (`first`: see _lane); the tile reads the staged copy where `edge`."""
        cv, b, c = self.conv, self.b, self.c
        zero = ir.Constant(self.vty, [0.0] * cv.vector)
        accs = [[self.accs[p * cv.block + q] for q in range(nv)] for p in range(r)]
        for row in accs:
            for acc in row:
                b.store(zero, acc)
        x0, x1, x2, x3 = cv.x_strides
        staging = cv.staging
        with self.loop(c(0), c(cv.ksizes[0]), "ka") as ka:
            t0 = b.sub(b.add(b.mul(i, c(cv.strides[0])), b.mul(ka, c(cv.dilations[0]))),
                       c(cv.pads[0]))  # fmt: skip
            with self._maybe(self._inside(t0, 0) if cv.checked[0] else None):
                step = c(x3)
                if edge is not True:
                    e = cv.base_dilations[0]
                    h = b.udiv(t0, c(e)) if e > 1 else t0
                    at = b.add(b.add(b.mul(n, c(x0)), b.mul(h, c(x1))), b.mul(col0, c(x2)))
                    base = b.gep(self.x, [at])  # not inbounds: an edge tile's may lie outside
                if edge is not False:
                    assert staging is not None
                    staged = b.gep(self.stage, [b.mul(ka, c(staging.row))], True)
                    if edge is True:
                        base, step = staged, c(staging.feature)
                    else:
                        base = b.select(edge, staged, base)
                        step = b.select(edge, c(staging.feature), c(x3))
                self._row(base, step, ka, first, nv, accs)
        self._store(n, i, j0, last, first, nv, accs)

    def _inside(self, t, dim: int):
        """Whether padded position `t` (signed) along spatial dim `dim` reads x."""
        cv, b, c = self.conv, self.b, self.c
        e = cv.base_dilations[dim]
        inside = b.and_(b.icmp_signed(">=", t, c(0)),
                        b.icmp_signed("<=", t, c((cv.sizes[dim] - 1) * e)))  # fmt: skip
        if e > 1:
            on_grid = b.icmp_signed("==", b.srem(t, c(e)), c(0))
            inside = b.and_(inside, on_grid)
        return inside

    def _row(self, base, step, ka, first, nv: int, accs) -> None:
        """The reduction over (b, c) of window row `ka`: position p of the tile at window
        column kb reads column p * s1 + kb * d1 of the row at `base`, feature ci at
        ci * `step` (an int for X3, or a value)."""
        cv, b, c = self.conv, self.b, self.c
        x2, wo = cv.x_strides[2], cv.kernel_width
        with self.loop(c(0), c(cv.ksizes[1]), "kb") as kb:
            k_at = b.add(b.mul(b.add(b.mul(ka, c(cv.ksizes[1])), kb), c(cv.channels * wo)),
                         self._lane(first, 0))  # fmt: skip
            col = b.mul(kb, c(cv.dilations[1] * x2))
            at = [b.add(col, c(p * cv.strides[1] * x2)) for p in range(len(accs))]
            self._reduce(base, step, at, k_at, nv, accs)

    def _reduce(self, base, step, at, k_at, nv: int, accs) -> None:
        """The reduction over input features at offsets `at` from `base` (one per output
        position of the tile)."""
        cv, b, c = self.conv, self.b, self.c
        wo = cv.kernel_width
        unroll = None if cv.channels <= _UNROLL_ALL_CHANNELS else 2
        with self.loop(c(0), c(cv.channels), "ci", unroll=unroll) as ci:
            w_at = b.add(k_at, b.mul(ci, c(wo)))
            ws = []
            for q in range(nv):
                ptr = b.gep(self.w, [b.add(w_at, c(q * cv.vector))], True)
                ws.append(b.load(b.bitcast(ptr, self.vty.as_pointer()), align=4))
            c_at = b.mul(ci, step)
            for p, offset in enumerate(at):
                s = b.load(b.gep(base, [b.add(offset, c_at)], True))
                splat = splat_scalar(b, self.vty, cv.vector, s)
                for q in range(nv):
                    acc = accs[p][q]
                    b.store(b.call(self.fma, [splat, ws[q], b.load(acc)]), acc)

    def _store(self, n, i, j0, last, first, nv: int, accs) -> None:
        """The tile's results: where `last`, positions past the row's end are not stored."""
        cv, b = self.conv, self.b
        if last is None:
            self._store_positions(n, i, j0, range(len(accs)), first, nv, accs)
            return
        rem = cv.outs[1] % cv.tile
        self._store_positions(n, i, j0, range(rem), first, nv, accs)
        with b.if_then(b.not_(last)):
            self._store_positions(n, i, j0, range(rem, len(accs)), first, nv, accs)

    def _store_positions(self, n, i, j0, positions, first, nv: int, accs) -> None:
        cv, b, c = self.conv, self.b, self.c
        y0, y1, y2, y3 = cv.out_strides
        row = b.add(b.mul(n, c(y0)), b.mul(i, c(y1)))
        for p in positions:
            base = b.add(row, b.mul(b.add(j0, c(p)), c(y2)))
            for q in range(nv):
                lane0 = self._lane(first, q)
                value = b.load(accs[p][q])
                whole = not isinstance(first, int) or (first + q + 1) * cv.vector <= cv.features
                if y3 == 1 and whole:
                    ptr = b.gep(self.out, [b.add(base, lane0)], True)
                    b.store(value, b.bitcast(ptr, self.vty.as_pointer()), align=4)
                    continue
                lanes = cv.vector
                if isinstance(first, int):
                    lanes = min(lanes, cv.features - (first + q) * cv.vector)
                for lane in range(lanes):  # lane by lane
                    v = b.extract_element(value, ir.Constant(I32, lane))
                    at = b.add(base, b.mul(b.add(lane0, c(lane)), c(y3)))
                    b.store(v, b.gep(self.out, [at], True))


def emit_direct_conv(conv: DirectConv, flush_denormals: bool = True) -> str:
    """The LLVM IR of a direct convolution kernel for `conv` (see the file comment)."""
    return _ConvEmitter(conv, flush_denormals).emit_ir()
