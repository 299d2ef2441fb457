"""Buffer assignment: give every HLO value a slice of a real allocation.

The steps follow XLA's BufferAssigner:
 1. fix a sequential schedule: the module's order when it is scheduled (as
    `prepare_for_buffer_assignment` leaves it: the order of post-order, DFS and list
    scheduling whose whole plan has the fewest temp bytes), else the given schedule, else
    the lowest peak of the three per computation;
 2. run the dataflow, alias and liveness analyses (xlapy.analysis) over it;
 3. check that the values of every must-share buffer do not interfere: a while loop whose
    body swaps two state elements, or an output that is also a non-donated parameter that
    the program writes to, needs copies first (the copy-insertion pass adds them);
 4. accept in-place updates: an output of dynamic-update-slice, scatter, an in-place fusion
    or an aliasing custom call joins its operand's buffer when that does not interfere
    (the operand dies there and is neither a constant nor a caller's parameter);
 5. make allocations: one per entry parameter leaf (the outputs aliased to it live there:
    donation updates in place), one per constant, one per live-out buffer, and one temp
    arena per memory space holding every other buffer, packed by the heap simulator
    (best of size- and lifetime-ordered best fit) over the buffers' live ranges. Before
    the packing, a temporary that fits in an output allocation and is dead before the
    output is written (or is the operand the output is computed over elementwise) moves
    into that allocation's bytes, as XLA reuses any allocation that is neither a
    parameter nor a constant; such allocations list the temporaries after their live-out
    buffer. Values
    inside thread-local computations (reducers, comparators, map bodies) never reach the
    arena: each array value there gets its own thread-local allocation, outside every
    total, as XLA gives one to each. Fusion bodies get none (XLA skips fusion computations:
    a fused instruction's values live in registers of the fusion's loop, never in memory).

Figures as XLA's memory_analysis() defines them: argument bytes (entry parameter
allocations), output bytes (live-out allocations, aliased parameters included), alias bytes
(allocations that are both), temp bytes (the arenas), peak = argument + output - alias +
temp, and the no-fragmentation lower bound of the temps under the chosen schedule.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from xlapy.analysis.alias import AliasAnalysis, Aliases, HloBuffer, UnionFind, value_bytes
from xlapy.analysis.dataflow import (
    Dataflow,
    DataflowAnalysis,
    DataflowError,
    HloValue,
    Use,
    sequential_computations,
)
from xlapy.analysis.liveness import Liveness, LivenessAnalysis, may_update_in_place
from xlapy.gc_pause import collector_paused
from xlapy.ir.computation import HloComputation
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.module import HloModule
from xlapy.ir.names import NameUniquer
from xlapy.ir.opcodes import Opcode
from xlapy.ir.parser import parse_module
from xlapy.ir.shapes import ShapeIndex, index_text
from xlapy.memory.heap_simulator import (
    DEFAULT_ALIGNMENT,
    HeapBuffer,
    HeapResult,
    MemoryPlanningError,
    lower_bound,
    simulate_heap,
)
from xlapy.memory.scheduler import (
    SCHEDULERS,
    ComputationSchedule,
    Schedule,
    schedule_candidates,
    schedule_computation,
    text_order,
)
from xlapy.passes.copy_insertion import CopyInsertion, drop_copies
from xlapy.passes.flatten_call_graph import FlattenCallGraph
from xlapy.passes.layout_normalize import AliasLayoutAgreement, WhileLayoutAgreement


@dataclass(frozen=True, slots=True)
class Slice:
    """`size` bytes at `offset` in allocation number `allocation`."""

    allocation: int
    offset: int
    size: int


@dataclass
class Allocation:
    """One contiguous block of memory the executable needs.

    `kind` is "parameter", "constant", "output", "temp" or "thread-local". Flags as XLA
    names them: an entry parameter records its number and shape index, and
    `is_aliased_output` when an output is computed in its bytes; `maybe_live_out` marks
    every allocation holding (part of) the result."""

    index: int
    kind: str
    size: int
    memory_space: int = 0
    parameter_number: int | None = None
    parameter_index: ShapeIndex | None = None
    maybe_live_out: bool = False
    is_aliased_output: bool = False
    is_tuple_table: bool = False
    buffers: list[tuple[HloBuffer, int]] = field(default_factory=list)  # (buffer, offset)
    computation: HloComputation | None = None  # thread-local allocations: where and
    instruction: HloInstruction | None = None  # whose value

    @property
    def is_entry_parameter(self) -> bool:
        return self.kind == "parameter"

    @property
    def is_constant(self) -> bool:
        return self.kind == "constant"

    @property
    def is_thread_local(self) -> bool:
        return self.kind == "thread-local"

    @property
    def is_temp(self) -> bool:
        return self.kind == "temp"

    def flags(self) -> list[str]:
        """The flags XLA prints for an allocation, in XLA's words."""
        flags = []
        if self.is_entry_parameter:
            index = index_text(self.parameter_index or ())
            access = "aliased" if self.is_aliased_output else "read-only"
            number = self.parameter_number
            flags.append(f"entry-parameter {number} at ShapeIndex {index} ({access})")
        if self.is_constant:
            flags.append("constant")
        if self.maybe_live_out:
            flags.append("maybe-live-out")
        if self.is_thread_local:
            name = self.computation.name if self.computation is not None else "?"
            if self.instruction is not None:
                name += f": {self.instruction.name}"
            flags.append(f"thread-local ({name})")
        if self.is_tuple_table:
            flags.append("tuple")
        if self.is_temp:
            flags.append("temp")
        if self.memory_space:
            flags.append(f"memory space {self.memory_space}")
        return flags

    def describe(self) -> str:
        return f"allocation {self.index}: {self.size} bytes, {', '.join(self.flags())}"


