# Kernel thunks: a native kernel (jit.kernel.Kernel, compiled from codegen's LLVM IR) called
# on the raw addresses of its output and input slices over its outer range, whole on the
# calling thread or split over the pool where that measures faster (SplitChoice).

from __future__ import annotations

import ctypes
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

from xlapy.backends.cpu.runtime.host_memory import empty_bytes
from xlapy.backends.cpu.runtime.native_pool import MAX_ARGS, native_pool
from xlapy.backends.cpu.runtime.pool import BLOCKS_PER_THREAD, even_blocks, pool_size, run_blocks
from xlapy.backends.cpu.runtime.thunk import (
    NS_PER_KERNEL_ELEMENT,
    BufferSlice,
    ExecutionContext,
    NativeKernel,
    SplitChoice,
    Thunk,
    address,
    slice_lines,
)
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.opcodes import Opcode

PARALLEL_MIN_ELEMENTS = 1 << 16
"""Kernels that touch at least this many elements (their largest output, or the operand of
a reduce they compute) may split their outer range over the pool; SplitChoice decides per
kernel whether they do. (XLA's parallel task assigner gives an I/O-bound loop two tasks
from 512 KiB accessed: 64Ki f32 elements read and written.)"""

DOT_PARALLEL_MIN_ELEMENTS = 1 << 20
"""A dot kernel (a matrix-vector product, codegen/emit_gemv.py) may split only from this many
elements of its larger operand (4 MiB of f32, ~250 us on one core): a 512 x 512 one inside
a native loop (~40 us a call) measured 5x slower split in two on the busy 2-core machine,
where the hand-off waits for a core."""


