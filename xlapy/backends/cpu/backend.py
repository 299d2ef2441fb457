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
#
# Dispatch cost: everything about the memory that does not depend on the arguments is
# worked out when the program is built: which allocation each parameter leaf fills and how
# to check it, a memory list with the constants already in place (and their addresses),
# the allocations made fresh per call, and for every output leaf where it comes from. A
# call copies the template, fills in the argument and output arrays, takes an arena (with
# its addresses) and runs the thunks. The common program (every parameter one row-major
# array that no output aliases, every output a whole fresh allocation of its own) has a
# shorter path for the common call (C-contiguous NumPy arguments of the right dtypes): a
# byte view and an address per argument, a fresh allocation per output, then the thunks.
# When those thunks are native kernels in a row (no temps, no scratch copies, no split over
# the pool) the short path calls the kernels' entries on the addresses directly, and the
# program's run time is fixed by its shapes (`fixed_cost_seconds`), which lets the runtime
# skip timing its runs.

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from xlapy.backends.base import (
    PROFILE,
    Backend,
    CompiledProgram,
    Fallback,
    alias_leaves,
    leaf_at,
)
from xlapy.backends.cpu.compiler import CompiledModule, compile_module, plan_module
from xlapy.backends.cpu.jit import program_image
from xlapy.backends.cpu.jit.compile_timing import phase
from xlapy.backends.cpu.options import CPU_OPTIONS
from xlapy.backends.cpu.runtime.custom_call_thunk import FfiCallThunk
from xlapy.backends.cpu.runtime.host_memory import empty_bytes
from xlapy.backends.cpu.runtime.kernel_thunk import KernelCall, KernelThunk
from xlapy.backends.cpu.runtime.thunk import (
    BufferSlice,
    ExecutionContext,
    address,
    logical_from_physical,
    physical_dims,
    walk_thunks,
)
from xlapy.errors import EvaluationError, XlapyError
from xlapy.ir.module import HloModule
from xlapy.ir.opcodes import Opcode
from xlapy.ir.shapes import Shape

if TYPE_CHECKING:
    from xlapy.memory.buffer_assignment import BufferAssignment

_STATE_OPTIONS = ("replica_id", "partition_id", "custom_calls", "rng_seed")
ARENA_POOL_SIZE = 4
"""Idle arenas an executable keeps for reuse."""
_NO_ARENAS: tuple[list[np.ndarray], list[int]] = ([], [])
_U8 = np.dtype(np.uint8)


@dataclass(frozen=True)
class NativePlan:
    """A program of native kernels in a row, for native callers (`CpuProgram.native_plan`):
    `params` (allocation, parameter number), `constants` (allocation, address: kept alive
    by the program; a kernel's parameter block is one, at an allocation number past the
    program's), `outputs` (allocation, bytes) in output order, `kernels` (entry address,
    (allocation, offset) per pointer argument, outer extent) in run order; each kernel's
    entry takes its pointers, then the range start and end."""

    num_allocations: int
    params: tuple[tuple[int, int], ...]
    constants: tuple[tuple[int, int], ...]
    outputs: tuple[tuple[int, int], ...]
    kernels: tuple[tuple[int, tuple[tuple[int, int], ...], int], ...]


def _is_row_major(shape: Shape) -> bool:
    return shape.layout is None or shape.layout.is_default


class _ParamLeaf:
    """How one entry-parameter allocation is filled from the arguments."""

    __slots__ = ("alloc", "dims", "dtype", "index", "number", "row_major", "shape", "writes")

    def __init__(self, alloc, shape: Shape):
        self.alloc = alloc.index
        self.number = alloc.parameter_number
        self.index = alloc.parameter_index
        self.shape = shape
        self.dims = shape.dims
        self.dtype = shape.dtype
        self.writes = alloc.is_aliased_output
        self.row_major = _is_row_major(shape)


class _OutputLeaf:
    """Where one array leaf of the result comes from."""

    __slots__ = (
        "alias",
        "dims",
        "dtype",
        "end",
        "exact",
        "handed_whole",
        "index",
        "row_major",
        "shape",
        "slice",
    )

    def __init__(self, index, shape: Shape, s: BufferSlice, alias, alloc):
        self.index = index
        self.shape = shape
        self.slice = s
        self.alias = alias
        self.handed_whole = alloc.kind == "output" and s.offset == 0 and s.size == alloc.size
        self.exact = s.offset == 0 and s.size == alloc.size and s.size > 0
        self.row_major = _is_row_major(shape)
        self.dims = physical_dims(shape)
        self.dtype = shape.dtype
        self.end = s.offset + s.size


