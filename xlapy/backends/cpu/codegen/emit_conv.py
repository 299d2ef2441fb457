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
# that lies in padding is skipped, and in a tile whose reads along the last dim are not all
# inside x, the positions outside read 0 (a select, on those tiles only). The library path
# that pads the input itself passes the padded buffer with no padding left to check.
#
# The kernel's outer range counts tiles of R consecutive output positions j of one output
# row (n, i); a tile holds R x NV vector accumulators (NV vectors of V output features) in
# registers through the whole reduction over (a, b, c): each step loads NV kernel vectors
# and R input scalars (broadcast) and does R x NV fused multiply-adds, so the loop is bound
# by the FMA units, not by loads (R x NV is chosen to fill the register file: 12
# accumulators with 16 registers, 24 with 32). Output features beyond NV x V run as further
# blocks over the same tile. Rows whose last tile is shorter than R run a copy of the body
# unrolled for the remainder. The loop over input features is unrolled by 2 (LLVM's own choice
# unrolled it fully in each of the 2-4 copies of the reduction, doubling the kernel's
# optimized IR and its compile time; see _UNROLL_ALL_CHANNELS). A result whose features are
# not adjacent (Y3 > 1: NCHW) is stored lane by lane. Each output element is summed by one
# tile in one fixed order (a, b, c ascending), so any split of the range over threads gives
# the same bits. The kernel is
#
#   void f(i8* noalias out, i8* noalias x, i8* noalias w, i64 start, i64 end)
#
# Subnormals are flushed like the other kernels' (flush_denormals).

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from xlapy.backends.cpu.codegen.common import F32, I32, I64, SYMBOL
from xlapy.backends.cpu.codegen.emitter import StandaloneKernelEmitter

