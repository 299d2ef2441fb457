# HLO -> LLVM IR for one kernel: a fused computation, or one elementwise / shape / reduce
# instruction wrapped as a computation.
#
# The kernel is `void name(i8* noalias out0, ..., i8* noalias in0, ..., i64 start, i64 end)`:
# output leaves first (in pre-order), then the parameters; [start, end) is a range of the
# outermost (most major) output dimension, so a thunk executor can split the work into
# chunks. The body is a loop nest over the output in its layout's major-to-minor order, the
# innermost loop running over the physically contiguous dimension. Where the outermost
# dimension is short (a [4, 128, 512] batch), it and the next ones make one range
# (`_merged_dims`, MERGE_EXTENT): [start, end) counts their index tuples in layout order,
# each step dividing its count apart, so the kernel splits 512 ways, not 4 (XLA's
# ShapePartitionAssigner partitions several outer dims for the same reason). Every output
# element is computed by one step, the same way whatever the split: blocks write disjoint
# elements and give the same bits as a whole run.
#
# In-place variants: a caller whose output i and input j are the same bytes asks for
# `in_place=((i, j),)`. The kernel then reads parameter j through output i's pointer, so every
# access to that memory is based on one pointer (LLVM sees the load and store of each element
# in the same iteration and still vectorizes, no runtime overlap checks), and input j's
# argument is ignored. This is valid only when the kernel reads parameter j at exactly the
# index it writes output i (elementwise paths from the root, equal dims and layout, equal
# element size): `in_place_reason` checks it. All outputs of an element are computed before
# any is stored, so a later output never sees an earlier one's store.
#
# Values are produced "elementally", as XLA's elemental emitter does: gen(instr, index)
# returns the LLVM value of `instr` at a logical multi-index (one i64 per dimension). Shape
# ops map the index to their operand's index; parameters and array constants load from memory
# at the physical offset their layout gives; a reduce opens its own loops over the reduced
# dimensions at the point it is asked for. Results are memoized per (instruction, index) in
# a stack of scopes, so a value is reused only where it dominates.
#
# Element types in registers: pred is i1, integers iN, f16/bf16/f32 are float (f16 and bf16
# results are rounded to their type after every op), f64 is double. Float arithmetic carries
# no fast-math flags except `reassoc` on reduction accumulators: simple reducers (add, mul,
# max, min, and, or) sum blocks of the innermost reduced dimension into a partial result
# (which LLVM vectorizes into several vector accumulators) and add the partials to the
# total, so float32 sums do not degrade like one long serial chain.
#
# Loops: a loop with another loop inside carries `llvm.loop.unroll.disable`. LLVM's O3
# pipeline otherwise fully unrolls an outer loop of constant trip count, a copy of the
# (vectorized, often itself unrolled) inner loop per iteration: a dynamic-update-slice kernel
# of 16 x 160 elements cost 0.8 s of LLVM and 14 KB of code, 41 ms and 2.2 KB without; the
# innermost loops, where unrolling pays, keep LLVM's judgement. In a nest over an output
# whose minor dimension runs at least 8 elements (SLP_MINOR), the loops around the minor
# loop also carry `llvm.loop.vectorize.width 1`: a short minor loop (37 elements) is fully
# unrolled by LLVM, and its loop vectorizer then vectorized the loop around it, four rows at
# a time with a gather and a scatter per element (41 KB of optimized IR, 0.4 s of LLVM in
# loop-load elimination over the 148 loads); without it, the SLP vectorizer makes vectors of
# the unrolled row (4 x 8 + 4 + 1 elements, 4 KB, 50 ms). Shorter minor runs leave the
# loop around them to the loop vectorizer (there the row makes no full vector).
#
# Subnormals: like XLA:CPU, kernels flush them to zero by default (flush_denormals=True): on
# x86 the kernel sets the MXCSR's flush-to-zero and denormals-are-zero bits on entry and
# restores the caller's MXCSR on exit (constants LLVM folds at compile time are folded in
# IEEE arithmetic, as XLA folds them). With flush_denormals=False (backend option
# `denormals="ieee"`) kernels keep IEEE subnormals. Other architectures keep them too.
# Reading and writing the MXCSR costs ~25 ns a call on the machines measured, more than a
# small kernel's work: a caller that has set the flush mode itself (a native while loop,
# codegen/emit_loop.py) passes the bitwise complement of `end` (a negative number, which no
# other caller passes), and the kernel leaves the MXCSR alone (understands_flushed_end):
# the body is emitted with `end` and its uses then read the decoded value (one function: a
# wrapper function around the body cost cold compiles 12% more LLVM time, inlined 30%).
# Only kernels of while loops are made so (FLUSH_IN_LOOP, the lowering's choice): the test
# still costs ~10% more LLVM time on small kernels.

from __future__ import annotations

import os
import platform
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from llvmlite import ir

from xlapy.backends.cpu.codegen import elemental
from xlapy.backends.cpu.codegen.common import (
    EMIT_RULES,
    F8_TYPES,
    F16,
    F32,
    I1,
    I8,
    I16,
    I32,
    I64,
    Index,
    KernelSpec,
    P,
    UnsupportedForCodegen,
    check_type,
    mem_type,
    physical_strides,
    reduce_hero,
    reg_type,
)
from xlapy.backends.cpu.codegen.complex import Complex, complex_reason
from xlapy.backends.cpu.codegen.f8 import f8_to_f32, f32_to_f8
from xlapy.backends.cpu.codegen.ir_release import released_text
from xlapy.backends.cpu.codegen.math import MathEmitter
from xlapy.errors import XlapyError
from xlapy.ir.computation import HloComputation
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.opcodes import Opcode
from xlapy.ir.shapes import Shape
from xlapy.ir.types import PrimitiveType