class _SimplePlan:
    """How `CpuProgram._run_simple` runs: (allocation, parameter number, dims, dtype) per
    parameter and (allocation, dtype, dims or None when rank 1) per output leaf."""

    __slots__ = ("outputs", "params")

    def __init__(self, params: tuple, outputs: tuple):
        self.params = params
        self.outputs = outputs


class CpuProgram(CompiledProgram):
    """A module compiled to thunks for the host CPU. `dump(dir)` writes the thunk listing,
    the optimized HLO, the buffer assignment and every kernel's LLVM IR and assembly."""

    def __init__(
        self,
        module: HloModule,
        options: Mapping[str, Any] | None = None,
        *,
        text: str | None = None,
    ):
        self.options = dict(options or {})
        self._set_up(compile_module(module, self.options, text=text))

    def _set_up(self, compiled: CompiledModule) -> None:
        self.compiled = compiled
        root = compiled.module.entry_computation().root_instruction()
        self._root_shape = root.shape
        self.state = {k: self.options[k] for k in _STATE_OPTIONS if k in self.options}
        self.aliases = alias_leaves(compiled.module)
        self._alias_by_output = {a.output_index: a for a in self.aliases}
        allocations = compiled.assignment.allocations
        self._temps = [a.index for a in allocations if a.is_temp]
        self._temp_sizes = [max(allocations[i].size, 1) for i in self._temps]
        self._temp_bytes = sum(allocations[i].size for i in self._temps)
        self._arenas: list[tuple[list[np.ndarray], list[int]]] = []
        self._arena_lock = threading.Lock()
        self._prepare_memory_plan(root)

    _IMAGED = (
        "_root_shape",
        "aliases",
        "_temps",
        "_temp_sizes",
        "_temp_bytes",
        "_num_params",
        "_param_leaves",
        "_fresh",
        "_outputs_plan",
        "_single_output",
        "_flat_output",
        "_simple",
        "_fixed_cost",
    )
    """What `_set_up` works out from the module and its buffer assignment, kept in a
    program image (`image_state`) so that loading one reads neither."""

    def image_state(self) -> dict[str, Any]:
        """What `from_image_state` needs: the compiled program and the run plan `_set_up`
        made of it (no address, closure or lock: those are made again where it loads)."""
        imaged = {name: getattr(self, name) for name in self._IMAGED}
        return {"compiled": self.compiled, "allocations": len(self._template), **imaged}

    @classmethod
    def from_image_state(cls, state: Mapping[str, Any], options: Mapping[str, Any]) -> CpuProgram:
        """The program `image_state` described, run with `options`: the module and buffer
        assignment stay unread until a report asks for them."""
        program = cls.__new__(cls)
        program._restore_image_state(state, options)
        return program

    def _restore_image_state(self, state: Mapping[str, Any], options: Mapping[str, Any]) -> None:
        self.options = dict(options)
        self.compiled = state["compiled"]
        for name in self._IMAGED:
            setattr(self, name, state[name])
        self.state = {k: self.options[k] for k in _STATE_OPTIONS if k in self.options}
        self._alias_by_output = {a.output_index: a for a in self.aliases}
        self._arenas = []
        self._arena_lock = threading.Lock()
        template: list[np.ndarray | None] = [None] * int(state["allocations"])
        self._template = template
        self._template_bases = [0] * len(template)
        for index, mem in self.compiled.constants.items():
            self._template[index] = mem
            self._template_bases[index] = address(mem)
        self._kernel_calls = self._straight_line_kernels()

    @property
    def module(self) -> HloModule:  # type: ignore[override]
        """The optimized module this program runs."""
        return self.compiled.module

    @property
    def buffer_assignment(self) -> BufferAssignment:
        """The buffer assignment this program executes (every memory figure describes it)."""
        return self.compiled.assignment

    @property
    def temp_allocation_bytes(self) -> int:
        """The bytes of the temp arenas one run takes."""
        return self._temp_bytes

    def _prepare_memory_plan(self, root) -> None:
        allocations = self.compiled.assignment.allocations
        params = self.compiled.module.entry_computation().parameters
        self._num_params = len(params)
        self._template = [None] * len(allocations)
        self._template_bases = [0] * len(allocations)
        for index, mem in self.compiled.constants.items():
            self._template[index] = mem
            self._template_bases[index] = address(mem)
        self._param_leaves: list[_ParamLeaf] = []
        fresh = []
        for alloc in allocations:
            if alloc.is_entry_parameter:
                number, leaf_index = alloc.parameter_number, alloc.parameter_index
                assert number is not None and leaf_index is not None, "parameter allocation"
                shape = params[number].shape.subshape(leaf_index)
                if shape.is_array:
                    self._param_leaves.append(_ParamLeaf(alloc, shape))
                    continue
            elif alloc.is_thread_local or alloc.is_temp or alloc.index in self.compiled.constants:
                continue
            fresh.append((alloc.index, max(alloc.size, 1)))
        self._fresh = tuple(fresh)
        self._outputs_plan = [
            _OutputLeaf(
                index,
                shape,
                sl := self._slice(root, index),
                self._alias_by_output.get(index),
                allocations[sl.allocation],
            )
            for index, shape in root.shape.leaves()
            if shape.is_array
        ]
        self._single_output = root.shape.is_array
        self._flat_output = root.shape.is_tuple and all(t.is_array for t in root.shape.tuple_shapes)
        self._simple = self._simple_plan()
        self._kernel_calls = self._straight_line_kernels()
        self._fixed_cost = (
            None
            if self._kernel_calls is None
            else sum(thunk.cost() for thunk in self.compiled.entry.thunks) * 1e-9
        )

    def _straight_line_kernels(self) -> tuple[KernelCall, ...] | None:
        """The kernel calls of `_run_simple` when the entry is native kernels in a row that
        need nothing but the allocations' addresses (no temps, scratch copies, pool splits or
        concurrent schedule); None otherwise."""
        entry = self.compiled.entry
        if self._simple is None or self._temps or entry.plan is not None or not entry.thunks:
            return None
        calls = []
        for thunk in entry.thunks:
            call = thunk.direct_call() if isinstance(thunk, KernelThunk) else None
            if call is None:
                return None
            calls.append(call)
        return tuple(calls)

    def native_plan(self) -> NativePlan | None:
        """The run of native kernels in a row (`fixed_cost_seconds` is set) as data native
        code can replay without Python: where each parameter and constant sits, the fresh
        allocations (each an output, in output order) and the kernels' entries; None for
        any other program."""
        if self._kernel_calls is None or self._simple is None:
            return None
        outputs = tuple(alloc for alloc, _, _ in self._simple.outputs)
        sizes = dict(self._fresh)
        params = tuple((alloc, number) for alloc, number, _, _ in self._simple.params)
        constants = tuple((i, self._template_bases[i]) for i in self.compiled.constants)
        known = {a for a, _ in params} | {a for a, _ in constants} | set(outputs)
        kernels = []
        blocks: list[tuple[int, int]] = []  # parameter blocks, as constants of their own
        for thunk in self.compiled.entry.thunks:
            entry = thunk.native_entry() if isinstance(thunk, KernelThunk) else None
            if entry is None or any(alloc not in known for alloc, _ in entry[1]):
                return None  # (a fresh allocation no kernel touches, a tuple's, is left out)
            address, slots, extent, data = entry
            if data:  # a pseudo-allocation past the program's, at the block (kept by the thunk)
                blocks.append((len(self._template) + len(blocks), data))
                slots = (*slots, (blocks[-1][0], 0))
            kernels.append((address, slots, extent))
        return NativePlan(
            len(self._template) + len(blocks),
            params,
            constants + tuple(blocks),
            tuple((alloc, sizes[alloc]) for alloc in outputs),
            tuple(kernels),
        )

    @property
    def fixed_cost_seconds(self) -> float | None:
        """The estimated time of one run when it does not depend on the data (native kernels
        in a row: no loops, library calls or interpreter rules); None otherwise."""
        return self._fixed_cost

    def _simple_plan(self) -> _SimplePlan | None:
        """The plan of `_run_simple`, or None when this program needs the general path."""
        if self.aliases:
            return None
        leaves = self._param_leaves
        if len(leaves) != self._num_params or sorted(leaf.number for leaf in leaves) != list(
            range(self._num_params)
        ):
            return None
        if any(leaf.index or leaf.writes or not leaf.row_major for leaf in leaves):
            return None
        root = self._root_shape
        flat = self._single_output or all(s.is_array for s in root.tuple_shapes)
        fresh = {index for index, _ in self._fresh}
        allocations = [out.slice.allocation for out in self._outputs_plan]
        if (
            not flat
            or len(set(allocations)) != len(allocations)
            or not fresh.issuperset(allocations)
            or not all(o.handed_whole and o.exact and o.row_major for o in self._outputs_plan)
        ):
            return None
        return _SimplePlan(
            tuple((leaf.alloc, leaf.number, leaf.dims, leaf.dtype) for leaf in leaves),
            tuple(
                (o.slice.allocation, o.dtype, o.dims if len(o.dims) != 1 else None)
                for o in self._outputs_plan
            ),
        )

    def _slice(self, root, index) -> BufferSlice:
        s = self.compiled.assignment.slice_of(root, index)
        return BufferSlice(s.allocation, s.offset, s.size, root.shape.subshape(index))

    # -- arenas ----------------------------------------------------------------------------
    def _take_arenas(self) -> tuple[list[np.ndarray], list[int]]:
        if not self._temps:
            return _NO_ARENAS
        with self._arena_lock:
            if self._arenas:
                return self._arenas.pop()
        arenas = [empty_bytes(size) for size in self._temp_sizes]
        return arenas, [address(a) for a in arenas]

    def _give_back(self, arenas: tuple[list[np.ndarray], list[int]]) -> None:
        if arenas is _NO_ARENAS:
            return
        with self._arena_lock:
            if len(self._arenas) < ARENA_POOL_SIZE:
                self._arenas.append(arenas)

    # -- running ---------------------------------------------------------------------------
    def run(
        self, args: Sequence[Any], donated: frozenset[int] = frozenset(), collectives=None
    ) -> Any:
        """Execute on `args`; see xlapy.backends.base for the donation contract and
        `collectives`."""
        state = self.state if collectives is None else {**self.state, **collectives.state}
        simple = self._simple
        if simple is not None and len(args) == self._num_params:
            memory = self._template.copy()
            bases = self._template_bases.copy()
            for alloc, number, dims, dtype in simple.params:
                arg = args[number]
                if (
                    type(arg) is not np.ndarray
                    or arg.shape != dims
                    or (arg.dtype is not dtype and arg.dtype != dtype)
                    or not arg.flags.c_contiguous
                ):
                    break
                memory[alloc] = mem = np.frombuffer(arg, _U8)
                bases[alloc] = address(mem)
            else:
                return self._run_simple(simple, memory, bases, state)
        return self._run_general(args, donated, state)

    def _run_simple(
        self, simple: _SimplePlan, memory: list, bases: list[int], state: dict[str, Any]
    ) -> Any:
        """The thunks on arguments already in `memory`; the outputs are fresh arrays."""
        for index, size in self._fresh:
            memory[index] = mem = empty_bytes(size)
            bases[index] = address(mem)
        calls = self._kernel_calls
        if calls is not None and PROFILE.get() is None:
            for call in calls:
                call(bases)
        elif not self._temps:
            self.compiled.entry.run(ExecutionContext(memory, state, bases))
        else:
            arenas = self._take_arenas()
            for index, arena, base in zip(self._temps, arenas[0], arenas[1], strict=True):
                memory[index] = arena
                bases[index] = base
            try:
                self.compiled.entry.run(ExecutionContext(memory, state, bases))
            finally:
                self._give_back(arenas)
        if self._single_output:
            alloc, dtype, dims = simple.outputs[0]
            out = memory[alloc].view(dtype)
            return out if dims is None else out.reshape(dims)
        outputs = []
        for alloc, dtype, dims in simple.outputs:
            out = memory[alloc].view(dtype)
            outputs.append(out if dims is None else out.reshape(dims))
        return tuple(outputs)

    def _run_general(
        self, args: Sequence[Any], donated: frozenset[int], state: dict[str, Any]
    ) -> Any:
        if len(args) != self._num_params:
            raise EvaluationError(
                f"{self.module.name} takes {self._num_params} arguments, {len(args)} were given"
            )
        memory = self._template.copy()
        bases = self._template_bases.copy()
        in_place: dict[int, np.ndarray] = {}  # allocation -> the argument array it is
        writeback: list[tuple[np.ndarray, int, Shape]] = []
        for leaf in self._param_leaves:
            arg = args[leaf.number]
            if (
                leaf.index
                or type(arg) is not np.ndarray
                or arg.shape != leaf.dims
                or (arg.dtype is not leaf.dtype and arg.dtype != leaf.dtype)
            ):
                arg = self._argument(args, leaf)
            flags = arg.flags
            if leaf.row_major and flags.c_contiguous:
                if not leaf.writes:
                    memory[leaf.alloc] = mem = np.frombuffer(arg, _U8)
                    bases[leaf.alloc] = address(mem)
                    continue
                if leaf.number in donated and flags.writeable:
                    memory[leaf.alloc] = mem = np.frombuffer(arg, _U8)
                    bases[leaf.alloc] = address(mem)
                    in_place[leaf.alloc] = arg
                    continue
            shape = leaf.shape
            order = tuple(reversed(shape.layout_or_default.minor_to_major))
            data = np.ascontiguousarray(np.transpose(arg, order) if shape.rank > 1 else arg)
            memory[leaf.alloc] = mem = data.reshape(-1).view(np.uint8).copy()
            bases[leaf.alloc] = address(mem)
            if leaf.writes and leaf.number in donated:
                writeback.append((arg, leaf.alloc, shape))
        for index, size in self._fresh:
            memory[index] = mem = empty_bytes(size)
            bases[index] = address(mem)
        arenas = self._take_arenas()
        for index, arena, base in zip(self._temps, arenas[0], arenas[1], strict=True):
            memory[index] = arena
            bases[index] = base
        ctx = ExecutionContext(memory, state, bases)
        try:
            self.compiled.entry.run(ctx)
            return self._outputs(memory, args, donated, in_place, writeback)
        finally:
            self._give_back(arenas)

    def _argument(self, args, leaf: _ParamLeaf) -> np.ndarray:
        number, index, shape = leaf.number, leaf.index, leaf.shape
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

    def _outputs(self, memory, args, donated, in_place, writeback) -> Any:
        handed: set[int] = set()
        leaves = []
        for out in self._outputs_plan:
            s, alias = out.slice, out.alias
            if alias is not None and alias.param_number in donated:
                target = leaf_at(args[alias.param_number], alias.param_index)
                if in_place.get(s.allocation) is not target:
                    np.copyto(target, _view(memory, out), casting="no")
                elif not out.row_major:
                    # the program wrote the result in its own layout over the (row-major)
                    # argument's bytes: put them in logical order (a copy first: they overlap)
                    np.copyto(target, np.array(_view(memory, out)), casting="no")
                leaves.append(target)
                handed.add(s.allocation)
                continue
            mem = memory[s.allocation]
            physical = (mem if out.exact else mem[s.offset : out.end]).view(out.dtype)
            physical = physical.reshape(out.dims)
            if out.handed_whole and s.allocation not in handed:
                handed.add(s.allocation)
                if out.row_major:
                    leaves.append(physical)
                else:
                    leaves.append(np.ascontiguousarray(logical_from_physical(physical, out.shape)))
                continue
            logical = logical_from_physical(physical, out.shape)
            leaves.append(np.array(logical, copy=True, order="C"))
        for arg, index, shape in writeback:
            if index not in handed:
                ctx = ExecutionContext(memory, self.state)
                np.copyto(arg, ctx.view(BufferSlice(index, 0, arg.nbytes, shape)))
        if self._single_output:
            return leaves[0]
        if self._flat_output:
            return tuple(leaves)
        by_index = {out.index: leaf for out, leaf in zip(self._outputs_plan, leaves, strict=True)}
        return _build(self._root_shape, (), by_index)

    @property
    def fallbacks(self) -> list[Fallback]:
        """The instructions run with the interpreter's rule alone (no kernel and no library
        path), each with its reason."""
        return list(self.compiled.fallbacks)

    @property
    def python_loops(self) -> list[Fallback]:
        return list(self.compiled.python_loops)

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


