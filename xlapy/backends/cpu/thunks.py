# Thunks: the steps a compiled CPU executable runs, and the executor that runs them over the
# memory of a buffer assignment.
#
# Every array value of the program lives in a slice of an allocation: the entry parameters'
# allocations are the caller's argument arrays, constants are filled once at compile time,
# live-out allocations are fresh arrays per execution, and every temporary shares one arena.
# A thunk knows only slices (allocation number, byte offset, shape); an ExecutionContext maps
# allocation numbers to the byte arrays of one execution, so one thunk sequence serves any
# number of concurrent executions, each with its own arena.
#
# Kernel thunks hand raw addresses to native code; library thunks (library.py) work on NumPy
# views of the same bytes. Control flow moves no data when buffer assignment made the loop
# state, branch operands and results share slices (it does, after copy insertion); where two
# slices differ the control thunk copies between them, so it stays correct either way.
#
# A sequence runs its thunks in schedule order, or, when the compiler found independent
# thunks worth overlapping (thunk_graph.py), as a dependency graph over the kernel pool.
#
# Per-thunk cost: small kernels take about a microsecond of native time, so the Python around
# each call matters. A thunk run once per execution works out its addresses from the
# execution's allocation bases (a kernel through a closure made for its argument count, a
# copy through memmove). A while loop runs the same thunks on the same addresses every
# iteration, so it first binds them (`Thunk.bind`): each becomes one callable with its
# arguments made, a kernel a ctypes call on prebuilt pointer objects. A loop whose condition
# is one compare of two integer scalars (`i < n`) reads them from memory and compares them
# in Python instead of calling a kernel and reading back its pred.

from __future__ import annotations

import ctypes
import functools
import operator
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from xlapy.backends.base import PROFILE
from xlapy.backends.cpu.kernel import Kernel, even_blocks, pool_size, run_blocks
from xlapy.backends.cpu.thunk_graph import Access, GraphPlan, run_graph
from xlapy.errors import EvaluationError
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.opcodes import Opcode
from xlapy.ir.shapes import Shape

PARALLEL_MIN_ELEMENTS = 1 << 16
"""Kernels that touch more elements than this (their largest output, or the operand of a
reduce they compute) may split their outer range over the pool; SplitChoice decides per
kernel whether they do."""


class SplitChoice:
    """Whether one kernel runs faster split over the pool or whole on the calling thread,
    learned from its own run times. Splitting pays a hand-off to the pool's threads (tens
    of microseconds on a loaded machine) and, for memory-bound kernels whose data sits in a
    shared cache, often gains nothing; compute-bound kernels gain nearly the core count.
    Neither can be told from the IR alone, so after one untimed warm-up run the first
    executions alternate the two ways (PROBES each), then the way with the lower best time
    among its RECENT runs is kept (load only ever adds time, so the minimum is the fairer
    estimate); every REPROBE-th execution tries the other way once, so a change of load is
    noticed."""

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
            self.split = min(parts) < min(whole)


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


def work_elements(instr: HloInstruction, outputs: Sequence[BufferSlice]) -> int:
    """About how many elements a kernel for `instr` touches: its largest output, or the
    operand of a reduce it computes (a reduction reads far more than it writes)."""
    elements = max((s.shape.num_elements for s in outputs), default=0)
    comp = instr.attrs.get("calls") if instr.opcode is Opcode.FUSION else None
    for i in comp.instructions if comp is not None else (instr,):
        if i.opcode is Opcode.REDUCE:
            elements = max(elements, i.operands[0].shape.num_elements)
    return elements


@dataclass(frozen=True, slots=True)
class BufferSlice:
    """The bytes of one array value: `size` bytes at `offset` of allocation `allocation`,
    laid out as `shape` (with its layout) says."""

    allocation: int
    offset: int
    size: int
    shape: Shape

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


def address(array: np.ndarray) -> int:
    """The address of `array`'s first byte. A writable, contiguous, non-empty array's address
    is read through the buffer protocol, several times faster than `array.ctypes.data`."""
    try:
        return _addressof(_char_from_buffer(array))
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

    def ptr(self, s: BufferSlice) -> int:
        return self.bases[s.allocation] + s.offset

    def physical(self, s: BufferSlice) -> np.ndarray:
        """The slice as a writable dense array in its physical dimension order."""
        mem = self.memory[s.allocation]
        assert mem is not None, "a slice read at run time has memory"
        raw = mem[s.offset : s.offset + s.size]
        return raw.view(s.shape.dtype).reshape(physical_dims(s.shape))

    def view(self, s: BufferSlice) -> np.ndarray:
        """The slice as a writable array indexed logically (a transposed view for layouts
        that are not row-major)."""
        return logical_from_physical(self.physical(s), s.shape)

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


