# Control-flow thunks: while, conditional and call run nested thunk sequences; each copies
# the loop state, branch operands or call arguments where buffer assignment gave two slices
# (usually none). A while run binds its nested thunks once for all its iterations
# (Thunk.bind); a loop whose condition is one compare of two integer scalars (`i < n`) reads
# them from memory and compares them in Python (HostCompare) instead of calling a kernel and
# reading back its pred. Their buffer accesses and costs are their nested sequences'.
#
# A loop whose condition and body are all native kernels and copies (nested native loops
# among them) runs as one native function instead (NativeLoop: the compiler emits it with
# codegen/emit_loop.py once the kernels are loaded): no Python between iterations, about a
# microsecond saved per kernel call of each iteration. Under the profiler a loop runs its
# thunks from Python, so each thunk of the condition and body is timed on every iteration.

from __future__ import annotations

import ctypes
import functools
import operator
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from xlapy.backends.base import PROFILE
from xlapy.backends.cpu.runtime.dot_thunk import blas_thread_setter
from xlapy.backends.cpu.runtime.kernel_thunk import KernelThunk
from xlapy.backends.cpu.runtime.loadable import loadable
from xlapy.backends.cpu.runtime.thunk import (
    UNKNOWN_TRIP_COUNT,
    BufferSlice,
    ExecutionContext,
    NativeKernel,
    Thunk,
    ThunkSequence,
    bind_copies,
    copy_lines,
    has_side_effect,
    raw_copies,
    run_copies,
    slice_range,
)
from xlapy.backends.cpu.runtime.thunk_graph import Access
from xlapy.errors import EvaluationError
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.opcodes import Opcode

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
        op = _COMPARISONS.get(thunk.instr.comparison_direction or "")
        return None if op is None else HostCompare(op, ctype, lhs, rhs)

    def bind(self, ctx: ExecutionContext) -> Callable[[], bool]:
        read = self.ctype.from_address
        lhs, rhs, op = read(ctx.ptr(self.lhs)), read(ctx.ptr(self.rhs)), self.op
        return lambda: op(lhs.value, rhs.value)


def _nested_access(
    thunk: Thunk, extra_reads: list[BufferSlice], nested: list[Thunk], copies: list
) -> Access | None:
    """A control-flow thunk's access: its own slices (`extra_reads` besides its operands),
    its copies', and everything its nested thunks touch (None, a barrier, when any nested
    thunk's access is unknown)."""
    reads = [slice_range(s) for s in (*thunk.reads, *extra_reads)]
    writes = [slice_range(s) for s in thunk.writes]
    reads += [slice_range(src) for src, _ in copies]
    writes += [slice_range(dst) for _, dst in copies]
    own = Access.of(reads, writes, has_side_effect(thunk.instr))
    return Access.union([own, *(t.access for t in nested)])


_LOOP_FUNCTION = ctypes.CFUNCTYPE(
    ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64
)