def supported(comp: HloComputation) -> str | None:
    """None when `comp` can be emitted, else the reason it cannot (without emitting)."""
    try:
        _precheck(comp)
    except UnsupportedForCodegen as e:
        return str(e)
    return None


def _precheck(comp: HloComputation) -> None:
    for instr in comp.instructions:
        if instr.opcode not in EMIT_RULES and instr.opcode is not Opcode.PARAMETER:
            raise UnsupportedForCodegen(
                f"{instr.name}: the CPU emitter has no rule for '{instr.opcode.text}'"
            )
        check_type(instr, instr.shape)
        reason = complex_reason(instr)
        if reason is not None:
            raise UnsupportedForCodegen(reason)
        for sub in instr.called_computations():
            _precheck(sub)
    root = comp.root_instruction()
    leaves = root.operands if root.opcode is Opcode.TUPLE else [root]
    if root.opcode is Opcode.TUPLE and not leaves:
        raise UnsupportedForCodegen(f"{root.name}: an empty tuple root has nothing to compute")
    hero = reduce_hero(leaves)
    first = hero.shape if hero is not None else leaves[0].shape
    dims = first.tuple_shapes[0].dims if first.is_tuple and first.tuple_shapes else first.dims
    for leaf in leaves:
        if leaf.shape.is_tuple and leaf.opcode is not Opcode.REDUCE:
            raise UnsupportedForCodegen(f"{leaf.name}: nested tuple outputs are not supported")
        if _over_input(hero, leaf):
            if _reaches_reduce(leaf):
                raise UnsupportedForCodegen(
                    f"{leaf.name}: an output over a reduction's input may not use a reduction"
                )
            continue
        shapes = leaf.shape.tuple_shapes if leaf.shape.is_tuple else (leaf.shape,)
        if any(s.dims != dims for s in shapes):
            raise UnsupportedForCodegen(
                f"{root.name}: multi-output roots need equal dimensions, got "
                f"{', '.join(str(s) for s in shapes)} and {dims}"
            )


def _over_input(hero: HloInstruction | None, leaf: HloInstruction) -> bool:
    return (
        hero is not None
        and leaf.opcode is not Opcode.REDUCE
        and leaf.shape.is_array
        and leaf.shape.dims == hero.operands[0].shape.dims
    )


def _reaches_reduce(instr: HloInstruction) -> bool:
    stack, seen = [instr], set()
    while stack:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if x.opcode is Opcode.REDUCE:
            return True
        stack.extend(x.operands)
    return False


DENORMALS = ("flush", "ieee")
DENORMALS_ENV = "XLAPY_CPU_DENORMALS"


def denormals_flushed(options: Mapping[str, Any]) -> bool:
    """Whether kernels flush subnormals to zero: backend option `denormals`, else
    $XLAPY_CPU_DENORMALS, else "flush" (what XLA:CPU does; "ieee" keeps them)."""
    mode = str(options.get("denormals") or os.environ.get(DENORMALS_ENV) or "flush").lower()
    if mode not in DENORMALS:
        raise XlapyError(f"denormals must be one of {', '.join(DENORMALS)}, got {mode!r}")
    return mode == "flush"


MXCSR_FLUSH = 0x8040
"""The MXCSR's flush-to-zero (bit 15) and denormals-are-zero (bit 6) bits."""


FLUSH_IN_LOOP = 2
"""The `flush_denormals` of a kernel of a while loop's body or condition: it flushes, and
on x86 takes an `end` below zero as `~end` with the MXCSR already flushing (see the top of
the file). Only such kernels carry the test: it costs ~10% more LLVM time on small kernels."""


def understands_flushed_end(flush_denormals: int) -> bool:
    """Whether a kernel made by KernelEmitter with `flush_denormals` takes an `end` below
    zero as `~end` with the MXCSR already flushing: one of a loop (FLUSH_IN_LOOP) on x86."""
    return flush_denormals == FLUSH_IN_LOOP and _X86


_X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


def emit_kernel(
    comp: HloComputation,
    name: str = "xla_kernel",
    in_place: Sequence[tuple[int, int]] = (),
    flush_denormals: int | None = None,
    checked: bool = False,
) -> KernelSpec:
    """Lower `comp` to an LLVM module holding one kernel function (see the file comment).
    `in_place` lists (output leaf, parameter) pairs the caller will pass the same bytes for.
    `checked`: the caller found `supported(comp)` None and `in_place_reason` None for every
    pair, so they are not asked again.

    Raises UnsupportedForCodegen when an instruction or element type has no lowering, or an
    in-place pair is not safe (see `in_place_reason`).
    """
    pairs = tuple(sorted({(int(o), int(i)) for o, i in in_place}))
    if not checked:
        _precheck(comp)
        for out, param in pairs:
            why = in_place_reason(comp, out, param)
            if why is not None:
                raise UnsupportedForCodegen(why)
    if flush_denormals is None:
        flush_denormals = denormals_flushed({})
    return KernelEmitter(comp, name, pairs, flush_denormals).emit()


def outer_extent_of(comp: HloComputation, in_place: tuple[tuple[int, int], ...] = ()) -> int:
    """The outer extent of `comp`'s kernel (KernelSpec.outer_extent), without emitting it."""
    return KernelEmitter(comp, "xla_kernel", in_place).outer_extent()


def output_leaves(comp: HloComputation) -> list[tuple[HloInstruction, int | None, Shape]]:
    """The kernel outputs of `comp` in pre-order: (instruction, tuple element or None, shape)."""
    root = comp.root_instruction()
    leaves = root.operands if root.opcode is Opcode.TUPLE else [root]
    out: list[tuple[HloInstruction, int | None, Shape]] = []
    for leaf in leaves:
        if leaf.shape.is_tuple:
            out.extend((leaf, i, s) for i, s in enumerate(leaf.shape.tuple_shapes))
        else:
            out.append((leaf, None, leaf.shape))
    return out


