# Small matrix-matrix products as kernels generic in their shape: the kernel library's gemms.
#
# codegen/emit_gemv.py compiles a small matrix-matrix product (a dot whose smaller free side
# has 2 to SMALL_COLS elements: an RNN cell's [batch, k] @ [k, n]) into a kernel specialised
# to its shape, at 70-280 ms of LLVM per shape. The kernels here do the same work with the
# shape as run-time data: depth, rows, columns, batch and every stride are read from a
# parameter block, so a few kernels serve every such dot of every program. XLA's CPU runtime
# calls precompiled Eigen kernels in the same way; these are compiled once per machine
# (jit/kernel_library.py) and a program's cold compile needs no LLVM for its small dots.
#
# What a kernel is specialised on (the finite menu, `MENU`): the element type (f32, f64), the
# loop order (rows: the matrix contiguous along k; columns: contiguous along its rows), the
# widths of the column chunks it keeps in registers (rows order 2 and 3; columns order
# 2 and 3 with G = 4 vectors of rows per tile, or 3 and 4 with G = 3, so that G x width
# accumulators and the loads fit 16 vector registers), and whether the unit-stride operand
# of the order is contiguous: the vector x along k (rows order: vector loads, else a gather
# per lane) or the result along rows (columns order: vector stores, else a store per lane).
# The vector width V is the host's (part of the library's cache key with the CPU features).
#
# The geometry is emit_gemv's (`Gemv`: the matrix is the operand with more free elements,
# the other one's free elements are `cols` vectors x_j); the loops are its small-gemm loops:
#
#   rows     a tile is 4 rows; per chunk of columns one vector accumulator per (row, j) over
#            the k of whole vectors, scalar chains for the k past them, lane sums at the end.
#   columns  a tile is G vectors of V rows; per chunk one vector accumulator per (vector,
#            j) over the whole of k, x[j, k] broadcast.
#
# The columns are cut into `count` chunks as emit_gemv cuts them (as few as the order's
# chunk limit allows, balanced: widths differ by at most one), so a chunk is one of the
# kernel's two widths; the kernel switches on each chunk's width. The last tile of a row
# range shorter than a whole tile runs as row blocks of one (rows order) or one vector of
# rows and then single rows (columns order), with the same accumulator widths. Every result
# element is summed by one tile in one fixed order, so any split of the outer range (tiles
# over batch and rows) gives the same bits; sums use llvm.fmuladd and accumulate in the
# element type. The kernel is
#
#   void f(i8* noalias out, i8* noalias lhs, i8* noalias rhs, i64* noalias params,
#          i64 start, i64 end)
#
# with `params` the i64 block `PARAMS` names (small_gemm_params), and flushes subnormals
# like the other kernels.

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from xlapy.backends.cpu.codegen.common import F32, F64, I32, I64, SYMBOL
from xlapy.backends.cpu.codegen.emit_gemv import Gemv, gemm_chunk_limit, lane_sum, splat
from xlapy.backends.cpu.codegen.emitter import StandaloneKernelEmitter

PARAMS = (
    "rows", "depth", "tiles", "count", "small", "rem",
    "a_b", "a_r", "a_k", "x_b", "x_k", "x_c", "y_b", "y_r", "y_c",
)  # fmt: skip
"""The parameter block's i64 words, in order: rows of the matrix, depth (k), tiles per batch
element, column chunks, their narrower width and how many chunks are one wider (the first
`rem`), then the matrix's, vector's and result's strides in elements (batch, row or k,
k or column...: as Gemv's a_strides, x_strides, y_strides)."""

UNROLL = 2
"""The count LLVM unrolls a columns-order k loop by (runtime trip count; left to LLVM, an
unroll by 2 of 12 accumulators plus 4 broadcasts spilled every accumulator every step)."""
ROWS_UNROLL = 2
"""The same for the rows order's loop over whole vectors of k."""

_ROW_TILE = 4
"""Rows per tile of the rows order (emit_gemv's)."""


