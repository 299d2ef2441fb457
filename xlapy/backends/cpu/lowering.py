# Lowering: HLO instructions -> thunks, through one table.
#
# LOWERING maps an opcode to its strategies in order of preference; an opcode not in the
# table has DEFAULT_STRATEGIES (a native kernel, else the interpreter's rule). A strategy
# either builds the instruction's thunk or answers why it does not apply; the first that
# builds wins, and the last of every list (a library or rule thunk) always applies, taking
# the reason the strategies before it gave (shown in the thunk listing, and recorded as a
# fallback when the thunk runs the interpreter's rule alone).
#
#   while, conditional, call    nested thunk sequences (runtime/control_flow_thunk.py); a
#                               while of kernels and copies alone becomes one native loop
#                               (codegen/emit_loop.py) once its kernels are loaded
#   collectives                 the execution's peers (runtime/collective_thunk.py)
#   reduce                      a plain reduce (f32/f64, add/max/min, rows, columns, middle
#                               axis, all) as a kernel of the kernel library
#                               (codegen/emit_reduce_library.py), else a per-shape kernel
#   fusion                      a sum of x * y or (x - c)^2 (a fused sum of squares or
#                               variance) as a library kernel with that prologue, else
#                               a per-shape kernel
#   dot                         a matrix-vector product (f32/f64, one side without free
#                               dims) as a native gemv kernel (codegen/emit_gemv.py), else
#                               BLAS on the arena, else the mixed-type library path
#   dynamic-update-slice, copy  window writes and memmoves on the arena
#   custom-call                 C targets on arena pointers, typed FFI handlers (LAPACK) on
#                               arena views, XLA's TopK as a library sort
#   fft                         ducc0 (XLA's FFT library) on arena views, split over the
#                               pool by axis passes; scipy.fft without ducc0
#                               (runtime/fft_thunk.py)
#   scatter                     a native in-order scatter loop (codegen/emit_scatter.py)
#   rng-bit-generator           native threefry / philox (codegen/emit_rng.py)
#   reduce-window               prefix scans (cumsum, cumlogsumexp, ...: any reducer, both
#                               directions, variadic) as a native scan (codegen/emit_scan.py),
#                               other windows (pooling) as a native window (emit_window.py)
#   convolution                 a direct native kernel (codegen/emit_conv.py) on the arena
#                               (f32 input and result), or run by the library thunk, else
#                               its BLAS paths (runtime/conv_thunk.py)
#   sort, topk, reduce-window, select-and-scatter, gather, scatter, convolution
#                               a fast NumPy library path where the family has one
#   everything else             a fused or single-instruction kernel where the emitter
#                               supports it (codegen/), else the interpreter's rule
#
# `Lowering` holds the state of lowering one module: the buffer assignment's slices, the
# kernels still compiling on the JIT's pool, and the fallbacks; `sequence(comp)` lowers a
# computation in schedule order and, where thunks may overlap, plans it as a graph.
#
# A kernel the emitter accepted but that fails to compile (the emitter or LLVM raising) is a
# bug in the code generator, never a way to decline: with `strict_kernels` (compile option,
# else $XLAPY_STRICT_KERNELS=1; the test suite turns it on) it raises KernelCompileError;
# otherwise it warns once per instruction and reason (KernelFallbackWarning) and the
# instruction takes its next strategy.

from __future__ import annotations

import functools
import math
import os
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from xlapy.backends.base import Fallback
from xlapy.backends.collectives import PERFORMED as COLLECTIVE_OPCODES
from xlapy.backends.cpu.codegen.common import SYMBOL
from xlapy.backends.cpu.codegen.emit_conv import DirectConv, emit_direct_conv, vector_shape
from xlapy.backends.cpu.codegen.emit_conv_library import (
    conv_extent,
    conv_kernel,
    conv_params,
    library_by_default,
)
from xlapy.backends.cpu.codegen.emit_gemv import Gemv, emit_gemv, gemv_geometry, gemv_signature
from xlapy.backends.cpu.codegen.emit_loop import (
    LOOP_SYMBOL,
    LoopCall,
    LoopCopy,
    LoopGemm,
    LoopGemmList,
    LoopNested,
    LoopPlan,
    LoopStep,
    LoopSwitch,
    emit_linked_loop,
    emit_loop,
)
from xlapy.backends.cpu.codegen.emit_reduce_library import (
    fused_reduce_library_kernel,
    reduce_extent,
    reduce_library_kernel,
    reduce_params,
)
from xlapy.backends.cpu.codegen.emit_rng import emit_rng, rng_description, rng_reason, rng_signature
from xlapy.backends.cpu.codegen.emit_scan import (
    emit_scan,
    scan_description,
    scan_reason,
    scan_signature,
)
from xlapy.backends.cpu.codegen.emit_scatter import emit_scatter, scatter_reason
from xlapy.backends.cpu.codegen.emit_small_gemm import (
    small_gemm_extent,
    small_gemm_kernel,
    small_gemm_params,
)
from xlapy.backends.cpu.codegen.emit_window import (
    emit_window,
    window_description,
    window_reason,
    window_signature,
)
from xlapy.backends.cpu.codegen.emit_window_library import window_extent, window_library_kernel
from xlapy.backends.cpu.codegen.emitter import (
    FLUSH_IN_LOOP,
    denormals_flushed,
    in_place_reason,
    supported,
)
from xlapy.backends.cpu.jit.engine import LinkedIR, host_target
from xlapy.backends.cpu.jit.kernel import (
    Kernel,
    NativeFunction,
    Signature,
    book_knows,
    described_kernel,
    forget_kernel,
    kernel_for,
    kernel_site,
    pending_kernel,
    request_function,
    symbol_name,
    wrap_instruction,
)
from xlapy.backends.cpu.jit.kernel_library import (
    LibraryKernel,
    library_function,
    library_kernel,
)
from xlapy.backends.cpu.runtime import native_addresses as addr
from xlapy.backends.cpu.runtime.collective_thunk import CollectiveThunk, plan_device_id
from xlapy.backends.cpu.runtime.control_flow_thunk import (
    CallThunk,
    ConditionalThunk,
    NativeLoop,
    NativeRun,
    WhileThunk,
)
from xlapy.backends.cpu.runtime.conv_thunk import (
    ConvolutionThunk,
    DirectConvThunk,
    DirectKernel,
    arena_geometry,
    direct_geometry,
    plan_convolution,
)
from xlapy.backends.cpu.runtime.copy_thunk import CopyThunk
from xlapy.backends.cpu.runtime.custom_call_thunk import CustomCallThunk, FfiCallThunk
from xlapy.backends.cpu.runtime.dot_thunk import (
    OPENBLAS_SERIAL_FLOPS,
    DotThunk,
    blas_dot_supported,
    plan_dot,
)
from xlapy.backends.cpu.runtime.fft_thunk import FftThunk
from xlapy.backends.cpu.runtime.indexing_thunk import (
    DynamicUpdateSliceThunk,
    plan_gather,
    plan_scatter,
)
from xlapy.backends.cpu.runtime.kernel_thunk import KernelThunk, work_elements
from xlapy.backends.cpu.runtime.native_pool import MAX_ARGS, native_pool
from xlapy.backends.cpu.runtime.rule_thunk import Planner, RuleThunk, all_arrays, plan_safely
from xlapy.backends.cpu.runtime.sort_thunk import (
    plan_approx_topk,
    plan_sort,
    plan_topk,
    plan_xla_topk,
)
from xlapy.backends.cpu.runtime.thunk import (
    BufferSlice,
    GraphChoice,
    Thunk,
    ThunkSequence,
    ValueTree,
    physical_dims,
    raw_copies,
    tree_slices,
)
from xlapy.backends.cpu.runtime.thunk_graph import concurrency_mode, plan_graph
from xlapy.backends.cpu.runtime.window_thunk import plan_reduce_window, plan_select_and_scatter
from xlapy.errors import EvaluationError, XlapyError
from xlapy.ir.computation import HloComputation
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.opcodes import Opcode
from xlapy.ir.printer import print_canonical
from xlapy.ir.shapes import ShapeIndex
from xlapy.memory.buffer_assignment import BufferAssignment