class NativeLoop:
    """A while loop compiled to one native function `i32 f(i64* bases, i64* table, i64
    limit, i64 budget)` (codegen/emit_loop.py) and the table of entry points it calls: the
    kernels' addresses and, for a nested native loop, its function's and its table's. It
    runs ROUND iterations a call, so Python handles signals (Ctrl-C on a loop that never
    ends) between calls. With `one_blas_thread` (a gemm it calls is big enough for OpenBLAS
    to start threads) OpenBLAS is limited to the calling thread around the calls, as the
    runtime does around such a dot (thread-local, so nothing else is affected).

    `code` answers the function's address (`code.address()`, jit.kernel.NativeFunction: it
    also keeps the code mapped) and each of `entries` one address of the table, so a loop
    pickles without addresses (a program image, jit/executable_cache.py) and binds them
    in the process that runs it, on first use (`bind`). The entries are kept as one flat
    tuple, (function, argument count, *arguments) per entry: one object for an image to
    make where partial applications were three each (a large training step's loops have
    hundreds of entries)."""

    ROUND = 1 << 20

    def __init__(
        self,
        code: Any,
        entries: Sequence[Callable[[], int]],
        one_blas_thread: bool = False,
    ):
        table: list[Any] = []
        for e in entries:
            if type(e) is functools.partial and not (e.keywords or vars(e)):
                table += (e.func, len(e.args), *e.args)
            else:
                table += (e, 0)
        self.code, self.one_blas_thread = code, one_blas_thread
        self._table = tuple(table)
        self._bound: tuple[Any, Any, int, int, Any] | None = None

    def __reduce__(self):
        return (_native_loop, (self.code, self._table, self.one_blas_thread))

    @property
    def entries(self) -> tuple[Callable[[], int], ...]:
        """What each address of the table is looked up by."""
        return tuple(functools.partial(f, *args) for f, args in _calls(self._table))

    def bind(self) -> tuple[Any, Any, int, int, Any]:
        """(the function, the table, the function's address, the table's address, the BLAS
        thread setter or None), resolving the addresses on the first call."""
        if self._bound is None:
            address = self.code.address()
            values = [f(*args) for f, args in _calls(self._table)]
            table = (ctypes.c_int64 * max(1, len(values)))(*values)
            setter = blas_thread_setter() if self.one_blas_thread else None
            function = _LOOP_FUNCTION(address)
            self._bound = (function, table, address, ctypes.addressof(table), setter)
        return self._bound

    @property
    def address(self) -> int:
        """The loop function's address (for an outer native loop's table)."""
        return self.bind()[2]

    @property
    def table_address(self) -> int:
        """The address of this loop's table (for an outer native loop's table)."""
        return self.bind()[3]

    @property
    def thread_setter(self) -> Any:
        """What limits OpenBLAS to the calling thread around the loop (None: not needed)."""
        return self.bind()[4]

    def run(self, bases: list[int], limit: int | None, memory: Any = None) -> bool:
        """Run the loop on an execution's allocation bases: False when some loop ran past
        `limit` iterations (None: no limit), else True. `memory`: the bases as a ctypes
        int64 array, when the caller has made it (ExecutionContext.native_bases)."""
        function, table, _, _, setter = self.bind()
        if memory is None:
            memory = (ctypes.c_int64 * len(bases))(*bases)
        left = -1 if limit is None else limit
        previous = None if setter is None else setter(1)
        try:
            while True:
                status = function(memory, table, left, self.ROUND)
                if status != 2:
                    return status == 0
                if left >= 0:
                    left -= self.ROUND
        finally:
            if setter is not None:
                setter(previous)


def _calls(table: tuple) -> Iterator[tuple[Any, tuple]]:
    """(function, arguments) of each entry of a flat table (NativeLoop)."""
    at, end = 0, len(table)
    while at < end:
        count = table[at + 1]
        yield table[at], table[at + 2 : at + 2 + count]
        at += 2 + count


@loadable
def _native_loop(code: Any, table: tuple, one_blas_thread: bool) -> NativeLoop:
    """A NativeLoop of a program image, its flat table checked (every function callable,
    every count within the table) before anything runs it."""
    at, end = 0, len(table)
    while at < end:
        count = table[at + 1] if at + 1 < end else None
        if not (type(count) is int and 0 <= count <= end - at - 2 and callable(table[at])):
            raise ValueError(f"a native loop's table is malformed at item {at}")
        at += 2 + count
    loop = NativeLoop.__new__(NativeLoop)
    loop.code, loop.one_blas_thread = code, bool(one_blas_thread)
    loop._table, loop._bound = table, None
    return loop


