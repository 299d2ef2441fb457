"""The backend interface: what a runtime needs from something that runs HLO.

A Backend turns a verified module into a CompiledProgram; a CompiledProgram runs on host
values (NumPy arrays, tuples of them for tuple parameters) and returns the output value.

Donation contract of `CompiledProgram.run(args, donated)`: `donated` holds the numbers of
parameters whose arrays the program may overwrite. For every alias of the module
(`module.config.input_output_alias`, expanded to array leaves by `alias_leaves`) whose
parameter is donated, the program writes that output into the argument's own array and
returns that very array object as the output leaf (in place, no copy). Every other output
leaf is a fresh array that shares memory with no argument, constant or other output, so a
runtime may hand each leaf to a different buffer. Arguments that are not donated are never
written.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from xlapy.backends.options import (
    INTERNAL_OPTIONS,
    RUNTIME_OPTIONS,
    BackendOptionError,
    Option,
    check_options,
    memory_scheduler,
)
from xlapy.ir.module import HloModule
from xlapy.ir.shapes import Shape, ShapeIndex

if TYPE_CHECKING:
    from xlapy.memory.buffer_assignment import BufferAssignment


@dataclass(frozen=True, slots=True)
class LeafAlias:
    """Array leaf `output_index` of the output lives in parameter `param_number`'s array leaf
    `param_index`."""

    output_index: ShapeIndex
    param_number: int
    param_index: ShapeIndex
    must_alias: bool = False


def alias_leaves(module: HloModule) -> tuple[LeafAlias, ...]:
    """The module's input/output aliases, with aliased tuples expanded to their array leaves."""
    out_shape = module.entry_computation().root_instruction().shape
    leaves = []
    for entry in module.config.input_output_alias:
        out_sub = out_shape.subshape(entry.output_index)
        for rel, leaf in out_sub.leaves():
            if not leaf.is_array:
                continue
            leaves.append(
                LeafAlias(
                    (*entry.output_index, *rel),
                    entry.param_number,
                    (*entry.param_index, *rel),
                    entry.kind == "must-alias",
                )
            )
    return tuple(leaves)


@dataclass(frozen=True, slots=True)
class Fallback:
    """An instruction a compiled program runs with the interpreter's NumPy rule instead of
    native or library code, and why."""

    name: str
    opcode: str
    reason: str

    def __str__(self) -> str:
        return f"{self.name} ({self.opcode}): {self.reason}"


class CompiledProgram(ABC):
    """A module compiled for one backend, ready to run on host values.

    `buffer_assignment` is the memory plan of the program this backend runs: the one every
    memory figure of the runtime describes (Executable.memory_stats(), the PJRT plugin's
    compiled memory stats, `xlapy memory`). A backend that executes over a buffer
    assignment returns that very object; the default plans the module as given (flatten
    the call graph, insert copies, assign buffers: xlapy.memory.plan_as_given), once.
    `temp_allocation_bytes` is what one run allocates besides its outputs (the temp
    arenas); the runtime counts it in the device allocator while the run lasts."""

    module: HloModule
    memory_scheduler: str = "plan"
    """The order the default plan is made over (the backend option `memory_scheduler`)."""
    _plan: BufferAssignment | None = None

    @property
    def buffer_assignment(self) -> BufferAssignment:
        """The buffer assignment of this program (MemoryPlanningError when the module
        cannot be planned)."""
        if self._plan is None:
            from xlapy.memory.buffer_assignment import plan_as_given

            self._plan = plan_as_given(self.module, self.memory_scheduler)
        return self._plan

    @property
    def temp_allocation_bytes(self) -> int:
        """Bytes one run allocates for its temporaries (0: none are planned)."""
        return 0

    @property
    def fixed_cost_seconds(self) -> float | None:
        """An estimate of one run's time when it depends only on the shapes, never on the
        data (no loops, library calls or custom calls); None when it may (the runtime then
        times the runs to decide whether they are cheap, see xlapy.runtime.execution)."""
        return None

    @property
    def fallbacks(self) -> list[Fallback]:
        """The instructions this program runs with the interpreter's rule (none for a
        backend that has no other way to run them)."""
        return []

    @property
    def python_loops(self) -> list[Fallback]:
        """The while loops this program drives from Python, iteration by iteration, and why
        each is not one native function (none for a backend without native loops)."""
        return []

    @abstractmethod
    def run(
        self, args: Sequence[Any], donated: frozenset[int] = frozenset(), collectives=None
    ) -> Any:
        """Run on `args` (one value per parameter) and return the output value; see the
        module docstring for what `donated` allows. `collectives`, for a run that is one
        device of a multi-device execution, is that device's
        xlapy.backends.collectives.DeviceCollectives: its replica and partition ids and
        the way to its peers."""


