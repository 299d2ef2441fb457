# The CPU compiler: module -> passes -> buffer assignment -> thunk sequence.
#
# 1. The module (a private copy: the caller's is never changed) runs the default CPU pipeline
#    (simplification, fusion, flatten-call-graph, copy insertion), then is prepared for and
#    given a buffer assignment. The prepared module's text is kept on disk
#    (module_cache.py), so a later compile of the same module skips the passes.
# 2. Each computation that runs sequentially (the entry, while bodies and conditions,
#    branches, called computations) becomes a ThunkSequence in its schedule's order. Per
#    instruction: forwarding ops, tuples, parameters and constants need no thunk (constants
#    are written into their allocation once, here); fusions and unfused elementwise / shape /
#    reduce / gather ops the emitter supports become kernel thunks (each distinct computation is
#    compiled once per process, the JIT caches objects on disk, and the LLVM work of the
#    program's kernels runs on a thread pool while lowering goes on); dot goes to BLAS,
#    dynamic-update-slice writes its window, one-operand scatters become native in-order
#    scatter loops (emit_scatter.py), custom calls call their targets on the arena;
#    control flow nests sequences; anything else, and anything the emitter or LLVM rejects,
#    falls back to the interpreter's rule for that one instruction.
# 3. Every thunk gets the byte ranges it reads and writes (its operands' and result's slices;
#    control flow: its nested sequences' and copies' too), whether it has side effects, and
#    an estimate of its run time; a sequence with independent thunks worth overlapping gets
#    a graph plan and runs them concurrently (thunk_graph.py; option `thunk_concurrency`).

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from xlapy.backends.collectives import PERFORMED as COLLECTIVE_OPCODES
from xlapy.backends.cpu import module_cache
from xlapy.backends.cpu.emit_scatter import scatter_thunk
from xlapy.backends.cpu.emitter import denormals_flushed, in_place_reason, supported
from xlapy.backends.cpu.kernel import (
    Kernel,
    clear_loaded_objects,
    compile_computation,
    wrap_instruction,
)
from xlapy.backends.cpu.lib_collectives import CollectiveThunk
from xlapy.backends.cpu.lib_dot import PARALLEL_MIN_FLOPS
from xlapy.backends.cpu.library import (
    CustomCallThunk,
    DotThunk,
    DynamicUpdateSliceThunk,
    RuleThunk,
    blas_dot_supported,
)
from xlapy.backends.cpu.thunk_graph import Access, concurrency_mode, plan_graph
from xlapy.backends.cpu.thunks import (
    BufferSlice,
    CallThunk,
    ConditionalThunk,
    CopyThunk,
    GraphChoice,
    KernelThunk,
    Thunk,
    ThunkSequence,
    ValueTree,
    WhileThunk,
    physical_dims,
    work_elements,
)
from xlapy.errors import EvaluationError, XlapyError
from xlapy.ir.computation import HloComputation
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.module import HloModule
from xlapy.ir.opcodes import Category, Opcode
from xlapy.ir.parser import parse_module
from xlapy.ir.shapes import ShapeIndex
from xlapy.memory.buffer_assignment import (
    BufferAssignment,
    assign_buffers,
    prepare_for_buffer_assignment,
)
from xlapy.passes.pipelines import default_cpu_pipeline

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

_kernel_cache: dict[tuple, Kernel] = {}
_kernel_lock = threading.Lock()


def clear_kernel_cache() -> None:
    """Forget the kernels compiled in this process (the disk cache stays), so the next
    compile loads them from disk or compiles them again: what `xlapy bench` times."""
    with _kernel_lock:
        _kernel_cache.clear()
    clear_loaded_objects()