@dataclass(frozen=True, slots=True)
class ValueInfo:
    """What a report needs about one value."""

    value: HloValue
    slice: Slice
    start: int
    end: int
    instruction: HloInstruction
    uses: tuple[Use, ...]

    @property
    def size(self) -> int:
        return self.slice.size


@dataclass(frozen=True, slots=True)
class MemoryStats:
    """The figures of XLA's CompiledMemoryStats."""

    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    temp_bytes: int
    generated_code_bytes: int
    constant_bytes: int
    peak_bytes: int
    lower_bound_bytes: int


@dataclass
class BufferAssignment:
    """The result of assign_buffers (see the module comment)."""

    module: HloModule
    schedule: Schedule
    scheduler: str
    dataflow: Dataflow
    aliases: Aliases
    liveness: Liveness
    allocations: list[Allocation]
    slices: dict[HloValue, Slice]
    heap_results: dict[int, HeapResult]  # memory space -> packing of its temp arena
    in_place: list[tuple[HloValue, HloValue]]  # accepted (output, operand) pairs

    @property
    def entry(self) -> HloComputation:
        """The module's entry computation (assign_buffers refuses a module without one)."""
        entry = self.module.entry
        assert entry is not None
        return entry

    # -- queries ---------------------------------------------------------------------------
    def slice_of(self, instr: HloInstruction, index: ShapeIndex = ()) -> Slice:
        """The slice of the value at a position (instruction, shape index)."""
        return self.slices[self.dataflow.value_at(instr, index)]

    def allocation_of(self, instr: HloInstruction, index: ShapeIndex = ()) -> Allocation:
        return self.allocations[self.slice_of(instr, index).allocation]

    def value_infos(self) -> list[ValueInfo]:
        """One record per value, in definition order."""
        return [
            ValueInfo(
                v,
                self.slices[v],
                *self.liveness.live_range(v),
                v.instruction,
                tuple(self.dataflow.uses(v)),
            )
            for v in self.dataflow.values
        ]

    def _total(self, predicate) -> int:
        return sum(a.size for a in self.allocations if predicate(a))

    @property
    def argument_bytes(self) -> int:
        return self._total(lambda a: a.is_entry_parameter)

    @property
    def output_bytes(self) -> int:
        return self._total(lambda a: a.maybe_live_out and not a.is_constant)

    @property
    def alias_bytes(self) -> int:
        return self._total(lambda a: a.is_entry_parameter and a.maybe_live_out)

    @property
    def temp_bytes(self) -> int:
        return self._total(lambda a: a.is_temp)

    @property
    def constant_bytes(self) -> int:
        return self._total(lambda a: a.is_constant)

    @property
    def generated_code_bytes(self) -> int:
        return 0

    @property
    def peak_bytes(self) -> int:
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes

    @property
    def lower_bound_bytes(self) -> int:
        return sum(r.lower_bound for r in self.heap_results.values())

    def memory_analysis(self) -> MemoryStats:
        return MemoryStats(
            self.argument_bytes,
            self.output_bytes,
            self.alias_bytes,
            self.temp_bytes,
            self.generated_code_bytes,
            self.constant_bytes,
            self.peak_bytes,
            self.lower_bound_bytes,
        )

    def to_text(self) -> str:
        """A short listing: allocations and their values, then the figures."""
        lines = [f"BufferAssignment for {self.module.name} (scheduler: {self.scheduler})"]
        for alloc in self.allocations:
            lines.append(alloc.describe())
            for buffer, offset in alloc.buffers:
                for v in buffer.values:
                    s, e = self.liveness.live_range(v)
                    lines.append(
                        f"  {v.name}: offset {offset}, {value_bytes(v)} bytes, live {s}..{e}"
                    )
        stats = self.memory_analysis()
        for name in MemoryStats.__dataclass_fields__:
            lines.append(f"{name}: {getattr(stats, name)}")
        return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class AssignmentOptions:
    """`heap_algorithm`: a heap simulator algorithm or "best"; `alignment` of temps;
    `scheduler`: a scheduler name or "best" (used when no schedule is given);
    `in_place`: let in-place updates reuse their operand's buffer; `reuse_outputs`: let
    temporaries live in output allocations they do not interfere with; `use_module_schedule`:
    for a module marked `is_scheduled`, keep its instruction order as the schedule."""

    heap_algorithm: str = "best"
    use_module_schedule: bool = True
    alignment: int = DEFAULT_ALIGNMENT
    scheduler: str = "best"
    in_place: bool = True
    reuse_outputs: bool = True