class NativeRun(Thunk):
    """A stretch of consecutive thunks of a sequence run by one native function (a
    NativeLoop whose plan has no pred, codegen/emit_loop.py): kernels, copies and dots that
    are one gemm or one gemm list, called in order with no Python between them (about a
    microsecond saved per kernel, a few per dot). The sequence keeps its thunks for the
    listing and the profiler (which times them one by one); `thunks` are the ones this run
    stands for."""

    kind = "native-run"

    def __init__(self, thunks: Sequence[Thunk], native: NativeLoop):
        self.thunks, self.native = tuple(thunks), native
        self.instr = thunks[0].instr

    def run(self, ctx: ExecutionContext) -> None:
        function, table, _, _, setter = self.native.bind()
        if setter is not None:
            self.native.run(ctx.bases, None, ctx.native_bases)
            return
        function(ctx.native_bases, table, -1, 0)  # a straight run returns 0

    def bind(self, ctx: ExecutionContext) -> Callable[[], object] | None:
        return functools.partial(self.run, ctx)

    def kernels(self) -> list[NativeKernel]:
        return [k for t in self.thunks for k in t.kernels()]

    def cost(self) -> float:
        return sum(t.cost() for t in self.thunks)


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
            raw_copies(c) for c in (init_copies, cond_copies, body_copies, back_copies)
        )
        self.native: NativeLoop | None = None

    @property
    def raw_copies(self):
        """The init, condition, body and back copies as (dst allocation, dst offset, src
        allocation, src offset, size) tuples."""
        return self._raw

    def run(self, ctx: ExecutionContext) -> None:
        bases = ctx.bases
        init, cond_copies, body_copies, back_copies = self._raw
        run_copies(bases, init)
        if self.native is not None and PROFILE.get() is None:
            limit = self.max_iterations
            if not self.native.run(bases, limit):
                raise EvaluationError(
                    f"{self.instr.name}: while loop (or one nested in it) ran past {limit} "
                    f"iterations"
                )
            return
        before = bind_copies(bases, cond_copies)
        if self.host_compare is not None:
            test = self.host_compare.bind(ctx)
        else:
            before += self.condition.bind(ctx)
            pred = ctypes.c_uint8.from_address(ctx.ptr(self.pred))

            def test() -> bool:
                return bool(pred.value)

        after = [
            *bind_copies(bases, body_copies),
            *self.body.bind(ctx),
            *bind_copies(bases, back_copies),
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
        if self.native is not None:
            lines[0] += " (native loop)"
        elif self.host_compare is not None:
            lines[0] += " (condition compared on the host)"
        return [
            *lines,
            *copy_lines("init copy", self.init_copies),
            *copy_lines("condition copy", self.cond_copies),
            *copy_lines("body copy", self.body_copies),
            *copy_lines("back copy", self.back_copies),
            *self.condition.describe(),
            *self.body.describe(),
        ]

    def kernels(self) -> list[NativeKernel]:
        return self.condition.kernels() + self.body.kernels()

    def buffer_access(self) -> Access | None:
        nested = [*self.condition.thunks, *self.body.thunks]
        copies = [*self.init_copies, *self.cond_copies, *self.body_copies, *self.back_copies]
        # the loop state is read back every iteration
        return _nested_access(self, [*self.writes, self.pred], nested, copies)

    def cost(self) -> float:
        trips = self.instr.known_trip_count or UNKNOWN_TRIP_COUNT
        return trips * sum(t.cost() for t in [*self.condition.thunks, *self.body.thunks])


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
        self._in = tuple(raw_copies(c) for c in self.in_copies)
        self._out = tuple(raw_copies(c) for c in self.out_copies)
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
        run_copies(bases, self._in[index])
        self.branches[index].run(ctx)
        run_copies(bases, self._out[index])

    def describe(self) -> list[str]:
        lines = [*super().describe(), f"selector: {self.selector}"]
        for i, branch in enumerate(self.branches):
            lines += copy_lines(f"branch {i} in", self.in_copies[i])
            lines += copy_lines(f"branch {i} out", self.out_copies[i])
            lines += branch.describe()
        return lines

    def kernels(self) -> list[NativeKernel]:
        return [k for b in self.branches for k in b.kernels()]

    def buffer_access(self) -> Access | None:
        nested = [t for b in self.branches for t in b.thunks]
        copies = [c for cs in (*self.in_copies, *self.out_copies) for c in cs]
        return _nested_access(self, [], nested, copies)

    def cost(self) -> float:
        return max((sum(t.cost() for t in b.thunks) for b in self.branches), default=0.0)


class CallThunk(Thunk):
    """Runs the called computation's thunks (its result is the root's slices)."""

    kind = "call"

    def __init__(self, instr: HloInstruction, body: ThunkSequence, in_copies):
        self.instr, self.body, self.in_copies = instr, body, tuple(in_copies)
        self._in = raw_copies(self.in_copies)

    def run(self, ctx: ExecutionContext) -> None:
        run_copies(ctx.bases, self._in)
        self.body.run(ctx)

    def describe(self) -> list[str]:
        return [*super().describe(), *copy_lines("in", self.in_copies), *self.body.describe()]

    def kernels(self) -> list[NativeKernel]:
        return self.body.kernels()

    def buffer_access(self) -> Access | None:
        return _nested_access(self, list(self.writes), list(self.body.thunks), list(self.in_copies))

    def cost(self) -> float:
        return sum(t.cost() for t in self.body.thunks)
