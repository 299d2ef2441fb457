# The CPU backend: compile with xlapy.backends.cpu.compiler, execute the thunk sequence over
# the buffer assignment's memory.
#
# Memory of one execution: entry parameter allocations are the argument arrays themselves
# (read in place; a donated argument that an output aliases is also written in place and
# returned as that output), constant allocations are shared read-only bytes made at compile
# time, each live-out allocation is a fresh array that becomes an output, and the temp arena
# comes from a small pool owned by the executable: an execution takes one (or makes one when
# all are busy) and gives it back, so concurrent executions never share an arena and steady
# state allocates no temporaries.

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from xlapy.backends.base import Backend, CompiledProgram, alias_leaves, leaf_at
from xlapy.backends.cpu.compiler import CompiledModule, compile_module
from xlapy.backends.cpu.thunks import BufferSlice, ExecutionContext, logical_from_physical
from xlapy.errors import EvaluationError
from xlapy.ir.module import HloModule
from xlapy.ir.shapes import Shape

_STATE_OPTIONS = ("replica_id", "partition_id", "custom_calls", "rng_seed")
ARENA_POOL_SIZE = 4
"""Idle arenas an executable keeps for reuse."""


def _is_row_major(shape: Shape) -> bool:
    return shape.layout is None or shape.layout.is_default