def assign_buffers(
    module: HloModule,
    schedule: Schedule | None = None,
    options: AssignmentOptions | None = None,
) -> BufferAssignment:
    """Assign every value of `module` a slice (see the module comment). The module must have
    one call site per control-flow computation and no interfering must-share buffers (run
    flatten-call-graph and copy-insertion first); MemoryPlanningError otherwise."""
    assignment = _assign(module, schedule, options, None)
    assert assignment is not None  # (no temp bytes to beat)
    return assignment


def _assign(
    module: HloModule,
    schedule: Schedule | None,
    options: AssignmentOptions | None,
    beat: int | None,
) -> BufferAssignment | None:
    """`assign_buffers`, or None when `beat` is given and the temps cannot fit in `beat`
    bytes or fewer (their no-fragmentation lower bound is above it): the plan choice then
    skips the heap simulation of an order that cannot win."""
    options = options or AssignmentOptions()
    entry = module.entry
    if entry is None or entry.root is None:
        raise MemoryPlanningError(
            f"buffer assignment of {module.name}: expected an entry computation with a root"
        )
    try:
        dataflow = DataflowAnalysis.run(module)
        if schedule is None and options.use_module_schedule and module.config.is_scheduled:
            schedule = _module_schedule(dataflow)
        if schedule is None:
            schedule = Schedule(
                tuple(schedule_computation(c, options.scheduler) for c in dataflow.computations)
            )
        sequences = {c: schedule.sequence(c) for c in dataflow.computations}
        liveness = LivenessAnalysis.run(module, dataflow, sequences)
        aliases = AliasAnalysis.run(module, dataflow)
    except DataflowError as e:
        raise MemoryPlanningError(f"buffer assignment of {module.name}: {e}") from e
    writable = _writable_parameters(module, entry, dataflow)
    for buffer in aliases.buffers:
        if len(buffer.values) == 1:
            continue  # a value alone shares its bytes with nothing
        if all(v.shape.is_token for v in buffer.values):
            continue  # tokens hold no data: nothing of theirs can be overwritten (as XLA)
        problem = liveness.conflicts(buffer.values, writable)
        if problem is not None:
            raise MemoryPlanningError(
                f"buffer assignment of {module.name}: values that must share a buffer "
                f"interfere: {problem}; run the copy-insertion pass first"
            )
    accepted: list[tuple[HloValue, HloValue]] = []
    if options.in_place:
        accepted = _accept_in_place(dataflow, aliases, liveness, writable)
        if accepted:
            aliases = aliases.merged(accepted)
    allocated = _allocate(module, entry, dataflow, aliases, liveness, options, beat)
    if allocated is None:
        return None
    allocations, heap_results = allocated
    slices: dict[HloValue, Slice] = {}
    for alloc in allocations:
        for buffer, offset in alloc.buffers:
            for v in buffer.values:
                slices[v] = Slice(alloc.index, offset, value_bytes(v))
    entry_schedule = schedule[entry]
    return BufferAssignment(
        module,
        schedule,
        entry_schedule.algorithm,
        dataflow,
        aliases,
        liveness,
        allocations,
        slices,
        heap_results,
        accepted,
    )


