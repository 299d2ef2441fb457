# Thunks: the steps a compiled CPU executable runs, and the executor that runs them over the
# memory of a buffer assignment. This module holds what every thunk family shares; each
# family has its own module beside it (kernel_thunk, dot_thunk, conv_thunk, sort_thunk,
# window_thunk, indexing_thunk, collective_thunk, control_flow_thunk, custom_call_thunk,
# copy_thunk, and rule_thunk: the interpreter's rule, for what no family handles).
#
# Every array value of the program lives in a slice of an allocation: the entry parameters'
# allocations are the caller's argument arrays, constants are filled once at compile time,
# live-out allocations are fresh arrays per execution, and every temporary shares one arena.
# A thunk knows only slices (allocation number, byte offset, shape); an ExecutionContext maps
# allocation numbers to the byte arrays of one execution, so one thunk sequence serves any
# number of concurrent executions, each with its own arena.
#
# Kernel thunks hand raw addresses to native code; library thunks work on NumPy views of the
# same bytes. Control flow moves no data when buffer assignment made the loop state, branch
# operands and results share slices (it does, after copy insertion); where two slices differ
# the control thunk copies between them, so it stays correct either way.
#
# Every thunk declares the slices it reads and writes (`reads`, `writes`: its operands' and
# result's, given by the compiler) and answers `cost()`, an estimate of one run in
# nanoseconds; from these the compiler finds independent thunks worth overlapping and a
# sequence runs them as a dependency graph over the kernel pool (thunk_graph.py).
#
# Per-thunk cost: small kernels take about a microsecond of native time, so the Python around
# each call matters. A thunk run once per execution works out its addresses from the
# execution's allocation bases (a kernel through a closure made for its argument count, a
# copy through memmove). A while loop runs the same thunks on the same addresses every
# iteration, so it first binds them (`Thunk.bind`): each becomes one callable with its
# arguments made, a kernel a ctypes call on prebuilt pointer objects.

from __future__ import annotations

import ctypes
import functools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import cffi
import numpy as np

from xlapy.backends.base import PROFILE
from xlapy.backends.cpu.runtime.loadable import deferred_attribute
from xlapy.backends.cpu.runtime.thunk_graph import Access, GraphPlan, run_graph
from xlapy.errors import EvaluationError
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.opcodes import Category, Opcode
from xlapy.ir.shapes import Shape


class SplitChoice:
    """Whether one kernel runs faster split over the pool or whole on the calling thread,
    learned from its own run times. Splitting pays a hand-off to the pool's threads (tens
    of microseconds on a loaded machine) and, for memory-bound kernels whose data sits in a
    shared cache, often gains nothing; compute-bound kernels gain nearly the core count.
    Neither can be told from the IR alone, so after one untimed warm-up run the first
    executions alternate the two ways (PROBES each), then the way with the lower median
    time among its RECENT runs is kept; every REPROBE-th execution tries the other way once,
    so a change of load is noticed. The median, not the best time: on a loaded machine a
    split run waits for whichever of its threads the OS descheduled, which a whole run
    never does, and only the typical run shows that (a 7x7 stem convolution at load 11 on
    2 cores: best 0.87 ms whole, 0.90 ms split; median 1.2 ms whole, 2.6-3.9 ms split);
    on a quiet machine the median is near the best time and picks the same way."""

    PROBES = 4
    REPROBE = 50
    RECENT = 5

    __slots__ = ("calls", "split", "times")

    def __init__(self):
        self.calls = 0
        self.times = (deque(maxlen=self.RECENT), deque(maxlen=self.RECENT))
        self.split = True

    def next_split(self) -> bool:
        """Whether the next execution should split."""
        n = self.calls
        self.calls = n + 1
        if n == 0:
            return True
        if n <= 2 * self.PROBES:
            return n % 2 == 0
        if n % self.REPROBE == 0:
            return not self.split
        return self.split

    def record(self, split: bool, seconds: float) -> None:
        if self.calls == 1:
            return  # the warm-up run: first-touch costs, not the kernel's
        self.times[split].append(seconds)
        whole, parts = self.times
        if whole and parts:
            self.split = _median(parts) < _median(whole)