class Thunk:
    """One step of an executable. `instr` is the HLO instruction it implements; `access`
    the memory it touches (None: unknown, a barrier) and `cost` its estimated run time in
    nanoseconds, both set by the compiler for the graph executor (thunk_graph.py)."""

    kind = "thunk"
    instr: HloInstruction
    access: Access | None = None
    cost: float = 0.0

    def run(self, ctx: ExecutionContext) -> None:
        raise NotImplementedError

    def bind(self, ctx: ExecutionContext) -> Callable[[], object] | None:
        """A callable that runs this thunk on `ctx`'s memory, for running it many times in
        one execution (a loop body); None when running it would do nothing."""
        return functools.partial(self.run, ctx)

    def describe(self) -> list[str]:
        """Lines of the thunk listing (the first names the thunk and its instruction)."""
        return [f"{self.kind} {self.instr.name} = {self.instr.opcode.text}"]

    def kernels(self) -> list[Kernel]:
        return []


@dataclass
class ThunkSequence:
    """The thunks of one computation, in schedule order. `plan`, when set, runs the
    independent ones concurrently (thunk_graph.py); with a `choice` as well, each
    execution runs as a graph or in order, whichever the choice has found faster (another
    thread helps only where a core is free, which load on the machine decides)."""

    name: str
    thunks: list[Thunk] = field(default_factory=list)
    plan: GraphPlan | None = None
    choice: GraphChoice | None = None

    def run(self, ctx: ExecutionContext) -> None:
        profile = PROFILE.get()
        if profile is not None:  # one thunk after another, each timed
            profile.run_sequence(self.name, self.thunks, lambda thunk: thunk.run(ctx))
            return
        plan = self.plan
        if plan is None:
            for thunk in self.thunks:
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
        a graph is one call."""
        if self.plan is not None:
            return [functools.partial(self.run, ctx)]
        return [b for t in self.thunks if (b := t.bind(ctx)) is not None]

    def describe(self, indent: str = "") -> list[str]:
        head = f"{indent}sequence {self.name} ({len(self.thunks)} thunks)"
        if self.plan is not None:
            head += f" ({self.plan.describe()})"
        lines = [head]
        for thunk in self.thunks:
            text = thunk.describe()
            lines.append(f"{indent}  {text[0]}")
            lines.extend(f"{indent}    {line}" for line in text[1:])
        return lines

    def kernels(self) -> list[Kernel]:
        return [k for t in self.thunks for k in t.kernels()]


def _slice_lines(label: str, slices: Sequence[BufferSlice]) -> list[str]:
    return [f"{label}{i}: {s}" for i, s in enumerate(slices)]


def _pointer_call(fn: Callable[..., object], slots: tuple[tuple[int, int], ...], extent: int):
    """A function of an execution's allocation bases that calls kernel entry `fn` on the
    addresses of `slots` ((allocation, offset) pairs) over its whole outer range. The
    common argument counts get a closure that adds the addresses up without building a list
    (several tenths of a microsecond of a small kernel's ~1 us)."""
    if len(slots) == 1:
        ((a0, o0),) = slots
        return lambda b: fn(b[a0] + o0, 0, extent)
    if len(slots) == 2:
        (a0, o0), (a1, o1) = slots
        return lambda b: fn(b[a0] + o0, b[a1] + o1, 0, extent)
    if len(slots) == 3:
        (a0, o0), (a1, o1), (a2, o2) = slots
        return lambda b: fn(b[a0] + o0, b[a1] + o1, b[a2] + o2, 0, extent)
    if len(slots) == 4:
        (a0, o0), (a1, o1), (a2, o2), (a3, o3) = slots
        return lambda b: fn(b[a0] + o0, b[a1] + o1, b[a2] + o2, b[a3] + o3, 0, extent)
    return lambda b: fn(*[b[a] + offset for a, offset in slots], 0, extent)


class KernelThunk(Thunk):
    """A native kernel on raw addresses. An output may share its exact bytes with an input
    when the kernel was compiled for that (output, input) pair (`kernel.in_place`: it reads
    the input through the output's pointer). Any other overlap sets `scratch`: the kernel's
    arguments are noalias, so it writes fresh scratch buffers that are copied into the
    outputs afterwards."""

    kind = "kernel"

    def __init__(
        self,
        instr: HloInstruction,
        kernel: Kernel,
        outputs: Sequence[BufferSlice],
        inputs: Sequence[BufferSlice],
    ):
        self.instr = instr
        self.kernel = kernel
        self.outputs = tuple(outputs)
        self.inputs = tuple(inputs)
        in_place = set(kernel.in_place)
        self.scratch = any(
            o.overlaps(i) and not ((a, b) in in_place and o.same_bytes(i))
            for a, o in enumerate(self.outputs)
            for b, i in enumerate(self.inputs)
        )
        self._slots = tuple((s.allocation, s.offset) for s in (*self.outputs, *self.inputs))
        elements = work_elements(instr, self.outputs)
        extent = self._extent = kernel.outer_extent
        self.chunks = (
            min(extent, pool_size()) if elements > PARALLEL_MIN_ELEMENTS and extent > 1 else 1
        )
        self.split_choice = SplitChoice() if self.chunks > 1 else None
        self._call: Callable[[list[int]], object] | None = None  # made on first run

    def run(self, ctx: ExecutionContext) -> None:
        call = self._call
        if call is None:
            if self.scratch or self.split_choice is not None:
                self._run_general(ctx)
                return
            call = self._call = _pointer_call(self.kernel.function, self._slots, self._extent)
        call(ctx.bases)

    def bind(self, ctx: ExecutionContext) -> Callable[[], object] | None:
        if self.scratch or self.split_choice is not None:
            return functools.partial(self._run_general, ctx)
        bases = ctx.bases
        args = [ctypes.c_void_p(bases[a] + offset) for a, offset in self._slots]
        return functools.partial(
            self.kernel.function, *args, ctypes.c_int64(0), ctypes.c_int64(self._extent)
        )

    def _run_general(self, ctx: ExecutionContext) -> None:
        """A run through scratch buffers or with a split choice to make."""
        if self.scratch:
            outs = [np.empty(o.size, np.uint8) for o in self.outputs]
            ptrs = [address(o) for o in outs] + [ctx.ptr(i) for i in self.inputs]
        else:
            bases = ctx.bases
            ptrs = [bases[a] + offset for a, offset in self._slots]
        extent = self._extent
        choice = self.split_choice
        if choice is None:
            self.kernel.run_raw(ptrs, 0, extent)
        else:
            split = choice.next_split()
            start = time.perf_counter()
            if split:
                run = self.kernel.run_raw
                run_blocks(lambda lo, hi: run(ptrs, lo, hi), even_blocks(extent, self.chunks))
            else:
                self.kernel.run_raw(ptrs, 0, extent)
            choice.record(split, time.perf_counter() - start)
        if self.scratch:
            for o, buf in zip(self.outputs, outs, strict=True):
                mem = ctx.memory[o.allocation]
                assert mem is not None, "a kernel output has memory"
                mem[o.offset : o.offset + o.size] = buf

    def describe(self) -> list[str]:
        head = f"kernel {self.instr.name} = {self.instr.opcode.text} -> {self.kernel.name}"
        notes = []
        if self.chunks > 1:
            notes.append(f"parallel x{self.chunks} when faster")
        if self.scratch:
            notes.append("in place via scratch")
        if notes:
            head += f" ({', '.join(notes)})"
        return [head, *_slice_lines("out", self.outputs), *_slice_lines("in", self.inputs)]

    def kernels(self) -> list[Kernel]:
        return [self.kernel]


_memmove = ctypes.memmove

RawCopy = tuple[int, int, int, int, int]
"""A copy as (destination allocation, offset, source allocation, offset, bytes)."""


def _raw_copies(copies: Sequence[tuple[BufferSlice, BufferSlice]]) -> tuple[RawCopy, ...]:
    return tuple(
        (dst.allocation, dst.offset, src.allocation, src.offset, src.size)
        for src, dst in copies
        if src.size and not src.same_bytes(dst)
    )


def _run_copies(bases: list[int], copies: tuple[RawCopy, ...]) -> None:
    for da, do, sa, so, size in copies:
        _memmove(bases[da] + do, bases[sa] + so, size)


def _bind_copies(bases: list[int], copies: tuple[RawCopy, ...]) -> list[Callable[[], object]]:
    return [
        functools.partial(_memmove, bases[da] + do, bases[sa] + so, size)
        for da, do, sa, so, size in copies
    ]


class CopyThunk(Thunk):
    """A byte copy between two slices of the same shape and layout."""

    kind = "copy"

    def __init__(self, instr: HloInstruction, src: BufferSlice, dst: BufferSlice):
        self.instr, self.src, self.dst = instr, src, dst
        self._copies = _raw_copies([(src, dst)])

    def run(self, ctx: ExecutionContext) -> None:
        _run_copies(ctx.bases, self._copies)

    def bind(self, ctx: ExecutionContext) -> Callable[[], object] | None:
        bound = _bind_copies(ctx.bases, self._copies)
        return bound[0] if bound else None

    def describe(self) -> list[str]:
        return [*super().describe(), f"from {self.src}", f"to {self.dst}"]


def _copy_lines(label: str, copies) -> list[str]:
    return [f"{label}: {s} -> {d}" for s, d in copies]


_COMPARISONS: dict[str, Callable[[Any, Any], bool]] = {
    "EQ": operator.eq,
    "NE": operator.ne,
    "LT": operator.lt,
    "LE": operator.le,
    "GT": operator.gt,
    "GE": operator.ge,
}

_SCALAR_CTYPES: dict[np.dtype, Any] = {  # ctypes scalar types
    np.dtype(t): np.ctypeslib.as_ctypes_type(t)
    for t in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64)
}