def _module_schedule(dataflow: Dataflow) -> Schedule:
    return Schedule(
        tuple(
            ComputationSchedule(c, tuple(c.instructions), "module", 0, ())
            for c in dataflow.computations
        )
    )


PLAN_CANDIDATES = ("best", *SCHEDULERS)
"""The orders `prepare_for_buffer_assignment` tries, in tie-break order: "best" (each
computation's lowest peak under the scheduler's size model), then each scheduler alone."""

PLAN_ORDERS = ("plan", *PLAN_CANDIDATES, "module")
"""The orders `prepare_for_buffer_assignment` takes by name (and the backends' option
`memory_scheduler`): "plan" (the default: the candidate whose plan is smallest), one
candidate, or "module" (the module's text order, an appended copy moved after its
operands)."""


def prepare_for_buffer_assignment(module: HloModule, scheduler: str = "plan") -> str:
    """Make `module` ready for assign_buffers: flatten its call graph, then insert copies
    judged under one sequential order of each computation, which becomes the module's order
    (copy insertion and buffer assignment see the same sequence). `scheduler` names the
    order (one of PLAN_ORDERS); "plan" tries each of PLAN_CANDIDATES on a copy of the
    module, copy insertion and buffer assignment included, and keeps the one whose plan has
    the fewest temp bytes (then the lowest peak; then the earliest), as XLA keeps the
    scheduler whose heap simulation is smallest. The scheduler size model alone misjudges
    the copies that copy insertion will remove and the in-place updates and output reuse
    that buffer assignment will accept, so the real plan decides. Returns the order kept."""
    if scheduler not in PLAN_ORDERS:
        known = ", ".join(PLAN_ORDERS)
        raise MemoryPlanningError(f"unknown scheduler {scheduler!r}; expected one of {known}")
    # values that share a buffer agree on layouts (copies where the module's did not; the
    # CPU pipeline ran these already, an unoptimized compile did not)
    WhileLayoutAgreement().run(module)
    AliasLayoutAgreement().run(module)
    FlattenCallGraph().run(module)
    if scheduler == "plan":
        return _insert_copies_for_smallest_plan(module)[0]
    CopyInsertion(_order_of(scheduler)).run(module)
    return scheduler


def prepare_with_plan(
    module: HloModule, scheduler: str = "plan"
) -> tuple[HloModule, BufferAssignment | None]:
    """`prepare_for_buffer_assignment` without doing twice what the plan choice did once:
    the prepared module, and its buffer assignment when the choice made it already. When
    "plan" tried candidates, the winner's trial module (a copy of `module`, or `module`
    itself, prepared under the winning order) and its assignment are returned as they are:
    the same plan that preparing `module` in place and assigning anew gives. Otherwise
    `module` is prepared in place and returned with None (assign_buffers it). `module` is
    consumed: use the module returned."""
    if scheduler != "plan":
        prepare_for_buffer_assignment(module, scheduler)
        return module, None
    WhileLayoutAgreement().run(module)
    AliasLayoutAgreement().run(module)
    FlattenCallGraph().run(module)
    _, winner = _insert_copies_for_smallest_plan(module, keep_trial=True)
    if winner is not None:
        return winner.module, winner
    return module, None