KERNEL_OPCODES = frozenset(
    {
        Opcode.BROADCAST,
        Opcode.TRANSPOSE,
        Opcode.RESHAPE,
        Opcode.SLICE,
        Opcode.CONCATENATE,
        Opcode.PAD,
        Opcode.IOTA,
        Opcode.REVERSE,
        Opcode.REDUCE,
        Opcode.DYNAMIC_SLICE,
        Opcode.GATHER,
        Opcode.FUSION,
    }
)
"""Unfused opcodes (besides elementwise ones) that become kernels when the emitter can."""

NO_THUNK = frozenset({Opcode.PARAMETER, Opcode.TUPLE, Opcode.CONSTANT, Opcode.AFTER_ALL})
"""Opcodes that run no code (besides those that forward their operand's value)."""

Built = Thunk | str
"""What a strategy answers: the thunk it built, or why it does not apply."""

STRICT_ENV = "XLAPY_STRICT_KERNELS"


class KernelCompileError(XlapyError):
    """A kernel the code generator accepted failed to compile (strict_kernels)."""


class KernelFallbackWarning(UserWarning):
    """A kernel failed to compile and its instruction runs another way (the interpreter's
    rule, or a library path): a code generator bug, worth reporting."""


def strict_kernels(options: Mapping[str, Any]) -> bool:
    """Whether a kernel compile failure raises: compile option `strict_kernels`, else
    $XLAPY_STRICT_KERNELS set to 1 / true / yes."""
    value = options.get("strict_kernels")
    if value is None:
        value = os.environ.get(STRICT_ENV, "").strip().lower() in ("1", "true", "yes")
    return bool(value)


_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


@dataclass(frozen=True, slots=True)
class Strategy:
    """One way to lower an instruction: `build(lowering, instr, why)` returns the thunk, or
    why this strategy does not apply; `why` is the reason the strategy before it gave."""

    name: str
    build: Callable[[Lowering, HloInstruction, str], Built]


# -- the strategies ------------------------------------------------------------------------------
def _while(lw: Lowering, instr: HloInstruction, why: str) -> Built:
    cond, body = instr.while_condition, instr.while_body
    init = instr.operands[0]
    limit = lw.options.get("max_while_iterations")
    lw.loop_depth += 1
    try:
        sequences = lw.sequence(cond), lw.sequence(body)
    finally:
        lw.loop_depth -= 1
    thunk = WhileThunk(
        instr,
        *sequences,
        lw.slice_at(cond.root_instruction()),
        lw.leaf_copies(init, instr),
        lw.leaf_copies(instr, cond.parameter(0)),
        lw.leaf_copies(instr, body.parameter(0)),
        lw.leaf_copies(body.root_instruction(), instr),
        None if limit is None else int(limit),
    )
    lw.plan_native_loop(thunk)
    return thunk


def _data_entry(thunk: KernelThunk, table: list[Callable[[], int]]) -> int:
    """The table index of `thunk`'s parameter block's address (appended), or -1 without one."""
    if thunk.data is None:
        return -1
    table.append(functools.partial(addr.data_address, thunk))
    return len(table) - 1


@dataclass(frozen=True, slots=True)
class NativeLoopPlan:
    """What native_loop_plan makes of a while loop: the function's plan, its table of entry
    points (each a function answering the address, once kernels and inner loops are
    loaded), and whether some gemm it calls (its inner loops' included) needs OpenBLAS
    limited to the calling thread around the loop (one above OPENBLAS_SERIAL_FLOPS)."""

    plan: LoopPlan
    table: list[Callable[[], int]]
    one_blas_thread: bool
    inlined: tuple[Kernel, ...] = ()

    def emit(self) -> str | LinkedIR:
        """The loop's IR: its module alone, or linked with the kernels compiled into it."""
        if not self.inlined:
            return emit_loop(self.plan)
        kernels = [(k.spec.llvm_ir, k.spec.name) for k in self.inlined]
        return LinkedIR(*emit_linked_loop(self.plan, kernels))


INLINE_MAX_ELEMENTS = 512
"""A kernel of a native loop that computes at most this many elements (an in-place
dynamic-update-slice: the window it writes; KernelThunk.elements), does not split and has
no parameter block (a library kernel's) is compiled into the loop function
(codegen/emit_loop.py): its call costs about as much as its work. Larger kernels stay
calls: their call is a small part of their time, and compiling them twice (on their own
for the profiler, into the loop) would cost cold-compile time for nothing."""

INLINE_MAX_KERNELS = 24
"""At most this many kernels are compiled into one loop (the loop's LLVM compile grows with
them, and it runs beside the kernels' own)."""


def _inlinable(t: KernelThunk) -> bool:
    kernel = t.kernel
    if not isinstance(kernel, Kernel) or t.split_choice is not None or t.data is not None:
        return False
    root = t.instr.calls.root_instruction() if t.instr.opcode is Opcode.FUSION else t.instr
    if root.opcode is Opcode.DYNAMIC_UPDATE_SLICE:
        elements = t.elements()  # the window it writes in place
    else:
        elements = work_elements(t.instr, t.outputs)
    return kernel.has_ir and elements <= INLINE_MAX_ELEMENTS


def _flushes(steps: Sequence[LoopStep]) -> bool:
    """Whether a call among `steps` (in a conditional's branches too) is `flushed`: the
    function around them must set the flush mode."""
    for step in steps:
        if isinstance(step, LoopCall) and step.flushed:
            return True
        if isinstance(step, LoopSwitch) and any(_flushes(b) for b in step.branches):
            return True
    return False