def kernel_for(
    comp: HloComputation,
    name: str,
    in_place: tuple[tuple[int, int], ...] = (),
    defer: bool = False,
    flush_denormals: bool = True,
) -> Kernel:
    """The compiled kernel of `comp`, compiled once per process per computation text.
    `in_place` asks for the variant whose (output leaf, parameter) pairs share their bytes
    (the caller has checked emitter.in_place_reason and passes the same slice for both).
    `defer`: the LLVM work may still be running; `kernel.wait()` before running it (and
    `forget_kernel` when that fails). `flush_denormals`: see `denormals_flushed`."""
    text = comp.to_text()
    key = (text, tuple(in_place), flush_denormals)
    with _kernel_lock:
        kernel = _kernel_cache.get(key)
    if kernel is None:
        kernel = compile_computation(
            comp,
            name,
            in_place=in_place,
            defer=True,
            comp_text=text,
            flush_denormals=flush_denormals,
        )
        with _kernel_lock:
            kernel = _kernel_cache.setdefault(key, kernel)
    if defer:
        return kernel
    try:
        return kernel.wait()
    except Exception:
        forget_kernel(kernel)
        raise


def forget_kernel(kernel: Kernel) -> None:
    """Drop `kernel` (one whose compile failed) from the process's kernel cache."""
    with _kernel_lock:
        for key in [k for k, v in _kernel_cache.items() if v is kernel]:
            del _kernel_cache[key]


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


@dataclass
class CompiledModule:
    """What the CPU compiler produces: the optimized module, its buffer assignment, the
    entry's thunk sequence and the constant allocations' bytes (shared, read-only)."""

    module: HloModule
    assignment: BufferAssignment
    entry: ThunkSequence
    constants: dict[int, np.ndarray]
    fallbacks: dict[str, str] = field(default_factory=dict)  # instruction -> reason

    def kernels(self) -> list[Kernel]:
        seen: dict[int, Kernel] = {}
        for k in self.entry.kernels():
            seen.setdefault(id(k), k)
        return list(seen.values())

    def thunk_listing(self) -> str:
        """The thunk sequence as text: kind, instruction and slices of every thunk."""
        lines = [f"CPU executable {self.module.name}"]
        for alloc in self.assignment.allocations:
            lines.append(f"  {alloc.describe()}")
        lines += self.entry.describe()
        return "\n".join(lines) + "\n"


def compile_module(
    module: HloModule, options: Mapping[str, Any] | None = None, *, text: str | None = None
) -> CompiledModule:
    """Optimize a copy of `module`, assign its buffers and lower it to thunks. `text`, when
    the caller has it, is `module.to_text()`."""
    options = dict(options or {})
    module, assignment = plan_module(module, options, text=text)
    entry_comp = module.entry_computation()
    lowering = _Lowering(assignment, options)
    entry = lowering.sequence(entry_comp)
    failed = lowering.wait_for_kernels()
    if failed:  # lower again, those instructions as rule thunks
        lowering = _Lowering(assignment, options, failed)
        entry = lowering.sequence(entry_comp)
        lowering.wait_for_kernels()
    return CompiledModule(
        module, assignment, entry, _constant_memory(assignment), lowering.fallbacks
    )


def plan_module(
    module: HloModule, options: Mapping[str, Any] | None = None, *, text: str | None = None
) -> tuple[HloModule, BufferAssignment]:
    """The optimized copy of `module` and the buffer assignment that `compile_module` lowers
    and the program executes (the memory reports read this, without generating code)."""
    options = dict(options or {})
    prepared = _prepared_module(module.to_text() if text is None else text, options, module)
    return prepared, assign_buffers(prepared)


def _prepared_module(text: str, options: Mapping[str, Any], original: HloModule) -> HloModule:
    """The module of `text` (`original` printed) optimized and prepared for buffer
    assignment, from the compiled-module cache when an earlier compile made it
    (module_cache.py) and it has `original`'s parameter and result shapes."""
    key = module_cache.cache_key(text, options)
    cached = module_cache.read(key)
    if cached is not None:
        try:
            module = parse_module(cached)
        except XlapyError:
            module = None
        if module is not None and _entry_signature(module) == _entry_signature(original):
            return module
    module = parse_module(text)
    if options.get("optimize", True):
        default_cpu_pipeline(verify=bool(options.get("verify", False))).run(module)
    prepare_for_buffer_assignment(module)
    module_cache.write(key, module.to_text())
    return module