def _order_of(scheduler: str):
    if scheduler == "module":
        return text_order

    def order(comp: HloComputation) -> tuple[HloInstruction, ...]:
        return schedule_computation(comp, scheduler).sequence

    return order


def _insert_copies_for_smallest_plan(
    module: HloModule, keep_trial: bool = False
) -> tuple[str, BufferAssignment | None]:
    """Copy insertion into `module` (flattened) under the candidate order whose plan has the
    fewest temp bytes (then the lowest peak, then the earliest candidate); the order kept,
    and with `keep_trial` the winning trial's assignment when candidates were tried (its
    module is then the prepared one; `module` is used up).
    Which copies copy insertion adds does not depend on the order, so they are added once,
    and every candidate's sequences are computed once on the module that holds them. A
    candidate whose sequences are an earlier candidate's makes the same plan: only the
    distinct ones are tried, and a module on which all candidates agree (most small
    programs) is not tried, nor copied, at all. Which copies each distinct order removes is
    judged on `module` itself, with one dataflow and alias analysis for all of them (the
    judgement edits nothing); each is then removed from a copy of the module (the last
    trial, once an earlier one has assigned, takes `module` itself) and its buffers
    assigned. The copies share `module`'s embedded computations (fusion bodies, reducers:
    most of a large module), which removing copies does not edit. A trial whose temps'
    no-fragmentation lower bound is above the best plan's temp bytes so far cannot win:
    its heap simulation is skipped."""
    with collector_paused():
        return _smallest_plan(module, keep_trial)


def _smallest_plan(module: HloModule, keep_trial: bool) -> tuple[str, BufferAssignment | None]:
    """`_insert_copies_for_smallest_plan` without pausing the collector."""
    insertion = CopyInsertion()
    names = NameUniquer(module)
    insertion.add_copies(module, names)
    schedules = {c: schedule_candidates(c) for c in sequential_computations(module)}
    distinct: dict[tuple, tuple[int, str]] = {}
    for rank, name in enumerate(PLAN_CANDIDATES):
        orders = tuple(tuple(i.name for i in s[name].sequence) for s in schedules.values())
        distinct.setdefault(orders, (rank, name))
    chosen = PLAN_CANDIDATES[0]
    won: BufferAssignment | None = None
    if len(distinct) > 1:
        dataflow = DataflowAnalysis.run(module)
        aliases = AliasAnalysis.run(module, dataflow)
        embedded = set(module.computations).difference(dataflow.computations)
        best: tuple[int, int, int] | None = None
        tried = list(distinct.values())
        for number, (rank, name) in enumerate(tried):
            judge = CopyInsertion(_candidate_order(schedules, name))
            sequences, dropped = judge.removable_copies(module, dataflow, aliases)
            last = number == len(tried) - 1
            if keep_trial and last and won is not None:
                trial = module  # nothing is judged on it any more
            else:
                trial = module.copy(share=embedded)  # every copy added, none removed yet
                sequences, dropped = _same_named(trial, sequences, dropped)
            drop_copies(trial, sequences, dropped, NameUniquer(trial))
            try:
                assignment = _assign(trial, None, None, best[0] if best is not None else None)
            except MemoryPlanningError:
                _release(trial, module, embedded)
                continue  # the module's own call reports it, if every order fails
            if assignment is None:
                _release(trial, module, embedded)
                continue  # more temp bytes than the best so far, whatever the packing
            score = (assignment.temp_bytes, assignment.peak_bytes, rank)
            if best is None or score < best:
                if won is not None:
                    _release(won.module, module, embedded)
                best, chosen, won = score, name, assignment
            else:
                _release(trial, module, embedded)
    if not keep_trial and won is not None:
        _release(won.module, module, embedded)
    if keep_trial and won is not None:
        for comp in won.module.computations:
            comp.parent = won.module  # (the trials shared the embedded computations)
        if won.module is not module:
            module.release(keep=embedded)  # used up (the docstring), its twin won
        return chosen, won
    insertion.schedule_fn = _candidate_order(schedules, chosen)
    insertion.remove_copies(module, names)
    return chosen, None


