# The direct convolution as a kernel generic in its geometry: the kernel library's
# convolution.
#
# The direct kernel of codegen/emit_conv.py is compiled per geometry: its sizes, strides,
# dilations and feature counts are constants, and LLVM spends 25-30 ms on each, more than
# XLA:CPU's whole compile of a small CNN (XLA calls Eigen's precompiled convolution, its
# shapes run-time arguments). The kernel here does the same arithmetic with the geometry
# read from a parameter block at run time, so one object per machine (jit/kernel_library.py)
# serves every convolution the direct path takes and a program needs no LLVM for them.
#
# It reads the input and writes the result where they lie, as emit_conv.py's kernel does
# (runtime/conv_thunk.py DirectConvThunk), through element strides read at run time:
#
#   x    x[n, h, w, c] at n*X0 + h*X1 + w*X2 + c*X3, h < H, w < W (the unpadded input)
#   out  out[n, i, j, o] at n*Y0 + i*Y1 + j*Y2 + o*Y3, its first Og features written
#
# with the kernel packed as [K0, K1, C, Wo] (output features padded with zeros to Wo, a
# multiple of V). Padding and base dilation are handled in the loops, no padded copy: a
# window row in padding or off the dilation grid is skipped (as emit_conv.py skips it); a
# tile whose columns all lie inside x without base dilation, features adjacent (the
# `interior` of an NHWC row) reads x at one base per position, its window columns and
# features as one reduction where they lie adjacent (no window dilation, X2 = C). Any
# other tile first stages the window rows it reads in a stack buffer, features adjacent,
# 0 where a column lies outside x or off the dilation grid (an NHWC row by masked vector
# loads, other layouts column by column), as emit_conv.py stages its edge tiles; a tile
# too large to stage (over STAGE_LIMIT floats) reads, per position and window column,
# either x or a zero through a zero stride. Every output element sums the same products in
# the same order as the per-shape kernel: the same bits. The padded-copy path
# (runtime/conv_thunk.py `_direct`, for inputs that are not f32) passes the padded buffer
# as x with no padding left.
#
# Loop order is the per-shape kernel's: the outer range counts tiles of R consecutive output
# positions of one output row (n, i), `tiles` per row; a tile keeps R x NV vector
# accumulators in registers through the reduction over (a, b, c), a ascending, then b, then c,
# one fused multiply-add per step. Output features run as blocks of NV vectors, then the
# vectors left as one smaller block (1 to NV - 1 of them, each size its own code); a vector
# past Og's last whole one is stored under a lane mask (features adjacent) or lane by lane.
# A row's last tile, when R does not divide the row, runs whole (its positions past the
# row read inside x or zeros) and stores only the positions inside the row. The menu has a
# kernel for each (R, NV) that emit_conv.DirectConv may choose (NV 1-4, R 1-8: the
# lowering asks DirectConv for its block and tile, so the library runs the same tiles but
# where DirectConv would run a short last tile: a dividing tile instead, `conv_kernel`);
# each is compiled on first use. Each output element is summed in one order by one tile,
# so any split of the range gives the same bits. The kernel is
#
#   void f(i8* noalias out, i8* noalias x, i8* noalias w, i64* noalias params,
#          i64 start, i64 end)
#
# with `params` the i64 block PARAMS names (`conv_params`); subnormals are flushed like the
# other kernels'.

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from xlapy.backends.cpu.codegen.common import F32, I1, I8, I32, I64, SYMBOL
from xlapy.backends.cpu.codegen.emit_gemv import splat as splat_scalar
from xlapy.backends.cpu.codegen.emitter import StandaloneKernelEmitter
from xlapy.backends.cpu.codegen.ir_release import released_text

PARAMS = (
    "o0", "o1", "k0", "k1", "c", "s0", "s1", "d0", "d1", "features", "width",
    "h", "w", "p0", "p1", "e0", "e1", "x0", "x1", "x2", "x3", "y0", "y1", "y2", "y3", "tiles",
)  # fmt: skip
"""The parameter block's i64 words, in order: output sizes, window sizes, input features,
strides, window dilations, output features Og, the packed kernel's width Wo, the input's
sizes H and W, low padding, base dilations, the input's element strides (batch, row, column,
feature), the result's, and tiles per output row."""

