# One-operand scatter as a native kernel: a serial loop over the updates in row-major order of
# the update tensor, the order the interpreter applies them in, so every output element sees
# the same combiner calls in the same order and results match the interpreter bit for bit.
#
# The kernel is `void f(i8* out, i8* operand, i8* indices, i8* updates, i64 start, i64 end)`
# with an outer extent of 1 (a thunk never splits it: the updates must run in order). Unless
# buffer assignment gave the output the operand's bytes (the in-place variant, which reads the
# operand through the output pointer and ignores its own argument), it first copies the
# operand into the output. Then it opens one loop per update dimension, outermost first. Once
# the scatter (non-window) dimensions are all fixed, it reads the index vector, builds the
# operand start of the window (index components where scatter_dims_to_operand_dims sends them,
# the scatter position's own coordinate on operand batching dimensions, 0 elsewhere) and skips
# the whole window when any part of it would fall outside the operand (XLA's rule, as the
# interpreter applies it). Each window element then becomes
# `out[start + offset] = to_apply(out[start + offset], update)`, the combiner inlined by the
# elemental emitter. Window elements of one update never alias each other, so the innermost
# loop over a contiguous window dimension vectorizes.
#
# Runs of updates into one window (segment sums over sorted ids) would chain every combine
# through a store and a reload of the same output bytes. When the window dims are minor to
# all scatter dims and the window is small, the kernel instead keeps the current window in
# an aligned stack buffer (which LLVM turns into registers): it loads the window when the
# target changes, writing the previous one back first, and writes the last one back at the
# end. The combines and their order are the same, so the results are too.
#
# Anything else (several operands, a combiner or element type the emitter cannot lower,
# operand and output in different layouts) returns None and keeps the library path.

from __future__ import annotations

import math

from llvmlite import ir

from xlapy.backends.cpu.codegen.common import (
    I1,
    I8,
    I64,
    SYMBOL,
    KernelSpec,
    mem_type,
    physical_dims,
    physical_strides,
    reg_type,
)
from xlapy.backends.cpu.codegen.emitter import KernelEmitter, supported
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.opcodes import Opcode
from xlapy.ir.shapes import Shape
from xlapy.ir.types import PrimitiveType

P = PrimitiveType
_INT64_MAX = (1 << 63) - 1
_ACC_BYTES = 1024
"""Windows up to this size accumulate on the stack while consecutive updates hit them."""


def _plain(shape: Shape) -> bool:
    layout = shape.layout
    return shape.is_array and not shape.is_dynamic and not (layout is not None and layout.tiles)