def native_loop_plan(
    thunk: WhileThunk, native: Mapping[WhileThunk, bool] | None = None, inline: bool = False
) -> NativeLoopPlan | str:
    """The native loop of `thunk` (codegen/emit_loop.py), or why it has none: its condition
    and body must be kernels (those that may split over the cores run on the native pool,
    in the runtime's number of blocks), copies, dots that are one cblas gemm or one gemm
    list run whole (DotThunk.native_gemm, native_gemm_list), conditionals of such
    branches, and while loops in `native` (those that will be native loops themselves, each
    mapped to whether it needs one BLAS thread). Small kernels (_inlinable, up to
    INLINE_MAX_KERNELS, with `inline`: option `inline_loop_kernels`) are compiled into the
    loop."""
    native = native or {}
    table: list[Callable[[], int]] = []
    one_thread = False
    inlined: dict[Kernel, int] = {}

    def copies(raw) -> list[LoopStep]:
        return [LoopCopy((da, do), (sa, so), size) for da, do, sa, so, size in raw]

    def steps(seq: ThunkSequence) -> list[LoopStep] | str:
        nonlocal one_thread
        if seq.plan is not None:
            return f"{seq.name} runs as a graph"
        out: list[LoopStep] = []
        for t in seq.thunks:
            if isinstance(t, KernelThunk):
                if t.scratch or not isinstance(t.kernel, Kernel):
                    return f"{t.instr.name}: its kernel needs scratch buffers"
                slots = tuple((s.allocation, s.offset) for s in (*t.outputs, *t.inputs))
                if inline and _inlinable(t) and len(inlined) < INLINE_MAX_KERNELS:
                    index = inlined.setdefault(t.kernel, len(inlined))
                    flushed = t.kernel.flushed_end
                    out.append(LoopCall(-1, slots, t.kernel.outer_extent, inline=index,
                                        flushed=flushed))  # fmt: skip
                    continue
                pool = native_pool() if t.split_choice is not None else None
                arity = len(slots) + (t.data is not None)
                if t.split_choice is not None and (pool is None or arity > MAX_ARGS):
                    return f"{t.instr.name}: its kernel may split and the native pool cannot run it"
                table.append(functools.partial(addr.kernel_address, t.kernel))
                entry = len(table) - 1
                data = _data_entry(t, table)
                if pool is None:
                    flushed = t.kernel.flushed_end
                    out.append(LoopCall(entry, slots, t.kernel.outer_extent, data=data,
                                        flushed=flushed))  # fmt: skip
                    continue
                table.append(addr.pool_run_address)
                pool_at = len(table) - 1
                out.append(LoopCall(entry, slots, t.kernel.outer_extent, t.chunks, pool_at, data))
            elif isinstance(t, CopyThunk):
                out += copies(raw_copies([(t.src, t.dst)]))
            elif isinstance(t, DotThunk) and (made := native_run_steps(t, table)) is not None:
                out += made[0]
                one_thread |= made[1]
            elif isinstance(t, ConditionalThunk):
                branches = []
                for i, branch in enumerate(t.branches):
                    inner = steps(branch)
                    if isinstance(inner, str):
                        return inner
                    moves_in, moves_out = raw_copies(t.in_copies[i]), raw_copies(t.out_copies[i])
                    branches.append((*copies(moves_in), *inner, *copies(moves_out)))
                selector = (t.selector.allocation, t.selector.offset)
                dtype = t.selector.shape.dtype
                bits = 0 if t.is_pred else 8 * dtype.itemsize
                out.append(LoopSwitch(selector, bits, dtype.kind == "i", tuple(branches)))
            elif isinstance(t, WhileThunk) and t in native:
                out += copies(t.raw_copies[0])
                one_thread |= native[t]
                table.extend((functools.partial(addr.native_of, t, "address"),
                              functools.partial(addr.native_of, t, "table_address")))  # fmt: skip
                out.append(LoopNested(len(table) - 2))
            elif isinstance(t, WhileThunk):
                return f"{t.instr.name}: an inner while loop that runs from Python"
            elif isinstance(t, DotThunk):
                return f"{t.instr.name}: a dot that is not one cblas gemm or gemm list run whole"
            else:
                return f"{t.instr.name} is a {t.kind} thunk (it runs from Python)"
        return out

    cond, body = steps(thunk.condition), steps(thunk.body)
    if isinstance(cond, str) or isinstance(body, str):
        return cond if isinstance(cond, str) else str(body)
    _, cond_copies, body_copies, back_copies = thunk.raw_copies
    before = (*copies(cond_copies), *cond)
    after = (*copies(body_copies), *body, *copies(back_copies))
    keys = tuple(k.object_key for k in inlined)
    flush = _flushes((*before, *after))
    plan = LoopPlan(before, (thunk.pred.allocation, thunk.pred.offset), after, keys, flush)
    return NativeLoopPlan(plan, table, one_thread, tuple(inlined))


MIN_NATIVE_RUN = 3
"""Thunks in a row that become one native function (fewer save too little to pay for
compiling it)."""


def native_run_steps(
    thunk: Thunk, table: list[Callable[[], int]]
) -> tuple[list[LoopStep], bool] | None:
    """`thunk` as steps of a straight native run, its entry points appended to `table`,
    and whether a gemm among them needs OpenBLAS limited to the calling thread; None for a
    thunk that runs from Python: a kernel that may split over the pool (it keeps choosing
    by its run times) or writes through scratch, a dot that is not one gemm or one gemm list
    run whole, and every other kind."""
    if isinstance(thunk, KernelThunk):
        kernel = thunk.kernel
        if thunk.scratch or thunk.split_choice is not None or not isinstance(kernel, Kernel):
            return None
        table.append(functools.partial(addr.kernel_address, kernel))
        entry = len(table) - 1
        slots = tuple((s.allocation, s.offset) for s in (*thunk.outputs, *thunk.inputs))
        data = _data_entry(thunk, table)
        call = LoopCall(entry, slots, kernel.outer_extent, data=data, flushed=kernel.flushed_end)
        return [call], False
    if isinstance(thunk, CopyThunk):
        moves = raw_copies([(thunk.src, thunk.dst)])
        return [LoopCopy((da, do), (sa, so), n) for da, do, sa, so, n in moves], False
    if not isinstance(thunk, DotThunk):
        return None
    gemm = thunk.native_gemm(math.inf)
    if gemm is not None:
        _, wide, (order, ta, tb, m, n, k, a, lda, b, ldb, c, ldc) = gemm
        table.append(functools.partial(addr.gemm_address, thunk))
        dtype = "float" if thunk.out.shape.dtype.itemsize == 4 else "double"
        bits, entry = 64 if wide else 32, len(table) - 1
        step = LoopGemm(entry, dtype, bits, order, ta, tb, m, n, k, a, lda, b, ldb, c, ldc)
        return [step], thunk.flops > OPENBLAS_SERIAL_FLOPS
    listed = thunk.native_gemm_list()
    if listed is None:
        return None
    (a, b, c), count = listed
    table.extend((functools.partial(addr.gemm_list_address, thunk, 0),
                  functools.partial(addr.gemm_list_address, thunk, 1)))  # fmt: skip
    return [LoopGemmList(len(table) - 2, a, b, c, count)], False


@dataclass(frozen=True, slots=True)
class NativeRunPlan:
    """A stretch of a sequence's thunks (`start` to `end`) as one native function."""

    start: int
    end: int
    plan: NativeLoopPlan