def _release(trial: HloModule, module: HloModule, shared: set[HloComputation]) -> None:
    """A trial copy that lost the plan choice taken apart (`HloModule.release`), so reference
    counting frees it, not the cyclic collector after the compile; its computations shared
    with `module` stay intact, and `module` itself is never released."""
    if trial is not module:
        trial.release(keep=shared)


def _candidate_order(schedules: dict[HloComputation, dict[str, ComputationSchedule]], name: str):
    """The order of candidate `name` in `schedules` (`name`'s own scheduler for a
    computation they do not hold)."""
    fallback = _order_of(name)

    def order(comp: HloComputation) -> tuple[HloInstruction, ...]:
        found = schedules.get(comp)
        return found[name].sequence if found is not None else fallback(comp)

    return order


def _same_named(
    clone: HloModule,
    sequences: dict[HloComputation, list[HloInstruction]],
    dropped: list[HloInstruction],
) -> tuple[dict[HloComputation, list[HloInstruction]], list[HloInstruction]]:
    """`sequences` and `dropped` (of a module that `clone` copies) in `clone`'s own
    computations and instructions, found by name."""
    comps = {c.name: c for c in clone.computations}
    instrs: dict[str, HloInstruction] = {}
    cloned: dict[HloComputation, list[HloInstruction]] = {}
    for comp, sequence in sequences.items():
        twin = comps[comp.name]
        by_name = {i.name: i for i in twin.instructions}
        cloned[twin] = [by_name[i.name] for i in sequence]
        instrs.update(by_name)
    return cloned, [instrs[c.name] for c in dropped]


def plan_as_given(module: HloModule, scheduler: str = "plan") -> BufferAssignment:
    """The buffer assignment of `module` run as it is (no optimization): a copy is
    flattened, given copies under the order `scheduler` names (PLAN_ORDERS) and assigned
    buffers. It is the plan of a backend that runs modules unoptimized (the interpreter);
    `module` is unchanged."""
    clone = parse_module(module.to_text())
    prepare_for_buffer_assignment(clone, scheduler)
    return assign_buffers(clone)


def _writable_parameters(
    module: HloModule, entry: HloComputation, dataflow: Dataflow
) -> frozenset[HloValue]:
    params = entry.parameters_by_number()
    return frozenset(
        dataflow.value_at(params[a.param_number], a.param_index)
        for a in module.config.input_output_alias
    )


def _accept_in_place(
    dataflow: Dataflow, aliases: Aliases, liveness: Liveness, writable
) -> list[tuple[HloValue, HloValue]]:
    groups = UnionFind()
    members: dict[HloBuffer, list[HloValue]] = {b: list(b.values) for b in aliases.buffers}
    accepted = []
    for pair in sorted(dataflow.in_place_pairs, key=lambda p: liveness.live_range(p.output)[0]):
        a = groups.find(aliases.buffer_of(pair.output))
        b = groups.find(aliases.buffer_of(pair.operand))
        if a is b or value_bytes(pair.output) != value_bytes(pair.operand):
            continue
        merged = members[a] + members[b]
        if liveness.conflicts(merged, writable) is not None:
            continue
        groups.union(a, b)
        members[groups.find(a)] = merged
        accepted.append((pair.output, pair.operand))
    return accepted