def _entry_signature(module: HloModule) -> tuple[str, ...] | None:
    """The entry computation's parameter and result shapes, as text without layouts."""
    entry = module.entry
    if entry is None or entry.root is None:
        return None
    shapes = [p.shape for p in entry.parameters] + [entry.root.shape]
    return tuple(s.to_text(with_layout=False) for s in shapes)


def _constant_memory(assignment: BufferAssignment) -> dict[int, np.ndarray]:
    memory = {}
    for alloc in assignment.allocations:
        if not alloc.is_constant:
            continue
        mem = np.zeros(alloc.size, np.uint8)
        for buffer, offset in alloc.buffers:
            for value in buffer.values:
                instr = value.instruction
                if instr.opcode is not Opcode.CONSTANT or not value.shape.is_array:
                    continue
                literal = instr.literal
                if literal is None:
                    raise EvaluationError(
                        f"{instr.name}: the constant's value was elided from the text "
                        f"(constant({{...}})), so it cannot be compiled"
                    )
                for i in value.index:
                    literal = literal.elements[i]
                assert literal.array is not None, "an array literal holds its data"
                shape = value.shape
                order = tuple(reversed(shape.layout_or_default.minor_to_major))
                data = np.ascontiguousarray(np.transpose(literal.array, order))
                raw = data.reshape(-1).view(np.uint8)
                mem[offset : offset + raw.size] = raw
        mem.flags.writeable = False
        memory[alloc.index] = mem
    return memory