def native_run_plans(seq: ThunkSequence) -> list[NativeRunPlan]:
    """The stretches of at least MIN_NATIVE_RUN thunks of `seq` (one without a graph plan)
    that native_run_steps takes, each with its straight-line plan."""
    found: list[NativeRunPlan] = []
    steps: list[LoopStep] = []
    table: list[Callable[[], int]] = []
    start, one_thread = 0, False

    def close(end: int) -> None:
        if end - start >= MIN_NATIVE_RUN:
            straight = LoopPlan(tuple(steps), None, (), flush=_flushes(steps))
            plan = NativeLoopPlan(straight, table, one_thread)
            found.append(NativeRunPlan(start, end, plan))

    for i, thunk in enumerate([*seq.thunks, None]):
        made = None if thunk is None else native_run_steps(thunk, table)
        if made is None:
            close(i)
            start, steps, table, one_thread = i + 1, [], [], False
            continue
        steps += made[0]
        one_thread |= made[1]
    return found


def _conditional(lw: Lowering, instr: HloInstruction, why: str) -> Built:
    branches = instr.branches
    is_pred = instr.conditional_is_predicated
    ins, outs, seqs = [], [], []
    for i, branch in enumerate(branches):
        copies = []
        if branch.num_parameters:
            copies = lw.leaf_copies(instr.operands[i + 1], branch.parameter(0))
        ins.append(copies)
        outs.append(lw.leaf_copies(branch.root_instruction(), instr))
        seqs.append(lw.sequence(branch))
    return ConditionalThunk(instr, lw.slice_at(instr.operands[0]), seqs, ins, outs, is_pred)


def _call(lw: Lowering, instr: HloInstruction, why: str) -> Built:
    comp = instr.to_apply
    copies = [
        c for o, p in zip(instr.operands, comp.parameters, strict=True)
        for c in lw.leaf_copies(o, p)
    ]  # fmt: skip
    return CallThunk(instr, lw.sequence(comp), copies)


def _collective(lw: Lowering, instr: HloInstruction, why: str) -> Built:
    operands = [lw.tree_at(o) for o in instr.operands]
    return CollectiveThunk(instr, operands, lw.tree_at(instr))


def _blas_dot(lw: Lowering, instr: HloInstruction, why: str) -> Built:
    if not blas_dot_supported(instr):
        return "not one BLAS element type (f32, f64, c64, c128) in and out"
    lhs, rhs = instr.operands
    out = lw.slice_at(instr)
    return DotThunk(instr, lw.slice_at(lhs), lw.slice_at(rhs), out, lw.flush_denormals)


def _native_gemv(lw: Lowering, instr: HloInstruction, why: str) -> Built:
    """A matrix-vector dot, or a small matrix-matrix one (a side of at most 16 free
    elements), as a native kernel (codegen/emit_gemv.py); compile options
    `native_gemv=False` / `native_small_gemm=False` leave them to BLAS."""
    if not lw.options.get("native_gemv", True):
        return "native_gemv is off"
    small_gemm = bool(lw.options.get("native_small_gemm", True))
    geometry = gemv_geometry(instr, vector_shape(host_target().features)[0], small_gemm)
    if isinstance(geometry, str):
        return geometry
    if geometry.cols > 1 and lw.options.get("small_gemm_library", True):
        return _library_gemm(lw, instr, geometry)
    return _described_kernel(
        lw,
        instr,
        lambda i: lw.failed.get(i.name),
        lambda i, flush: geometry.description(flush),
        lambda i: gemv_signature(i, geometry),
        lambda i, flush: emit_gemv(i, geometry, flush),
    )


def _library_gemm(lw: Lowering, instr: HloInstruction, geometry: Gemv) -> Built:
    """A small matrix-matrix dot as a kernel of the kernel library, generic in its shape
    (codegen/emit_small_gemm.py, jit/kernel_library.py): no LLVM for this program; the
    thunk keeps the dot's geometry as the kernel's parameter block."""
    kernel = small_gemm_kernel(geometry)
    if isinstance(kernel, str):
        return kernel
    matrix = instr.operands[geometry.matrix]
    vector = instr.operands[1 - geometry.matrix]
    extent = small_gemm_extent(geometry, kernel)
    data = small_gemm_params(geometry, kernel)
    return _library_thunk(lw, instr, kernel, [matrix, vector], extent, data)


def _library_reduce(lw: Lowering, instr: HloInstruction, why: str) -> Built:
    """A plain reduce (one f32/f64 array by add, maximum or minimum, as [P, R, Q] -> [P, Q])
    as a kernel of the kernel library, generic in its extents and strides
    (codegen/emit_reduce_library.py): no LLVM for this program. Option
    `reduce_library=False` compiles it per shape instead."""
    if not lw.options.get("reduce_library", True):
        return "reduce_library is off"
    found = reduce_library_kernel(instr, vector_shape(host_target().features)[0])
    if isinstance(found, str):
        return found
    kernel, geometry = found
    data = reduce_params(geometry, kernel)
    return _library_thunk(lw, instr, kernel, list(instr.operands[:2]), reduce_extent(data), data)


def _library_fused_reduce(lw: Lowering, instr: HloInstruction, why: str) -> Built:
    """A fusion that sums x * y or (x - c)^2 (a fused sum of squares or variance) as a
    kernel of the kernel library with that prologue (codegen/emit_reduce_library.py's
    fused_reduce_library_kernel says exactly which fusions); `reduce_library=False` or any
    other fusion: its per-shape kernel."""
    if not lw.options.get("reduce_library", True):
        return "reduce_library is off"
    found = fused_reduce_library_kernel(instr, vector_shape(host_target().features)[0])
    if isinstance(found, str):
        return found
    data = reduce_params(found.geometry, found.kernel, found.init_bits)
    inputs = [instr.operands[i] for i in found.operands]
    return _library_thunk(lw, instr, found.kernel, inputs, reduce_extent(data), data)


def _library_thunk(
    lw: Lowering, instr: HloInstruction, kernel: LibraryKernel, inputs: list, extent: int, data
) -> Built:
    """The KernelThunk running kernel-library kernel `kernel` on `inputs` (instructions)
    over `extent` outer steps with parameter block `data`; a failed kernel is the reason
    (see the file comment)."""
    reason = lw.failed.get(instr.name)
    if reason is not None:
        return reason
    shapes = tuple(x.shape for x in inputs)
    signature = Signature((instr.shape,), shapes, extent, param_blocks=1)
    try:
        native = library_kernel(kernel, lw.flush_denormals, signature, symbol_name(instr.name))
    except Exception as e:  # a code generator bug: loud (see the file comment)
        return lw.kernel_failed(instr.name, e)
    lw.kernels.append((instr.name, native))
    slices = [lw.slice_at(x) for x in inputs]
    return KernelThunk(instr, native, [lw.slice_at(instr)], slices, data)


def _dynamic_update_slice(lw: Lowering, instr: HloInstruction, why: str) -> Built:
    if not instr.shape.is_array:
        return "a tuple result"
    operand, update, *starts = instr.operands
    return DynamicUpdateSliceThunk(
        instr,
        lw.slice_at(operand),
        lw.slice_at(update),
        [lw.slice_at(s) for s in starts],
        lw.slice_at(instr),
    )


