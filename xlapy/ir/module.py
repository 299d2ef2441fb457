"""HloModule: a set of computations, one of them the entry, plus the module's config.

The config holds what the header line of HLO text says: input/output aliases, buffer
donors, the entry computation layout, whether the text order is a schedule, replica and
partition counts, frontend attributes; header attributes xlapy does not interpret are kept
as text and printed back.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import Literal as TypingLiteral

from xlapy.errors import VerifierError
from xlapy.ir.attributes import FrontendAttributes
from xlapy.ir.computation import HloComputation
from xlapy.ir.shapes import ProgramShape, ShapeIndex

AliasKind = TypingLiteral["may-alias", "must-alias"]


@dataclass(frozen=True, slots=True)
class AliasEntry:
    """Output `output_index` shares its buffer with parameter `param_number` at `param_index`."""

    output_index: ShapeIndex
    param_number: int
    param_index: ShapeIndex
    kind: AliasKind = "may-alias"


@dataclass(frozen=True, slots=True)
class BufferDonor:
    """Parameter `param_number` at `param_index` may be reused for any output of its size."""

    param_number: int
    param_index: ShapeIndex


@dataclass(slots=True)
class ModuleConfig:
    input_output_alias: tuple[AliasEntry, ...] = ()
    buffer_donors: tuple[BufferDonor, ...] = ()
    entry_computation_layout: ProgramShape | None = None
    is_scheduled: bool = False
    replica_count: int = 1
    num_partitions: int = 1
    frontend_attributes: FrontendAttributes | None = None
    extra_attributes: tuple[tuple[str, str], ...] = ()  # uninterpreted header attrs, as text

    @property
    def spmd_partitions(self) -> int:
        """The device count a global (not yet partitioned) program asks to be partitioned
        for: its `mhlo.num_partitions` frontend attribute (what the StableHLO importer
        writes for a sharded program), else 1. A partitioned module's count is
        `num_partitions` instead."""
        fa = self.frontend_attributes
        value = fa.get("mhlo.num_partitions") if fa is not None else None
        if isinstance(value, str) and value.isdigit() and int(value) > 0:
            return int(value)
        return 1

    @property
    def output_memory_kinds(self) -> tuple[str, ...] | None:
        """The memory kind ("device", "pinned_host") of each entry output, from the
        `xla.output_memory_kinds` frontend attribute (comma-separated; what the StableHLO
        importer writes for JAX's `mhlo.memory_kind` result attributes); None: all on the
        device."""
        fa = self.frontend_attributes
        value = fa.get("xla.output_memory_kinds") if fa is not None else None
        return tuple(value.split(",")) if isinstance(value, str) and value else None

    def alias_for_output(self, output_index: ShapeIndex) -> AliasEntry | None:
        for entry in self.input_output_alias:
            if entry.output_index == output_index:
                return entry
        return None

    def aliases_of_parameter(self, param_number: int) -> list[AliasEntry]:
        return [e for e in self.input_output_alias if e.param_number == param_number]


@dataclass(frozen=True, slots=True)
class StackFrameTables:
    """The FileNames / FunctionNames / FileLocations / StackFrames tables of optimized dumps,
    kept as (id, text) rows so they print back unchanged."""

    file_names: tuple[tuple[int, str], ...] = ()
    function_names: tuple[tuple[int, str], ...] = ()
    file_locations: tuple[tuple[int, str], ...] = ()
    stack_frames: tuple[tuple[int, str], ...] = ()

    @property
    def empty(self) -> bool:
        return not (
            self.file_names or self.function_names or self.file_locations or self.stack_frames
        )


class HloModule:
    """A whole HLO program. `module.entry` is the entry computation."""

    __slots__ = ("_name_counter", "computations", "config", "entry", "name", "stack_frames")

    def __init__(self, name: str, config: ModuleConfig | None = None):
        self.name = name
        self.computations: list[HloComputation] = []
        self.entry: HloComputation | None = None
        self.config = config or ModuleConfig()
        self.stack_frames = StackFrameTables()

    def add_computation(self, comp: HloComputation, *, entry: bool = False) -> HloComputation:
        comp.parent = self
        self.computations.append(comp)
        if entry:
            if self.entry is not None:
                self.entry.is_entry = False
            self.entry = comp
            comp.is_entry = True
        return comp

    def get_computation(self, name: str) -> HloComputation:
        for comp in self.computations:
            if comp.name == name:
                return comp
        raise KeyError(f"module {self.name} has no computation named {name}")

    def entry_computation(self) -> HloComputation:
        """The entry, for code that needs one (`entry` is None only while a module is being
        built); VerifierError naming the module when it has none."""
        if self.entry is None:
            raise VerifierError(f"module {self.name} has no entry computation")
        return self.entry

    @property
    def program_shape(self) -> ProgramShape:
        return self.entry_computation().program_shape

    def instructions(self):
        """Every instruction of every computation."""
        for comp in self.computations:
            yield from comp.instructions

    def release(self, keep: Collection[HloComputation] = ()) -> None:
        """Take apart a module its owner drops (a losing trial of the memory-plan choice):
        the edges that make its computations and instructions one reference cycle (use-lists,
        control edges, `parent` links, a computation's instruction list) are removed, so
        reference counting frees it at once instead of the cyclic collector later. The
        computations in `keep` (shared with another module, see `copy`) are left intact.
        A released module, computation or instruction used again raises AttributeError."""
        for comp in self.computations:
            if comp in keep:
                continue
            comp.release()
        del self.computations, self.entry

    def copy(self, share: Collection[HloComputation] = ()) -> HloModule:
        """An independent copy with the same names, order and attributes: what parsing
        `to_text()` gives, without printing and parsing. Computations, instructions, use-lists
        (in text order, as a parse makes them) and the config are new; shapes, literals and
        attribute values are immutable and shared, except references to computations, which
        point at the copies. The computations in `share` are not copied: the copy holds
        them as they are (for a copy that will not edit them; their `parent` stays this
        module)."""
        from xlapy.ir.instruction import HloInstruction

        clone = HloModule(self.name, replace(self.config))
        clone.stack_frames = self.stack_frames
        comps = {c: c if c in share else HloComputation(c.name) for c in self.computations}

        def remap(value):
            if isinstance(value, HloComputation):
                return comps[value]
            if isinstance(value, tuple) and value and isinstance(value[0], HloComputation):
                return tuple(comps[c] for c in value)
            return value

        for comp in self.computations:
            copy = comps[comp]
            if copy is comp:
                clone.computations.append(comp)
                if comp is self.entry:
                    clone.entry = comp
                continue
            copy.execution_thread = comp.execution_thread
            made = {
                i: HloInstruction(
                    i.name,
                    i.opcode,
                    i.shape,
                    (),
                    {k: remap(v) for k, v in i.attrs.items()},
                    literal=i.literal,
                    parameter_number=i.parameter_number,
                )
                for i in comp.instructions
            }
            for instr in comp.instructions:
                new = made[instr]
                new.operands = [made[o] for o in instr.operands]
                new.control_predecessors = [made[p] for p in instr.control_predecessors]
                copy.add_instruction(new)
            root = comp.root
            copy.root = made[root] if root is not None else None
            clone.add_computation(copy, entry=comp is self.entry)
        return clone

    def to_text(self, **options) -> str:
        """The module as HLO text (see xlapy.ir.printer.print_module for options)."""
        from xlapy.ir.printer import print_module

        return print_module(self, **options)

    def __str__(self) -> str:
        return self.to_text()

    def __repr__(self) -> str:
        return f"<HloModule {self.name}: {len(self.computations)} computations>"