def _allocate(
    module: HloModule,
    entry: HloComputation,
    dataflow: Dataflow,
    aliases: Aliases,
    liveness: Liveness,
    options: AssignmentOptions,
    beat: int | None = None,
) -> tuple[list[Allocation], dict[int, HeapResult]] | None:
    assert entry.root is not None  # assign_buffers checked
    live_out = {v for _, v in dataflow.values_of(entry.root)}
    allocations: list[Allocation] = []
    temps: dict[int, list[HloBuffer]] = {}

    def new(kind: str, buffer: HloBuffer | None, **flags) -> Allocation:
        size = buffer.size if buffer is not None else flags.pop("size")
        alloc = Allocation(len(allocations), kind, size, **flags)
        if buffer is not None:
            alloc.buffers.append((buffer, 0))
            alloc.maybe_live_out = any(v in live_out for v in buffer.values)
            alloc.is_tuple_table = all(v.shape.is_tuple for v in buffer.values)
        allocations.append(alloc)
        return alloc

    aliased_params = {(a.param_number, a.param_index) for a in module.config.input_output_alias}
    for param in entry.parameters:
        for index, _ in param.shape.subshapes():
            buffer = aliases.buffer_at(param, index)
            alloc = new(
                "parameter",
                buffer,
                parameter_number=param.parameter_number,
                parameter_index=index,
            )
            alloc.is_aliased_output = (param.parameter_number, index) in aliased_params
    placed = {a.buffers[0][0] for a in allocations}
    for buffer in aliases.buffers:
        if buffer in placed:
            continue
        if any(v.instruction.opcode is Opcode.CONSTANT for v in buffer.values):
            new("constant", buffer)
        elif any(v in live_out for v in buffer.values):
            new("output", buffer)
        else:
            space = max((_memory_space(v) for v in buffer.values), default=0)
            temps.setdefault(space, []).append(buffer)
    ranges = _Ranges(liveness)
    if options.reuse_outputs:
        _reuse_output_allocations(allocations, temps, dataflow, liveness, ranges)
    heaps: list[tuple[int, list[HloBuffer], list[HeapBuffer]]] = []
    for space, buffers in sorted(temps.items()):
        if not buffers:
            continue
        groups = _operand_reuse_groups(buffers, aliases, dataflow, liveness, ranges)
        heap = [
            HeapBuffer(b.id, b.size, *ranges[b], options.alignment, groups.get(b)) for b in buffers
        ]
        heaps.append((space, buffers, heap))
    if beat is not None and sum(lower_bound(heap) for _, _, heap in heaps) > beat:
        return None
    heap_results: dict[int, HeapResult] = {}
    for space, buffers, heap in heaps:
        result = simulate_heap(heap, options.heap_algorithm)
        heap_results[space] = result
        arena = new("temp", None, size=result.heap_size, memory_space=space)
        arena.buffers.extend((b, result.offsets[b.id]) for b in buffers)
    fused = {
        called
        for comp in module.computations
        for instr in comp.instructions
        if instr.opcode is Opcode.FUSION
        for called in instr.called_computations()
    }
    for comp in sorted(dataflow.thread_local - fused, key=lambda c: c.name):
        for instr in comp.instructions:
            if not instr.shape.is_tuple:
                size = instr.shape.byte_size
                new("thread-local", None, size=size, computation=comp, instruction=instr)
    return allocations, heap_results


def _buffer_range(buffer: HloBuffer, liveness: Liveness) -> tuple[int, int]:
    """The steps a buffer's bytes are held: from its first value's start to its last value's
    end (a loop's state is held across the whole loop, gaps between its values included)."""
    ranges = [liveness.live_range(v) for v in buffer.values]
    return min(s for s, _ in ranges), max(e for _, e in ranges)


class _Ranges(dict[HloBuffer, tuple[int, int]]):
    """`_buffer_range` of each buffer asked for, computed once."""

    def __init__(self, liveness: Liveness):
        super().__init__()
        self.liveness = liveness

    def __missing__(self, buffer: HloBuffer) -> tuple[int, int]:
        found = self[buffer] = _buffer_range(buffer, self.liveness)
        return found