def _copy(lw: Lowering, instr: HloInstruction, why: str) -> Built:
    if not instr.shape.is_array:
        return "a tuple result"
    src, dst = lw.slice_at(instr.operands[0]), lw.slice_at(instr)
    if physical_dims(src.shape) != physical_dims(dst.shape) or (
        src.shape.layout_or_default != dst.shape.layout_or_default
    ):
        return "a copy that changes the layout"
    return CopyThunk(instr, src, dst)


def _custom_call(lw: Lowering, instr: HloInstruction, why: str) -> Built:
    from xlapy.backends.custom_calls import XLA_INTERNAL_TARGET_NAMES

    target = instr.custom_call_target
    if target in XLA_INTERNAL_TARGET_NAMES:
        return f"XLA-internal target {target!r}"
    operands = [lw.tree_at(o) for o in instr.operands]
    result = lw.tree_at(instr)
    aliases = []
    for alias in instr.output_to_operand_aliasing:
        out = result
        for i in alias.output_index:
            out = out[i]
        aliases.append((alias.operand_number, tuple(alias.operand_index), out))
    handler = _typed_ffi_target(lw, target)
    if handler is not None:
        if not all(all_arrays(t) for t in (*operands, result)):
            return "a typed FFI call with a token operand or result"
        return FfiCallThunk(instr, operands, result, aliases, handler)
    leaves = [s for o in instr.operands for _, s in o.shape.leaves()]
    leaves += [s for _, s in instr.shape.leaves()]
    if any(s.is_array and s.layout is not None and not s.layout.is_default for s in leaves):
        return "an operand or result in a non-default layout"
    return CustomCallThunk(instr, operands, result, aliases)


def _typed_ffi_target(lw: Lowering, name: str | None):
    """The registered typed-FFI target `name` (found as a run would find it), or None."""
    from xlapy.backends.custom_calls import typed_ffi_target

    return typed_ffi_target(name, lw.options.get("custom_calls"))


def _fft(lw: Lowering, instr: HloInstruction, why: str) -> Built:
    if not instr.shape.is_array:
        return "a tuple result"
    try:
        library = lw.options.get("fft_library", "ducc0")
        return FftThunk(instr, lw.slice_at(instr.operands[0]), lw.slice_at(instr), library)
    except EvaluationError as e:  # the rule reports the same problem when it runs
        return str(e)


def _native_scatter(lw: Lowering, instr: HloInstruction, why: str) -> Built:
    if len(instr.operands) != 3 or not instr.shape.is_array:
        return "not a one-operand scatter"
    reason = lw.failed.get(instr.name) or scatter_reason(instr)
    if reason is not None:
        return reason
    out = lw.slice_at(instr)
    inputs = [lw.slice_at(o) for o in instr.operands]
    operand, indices, updates = inputs
    in_place = out.same_bytes(operand) and not (out.overlaps(indices) or out.overlaps(updates))
    try:  # compiled on the JIT's pool, not here (it was ~10% of bert's lowering)
        spec = emit_scatter(instr, in_place, lw.flush_denormals)
        kernel = pending_kernel(spec, symbol_name(instr.name))
    except Exception as e:  # a code generator bug: loud (see the file comment)
        return lw.kernel_failed(instr.name, e)
    lw.kernels.append((instr.name, kernel))
    return KernelThunk(instr, kernel, [out], inputs)


def _native_scan(lw: Lowering, instr: HloInstruction, why: str) -> Built:
    return _described_kernel(lw, instr, scan_reason, scan_description, scan_signature, emit_scan)


def _library_window(lw: Lowering, instr: HloInstruction, why: str) -> Built:
    """A pooling reduce-window (one f32/f64 array by add, maximum or minimum) as a kernel of
    the kernel library, generic in its geometry (codegen/emit_window_library.py): no LLVM
    for this program. Off by default (option `window_library`): on NHWC max pooling and
    the average pool's gradient it ran 1.9x and 3.5-6x slower than the per-shape kernel
    (benchmarks/RESULTS.md, tenth session, branch convlib)."""
    if not lw.options.get("window_library", False):
        return "window_library is off (the default)"
    found = window_library_kernel(instr, vector_shape(host_target().features)[0])
    if isinstance(found, str):
        return found
    kernel, data = found
    return _library_thunk(lw, instr, kernel, list(instr.operands), window_extent(data), data)


def _native_window(lw: Lowering, instr: HloInstruction, why: str) -> Built:
    return _described_kernel(
        lw, instr, window_reason, window_description, window_signature, emit_window
    )


def _described_kernel(lw: Lowering, instr: HloInstruction, reason_of, describe, signature, emit):
    """A kernel thunk running the one kernel its emitter writes for `instr` (a native scan
    or window), named by its description: `reason_of(instr)` says why it cannot be one."""
    reason = lw.failed.get(instr.name) or reason_of(instr)
    if reason is not None:
        return reason
    outputs = [lw.slice_at(instr, index) for index, _ in instr.shape.leaves()]
    inputs = [lw.slice_at(o) for o in instr.operands]
    flush = lw.flush_denormals
    try:
        kernel = described_kernel(
            describe(instr, flush),
            Signature(*signature(instr)),
            symbol_name(instr.name),
            functools.partial(emit, instr, flush),
        )
    except Exception as e:  # a code generator bug: loud (see the file comment)
        return lw.kernel_failed(instr.name, e)
    lw.kernels.append((instr.name, kernel))
    return KernelThunk(instr, kernel, outputs, inputs)


def _convolution(lw: Lowering, instr: HloInstruction, why: str) -> Built:
    """A direct kernel compiled for the convolution's geometry (codegen/emit_conv.py): on
    the arena where its input and result allow (DirectConvThunk), else run by the library
    convolution (runtime/conv_thunk.py), which has BLAS paths for the rest."""
    fallback = library(plan_convolution, ConvolutionThunk)
    if lw.failed.get(instr.name) or not lw.options.get("direct_convolutions", True):
        return fallback.build(lw, instr, why)
    vector, registers = vector_shape(host_target().features)
    out, x, w = lw.slice_at(instr), *(lw.slice_at(o) for o in instr.operands)
    arena = None if out.overlaps(x) or out.overlaps(w) else arena_geometry(instr)
    choice = lw.options.get("conv_library")  # None: library_by_default's rule
    if choice is not False:  # where a direct kernel runs, and only there
        built = _library_convolution(lw, instr, why, vector, arena, (out, x, w), choice)
        if built is not None:
            return built
    if arena is not None and not DirectConv(**arena, vector=vector, registers=registers).fits:
        arena = None  # its edge tiles' input outgrows the stack buffer: the padded copy
    geometry = arena or direct_geometry(instr)
    if geometry is None:
        return fallback.build(lw, instr, why)
    conv = DirectConv(**geometry, vector=vector, registers=registers)
    if not conv.fits:
        return fallback.build(lw, instr, why)
    flush = lw.flush_denormals
    try:
        function = request_function(
            conv.description(flush),
            functools.partial(emit_direct_conv, conv, flush),
            SYMBOL,
            light=True,  # its loops are vectorized and tiled already (emit_conv.py)
        )
    except Exception as e:  # a code generator bug: loud (see the file comment)
        lw.kernel_failed(instr.name, e)
        return fallback.build(lw, instr, why)
    lw.functions.append((instr.name, function))
    direct = DirectKernel(function, conv.kernel_width, conv.extent)
    if arena is not None:
        return DirectConvThunk(instr, direct, out, x, w)
    planner = functools.partial(plan_convolution, direct=direct)
    return library(planner, ConvolutionThunk).build(lw, instr, why)


