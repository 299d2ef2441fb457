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
# It runs on the form the direct path's padded copy gives (runtime/conv_thunk.py `_direct`):
# the input padded and dilated, row-major [Nb, P0, P1, C] up to its strides X0, X1, X2
# (features adjacent), the kernel packed as [K0, K1, C, Wo] (output features padded with
# zeros to Wo, a multiple of V), the result [Nb, O0, O1, Og] at strides Y0, Y1, Y2 (features
# adjacent). No read leaves the padded input, so nothing is staged or checked.
#
# Loop order is the per-shape kernel's: the outer range counts tiles of R consecutive output
# positions of one output row (n, i), `tiles` per row; a tile keeps R x NV vector
# accumulators in registers through the reduction over (a, b, c), a ascending, then b, then c,
# one fused multiply-add per step: every output element is summed in the same order as the
# per-shape kernel sums it, so on the same padded input the results are the same bits (the
# per-shape kernel on the arena skips window rows in padding where this one adds 0 * w:
# the same bits for finite kernels, up to the sign of an all-zero sum). Output features run
# as blocks of NV vectors, then the vectors left one at a time, a vector past Og's last
# whole one stored under a lane mask; when R does not divide O1, a row's last tile moves
# back to end with the row, computing again some of the positions of the tile before it
# (the same sums in the same order: the same bits, stored twice), and a row shorter than R
# runs its positions one at a time (no read past the row's last window). The menu has kernels
# for NV = 1, 2 and 4, R the most positions the register file holds for each; the lowering
# picks one by the per-shape kernel's rule (`conv_kernel`). Each output element is summed
# in that one order by whichever tile computes it, so any split of the range gives the
# same bits. The kernel is
#
#   void f(i8* noalias out, i8* noalias x, i8* noalias w, i64* noalias params,
#          i64 start, i64 end)
#
# with `params` the i64 block PARAMS names (`conv_params`); subnormals are flushed like the
# other kernels'.

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from xlapy.backends.cpu.codegen.common import F32, I1, I32, I64, SYMBOL
from xlapy.backends.cpu.codegen.emit_gemv import splat as splat_scalar
from xlapy.backends.cpu.codegen.emitter import StandaloneKernelEmitter