@dataclass(frozen=True, slots=True)
class HostCompare:
    """A loop condition that is one compare of two integer scalars, evaluated in Python on
    the scalars read from memory: `op(lhs, rhs)` with each read as `ctype`."""

    op: Callable[[Any, Any], bool]
    ctype: Any  # a ctypes integer type
    lhs: BufferSlice
    rhs: BufferSlice

    @staticmethod
    def of(condition: ThunkSequence, pred: BufferSlice) -> HostCompare | None:
        """The host compare `condition` computes into `pred`, or None when it is anything
        else (several thunks, a fusion, floats, a compare written elsewhere)."""
        if condition.plan is not None or len(condition.thunks) != 1:
            return None
        thunk = condition.thunks[0]
        if not isinstance(thunk, KernelThunk) or thunk.instr.opcode is not Opcode.COMPARE:
            return None
        if thunk.scratch or len(thunk.inputs) != 2 or thunk.outputs != (pred,):
            return None
        lhs, rhs = thunk.inputs
        ctype = _SCALAR_CTYPES.get(lhs.shape.dtype)
        if ctype is None or lhs.shape.rank or rhs.shape.rank or rhs.shape.dtype != lhs.shape.dtype:
            return None
        direction = thunk.instr.attrs.get(
            "direction", thunk.instr.attrs.get("comparison_direction")
        )
        op = _COMPARISONS.get(getattr(direction, "text", str(direction)))
        return None if op is None else HostCompare(op, ctype, lhs, rhs)

    def bind(self, ctx: ExecutionContext) -> Callable[[], bool]:
        read = self.ctype.from_address
        lhs, rhs, op = read(ctx.ptr(self.lhs)), read(ctx.ptr(self.rhs)), self.op
        return lambda: op(lhs.value, rhs.value)