def _library_convolution(
    lw: Lowering, instr: HloInstruction, why: str, vector: int, arena, slices, choice
) -> Built | None:
    """A direct convolution on the kernel library's convolution, generic in its geometry
    (codegen/emit_conv_library.py: no LLVM for this program): on the arena where its input
    and result allow (`arena`: arena_geometry; DirectConvThunk, padding in the kernel's
    loops), else run by the library convolution on the padded input it writes
    (runtime/conv_thunk.py `_direct`); None where the direct path does not apply or the
    input or result has its features apart (NCHW on the arena: 1.8x slower than the kernel
    compiled per geometry). The same bits as the kernel compiled per geometry; `choice`:
    option `conv_library` (True: wherever it applies; None, the default: where
    library_by_default says, short last tiles: where it runs no slower; docs/cpu_backend.md)."""
    if arena is not None and (arena["x_strides"][3] != 1 or arena["out_strides"][3] != 1):
        return None  # features apart (NCHW): every edge tile staged column by column
    geometry = arena or direct_geometry(instr)
    if geometry is None or (choice is None and not library_by_default(geometry, vector)):
        return None
    kernel = conv_kernel(geometry, vector)
    try:
        function = library_function(kernel, lw.flush_denormals)
    except Exception as e:  # a code generator bug: loud (see the file comment)
        lw.kernel_failed(instr.name, e)
        return None
    lw.functions.append((instr.name, function))
    params = conv_params(kernel, geometry)
    direct = DirectKernel(function, kernel.width(geometry["features"]),
                          conv_extent(geometry, kernel), params)  # fmt: skip
    if arena is not None:
        return DirectConvThunk(instr, direct, *slices)
    planner = functools.partial(plan_convolution, direct=direct)
    return library(planner, ConvolutionThunk).build(lw, instr, why)


def _native_rng(lw: Lowering, instr: HloInstruction, why: str) -> Built:
    reason = lw.failed.get(instr.name) or rng_reason(instr)
    if reason is not None:
        return reason
    outputs = [lw.slice_at(instr, index) for index, _ in instr.shape.leaves()]
    inputs = [lw.slice_at(o) for o in instr.operands]
    try:
        kernel = described_kernel(
            rng_description(instr),
            Signature(*rng_signature(instr)),
            symbol_name(instr.name),
            functools.partial(emit_rng, instr),
        )
    except Exception as e:  # a code generator bug: loud (see the file comment)
        return lw.kernel_failed(instr.name, e)
    lw.kernels.append((instr.name, kernel))
    return KernelThunk(instr, kernel, outputs, inputs)


def kernel_reason(instr: HloInstruction, known: bool = False) -> str | None:
    """None when `instr` can be a kernel thunk, else why not. `known`: a compile of the same
    program by the same sources made it a kernel (an authenticated whole-executable cache
    entry says so), so the code generator's precheck is not run again."""
    reason = _kernel_form_reason(instr)
    if reason is not None or known:
        return reason
    return supported(kernel_computation(instr))


def _kernel_form_reason(instr: HloInstruction) -> str | None:
    """kernel_reason without the code generator's precheck: the opcode and operand kinds."""
    op = instr.opcode
    if op not in KERNEL_OPCODES and not op.is_elementwise:
        return f"no kernel for '{op.text}'"
    if op in (Opcode.RNG, Opcode.STOCHASTIC_CONVERT):
        return f"no kernel for '{op.text}'"
    if any(not o.shape.is_array for o in instr.operands):
        return "a tuple or token operand"
    for _, shape in instr.shape.leaves():
        if not shape.is_array:
            return "a token result"
    return None


def kernel_computation(instr: HloInstruction) -> HloComputation:
    """The computation a kernel for `instr` compiles: its fused computation, or `instr`
    wrapped alone."""
    if instr.opcode is Opcode.FUSION:
        return instr.calls
    return wrap_instruction(instr)


def _kernel(lw: Lowering, instr: HloInstruction, why: str) -> Built:
    reason = lw.failed.get(instr.name) or _kernel_form_reason(instr)
    if reason is not None:
        return reason
    comp = kernel_computation(instr)
    # the canonical text keys the kernel (kernel_for) and the precheck's answer: a model's
    # layers are one text (bert train: 540 kernel instructions, 133 texts). A kernel an
    # authenticated whole-executable entry names needs neither (see kernel_reason).
    text = None if book_knows(kernel_site(instr)) else print_canonical(comp)
    if text is not None:
        reason = lw.supported(comp, text)
        if reason is not None:
            return reason
    try:
        return lw.kernel_thunk(instr, comp, text)
    except Exception as e:  # a code generator bug: loud (see the file comment)
        return lw.kernel_failed(instr.name, e)


def _rule(lw: Lowering, instr: HloInstruction, why: str) -> Built:
    return lw.rule_thunk(instr, RuleThunk(instr, lw.operand_trees(instr), lw.tree_at(instr), why))


def library(planner: Planner, thunk: type[RuleThunk] = RuleThunk) -> Strategy:
    """The strategy that runs an instruction as `thunk` with `planner`'s fast path, where it
    has one, else with the interpreter's rule."""

    def build(lw: Lowering, instr: HloInstruction, why: str) -> Built:
        result = lw.tree_at(instr)
        fast = plan_safely(planner, instr) if all_arrays(result) else None
        operands = lw.operand_trees(instr)
        made = thunk(instr, operands, result, why, fast, planner if fast is not None else None)
        return lw.rule_thunk(instr, made)

    return Strategy(f"library {getattr(planner, '__name__', 'planner')}", build)


def _sort_library(lw: Lowering, instr: HloInstruction, why: str) -> Built:
    """The library sort, its comparator reading subnormals as the kernels do."""
    planner = functools.partial(plan_sort, flush_denormals=lw.flush_denormals)
    return library(planner).build(lw, instr, why)


CUSTOM_CALL_PLANNERS: dict[str, Planner] = {"TopK": plan_xla_topk, "ApproxTopK": plan_approx_topk}
"""XLA-internal custom-call target -> its library planner."""


def _custom_call_library(lw: Lowering, instr: HloInstruction, why: str) -> Built:
    planner = CUSTOM_CALL_PLANNERS.get(instr.custom_call_target or "")
    if planner is None:
        return _rule(lw, instr, why)
    return library(planner).build(lw, instr, why)


KERNEL = Strategy("kernel", _kernel)
RULE = Strategy("interpreter rule", _rule)
DEFAULT_STRATEGIES = (KERNEL, RULE)