PARAMS = (
    "o0", "o1", "k0", "k1", "c", "s0", "s1", "d0", "d1", "features", "width",
    "x0", "x1", "x2", "y0", "y1", "y2", "tiles",
)  # fmt: skip
"""The parameter block's i64 words, in order: output sizes, window sizes, input features,
strides, window dilations, output features Og, the packed kernel's width Wo, the padded
input's element strides (batch, row, column), the result's, and tiles per output row."""


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
        return f"conv-library v1 {'ftz' if flush_denormals else 'ieee'} {self!r}"

    def width(self, features: int) -> int:
        """Wo: `features` output features padded to whole vectors."""
        return -(-features // self.lanes) * self.lanes


def _tile_for(nv: int, registers: int) -> int:
    """R for blocks of `nv` vectors: the positions whose accumulators leave the kernel
    vectors and a broadcast free (emit_conv.DirectConv's rule, at most 8)."""
    return max(1, min((registers - nv - 2) // nv, 8))


def menu(lanes: int) -> tuple[ConvKernel, ...]:
    """Every convolution kernel of the library for vector registers of `lanes` f32
    elements (16 lanes: 32 registers, AVX-512; else 16): blocks of 1, 2 or 4 vectors."""
    registers = 32 if lanes >= 16 else 16
    return tuple(ConvKernel(_tile_for(nv, registers), nv, lanes) for nv in (1, 2, 4))


def conv_kernel(features: int, lanes: int) -> ConvKernel:
    """The kernel of the menu for `features` output features: the block of vectors whose
    tiles do the most multiply-adds per load (emit_conv.DirectConv.block's merit: R x NV
    of them for R + NV loads, all blocks of a tile counted; ties: more positions)."""
    vectors = -(-features // lanes)

    def merit(kernel: ConvKernel) -> tuple[float, int]:
        r, blocks = kernel.tile, -(-vectors // kernel.block)
        return r * vectors / (blocks * r + vectors), r

    return max((k for k in menu(lanes) if k.block <= max(vectors, 1)), key=merit)


def conv_params(kernel: ConvKernel, geometry: dict) -> tuple[int, ...]:
    """The parameter block (PARAMS) of a direct geometry (runtime/conv_thunk.py
    `direct_geometry`: unpadded reads, features adjacent) for `kernel`."""
    g = geometry
    xs, ys = g["x_strides"], g["out_strides"]
    if xs[3] != 1 or ys[3] != 1 or g["checked"] != (False, False):
        raise ValueError("the library convolution reads a padded input, features adjacent")
    tiles = -(-g["outs"][1] // kernel.tile)
    return (
        *g["outs"], *g["ksizes"], g["channels"], *g["strides"], *g["dilations"],
        g["features"], kernel.width(g["features"]), *xs[:3], *ys[:3], tiles,
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
        with self.loop(fn.args[4], fn.args[5], "tile") as unit:
            t = b.urem(unit, p["tiles"])
            row = b.udiv(unit, p["tiles"])
            i = b.urem(row, p["o0"])
            n = b.udiv(row, p["o0"])
            j0 = b.mul(t, c(k.tile))
            last = b.sub(p["o1"], c(k.tile))  # where a row's last whole tile starts
            with b.if_else(b.icmp_signed(">=", last, c(0))) as (whole, part):
                with whole:  # a last tile past the row's end moves back to end with it
                    self._tile(n, i, b.select(b.icmp_signed(">", j0, last), last, j0), k.tile)
                with part, self.loop(c(0), p["o1"], "pos", unroll=1) as q:  # one at a time
                    self._tile(n, i, q, 1)
        self.end_function(body)
        return str(self.module)

    def _tile(self, n, i, j0, r: int) -> None:
        """Output positions [j0, j0 + r) of row (n, i): blocks of NV vectors, then the
        vectors left one at a time; a vector past Og's last whole one is stored under a
        mask (the packed kernel's padding makes its lanes past Og zeros)."""
        k, b, c, p = self.k, self.b, self.c, self.p
        vectors = b.udiv(b.add(p["features"], c(k.lanes - 1)), c(k.lanes))
        blocks = b.udiv(vectors, c(k.block))
        with self.loop(c(0), blocks, "blk", unroll=1) as blk:
            self._block(n, i, j0, r, b.mul(blk, c(k.block)), k.block)
        if k.block > 1:
            with self.loop(b.mul(blocks, c(k.block)), vectors, "vec", unroll=1) as vec:
                self._block(n, i, j0, r, vec, 1)

    def _block(self, n, i, j0, r: int, first, nv: int) -> None:
        """Positions [j0, j0 + r), vectors [first, first + nv): the reduction, then the
        stores."""
        k, b, c, p = self.k, self.b, self.c, self.p
        zero = ir.Constant(self.vty, [0.0] * k.lanes)
        accs = [[self.accs[pos * k.block + q] for q in range(nv)] for pos in range(r)]
        for row in accs:
            for acc in row:
                b.store(zero, acc)
        lane0 = b.mul(first, c(k.lanes))
        col0 = b.mul(b.mul(j0, p["s1"]), p["x2"])
        step = b.mul(p["s1"], p["x2"])  # between adjacent positions of the tile
        k_row = b.mul(p["c"], p["width"])  # kernel floats per window position
        with self.loop(c(0), p["k0"], "ka") as ka:
            h = b.add(b.mul(i, p["s0"]), b.mul(ka, p["d0"]))
            base = b.add(b.add(b.mul(n, p["x0"]), b.mul(h, p["x1"])), col0)
            with self.loop(c(0), p["k1"], "kb") as kb:
                at0 = b.add(base, b.mul(b.mul(kb, p["d1"]), p["x2"]))
                at = [b.add(at0, b.mul(c(pos), step)) for pos in range(r)]
                k_at = b.add(b.mul(b.add(b.mul(ka, p["k1"]), kb), k_row), lane0)
                self._reduce(at, k_at, nv, accs)
        self._store(n, i, j0, lane0, nv, accs)

    def _reduce(self, at, k_at, nv: int, accs) -> None:
        """The reduction over input features at input offsets `at` (one per position)."""
        k, b, c, p = self.k, self.b, self.c, self.p
        with self.loop(c(0), p["c"], "ci", unroll=2) as ci:
            w_at = b.add(k_at, b.mul(ci, p["width"]))
            ws = []
            for q in range(nv):
                ptr = b.gep(self.w, [b.add(w_at, c(q * k.lanes))], True)
                ws.append(b.load(b.bitcast(ptr, self.vty.as_pointer()), align=4))
            for pos, offset in enumerate(at):
                s = b.load(b.gep(self.x, [b.add(offset, ci)], True))
                splat = splat_scalar(b, self.vty, k.lanes, s)
                for q in range(nv):
                    acc = accs[pos][q]
                    b.store(b.call(self.fma, [splat, ws[q], b.load(acc)]), acc)

    def _store(self, n, i, j0, lane0, nv: int, accs) -> None:
        """The block's results: vector q whole where Og reaches past it, else under a mask
        of its features below Og."""
        k, b, c, p = self.k, self.b, self.c, self.p
        row = b.add(b.mul(n, p["y0"]), b.mul(i, p["y1"]))
        vp = self.vty.as_pointer()
        ids = ir.Constant(ir.VectorType(I64, k.lanes), list(range(k.lanes)))
        vi64 = ir.VectorType(I64, k.lanes)
        for q in range(nv):
            left = b.sub(p["features"], b.add(lane0, c(q * k.lanes)))  # features from here
            splat = b.insert_element(ir.Constant(vi64, ir.Undefined), left, c(0))
            zeros = ir.Constant(ir.VectorType(I32, k.lanes), [0] * k.lanes)
            splat = b.shuffle_vector(splat, ir.Constant(vi64, ir.Undefined), zeros)
            mask = b.icmp_signed("<", ids, splat)
            whole = b.icmp_signed(">=", left, c(k.lanes))
            for pos in range(len(accs)):
                base = b.add(b.add(row, b.mul(b.add(j0, c(pos)), p["y2"])), lane0)
                ptr = b.bitcast(b.gep(self.out, [b.add(base, c(q * k.lanes))], True), vp)
                value = b.load(accs[pos][q])
                with b.if_else(whole) as (full, part):
                    with full:
                        b.store(value, ptr, align=4)
                    with part:
                        b.call(self.masked_store, [value, ptr, ir.Constant(I32, 4), mask])


def emit_conv_kernel(kernel: ConvKernel, flush_denormals: bool = True) -> str:
    """The LLVM IR of the library's convolution kernel `kernel` (see the file comment)."""
    return _Emitter(kernel, flush_denormals).emit_ir()