class Backend(ABC):
    """Something that compiles modules: `name` is how it is found, `platform` the kind of
    device it runs on ("interpreter", "cpu", ...)."""

    name: str
    platform: str
    options: ClassVar[Mapping[str, Option]] = {}
    """The backend options this backend honours (xlapy.backends.options), beside the
    runtime's RUNTIME_OPTIONS; any other is a BackendOptionError."""

    def user_options(self) -> dict[str, Option]:
        """Every option a user may set for this backend: its own and the runtime's."""
        return {**self.options, **RUNTIME_OPTIONS}

    def check_options(self, options: Mapping[str, Any] | None, *, user: bool = False) -> None:
        """BackendOptionError for an option of `options` this backend does not honour or a
        value it cannot take; `user`: options a user set (the runtime's own, which it
        passes to `compile`, are then not allowed)."""
        options = options or {}
        if user:
            for key in options:
                if key in INTERNAL_OPTIONS:
                    raise BackendOptionError(
                        f"backend option {key!r} is {INTERNAL_OPTIONS[key].doc}, not by a user"
                    )
        table = self.user_options() if user else {**self.user_options(), **INTERNAL_OPTIONS}
        check_options(table, options, self.name)

    @abstractmethod
    def compile(
        self,
        module: HloModule,
        options: Mapping[str, Any] | None = None,
        *,
        text: str | None = None,
    ) -> CompiledProgram:
        """Compile a verified `module`; `options` are backend-specific settings; `text`,
        when the caller has it, is `module`'s HLO text (saves printing it again)."""

    def plan_memory(
        self,
        module: HloModule,
        options: Mapping[str, Any] | None = None,
        *,
        text: str | None = None,
    ) -> BufferAssignment:
        """The buffer assignment `compile(module, options)` executes, without generating
        code (`module` is not changed). The default: the module planned as given, over
        the order the option `memory_scheduler` names."""
        from xlapy.memory.buffer_assignment import plan_as_given

        self.check_options(options)
        return plan_as_given(module, memory_scheduler(options))

    # -- whole-program images (a warm compile that parses nothing) ---------------------------
    def image_key(self, program: str | bytes, options_json: str) -> str | None:
        """The name of the image of compiling `program` (text or bytes exactly as the
        runtime was handed them, unparsed) with the compile options `options_json`; None
        when this backend keeps no images (the default)."""
        return None

    def save_image(self, key: str, executable: Mapping[str, Any], program: CompiledProgram) -> bool:
        """Keep `program` (compiled with `executable`'s options) and the runtime's facts
        about its executable under `key`; False when it cannot be imaged."""
        return False

    def load_image(
        self, key: str, options: Mapping[str, Any]
    ) -> tuple[dict[str, Any], CompiledProgram] | None:
        """(the runtime's facts, the program) imaged under `key`, the program given the
        process's `options` (the client's custom-call registry); None on a miss."""
        return None


PROFILE: ContextVar[Any] = ContextVar("xlapy_profile", default=None)
"""The profiler recording the runs made on this thread (xlapy.runtime.profiler), or None. A
backend that runs a sequence of steps hands each sequence to `PROFILE.get().run_sequence(
name, steps, run)` when one is set, which runs them one by one (`run(step)`) and times
each; when none is set (always, outside profiling) it runs as usual."""


def leaf_at(value: Any, index: ShapeIndex) -> Any:
    """The sub-value of a (nested tuple) value at `index`."""
    for i in index:
        value = value[i]
    return value


def replace_leaf(value: Any, index: ShapeIndex, leaf: Any) -> Any:
    """`value` with the sub-value at `index` replaced by `leaf` (tuples are rebuilt)."""
    if not index:
        return leaf
    head, rest = index[0], index[1:]
    items = list(value)
    items[head] = replace_leaf(items[head], rest, leaf)
    return tuple(items)


def shape_leaves(shape: Shape) -> list[tuple[ShapeIndex, Shape]]:
    """The array leaves of `shape` in pre-order."""
    return [(i, s) for i, s in shape.leaves() if s.is_array]