class WhileThunk(Thunk):
    """Runs the condition, reads its pred from the condition root's slice, runs the body;
    `*_copies` move the loop state where buffer assignment gave two slices (usually none).
    Each run binds the nested thunks once for all its iterations (Thunk.bind); a condition
    that is a compare of two integer scalars runs as a HostCompare."""

    kind = "while"

    def __init__(
        self,
        instr: HloInstruction,
        condition: ThunkSequence,
        body: ThunkSequence,
        pred: BufferSlice,
        init_copies,
        cond_copies,
        body_copies,
        back_copies,
        max_iterations: int | None = None,
    ):
        self.instr = instr
        self.condition, self.body, self.pred = condition, body, pred
        self.init_copies, self.cond_copies = init_copies, cond_copies
        self.body_copies, self.back_copies = body_copies, back_copies
        self.max_iterations = max_iterations
        self.host_compare = HostCompare.of(condition, pred)
        self._raw = tuple(
            _raw_copies(c) for c in (init_copies, cond_copies, body_copies, back_copies)
        )

    def run(self, ctx: ExecutionContext) -> None:
        bases = ctx.bases
        init, cond_copies, body_copies, back_copies = self._raw
        _run_copies(bases, init)
        before = _bind_copies(bases, cond_copies)
        if self.host_compare is not None:
            test = self.host_compare.bind(ctx)
        else:
            before += self.condition.bind(ctx)
            pred = ctypes.c_uint8.from_address(ctx.ptr(self.pred))

            def test() -> bool:
                return bool(pred.value)

        after = [
            *_bind_copies(bases, body_copies),
            *self.body.bind(ctx),
            *_bind_copies(bases, back_copies),
        ]
        limit = self.max_iterations
        iterations = 0
        while True:
            for step in before:
                step()
            if not test():
                return
            if limit is not None and iterations >= limit:
                raise EvaluationError(f"{self.instr.name}: while loop ran past {limit} iterations")
            for step in after:
                step()
            iterations += 1

    def describe(self) -> list[str]:
        lines = [*super().describe(), f"pred: {self.pred}"]
        if self.host_compare is not None:
            lines[0] += " (condition compared on the host)"
        return [
            *lines,
            *_copy_lines("init copy", self.init_copies),
            *_copy_lines("condition copy", self.cond_copies),
            *_copy_lines("body copy", self.body_copies),
            *_copy_lines("back copy", self.back_copies),
            *self.condition.describe(),
            *self.body.describe(),
        ]

    def kernels(self) -> list[Kernel]:
        return self.condition.kernels() + self.body.kernels()