def _reuse_output_allocations(
    allocations: list[Allocation],
    temps: dict[int, list[HloBuffer]],
    dataflow: Dataflow,
    liveness: Liveness,
    ranges: _Ranges,
) -> None:
    """Place temporary buffers in output allocations they fit in and do not interfere with,
    as XLA's buffer assigner lets a buffer reuse any allocation that is neither a parameter
    nor a constant: a gradient computed before its output is written lives in the output's
    bytes. Largest temps first, each into the smallest output allocation that takes it.
    Placed buffers leave `temps` (and so the arena); the allocation sizes do not change."""
    outputs = [
        a
        for a in allocations
        if a.kind == "output" and not a.is_tuple_table and a.buffers and a.size > 0
    ]
    if not outputs:
        return
    outputs.sort(key=lambda a: (a.size, a.index))
    held = {a.index: [(b, *ranges[b]) for b, _ in a.buffers] for a in outputs}
    spaces = {
        a.index: max((_memory_space(v) for b, _ in a.buffers for v in b.values), default=0)
        for a in outputs
    }
    for space, buffers in temps.items():
        order = sorted(buffers, key=lambda b: (-b.size, ranges[b][0], b.id))
        for buffer in order:
            if buffer.size == 0 or all(v.shape.is_tuple for v in buffer.values):
                continue
            start, end = ranges[buffer]
            for alloc in outputs:
                if alloc.size < buffer.size or spaces[alloc.index] != space:
                    continue
                if not all(
                    _disjoint((buffer, start, end), other, dataflow, liveness)
                    for other in held[alloc.index]
                ):
                    continue
                alloc.buffers.append((buffer, 0))
                held[alloc.index].append((buffer, start, end))
                buffers.remove(buffer)
                break


def _operand_reuse_groups(
    buffers: list[HloBuffer],
    aliases: Aliases,
    dataflow: Dataflow,
    liveness: Liveness,
    ranges: _Ranges,
) -> dict[HloBuffer, int]:
    """Colocation groups for the heap simulator: a temp whose value is computed elementwise
    over a temp dying at that instruction shares its offset (XLA's heap simulator reuses a
    dying operand's buffer the same way). Each buffer takes at most one predecessor and
    gives way to at most one successor, so a group is a chain of back-to-back buffers."""
    members = set(buffers)
    taken_before: set[HloBuffer] = set()
    groups = UnionFind()
    linked = False
    for buffer in sorted(buffers, key=lambda b: (ranges[b][0], b.id)):
        start = ranges[buffer][0]
        born = [v for v in buffer.values if liveness.live_range(v)[0] == start]
        if len(born) != 1 or not born[0].is_write:
            continue
        instr = born[0].instruction
        for operand in instr.operands:
            if not operand.shape.is_array:
                continue
            before = aliases.buffer_of(dataflow.value_at(operand, ()))
            if before is buffer or before not in members or before in taken_before:
                continue
            if ranges[before][1] != start or before.size != buffer.size:
                continue
            if not _disjoint(
                (before, *ranges[before]), (buffer, start, ranges[buffer][1]), dataflow, liveness
            ):
                continue
            taken_before.add(before)
            groups.union(before, buffer)
            linked = True
            break
    if not linked:
        return {}
    roots = {b: groups.find(b) for b in buffers}
    sizes: dict[HloBuffer, int] = {}
    for root in roots.values():
        sizes[root] = sizes.get(root, 0) + 1
    return {b: root.id for b, root in roots.items() if sizes[root] > 1}


def _disjoint(a, b, dataflow: Dataflow, liveness: Liveness) -> bool:
    """Whether two buffers, each (buffer, start, end), may occupy the same bytes: their
    ranges do not overlap, or one starts exactly where the other ends and every value
    starting then is computed elementwise over every value of the other dying then."""
    (first, s1, e1), (second, s2, _) = sorted([a, b], key=lambda x: (x[1], x[2]))
    if e1 < s2:
        return True
    if e1 != s2 or s1 == s2:
        return False
    dying = [v for v in first.values if liveness.live_range(v)[1] == e1]
    born = [v for v in second.values if liveness.live_range(v)[0] == s2]
    return all(w.is_write and may_update_in_place(w, u, dataflow) for w in born for u in dying)


def _memory_space(value: HloValue) -> int:
    shape = value.shape
    if not shape.is_array or shape.layout is None:
        return 0
    return shape.layout.memory_space
