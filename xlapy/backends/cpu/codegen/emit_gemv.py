# Matrix-vector dots as one native kernel: y[b, r] = sum over k of A[b, r, k] * x[b, k].
#
# A dot of f32 or f64 operands whose left or right side has no free dimension of size above
# one (n == 1: a matrix times a vector; m == 1: a vector times a matrix), batched or not, is
# a matrix-vector product. BLAS's gemm with one column repacks the whole matrix on every
# call (4-10x slower than a gemv on a 512 x 512 matrix) and OpenBLAS's gemv runs on its own
# spinning threads; XLA:CPU emits its own tiled LLVM IR for every dot whose result has at
# most one dimension above size 1 (dot_op_emitter's matrix-vector strategy, row-major and
# column-major variants). So does this kernel. The "matrix" is the operand with free
# dimensions (rows: its free dimensions, merged; k: the contracting ones, merged in the
# dot's order), the "vector" the other; every group of dimensions (batch, rows, k, and the
# result's) must merge into one stride, any layout and either operand order, else the
# dot goes to BLAS (runtime/dot_thunk.py).
#
# Two loop orders, chosen by which of the matrix's strides is 1:
#
#   rows     (k contiguous: A @ x with a row-major A) a tile is 4 rows; each keeps two vector
#            accumulators of V lanes over k (8 independent fused multiply-add chains, one
#            vector of x loaded per step for the 4 rows), summed across lanes at the end;
#            the k elements past the last whole vector run as a scalar chain per row.
#   columns  (rows contiguous: x @ A, or A^T @ x) a tile is 8 KiB of adjacent rows; k runs
#            in blocks of 4 steps, and in each block groups of 8 vectors of V rows each
#            keep an accumulator over the block's steps (x[k] broadcast, one vector load of
#            A per accumulator), loaded from y before the block and stored after it (bit
#            for bit one chain per row); rows past the last whole vector of the final
#            tile run as scalar chains. A block reads 4 rows of A side by side, each
#            contiguous over the tile, as BLAS's column-major gemv does.
#
# A small matrix-matrix product (the "vector" operand has 2 to _SMALL_COLS free elements:
# an RNN cell's [batch, k] @ [k, n] with a batch of a few rows, compile option
# native_small_gemm) runs the same two orders over `cols` vectors x_j, without BLAS's
# packing of both operands on every call (OpenBLAS sgemm on 3 x 128 x 256 spent ~3x XLA's
# time on it). The matrix is the operand with more free elements. Each tile takes the
# columns j in a few balanced chunks of at most _GEMM_CHUNK and keeps every (row, j) sum
# of the chunk in a register over the whole of k (A's tile is re-read from cache per chunk):
#
#   rows     a tile is 4 rows; per chunk (at most _GEMM_ROWS_CHUNK columns) one vector
#            accumulator per (row, j) over k (4 x J fused multiply-add chains, J + 4
#            vector loads per step), summed across lanes at the end.
#   columns  a tile is G vectors of V adjacent rows; per chunk one vector accumulator per
#            (vector, j): x[j, k] broadcast, G vector loads of A per step, G x J chains
#            (G = 12 // J, at most 4, so that the accumulators and loads fit 16 registers).
#
# The kernel's outer range counts tiles over (batch, rows), so a thunk may split it over the
# pool; every result element is summed by one tile in one fixed order, so any split gives the
# same bits. Sums use llvm.fmuladd (fused where the target has FMA, as BLAS's kernels are)
# and accumulate in the element type, as the interpreter does. The kernel is
#
#   void f(i8* noalias out, i8* noalias lhs, i8* noalias rhs, i64 start, i64 end)
#
# and flushes subnormals like the other kernels (flush_denormals: XLA:CPU's dots do).

from __future__ import annotations

import math
from dataclasses import dataclass

from llvmlite import ir

from xlapy.backends.cpu.codegen.common import F32, F64, I32, I64, SYMBOL, KernelSpec
from xlapy.backends.cpu.codegen.emitter import StandaloneKernelEmitter
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.shapes import Shape, merged_stride
from xlapy.ir.types import PrimitiveType