_LINEAR_MOVES = (Opcode.RESHAPE, Opcode.BITCAST)


def _same_linear_order(a: Shape, b: Shape) -> bool:
    """Whether arrays of shapes `a` and `b` hold each element at the same byte: row-major
    both, the same element count and size (a reshape or bitcast between them moves no
    element, so [3,16] and [3,16,1] can share their bytes in place)."""
    return (
        a.is_array
        and b.is_array
        and a.num_elements == b.num_elements
        and a.dtype.itemsize == b.dtype.itemsize
        and a.layout_or_default.is_default
        and b.layout_or_default.is_default
    )


def in_place_reason(comp: HloComputation, out: int, param: int) -> str | None:
    """None when output leaf `out` of `comp` may share its bytes with parameter `param`
    (the kernel reads that parameter only at the index it writes, through elementwise ops),
    else why not."""
    leaves = output_leaves(comp)
    if not 0 <= out < len(leaves) or not 0 <= param < comp.num_parameters:
        return f"{comp.name}: no output {out} or parameter {param}"
    target = comp.parameter(param)
    oshape, pshape = leaves[out][2], target.shape
    same_layout = (
        pshape.is_array
        and pshape.layout_or_default.minor_to_major == oshape.layout_or_default.minor_to_major
    )
    alike = (same_layout and pshape.dims == oshape.dims) or _same_linear_order(pshape, oshape)
    if not alike or pshape.dtype.itemsize != oshape.dtype.itemsize:
        return f"{comp.name}: parameter {param} ({pshape}) is not laid out like output {out}"
    seen: set[tuple[int, bool]] = set()
    stack = [(leaf, element is None) for leaf, element, _ in leaves]
    while stack:
        instr, same = stack.pop()
        if (id(instr), same) in seen:
            continue
        seen.add((id(instr), same))
        if instr is target:
            if not same:
                return f"{comp.name}: parameter {param} is read at other indices than written"
            continue
        if instr.opcode.is_elementwise and same:
            stack.extend((o, o.shape.dims == instr.shape.dims) for o in instr.operands)
        elif instr.opcode in _LINEAR_MOVES and same:
            operand = instr.operands[0]
            stack.append((operand, _same_linear_order(operand.shape, instr.shape)))
        elif instr.opcode is Opcode.DYNAMIC_UPDATE_SLICE and same:
            stack.append((instr.operands[0], True))
            stack.extend((o, False) for o in instr.operands[1:])
        else:
            stack.extend((o, False) for o in instr.operands)
    return None