class _Lowering:
    def __init__(
        self,
        assignment: BufferAssignment,
        options: dict[str, Any],
        failed: Mapping[str, str] | None = None,
    ):
        self.assignment = assignment
        self.dataflow = assignment.dataflow
        self.options = options
        self.fallbacks: dict[str, str] = {}
        self.failed = dict(failed or {})  # instruction -> why its kernel failed to compile
        self.concurrency = concurrency_mode(options)
        self.flush_denormals = denormals_flushed(options)
        self.kernels: list[tuple[str, Kernel]] = []  # compiling on the JIT's pool

    def wait_for_kernels(self) -> dict[str, str]:
        """Wait for the kernels this lowering asked for; {instruction: why} of those whose
        compile failed."""
        failed = {}
        for name, kernel in self.kernels:
            try:
                kernel.wait()
            except Exception as e:  # any codegen failure falls back to the rule
                forget_kernel(kernel)
                failed[name] = f"kernel compile failed: {type(e).__name__}: {e}"
        return failed

    # -- slices ----------------------------------------------------------------------------
    def slice_at(self, instr: HloInstruction, index: ShapeIndex = ()) -> BufferSlice:
        value = self.dataflow.value_at(instr, index)
        s = self.assignment.slices[value]
        return BufferSlice(s.allocation, s.offset, s.size, instr.shape.subshape(index))

    def tree_at(self, instr: HloInstruction, index: ShapeIndex = ()) -> ValueTree:
        shape = instr.shape.subshape(index)
        if shape.is_tuple:
            return tuple(self.tree_at(instr, (*index, i)) for i in range(len(shape.tuple_shapes)))
        if not shape.is_array:
            return None
        return self.slice_at(instr, index)

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
            thunk = self.lower(instr)
            if self.concurrency != "off":
                thunk.access = self.access(instr, thunk)
                thunk.cost = estimate_cost(thunk)
            seq.thunks.append(thunk)
        if self.concurrency != "off" and not _meets_peers(comp):
            accesses = [t.access for t in seq.thunks]
            costs = [t.cost for t in seq.thunks]
            alone = [_runs_alone(t) for t in seq.thunks]
            seq.plan = plan_graph(accesses, costs, self.concurrency, alone)
            if seq.plan is not None and self.concurrency == "auto":
                seq.choice = GraphChoice()
        return seq

    # -- memory each thunk touches ---------------------------------------------------------
    def access(self, instr: HloInstruction, thunk: Thunk) -> Access | None:
        """The byte ranges `thunk` reads and writes: its operands' and result's slices (an
        in-place result is both), and for control flow everything its nested sequences and
        copies touch (None, a barrier, when any nested thunk's is unknown)."""
        reads = [_range(s) for o in instr.operands for s in _slices(self.tree_at(o))]
        writes = [_range(s) for s in _slices(self.tree_at(instr))]
        ordered = _has_side_effect(instr)
        if isinstance(thunk, WhileThunk):
            nested = [*thunk.condition.thunks, *thunk.body.thunks]
            copies = [
                *thunk.init_copies,
                *thunk.cond_copies,
                *thunk.body_copies,
                *thunk.back_copies,
            ]
            reads += [*writes, _range(thunk.pred)]  # the loop state is read back
        elif isinstance(thunk, ConditionalThunk):
            nested = [t for b in thunk.branches for t in b.thunks]
            copies = [c for cs in (*thunk.in_copies, *thunk.out_copies) for c in cs]
        elif isinstance(thunk, CallThunk):
            nested = list(thunk.body.thunks)
            copies = list(thunk.in_copies)
            reads += writes
        else:
            return Access.of(reads, writes, ordered)
        reads += [_range(src) for src, _ in copies]
        writes += [_range(dst) for _, dst in copies]
        own = Access.of(reads, writes, ordered)
        return Access.union([own, *(t.access for t in nested)])

    def lower(self, instr: HloInstruction) -> Thunk:
        op = instr.opcode
        if op is Opcode.WHILE:
            return self.lower_while(instr)
        if op is Opcode.CONDITIONAL:
            return self.lower_conditional(instr)
        if op is Opcode.CALL:
            comp = instr.attrs["to_apply"]
            copies = [
                c for o, p in zip(instr.operands, comp.parameters, strict=True)
                for c in self.leaf_copies(o, p)
            ]  # fmt: skip
            return CallThunk(instr, self.sequence(comp), copies)
        if op in COLLECTIVE_OPCODES:
            operands = [self.tree_at(o) for o in instr.operands]
            return CollectiveThunk(instr, operands, self.tree_at(instr))
        if op is Opcode.DOT and blas_dot_supported(instr):
            lhs, rhs = instr.operands
            return DotThunk(instr, self.slice_at(lhs), self.slice_at(rhs), self.slice_at(instr))
        if op is Opcode.DYNAMIC_UPDATE_SLICE and instr.shape.is_array:
            operand, update, *starts = instr.operands
            return DynamicUpdateSliceThunk(
                instr,
                self.slice_at(operand),
                self.slice_at(update),
                [self.slice_at(s) for s in starts],
                self.slice_at(instr),
            )
        if op is Opcode.COPY and instr.shape.is_array:
            src = self.slice_at(instr.operands[0])
            dst = self.slice_at(instr)
            if physical_dims(src.shape) == physical_dims(dst.shape) and (
                src.shape.layout_or_default == dst.shape.layout_or_default
            ):
                return CopyThunk(instr, src, dst)
        if op is Opcode.CUSTOM_CALL:
            thunk = self.lower_custom_call(instr)
            if thunk is not None:
                return thunk
        if op is Opcode.SCATTER and len(instr.operands) == 3 and instr.shape.is_array:
            inputs = [self.slice_at(o) for o in instr.operands]
            thunk = scatter_thunk(instr, self.slice_at(instr), inputs)
            if thunk is not None:
                return thunk
        why = self.failed.get(instr.name) or self.kernel_reason(instr)
        if why is None:
            try:
                return self.kernel_thunk(instr)
            except Exception as e:  # any codegen failure falls back to the rule
                why = f"kernel compile failed: {type(e).__name__}: {e}"
        return self.rule_thunk(instr, why)

    def rule_thunk(self, instr: HloInstruction, why: str | None) -> RuleThunk:
        if why:
            self.fallbacks[instr.name] = why
        operands = [self.tree_at(o) for o in instr.operands]
        return RuleThunk(instr, operands, self.tree_at(instr), why or "")

    # -- kernels ---------------------------------------------------------------------------
    def kernel_computation(self, instr: HloInstruction) -> HloComputation:
        if instr.opcode is Opcode.FUSION:
            return instr.attrs["calls"]
        return wrap_instruction(instr)

    def kernel_reason(self, instr: HloInstruction) -> str | None:
        """None when `instr` can be a kernel thunk, else why not."""
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
        return supported(self.kernel_computation(instr))

    def kernel_thunk(self, instr: HloInstruction) -> KernelThunk:
        comp = self.kernel_computation(instr)
        outputs = [self.slice_at(instr, index) for index, _ in instr.shape.leaves()]
        inputs = [self.slice_at(o) for o in instr.operands]
        pairs = in_place_pairs(comp, outputs, inputs)
        kernel = kernel_for(comp, instr.name, pairs or (), True, self.flush_denormals)
        self.kernels.append((instr.name, kernel))
        return KernelThunk(instr, kernel, outputs, inputs)

    # -- custom calls ----------------------------------------------------------------------
    def lower_custom_call(self, instr: HloInstruction) -> Thunk | None:
        from xlapy.backends.custom_calls import XLA_INTERNAL_TARGET_NAMES

        if instr.attrs.get("custom_call_target") in XLA_INTERNAL_TARGET_NAMES:
            return None
        operands = [self.tree_at(o) for o in instr.operands]
        leaves = [s for o in instr.operands for _, s in o.shape.leaves()]
        leaves += [s for _, s in instr.shape.leaves()]
        if any(s.is_array and s.layout is not None and not s.layout.is_default for s in leaves):
            return None
        result = self.tree_at(instr)
        aliases = []
        for alias in instr.attrs.get("output_to_operand_aliasing") or ():
            out = result
            for i in alias.output_index:
                out = out[i]
            aliases.append((alias.operand_number, tuple(alias.operand_index), out))
        return CustomCallThunk(instr, operands, result, aliases)

    # -- control flow ----------------------------------------------------------------------
    def lower_while(self, instr: HloInstruction) -> WhileThunk:
        cond, body = instr.attrs["condition"], instr.attrs["body"]
        init = instr.operands[0]
        limit = self.options.get("max_while_iterations")
        return WhileThunk(
            instr,
            self.sequence(cond),
            self.sequence(body),
            self.slice_at(cond.root),
            self.leaf_copies(init, instr),
            self.leaf_copies(instr, cond.parameter(0)),
            self.leaf_copies(instr, body.parameter(0)),
            self.leaf_copies(body.root, instr),
            None if limit is None else int(limit),
        )

    def lower_conditional(self, instr: HloInstruction) -> ConditionalThunk:
        branches = instr.attrs.get("branch_computations")
        is_pred = branches is None
        if branches is None:
            branches = (instr.attrs["true_computation"], instr.attrs["false_computation"])
        ins, outs, seqs = [], [], []
        for i, branch in enumerate(branches):
            copies = []
            if branch.num_parameters:
                copies = self.leaf_copies(instr.operands[i + 1], branch.parameter(0))
            ins.append(copies)
            outs.append(self.leaf_copies(branch.root, instr))
            seqs.append(self.sequence(branch))
        return ConditionalThunk(instr, self.slice_at(instr.operands[0]), seqs, ins, outs, is_pred)