class ConditionalThunk(Thunk):
    """Reads the pred or branch index from its slice and runs one branch (an out-of-range
    index runs the last branch, as XLA does)."""

    kind = "conditional"

    def __init__(
        self,
        instr: HloInstruction,
        selector: BufferSlice,
        branches: Sequence[ThunkSequence],
        in_copies: Sequence,
        out_copies: Sequence,
        is_pred: bool,
    ):
        self.instr, self.selector, self.branches = instr, selector, tuple(branches)
        self.in_copies, self.out_copies, self.is_pred = tuple(in_copies), tuple(out_copies), is_pred
        self._in = tuple(_raw_copies(c) for c in self.in_copies)
        self._out = tuple(_raw_copies(c) for c in self.out_copies)
        self._ctype = ctypes.c_uint8 if is_pred else _SCALAR_CTYPES[selector.shape.dtype]

    def run(self, ctx: ExecutionContext) -> None:
        value = self._ctype.from_address(ctx.ptr(self.selector)).value
        if self.is_pred:
            index = 0 if value else 1
        else:
            index = value
            if not 0 <= index < len(self.branches):
                index = len(self.branches) - 1
        bases = ctx.bases
        _run_copies(bases, self._in[index])
        self.branches[index].run(ctx)
        _run_copies(bases, self._out[index])

    def describe(self) -> list[str]:
        lines = [*super().describe(), f"selector: {self.selector}"]
        for i, branch in enumerate(self.branches):
            lines += _copy_lines(f"branch {i} in", self.in_copies[i])
            lines += _copy_lines(f"branch {i} out", self.out_copies[i])
            lines += branch.describe()
        return lines

    def kernels(self) -> list[Kernel]:
        return [k for b in self.branches for k in b.kernels()]


class CallThunk(Thunk):
    """Runs the called computation's thunks (its result is the root's slices)."""

    kind = "call"

    def __init__(self, instr: HloInstruction, body: ThunkSequence, in_copies):
        self.instr, self.body, self.in_copies = instr, body, tuple(in_copies)
        self._in = _raw_copies(self.in_copies)

    def run(self, ctx: ExecutionContext) -> None:
        _run_copies(ctx.bases, self._in)
        self.body.run(ctx)

    def describe(self) -> list[str]:
        return [*super().describe(), *_copy_lines("in", self.in_copies), *self.body.describe()]

    def kernels(self) -> list[Kernel]:
        return self.body.kernels()