class KernelEmitter:
    """Builds the LLVM IR of one kernel; rules in EMIT_RULES call back into it."""

    unroll_outer_loops = False
    """Whether LLVM may unroll loops that hold loops (see the top of the file): an emitter
    whose loop nest counts on it (independent chains interleaved by unrolling) says so."""

    def __init__(
        self, comp: HloComputation, name: str, in_place: tuple = (), flush_denormals: int = True
    ):
        self.comp = comp
        self.name = name
        self.in_place = in_place
        self.flush_denormals = flush_denormals
        self.module = ir.Module(name=name)
        self.math = MathEmitter(self.module)
        self.scopes: list[dict] = [{}]
        self.open_loops: list[_Loop] = []
        self.param_ptrs: dict[int, ir.Value] = {}
        self.scalar_env: list[dict[int, object]] = []
        self._globals = 0
        self.out_leaves = output_leaves(comp)
        self.params = comp.parameters
        self.hero = reduce_hero([leaf for leaf, _, _ in self.out_leaves])
        self.input_outputs = tuple(
            k for k, (leaf, _, _) in enumerate(self.out_leaves) if _over_input(self.hero, leaf)
        )
        self.out_ptrs: list = []
        self.flat: Index | None = None  # the index of a flat loop (see _flat_elementwise)

    # -- the function --------------------------------------------------------------------
    def begin_function(self, names: Sequence[str], aliased: set[int]):
        """Start the kernel function `void f(i8* names..., i64 start, i64 end)`: pointers
        are noalias except those in `aliased` (read through another pointer); returns the
        function and its body block. Allocas go to the entry block, which `end_function`
        closes."""
        fnty = ir.FunctionType(ir.VoidType(), [I8.as_pointer()] * len(names) + [I64, I64])
        fn = ir.Function(self.module, fnty, self.name)
        for i, (arg, name) in enumerate(zip(fn.args, names, strict=False)):
            arg.name = name
            if i not in aliased:
                arg.add_attribute("noalias")
        fn.attributes.add("nounwind")
        self.fn = fn
        self.alloca_builder = ir.IRBuilder(fn.append_basic_block("entry"))
        body = fn.append_basic_block("body")
        self.b = ir.IRBuilder(body)
        self.math.b = self.b
        self._saved_mxcsr: ir.Value | None = None
        if self.flush_denormals and not understands_flushed_end(self.flush_denormals):
            self._flush_denormals_on_entry()
        return fn, body

    def end_function(self, body) -> None:
        if understands_flushed_end(self.flush_denormals):
            self._flush_denormals(body)
            return
        if self._saved_mxcsr is not None:  # the caller's floating-point mode again
            self.b.call(self._mxcsr_intrinsic("ldmxcsr"), [self._saved_mxcsr])
        self.b.ret_void()
        self.alloca_builder.branch(body)

    def _flush_denormals_on_entry(self) -> None:
        """On x86, set the MXCSR's FTZ and DAZ bits for the kernel's run (the caller's MXCSR
        is saved here and restored in end_function)."""
        if not _X86:
            return
        b = self.alloca_builder
        saved = b.alloca(I32, name="mxcsr.saved")
        flushing = b.alloca(I32, name="mxcsr.flush")
        saved_ptr = b.bitcast(saved, I8.as_pointer())
        flushing_ptr = b.bitcast(flushing, I8.as_pointer())
        b.call(self._mxcsr_intrinsic("stmxcsr"), [saved_ptr])
        b.store(b.or_(b.load(saved), ir.Constant(I32, MXCSR_FLUSH)), flushing)
        b.call(self._mxcsr_intrinsic("ldmxcsr"), [flushing_ptr])
        self._saved_mxcsr = saved_ptr

    def _flush_denormals(self, body) -> None:
        """Close the kernel with the MXCSR work of a flushing kernel on x86: set the FTZ and
        DAZ bits on entry and restore the caller's MXCSR on exit, unless `end` is negative
        (understands_flushed_end): then the MXCSR is left alone and the body, emitted with
        `end`, runs on `~end` instead."""
        b, end = self.alloca_builder, self.fn.args[-1]
        saved = b.alloca(I32, name="mxcsr.saved")
        flushing = b.alloca(I32, name="mxcsr.flush")
        saved_ptr = b.bitcast(saved, I8.as_pointer())
        flushing_ptr = b.bitcast(flushing, I8.as_pointer())
        preset = b.icmp_signed("<", end, ir.Constant(I64, 0), name="mxcsr.preset")
        flipped = b.not_(end)
        real_end = b.select(preset, flipped, end, name="end.real")
        for block in self.fn.blocks:
            for instruction in block.instructions:
                if instruction not in (preset, flipped, real_end):
                    instruction.replace_usage(end, real_end)
        flush = self.fn.append_basic_block("mxcsr.flush")
        b.cbranch(preset, body, flush)
        fb = ir.IRBuilder(flush)
        fb.call(self._mxcsr_intrinsic("stmxcsr"), [saved_ptr])
        fb.store(fb.or_(fb.load(saved), ir.Constant(I32, MXCSR_FLUSH)), flushing)
        fb.call(self._mxcsr_intrinsic("ldmxcsr"), [flushing_ptr])
        fb.branch(body)
        with self.b.if_then(self.b.not_(preset)):  # the caller's floating-point mode again
            self.b.call(self._mxcsr_intrinsic("ldmxcsr"), [saved_ptr])
        self.b.ret_void()

    def _mxcsr_intrinsic(self, which: str) -> ir.Function:
        name = f"llvm.x86.sse.{which}"
        if name in self.module.globals:
            return self.module.globals[name]
        return ir.Function(self.module, ir.FunctionType(ir.VoidType(), [I8.as_pointer()]), name)

    def emit(self) -> KernelSpec:
        n_ptrs = len(self.out_leaves) + len(self.params)
        names = [f"out{i}" for i in range(len(self.out_leaves))]
        names += [f"in{k}" for k in range(len(self.params))]
        unused = {len(self.out_leaves) + param for _, param in self.in_place}
        fn, body = self.begin_function(names, unused)
        out_ptrs = []
        for i, (_, _, shape) in enumerate(self.out_leaves):
            out_ptrs.append(self.b.bitcast(fn.args[i], mem_type(shape.element_type).as_pointer()))
        through = {param: out for out, param in self.in_place}
        for k, p in enumerate(self.params):
            arg = fn.args[through.get(k, len(self.out_leaves) + k)]
            self.param_ptrs[id(p)] = self.b.bitcast(
                arg, mem_type(p.shape.element_type).as_pointer()
            )
        start, end = fn.args[n_ptrs], fn.args[n_ptrs + 1]
        start.name, end.name = "start", "end"
        start, end = self._bounded_range(start, end)

        self.out_ptrs = out_ptrs
        shape0 = self.loop_shape()
        order = list(reversed(shape0.layout_or_default.minor_to_major))
        index: list = [None] * shape0.rank

        concat = self._root_concatenate()
        part: list = [None]  # (operand, offset) of the root concatenate being stored

        merged = self._merged_dims(shape0, order) if shape0.rank else 1

        def nest(level: int):
            if level == 0 and merged > 1:
                merged_loop()
                return
            if level == len(order):
                if part[0] is None:
                    self._store_outputs(tuple(index), out_ptrs)
                else:
                    op, offset = part[0]
                    self._store_concat_part(concat, op, offset, tuple(index), out_ptrs[0])
                return
            d = order[level]
            if concat is not None and d == concat.dimensions[0]:
                self._concat_loops(concat, level, start, end, index, part, nest)  # noqa: F821 (deleted after use)
                return
            lo = start if level == 0 else ir.Constant(I64, 0)
            hi = end if level == 0 else ir.Constant(I64, shape0.dims[d])
            innermost = level and level == len(order) - 1
            unroll = 1 if innermost and self._keep_minor_loop(shape0.dims[d]) else None
            across = level < len(order) - 1 and shape0.dims[order[-1]] >= SLP_MINOR
            with self.loop(lo, hi, f"d{d}", unroll=unroll, vectorize=not across) as i:
                index[d] = i
                nest(level + 1)  # noqa: F821 (deleted after use)

        def merged_loop():
            """The outer range over the first `merged` dims in layout order, each step's
            index taken apart by division (by constants: multiplies and shifts)."""
            across = merged < len(order) and shape0.dims[order[-1]] >= SLP_MINOR
            with self.loop(start, end, "merged", vectorize=not across) as flat:
                rest = flat
                for level in reversed(range(1, merged)):
                    size = ir.Constant(I64, shape0.dims[order[level]])
                    index[order[level]] = self.b.urem(rest, size)
                    rest = self.b.udiv(rest, size)
                index[order[0]] = rest
                nest(merged)  # noqa: F821 (deleted after use)

        reduces = elemental.kept_minor_reduces(self.out_leaves) if shape0.rank else None
        window = self._in_place_window() if shape0.rank else None
        if shape0.rank == 0:
            with self.loop(start, end, "once"):
                self._store_outputs((), out_ptrs)
        elif self._flat_elementwise(shape0):
            with self.loop(start, end, "flat") as i:
                self.flat = (i,) * shape0.rank
                self._store_outputs(self.flat, out_ptrs)
        elif reduces is not None:
            elemental.emit_kept_minor_reduce(self, reduces, out_ptrs, start, end)
        elif window is not None:
            self._store_window(window, order, out_ptrs[0], start, end)
        else:
            nest(0)
        del nest  # the recursive closure is a reference cycle through self (ir_release.py)
        self.end_function(body)
        return KernelSpec(
            self.name,
            released_text(self.module),
            tuple(s for _, _, s in self.out_leaves),
            tuple(p.shape for p in self.params),
            self.outer_extent(),
            self.in_place,
        )

    def _root_concatenate(self) -> HloInstruction | None:
        """The root when it is a concatenate written alone (one output, no reduce hero):
        then the loop over its dimension is one loop per operand (`_concat_loops`), each
        computing only its operand. Evaluated element by element, a concatenate computes
        every operand (and what it reads) at every element and selects one: a fusion that
        joins four gate gradients computed four times the work."""
        if self.hero is not None or len(self.out_leaves) != 1:
            return None
        leaf, element, shape = self.out_leaves[0]
        if element is not None or leaf.opcode is not Opcode.CONCATENATE or shape.rank == 0:
            return None
        return leaf

    def _concat_loops(self, concat, level: int, start, end, index: list, part: list, nest):
        """The loops over the concatenated dimension at nest `level`: one per operand over
        its own range of the output (cut to [start, end) at the outermost level)."""
        d = concat.dimensions[0]
        b = self.b
        offset = 0
        for k, op in enumerate(concat.operands):
            size = op.shape.dims[d]
            lo, hi = ir.Constant(I64, offset), ir.Constant(I64, offset + size)
            if level == 0:
                lo = b.select(b.icmp_signed(">", start, lo), start, lo)
                hi = b.select(b.icmp_signed("<", end, hi), end, hi)
            if size:
                with self.loop(lo, hi, f"c{d}.{k}") as i:
                    index[d] = i
                    part[0] = (op, offset)
                    nest(level + 1)
            offset += size
        part[0] = None

    def _store_concat_part(self, concat, op, offset: int, index, out_ptr) -> None:
        """out[index] = op[index less `offset` along the concatenated dimension]."""
        d = concat.dimensions[0]
        local = list(index)
        if offset:
            local[d] = self.b.sub(index[d], ir.Constant(I64, offset), flags=["nsw"])
        value = self.gen(op, tuple(local))
        shape = self.out_leaves[0][2]
        at = self.b.gep(out_ptr, [self.offset(shape, index)], True)
        self.b.store(self.to_mem(value, shape.element_type), at)

    def _bounded_range(self, start: ir.Value, end: ir.Value) -> tuple[ir.Value, ir.Value]:
        """[start, end), clamped to [0, 1] when the outer extent is 1 (no caller passes
        more): LLVM then knows that the outermost loop runs once at most, and does not
        vectorize, interleave and unroll it as if its one row could be any number of rows
        (a u32[1] add took 10 ms of LLVM, 2 ms bounded; the 49 kernels of extent 1 of a BERT
        training step 756 -> 490 ms; benchmarks/RESULTS.md, branch llvm3). Larger extents
        gained nothing measurable from the bound (their code grew 1-3%), so their IR is
        left as it was. The rows run in the same order: the same bits."""
        if self.outer_extent() != 1:
            return start, end
        b, zero, one = self.b, ir.Constant(I64, 0), ir.Constant(I64, 1)
        start = b.select(b.icmp_signed(">", start, zero), start, zero, name="start.in")
        end = b.select(b.icmp_signed("<", end, one), end, one, name="end.in")
        return start, end

    def outer_extent(self) -> int:
        """The size of the range [start, end) the kernel's entry point splits on: what
        `emit` lays the outermost loop over (also computed alone, without emitting, to
        check a cached kernel's signature)."""
        shape0 = self.loop_shape()
        if shape0.rank == 0:
            return 1
        order = list(reversed(shape0.layout_or_default.minor_to_major))
        if self._flat_elementwise(shape0):
            return shape0.num_elements
        if elemental.kept_minor_reduces(self.out_leaves) is not None:
            return shape0.dims[order[0]]
        window = self._in_place_window()
        if window is not None:
            return window.operands[1].shape.dims[order[0]]
        return int(np.prod([shape0.dims[d] for d in order[: self._merged_dims(shape0, order)]]))

    def _merged_dims(self, shape0: Shape, order: Sequence[int]) -> int:
        """How many dims, from the major end of the nest's layout order, make up the outer
        range [start, end): the outermost alone when it runs MERGE_EXTENT iterations or
        more, else it and the next ones until their product does (XLA's partition
        assigner cuts several outer dims the same way: a [4, 128, 512] kernel splits 512
        ways, not 4). The innermost dim stays a loop of its own, except under a reduction
        (each of its steps folds a whole reduction); a root concatenate's dim (one loop
        per operand) is not merged."""
        concat = self._root_concatenate()
        stop = concat.dimensions[0] if concat is not None else -1
        last = len(order) if self.hero is not None else len(order) - 1
        merged, extent = 1, shape0.dims[order[0]]
        if order[0] == stop:
            return 1
        while extent < MERGE_EXTENT and merged < last and order[merged] != stop:
            extent *= shape0.dims[order[merged]]
            merged += 1
        return merged

    def _keep_minor_loop(self, extent: int) -> bool:
        """Whether the nest's innermost loop, of `extent` iterations, is kept a loop
        (`llvm.loop.unroll.disable`): where the kernel pads with interior padding and the
        minor run is 8-64 elements (SHORT_MINOR, a multiple of 8). LLVM's O3 pipeline fully
        unrolls such a loop before it vectorizes, and then vectorizes the loop around it,
        whose index reaches the operand through a division: a gather per element
        (avgpool_grad's pad of an NHWC tensor with 16 features: 49 KB of optimized IR, 180
        ms of LLVM); kept, the minor run itself is vectorized (5 KB, 24 ms). Elsewhere the
        unrolled run is what LLVM's SLP vectorizer makes two full vectors of (a bias add
        over 16 features ran 1.5x slower as a loop), so it is left alone."""
        low, high = SHORT_MINOR
        if not (low <= extent <= high and extent % low == 0):
            return False
        return any(
            i.opcode is Opcode.PAD and any(interior for _, _, interior in i.padding_config.dims)
            for i in self.comp.instructions
        )

    def _flat_elementwise(self, shape0: Shape) -> bool:
        """Whether the kernel reads every array it touches at the element it writes, in the
        same layout (elementwise ops over operands laid out like the outputs, scalars
        broadcast): then it runs as one loop over the flat buffers, [start, end) a range of
        elements. A nest over the dims would leave a short innermost loop (the feature dim of
        an NHWC tensor) that LLVM unrolls fully and then vectorizes the loop around it with
        gathers and scatters."""
        if self.hero is not None or shape0.rank < 2:
            return False
        layout = shape0.layout_or_default.minor_to_major

        def alike(s: Shape) -> bool:
            if not s.is_array or s.dims != shape0.dims:
                return False
            return s.layout_or_default.minor_to_major == layout

        if not all(alike(s) for _, _, s in self.out_leaves):
            return False
        root = self.comp.root_instruction()
        for instr in self.comp.instructions:
            op, shape = instr.opcode, instr.shape
            if op is Opcode.PARAMETER:
                ok = shape.is_array and (shape.rank == 0 or alike(shape))
            elif op is Opcode.CONSTANT:
                array = None if instr.literal is None else instr.literal.array
                ok = array is not None and array.size == 1
            elif op is Opcode.BROADCAST:
                ok = instr.operands[0].shape.rank == 0 and shape.dims == shape0.dims
            elif op.is_elementwise:
                ok = shape.is_array and (shape.rank == 0 or shape.dims == shape0.dims)
            else:
                ok = op is Opcode.TUPLE and instr is root
            if not ok:
                return False
        return True

    def _in_place_window(self) -> HloInstruction | None:
        """The root dynamic-update-slice when this kernel updates its operand 0 in place
        (the output's bytes already hold it): then only the update's window is written."""
        if len(self.out_leaves) != 1 or self.out_leaves[0][1] is not None:
            return None
        root = self.out_leaves[0][0]
        if root.opcode is not Opcode.DYNAMIC_UPDATE_SLICE:
            return None
        target = root.operands[0]
        if target.opcode is not Opcode.PARAMETER or len(root.operands) != 2 + target.shape.rank:
            return None
        if (0, self.params.index(target)) not in self.in_place:
            return None
        return root

    def _store_window(self, dus: HloInstruction, order, out_ptr, start, end) -> None:
        """out[starts + u] = update[u] over the update's index space (outer range
        [start, end) of its dims in the output's layout order); the rest of the output
        keeps the operand's bytes, which it already holds."""
        update = dus.operands[1]
        out_shape = self.out_leaves[0][2]
        starts = elemental.dynamic_starts(self, dus, out_shape.dims, update.shape.dims, 2)
        index: list = [None] * out_shape.rank

        def nest(level: int):
            if level == len(order):
                value = self.gen(update, tuple(index))
                at = tuple(
                    self.b.add(i, s, flags=["nsw"]) for i, s in zip(index, starts, strict=True)
                )
                ptr = self.b.gep(out_ptr, [self.offset(out_shape, at)], True)
                self.b.store(self.to_mem(value, out_shape.element_type), ptr)
                return
            d = order[level]
            lo = start if level == 0 else ir.Constant(I64, 0)
            hi = end if level == 0 else ir.Constant(I64, update.shape.dims[d])
            with self.loop(lo, hi, f"w{d}") as i:
                index[d] = i
                nest(level + 1)  # noqa: F821 (deleted after use)

        nest(0)
        del nest  # the recursive closure is a reference cycle through self (ir_release.py)

    def loop_shape(self) -> Shape:
        """The shape the kernel's loop nest (and its [start, end) range) runs over."""
        if self.hero is None:
            return self.out_leaves[0][2]
        shape = self.hero.shape
        return shape.tuple_shapes[0] if shape.is_tuple else shape

    def store_input_outputs(self, reduce: HloInstruction, index: Index) -> None:
        """Inside the reduction loop of the hero reduce, at input `index`: store the outputs
        that run over the reduction's input (see `reduce_hero`)."""
        if reduce is not self.hero or not self.input_outputs:
            return
        values = [self.gen(self.out_leaves[k][0], index) for k in self.input_outputs]
        for k, value in zip(self.input_outputs, values, strict=True):
            shape = self.out_leaves[k][2]
            addr = self.b.gep(self.out_ptrs[k], [self.offset(shape, index)], True)
            self.b.store(self.to_mem(value, shape.element_type), addr)

    def _store_outputs(self, index, out_ptrs):
        values = []
        stored = []
        for k, (leaf, element, shape) in enumerate(self.out_leaves):
            if k in self.input_outputs:
                continue
            value = self.gen(leaf, index)
            values.append(value if element is None else value[element])
            stored.append((shape, out_ptrs[k]))
        for (shape, ptr), value in zip(stored, values, strict=True):
            offset = self.offset(shape, index)
            self.b.store(self.to_mem(value, shape.element_type), self.b.gep(ptr, [offset], True))

    # -- loops and scopes ----------------------------------------------------------------
    def loop(
        self,
        lo,
        hi,
        name: str,
        step: int = 1,
        unroll: int | None = None,
        interleave: int | None = None,
        vectorize: bool = True,
    ):
        """A counted loop (see _Loop); `unroll`: the count LLVM unrolls it by, even when it
        is innermost (1: not unrolled), or None for the default; `interleave`: the count
        LLVM's vectorizer interleaves it by (1: vectorized, not interleaved), or None;
        `vectorize=False`: LLVM's loop vectorizer leaves it alone (`vectorize.width 1`)."""
        return _Loop(self, lo, hi, name, step, unroll, interleave, vectorize)

    def alloca(self, ty, name: str = ""):
        return self.alloca_builder.alloca(ty, name=name)

    # -- elemental generation --------------------------------------------------------------
    def gen(self, instr: HloInstruction, index: Index):
        """The value of `instr` at logical `index` (a tuple of values for tuple shapes)."""
        key = (id(instr), tuple(id(v) for v in index))
        for scope in reversed(self.scopes):
            if key in scope:
                return scope[key]
        if instr.opcode is Opcode.PARAMETER:
            value = self._gen_parameter(instr, index)
        else:
            rule = EMIT_RULES.get(instr.opcode)
            if rule is None:
                raise UnsupportedForCodegen(
                    f"{instr.name}: the CPU emitter has no rule for '{instr.opcode.text}'"
                )
            value = rule(self, instr, index)
        self.scopes[-1][key] = value
        return value

    def operand_at(self, instr: HloInstruction, i: int, index: Index):
        """Operand i of an elementwise instruction at `index` (scalars broadcast)."""
        op = instr.operands[i]
        return self.gen(op, () if op.shape.rank == 0 else index)

    def _gen_parameter(self, instr: HloInstruction, index: Index):
        if self.scalar_env:
            assert instr.parameter_number is not None, "a parameter has a number"
            return self.scalar_env[-1][instr.parameter_number]
        ptr = self.param_ptrs[id(instr)]
        addr = self.b.gep(ptr, [self.offset(instr.shape, index)], True)
        return self.from_mem(self.b.load(addr), instr.shape.element_type)

    def offset(self, shape: Shape, index: Index):
        """Physical element offset of logical `index` in a buffer of `shape`."""
        if self.flat is not None and index and index[0] is self.flat[0]:
            assert index == self.flat, "a flat kernel reads only at the element it writes"
            return index[0]
        total = ir.Constant(I64, 0)
        for i, stride in zip(index, physical_strides(shape), strict=True):
            if stride == 0:
                continue
            term = i if stride == 1 else self.b.mul(i, ir.Constant(I64, stride), flags=["nsw"])
            total = (
                term
                if total.__class__ is ir.Constant and total.constant == 0
                else (self.b.add(total, term, flags=["nsw"]))
            )
        return total

    def call_scalar(self, comp: HloComputation, args: Sequence):
        """Inline `comp` (a scalar computation, e.g. a reducer) on register values."""
        self.scalar_env.append(dict(enumerate(args)))
        self.scopes.append({})
        try:
            root = comp.root_instruction()
            if root.opcode is Opcode.TUPLE:
                return tuple(self.gen(op, ()) for op in root.operands)
            return self.gen(root, ())
        finally:
            self.scopes.pop()
            self.scalar_env.pop()

    # -- memory <-> register conversions ----------------------------------------------------
    def from_mem(self, v, t: PrimitiveType):
        b = self.b
        if t is P.PRED:
            return b.icmp_unsigned("!=", v, ir.Constant(I8, 0))
        if t is P.F16:
            return b.fpext(v, F32)
        if t is P.BF16:
            return b.bitcast(b.shl(b.zext(v, I32), ir.Constant(I32, 16)), F32)
        if t in F8_TYPES:
            return f8_to_f32(self, v, t)
        return v

    def to_mem(self, v, t: PrimitiveType):
        b = self.b
        if t is P.PRED:
            return b.zext(v, I8)
        if t is P.F16:
            return b.fptrunc(v, F16)
        if t is P.BF16:  # register bf16 values are already rounded: keep the high half
            return b.trunc(b.lshr(b.bitcast(v, I32), ir.Constant(I32, 16)), I16)
        if t in F8_TYPES:  # already rounded: rounding again is exact
            return f32_to_f8(self, v, t)
        return v

    def round_bf16(self, v):
        """An f32 value rounded (nearest even, NaN kept quiet) to the nearest bf16 value."""
        b = self.b
        bits = b.bitcast(v, I32)
        lsb = b.and_(b.lshr(bits, ir.Constant(I32, 16)), ir.Constant(I32, 1))
        rounded = b.add(bits, b.add(ir.Constant(I32, 0x7FFF), lsb))
        quiet = b.or_(bits, ir.Constant(I32, 0x400000))
        bits = b.select(self.math.isnan(v), quiet, rounded)
        return b.bitcast(b.and_(bits, ir.Constant(I32, 0xFFFF0000)), F32)

    def round_to(self, v, t: PrimitiveType):
        """A float register value rounded to element type t (f16/bf16 need it)."""
        if t is P.BF16:
            return self.round_bf16(v)
        if t is P.F16:
            return self.b.fpext(self.b.fptrunc(v, F16), F32)
        if t in F8_TYPES:
            return f8_to_f32(self, f32_to_f8(self, v, t), t)
        return v

    def global_array(self, arr: np.ndarray, t: PrimitiveType):
        """A private constant global holding `arr` row-major, as a pointer to its elements."""
        flat = np.ascontiguousarray(arr).reshape(-1)
        ety = mem_type(t)
        if t is P.PRED:
            values = [ir.Constant(I8, int(x)) for x in flat]
        elif t is P.BF16:
            values = [ir.Constant(I16, int(x)) for x in flat.view(np.uint16)]
        elif t in F8_TYPES:
            values = [ir.Constant(I8, int(x)) for x in flat.view(np.uint8)]
        elif t.is_integral:
            values = [ir.Constant(ety, int(x)) for x in flat]
        elif t.is_complex:
            values = [Complex(self).constant(complex(x), t) for x in flat]
        else:
            values = [ir.Constant(ety, float(x)) for x in flat]
        arrty = ir.ArrayType(ety, len(values))
        g = ir.GlobalVariable(self.module, arrty, f"const.{self._globals}")
        self._globals += 1
        g.global_constant = True
        g.linkage = "private"
        g.initializer = ir.Constant(arrty, values)
        return self.b.gep(g, [ir.Constant(I32, 0), ir.Constant(I32, 0)], True)

    def scalar_constant(self, value, t: PrimitiveType):
        ty = reg_type(t)
        if t is P.PRED:
            return ir.Constant(I1, int(bool(value)))
        if t.is_integral:
            return ir.Constant(ty, int(value) & ((1 << t.bits) - 1))
        if t.is_complex:
            return Complex(self).constant(complex(value), t)
        return ir.Constant(ty, float(value))