_ROW_TILE = 4
"""Rows per tile of the rows order."""
_COLUMN_VECTORS = 8
"""Vectors of adjacent rows summed together in registers by the columns order."""
_COLUMN_TILE_BYTES = 8192
"""Bytes of adjacent rows per tile of the columns order (a 2048 x 2048 f32 x @ A measured
5x slower with 2 KiB tiles: each step of k then reads 2 KiB of a new page)."""
_DEPTH_BLOCK = 4
"""k steps per block of the columns order: the block's rows of A stream side by side as
the groups sweep the tile (4 to 16 measured alike on 512 x 4096; 64 was 6x slower)."""
SMALL_COLS = 16
"""A dot whose smaller free side (m or n) has at most this many elements is a small
matrix-matrix product for this kernel (native_small_gemm); larger ones go to BLAS."""
_GEMM_CHUNK = 4
"""Columns (x_j) per chunk of a small matrix-matrix product's tile, columns order."""
_GEMM_ROWS_CHUNK = 3
"""The same, rows order (4 rows x 3 columns: 12 accumulators; 2, 3 and 4 measured within
the noise of the loaded machine, 3 best or level on 3-8 rows x 128-512 x 160-384)."""
_GEMM_REGISTERS = 12
"""Vector accumulators per chunk of the columns order (G x J <= this)."""


def gemm_chunk_limit(by_rows: bool) -> int:
    """The most columns one chunk of a small gemm's tile keeps in registers, by loop order."""
    return _GEMM_ROWS_CHUNK if by_rows else _GEMM_CHUNK


