"""Sequential schedulers: pick the order in which a computation's instructions run.

Any topological order is a correct program; they differ in how many bytes are live at once,
because a value's buffer can be reused only after its last user has run. Three schedulers,
as in XLA, each registered in SCHEDULERS:
  post-order  depth-first post order from the root, operands in operand order (XLA's
              default order), then whatever the root does not reach, in text order.
  dfs         depth-first from the root, but at each instruction the operand whose subtree
              has the most extra users (users beyond the first), then the most bytes, is
              visited first: the big subtree is finished and its temporaries freed before
              the small ones start (XLA's DFSMemoryScheduler).
  list        greedy list scheduling: among the ready instructions take the one that frees
              the most bytes minus the bytes it defines (XLA's ListScheduler).
`pick_best_schedule` runs all three and keeps the order with the lowest peak.

Every order puts operands and control predecessors before their users, and keeps
side-effecting instructions in their text order (each one implicitly depends on the
previous one).

Size model (replaceable: everything takes `size_fn(instr) -> bytes`). `default_size`:
an instruction defines `shape.byte_size` bytes (for a tuple-shaped result, only its table of
leaf pointers); tuple, get-tuple-element, bitcast and parameter define none. A tuple,
get-tuple-element or bitcast forwards its operands' buffers instead of defining one, so a
use of it is a use of the buffers behind it. A buffer is live from the step of its
definition to the step of its last use; the buffers behind the root stay live to the end,
and a parameter given a size is live for the whole computation. Called computations are
scheduled on their own and do not count towards their caller's peak. A later buffer
assignment replaces this with real logical buffers by passing its own size_fn.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from xlapy.errors import VerifierError
from xlapy.ir.computation import HloComputation
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.module import HloModule
from xlapy.ir.opcodes import Opcode
from xlapy.memory.heap_simulator import (
    DEFAULT_ALIGNMENT,
    HeapBuffer,
    MemoryPlanningError,
    simulate_peak,
)

SizeFn = Callable[[HloInstruction], int]


def _reuses_operand_buffers(op: Opcode) -> bool:
    """Whether the result is (part of) operand buffers rather than a new buffer: a tuple
    of its operands, or an op that forwards operand 0 (get-tuple-element, bitcast, ...)."""
    return op.forwards_operand or op is Opcode.TUPLE


def default_size(instr: HloInstruction) -> int:
    """Bytes `instr` defines under the simple size model in the module comment."""
    if instr.opcode is Opcode.PARAMETER or _reuses_operand_buffers(instr.opcode):
        return 0
    shape = instr.shape
    if shape.is_array and shape.is_unbounded_dynamic:
        return 0
    return shape.byte_size


# -- the dependence graph ---------------------------------------------------------------------
def _dependencies(comp: HloComputation) -> dict[HloInstruction, list[HloInstruction]]:
    """Per instruction, what must run before it: operands, control predecessors, and the
    previous side-effecting instruction in text order. Unique, in that order."""
    members = set(comp.instructions)
    deps: dict[HloInstruction, list[HloInstruction]] = {}
    previous_effect: HloInstruction | None = None
    for instr in comp.instructions:
        before = [*instr.operands, *instr.control_predecessors]
        for dep in before:
            if dep not in members:
                raise VerifierError(
                    f"computation {comp.name}: {instr.name} depends on {dep.name}, "
                    "which is not in the computation"
                )
        if instr.has_side_effect:
            if previous_effect is not None:
                before.append(previous_effect)
            previous_effect = instr
        deps[instr] = list(dict.fromkeys(before))
    return deps


def _cycle_error(comp: HloComputation, instr: HloInstruction) -> VerifierError:
    return VerifierError(
        f"computation {comp.name}: {instr.name} depends on itself through its operands, "
        "control predecessors or the text order of side-effecting instructions; "
        "expected an acyclic graph"
    )


def _dfs_post_order(
    comp: HloComputation,
    deps: dict[HloInstruction, list[HloInstruction]],
    starts: Iterable[HloInstruction],
    order_deps: Callable[[list[HloInstruction]], list[HloInstruction]] = list,
) -> list[HloInstruction]:
    """Iterative DFS post order over `deps` from each of `starts` in turn."""
    order: list[HloInstruction] = []
    state: dict[HloInstruction, int] = {}  # 1 on the stack, 2 done
    for start in starts:
        if start in state:
            continue
        state[start] = 1
        stack = [(start, iter(order_deps(deps[start])))]
        while stack:
            node, pending = stack[-1]
            dep = next(pending, None)
            if dep is None:
                stack.pop()
                state[node] = 2
                order.append(node)
                continue
            seen = state.get(dep)
            if seen == 2:
                continue
            if seen == 1:
                raise _cycle_error(comp, dep)
            state[dep] = 1
            stack.append((dep, iter(order_deps(deps[dep]))))
    return order


def _roots_first(comp: HloComputation) -> list[HloInstruction]:
    return ([comp.root] if comp.root is not None else []) + comp.instructions


# -- buffers under a size model ---------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Buffers:
    """The buffers each instruction defines and reads under a size function."""

    size: dict[HloInstruction, int]
    reads: dict[HloInstruction, tuple[HloInstruction, ...]]  # buffers (by definer) read
    pinned: frozenset[HloInstruction]  # live to the end: behind the root, or parameters


def _buffers(comp: HloComputation, size_fn: SizeFn, topo: list[HloInstruction]) -> _Buffers:
    """The buffers of `comp`; `topo` is its instructions, each after what it depends on."""
    size = {instr: int(size_fn(instr)) for instr in comp.instructions}
    for instr, nbytes in size.items():
        if nbytes < 0:
            raise MemoryPlanningError(
                f"size function gave {nbytes} bytes for {instr.name}; expected >= 0"
            )
    behind: dict[HloInstruction, tuple[HloInstruction, ...]] = {}

    def sources(value: HloInstruction) -> tuple[HloInstruction, ...]:
        return behind[value]

    for instr in topo:
        own: tuple[HloInstruction, ...] = (instr,) if size[instr] else ()
        if _reuses_operand_buffers(instr.opcode):
            own += tuple(b for op in instr.operands for b in sources(op))
        behind[instr] = tuple(dict.fromkeys(own))
    reads = {
        instr: tuple(dict.fromkeys(b for op in instr.operands for b in sources(op)))
        for instr in comp.instructions
        if not _reuses_operand_buffers(instr.opcode)
    }
    for instr in comp.instructions:
        reads.setdefault(instr, ())
    pinned = set(behind[comp.root]) if comp.root is not None else set()
    pinned |= {i for i in comp.instructions if i.opcode is Opcode.PARAMETER and size[i]}
    return _Buffers(size, reads, frozenset(pinned))


@dataclass(frozen=True, slots=True)
class _Graph:
    """The dependences and buffers of one computation under one size function, computed
    once and shared by every scheduler and peak computation `schedule_computation` runs."""

    deps: dict[HloInstruction, list[HloInstruction]]
    topo: list[HloInstruction]  # every instruction after its dependences (a DFS post order)
    buffers: _Buffers


def _graph(comp: HloComputation, size_fn: SizeFn) -> _Graph:
    deps = _dependencies(comp)
    topo = _dfs_post_order(comp, deps, comp.instructions)
    return _Graph(deps, topo, _buffers(comp, size_fn, topo))


def live_intervals(
    comp: HloComputation, sequence: Iterable[HloInstruction], size_fn: SizeFn = default_size
) -> dict[HloInstruction, tuple[int, int, int]]:
    """(start, end, bytes) per buffer-defining instruction for `sequence`, steps inclusive."""
    return _live_intervals(comp, sequence, _graph(comp, size_fn))


def _live_intervals(
    comp: HloComputation, sequence: Iterable[HloInstruction], graph: _Graph
) -> dict[HloInstruction, tuple[int, int, int]]:
    sequence = list(sequence)
    _validate_sequence(comp, sequence, graph.deps)
    buffers = graph.buffers
    step = {instr: i for i, instr in enumerate(sequence)}
    last = len(sequence) - 1
    end = {b: step[b] for b, nbytes in buffers.size.items() if nbytes}
    for instr, read in buffers.reads.items():
        at = step[instr]
        for b in read:
            if end[b] < at:
                end[b] = at
    intervals = {}
    for b in end:
        if b in buffers.pinned:
            start = 0 if b.opcode is Opcode.PARAMETER else step[b]
            intervals[b] = (start, last, buffers.size[b])
        else:
            intervals[b] = (step[b], end[b], buffers.size[b])
    return intervals


def peak_memory(
    comp: HloComputation, sequence: Iterable[HloInstruction], size_fn: SizeFn = default_size
) -> int:
    """The most bytes live at any step when `comp` runs in the order `sequence`."""
    return simulate_peak(live_intervals(comp, sequence, size_fn).values())[0]


def heap_buffers(
    comp: HloComputation,
    sequence: Iterable[HloInstruction],
    size_fn: SizeFn = default_size,
    alignment: int = DEFAULT_ALIGNMENT,
) -> list[HeapBuffer]:
    """The buffers of `comp` under `sequence`, ready for the heap simulator (ids are
    instruction names)."""
    return [
        HeapBuffer(instr.name, size, start, end, alignment)
        for instr, (start, end, size) in live_intervals(comp, sequence, size_fn).items()
    ]


def validate_sequence(comp: HloComputation, sequence: Iterable[HloInstruction]) -> None:
    """Raise VerifierError unless `sequence` holds every instruction of `comp` once, after its
    operands, control predecessors and earlier side-effecting instructions."""
    _validate_sequence(comp, sequence, _dependencies(comp))


def _validate_sequence(
    comp: HloComputation,
    sequence: Iterable[HloInstruction],
    deps: dict[HloInstruction, list[HloInstruction]],
) -> None:
    done: set[HloInstruction] = set()
    for instr in sequence:
        if instr not in deps:
            raise VerifierError(
                f"schedule of {comp.name}: {instr.name} is not an instruction of the computation"
            )
        if instr in done:
            raise VerifierError(f"schedule of {comp.name}: {instr.name} appears twice")
        for dep in deps[instr]:
            if dep not in done:
                raise VerifierError(
                    f"schedule of {comp.name}: {instr.name} comes before {dep.name}, "
                    "which it depends on"
                )
        done.add(instr)
    missing = [i.name for i in comp.instructions if i not in done]
    if missing:
        raise VerifierError(f"schedule of {comp.name}: missing {', '.join(missing)}")


# -- the schedulers ---------------------------------------------------------------------------
def post_order_schedule(
    comp: HloComputation, size_fn: SizeFn = default_size, graph: _Graph | None = None
) -> list[HloInstruction]:
    """Depth-first post order from the root, operands in order; unreached ones after."""
    deps = graph.deps if graph is not None else _dependencies(comp)
    return _dfs_post_order(comp, deps, _roots_first(comp))


_SATURATE = 1 << 62


def dfs_schedule(
    comp: HloComputation, size_fn: SizeFn = default_size, graph: _Graph | None = None
) -> list[HloInstruction]:
    """Depth-first post order visiting the heaviest operand subtree first."""
    graph = graph or _graph(comp, size_fn)
    deps, size = graph.deps, graph.buffers.size
    extra_users: dict[HloInstruction, int] = {}
    total_size: dict[HloInstruction, int] = {}
    for instr in graph.topo:
        operands = dict.fromkeys(instr.operands)
        extra = max(len(instr.users) - 1, 0) + sum(extra_users[d] for d in operands)
        total = size[instr] + sum(total_size[d] for d in operands)
        extra_users[instr] = min(extra, _SATURATE)
        total_size[instr] = min(total, _SATURATE)
    position = {instr: i for i, instr in enumerate(comp.instructions)}

    def heaviest_first(before: list[HloInstruction]) -> list[HloInstruction]:
        return sorted(before, key=lambda d: (-extra_users[d], -total_size[d], position[d]))

    return _dfs_post_order(comp, deps, _roots_first(comp), heaviest_first)


def list_schedule(
    comp: HloComputation, size_fn: SizeFn = default_size, graph: _Graph | None = None
) -> list[HloInstruction]:
    """Greedy: repeatedly run the ready instruction with the largest (bytes it frees - bytes
    it defines), the earliest in text order on a tie."""
    graph = graph or _graph(comp, size_fn)
    deps, buffers = graph.deps, graph.buffers
    position = {instr: i for i, instr in enumerate(comp.instructions)}
    waiting = {instr: len(before) for instr, before in deps.items()}
    dependents: dict[HloInstruction, list[HloInstruction]] = {i: [] for i in deps}
    for instr, before in deps.items():
        for dep in before:
            dependents[dep].append(instr)
    readers: dict[HloInstruction, set[HloInstruction]] = {
        b: set() for b, nbytes in buffers.size.items() if nbytes
    }
    for instr, read in buffers.reads.items():
        for b in read:
            readers[b].add(instr)
    ready: set[HloInstruction] = set()
    size, pinned = buffers.size, buffers.pinned

    def priority(instr: HloInstruction) -> int:
        freed = 0
        for b in buffers.reads[instr]:
            if b not in pinned:
                last = readers[b]
                if len(last) == 1 and instr in last:
                    freed += size[b]
        return freed - size[instr]

    queue: list[tuple[int, int, HloInstruction]] = []
    best_known: dict[HloInstruction, int] = {}

    def push(instr: HloInstruction) -> None:
        value = priority(instr)
        best_known[instr] = value
        heapq.heappush(queue, (-value, position[instr], instr))

    for instr in comp.instructions:
        if waiting[instr] == 0:
            ready.add(instr)
            push(instr)
    order: list[HloInstruction] = []
    while queue:
        negated, _, instr = heapq.heappop(queue)
        if instr not in ready or best_known[instr] != -negated:
            continue
        ready.discard(instr)
        order.append(instr)
        for b in buffers.reads[instr]:
            readers[b].discard(instr)
            if len(readers[b]) == 1:
                (last_reader,) = readers[b]
                if last_reader in ready:
                    push(last_reader)
        for user in dependents[instr]:
            waiting[user] -= 1
            if waiting[user] == 0:
                ready.add(user)
                push(user)
    if len(order) != len(comp.instructions):
        stuck = next(i for i in comp.instructions if waiting[i] > 0)
        raise _cycle_error(comp, stuck)
    return order


def text_order(comp: HloComputation) -> list[HloInstruction]:
    """The computation's instructions in text order, except that an instruction placed
    before one of its operands (a copy a pass appended) moves down to just after it."""
    position = {instr: n for n, instr in enumerate(comp.instructions)}
    waiting = {
        instr: len(set(instr.operands) | set(instr.control_predecessors))
        for instr in comp.instructions
    }
    ready = [(position[i], i.name) for i, n in waiting.items() if n == 0]
    by_name = {i.name: i for i in comp.instructions}
    heapq.heapify(ready)
    order = []
    while ready:
        _, name = heapq.heappop(ready)
        instr = by_name[name]
        order.append(instr)
        for user in dict.fromkeys([*instr.users, *instr.control_successors]):
            waiting[user] -= 1
            if waiting[user] == 0:
                heapq.heappush(ready, (position[user], user.name))
    return order


SCHEDULERS: dict[str, Callable[..., list[HloInstruction]]] = {
    "post-order": post_order_schedule,
    "dfs": dfs_schedule,
    "list": list_schedule,
}
"""Sequential schedulers by name, in the order pick_best_schedule tries them; each is called
as `scheduler(comp, size_fn)`."""


# -- results ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ComputationSchedule:
    """One computation's instruction sequence, the scheduler that made it, its peak bytes,
    and (scheduler, peak) for every scheduler tried."""

    computation: HloComputation
    sequence: tuple[HloInstruction, ...]
    algorithm: str
    peak_bytes: int
    candidates: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class Schedule:
    """A sequential order for each scheduled computation of a module (fusion computations
    are not scheduled: their instructions run inside the fusion)."""

    computations: tuple[ComputationSchedule, ...]

    def __getitem__(self, comp: HloComputation | str) -> ComputationSchedule:
        for entry in self.computations:
            if entry.computation is comp or entry.computation.name == comp:
                return entry
        name = comp if isinstance(comp, str) else comp.name
        raise MemoryPlanningError(f"the schedule has no sequence for computation {name}")

    def sequence(self, comp: HloComputation | str) -> tuple[HloInstruction, ...]:
        """The instruction order of `comp` (a computation or its name)."""
        return self[comp].sequence

    def __contains__(self, comp: HloComputation | str) -> bool:
        return any(e.computation is comp or e.computation.name == comp for e in self.computations)


def schedule_computation(
    comp: HloComputation, algorithm: str = "best", size_fn: SizeFn = default_size
) -> ComputationSchedule:
    """Schedule `comp` with the named scheduler, or with all of them ("best"), keeping the
    lowest peak (the first in SCHEDULERS order on a tie)."""
    if algorithm != "best" and algorithm not in SCHEDULERS:
        known = ", ".join(["best", *SCHEDULERS])
        raise MemoryPlanningError(f"unknown scheduler {algorithm!r}; expected one of {known}")
    names = list(SCHEDULERS) if algorithm == "best" else [algorithm]
    return _best_of(comp, _tried(comp, names, size_fn))


def schedule_candidates(
    comp: HloComputation, size_fn: SizeFn = default_size
) -> dict[str, ComputationSchedule]:
    """`schedule_computation(comp, name)` for "best" and every name of SCHEDULERS, each
    scheduler run once."""
    tried = _tried(comp, list(SCHEDULERS), size_fn)
    schedules = {n: ComputationSchedule(comp, s, n, p, ((n, p),)) for n, s, p in tried}
    schedules["best"] = _best_of(comp, tried)
    return schedules


def _tried(
    comp: HloComputation, names: list[str], size_fn: SizeFn
) -> list[tuple[str, tuple[HloInstruction, ...], int]]:
    graph = _graph(comp, size_fn)
    tried = []
    for name in names:
        sequence = tuple(SCHEDULERS[name](comp, size_fn, graph))
        peak = simulate_peak(_live_intervals(comp, sequence, graph).values())[0]
        tried.append((name, sequence, peak))
    return tried


def _best_of(
    comp: HloComputation, tried: list[tuple[str, tuple[HloInstruction, ...], int]]
) -> ComputationSchedule:
    """The tried sequence with the lowest peak (the first on a tie)."""
    name, sequence, peak = min(tried, key=lambda t: t[2])
    candidates = tuple((n, p) for n, _, p in tried)
    return ComputationSchedule(comp, sequence, name, peak, candidates)


def pick_best_schedule(comp: HloComputation, size_fn: SizeFn = default_size) -> ComputationSchedule:
    """Run every scheduler on `comp` and keep the sequence with the lowest peak memory."""
    return schedule_computation(comp, "best", size_fn)


def fusion_computations(module: HloModule) -> set[HloComputation]:
    """Computations called by fusion instructions, and everything they call."""
    fused: set[HloComputation] = set()
    pending = [
        called
        for instr in module.instructions()
        if instr.opcode is Opcode.FUSION
        for called in instr.called_computations()
    ]
    while pending:
        comp = pending.pop()
        if comp in fused:
            continue
        fused.add(comp)
        pending.extend(comp.called_computations())
    return fused


def schedule_module(
    module: HloModule, algorithm: str = "best", size_fn: SizeFn = default_size
) -> Schedule:
    """Schedule every non-fusion computation of `module` independently (the entry, while
    bodies and conditions, branches, reducers, ...), each with `algorithm`."""
    fused = fusion_computations(module)
    return Schedule(
        tuple(
            schedule_computation(comp, algorithm, size_fn)
            for comp in module.computations
            if comp not in fused
        )
    )