MERGE_EXTENT = 256
"""A kernel's outer range, when a nest, runs at least this many steps where its dims allow
(KernelEmitter._merged_dims): four blocks for each of 64 threads. Fixed, not the pool's
size, so that a kernel's code does not depend on the machine."""

SLP_MINOR = 8
"""A nest whose innermost (minor) dimension runs at least this many elements marks the
loops around that dimension's loop `llvm.loop.vectorize.width 1` (see the top of the file):
fully unrolled, a run this long is made vectors of by the SLP vectorizer."""

SHORT_MINOR = (8, 64)
"""Extents of a nest's innermost (minor) dimension kept as a loop (`llvm.loop.unroll.disable`)
in a kernel with an interior-padded pad (see KernelEmitter._keep_minor_loop)."""


class _Loop:
    """`with emitter.loop(lo, hi) as i:` emits a counted loop; the body goes in the block.
    A loop with another loop inside is marked `llvm.loop.unroll.disable` (see the top of
    the file); an `unroll` count, where given, is what LLVM is told instead."""

    def __init__(
        self,
        em: KernelEmitter,
        lo,
        hi,
        name: str,
        step: int = 1,
        unroll: int | None = None,
        interleave: int | None = None,
        vectorize: bool = True,
    ):
        self.em, self.lo, self.hi, self.name, self.step = em, lo, hi, name, step
        self.unroll, self.interleave, self.vectorize = unroll, interleave, vectorize
        self.has_inner = False

    def __enter__(self):
        em = self.em
        b = em.b
        pre = b.block
        fn = em.fn
        if em.open_loops:
            em.open_loops[-1].has_inner = True
        em.open_loops.append(self)
        self.header = fn.append_basic_block(f"{self.name}.header")
        body = fn.append_basic_block(f"{self.name}.body")
        self.exit = fn.append_basic_block(f"{self.name}.exit")
        b.branch(self.header)
        b.position_at_end(self.header)
        self.i = b.phi(I64, name=self.name)
        self.i.add_incoming(self.lo, pre)
        b.cbranch(b.icmp_signed("<", self.i, self.hi), body, self.exit)
        b.position_at_end(body)
        em.scopes.append({})
        return self.i

    def __exit__(self, exc_type, exc, tb):
        em = self.em
        em.scopes.pop()
        em.open_loops.pop()
        if exc_type is not None:
            return False
        b = em.b
        nxt = b.add(self.i, ir.Constant(I64, self.step), flags=["nsw"])
        self.i.add_incoming(nxt, b.block)
        latch = b.branch(self.header)
        properties = []
        if self.unroll is not None and self.unroll > 1:
            properties.append(_property(em.module, "llvm.loop.unroll.count", self.unroll))
        elif self.unroll == 1 or (self.has_inner and not em.unroll_outer_loops):
            properties.append(_property(em.module, "llvm.loop.unroll.disable"))
        if self.interleave is not None:
            properties.append(_property(em.module, "llvm.loop.interleave.count", self.interleave))
        if not self.vectorize:
            properties.append(_property(em.module, "llvm.loop.vectorize.width", 1))
        if properties:
            latch.set_metadata(
                "llvm.loop", _LoopID(em.module, properties, str(len(em.module.metadata)))
            )
        b.position_at_end(self.exit)
        return False