@dataclass(frozen=True, slots=True)
class Gemv:
    """The geometry a matrix-vector kernel is compiled for (see the file comment); strides
    in elements."""

    f64: bool
    matrix: int  # which operand is the matrix: 0 (lhs) or 1 (rhs)
    batch: int
    rows: int
    depth: int  # k
    a_strides: tuple[int, int, int]  # matrix: batch, row, k
    x_strides: tuple[int, int, int]  # vector: batch, k, column
    y_strides: tuple[int, int, int]  # result: batch, row, column
    lanes: int  # V: elements of one vector register
    cols: int = 1  # the vectors x_j (free elements of the other operand): above 1, a gemm

    @property
    def chunks(self) -> tuple[tuple[int, int], ...]:
        """(first column, columns) of each chunk of a small gemm's tile: as few as
        _GEMM_CHUNK allows, balanced (5 columns are 3 + 2, not 4 + 1)."""
        count = -(-self.cols // gemm_chunk_limit(self.by_rows))
        sizes = [self.cols // count + (i < self.cols % count) for i in range(count)]
        return tuple((sum(sizes[:i]), size) for i, size in enumerate(sizes))

    @property
    def gemm_vectors(self) -> int:
        """G: vectors of rows per tile of a small gemm's columns order."""
        widest = max(size for _, size in self.chunks)
        return max(1, min(4, _GEMM_REGISTERS // widest))

    @property
    def by_rows(self) -> bool:
        """The rows order (k contiguous), else the columns order (rows contiguous)."""
        return self.a_strides[2] == 1

    @property
    def tile(self) -> int:
        """Rows per tile."""
        if self.by_rows:
            return _ROW_TILE
        if self.cols > 1:
            return self.gemm_vectors * self.lanes
        group = _COLUMN_VECTORS * self.lanes
        per_tile = max(_COLUMN_TILE_BYTES // (8 if self.f64 else 4) // group, 1) * group
        return min(per_tile, -(-self.rows // group) * group)

    @property
    def tiles(self) -> int:
        """Tiles per batch element."""
        return -(-self.rows // self.tile)

    @property
    def extent(self) -> int:
        return self.batch * self.tiles

    def description(self, flush_denormals: bool) -> str:
        """A text that determines the kernel's IR (a cache key)."""
        return f"gemv v3 {'ftz' if flush_denormals else 'ieee'} {self!r}"


def splat(b: ir.IRBuilder, vty: ir.VectorType, lanes: int, s) -> ir.Value:
    """Scalar `s` in every one of the `lanes` lanes of a `vty` vector."""
    one = b.insert_element(ir.Constant(vty, ir.Undefined), s, ir.Constant(I32, 0))
    mask = ir.Constant(ir.VectorType(I32, lanes), [0] * lanes)
    return b.shuffle_vector(one, ir.Constant(vty, ir.Undefined), mask)


def lane_sum(b: ir.IRBuilder, v, lanes: int) -> ir.Value:
    """The sum of `v`'s `lanes` lanes, halves added until one lane is left (the order every
    gemv/small-gemm kernel sums in, so their results agree bit for bit)."""
    undefined = ir.Constant(v.type, ir.Undefined)
    width = lanes
    while width > 1:
        half = width // 2
        mask = list(range(half, width)) + list(range(half, width))
        mask += [0] * (lanes - len(mask))
        hi = b.shuffle_vector(v, undefined, ir.Constant(ir.VectorType(I32, lanes), mask))
        v = b.fadd(v, hi)
        width = half
    return b.extract_element(v, ir.Constant(I32, 0))


_TYPES = {PrimitiveType.F32: False, PrimitiveType.F64: True}


def gemv_geometry(instr: HloInstruction, f32_lanes: int, small_gemm: bool = False) -> Gemv | str:
    """The matrix-vector kernel geometry of dot `instr`, or why it has none. `f32_lanes`:
    f32 elements in one vector register of the target (8 with AVX2). `small_gemm`: also
    a matrix-matrix product whose smaller free side has at most SMALL_COLS elements."""
    if len(instr.operands) != 2 or not instr.shape.is_array:
        return "not a dot of two arrays"
    lhs, rhs = (o.shape for o in instr.operands)
    out = instr.shape
    t = out.element_type
    if t not in _TYPES or lhs.element_type is not t or rhs.element_type is not t:
        return "not one element type (f32 or f64) in and out"
    for s in (lhs, rhs, out):
        if s.is_dynamic or (s.layout is not None and s.layout.tiles):
            return "a dynamic shape or a tiled layout"
    dn = instr.dot_dimension_numbers
    lb, rb = dn.lhs_batch, dn.rhs_batch
    lc, rc = dn.lhs_contracting, dn.rhs_contracting
    if len(lb) != len(rb) or len(lc) != len(rc):
        return "unpaired batch or contracting dimensions"
    lf = [d for d in range(lhs.rank) if d not in lb and d not in lc]
    rf = [d for d in range(rhs.rank) if d not in rb and d not in rc]
    m = math.prod(lhs.dims[d] for d in lf)
    n = math.prod(rhs.dims[d] for d in rf)
    if m != 1 and n != 1 and (not small_gemm or min(m, n) > SMALL_COLS):
        return f"a matrix-matrix product ({m} x {n} results per batch)"
    batch = math.prod(lhs.dims[d] for d in lb)
    depth = math.prod(lhs.dims[d] for d in lc)
    if batch == 0 or m * n == 0:
        return "an empty result"
    matrix = 0 if n == 1 or (m != 1 and m > n) else 1
    mat, vec = (lhs, rhs) if matrix == 0 else (rhs, lhs)
    mb, vb = (lb, rb) if matrix == 0 else (rb, lb)
    mc, vc = (lc, rc) if matrix == 0 else (rc, lc)
    free, vfree = (lf, rf) if matrix == 0 else (rf, lf)
    nb = len(lb)
    lhs_out = range(nb, nb + len(lf))
    rhs_out = range(nb + len(lf), out.rank)
    strides = (
        merged_stride(mat, mb),
        merged_stride(mat, free),
        merged_stride(mat, mc),
        merged_stride(vec, vb),
        merged_stride(vec, vc),
        merged_stride(vec, vfree),
        merged_stride(out, range(nb)),
        merged_stride(out, lhs_out if matrix == 0 else rhs_out),
        merged_stride(out, rhs_out if matrix == 0 else lhs_out),
    )
    if any(s is None for s in strides):
        return "a group of dimensions (batch, rows, contracting) spans several strides"
    sa_b, sa_r, sa_k, sx_b, sx_k, sx_c, sy_b, sy_r, sy_c = (int(s or 0) for s in strides)
    if sa_k != 1 and sa_r != 1:
        return "the matrix operand is contiguous neither along rows nor along k"
    f64 = _TYPES[t]
    return Gemv(
        f64,
        matrix,
        batch,
        n if matrix else m,
        depth,
        (sa_b, sa_r, sa_k),
        (sx_b, sx_k, sx_c),
        (sy_b, sy_r, sy_c),
        max(f32_lanes // 2, 1) if f64 else f32_lanes,
        m if matrix else n,
    )


class _GemvEmitter(StandaloneKernelEmitter):
    def __init__(self, g: Gemv, flush_denormals: bool):
        super().__init__(SYMBOL, flush_denormals)
        self.g = g
        self.scalar = F64 if g.f64 else F32
        self.vty = ir.VectorType(self.scalar, g.lanes)
        self.align = 8 if g.f64 else 4
        self.vfma = self._fmuladd(self.vty)
        self.sfma = self._fmuladd(self.scalar)

    def emit_ir(self) -> str:
        g = self.g
        fn, body = self.begin_function(["out", "lhs", "rhs"], set())
        b = self.b
        out, lhs, rhs = (b.bitcast(arg, self.scalar.as_pointer()) for arg in fn.args[:3])
        self.y = out
        self.a, self.x = (lhs, rhs) if g.matrix == 0 else (rhs, lhs)
        c = self.c
        rest = g.rows % g.tile
        with self.loop(fn.args[3], fn.args[4], "tile") as unit:
            bi = b.udiv(unit, c(g.tiles))
            t = b.urem(unit, c(g.tiles))
            r0 = b.mul(t, c(g.tile))
            if g.cols > 1:
                tile = self._gemm_rows_tile if g.by_rows else self._gemm_columns_tile
            else:
                tile = self._rows_tile if g.by_rows else self._columns_tile
            if rest:
                last = b.icmp_unsigned("==", t, c(g.tiles - 1))
                with b.if_else(last) as (short, full):
                    with short:
                        tile(bi, r0, rest)
                    with full:
                        tile(bi, r0, g.tile)
            else:
                tile(bi, r0, g.tile)
        self.end_function(body)
        return str(self.module)

    # -- helpers ---------------------------------------------------------------------------
    def _fmuladd(self, ty) -> ir.Function:
        """llvm.fmuladd on `ty`: a * b + c, fused where the target has FMA."""
        base = "f64" if self.g.f64 else "f32"
        name = f"llvm.fmuladd.v{self.g.lanes}{base}" if ty is self.vty else f"llvm.fmuladd.{base}"
        return ir.Function(self.module, ir.FunctionType(ty, [ty] * 3), name)

    @staticmethod
    def c(v: int) -> ir.Constant:
        return ir.Constant(I64, v)

    def _at(self, base, index):
        return self.b.gep(base, [index], inbounds=True)

    def _load_vector(self, base, index, stride: int):
        """V elements from `base[index + i * stride]`."""
        b = self.b
        if stride == 1:
            ptr = b.bitcast(self._at(base, index), self.vty.as_pointer())
            return b.load(ptr, align=self.align)
        v = ir.Constant(self.vty, ir.Undefined)
        for lane in range(self.g.lanes):
            s = b.load(self._at(base, b.add(index, self.c(lane * stride))))
            v = b.insert_element(v, s, ir.Constant(I32, lane))
        return v

    def _splat(self, s):
        return splat(self.b, self.vty, self.g.lanes, s)

    def _lane_sum(self, v):
        return lane_sum(self.b, v, self.g.lanes)

    def _zeroed(self, ty, count: int, name: str) -> list:
        zero = ir.Constant(ty, [0.0] * self.g.lanes) if ty is self.vty else ir.Constant(ty, 0.0)
        slots = [self.alloca(ty, f"{name}{i}") for i in range(count)]
        for slot in slots:
            self.b.store(zero, slot)
        return slots

    def _bases(self, bi, r0):
        """(first element of the tile's rows in A, the batch's x, the tile's rows in y)."""
        b, g, c = self.b, self.g, self.c
        a = b.add(b.mul(bi, c(g.a_strides[0])), b.mul(r0, c(g.a_strides[1])))
        x = b.mul(bi, c(g.x_strides[0]))
        y = b.add(b.mul(bi, c(g.y_strides[0])), b.mul(r0, c(g.y_strides[1])))
        return a, x, y

    # -- rows order: k contiguous ----------------------------------------------------------
    def _rows_tile(self, bi, r0, rows: int) -> None:
        b, g, c = self.b, self.g, self.c
        lanes, sx_k = g.lanes, g.x_strides[1]
        a0, x0, y0 = self._bases(bi, r0)
        row_at = [b.add(a0, c(r * g.a_strides[1])) for r in range(rows)]
        accs = self._zeroed(self.vty, 2 * rows, "acc")
        sums = self._zeroed(self.scalar, rows, "sum")
        pairs, whole = g.depth // (2 * lanes), g.depth // lanes

        def step(k, which: int) -> None:
            xv = self._load_vector(self.x, b.add(x0, b.mul(k, c(sx_k))), sx_k)
            for r in range(rows):
                av = self._load_vector(self.a, b.add(row_at[r], k), 1)
                acc = accs[2 * r + which]
                b.store(b.call(self.vfma, [av, xv, b.load(acc)]), acc)

        if pairs:
            with self.loop(c(0), c(pairs), "kk") as kk:
                k = b.mul(kk, c(2 * lanes))
                step(k, 0)
                step(b.add(k, c(lanes)), 1)
        if whole > 2 * pairs:
            step(c(2 * pairs * lanes), 0)
        if g.depth > whole * lanes:
            with self.loop(c(whole * lanes), c(g.depth), "k") as k:
                xs = b.load(self._at(self.x, b.add(x0, b.mul(k, c(sx_k)))))
                for r in range(rows):
                    a = b.load(self._at(self.a, b.add(row_at[r], k)))
                    b.store(b.call(self.sfma, [a, xs, b.load(sums[r])]), sums[r])
        for r in range(rows):
            total = b.fadd(b.load(accs[2 * r]), b.load(accs[2 * r + 1]))
            value = b.fadd(self._lane_sum(total), b.load(sums[r]))
            b.store(value, self._at(self.y, b.add(y0, c(r * g.y_strides[1]))))

    # -- columns order: rows contiguous ----------------------------------------------------
    def _columns_tile(self, bi, r0, rows: int) -> None:
        g, c = self.g, self.c
        group = _COLUMN_VECTORS * g.lanes
        groups, rest = rows // group, rows % group
        a0, x0, y0 = self._bases(bi, r0)
        blocks = max(-(-g.depth // _DEPTH_BLOCK), 1)  # k = 0 still stores zeros
        with self.loop(c(0), c(blocks), "kb") as kb:
            k0 = self.b.mul(kb, c(_DEPTH_BLOCK))
            k1 = self.b.select(
                self.b.icmp_unsigned("==", kb, c(blocks - 1)),
                c(g.depth),
                self.b.add(k0, c(_DEPTH_BLOCK)),
            )
            first = self.b.icmp_unsigned("==", kb, c(0))
            if groups:
                with self.loop(c(0), c(groups), "group") as q:
                    j = self.b.mul(q, c(group))
                    self._columns(a0, x0, y0, j, k0, k1, first, _COLUMN_VECTORS, 0)
            if rest:
                j = c(groups * group)
                self._columns(a0, x0, y0, j, k0, k1, first, rest // g.lanes, rest % g.lanes)

    def _columns(self, a0, x0, y0, j, k0, k1, first, vectors: int, scalars: int) -> None:
        """Rows [j, j + vectors * V + scalars) of the tile over k in [k0, k1): each row
        accumulates in a register, from zero on the first block of k, else from y."""
        b, g, c = self.b, self.g, self.c
        lanes, sa_k, sx_k, sy_r = g.lanes, g.a_strides[2], g.x_strides[1], g.y_strides[1]
        accs = [self.alloca(self.vty, f"acc{q}") for q in range(vectors)]
        sums = [self.alloca(self.scalar, f"sum{q}") for q in range(scalars)]
        y_at = [b.add(y0, b.mul(b.add(j, c(q * lanes)), c(sy_r))) for q in range(vectors)]
        y_at += [
            b.add(y0, b.mul(b.add(j, c(vectors * lanes + s)), c(sy_r))) for s in range(scalars)
        ]
        vzero = ir.Constant(self.vty, [0.0] * lanes)
        for q, acc in enumerate(accs):
            b.store(b.select(first, vzero, self._load_vector(self.y, y_at[q], sy_r)), acc)
        for s, acc in enumerate(sums):
            old = b.load(self._at(self.y, y_at[vectors + s]))
            b.store(b.select(first, ir.Constant(self.scalar, 0.0), old), acc)
        with self.loop(k0, k1, "k") as k:
            xs = b.load(self._at(self.x, b.add(x0, b.mul(k, c(sx_k)))))
            at = b.add(b.add(a0, b.mul(k, c(sa_k))), j)
            if vectors:
                xv = self._splat(xs)
                for q in range(vectors):
                    av = self._load_vector(self.a, b.add(at, c(q * lanes)), 1)
                    b.store(b.call(self.vfma, [av, xv, b.load(accs[q])]), accs[q])
            for s in range(scalars):
                a = b.load(self._at(self.a, b.add(at, c(vectors * lanes + s))))
                b.store(b.call(self.sfma, [a, xs, b.load(sums[s])]), sums[s])
        for q in range(vectors):
            value = b.load(accs[q])
            if sy_r == 1:
                ptr = b.bitcast(self._at(self.y, y_at[q]), self.vty.as_pointer())
                b.store(value, ptr, align=self.align)
                continue
            for lane in range(lanes):
                v = b.extract_element(value, ir.Constant(I32, lane))
                b.store(v, self._at(self.y, b.add(y_at[q], c(lane * sy_r))))
        for s in range(scalars):
            b.store(b.load(sums[s]), self._at(self.y, y_at[vectors + s]))

    # -- small matrix-matrix products: `cols` vectors x_j ----------------------------------
    def _store_vector(self, value, index, stride: int) -> None:
        """`value`'s lanes to `y[index + i * stride]`."""
        b = self.b
        if stride == 1:
            ptr = b.bitcast(self._at(self.y, index), self.vty.as_pointer())
            b.store(value, ptr, align=self.align)
            return
        for lane in range(self.g.lanes):
            v = b.extract_element(value, ir.Constant(I32, lane))
            b.store(v, self._at(self.y, b.add(index, self.c(lane * stride))))

    def _gemm_rows_tile(self, bi, r0, rows: int) -> None:
        """k contiguous: per chunk of columns, a vector accumulator per (row, column) over
        the whole of k, the k past the last whole vector as scalar chains."""
        b, g, c = self.b, self.g, self.c
        lanes, sx_k, sx_c = g.lanes, g.x_strides[1], g.x_strides[2]
        sy_r, sy_c = g.y_strides[1], g.y_strides[2]
        a0, x0, y0 = self._bases(bi, r0)
        row_at = [b.add(a0, c(r * g.a_strides[1])) for r in range(rows)]
        whole = g.depth // lanes
        for j0, width in g.chunks:
            col_at = [b.add(x0, c((j0 + j) * sx_c)) for j in range(width)]
            accs = self._zeroed(self.vty, rows * width, "acc")
            sums = self._zeroed(self.scalar, rows * width, "sum")
            if whole:
                with self.loop(c(0), c(whole), "kv") as kv:
                    k = b.mul(kv, c(lanes))
                    xs = [
                        self._load_vector(self.x, b.add(x, b.mul(k, c(sx_k))), sx_k) for x in col_at
                    ]
                    for r in range(rows):
                        av = self._load_vector(self.a, b.add(row_at[r], k), 1)
                        for j in range(width):
                            acc = accs[r * width + j]
                            b.store(b.call(self.vfma, [av, xs[j], b.load(acc)]), acc)
            if g.depth > whole * lanes:
                with self.loop(c(whole * lanes), c(g.depth), "k") as k:
                    xs = [b.load(self._at(self.x, b.add(x, b.mul(k, c(sx_k))))) for x in col_at]
                    for r in range(rows):
                        a = b.load(self._at(self.a, b.add(row_at[r], k)))
                        for j in range(width):
                            acc = sums[r * width + j]
                            b.store(b.call(self.sfma, [a, xs[j], b.load(acc)]), acc)
            for r in range(rows):
                for j in range(width):
                    i = r * width + j
                    value = b.fadd(self._lane_sum(b.load(accs[i])), b.load(sums[i]))
                    at = b.add(y0, c(r * sy_r + (j0 + j) * sy_c))
                    b.store(value, self._at(self.y, at))

    def _gemm_columns_tile(self, bi, r0, rows: int) -> None:
        """Rows contiguous: per chunk of columns, a vector accumulator per (vector of rows,
        column) over the whole of k (x[j, k] broadcast); rows past the last whole vector
        of the final tile as scalar chains."""
        b, g, c = self.b, self.g, self.c
        lanes, sa_k, sx_k, sx_c = g.lanes, g.a_strides[2], g.x_strides[1], g.x_strides[2]
        sy_r, sy_c = g.y_strides[1], g.y_strides[2]
        vectors, scalars = rows // lanes, rows % lanes
        a0, x0, y0 = self._bases(bi, r0)
        for j0, width in g.chunks:
            col_at = [b.add(x0, c((j0 + j) * sx_c)) for j in range(width)]
            accs = self._zeroed(self.vty, vectors * width, "acc")
            sums = self._zeroed(self.scalar, scalars * width, "sum")
            with self.loop(c(0), c(g.depth), "k") as k:
                at = b.add(a0, b.mul(k, c(sa_k)))
                xs = [b.load(self._at(self.x, b.add(x, b.mul(k, c(sx_k))))) for x in col_at]
                xv = [self._splat(x) for x in xs] if vectors else []
                for q in range(vectors):
                    av = self._load_vector(self.a, b.add(at, c(q * lanes)), 1)
                    for j in range(width):
                        acc = accs[q * width + j]
                        b.store(b.call(self.vfma, [av, xv[j], b.load(acc)]), acc)
                for s in range(scalars):
                    a = b.load(self._at(self.a, b.add(at, c(vectors * lanes + s))))
                    for j in range(width):
                        acc = sums[s * width + j]
                        b.store(b.call(self.sfma, [a, xs[j], b.load(acc)]), acc)
            for j in range(width):
                y_col = b.add(y0, c((j0 + j) * sy_c))
                for q in range(vectors):
                    at = b.add(y_col, c(q * lanes * sy_r))
                    self._store_vector(b.load(accs[q * width + j]), at, sy_r)
                for s in range(scalars):
                    at = b.add(y_col, c((vectors * lanes + s) * sy_r))
                    b.store(b.load(sums[s * width + j]), self._at(self.y, at))


def gemv_signature(
    instr: HloInstruction, g: Gemv
) -> tuple[tuple[Shape, ...], tuple[Shape, ...], int]:
    """(outputs, params, outer extent) of `instr`'s matrix-vector kernel for `g`."""
    return (instr.shape,), tuple(o.shape for o in instr.operands), g.extent


def emit_gemv(instr: HloInstruction, g: Gemv, flush_denormals: bool = True) -> KernelSpec:
    """The matrix-vector kernel of `instr` for its geometry `g` (gemv_geometry)."""
    text = _GemvEmitter(g, flush_denormals).emit_ir()
    outputs, params, extent = gemv_signature(instr, g)
    return KernelSpec(SYMBOL, text, outputs, params, extent)