def split_blocks(elements: int, extent: int, least: int, threads: int) -> int:
    """The blocks a kernel touching `elements` elements over an outer range of `extent` is
    cut into when it splits (1: it never splits): from `least` elements it gets two threads'
    worth and one more thread per `least` / 2 elements (XLA's parallel task assigner: a task
    per 256 KiB of an I/O-bound loop's output), up to `threads`; each thread's share is cut
    into pool.BLOCKS_PER_THREAD blocks that the threads claim as they come (native_pool.py),
    so one that starts late or runs slow leaves its blocks to the others."""
    if elements < least or extent < 2 or threads < 2:
        return 1
    tasks = min(threads, max(2, 2 * elements // least))
    return min(extent, tasks * BLOCKS_PER_THREAD)


def work_elements(instr: HloInstruction, outputs: Sequence[BufferSlice]) -> int:
    """About how many elements a kernel for `instr` touches: its largest output, or the
    operand of a reduce it computes, or of a dot (a reduction reads far more than it
    writes)."""
    elements = max((s.shape.num_elements for s in outputs), default=0)
    if instr.opcode is Opcode.DOT:
        elements = max(elements, *(o.shape.num_elements for o in instr.operands))
    comp = instr.calls if instr.opcode is Opcode.FUSION else None
    for i in comp.instructions if comp is not None else (instr,):
        if i.opcode is Opcode.REDUCE:
            elements = max(elements, i.operands[0].shape.num_elements)
    return elements


KernelCall = Callable[[list[int]], object]
"""A kernel's entry bound to its slices: called with an execution's allocation bases."""


def _pointer_call(
    fn: Callable[..., object], slots: tuple[tuple[int, int], ...], extent: int, data: int = 0
) -> KernelCall:
    """A function of an execution's allocation bases that calls kernel entry `fn` on the
    addresses of `slots` ((allocation, offset) pairs), then `data` (the address of a
    parameter block) when nonzero, over its whole outer range. The common argument counts
    get a closure that adds the addresses up without building a list (several tenths of a
    microsecond of a small kernel's ~1 us)."""
    if data:
        if len(slots) == 3:
            (a0, o0), (a1, o1), (a2, o2) = slots
            return lambda b: fn(b[a0] + o0, b[a1] + o1, b[a2] + o2, data, 0, extent)
        return lambda b: fn(*[b[a] + offset for a, offset in slots], data, 0, extent)
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
    outputs afterwards. `data`: the words of a parameter block the kernel takes after its
    buffers (a library kernel's geometry, jit/kernel_library.py), kept by the thunk."""

    kind = "kernel"

    def __init__(
        self,
        instr: HloInstruction,
        kernel: NativeKernel,
        outputs: Sequence[BufferSlice],
        inputs: Sequence[BufferSlice],
        data: Sequence[int] | None = None,
    ):
        self.instr = instr
        self.kernel = kernel
        self.outputs = tuple(outputs)
        self.inputs = tuple(inputs)
        self.data = None if data is None else tuple(int(w) for w in data)
        self._block = self._make_block()
        in_place = set(kernel.in_place)
        self.scratch = any(
            o.overlaps(i) and not ((a, b) in in_place and o.same_bytes(i))
            for a, o in enumerate(self.outputs)
            for b, i in enumerate(self.inputs)
        )
        self._slots = tuple((s.allocation, s.offset) for s in (*self.outputs, *self.inputs))
        elements = work_elements(instr, self.outputs)
        extent = self._extent = kernel.outer_extent
        least = DOT_PARALLEL_MIN_ELEMENTS if instr.opcode is Opcode.DOT else PARALLEL_MIN_ELEMENTS
        self.chunks = split_blocks(elements, extent, least, pool_size())
        self.split_choice = SplitChoice() if self.chunks > 1 else None
        self._call: KernelCall | None = None  # made on first run

    def __getstate__(self) -> dict:
        """The thunk without its call closure (made again on the first run) and its
        parameter block's memory (made again from `data`)."""
        return {**self.__dict__, "_call": None, "_block": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._block = None if self.data is None else self._make_block()

    def _make_block(self) -> ctypes.Array | None:
        """The parameter block's memory: made once per thunk, so its address is fixed for
        the thunk's life (native code and closures hold it)."""
        return None if self.data is None else (ctypes.c_int64 * len(self.data))(*self.data)

    def data_address(self) -> int:
        """The address of the parameter block (0 without one)."""
        return 0 if self._block is None else ctypes.addressof(self._block)

    def _extra(self) -> list[int]:
        return [] if self.data is None else [self.data_address()]

    def run(self, ctx: ExecutionContext) -> None:
        call = self._call
        if call is None:
            if self.scratch or self.split_choice is not None:
                self._run_general(ctx)
                return
            call = self._call = self._direct()
        call(ctx.bases)

    def _direct(self) -> KernelCall:
        return _pointer_call(self.kernel.function, self._slots, self._extent, self.data_address())

    def direct_call(self) -> KernelCall | None:
        """The kernel's entry over its whole range as a function of the allocation bases,
        when a run needs nothing else (no scratch copies, no split over the pool)."""
        if self.scratch or self.split_choice is not None:
            return None
        if self._call is None:
            self._call = self._direct()
        return self._call

    def native_entry(self) -> tuple[int, tuple[tuple[int, int], ...], int, int] | None:
        """What native code calls when `direct_call` applies: (the entry's address, the
        (allocation, offset) of each buffer argument, the outer extent, the address of the
        parameter block passed after the buffers or 0 without one); else None."""
        if self.direct_call() is None:
            return None
        function: Any = self.kernel.function  # a ctypes function pointer
        address = ctypes.cast(function, ctypes.c_void_p).value
        return (address, self._slots, self._extent, self.data_address()) if address else None

    def bind(self, ctx: ExecutionContext) -> Callable[[], object] | None:
        if self.scratch or self.split_choice is not None:
            return functools.partial(self._run_general, ctx)
        bases = ctx.bases
        args = [ctypes.c_void_p(bases[a] + offset) for a, offset in self._slots]
        args += [ctypes.c_void_p(p) for p in self._extra()]
        return functools.partial(
            self.kernel.function, *args, ctypes.c_int64(0), ctypes.c_int64(self._extent)
        )

    def _run_general(self, ctx: ExecutionContext) -> None:
        """A run through scratch buffers or with a split choice to make."""
        if self.scratch:
            outs = [empty_bytes(o.size) for o in self.outputs]
            ptrs = [address(o) for o in outs] + [ctx.ptr(i) for i in self.inputs]
        else:
            bases = ctx.bases
            ptrs = [bases[a] + offset for a, offset in self._slots]
        ptrs += self._extra()
        extent = self._extent
        choice = self.split_choice
        if choice is None:
            self.kernel.run_raw(ptrs, 0, extent)
        else:
            split = choice.next_split()
            start = time.perf_counter()
            if split:
                self._run_split(ptrs, extent)
            else:
                self.kernel.run_raw(ptrs, 0, extent)
            choice.record(split, time.perf_counter() - start)
        if self.scratch:
            for o, buf in zip(self.outputs, outs, strict=True):
                mem = ctx.memory[o.allocation]
                assert mem is not None, "a kernel output has memory"
                mem[o.offset : o.offset + o.size] = buf

    def _run_split(self, ptrs: list[int], extent: int) -> None:
        """The kernel over [0, extent) in self.chunks blocks: on the native pool when there
        is one (no Python per block), else on the Python pool."""
        native = native_pool()
        if native is not None and len(ptrs) <= MAX_ARGS:
            address = getattr(self.kernel, "address", None)  # jit.kernel.Kernel has one
            if address is not None:
                native.run(address, ptrs, extent, self.chunks)
                return
        run = self.kernel.run_raw
        run_blocks(lambda lo, hi: run(ptrs, lo, hi), even_blocks(extent, self.chunks))

    def describe(self) -> list[str]:
        head = f"kernel {self.instr.name} = {self.instr.opcode.text} -> {self.kernel.name}"
        notes = []
        if self.chunks > 1:
            notes.append(f"parallel x{self.chunks} blocks when faster")
        if self.scratch:
            notes.append("in place via scratch")
        if notes:
            head += f" ({', '.join(notes)})"
        return [head, *slice_lines("out", self.outputs), *slice_lines("in", self.inputs)]

    def kernels(self) -> list[NativeKernel]:
        return [self.kernel]

    def elements(self) -> int:
        """The elements a run computes (an in-place kernel: the window it writes)."""
        if self.kernel.in_place:  # writes the window its other inputs give
            shared = {i for _, i in self.kernel.in_place}
            others = [s for i, s in enumerate(self.inputs) if i not in shared]
            return max((s.shape.num_elements for s in others), default=1)
        return work_elements(self.instr, self.outputs)

    def cost(self) -> float:
        return 1_000 + self.elements() * NS_PER_KERNEL_ELEMENT

    def runs_alone(self) -> bool:
        return self.chunks == 1
