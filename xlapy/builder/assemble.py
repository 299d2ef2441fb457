"""Turning a top-level builder's computation into a verified HloModule.

The module gets copies of the builder's instructions and of every computation they call, so
a builder (and a reducer built once and used in many places) stays untouched, and building
twice gives two independent modules. A computation called by several ops is copied once.
Callees come before their callers and the entry comes last, the order the text format
needs. Names are made unique across the module: a clashing name gets a fresh `.N` suffix.
The alias and donor entries are checked against the entry's signature (naming the builder
method that made them), then the whole module goes through the verifier.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xlapy.ir.computation import HloComputation
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.module import AliasEntry, BufferDonor, HloModule, ModuleConfig
from xlapy.ir.shapes import index_text
from xlapy.ir.verifier import verify

if TYPE_CHECKING:
    from xlapy.builder.builder import XlaBuilder


def assemble_module(
    builder: XlaBuilder,
    entry: HloComputation,
    aliases: list[AliasEntry],
    donors: list[BufferDonor],
) -> HloModule:
    """A verified module whose entry is a copy of `entry`, with `aliases` and `donors`
    (check them first with `alias_problem`)."""
    config = ModuleConfig(input_output_alias=tuple(aliases), buffer_donors=tuple(donors))
    module = HloModule(builder.name, config)
    _Copier(module).copy(entry, is_entry=True)
    verify(module)
    return module


class _Copier:
    def __init__(self, module: HloModule):
        self.module = module
        self.copies: dict[int, HloComputation] = {}
        self.taken: set[str] = set()
        self.suffix = 0

    def copy(self, comp: HloComputation, is_entry: bool = False) -> HloComputation:
        done = self.copies.get(id(comp))
        if done is not None:
            return done
        for callee in comp.called_computations():
            self.copy(callee)
        mapping: dict[int, HloInstruction] = {}
        instructions = []
        for instr in comp.instructions:
            clone = HloInstruction(
                self.unique(instr.name),
                instr.opcode,
                instr.shape,
                [mapping[id(op)] for op in instr.operands],
                {k: self.remap(v) for k, v in instr.attrs.items()},
                literal=instr.literal,
                parameter_number=instr.parameter_number,
                control_predecessors=[mapping[id(p)] for p in instr.control_predecessors],
            )
            mapping[id(instr)] = clone
            instructions.append(clone)
        copy = HloComputation(self.unique(comp.name), instructions, mapping[id(comp.root)])
        self.copies[id(comp)] = copy
        self.module.add_computation(copy, entry=is_entry)
        return copy

    def remap(self, value):
        if isinstance(value, HloComputation):
            return self.copies[id(value)]
        if isinstance(value, tuple) and value and isinstance(value[0], HloComputation):
            return tuple(self.copies[id(c)] for c in value)
        return value

    def unique(self, name: str) -> str:
        if name not in self.taken:
            self.taken.add(name)
            return name
        base = name.rsplit(".", 1)[0] if name.rsplit(".", 1)[-1].isdigit() else name
        while True:
            self.suffix += 1
            candidate = f"{base}.{self.suffix}"
            if candidate not in self.taken:
                self.taken.add(candidate)
                return candidate


def alias_problem(entry: HloComputation, aliases, donors) -> str | None:
    """What is wrong with `aliases` and `donors` for `entry`'s signature, or None."""
    params = {p.parameter_number: p.shape for p in entry.parameters}
    result = entry.root_instruction().shape
    for e in aliases:
        where = (
            f"set_up_alias(): alias {index_text(e.output_index)}: "
            f"({e.param_number}, {index_text(e.param_index)})"
        )
        if not result.has_index(e.output_index):
            return (
                f"{where} names output index {index_text(e.output_index)}, which does not "
                f"exist in the result shape {result.to_text(False)}"
            )
        if e.param_number not in params:
            return f"{where} names parameter {e.param_number}, which does not exist"
        if not params[e.param_number].has_index(e.param_index):
            return (
                f"{where}: index {index_text(e.param_index)} does not exist in parameter "
                f"{e.param_number} ({params[e.param_number].to_text(False)})"
            )
    for d in donors:
        where = f"add_buffer_donor(): donor ({d.param_number}, {index_text(d.param_index)})"
        if d.param_number not in params:
            return f"{where} names parameter {d.param_number}, which does not exist"
        if not params[d.param_number].has_index(d.param_index):
            return (
                f"{where}: index {index_text(d.param_index)} does not exist in parameter "
                f"{d.param_number} ({params[d.param_number].to_text(False)})"
            )
    return None