# The reduction over input features is unrolled by 2 (LLVM's own choice unrolls it fully up to
# some 16 features, in every copy of the tile: 2-4 copies of 6 x 2 fused multiply-adds each),
# except over so few features that the whole loop is a handful of steps.
_UNROLL_ALL_CHANNELS = 4


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
    def tile(self) -> int:
        """R: output positions per tile."""
        return self._tile_for(self.block)

    @property
    def tiles_per_row(self) -> int:
        return -(-self.outs[1] // self.tile)

    @property
    def extent(self) -> int:
        return self.nb * self.outs[0] * self.tiles_per_row

    def description(self, flush_denormals: bool) -> str:
        """A text that determines the kernel's IR (a cache key)."""
        return f"direct conv v5 {'ftz' if flush_denormals else 'ieee'} {self!r}"


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

    def emit_ir(self) -> str:
        cv = self.conv
        fn, body = self.begin_function(["out", "x", "w"], set())
        b = self.b
        self.out, self.x, self.w = (b.bitcast(a, F32.as_pointer()) for a in fn.args[:3])
        c = lambda v: ir.Constant(I64, v)  # noqa: E731
        count = cv.block * cv.tile
        self.accs = [self.alloca(self.vty, f"acc{i}") for i in range(count)]
        rem = cv.outs[1] % cv.tile
        with self.loop(fn.args[3], fn.args[4], "tile") as unit:
            t = b.urem(unit, c(cv.tiles_per_row))
            row = b.udiv(unit, c(cv.tiles_per_row))
            i = b.urem(row, c(cv.outs[0]))
            n = b.udiv(row, c(cv.outs[0]))
            j0 = b.mul(t, c(cv.tile))
            if rem:
                last = b.icmp_unsigned("==", t, c(cv.tiles_per_row - 1))
                with b.if_else(last) as (short, full):
                    with short:
                        self._tile(n, i, j0, rem)
                    with full:
                        self._tile(n, i, j0, cv.tile)
            else:
                self._tile(n, i, j0, cv.tile)
        self.end_function(body)
        return str(self.module)

    def _tile(self, n, i, j0, r: int) -> None:
        """The blocks of a tile: those of whole vectors as a loop (the IR stays the same size
        however many output features there are), then the rest one by one."""
        cv, b = self.conv, self.b
        nv = cv.block
        looped = (cv.features // cv.vector) // nv
        start = 0
        if looped >= 2:
            with self.loop(ir.Constant(I64, 0), ir.Constant(I64, looped), "blk") as blk:
                self._block(n, i, j0, r, b.mul(blk, ir.Constant(I64, nv)), nv)
            start = looped * nv
        for first in range(start, cv.vectors, nv):
            self._block(n, i, j0, r, first, min(nv, cv.vectors - first))

    def _lane(self, first, q: int):
        """The lane of vector `first` + q: `first` a vector number, or an IR value of one
        (a looped block, whose vectors are all whole)."""
        lane = (first if isinstance(first, int) else 0) + q
        if isinstance(first, int):
            return ir.Constant(I64, lane * self.conv.vector)
        return self.b.mul(
            self.b.add(first, ir.Constant(I64, q)), ir.Constant(I64, self.conv.vector)
        )

    def _block(self, n, i, j0, r: int, first, nv: int) -> None:
        """Output positions [j0, j0 + r) of row (n, i), vectors [first, first + nv)
        (`first`: see _lane)."""
        cv, b = self.conv, self.b
        c = lambda v: ir.Constant(I64, v)  # noqa: E731
        zero = ir.Constant(self.vty, [0.0] * cv.vector)
        accs = [[self.accs[p * cv.block + q] for q in range(nv)] for p in range(r)]
        for row in accs:
            for acc in row:
                b.store(zero, acc)
        x1 = cv.x_strides[1]
        with self.loop(c(0), c(cv.ksizes[0]), "ka") as ka:
            t0 = b.sub(b.add(b.mul(i, c(cv.strides[0])), b.mul(ka, c(cv.dilations[0]))),
                       c(cv.pads[0]))  # fmt: skip
            if not cv.checked[0]:
                self._row(n, b.mul(t0, c(x1)), j0, ka, r, first, nv, accs)
            else:
                with b.if_then(self._inside(t0, 0)):
                    e = cv.base_dilations[0]
                    h = b.udiv(t0, c(e)) if e > 1 else t0
                    self._row(n, b.mul(h, c(x1)), j0, ka, r, first, nv, accs)
        self._store(n, i, j0, r, first, nv, accs)

    def _inside(self, t, dim: int):
        """Whether padded position `t` (signed) along spatial dim `dim` reads x."""
        cv, b = self.conv, self.b
        c = lambda v: ir.Constant(I64, v)  # noqa: E731
        e = cv.base_dilations[dim]
        inside = b.and_(b.icmp_signed(">=", t, c(0)),
                        b.icmp_signed("<=", t, c((cv.sizes[dim] - 1) * e)))  # fmt: skip
        if e > 1:
            on_grid = b.icmp_signed("==", b.srem(t, c(e)), c(0))
            inside = b.and_(inside, on_grid)
        return inside

    def _row(self, n, h_at, j0, ka, r: int, first, nv: int, accs) -> None:
        """The reduction over (b, c) of window row `ka`, which reads input row offset
        `h_at` (elements)."""
        cv, b = self.conv, self.b
        c = lambda v: ir.Constant(I64, v)  # noqa: E731
        x0, x2 = cv.x_strides[0], cv.x_strides[2]
        row_at = b.add(b.mul(n, c(x0)), h_at)
        wo = cv.kernel_width
        with self.loop(c(0), c(cv.ksizes[1]), "kb") as kb:
            k_at = b.add(b.mul(b.add(b.mul(ka, c(cv.ksizes[1])), kb), c(cv.channels * wo)),
                         self._lane(first, 0))  # fmt: skip
            t_kb = b.sub(b.mul(kb, c(cv.dilations[1])), c(cv.pads[1]))
            ts = [b.add(b.mul(b.add(j0, c(p)), c(cv.strides[1])), t_kb) for p in range(r)]
            if not cv.checked[1]:
                at = [b.add(row_at, b.mul(t, c(x2))) for t in ts]
                self._reduce(at, None, k_at, r, nv, accs)
            else:
                self._checked_reduce(ts, row_at, k_at, r, nv, accs)

    def _checked_reduce(self, ts, row_at, k_at, r: int, nv: int, accs) -> None:
        """_reduce at padded positions `ts` along the last spatial dim that may lie outside
        x: a tile whose positions all read x runs the plain reduction, others the one that
        reads 0 outside."""
        cv, b = self.conv, self.b
        c = lambda v: ir.Constant(I64, v)  # noqa: E731
        x2 = cv.x_strides[2]
        insides = [self._inside(t, 1) for t in ts]
        e = cv.base_dilations[1]
        at = []
        for t, inside in zip(ts, insides, strict=True):
            w_index = b.select(inside, t, c(0))
            if e > 1:
                w_index = b.udiv(w_index, c(e))
            at.append(b.add(row_at, b.mul(w_index, c(x2))))
        every = insides[0]
        for inside in insides[1:]:
            every = b.and_(every, inside)
        with b.if_else(every) as (whole, part):
            with whole:
                self._reduce(at, None, k_at, r, nv, accs)
            with part:
                self._reduce(at, insides, k_at, r, nv, accs)

    def _reduce(self, at, insides, k_at, r: int, nv: int, accs) -> None:
        """The reduction over input features c at input offsets `at` (one per output
        position of the tile); `insides`: whether each position reads x (else 0), or None
        when all do."""
        cv, b = self.conv, self.b
        c = lambda v: ir.Constant(I64, v)  # noqa: E731
        x3, wo = cv.x_strides[3], cv.kernel_width
        zero = ir.Constant(F32, 0.0)
        unroll = None if cv.channels <= _UNROLL_ALL_CHANNELS else 2
        with self.loop(c(0), c(cv.channels), "ci", unroll=unroll) as ci:
            w_at = b.add(k_at, b.mul(ci, c(wo)))
            ws = []
            for q in range(nv):
                ptr = b.gep(self.w, [b.add(w_at, c(q * cv.vector))], True)
                ws.append(b.load(b.bitcast(ptr, self.vty.as_pointer()), align=4))
            c_at = b.mul(ci, c(x3))
            for p in range(r):
                s = b.load(b.gep(self.x, [b.add(at[p], c_at)], True))
                if insides is not None:
                    s = b.select(insides[p], s, zero)
                splat = b.shuffle_vector(
                    b.insert_element(ir.Constant(self.vty, ir.Undefined), s, ir.Constant(I32, 0)),
                    ir.Constant(self.vty, ir.Undefined),
                    ir.Constant(ir.VectorType(I32, cv.vector), [0] * cv.vector),
                )
                for q in range(nv):
                    acc = accs[p][q]
                    b.store(b.call(self.fma, [splat, ws[q], b.load(acc)]), acc)

    def _store(self, n, i, j0, r: int, first, nv: int, accs) -> None:
        cv, b = self.conv, self.b
        c = lambda v: ir.Constant(I64, v)  # noqa: E731
        y0, y1, y2, y3 = cv.out_strides
        row = b.add(b.mul(n, c(y0)), b.mul(i, c(y1)))
        for p in range(r):
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