def _median(times: deque[float]) -> float:
    """The middle of a few run times (the lower middle of an even count)."""
    return sorted(times)[(len(times) - 1) // 2]


class GraphChoice(SplitChoice):
    """SplitChoice for a thunk sequence: "split" runs it as a graph. A graph run that loses
    can lose badly (a helper thread preempted on a busy machine stalls the caller that
    waits for its thunk), so the other way is tried less often, and the graph is kept only
    when its best time beats the in-order runs' by MARGIN."""

    REPROBE = 200
    MARGIN = 0.95

    __slots__ = ()

    def record(self, split: bool, seconds: float) -> None:
        if self.calls == 1:
            return
        self.times[split].append(seconds)
        ordered, graph = self.times
        if ordered and graph:
            self.split = min(graph) < self.MARGIN * min(ordered)


@dataclass(frozen=True, slots=True)
class BufferSlice:
    """The bytes of one array value: `size` bytes at `offset` of allocation `allocation`,
    laid out as `shape` (with its layout) says."""

    allocation: int
    offset: int
    size: int
    shape: Shape
    # how to view the bytes, worked out once (views are made on every run of every thunk):
    # dtype, physical dims, and the transpose to logical order (None: row-major)
    _view: tuple[np.dtype, tuple[int, ...], tuple[int, ...] | None] = field(
        init=False, repr=False, compare=False, hash=False
    )

    def __post_init__(self):
        shape, recipe = self.shape, None
        if shape.is_array:
            perm = None
            if shape.layout is not None and not shape.layout.is_default and shape.rank >= 2:
                perm = tuple(
                    int(i) for i in np.argsort(tuple(reversed(shape.layout.minor_to_major)))
                )
            try:
                recipe = (shape.dtype, physical_dims(shape), perm)
            except TypeError:  # an element type with no host array representation
                recipe = None
        object.__setattr__(self, "_view", recipe)

    def overlaps(self, other: BufferSlice) -> bool:
        return (
            self.allocation == other.allocation
            and self.offset < other.offset + other.size
            and other.offset < self.offset + self.size
        )

    def same_bytes(self, other: BufferSlice) -> bool:
        return (self.allocation, self.offset, self.size) == (
            other.allocation,
            other.offset,
            other.size,
        )

    def __str__(self) -> str:
        return f"alloc{self.allocation}[{self.offset}:+{self.size}] {self.shape.to_text()}"


# any writable buffer will do; NumPy's stubs call ndarray a Buffer only on Python 3.12+
_char_from_buffer: Callable[[Any], ctypes.c_char] = ctypes.c_char.from_buffer
_addressof = ctypes.addressof
# ctypes takes writable buffers only; cffi's from_buffer takes read-only ones too
_ffi = cffi.FFI()
_cffi_from_buffer, _cffi_cast, _UINTPTR = _ffi.from_buffer, _ffi.cast, _ffi.typeof("uintptr_t")


def address(array: np.ndarray) -> int:
    """The address of `array`'s first byte. A contiguous, non-empty array's address is read
    through the buffer protocol, several times faster than `array.ctypes.data` (ctypes for a
    writable array, cffi for a read-only one: the runtime's buffers are read-only, and
    ctypes' refusal plus `ctypes.data` cost ~7 us per argument of every call)."""
    try:
        if array.flags.writeable:
            return _addressof(_char_from_buffer(array))
        return int(_cffi_cast(_UINTPTR, _cffi_from_buffer(array)))
    except (TypeError, ValueError, BufferError):
        return array.ctypes.data


def physical_dims(shape: Shape) -> tuple[int, ...]:
    """The dims of `shape` in its layout's major-to-minor order."""
    order = tuple(reversed(shape.layout_or_default.minor_to_major))
    return tuple(shape.dims[d] for d in order)


def logical_from_physical(buf: np.ndarray, shape: Shape) -> np.ndarray:
    """A logical (row-major indexed) view of the physical buffer `buf` of `shape`."""
    if shape.layout is None or shape.layout.is_default or shape.rank < 2:
        return buf
    order = tuple(reversed(shape.layout.minor_to_major))
    return np.transpose(buf, np.argsort(order))


ValueTree = Any  # BufferSlice | None (token) | tuple[ValueTree, ...]

_interpreter_lock = threading.Lock()


class ExecutionContext:
    """The memory of one execution: a byte array and its address per allocation, plus the
    interpreter that library thunks evaluate rules with (created on first use). `bases`,
    when given, are the memory's addresses already worked out (0 for None)."""

    def __init__(
        self,
        memory: list[np.ndarray | None],
        state: dict[str, Any],
        bases: list[int] | None = None,
    ):
        self.memory = memory
        self.bases = [0 if m is None else address(m) for m in memory] if bases is None else bases
        self.state = state
        self._interpreter = None
        self._native_bases: Any = None

    @property
    def native_bases(self) -> Any:
        """`bases` as a ctypes int64 array, for native code (made once per execution)."""
        made = self._native_bases
        if made is None:
            made = self._native_bases = (ctypes.c_int64 * max(1, len(self.bases)))(*self.bases)
        return made

    def ptr(self, s: BufferSlice) -> int:
        return self.bases[s.allocation] + s.offset

    def physical(self, s: BufferSlice) -> np.ndarray:
        """The slice as a writable dense array in its physical dimension order."""
        mem = self.memory[s.allocation]
        assert mem is not None, "a slice read at run time has memory"
        raw = mem[s.offset : s.offset + s.size]
        recipe = s._view
        if recipe is None:
            return raw.view(s.shape.dtype).reshape(physical_dims(s.shape))
        return raw.view(recipe[0]).reshape(recipe[1])

    def view(self, s: BufferSlice) -> np.ndarray:
        """The slice as a writable array indexed logically (a transposed view for layouts
        that are not row-major)."""
        recipe = s._view
        if recipe is None:
            return logical_from_physical(self.physical(s), s.shape)
        mem = self.memory[s.allocation]
        assert mem is not None, "a slice read at run time has memory"
        raw = mem[s.offset : s.offset + s.size].view(recipe[0]).reshape(recipe[1])
        return raw if recipe[2] is None else raw.transpose(recipe[2])

    def read(self, tree: ValueTree):
        """The interpreter value of a tree of slices (tokens are None leaves)."""
        if isinstance(tree, tuple):
            return tuple(self.read(t) for t in tree)
        if tree is None:
            from xlapy.backends.interpreter.registry import TOKEN

            return TOKEN
        return self.view(tree)

    def write(self, tree: ValueTree, value, what: str) -> None:
        """Store an interpreter value into a tree of slices."""
        if isinstance(tree, tuple):
            for t, v in zip(tree, value, strict=True):
                self.write(t, v, what)
            return
        if tree is None:
            return
        arr = np.asarray(value)
        if arr.shape != tree.shape.dims or arr.dtype != tree.shape.dtype:
            raise EvaluationError(
                f"{what}: produced {arr.dtype}{list(arr.shape)} for {tree.shape.to_text()}"
            )
        np.copyto(self.view(tree), arr, casting="no")

    def copy(self, src: BufferSlice, dst: BufferSlice) -> None:
        """Copy the bytes of `src` into `dst` (layouts must agree)."""
        a, b = self.memory[src.allocation], self.memory[dst.allocation]
        assert a is not None and b is not None, "copied slices have memory"
        b[dst.offset : dst.offset + dst.size] = a[src.offset : src.offset + src.size]

    @property
    def interpreter(self):
        if self._interpreter is None:
            from xlapy.backends.interpreter.evaluator import Interpreter

            with _interpreter_lock:  # thunks of one execution may run on two threads
                if self._interpreter is None:
                    self._interpreter = Interpreter(**self.state)
        return self._interpreter


class NativeKernel(Protocol):
    """What a thunk needs of a compiled kernel (jit.kernel.Kernel is one): its entry point
    on raw addresses and the signature it was compiled for."""

    name: str

    @property
    def function(self) -> Callable[..., object]: ...

    @property
    def in_place(self) -> tuple[tuple[int, int], ...]: ...

    @property
    def outer_extent(self) -> int: ...

    def run_raw(self, pointers: Sequence[int], start: int = 0, end: int | None = None) -> None: ...


# Run-time estimates in nanoseconds, rough (2-core x86, one thread), for deciding whether
# overlapping two thunks can pay for handing one to another thread.
NS_PER_FLOP = 0.015  # one-thread sgemm
NS_PER_KERNEL_ELEMENT = 0.3
NS_PER_COPIED_BYTE = 0.1
NS_PER_LIBRARY_ELEMENT = 1.0
NS_PER_RULE_ELEMENT = 20.0
UNKNOWN_TRIP_COUNT = 10


def touched_elements(instr: HloInstruction) -> int:
    """The elements of `instr`'s array result and array operands."""
    elements = instr.shape.num_elements if instr.shape.is_array else 0
    return elements + sum(o.shape.num_elements for o in instr.operands if o.shape.is_array)


def has_side_effect(instr: HloInstruction) -> bool:
    """Whether `instr` (or, for a library rule, a computation it calls) has side effects
    that must keep their order: rng state, infeed/outfeed, send/recv, custom calls,
    collectives (their order is the one every replica follows)."""
    op = instr.opcode
    if op.has_side_effect or op is Opcode.CUSTOM_CALL or op.category is Category.COLLECTIVE:
        return True
    if op in (Opcode.WHILE, Opcode.CONDITIONAL, Opcode.CALL, Opcode.FUSION):
        return False  # control flow: its nested thunks say; fusions are pure kernels
    return any(
        has_side_effect(i) for comp in instr.called_computations() for i in comp.instructions
    )


def slice_range(s: BufferSlice) -> tuple[int, int, int]:
    """`s` as an (allocation, start, end) byte range."""
    return (s.allocation, s.offset, s.offset + s.size)


class Thunk:
    """One step of an executable. `instr` is the HLO instruction it implements; `reads` and
    `writes` the slices it declares it reads and writes (its operands' and result's, set by
    the compiler through `declare`); `access` the memory it touches as the graph executor
    (thunk_graph.py) reads it (None: unknown, a barrier), set by the compiler from
    `buffer_access()` where sequences may run as graphs."""

    kind = "thunk"
    instr: HloInstruction
    reads: tuple[BufferSlice, ...] = ()
    writes: tuple[BufferSlice, ...] = ()
    access: Access | None = None
    IMAGE_DETACHED: tuple[str, ...] = ()
    IMAGE_DEFERRED: tuple[str, ...] = ("instr",)
    """What a program image keeps with the reports' part (loadable.deferred_attribute): a
    thunk loaded from one reads its instruction (names, shapes, costs) on first use."""

    def __getattr__(self, name: str) -> Any:
        return deferred_attribute(self, name)

    def __setstate__(self, state: dict) -> None:
        # (pickle's own way looks __setstate__ up on the instance first: a miss through
        # __getattr__ per thunk of a program image)
        self.__dict__.update(state)

    def run(self, ctx: ExecutionContext) -> None:
        raise NotImplementedError

    def bind(self, ctx: ExecutionContext) -> Callable[[], object] | None:
        """A callable that runs this thunk on `ctx`'s memory, for running it many times in
        one execution (a loop body); None when running it would do nothing."""
        return functools.partial(self.run, ctx)

    def describe(self) -> list[str]:
        """Lines of the thunk listing (the first names the thunk and its instruction)."""
        return [f"{self.kind} {self.instr.name} = {self.instr.opcode.text}"]

    def kernels(self) -> list[NativeKernel]:
        return []

    # -- what the compiler plans with ---------------------------------------------------------
    def declare(self, reads: Sequence[BufferSlice], writes: Sequence[BufferSlice]) -> None:
        """Record the slices this thunk reads and writes (an in-place result is both)."""
        self.reads, self.writes = tuple(reads), tuple(writes)

    def buffer_access(self) -> Access | None:
        """The byte ranges this thunk reads and writes, and whether it keeps its order
        among side-effecting thunks."""
        reads = [slice_range(s) for s in self.reads]
        writes = [slice_range(s) for s in self.writes]
        return Access.of(reads, writes, has_side_effect(self.instr))

    def cost(self) -> float:
        """About how many nanoseconds one run takes (see the NS_PER_* constants): a library
        thunk working on NumPy views of its operands and result."""
        return 5_000 + touched_elements(self.instr) * NS_PER_LIBRARY_ELEMENT

    def runs_alone(self) -> bool:
        """Whether this thunk keeps to the calling thread (so another thread running beside
        it adds a core's worth of work): not one that splits itself over the pool."""
        return True


@dataclass
class ThunkSequence:
    """The thunks of one computation, in schedule order. `plan`, when set, runs the
    independent ones concurrently (thunk_graph.py); with a `choice` as well, each
    execution runs as a graph or in order, whichever the choice has found faster (another
    thread helps only where a core is free, which load on the machine decides). `steps`,
    when set (a sequence without a plan), are what an unprofiled run runs in place of
    `thunks`: the same thunks with stretches of native ones each one native call
    (control_flow_thunk.NativeRun)."""

    name: str
    thunks: list[Thunk] = field(default_factory=list)
    plan: GraphPlan | None = None
    choice: GraphChoice | None = None
    steps: list[Thunk] | None = None

    def run(self, ctx: ExecutionContext) -> None:
        profile = PROFILE.get()
        if profile is not None:  # one thunk after another, each timed
            profile.run_sequence(self.name, self.thunks, lambda thunk: thunk.run(ctx))
            return
        plan = self.plan
        if plan is None:
            for thunk in self.thunks if self.steps is None else self.steps:
                thunk.run(ctx)
            return
        choice = self.choice
        if choice is None:
            run_graph(self.thunks, plan, ctx)
            return
        graph = choice.next_split()
        start = time.perf_counter()
        if graph:
            run_graph(self.thunks, plan, ctx)
        else:
            for thunk in self.thunks:
                thunk.run(ctx)
        choice.record(graph, time.perf_counter() - start)

    def bind(self, ctx: ExecutionContext) -> list[Callable[[], object]]:
        """The thunks bound to `ctx` (Thunk.bind), to call in order; a sequence that runs as
        a graph is one call, and so is one run under the profiler (which times each thunk
        of every execution, a loop body's included)."""
        if self.plan is not None or PROFILE.get() is not None:
            return [functools.partial(self.run, ctx)]
        thunks = self.thunks if self.steps is None else self.steps
        return [b for t in thunks if (b := t.bind(ctx)) is not None]

    def describe(self, indent: str = "") -> list[str]:
        head = f"{indent}sequence {self.name} ({len(self.thunks)} thunks)"
        if self.plan is not None:
            head += f" ({self.plan.describe()})"
        runs = [len(getattr(s, "thunks", ())) for s in self.steps or () if s.kind == "native-run"]
        if runs:
            head += f" ({sum(runs)} in {len(runs)} native runs)"
        lines = [head]
        for thunk in self.thunks:
            text = thunk.describe()
            lines.append(f"{indent}  {text[0]}")
            lines.extend(f"{indent}    {line}" for line in text[1:])
        return lines

    def kernels(self) -> list[NativeKernel]:
        return [k for t in self.thunks for k in t.kernels()]


def walk_thunks(sequence: ThunkSequence) -> Iterator[Thunk]:
    """Every thunk of `sequence` and of the sequences its thunks hold (loop bodies and
    conditions, branches, called computations), depth first."""
    for thunk in sequence.thunks:
        yield thunk
        for value in getattr(thunk, "__dict__", {}).values():
            nested = value if isinstance(value, list | tuple) else (value,)
            for inner in nested:
                if isinstance(inner, ThunkSequence):
                    yield from walk_thunks(inner)


def slice_lines(label: str, slices: Sequence[BufferSlice]) -> list[str]:
    return [f"{label}{i}: {s}" for i, s in enumerate(slices)]


_memmove = ctypes.memmove

RawCopy = tuple[int, int, int, int, int]
"""A copy as (destination allocation, offset, source allocation, offset, bytes)."""


def raw_copies(copies: Sequence[tuple[BufferSlice, BufferSlice]]) -> tuple[RawCopy, ...]:
    return tuple(
        (dst.allocation, dst.offset, src.allocation, src.offset, src.size)
        for src, dst in copies
        if src.size and not src.same_bytes(dst)
    )


def run_copies(bases: list[int], copies: tuple[RawCopy, ...]) -> None:
    for da, do, sa, so, size in copies:
        _memmove(bases[da] + do, bases[sa] + so, size)


def bind_copies(bases: list[int], copies: tuple[RawCopy, ...]) -> list[Callable[[], object]]:
    return [
        functools.partial(_memmove, bases[da] + do, bases[sa] + so, size)
        for da, do, sa, so, size in copies
    ]


def copy_lines(label: str, copies) -> list[str]:
    return [f"{label}: {s} -> {d}" for s, d in copies]


def tree_lines(label: str, tree: ValueTree, path: str = "") -> list[str]:
    """Listing lines for each slice of a tree of slices."""
    if isinstance(tree, tuple):
        return [line for i, t in enumerate(tree) for line in tree_lines(label, t, f"{path}{i}.")]
    if tree is None:
        return []
    return [f"{label}{{{path.rstrip('.')}}}: {tree}"]


def tree_leaves(tree: ValueTree) -> list:
    """The leaves of a tree of slices in pre-order (None for tokens)."""
    if isinstance(tree, tuple):
        return [leaf for t in tree for leaf in tree_leaves(t)]
    return [tree]


def tree_slices(tree: ValueTree) -> list[BufferSlice]:
    """The slices of a tree of slices in pre-order (tokens left out)."""
    return [leaf for leaf in tree_leaves(tree) if leaf is not None]


def tree_at(tree: ValueTree, index) -> ValueTree:
    """The subtree of `tree` at shape index `index`."""
    for i in index:
        tree = tree[i]
    return tree