class _ScatterEmitter(KernelEmitter):
    """Emits the scatter loop of one instruction; the combiner goes through call_scalar."""

    def __init__(self, instr: HloInstruction, in_place: bool, flush_denormals: bool):
        self.instr = instr
        self.combiner = instr.to_apply
        super().__init__(self.combiner, SYMBOL, ((0, 0),) if in_place else (), flush_denormals)
        operand, indices, updates = instr.operands
        self.operand, self.indices, self.updates = operand.shape, indices.shape, updates.shape
        a = instr.scatter_dimension_numbers
        self.index_map = a.scatter_dims_to_operand_dims
        self.window_dims = a.update_window_dims
        inserted = set(a.inserted_window_dims)
        batching = a.input_batching_dims
        indices_batching = a.scatter_indices_batching_dims
        self.ivd = a.index_vector_dim
        rank = self.operand.rank
        window_operand = [d for d in range(rank) if d not in inserted and d not in batching]
        self.scatter_positions = [d for d in range(self.updates.rank) if d not in self.window_dims]
        # operand dim -> update dim whose loop variable is its window offset
        self.window_of = dict(zip(window_operand, self.window_dims, strict=True))
        # operand batching dim -> update dim whose loop variable is its start
        self.batch_of = {}
        for od, idim in zip(batching, indices_batching, strict=True):
            axis = idim if idim < self.ivd else idim - 1
            self.batch_of[od] = self.scatter_positions[axis]
        self.extent = [1] * rank
        for od, ud in self.window_of.items():
            self.extent[od] = self.updates.dims[ud]

    def emit(self) -> KernelSpec:
        names = ("out", "operand", "indices", "updates")
        fn, body = self.begin_function(names, {1} if self.in_place else set())
        t = self.operand.element_type
        self.out_ptr = self.b.bitcast(fn.args[0], mem_type(t).as_pointer())
        self.idx_ptr = self.b.bitcast(fn.args[2], mem_type(self.indices.element_type).as_pointer())
        self.upd_ptr = self.b.bitcast(fn.args[3], mem_type(t).as_pointer())
        self.update_index: list = [None] * self.updates.rank
        self.acc = self._accumulator()
        with self.loop(fn.args[4], fn.args[5], "once"):
            if not self.in_place:
                self._copy_operand(fn.args[0], fn.args[1])
            if self.acc is None:
                self._nest(0, None)
            else:
                self.b.store(ir.Constant(I64, -1), self.pending)
                self._nest(0, None)
                self._flush_pending()
        self.end_function(body)
        return KernelSpec(
            self.name,
            str(self.module),
            (self.instr.shape,),
            tuple(o.shape for o in self.instr.operands),
            1,
            self.in_place,
        )

    def _copy_operand(self, dst, src) -> None:
        size = self.operand.num_elements * self.operand.dtype.itemsize
        memcpy = self.module.declare_intrinsic(
            "llvm.memcpy", [I8.as_pointer(), I8.as_pointer(), I64]
        )
        self.b.call(memcpy, [dst, src, ir.Constant(I64, size), ir.Constant(I1, 0)])

    def _accumulator(self):
        """The stack buffer windows accumulate in, when every window dim of the update is
        minor to every scatter dim and the window is small; else None."""
        window, scatter = self.window_dims, self.scatter_positions
        if window and scatter and max(scatter) > min(window):
            return None
        size = math.prod(self.updates.dims[d] for d in window)
        if not 0 < size * self.operand.dtype.itemsize <= _ACC_BYTES:
            return None
        self.pending = self.alloca(I64, "pending")
        acc = self.alloca(ir.ArrayType(reg_type(self.operand.element_type), size), "acc")
        acc.align = 64
        return acc

    def _nest(self, level: int, base) -> None:
        """Loops over update dims `level`.. ; `base` is the window start's offset in the
        output once every scatter dim is fixed (None before)."""
        if base is None and all(self.update_index[d] is not None for d in self.scatter_positions):
            base, inside = self._window_start()
            with self.b.if_then(inside):
                if self.acc is None:
                    self._nest(level, base)
                else:
                    self._switch_to(base)
                    self._over_window(self._accumulate)
            return
        if level == self.updates.rank:
            self._combine(base)
            return
        size = ir.Constant(I64, self.updates.dims[level])
        with self.loop(ir.Constant(I64, 0), size, f"u{level}") as i:
            self.update_index[level] = i
            self._nest(level + 1, base)
        self.update_index[level] = None

    def _over_window(self, body) -> None:
        """Loops over the window dims; body(offset from the window start in the output,
        element number in the accumulator)."""
        b = self.b
        strides = physical_strides(self.instr.shape)
        operand_of = {ud: od for od, ud in self.window_of.items()}

        def nest(k: int, rel, w):
            if k == len(self.window_dims):
                body(rel, w)
                return
            ud = self.window_dims[k]
            size = ir.Constant(I64, self.updates.dims[ud])
            with self.loop(ir.Constant(I64, 0), size, f"w{ud}") as i:
                self.update_index[ud] = i
                step = b.mul(i, ir.Constant(I64, strides[operand_of[ud]]))
                nest(k + 1, b.add(rel, step), b.add(b.mul(w, size), i))
            self.update_index[ud] = None

        nest(0, ir.Constant(I64, 0), ir.Constant(I64, 0))

    def _acc_at(self, w):
        return self.b.gep(self.acc, [ir.Constant(I64, 0), w], True)

    def _switch_to(self, base) -> None:
        """Make the accumulator hold the window at `base`, writing back the one it held."""
        b = self.b
        t = self.operand.element_type
        held = b.load(self.pending)
        with b.if_then(b.icmp_signed("!=", held, base)):
            self._flush_pending()

            def fill(rel, w):
                value = b.load(b.gep(self.out_ptr, [b.add(base, rel)], True))
                b.store(self.from_mem(value, t), self._acc_at(w))

            self._over_window(fill)
            b.store(base, self.pending)

    def _flush_pending(self) -> None:
        b = self.b
        t = self.operand.element_type
        held = b.load(self.pending)

        def flush(rel, w):
            target = b.gep(self.out_ptr, [b.add(held, rel)], True)
            b.store(self.to_mem(b.load(self._acc_at(w)), t), target)

        with b.if_then(b.icmp_signed(">=", held, ir.Constant(I64, 0))):
            self._over_window(flush)

    def _accumulate(self, rel, w) -> None:
        b = self.b
        t = self.operand.element_type
        upd_at = self.offset(self.updates, tuple(self.update_index))
        update = self.from_mem(b.load(b.gep(self.upd_ptr, [upd_at], True)), t)
        slot = self._acc_at(w)
        b.store(self.call_scalar(self.combiner, [b.load(slot), update]), slot)

    def _index_component(self, k: int):
        """Component k of the current scatter position's index vector, as i64 (unsigned
        values past the int64 range saturate, as the interpreter's conversion does)."""
        where = [self.update_index[d] for d in self.scatter_positions]
        if self.ivd < self.indices.rank:
            where.insert(self.ivd, ir.Constant(I64, k))
        t = self.indices.element_type
        ptr = self.b.gep(self.idx_ptr, [self.offset(self.indices, tuple(where))], True)
        v = self.b.load(ptr)
        if t.bits < 64:
            return self.b.zext(v, I64) if t.is_unsigned_integral else self.b.sext(v, I64)
        if t.is_unsigned_integral:
            negative = self.b.icmp_signed("<", v, ir.Constant(I64, 0))
            return self.b.select(negative, ir.Constant(I64, _INT64_MAX), v)
        return v

    def _window_start(self):
        """(offset of the window's first element in the output, whether it lies inside)."""
        b = self.b
        dims = self.operand.dims
        starts: dict[int, object] = {}
        for k, d in enumerate(self.index_map):
            starts[d] = self._index_component(k)
        for d, ud in self.batch_of.items():
            starts[d] = self.update_index[ud]
        static_ok = all(self.extent[d] <= dims[d] for d in range(len(dims)) if d not in starts)
        inside = ir.Constant(I1, int(static_ok))
        for d, s in starts.items():
            ok = b.and_(
                b.icmp_signed(">=", s, ir.Constant(I64, 0)),
                b.icmp_signed("<=", s, ir.Constant(I64, dims[d] - self.extent[d])),
            )
            inside = b.and_(inside, ok)
        strides = physical_strides(self.instr.shape)
        base = ir.Constant(I64, 0)
        for d, s in starts.items():
            base = b.add(base, b.mul(s, ir.Constant(I64, strides[d])))
        return base, inside

    def _combine(self, base) -> None:
        b = self.b
        t = self.operand.element_type
        offset = base
        for od, ud in self.window_of.items():
            stride = physical_strides(self.instr.shape)[od]
            offset = b.add(offset, b.mul(self.update_index[ud], ir.Constant(I64, stride)))
        target = b.gep(self.out_ptr, [offset], True)
        upd_at = self.offset(self.updates, tuple(self.update_index))
        update = self.from_mem(b.load(b.gep(self.upd_ptr, [upd_at], True)), t)
        current = self.from_mem(b.load(target), t)
        result = self.call_scalar(self.combiner, [current, update])
        b.store(self.to_mem(result, t), target)