LOWERING: dict[Opcode, tuple[Strategy, ...]] = {
    Opcode.WHILE: (Strategy("while", _while),),
    Opcode.CONDITIONAL: (Strategy("conditional", _conditional),),
    Opcode.CALL: (Strategy("call", _call),),
    **{op: (Strategy("collective", _collective),) for op in COLLECTIVE_OPCODES},
    Opcode.DOT: (
        Strategy("native gemv", _native_gemv),
        Strategy("blas dot", _blas_dot),
        KERNEL,
        library(plan_dot),
    ),
    Opcode.REDUCE: (Strategy("library reduce", _library_reduce), KERNEL, RULE),
    Opcode.FUSION: (Strategy("library fused reduce", _library_fused_reduce), KERNEL, RULE),
    Opcode.DYNAMIC_UPDATE_SLICE: (
        Strategy("dynamic-update-slice", _dynamic_update_slice),
        KERNEL,
        RULE,
    ),
    Opcode.COPY: (Strategy("copy", _copy), KERNEL, RULE),
    Opcode.CUSTOM_CALL: (
        Strategy("custom call", _custom_call),
        KERNEL,
        Strategy("custom call library", _custom_call_library),
    ),
    Opcode.SCATTER: (Strategy("native scatter", _native_scatter), KERNEL, library(plan_scatter)),
    Opcode.GATHER: (KERNEL, library(plan_gather)),
    Opcode.SORT: (KERNEL, Strategy("library plan_sort", _sort_library)),
    Opcode.TOPK: (KERNEL, library(plan_topk)),
    Opcode.REDUCE_WINDOW: (
        Strategy("native scan", _native_scan),
        Strategy("library window", _library_window),
        Strategy("native window", _native_window),
        library(plan_reduce_window),
    ),
    Opcode.SELECT_AND_SCATTER: (KERNEL, library(plan_select_and_scatter)),
    Opcode.CONVOLUTION: (KERNEL, Strategy("convolution", _convolution)),
    Opcode.FFT: (Strategy("fft", _fft), RULE),
    Opcode.RNG_BIT_GENERATOR: (Strategy("native rng", _native_rng), RULE),
    Opcode.REPLICA_ID: (library(plan_device_id),),
    Opcode.PARTITION_ID: (library(plan_device_id),),
}
"""opcode -> its lowering strategies, in order (see the file comment)."""


def strategies_for(opcode: Opcode) -> tuple[Strategy, ...]:
    """The lowering strategies of `opcode`, in order."""
    return LOWERING.get(opcode, DEFAULT_STRATEGIES)


def in_place_pairs(
    comp: HloComputation, outputs: list[BufferSlice], inputs: list[BufferSlice]
) -> tuple[tuple[int, int], ...] | None:
    """The (output, input) pairs of a kernel whose slices are the same bytes, when every
    overlap between its outputs and inputs is such a pair and the kernel can run them in
    place; None when nothing overlaps or some overlap needs a scratch copy."""
    pairs = []
    for o, out in enumerate(outputs):
        for i, inp in enumerate(inputs):
            if not out.overlaps(inp):
                continue
            if not out.same_bytes(inp) or in_place_reason(comp, o, i) is not None:
                return None
            pairs.append((o, i))
    return tuple(pairs) or None