class CpuProgram(CompiledProgram):
    """A module compiled to thunks for the host CPU. `dump(dir)` writes the thunk listing,
    the optimized HLO, the buffer assignment and every kernel's LLVM IR and assembly."""

    def __init__(self, module: HloModule, options: Mapping[str, Any] | None = None):
        self.options = dict(options or {})
        self.compiled: CompiledModule = compile_module(module, self.options)
        self.module = self.compiled.module
        self.state = {k: self.options[k] for k in _STATE_OPTIONS if k in self.options}
        self.aliases = alias_leaves(self.module)
        self._alias_by_output = {a.output_index: a for a in self.aliases}
        allocations = self.compiled.assignment.allocations
        self._temps = [a.index for a in allocations if a.is_temp]
        self._arenas: list[list[np.ndarray]] = []
        self._arena_lock = threading.Lock()
        self._param_allocs = [a for a in allocations if a.is_entry_parameter]
        self._root_slices = [
            (index, shape, self._slice(index))
            for index, shape in self.module.entry.root.shape.leaves()
            if shape.is_array
        ]

    def _slice(self, index) -> BufferSlice:
        root = self.module.entry.root
        s = self.compiled.assignment.slice_of(root, index)
        return BufferSlice(s.allocation, s.offset, s.size, root.shape.subshape(index))

    # -- arenas ----------------------------------------------------------------------------
    def _take_arenas(self) -> list[np.ndarray]:
        with self._arena_lock:
            if self._arenas:
                return self._arenas.pop()
        allocations = self.compiled.assignment.allocations
        return [np.empty(max(allocations[i].size, 1), np.uint8) for i in self._temps]

    def _give_back(self, arenas: list[np.ndarray]) -> None:
        with self._arena_lock:
            if len(self._arenas) < ARENA_POOL_SIZE:
                self._arenas.append(arenas)

    # -- running ---------------------------------------------------------------------------
    def run(self, args: Sequence[Any], donated: frozenset[int] = frozenset()) -> Any:
        """Execute on `args`; see xlapy.backends.base for the donation contract."""
        params = self.module.entry.parameters
        if len(args) != len(params):
            raise EvaluationError(
                f"{self.module.name} takes {len(params)} arguments, {len(args)} were given"
            )
        allocations = self.compiled.assignment.allocations
        memory: list[np.ndarray | None] = [None] * len(allocations)
        in_place: dict[int, np.ndarray] = {}  # allocation -> the argument array it is
        writeback: list[tuple[np.ndarray, int, Shape]] = []
        for alloc in self._param_allocs:
            number, index = alloc.parameter_number, alloc.parameter_index
            shape = params[number].shape.subshape(index)
            if not shape.is_array:
                memory[alloc.index] = np.empty(max(alloc.size, 1), np.uint8)
                continue
            arg = self._argument(args, number, index, shape)
            writes = alloc.is_aliased_output
            if _is_row_major(shape) and arg.flags.c_contiguous:
                if not writes:
                    memory[alloc.index] = arg.reshape(-1).view(np.uint8)
                    continue
                if number in donated and arg.flags.writeable:
                    memory[alloc.index] = arg.reshape(-1).view(np.uint8)
                    in_place[alloc.index] = arg
                    continue
            order = tuple(reversed(shape.layout_or_default.minor_to_major))
            data = np.ascontiguousarray(np.transpose(arg, order) if shape.rank > 1 else arg)
            memory[alloc.index] = data.reshape(-1).view(np.uint8).copy()
            if writes and number in donated:
                writeback.append((arg, alloc.index, shape))
        for index, mem in self.compiled.constants.items():
            memory[index] = mem
        arenas = self._take_arenas()
        for index, arena in zip(self._temps, arenas, strict=True):
            memory[index] = arena
        for alloc in allocations:
            if memory[alloc.index] is None and not alloc.is_thread_local:
                memory[alloc.index] = np.empty(max(alloc.size, 1), np.uint8)
        ctx = ExecutionContext(memory, self.state)
        try:
            self.compiled.entry.run(ctx)
            return self._outputs(ctx, args, donated, in_place, writeback)
        finally:
            self._give_back(arenas)

    def _argument(self, args, number: int, index, shape: Shape) -> np.ndarray:
        try:
            arg = np.asarray(leaf_at(args[number], index))
        except (IndexError, TypeError) as e:
            raise EvaluationError(
                f"{self.module.name}: parameter {number} must be a value of {shape}"
            ) from e
        if arg.shape != shape.dims or arg.dtype != shape.dtype:
            raise EvaluationError(
                f"{self.module.name}: parameter {number}{list(index) or ''} expects "
                f"{shape.to_text(with_layout=False)}, got {arg.dtype}{list(arg.shape)}"
            )
        return arg

    def _outputs(self, ctx: ExecutionContext, args, donated, in_place, writeback) -> Any:
        allocations = self.compiled.assignment.allocations
        handed: set[int] = set()
        leaves = {}
        for index, shape, s in self._root_slices:
            alias = self._alias_by_output.get(index)
            alloc = allocations[s.allocation]
            if alias is not None and alias.param_number in donated:
                target = leaf_at(args[alias.param_number], alias.param_index)
                if in_place.get(s.allocation) is not target:
                    np.copyto(target, ctx.view(s), casting="no")
                leaves[index] = target
                handed.add(s.allocation)
                continue
            whole = s.offset == 0 and s.size == alloc.size
            if alloc.kind == "output" and whole and s.allocation not in handed:
                handed.add(s.allocation)
                leaves[index] = logical_from_physical(ctx.physical(s), shape)
                if not _is_row_major(shape):
                    leaves[index] = np.ascontiguousarray(leaves[index])
                continue
            leaves[index] = np.array(ctx.view(s), copy=True, order="C")
        for arg, index, shape in writeback:
            if index not in handed:
                np.copyto(arg, ctx.view(BufferSlice(index, 0, arg.nbytes, shape)))
        return _build(self.module.entry.root.shape, (), leaves)

    # -- dumps -----------------------------------------------------------------------------
    def thunk_listing(self) -> str:
        return self.compiled.thunk_listing()

    def dump(self, directory: str | Path) -> list[Path]:
        """Write thunks.txt, module.hlo, buffer_assignment.txt and, per kernel, NAME.ll
        (as emitted), NAME.opt.ll and NAME.s into `directory`; returns the paths."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        files = {
            "thunks.txt": self.thunk_listing(),
            "module.hlo": self.module.to_text(),
            "buffer_assignment.txt": self.compiled.assignment.to_text() + "\n",
        }
        for kernel in self.compiled.kernels():
            files[f"{kernel.name}.ll"] = kernel.llvm_ir
            files[f"{kernel.name}.opt.ll"] = kernel.optimized_ir
            files[f"{kernel.name}.s"] = kernel.asm
        paths = []
        for name, text in files.items():
            path = out / name
            path.write_text(text)
            paths.append(path)
        return paths


def _build(shape: Shape, index, leaves: dict) -> Any:
    if shape.is_tuple:
        return tuple(_build(s, (*index, i), leaves) for i, s in enumerate(shape.tuple_shapes))
    if not shape.is_array:
        from xlapy.backends.interpreter.registry import TOKEN

        return TOKEN
    return leaves[index]


class CpuBackend(Backend):
    """Native CPU code: fused kernels through llvmlite, BLAS dots, library thunks."""

    def __init__(self, name: str = "cpu", platform: str = "cpu"):
        self.name = name
        self.platform = platform

    def compile(self, module: HloModule, options: Mapping[str, Any] | None = None) -> CpuProgram:
        return CpuProgram(module, options)