def _slices(tree: ValueTree) -> list[BufferSlice]:
    if isinstance(tree, tuple):
        return [s for t in tree for s in _slices(t)]
    return [] if tree is None else [tree]


def _range(s: BufferSlice) -> tuple[int, int, int]:
    return (s.allocation, s.offset, s.offset + s.size)


def _meets_peers(comp: HloComputation) -> bool:
    """Whether `comp` (or a computation it calls) runs a collective or a recv, which waits
    for other devices and so must not run on the shared pool (lib_collectives.py)."""
    for instr in comp.instructions:
        if instr.opcode in COLLECTIVE_OPCODES or instr.opcode in (Opcode.SEND, Opcode.RECV):
            return True
        if instr.opcode is not Opcode.FUSION and any(
            _meets_peers(c) for c in instr.called_computations()
        ):
            return True
    return False


def _has_side_effect(instr: HloInstruction) -> bool:
    """Whether `instr` (or, for a library rule, a computation it calls) has side effects
    that must keep their order: rng state, infeed/outfeed, send/recv, custom calls,
    collectives (their order is the one every replica follows)."""
    op = instr.opcode
    if op.has_side_effect or op is Opcode.CUSTOM_CALL or op.category is Category.COLLECTIVE:
        return True
    if op in (Opcode.WHILE, Opcode.CONDITIONAL, Opcode.CALL, Opcode.FUSION):
        return False  # control flow: its nested thunks say; fusions are pure kernels
    return any(
        _has_side_effect(i) for comp in instr.called_computations() for i in comp.instructions
    )