# -- lowering one module -------------------------------------------------------------------------
class Lowering:
    """The state of lowering one module's computations to thunk sequences (see the file
    comment). `failed`: instruction -> why its kernel failed to compile in an earlier
    lowering of the same module, so this one gives it its next strategy."""

    def __init__(
        self,
        assignment: BufferAssignment,
        options: dict[str, Any],
        failed: Mapping[str, str] | None = None,
    ):
        self.assignment = assignment
        self.dataflow = assignment.dataflow
        self.options = options
        self.fallbacks: list[Fallback] = []
        self.failed = dict(failed or {})
        self.strict = strict_kernels(options)
        self.concurrency = concurrency_mode(options)
        self.flush_denormals = denormals_flushed(options)
        self.kernels: list[tuple[str, Kernel]] = []  # compiling on the JIT's pool
        self.functions: list[tuple[str, NativeFunction]] = []  # other code (direct convs)
        # while loops becoming native, inner loops before the loops around them:
        # thunk -> (its function, its plan)
        self.native_loops: dict[WhileThunk, tuple[NativeFunction, NativeLoopPlan]] = {}
        self.python_loops: list[Fallback] = []  # while loops left to the Python driver
        self.loop_depth = 0  # while loops around the computation being lowered
        # sequences with stretches of native thunks: (sequence, [(stretch, its function)])
        self.native_runs: list[tuple[ThunkSequence, list[tuple[NativeRunPlan, Any]]]] = []
        # each value's slice and each instruction's tree, made once: an instruction's are
        # asked for by every thunk that reads it (BufferSlice works out its view once)
        self._slices: dict[tuple[int, ShapeIndex], BufferSlice] = {}
        self._trees: dict[tuple[int, ShapeIndex], ValueTree] = {}
        self._supported: set[str] = set()  # canonical texts the emitter accepts

    def plan_native_runs(self, seq: ThunkSequence) -> None:
        """Start compiling `seq`'s stretches of native thunks (native_run_plans) as native
        functions on the JIT's pool; compile_loops makes them the sequence's steps. Not for
        a sequence run as a graph; compile option `native_runs=False` keeps them all in
        Python."""
        if seq.plan is not None or not self.options.get("native_runs", True):
            return
        made = []
        for run in native_run_plans(seq):
            plan = run.plan.plan
            emit = functools.partial(emit_loop, plan)
            made.append((run, request_function(repr(plan), emit, LOOP_SYMBOL, driver=True)))
        if made:
            self.native_runs.append((seq, made))

    def plan_native_loop(self, thunk: WhileThunk) -> None:
        """When `thunk` can be one native function (native_loop_plan), start compiling it on
        the JIT's pool (its IR needs no kernel address); compile_loops finishes it. A loop
        left to Python gets native runs in its condition and body instead (plan_native_runs).
        Compile option `native_loops=False` keeps every loop in Python."""
        instr = thunk.instr
        if not self.options.get("native_loops", True):
            self.python_loops.append(Fallback(instr.name, instr.opcode.text, "native_loops=False"))
            return
        inner = {t: p.one_blas_thread for t, (_, p) in self.native_loops.items()}
        planned = native_loop_plan(thunk, inner, self.options.get("inline_loop_kernels", False))
        if isinstance(planned, str):
            self.python_loops.append(Fallback(instr.name, instr.opcode.text, planned))
            # the loop stays in Python, its stretches of native thunks need not
            self.plan_native_runs(thunk.condition)
            self.plan_native_runs(thunk.body)
            return
        function = request_function(repr(planned.plan), planned.emit, LOOP_SYMBOL, driver=True)
        self.native_loops[thunk] = (function, planned)

    def compile_loops(self) -> None:
        """Make the loops plan_native_loop started native, inner loops first (an outer
        loop's table holds its inner loops' functions). Call after wait_for_kernels."""
        for thunk, (function, planned) in self.native_loops.items():
            thunk.native = NativeLoop(function, planned.table, planned.one_blas_thread)
            thunk.native.bind()
        for seq, runs in self.native_runs:
            steps: list[Thunk] = []
            done = 0
            for run, function in runs:
                planned = run.plan
                native = NativeLoop(function, planned.table, planned.one_blas_thread)
                function.address()  # compiled (the table binds on the first run)
                steps += seq.thunks[done : run.start]
                steps.append(NativeRun(seq.thunks[run.start : run.end], native))
                done = run.end
            seq.steps = steps + seq.thunks[done:]

    def wait_for_kernels(self) -> dict[str, str]:
        """Wait for the kernels this lowering asked for; {instruction: why} of those whose
        compile failed."""
        failed = {}
        for name, kernel in self.kernels:
            try:
                kernel.wait()
            except Exception as e:  # a code generator bug: loud (see the file comment)
                forget_kernel(kernel)
                failed[name] = self.kernel_failed(name, e)
        for name, function in self.functions:
            try:
                function.address()
            except Exception as e:  # a code generator bug: loud (see the file comment)
                failed[name] = self.kernel_failed(name, e)
        return failed

    def kernel_failed(self, name: str, error: Exception) -> str:
        """The reason to record for instruction `name` whose kernel failed to compile with
        `error`, after warning once; with strict_kernels, raise KernelCompileError."""
        reason = f"kernel compile failed: {type(error).__name__}: {error}"
        if self.strict:
            raise KernelCompileError(
                f"{name}: its kernel failed to compile ({type(error).__name__}: {error}); "
                f"a code generator bug (strict_kernels is on)"
            ) from error
        with _warned_lock:
            first = (name, reason) not in _warned
            _warned.add((name, reason))
        if first:
            message = f"{name}: {reason}; running it another way"
            warnings.warn(message, KernelFallbackWarning, stacklevel=2)
        return reason

    # -- slices ----------------------------------------------------------------------------
    def slice_at(self, instr: HloInstruction, index: ShapeIndex = ()) -> BufferSlice:
        key = (id(instr), index)  # (the module keeps its instructions alive meanwhile)
        found = self._slices.get(key)
        if found is None:
            value = self.dataflow.value_at(instr, index)
            s = self.assignment.slices[value]
            shape = instr.shape.subshape(index)
            found = self._slices[key] = BufferSlice(s.allocation, s.offset, s.size, shape)
        return found

    def tree_at(self, instr: HloInstruction, index: ShapeIndex = ()) -> ValueTree:
        key = (id(instr), index)
        if key in self._trees:
            return self._trees[key]
        shape = instr.shape.subshape(index)
        tree: ValueTree = None
        if shape.is_tuple:
            tree = tuple(self.tree_at(instr, (*index, i)) for i in range(len(shape.tuple_shapes)))
        elif shape.is_array:
            tree = self.slice_at(instr, index)
        self._trees[key] = tree
        return tree

    def operand_trees(self, instr: HloInstruction) -> list[ValueTree]:
        return [self.tree_at(o) for o in instr.operands]

    def leaf_copies(self, src: HloInstruction, dst: HloInstruction) -> list:
        """(from, to) slices for each array leaf where `src` and `dst` differ in bytes."""
        copies = []
        for index, shape in dst.shape.leaves():
            if not shape.is_array:
                continue
            a, b = self.slice_at(src, index), self.slice_at(dst, index)
            if not a.same_bytes(b):
                copies.append((a, b))
        return copies

    # -- sequences -------------------------------------------------------------------------
    def sequence(self, comp: HloComputation) -> ThunkSequence:
        seq = ThunkSequence(comp.name)
        for instr in self.assignment.schedule.sequence(comp):
            if instr.opcode in NO_THUNK or instr.opcode.forwards_operand:
                continue
            seq.thunks.append(self.lower(instr))
        if self.concurrency != "off" and not _meets_peers(comp):
            accesses = [t.access for t in seq.thunks]
            costs = [t.cost() for t in seq.thunks]
            alone = [t.runs_alone() for t in seq.thunks]
            seq.plan = plan_graph(accesses, costs, self.concurrency, alone)
            if seq.plan is not None and self.concurrency == "auto":
                seq.choice = GraphChoice()
        return seq

    def lower(self, instr: HloInstruction) -> Thunk:
        """The thunk of the first strategy of LOWERING that applies to `instr`."""
        why = ""
        for strategy in strategies_for(instr.opcode):
            built = strategy.build(self, instr, why)
            if isinstance(built, Thunk):
                reads = [s for o in instr.operands for s in tree_slices(self.tree_at(o))]
                built.declare(reads, tree_slices(self.tree_at(instr)))
                if self.concurrency != "off":
                    built.access = built.buffer_access()
                return built
            why = built
        raise EvaluationError(f"{instr.name}: no lowering strategy applies ({why})")

    def rule_thunk(self, instr: HloInstruction, thunk: RuleThunk) -> RuleThunk:
        """`thunk`, recorded as a fallback when it runs the interpreter's rule alone."""
        if thunk.is_fallback:
            self.fallbacks.append(Fallback(instr.name, instr.opcode.text, thunk.why))
        return thunk

    def supported(self, comp: HloComputation, text: str) -> str | None:
        """emitter.supported(comp), asked once per canonical text `text` (print_canonical:
        the precheck reads what the text holds, never the names) that the emitter accepts."""
        if text in self._supported:
            return None
        reason = supported(comp)
        if reason is None:
            self._supported.add(text)
        return reason

    def kernel_thunk(
        self, instr: HloInstruction, comp: HloComputation, text: str | None = None
    ) -> KernelThunk:
        """The kernel thunk of `instr`, running `comp` (kernel_computation(instr)) whose
        canonical text is `text` (None: worked out when needed)."""
        outputs = [self.slice_at(instr, index) for index, _ in instr.shape.leaves()]
        inputs = [self.slice_at(o) for o in instr.operands]
        pairs = in_place_pairs(comp, outputs, inputs)
        site = kernel_site(instr)
        flush = int(self.flush_denormals)
        if flush and self.loop_depth:  # may be called with the flush mode set (emit_loop.py)
            flush = FLUSH_IN_LOOP
        # with `text`, _kernel ran the precheck (self.supported) and in_place_pairs the
        # pairs' checks: the emitter need not run them again
        kernel = kernel_for(
            comp, instr.name, pairs or (), True, flush, site, text, text is not None
        )
        self.kernels.append((instr.name, kernel))
        return KernelThunk(instr, kernel, outputs, inputs)


def _meets_peers(comp: HloComputation) -> bool:
    """Whether `comp` (or a computation it calls) runs a collective or a recv, which waits
    for other devices and so must not run on the shared pool (collective_thunk.py)."""
    for instr in comp.instructions:
        if instr.opcode in COLLECTIVE_OPCODES or instr.opcode in (Opcode.SEND, Opcode.RECV):
            return True
        if instr.opcode is not Opcode.FUSION and any(
            _meets_peers(c) for c in instr.called_computations()
        ):
            return True
    return False
