"""Flatten the call graph: one call site per control-flow computation.

Buffer assignment gives each value of a while body, conditional branch or called
computation one place in the flattened schedule, so each such computation may be called
from one while, conditional or call only. This pass clones a computation for every further
call site (and where a computation serves both as control flow and inside an operation,
e.g. as a reducer), recursively, as XLA's FlattenCallGraph does. Thread-local computations
(fusion bodies, reducers, comparators) may stay shared.
"""

from __future__ import annotations

from xlapy.ir.attributes import COMPUTATION_ATTRIBUTES
from xlapy.ir.call_graph import CallGraph
from xlapy.ir.computation import HloComputation
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.module import HloModule
from xlapy.ir.names import NameUniquer
from xlapy.ir.opcodes import CallContext
from xlapy.passes.pass_base import HloPass, register_pass


def clone_computation(comp: HloComputation, names: NameUniquer) -> HloComputation:
    """A copy of `comp` with fresh names; called computations stay shared."""
    mapping: dict[HloInstruction, HloInstruction] = {}
    clone = HloComputation(names.fresh(f"{comp.name}.clone"))
    for instr in comp.instructions:
        copy = HloInstruction(
            names.fresh(f"{instr.name}.clone"),
            instr.opcode,
            instr.shape,
            [mapping[o] for o in instr.operands],
            dict(instr.attrs),
            literal=instr.literal,
            parameter_number=instr.parameter_number,
            control_predecessors=[mapping[p] for p in instr.control_predecessors],
        )
        mapping[instr] = copy
        clone.add_instruction(copy)
    clone.root = mapping[comp.root_instruction()]
    clone.execution_thread = comp.execution_thread
    return clone


@register_pass
class FlattenCallGraph(HloPass):
    """Clone control-flow computations so that each has exactly one call site."""

    name = "flatten-call-graph"

    def run(self, module: HloModule) -> bool:
        if module.entry is None:
            return False
        names = NameUniquer(module)
        graph = CallGraph(module)
        inside_ops = {
            c
            for c in module.computations
            if any(s.opcode.call_context is not CallContext.SEQUENTIAL for s in graph.callers(c))
        }
        claimed: set[HloComputation] = {module.entry}
        pending = [module.entry]
        changed = False
        while pending:
            comp = pending.pop(0)
            for instr in comp.instructions:
                if instr.opcode.call_context is not CallContext.SEQUENTIAL:
                    continue
                # every computation attribute, whatever its name, is rewired the same way:
                # read and written by name (tests/test_architecture.py allows this file)
                for key in COMPUTATION_ATTRIBUTES:
                    value = instr.attrs.get(key)
                    if value is None:
                        continue
                    called = list(value) if isinstance(value, tuple) else [value]
                    for i, callee in enumerate(called):
                        if callee in claimed or callee in inside_ops:
                            clone = clone_computation(callee, names)
                            position = module.computations.index(callee)
                            module.computations.insert(position, clone)
                            clone.parent = module
                            called[i] = clone
                            changed = True
                        claimed.add(called[i])
                        pending.append(called[i])
                    instr.attrs[key] = tuple(called) if isinstance(value, tuple) else called[0]
        return changed