def _view(memory: list[np.ndarray], out: _OutputLeaf) -> np.ndarray:
    s = out.slice
    physical = memory[s.allocation][s.offset : out.end].view(out.dtype).reshape(out.dims)
    return logical_from_physical(physical, out.shape)


def _build(shape: Shape, index, leaves: dict) -> Any:
    if shape.is_tuple:
        return tuple(_build(s, (*index, i), leaves) for i, s in enumerate(shape.tuple_shapes))
    if not shape.is_array:
        from xlapy.backends.interpreter.registry import TOKEN

        return TOKEN
    return leaves[index]


class CpuBackend(Backend):
    """Native CPU code: fused kernels through llvmlite, BLAS dots, library thunks."""

    options = CPU_OPTIONS

    def __init__(self, name: str = "cpu", platform: str = "cpu"):
        self.name = name
        self.platform = platform

    def compile(
        self,
        module: HloModule,
        options: Mapping[str, Any] | None = None,
        *,
        text: str | None = None,
    ) -> CpuProgram:
        self.check_options(options)
        return CpuProgram(module, options, text=text)

    def plan_memory(
        self,
        module: HloModule,
        options: Mapping[str, Any] | None = None,
        *,
        text: str | None = None,
    ) -> BufferAssignment:
        """The buffer assignment a CpuProgram of `module` executes (no code generated)."""
        self.check_options(options)
        return plan_module(module, options, text=text)[1]

    def image_key(self, program: str | bytes, options_json: str) -> str | None:
        return program_image.image_key(program, options_json) if program_image.enabled() else None

    def save_image(self, key: str, executable: Mapping[str, Any], program: CompiledProgram) -> bool:
        if not isinstance(program, CpuProgram):
            return False
        options = {k: v for k, v in program.options.items() if k != "custom_calls"}
        calls = _custom_call_kinds(program.compiled.module, program.options.get("custom_calls"))
        with phase("program image (pickle and write)"):
            state = program.image_state()
            return program_image.write(key, (dict(executable), options, state, calls))

    def load_image(
        self, key: str, options: Mapping[str, Any]
    ) -> tuple[dict[str, Any], CompiledProgram] | None:
        value = program_image.read(key)
        if value is None:
            return None
        try:
            executable, own, state, calls = value
            compiled = state["compiled"]
            if not isinstance(compiled, CompiledModule) or set(state) != _IMAGE_STATE_KEYS:
                raise TypeError("not a CPU program's state")
        except (TypeError, ValueError, KeyError):
            executable = own = compiled = calls = None
        if not (isinstance(executable, dict) and isinstance(own, dict) and isinstance(calls, dict)):
            program_image.warn_rejected(key + program_image.SUFFIX, "it holds no CPU program")
            return None
        if calls and not _bind_custom_calls(compiled, calls, options.get("custom_calls")):
            return None  # the registry changed how a call compiles: a miss
        return executable, CpuProgram.from_image_state(state, {**own, **options})