class _LoopID(ir.values.MDValue):
    """A loop's identity (`distinct !{!self, properties...}`): LLVM reads loop properties
    only from a distinct node whose first operand is the node itself."""

    def descr(self, buf):
        refs = ", ".join([self.get_reference(), *(op.get_reference() for op in self.operands)])
        buf += (f"distinct !{{ {refs} }}", "\n")


def _property(module: ir.Module, name: str, value: int | None = None) -> ir.values.MDValue:
    """A loop property node, `!{!"name"}` or `!{!"name", i32 value}` (shared in a module)."""
    operands: list = [ir.MetaDataString(module, name)]
    if value is not None:
        operands.append(ir.Constant(ir.IntType(32), value))
    return module.add_metadata(operands)


__all__ = [
    "KernelEmitter",
    "emit_kernel",
    "in_place_reason",
    "output_leaves",
]


class StandaloneKernelEmitter(KernelEmitter):
    """A kernel written by hand rather than from a computation (direct convolution,
    matrix-vector products): only what begin_function / end_function / loop / alloca use,
    one module named SYMBOL, no computation to emit."""

    def __init__(self, symbol: str, flush_denormals: bool):
        self.name = symbol
        self.flush_denormals = flush_denormals
        self.module = ir.Module(name=symbol)
        self.math = MathEmitter(self.module)
        self.scopes = [{}]
        self.open_loops = []
