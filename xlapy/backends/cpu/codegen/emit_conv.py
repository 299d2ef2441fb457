# A direct 2-D convolution kernel: no im2col, no BLAS, output channels in vector registers.
#
# The caller (runtime/conv_thunk.py, `_direct`) brings the convolution to the canonical form
# of conv_thunk's file comment with one group, in f32:
#
#   x    [Nb, P0, P1, C]     the input, already dilated and padded (row-major)
#   w    [K0, K1, C, Wo]     the kernel, output features padded with zeros to Wo, a multiple
#                            of the vector width V
#   out  [Nb, O0, O1, ldo]   the result: its first O features of each position are written
#
# and out[n, i, j, o] = sum over (a, b, c) of x[n, i*s0 + a*d0, j*s1 + b*d1, c] * w[a, b, c, o]
# (s: strides, d: window dilations). The kernel's outer range counts tiles of R consecutive
# output positions j of one output row (n, i); a tile holds R x NV vector accumulators (NV
# vectors of V output features) in registers through the whole reduction over (a, b, c):
# each step loads NV kernel vectors and R input scalars (broadcast) and does R x NV fused
# multiply-adds, so the loop is bound by the FMA units, not by loads (R x NV is chosen to
# fill the register file: 12 accumulators with 16 registers, 24 with 32). Output features
# beyond NV x V run as further blocks over the same tile. Rows whose last tile is shorter
# than R run a copy of the body unrolled for the remainder. Each output element is summed by
# one tile in one fixed order (a, b, c ascending), so any split of the range over threads
# gives the same bits. The kernel is
#
#   void f(i8* noalias out, i8* noalias x, i8* noalias w, i64 start, i64 end)
#
# Subnormals are flushed like the other kernels' (flush_denormals).

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from xlapy.backends.cpu.codegen.common import F32, I32, I64, SYMBOL
from xlapy.backends.cpu.codegen.emitter import StandaloneKernelEmitter


@dataclass(frozen=True, slots=True)
class DirectConv:
    """The geometry a direct convolution kernel is compiled for (see the file comment)."""

    nb: int
    padded: tuple[int, int]
    channels: int
    outs: tuple[int, int]
    ksizes: tuple[int, int]
    strides: tuple[int, int]
    dilations: tuple[int, int]
    features: int  # O: output features written per position
    ldo: int  # output elements between consecutive positions
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

    @property
    def block(self) -> int:
        """NV: vectors of output features per block."""
        return min(self.vectors, 4)

    @property
    def tile(self) -> int:
        """R: output positions per tile."""
        budget = self.registers - self.block - 2  # kernel vectors and a broadcast stay free
        return max(1, min(self.outs[1], budget // self.block, 8))

    @property
    def tiles_per_row(self) -> int:
        return -(-self.outs[1] // self.tile)

    @property
    def extent(self) -> int:
        return self.nb * self.outs[0] * self.tiles_per_row

    def description(self, flush_denormals: bool) -> str:
        """A text that determines the kernel's IR (a cache key)."""
        return f"direct conv v1 {'ftz' if flush_denormals else 'ieee'} {self!r}"


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
        cv = self.conv
        for first in range(0, cv.vectors, cv.block):
            self._block(n, i, j0, r, first, min(cv.block, cv.vectors - first))

    def _block(self, n, i, j0, r: int, first: int, nv: int) -> None:
        """Output positions [j0, j0 + r) of row (n, i), vectors [first, first + nv)."""
        cv, b = self.conv, self.b
        c = lambda v: ir.Constant(I64, v)  # noqa: E731
        zero = ir.Constant(self.vty, [0.0] * cv.vector)
        accs = [[self.accs[p * cv.block + q] for q in range(nv)] for p in range(r)]
        for row in accs:
            for acc in row:
                b.store(zero, acc)
        (p0, p1), ch, wo = cv.padded, cv.channels, cv.kernel_width
        with self.loop(c(0), c(cv.ksizes[0]), "ka") as ka:
            ih = b.add(b.mul(i, c(cv.strides[0])), b.mul(ka, c(cv.dilations[0])))
            x_row = b.mul(b.add(b.mul(n, c(p0)), ih), c(p1 * ch))
            with self.loop(c(0), c(cv.ksizes[1]), "kb") as kb:
                iw = b.add(b.mul(j0, c(cv.strides[1])), b.mul(kb, c(cv.dilations[1])))
                x_at = b.add(x_row, b.mul(iw, c(ch)))
                k_at = b.add(b.mul(b.add(b.mul(ka, c(cv.ksizes[1])), kb), c(ch * wo)),
                             c(first * cv.vector))  # fmt: skip
                with self.loop(c(0), c(ch), "ci") as ci:
                    w_at = b.add(k_at, b.mul(ci, c(wo)))
                    ws = []
                    for q in range(nv):
                        ptr = b.gep(self.w, [b.add(w_at, c(q * cv.vector))], True)
                        ws.append(b.load(b.bitcast(ptr, self.vty.as_pointer()), align=4))
                    xi = b.add(x_at, ci)
                    for p in range(r):
                        xp = b.gep(self.x, [b.add(xi, c(p * cv.strides[1] * ch))], True)
                        s = b.load(xp)
                        splat = b.shuffle_vector(
                            b.insert_element(ir.Constant(self.vty, ir.Undefined), s,
                                             ir.Constant(I32, 0)),
                            ir.Constant(self.vty, ir.Undefined),
                            ir.Constant(ir.VectorType(I32, cv.vector), [0] * cv.vector),
                        )  # fmt: skip
                        for q in range(nv):
                            acc = accs[p][q]
                            b.store(b.call(self.fma, [splat, ws[q], b.load(acc)]), acc)
        pos = b.add(b.mul(b.add(b.mul(n, c(cv.outs[0])), i), c(cv.outs[1])), j0)
        for p in range(r):
            base = b.mul(b.add(pos, c(p)), c(cv.ldo))
            for q in range(nv):
                lane0 = (first + q) * cv.vector
                value = b.load(accs[p][q])
                at = b.add(base, c(lane0))
                if lane0 + cv.vector <= cv.features:
                    ptr = b.bitcast(b.gep(self.out, [at], True), self.vty.as_pointer())
                    b.store(value, ptr, align=4)
                    continue
                for lane in range(cv.features - lane0):  # the last, partial vector
                    v = b.extract_element(value, ir.Constant(I32, lane))
                    b.store(v, b.gep(self.out, [b.add(at, c(lane))], True))


def emit_direct_conv(conv: DirectConv, flush_denormals: bool = True) -> str:
    """The LLVM IR of a direct convolution kernel for `conv` (see the file comment)."""
    return _ConvEmitter(conv, flush_denormals).emit_ir()