@dataclass(frozen=True, slots=True)
class SmallGemmKernel:
    """One kernel of the library (see the file comment): what it is specialised on."""

    f64: bool
    by_rows: bool
    widths: tuple[int, int]  # the chunk widths it has code for (narrower, wider)
    vectors: int  # columns order: G, vectors of rows per tile (rows order: 1)
    contiguous: bool  # rows order: x along k; columns order: the result along rows
    lanes: int  # V: elements of one vector register

    @property
    def tile(self) -> int:
        """Rows per tile."""
        return _ROW_TILE if self.by_rows else self.vectors * self.lanes

    @property
    def name(self) -> str:
        """A short readable name (dumps, the library listing)."""
        order = "rows" if self.by_rows else f"cols{self.vectors}"
        layout = "contig" if self.contiguous else "strided"
        widths = "".join(str(w) for w in self.widths)
        return f"small_gemm_{'f64' if self.f64 else 'f32'}_{order}_w{widths}_{layout}"

    def description(self, flush_denormals: bool) -> str:
        """A text that determines the kernel's IR (with the sources: a cache key)."""
        return f"small-gemm v1 {'ftz' if flush_denormals else 'ieee'} {self!r}"


def menu(lanes: int) -> tuple[SmallGemmKernel, ...]:
    """Every kernel of the library for vector registers of `lanes` f32 elements."""
    kernels = []
    for f64 in (False, True):
        v = max(lanes // 2, 1) if f64 else lanes
        for contiguous in (True, False):
            kernels.append(SmallGemmKernel(f64, True, (2, 3), 1, contiguous, v))
            kernels.append(SmallGemmKernel(f64, False, (2, 3), 4, contiguous, v))
            kernels.append(SmallGemmKernel(f64, False, (3, 4), 3, contiguous, v))
    return tuple(kernels)


def _chunking(cols: int, limit: int) -> tuple[int, int, int]:
    """(count, narrower width, chunks one wider) of `cols` columns in as few chunks of at
    most `limit` as there can be, balanced (emit_gemv's Gemv.chunks)."""
    count = -(-cols // limit)
    return count, cols // count, cols % count


def small_gemm_kernel(g: Gemv) -> SmallGemmKernel | str:
    """The library kernel that runs `g` (a small matrix-matrix product), or why none does."""
    if g.cols < 2:
        return "a matrix-vector product (emit_gemv's own kernel)"
    _, small, rem = _chunking(g.cols, gemm_chunk_limit(g.by_rows))
    widest = small + (rem > 0)
    if g.by_rows:
        contiguous = g.x_strides[1] == 1
        widths, vectors = (2, 3), 1
    else:
        contiguous = g.y_strides[1] == 1
        widths, vectors = ((3, 4), 3) if widest == 4 else ((2, 3), 4)
    if small < widths[0] or widest > widths[1]:
        return f"chunks of {small} to {widest} columns (the library has {widths})"
    return SmallGemmKernel(g.f64, g.by_rows, widths, vectors, contiguous, g.lanes)


def small_gemm_params(g: Gemv, kernel: SmallGemmKernel) -> tuple[int, ...]:
    """The parameter block (PARAMS) of `g` for `kernel`."""
    count, small, rem = _chunking(g.cols, gemm_chunk_limit(g.by_rows))
    tiles = -(-g.rows // kernel.tile)
    return (g.rows, g.depth, tiles, count, small, rem, *g.a_strides, *g.x_strides, *g.y_strides)


def small_gemm_extent(g: Gemv, kernel: SmallGemmKernel) -> int:
    """The kernel's outer range for `g`: tiles over batch and rows."""
    return g.batch * -(-g.rows // kernel.tile)


class _SmallGemmEmitter(StandaloneKernelEmitter):
    def __init__(self, k: SmallGemmKernel, flush_denormals: bool):
        super().__init__(SYMBOL, flush_denormals)
        self.k = k
        self.scalar = F64 if k.f64 else F32
        self.vty = ir.VectorType(self.scalar, k.lanes)
        self.align = 8 if k.f64 else 4
        self.vfma = self._fmuladd(True)
        self.sfma = self._fmuladd(False)

    def emit_ir(self) -> str:
        k = self.k
        fn, body = self.begin_function(["out", "matrix", "vector", "params"], set())
        b, c = self.b, self.c
        self.y, self.a, self.x = (b.bitcast(v, self.scalar.as_pointer()) for v in fn.args[:3])
        words = b.bitcast(fn.args[3], I64.as_pointer())
        p = {name: b.load(b.gep(words, [c(i)]), name=name) for i, name in enumerate(PARAMS)}
        self.p = p
        tiles = p["tiles"]
        with self.loop(fn.args[4], fn.args[5], "tile") as unit:
            bi = b.udiv(unit, tiles)
            r0 = b.mul(b.sub(unit, b.mul(bi, tiles)), c(k.tile))
            left = b.sub(p["rows"], r0)
            a0 = b.add(b.mul(bi, p["a_b"]), b.mul(r0, p["a_r"]))
            x0 = b.mul(bi, p["x_b"])
            y0 = b.add(b.mul(bi, p["y_b"]), b.mul(r0, p["y_r"]))
            whole = b.icmp_signed(">=", left, c(k.tile))
            with self.loop(c(0), p["count"], "chunk") as chunk:
                wider = b.icmp_signed("<", chunk, p["rem"])
                first = b.add(b.mul(chunk, p["small"]), self._min(chunk, p["rem"]))
                width = b.add(p["small"], b.zext(wider, I64))
                narrow, wide = self.k.widths
                is_wide = b.icmp_signed("==", width, c(wide))
                with b.if_else(is_wide) as (then_wide, then_narrow):
                    with then_wide:
                        self._chunk(whole, left, a0, x0, y0, first, wide)
                    with then_narrow:
                        self._chunk(whole, left, a0, x0, y0, first, narrow)
        self.end_function(body)
        return str(self.module)

    # -- helpers ---------------------------------------------------------------------------
    def _fmuladd(self, vector: bool) -> ir.Function:
        """llvm.fmuladd on vectors or scalars: a * b + c, fused where the target has FMA."""
        base = "f64" if self.k.f64 else "f32"
        ty = self.vty if vector else self.scalar
        name = f"llvm.fmuladd.v{self.k.lanes}{base}" if vector else f"llvm.fmuladd.{base}"
        return ir.Function(self.module, ir.FunctionType(ty, [ty] * 3), name)

    @staticmethod
    def c(v: int) -> ir.Constant:
        return ir.Constant(I64, v)

    def _min(self, x, y):
        return self.b.select(self.b.icmp_signed("<", x, y), x, y)

    def _at(self, base, index):
        return self.b.gep(base, [index], inbounds=True)

    def _load_vector(self, base, index, stride, contiguous: bool):
        """V elements from `base[index + i * stride]` (one vector load when contiguous)."""
        b = self.b
        if contiguous:
            ptr = b.bitcast(self._at(base, index), self.vty.as_pointer())
            return b.load(ptr, align=self.align)
        v = ir.Constant(self.vty, ir.Undefined)
        for lane in range(self.k.lanes):
            s = b.load(self._at(base, b.add(index, b.mul(self.c(lane), stride))))
            v = b.insert_element(v, s, ir.Constant(I32, lane))
        return v

    def _store_vector(self, value, index, stride, contiguous: bool) -> None:
        """`value`'s lanes to `y[index + i * stride]` (one vector store when contiguous)."""
        b = self.b
        if contiguous:
            ptr = b.bitcast(self._at(self.y, index), self.vty.as_pointer())
            b.store(value, ptr, align=self.align)
            return
        for lane in range(self.k.lanes):
            v = b.extract_element(value, ir.Constant(I32, lane))
            b.store(v, self._at(self.y, b.add(index, b.mul(self.c(lane), stride))))

    def _splat(self, s):
        return splat(self.b, self.vty, self.k.lanes, s)

    def _lane_sum(self, v):
        return lane_sum(self.b, v, self.k.lanes)

    def _running(self, start):
        """A stack slot holding an index a loop advances (promoted to a register: the
        loop then adds a stride instead of multiplying its counter by one)."""
        slot = self.alloca(I64, "at")
        self.b.store(start, slot)
        return slot

    def _zeroed(self, ty, count: int, name: str) -> list:
        zero = ir.Constant(ty, [0.0] * self.k.lanes) if ty is self.vty else ir.Constant(ty, 0.0)
        slots = [self.alloca(ty, f"{name}{i}") for i in range(count)]
        for slot in slots:
            self.b.store(zero, slot)
        return slots

    def _chunk(self, whole, left, a0, x0, y0, first, width: int) -> None:
        """Columns [first, first + width) of the tile: a whole tile at once, else its
        `left` rows in blocks of one row (rows order) or one vector of rows, then single
        rows (columns order)."""
        b, k, c, p = self.b, self.k, self.c, self.p
        col_at = [b.add(x0, b.mul(b.add(first, c(j)), p["x_c"])) for j in range(width)]
        y_cols = [b.add(y0, b.mul(b.add(first, c(j)), p["y_c"])) for j in range(width)]
        with b.if_else(whole) as (full, part):
            with full:
                if k.by_rows:
                    self._rows_block(a0, col_at, y_cols, _ROW_TILE)
                else:
                    self._columns_block(a0, col_at, y_cols, k.vectors)
            with part:
                if k.by_rows:
                    with self.loop(c(0), left, "row") as r:
                        a = b.add(a0, b.mul(r, p["a_r"]))
                        ys = [b.add(y, b.mul(r, p["y_r"])) for y in y_cols]
                        self._rows_block(a, col_at, ys, 1)
                    return
                lanes = c(k.lanes)
                vectors = b.udiv(left, lanes)
                merge = self.fn.append_basic_block("part.merge")
                switch = b.switch(vectors, merge)
                for count in range(1, k.vectors):  # the whole vectors in one pass over k
                    case = self.fn.append_basic_block(f"part.{count}")
                    switch.add_case(c(count), case)
                    b.position_at_end(case)
                    self._columns_block(a0, col_at, y_cols, count)
                    b.branch(merge)
                b.position_at_end(merge)
                with self.loop(b.mul(vectors, lanes), left, "single") as r:
                    a = b.add(a0, b.mul(r, p["a_r"]))
                    ys = [b.add(y, b.mul(r, p["y_r"])) for y in y_cols]
                    self._columns_single(a, col_at, ys)

    # -- rows order: k contiguous ----------------------------------------------------------
    def _rows_block(self, a0, col_at, y_cols, rows: int) -> None:
        """`rows` rows from a0 (a_r apart) times the chunk's columns: a vector accumulator
        per (row, column) over the k of whole vectors, scalar chains past them."""
        b, k, c, p = self.b, self.k, self.c, self.p
        width, lanes = len(col_at), k.lanes
        row_at = [b.add(a0, b.mul(c(r), p["a_r"])) for r in range(rows)]
        accs = self._zeroed(self.vty, rows * width, "acc")
        sums = self._zeroed(self.scalar, rows * width, "sum")
        vectors = b.udiv(p["depth"], c(lanes))
        sx_k = p["x_k"]
        a_at, x_at = self._running(c(0)), self._running(col_at[0])
        x_offsets = [b.sub(x, col_at[0]) for x in col_at]  # x_c apart
        x_step = b.mul(c(lanes), sx_k)
        with self.loop(c(0), vectors, "kv", unroll=ROWS_UNROLL):
            at, x0 = b.load(a_at), b.load(x_at)
            xs = [
                self._load_vector(self.x, b.add(x0, off), sx_k, k.contiguous) for off in x_offsets
            ]
            for r in range(rows):
                av = self._load_vector(self.a, b.add(row_at[r], at), None, True)
                for j in range(width):
                    acc = accs[r * width + j]
                    b.store(b.call(self.vfma, [av, xs[j], b.load(acc)]), acc)
            b.store(b.add(at, c(lanes)), a_at)
            b.store(b.add(x0, x_step), x_at)
        with self.loop(b.mul(vectors, c(lanes)), p["depth"], "k") as kk:
            xs = [b.load(self._at(self.x, b.add(x, b.mul(kk, sx_k)))) for x in col_at]
            for r in range(rows):
                a = b.load(self._at(self.a, b.add(row_at[r], kk)))
                for j in range(width):
                    acc = sums[r * width + j]
                    b.store(b.call(self.sfma, [a, xs[j], b.load(acc)]), acc)
        for r in range(rows):
            for j in range(width):
                i = r * width + j
                value = b.fadd(self._lane_sum(b.load(accs[i])), b.load(sums[i]))
                at = b.add(y_cols[j], b.mul(c(r), p["y_r"]))
                b.store(value, self._at(self.y, at))

    # -- columns order: rows contiguous ----------------------------------------------------
    def _columns_block(self, a0, col_at, y_cols, vectors: int) -> None:
        """`vectors` vectors of adjacent rows from a0 times the chunk's columns: a vector
        accumulator per (vector, column) over the whole of k, x[j, k] broadcast."""
        b, k, c, p = self.b, self.k, self.c, self.p
        width, lanes = len(col_at), k.lanes
        accs = self._zeroed(self.vty, vectors * width, "acc")
        sa_k, sx_k = p["a_k"], p["x_k"]
        a_at, x_at = self._running(a0), self._running(col_at[0])
        x_offsets = [b.sub(x, col_at[0]) for x in col_at]  # x_c apart
        with self.loop(c(0), p["depth"], "k", unroll=UNROLL):
            at, x0 = b.load(a_at), b.load(x_at)

            def matrix(q: int):
                return self._load_vector(self.a, b.add(at, c(q * lanes)), None, True)

            def broadcast(j: int):
                return self._splat(b.load(self._at(self.x, b.add(x0, x_offsets[j]))))

            # the operand with fewer vectors is loaded first, the other one vector at a
            # time: G x J accumulators + min(G, J) + 1 registers (16 for 4 x 3 and 3 x 4)
            if vectors <= width:
                avs = [matrix(q) for q in range(vectors)]
                for j in range(width):
                    xv = broadcast(j)
                    for q in range(vectors):
                        acc = accs[q * width + j]
                        b.store(b.call(self.vfma, [avs[q], xv, b.load(acc)]), acc)
            else:
                xvs = [broadcast(j) for j in range(width)]
                for q in range(vectors):
                    av = matrix(q)
                    for j in range(width):
                        acc = accs[q * width + j]
                        b.store(b.call(self.vfma, [av, xvs[j], b.load(acc)]), acc)
            b.store(b.add(at, sa_k), a_at)
            b.store(b.add(x0, sx_k), x_at)
        for j in range(width):
            for q in range(vectors):
                at = b.add(y_cols[j], b.mul(c(q * lanes), p["y_r"]))
                self._store_vector(b.load(accs[q * width + j]), at, p["y_r"], k.contiguous)

    def _columns_single(self, a0, col_at, y_cols) -> None:
        """One row times the chunk's columns: a scalar chain per column over k."""
        b, p = self.b, self.p
        sums = self._zeroed(self.scalar, len(col_at), "sum")
        with self.loop(self.c(0), p["depth"], "k") as kk:
            a = b.load(self._at(self.a, b.add(a0, b.mul(kk, p["a_k"]))))
            for j, x in enumerate(col_at):
                xs = b.load(self._at(self.x, b.add(x, b.mul(kk, p["x_k"]))))
                b.store(b.call(self.sfma, [a, xs, b.load(sums[j])]), sums[j])
        for j, y in enumerate(y_cols):
            b.store(b.load(sums[j]), self._at(self.y, y))


def emit_small_gemm(kernel: SmallGemmKernel, flush_denormals: bool = True) -> str:
    """The LLVM IR of library kernel `kernel`, its function named SYMBOL. Its pointer
    arguments are (out, matrix, vector, params): the caller passes the dot's operands in
    that order (the matrix first, whichever operand of the dot it is)."""
    return _SmallGemmEmitter(kernel, flush_denormals).emit_ir()