# Run-time estimates in nanoseconds, rough (2-core x86, one thread), for deciding whether
# overlapping two thunks can pay for handing one to another thread.
_NS_PER_FLOP = 0.015  # one-thread sgemm
_NS_PER_KERNEL_ELEMENT = 0.3
_NS_PER_COPIED_BYTE = 0.1
_NS_PER_LIBRARY_ELEMENT = 1.0
_NS_PER_RULE_ELEMENT = 20.0
_UNKNOWN_TRIP_COUNT = 10


def estimate_cost(thunk: Thunk) -> float:
    """About how many nanoseconds one run of `thunk` takes (see the constants above)."""
    instr = thunk.instr
    if isinstance(thunk, DotThunk):
        return 2_000 + thunk.flops * _NS_PER_FLOP
    if isinstance(thunk, KernelThunk):
        elements = work_elements(instr, thunk.outputs)
        if thunk.kernel.in_place:  # writes the window its other inputs give
            shared = {i for _, i in thunk.kernel.in_place}
            others = [s for i, s in enumerate(thunk.inputs) if i not in shared]
            elements = max((s.shape.num_elements for s in others), default=1)
        return 1_000 + elements * _NS_PER_KERNEL_ELEMENT
    if isinstance(thunk, CopyThunk):
        return 500 + thunk.src.size * _NS_PER_COPIED_BYTE
    if isinstance(thunk, WhileThunk):
        trips = instr.known_trip_count or _UNKNOWN_TRIP_COUNT
        nested = [*thunk.condition.thunks, *thunk.body.thunks]
        return trips * sum(t.cost for t in nested)
    if isinstance(thunk, ConditionalThunk):
        return max((sum(t.cost for t in b.thunks) for b in thunk.branches), default=0.0)
    if isinstance(thunk, CallThunk):
        return sum(t.cost for t in thunk.body.thunks)
    if instr.opcode is Opcode.CONVOLUTION:
        return 5_000 + _convolution_flops(instr) * _NS_PER_FLOP * 2
    elements = instr.shape.num_elements if instr.shape.is_array else 0
    elements += sum(o.shape.num_elements for o in instr.operands if o.shape.is_array)
    if isinstance(thunk, RuleThunk) and thunk.fast is None:
        return 20_000 + elements * _NS_PER_RULE_ELEMENT
    return 5_000 + elements * _NS_PER_LIBRARY_ELEMENT


def _runs_alone(thunk: Thunk) -> bool:
    """Whether `thunk` keeps to the calling thread (so another thread running beside it adds
    a core's worth of work): not a dot or kernel that splits itself over the pool."""
    if isinstance(thunk, DotThunk):
        return thunk.flops < PARALLEL_MIN_FLOPS
    if isinstance(thunk, KernelThunk):
        return thunk.chunks == 1
    return thunk.instr.opcode is not Opcode.CONVOLUTION


def _convolution_flops(instr: HloInstruction) -> float:
    labels = instr.attrs.get("dim_labels")
    kernel = instr.operands[1].shape
    if labels is None or not instr.shape.is_array:
        return 0.0
    per_output = kernel.num_elements / max(kernel.dims[labels.kernel_output_feature], 1)
    return 2.0 * instr.shape.num_elements * per_output