_IMAGE_STATE_KEYS = frozenset({"compiled", "allocations", *CpuProgram._IMAGED})


def _custom_call_kinds(module: HloModule, registry) -> dict[str, bool]:
    """Each custom-call target of `module` -> whether it was a typed-FFI handler (an
    FfiCallThunk) when the module was compiled with `registry`: what of the registry a
    compiled program depends on (see _bind_custom_calls)."""
    from xlapy.backends.custom_calls import typed_ffi_target

    names = {
        i.custom_call_target or "" for i in module.instructions() if i.opcode is Opcode.CUSTOM_CALL
    }
    return {name: typed_ffi_target(name, registry) is not None for name in sorted(names)}


def _bind_custom_calls(compiled: CompiledModule, calls: dict[str, bool], registry) -> bool:
    """Look the custom calls of a program image's `compiled` module up again in `registry`
    (and the global registry), as a compile would, and bind its typed-FFI calls to the
    handlers found: False (a miss, so a compile reports what changed) when a target is
    unknown now, rejects its call (check_custom_calls), or is a typed handler where it was
    not or the other way round (which would lower it another way). A Python or C target is
    looked up by every run, as a compiled program's is."""
    from xlapy.backends.custom_calls import (
        XLA_INTERNAL_TARGET_NAMES,
        check_custom_calls,
        resolve,
        typed_ffi_target,
    )
    from xlapy.errors import CustomCallError

    for name, typed in calls.items():
        if name in XLA_INTERNAL_TARGET_NAMES:
            continue
        if resolve(name, "Host", registry) is None:
            return False
        if (typed_ffi_target(name, registry) is not None) != typed:
            return False
    try:
        check_custom_calls(compiled.module, "Host", registry)
    except CustomCallError:
        return False
    for thunk in walk_thunks(compiled.entry):
        if isinstance(thunk, FfiCallThunk):
            target = typed_ffi_target(thunk.target_name, registry)
            if target is None:
                return False
            try:
                thunk.bind_target(target)
            except XlapyError:
                return False
    return True