def scatter_reason(instr: HloInstruction) -> str | None:
    """None when `instr` can run as a native scatter kernel, else why not."""
    if instr.opcode is not Opcode.SCATTER or len(instr.operands) != 3:
        return "not a one-operand scatter"
    operand, indices, updates = (o.shape for o in instr.operands)
    out = instr.shape
    if not all(_plain(s) for s in (out, operand, indices, updates)):
        return "a tuple, dynamic or tiled shape"
    t = out.element_type
    if operand.element_type is not t or updates.element_type is not t:
        return "operand, updates and result differ in element type"
    if operand.dims != out.dims or physical_dims(operand) != physical_dims(out):
        return "operand and result differ in layout"
    if operand.layout_or_default.minor_to_major != out.layout_or_default.minor_to_major:
        return "operand and result differ in layout"
    it = indices.element_type
    if not it.is_integral or it is P.PRED:
        return f"index type {it}"
    comp = instr.to_apply_or_none
    if comp is None or comp.num_parameters != 2 or not comp.root_instruction().shape.is_array:
        return "the combiner is not a two-parameter scalar computation"
    shapes = [comp.parameter(0).shape, comp.parameter(1).shape, comp.root_instruction().shape]
    if any(s.rank != 0 or s.element_type is not t for s in shapes):
        return "the combiner's types differ from the operand's"
    why = supported(comp)
    if why is not None:
        return why
    a = instr.scatter_dimension_numbers
    index_map = a.scatter_dims_to_operand_dims
    batching = a.input_batching_dims
    inserted = a.inserted_window_dims
    window_dims = a.update_window_dims
    ivd = a.index_vector_dim
    rank = operand.rank
    if len(set(index_map) | set(batching)) != len(index_map) + len(batching):
        return "an operand dim is both indexed and batched, or indexed twice"
    if any(not 0 <= d < rank for d in (*index_map, *batching, *inserted)):
        return "dimension numbers out of range"
    if list(window_dims) != sorted(set(window_dims)) or any(
        not 0 <= d < updates.rank for d in window_dims
    ):
        return "update_window_dims out of range or unsorted"
    window_operand = [d for d in range(rank) if d not in inserted and d not in batching]
    batch_rank = indices.rank - (1 if ivd < indices.rank else 0)
    if len(window_operand) != len(window_dims) or updates.rank - len(window_dims) != batch_rank:
        return "updates do not match the window and scatter dimensions"
    k = indices.dims[ivd] if ivd < indices.rank else 1
    if k != len(index_map):
        return "index vectors do not match scatter_dims_to_operand_dims"
    batch_dims = [d for d in range(indices.rank) if d != ivd]
    scatter_positions = [d for d in range(updates.rank) if d not in window_dims]
    for p, d in zip(scatter_positions, batch_dims, strict=True):
        if updates.dims[p] != indices.dims[d]:
            return "updates and indices differ in their scatter dims"
    indices_batching = a.scatter_indices_batching_dims
    if len(indices_batching) != len(batching) or ivd in indices_batching:
        return "batching dims do not pair up"
    for od, idim in zip(batching, indices_batching, strict=True):
        if not 0 <= idim < indices.rank or indices.dims[idim] != operand.dims[od]:
            return "batching dims do not pair up"
    return None


def emit_scatter(
    instr: HloInstruction, in_place: bool = False, flush_denormals: bool = True
) -> KernelSpec:
    """The LLVM IR of `instr`'s scatter kernel (see the file comment); `in_place` for the
    variant whose output is the operand's bytes; `flush_denormals` as the other kernels
    (emitter.denormals_flushed: the program's `denormals` option). The caller has checked
    scatter_reason."""
    return _ScatterEmitter(instr, in_place, flush_denormals).emit()