_MAX_TILE = 8  # emit_conv.DirectConv's largest R
_COPY_FEATURES = 16  # features of a staged column copied by memcpy / memset, at least
STAGE_LIMIT = 16384  # floats of the stack buffer an edge tile's input is staged in (64 KB)
_MAX_BLOCK = 4  # and NV
_MIN_ACCUMULATORS = 8  # emit_conv's: fewer accumulators leave the FMA units idle


@dataclass(frozen=True, slots=True)
class ConvKernel:
    """The library's direct convolution kernel (see the file comment)."""

    tile: int  # R: output positions per tile
    block: int  # NV: vectors of output features per block
    lanes: int  # V: f32 lanes of a vector register

    @property
    def name(self) -> str:
        """A short readable name (dumps, the library listing)."""
        return f"conv_f32_r{self.tile}_nv{self.block}"

    def description(self, flush_denormals: bool) -> str:
        """A text that determines the kernel's IR (with the sources: a cache key)."""
        return f"conv-library v2 {'ftz' if flush_denormals else 'ieee'} {self!r}"

    def width(self, features: int) -> int:
        """Wo: `features` output features padded to whole vectors."""
        return -(-features // self.lanes) * self.lanes


def _registers(lanes: int) -> int:
    return 32 if lanes >= 16 else 16


def menu(lanes: int) -> tuple[ConvKernel, ...]:
    """Every convolution kernel of the library for vector registers of `lanes` f32
    elements (16 lanes: 32 registers, AVX-512; else 16): each (R, NV) that
    emit_conv.DirectConv chooses (blocks of 1-4 vectors, tiles up to the most positions
    whose accumulators leave the kernel vectors and a broadcast free, at most 8)."""
    registers = _registers(lanes)
    return tuple(
        ConvKernel(r, nv, lanes)
        for nv in range(1, _MAX_BLOCK + 1)
        for r in range(1, max(1, min((registers - nv - 2) // nv, _MAX_TILE)) + 1)
    )


def conv_kernel(geometry: dict, lanes: int) -> ConvKernel:
    """The kernel of the menu for a direct geometry (runtime/conv_thunk.py
    `arena_geometry` or `direct_geometry`): the block and tile that emit_conv.DirectConv
    chooses for it, except where DirectConv would run a short last tile (a `heavy`
    kernel): then the widest tile that divides the row, if one keeps 8 accumulators."""
    from xlapy.backends.cpu.codegen.emit_conv import DirectConv

    conv = DirectConv(**geometry, vector=lanes, registers=_registers(lanes))
    if not conv.short:
        return ConvKernel(conv.tile, conv.block, lanes)
    # A `heavy` per-shape kernel runs a row's part-filled last tile as a copy of its own;
    # this one would run it whole: a tile that divides the row wastes nothing.
    nv, row = conv.block, geometry["outs"][1]
    fits = [r for r in range(conv.tile, 0, -1) if r * nv >= _MIN_ACCUMULATORS and row % r == 0]
    return ConvKernel(fits[0] if fits else conv.tile, nv, lanes)


def library_by_default(geometry: dict, lanes: int) -> bool:
    """Whether a direct geometry runs on the library's kernel when option `conv_library` is
    not given: where it is measured no slower than the kernel compiled per geometry (within
    2%, docs/cpu_backend.md), those where the per-geometry kernel would run a short last
    tile (`conv_kernel` takes a dividing tile there)."""
    from xlapy.backends.cpu.codegen.emit_conv import DirectConv

    return bool(DirectConv(**geometry, vector=lanes, registers=_registers(lanes)).short)


def conv_params(kernel: ConvKernel, geometry: dict) -> tuple[int, ...]:
    """The parameter block (PARAMS) of a direct geometry for `kernel`."""
    g = geometry
    tiles = -(-g["outs"][1] // kernel.tile)
    return (
        *g["outs"], *g["ksizes"], g["channels"], *g["strides"], *g["dilations"],
        g["features"], kernel.width(g["features"]), *g["sizes"], *g["pads"],
        *g["base_dilations"], *g["x_strides"], *g["out_strides"], tiles,
    )  # fmt: skip


def conv_extent(geometry: dict, kernel: ConvKernel) -> int:
    """The kernel's outer range: Nb x O0 x tiles per row."""
    return geometry["nb"] * geometry["outs"][0] * -(-geometry["outs"][1] // kernel.tile)


class _Emitter(StandaloneKernelEmitter):
    def __init__(self, kernel: ConvKernel, flush_denormals: bool):
        super().__init__(SYMBOL, flush_denormals)
        self.k = kernel
        v = kernel.lanes
        self.vty = ir.VectorType(F32, v)
        self.fma = ir.Function(
            self.module, ir.FunctionType(self.vty, [self.vty] * 3), f"llvm.fma.v{v}f32"
        )
        mask = ir.VectorType(I1, v)
        store = ir.FunctionType(ir.VoidType(), [self.vty, self.vty.as_pointer(), I32, mask])
        self.masked_store = ir.Function(self.module, store, f"llvm.masked.store.v{v}f32.p0")
        load = ir.FunctionType(self.vty, [self.vty.as_pointer(), I32, mask, self.vty])
        self.masked_load = ir.Function(self.module, load, f"llvm.masked.load.v{v}f32.p0")
        zero = ir.GlobalVariable(self.module, F32, "conv_zero")
        zero.global_constant, zero.linkage = True, "internal"
        zero.initializer = ir.Constant(F32, 0.0)
        self.zero = zero

    def c(self, v: int) -> ir.Constant:
        return ir.Constant(I64, v)

    def emit_ir(self) -> str:
        k, c = self.k, self.c
        fn, body = self.begin_function(["out", "x", "w", "params"], set())
        b = self.b
        self.out, self.x, self.w = (b.bitcast(a, F32.as_pointer()) for a in fn.args[:3])
        words = b.bitcast(fn.args[3], I64.as_pointer())
        self.p = {
            name: b.load(b.gep(words, [c(i)], True), name=name) for i, name in enumerate(PARAMS)
        }
        p = self.p
        self.accs = [self.alloca(self.vty, f"acc{i}") for i in range(k.tile * k.block)]
        self.spill = self.alloca(self.vty, "spill")  # a vector stored lane by lane
        # columns a tile reads: (R - 1) * s1 + (K1 - 1) * d1 + 1
        span = b.add(b.add(b.mul(c(k.tile - 1), p["s1"]), b.mul(b.sub(p["k1"], c(1)), p["d1"])),
                     c(1))  # fmt: skip
        plain = b.icmp_signed("==", p["e1"], c(1))
        adjacent = b.icmp_signed("==", p["x3"], c(1))
        self.stage_row = b.mul(span, p["c"])  # floats of one staged window row
        fits = b.icmp_signed("<=", b.mul(p["k0"], self.stage_row), c(STAGE_LIMIT))
        # room for a last staged row's vector past the limit (see _stage_row)
        stage = self.alloca_builder.alloca(ir.ArrayType(F32, STAGE_LIMIT + k.lanes), name="stage")
        stage.align = 64
        self.stage = self.alloca_builder.bitcast(stage, F32.as_pointer())
        # the unit's (n, i, t), counted along rather than divided out per tile
        where = [self.alloca(I64, name) for name in ("n", "i", "t")]
        first = b.udiv(fn.args[4], p["tiles"])
        for slot, value in zip(where, (b.udiv(first, p["o0"]), b.urem(first, p["o0"]),
                                       b.urem(fn.args[4], p["tiles"])), strict=True):  # fmt: skip
            b.store(value, slot)
        with self.loop(fn.args[4], fn.args[5], "tile"):
            n, i, t = (b.load(slot) for slot in where)
            self._count(where, n, i, t)
            j0 = b.mul(t, c(k.tile))
            col0 = b.sub(b.mul(j0, p["s1"]), p["p1"])  # the tile's first column (signed)
            inside = b.and_(b.icmp_signed(">=", col0, c(0)),
                            b.icmp_signed("<=", b.add(col0, span), p["w"]))  # fmt: skip
            with b.if_else(b.and_(b.and_(plain, adjacent), inside)) as (interior, edge):
                with interior:
                    self._tile(n, i, j0, col0, "interior")
                with edge, b.if_else(fits, likely=True) as (staged, large):
                    with staged:
                        self._stage(n, i, col0, span)
                        self._tile(n, i, j0, col0, "staged")
                    with large:
                        self._tile(n, i, j0, col0, "select")
        self.end_function(body)
        return released_text(self.module)

    def _window_row(self, ka, row, col0, staged: bool, lane0, nv: int, accs) -> None:
        """Window row `ka` of a tile reading x (at element `row`) or the staged copy:
        where its window columns are adjacent in memory (no window dilation, columns C
        apart) one reduction over (b, c) together, the same order as b then c; else one
        reduction over c per window column b."""
        k, b, c, p = self.k, self.b, self.c, self.p
        if staged:  # window row ka, column t - col0 (see _stage)
            start = b.gep(self.stage, [b.mul(ka, self.stage_row)], True)
            x2, origin = p["c"], col0
        else:
            start, x2, origin = b.gep(self.x, [row], True), p["x2"], c(0)
        step = b.mul(p["s1"], x2)  # between adjacent positions of the tile
        k_row = b.mul(p["c"], p["width"])  # kernel floats per window position
        k_first = b.add(b.mul(b.mul(ka, p["k1"]), k_row), lane0)
        ones = [c(1)] * k.tile
        joint = b.and_(b.icmp_signed("==", p["d1"], c(1)), b.icmp_signed("==", x2, p["c"]))
        with b.if_else(joint, likely=True) as (together, apart):
            with together:
                base = b.gep(start, [b.mul(b.sub(col0, origin), x2)], True)
                ptrs = [b.gep(base, [b.mul(c(pos), step)], True) for pos in range(k.tile)]
                self._reduce(ptrs, ones, k_first, nv, accs, b.mul(p["k1"], p["c"]))
            with apart, self.loop(c(0), p["k1"], "kb") as kb:
                k_at = b.add(k_first, b.mul(kb, k_row))
                tc = b.add(col0, b.mul(kb, p["d1"]))  # position 0's column (signed)
                base = b.gep(start, [b.mul(b.sub(tc, origin), x2)], True)
                ptrs = [b.gep(base, [b.mul(c(pos), step)], True) for pos in range(k.tile)]
                self._reduce(ptrs, ones, k_at, nv, accs, p["c"])

    def _count(self, where, n, i, t) -> None:
        """The next unit's (n, i, t) into `where`."""
        b, c, p = self.b, self.c, self.p
        t1 = b.add(t, c(1))
        wrap = b.icmp_unsigned("==", t1, p["tiles"])
        i1 = b.select(wrap, b.add(i, c(1)), i)
        down = b.icmp_unsigned("==", i1, p["o0"])
        b.store(b.select(down, b.add(n, c(1)), n), where[0])
        b.store(b.select(down, c(0), i1), where[1])
        b.store(b.select(wrap, c(0), t1), where[2])

    def _over(self, t, e):
        """`t` // `e` (t >= 0), no division where e is 1."""
        b, c = self.b, self.c
        one = b.icmp_unsigned("==", e, c(1))
        start = b.block
        with b.if_then(b.not_(one)):
            divided = b.udiv(t, e)
            end = b.block
        phi = b.phi(I64)
        phi.add_incoming(t, start)
        phi.add_incoming(divided, end)
        return phi

    def _tile(self, n, i, j0, col0, edge: str) -> None:
        """The tile's blocks of NV vectors, then the vectors left as one block of their
        number (each a code of its own). `edge`: "interior" (every read inside x, no base
        dilation, features adjacent), "staged" (reads the staged copy) or "select" (reads x
        or the zero per position, a tile too large to stage)."""
        k, b, c, p = self.k, self.b, self.c, self.p
        vectors = b.udiv(b.add(p["features"], c(k.lanes - 1)), c(k.lanes))
        blocks = b.udiv(vectors, c(k.block))
        with self.loop(c(0), blocks, "blk", unroll=1) as blk:
            self._block(n, i, j0, col0, edge, b.mul(blk, c(k.block)), k.block)
        rest = b.sub(vectors, b.mul(blocks, c(k.block)))
        for nv in range(1, k.block):
            with b.if_then(b.icmp_unsigned("==", rest, c(nv))):
                self._block(n, i, j0, col0, edge, b.mul(blocks, c(k.block)), nv)

    def _block(self, n, i, j0, col0, edge: str, first, nv: int) -> None:
        """Positions [j0, j0 + R), vectors [first, first + nv): the reduction over the
        window rows inside x, then the stores."""
        k, b, c, p = self.k, self.b, self.c, self.p
        zero = ir.Constant(self.vty, [0.0] * k.lanes)
        accs = [[self.accs[pos * k.block + q] for q in range(nv)] for pos in range(k.tile)]
        for row in accs:
            for acc in row:
                b.store(zero, acc)
        lane0 = b.mul(first, c(k.lanes))
        k_row = b.mul(p["c"], p["width"])  # kernel floats per window position
        top = b.mul(b.sub(p["h"], c(1)), p["e0"])  # the last padded row that reads x
        with self.loop(c(0), p["k0"], "ka") as ka:
            reads, row = self._x_row(n, i, ka, top)
            with b.if_then(reads):
                if edge == "select":
                    with self.loop(c(0), p["k1"], "kb") as kb:
                        k_at = b.add(b.mul(b.add(b.mul(ka, p["k1"]), kb), k_row), lane0)
                        ptrs, steps = self._edge_reads(row, b.add(col0, b.mul(kb, p["d1"])))
                        self._reduce(ptrs, steps, k_at, nv, accs, p["c"])
                else:
                    self._window_row(ka, row, col0, edge == "staged", lane0, nv, accs)
        self._store(n, i, j0, lane0, nv, accs)

    def _x_row(self, n, i, ka, top):
        """Window row `ka` of output row `i` (image `n`): whether it reads x (inside x, `top`
        the last padded row that does, and on the base dilation's grid), and where the x
        row it reads starts."""
        b, c, p = self.b, self.c, self.p
        t0 = b.sub(b.add(b.mul(i, p["s0"]), b.mul(ka, p["d0"])), p["p0"])
        inside = b.and_(b.icmp_signed(">=", t0, c(0)), b.icmp_signed("<=", t0, top))
        h = self._over(b.select(inside, t0, c(0)), p["e0"])
        on_grid = b.icmp_signed("==", b.mul(h, p["e0"]), t0)
        return b.and_(inside, on_grid), b.add(b.mul(n, p["x0"]), b.mul(h, p["x1"]))

    def _stage(self, n, i, col0, span) -> None:
        """Copy the input a tile reads to the stack buffer: window row ka (inside x) at
        ka * C * span, column col (from padded column `col0`) at col * C, features
        adjacent; 0 where a column lies outside x or off the base dilation's grid."""
        b, c, p = self.b, self.c, self.p
        top = b.mul(b.sub(p["h"], c(1)), p["e0"])
        dense = b.and_(b.and_(b.icmp_signed("==", p["e1"], c(1)),
                              b.icmp_signed("==", p["x3"], c(1))),
                       b.icmp_signed("==", p["x2"], p["c"]))  # fmt: skip
        with self.loop(c(0), p["k0"], "ska", unroll=1) as ka:
            reads, row = self._x_row(n, i, ka, top)
            with b.if_then(reads), b.if_else(dense, likely=True) as (whole, columns):
                with whole:
                    self._stage_row(ka, row, col0, span)
                with columns:
                    self._stage_columns(ka, row, col0, span)

    def _stage_row(self, ka, row, col0, span) -> None:
        """A staged window row whose columns are adjacent in x (features adjacent, C
        apart, no base dilation): one run of span x C floats, moved a vector at a time
        under a mask of the elements inside x (0 elsewhere)."""
        k, b, c, p = self.k, self.b, self.c, self.p
        v = k.lanes
        lo = b.mul(b.sub(c(0), col0), p["c"])  # the run's elements before x's row
        hi = b.mul(b.sub(p["w"], col0), p["c"])  # and from its end
        lanes = ir.VectorType(I64, v)
        ids = ir.Constant(lanes, list(range(v)))
        zeros = ir.Constant(ir.VectorType(I32, v), [0] * v)

        def splat(value):
            one = b.insert_element(ir.Constant(lanes, ir.Undefined), value, c(0))
            return b.shuffle_vector(one, one, zeros)

        src = b.gep(self.x, [b.add(row, b.mul(col0, p["c"]))])  # not inbounds: may lie outside
        dst = b.gep(self.stage, [b.mul(ka, self.stage_row)], True)
        vp = self.vty.as_pointer()
        with self.loop(c(0), self.stage_row, "sv", step=v, unroll=1, vectorize=False) as e:
            at = b.add(splat(e), ids)
            mask = b.and_(b.icmp_signed(">=", at, splat(lo)), b.icmp_signed("<", at, splat(hi)))
            ptr = b.bitcast(b.gep(src, [e]), vp)
            zero = ir.Constant(self.vty, [0.0] * v)
            value = b.call(self.masked_load, [ptr, ir.Constant(I32, 4), mask, zero])
            b.store(value, b.bitcast(b.gep(dst, [e], True), vp), align=4)

    def _stage_columns(self, ka, row, col0, span) -> None:
        """A staged window row of any other layout, column by column (see _stage)."""
        b, c, p = self.b, self.c, self.p
        i8p = I8.as_pointer()
        memcpy = self.module.declare_intrinsic("llvm.memcpy", [i8p, i8p, I64])
        memset = self.module.declare_intrinsic("llvm.memset", [i8p, I64])
        size = b.mul(p["c"], c(4))
        right = b.mul(b.sub(p["w"], c(1)), p["e1"])
        adjacent = b.icmp_signed("==", p["x3"], c(1))
        many = b.icmp_unsigned(">=", p["c"], c(_COPY_FEATURES))  # else a call costs more
        with self.loop(c(0), span, "scol", unroll=1) as col:
            t = b.add(col0, col)
            at = b.add(b.mul(ka, self.stage_row), b.mul(col, p["c"]))
            to = b.gep(self.stage, [at], True)
            inside = b.and_(b.icmp_signed(">=", t, c(0)), b.icmp_signed("<=", t, right))
            w = self._over(b.select(inside, t, c(0)), p["e1"])
            valid = b.and_(inside, b.icmp_signed("==", b.mul(w, p["e1"]), t))
            with b.if_else(valid) as (copy, zero):
                with copy:
                    src = b.gep(self.x, [b.add(row, b.mul(w, p["x2"]))], True)
                    with b.if_else(b.and_(adjacent, many), likely=True) as (whole, few):
                        with whole:
                            args = [b.bitcast(to, i8p), b.bitcast(src, i8p), size]
                            b.call(memcpy, [*args, ir.Constant(I1, 0)])
                        with few, self.loop(c(0), p["c"], "sch", unroll=1) as ch:
                            value = b.load(b.gep(src, [b.mul(ch, p["x3"])], True))
                            b.store(value, b.gep(to, [ch], True))
                with zero, b.if_else(many, likely=True) as (whole, few):
                    with whole:
                        args = [b.bitcast(to, i8p), ir.Constant(I8, 0), size]
                        b.call(memset, [*args, ir.Constant(I1, 0)])
                    with few, self.loop(c(0), p["c"], "sz", unroll=1) as ch:
                        b.store(ir.Constant(F32, 0.0), b.gep(to, [ch], True))

    def _edge_reads(self, row, tc) -> tuple[list, list]:
        """For each position of a tile too large to stage at window column `tc` (position
        0's padded column): (where its features start, their stride): in x, or the zero
        with stride 0 where the column lies outside x or off the base dilation's grid."""
        k, b, c, p = self.k, self.b, self.c, self.p
        right = b.mul(b.sub(p["w"], c(1)), p["e1"])  # the last padded column that reads x
        ptrs, steps = [], []
        for pos in range(k.tile):
            t = b.add(tc, b.mul(c(pos), p["s1"]))
            inside = b.and_(b.icmp_signed(">=", t, c(0)), b.icmp_signed("<=", t, right))
            col = b.udiv(b.select(inside, t, c(0)), p["e1"])
            valid = b.and_(inside, b.icmp_signed("==", b.mul(col, p["e1"]), t))
            at = b.gep(self.x, [b.add(row, b.mul(col, p["x2"]))], True)
            ptrs.append(b.select(valid, at, self.zero))
            steps.append(b.select(valid, p["x3"], c(0)))
        return ptrs, steps

    def _reduce(self, ptrs, steps, k_at, nv: int, accs, count) -> None:
        """The reduction over `count` steps (input features, or window columns and input
        features together), position `pos` reading step ci at ptrs[pos] + ci * steps[pos],
        the kernel's vectors at k_at + ci * Wo."""
        c = self.c
        with self.loop(c(0), count, "ci", unroll=1) as ci:  # a remainder costs a short one more
            self._step(ptrs, steps, k_at, nv, accs, ci)

    def _step(self, ptrs, steps, k_at, nv: int, accs, ci) -> None:
        """Input feature `ci`: R x nv fused multiply-adds."""
        k, b, c, p = self.k, self.b, self.c, self.p
        w_at = b.add(k_at, b.mul(ci, p["width"]))
        ws = []
        for q in range(nv):
            ptr = b.gep(self.w, [b.add(w_at, c(q * k.lanes))], True)
            ws.append(b.load(b.bitcast(ptr, self.vty.as_pointer()), align=4))
        for pos, (ptr, step) in enumerate(zip(ptrs, steps, strict=True)):
            s = b.load(b.gep(ptr, [b.mul(ci, step)], True))
            splat = splat_scalar(b, self.vty, k.lanes, s)
            for q in range(nv):
                acc = accs[pos][q]
                b.store(b.call(self.fma, [splat, ws[q], b.load(acc)]), acc)

    def _store(self, n, i, j0, lane0, nv: int, accs) -> None:
        """The block's results at the positions inside the row, features adjacent: vector
        q whole where Og reaches past it, else under a mask of its features below Og; else
        its lanes below Og one by one."""
        k, b, c, p = self.k, self.b, self.c, self.p
        row = b.add(b.mul(n, p["y0"]), b.mul(i, p["y1"]))
        vp = self.vty.as_pointer()
        adjacent = b.icmp_signed("==", p["y3"], c(1))
        ids = ir.Constant(ir.VectorType(I64, k.lanes), list(range(k.lanes)))
        vi64 = ir.VectorType(I64, k.lanes)
        zeros = ir.Constant(ir.VectorType(I32, k.lanes), [0] * k.lanes)
        for q in range(nv):
            lane = b.add(lane0, c(q * k.lanes))
            left = b.sub(p["features"], lane)  # features from here
            whole = b.icmp_signed(">=", left, c(k.lanes))
            splat = b.insert_element(ir.Constant(vi64, ir.Undefined), left, c(0))
            mask = b.icmp_signed("<", ids, b.shuffle_vector(splat, splat, zeros))
            for pos in range(len(accs)):
                j = b.add(j0, c(pos))
                with b.if_then(b.icmp_signed("<", j, p["o1"]), likely=True):
                    base = b.add(row, b.mul(j, p["y2"]))
                    value = b.load(accs[pos][q])
                    with b.if_else(adjacent, likely=True) as (vector, lanes):
                        with vector:
                            ptr = b.bitcast(b.gep(self.out, [b.add(base, lane)], True), vp)
                            with b.if_else(whole, likely=True) as (full, part):
                                with full:
                                    b.store(value, ptr, align=4)
                                with part:
                                    args = [value, ptr, ir.Constant(I32, 4), mask]
                                    b.call(self.masked_store, args)
                        with lanes:
                            b.store(value, self.spill)
                            self._store_lanes(base, lane, left)

    def _store_lanes(self, base, lane, left) -> None:
        """A vector past Og's last whole one, or a result whose features are not adjacent
        (in `spill`): the lanes below `left` one by one, each at its place."""
        k, b, c, p = self.k, self.b, self.c, self.p
        lanes = b.bitcast(self.spill, F32.as_pointer())
        count = b.select(b.icmp_signed("<", left, c(k.lanes)), left, c(k.lanes))
        with self.loop(c(0), count, "lane", unroll=1, vectorize=False) as q:
            at = b.add(base, b.mul(b.add(lane, q), p["y3"]))
            b.store(b.load(b.gep(lanes, [q], True)), b.gep(self.out, [at], True))


def emit_conv_kernel(kernel: ConvKernel, flush_denormals: bool = True) -> str:
    """The LLVM IR of the library's convolution kernel `kernel` (see the file comment)."""
    return _Emitter(kernel, flush_denormals).emit_ir()
