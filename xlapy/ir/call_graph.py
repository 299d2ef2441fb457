"""The call graph of a module (XLA's CallGraph): who calls each computation, and how it runs.

A computation runs in one of two ways, decided by the opcode of the instruction calling it
(the opcode table's `call_context`):
  sequential  as part of the program's schedule, its instructions ordered with the caller's:
              the entry, and the bodies, conditions and branches of while / conditional /
              call, when their caller is itself sequential;
  embedded    inside one operation, per element or per group: fusion bodies, reducers,
              comparators, scatter combiners, ... and everything those call.
A computation reached both ways has context BOTH (flatten-call-graph clones it apart); one
the entry does not reach has NONE. The graph is a snapshot: build it again after edits that
add or remove call sites.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from xlapy.ir.instruction import CALL_ATTRIBUTES
from xlapy.ir.opcodes import CallContext

if TYPE_CHECKING:
    from xlapy.ir.computation import HloComputation
    from xlapy.ir.instruction import HloInstruction
    from xlapy.ir.module import HloModule


class Context(enum.Enum):
    """How a computation runs (see the module comment)."""

    NONE = "none"
    SEQUENTIAL = "sequential"
    EMBEDDED = "embedded"
    BOTH = "both"


@dataclass(eq=False)
class CallGraphNode:
    """One computation: the instructions calling it and the computations it calls."""

    computation: HloComputation
    callers: list[HloInstruction] = field(default_factory=list)  # call sites, module order
    callees: list[HloComputation] = field(default_factory=list)  # each once, call order
    callsites: list[HloInstruction] = field(default_factory=list)  # its calling instructions
    context: Context = Context.NONE

    @property
    def sequential_callers(self) -> list[HloInstruction]:
        return [c for c in self.callers if c.opcode.call_context is CallContext.SEQUENTIAL]


class CallGraph:
    """Callers, callees and context of every computation of a module."""

    def __init__(self, module: HloModule):
        self.module = module
        self._nodes: dict[int, CallGraphNode] = {
            id(c): CallGraphNode(c) for c in module.computations
        }
        calls_nothing = CALL_ATTRIBUTES.isdisjoint  # (most instructions call nothing)
        for comp in module.computations:
            node = self._nodes[id(comp)]
            seen: set[int] = set()
            for instr in [i for i in comp.instructions if not calls_nothing(i.attrs)]:
                node.callsites.append(instr)
                for callee in instr.called_computations():
                    callee_node = self._nodes.get(id(callee))
                    if callee_node is None:  # not (yet) in the module
                        callee_node = self._nodes[id(callee)] = CallGraphNode(callee)
                    callee_node.callers.append(instr)
                    if id(callee) not in seen:
                        seen.add(id(callee))
                        node.callees.append(callee)
        self._sequential_order: list[HloComputation] = []
        if module.entry is not None:
            self._set_contexts(module.entry)

    @classmethod
    def build(cls, module: HloModule) -> CallGraph:
        return cls(module)

    def _set_contexts(self, entry: HloComputation) -> None:
        """Contexts by a walk from the entry: sequential through sequential call sites of
        sequential computations (breadth first, callers before callees: that order is
        `sequential_computations`), embedded through everything else."""
        marks: dict[int, set[Context]] = {}

        def mark(comp: HloComputation, context: Context) -> bool:
            have = marks.setdefault(id(comp), set())
            if context in have:
                return False
            have.add(context)
            return True

        mark(entry, Context.SEQUENTIAL)
        order = [entry]
        pending = [entry]
        embedded: list[HloComputation] = []
        while pending:
            comp = pending.pop(0)
            for instr in self._nodes[id(comp)].callsites:
                sequential = instr.opcode.call_context is CallContext.SEQUENTIAL
                for callee in instr.called_computations():
                    if not sequential:
                        if mark(callee, Context.EMBEDDED):
                            embedded.append(callee)
                    elif mark(callee, Context.SEQUENTIAL):
                        order.append(callee)
                        pending.append(callee)
        while embedded:
            comp = embedded.pop()
            for callee in self._nodes[id(comp)].callees:
                if mark(callee, Context.EMBEDDED):
                    embedded.append(callee)
        for key, have in marks.items():
            node = self._nodes[key]
            if len(have) == 2:
                node.context = Context.BOTH
            else:
                (node.context,) = have
        self._sequential_order = order

    # -- questions -------------------------------------------------------------------------
    def node(self, comp: HloComputation) -> CallGraphNode:
        node = self._nodes.get(id(comp))
        if node is None:
            raise KeyError(f"computation {comp.name} is not in module {self.module.name}")
        return node

    def callers(self, comp: HloComputation) -> list[HloInstruction]:
        """The instructions calling `comp`."""
        return self.node(comp).callers

    def context(self, comp: HloComputation) -> Context:
        return self.node(comp).context

    def is_sequential(self, comp: HloComputation) -> bool:
        """Runs as part of the schedule (possibly also embedded somewhere: BOTH)."""
        return self.node(comp).context in (Context.SEQUENTIAL, Context.BOTH)

    def is_embedded(self, comp: HloComputation) -> bool:
        """Runs inside an operation (possibly also sequentially somewhere: BOTH)."""
        return self.node(comp).context in (Context.EMBEDDED, Context.BOTH)

    def sequential_computations(self) -> list[HloComputation]:
        """The entry and every computation it reaches through control flow, callers before
        callees (breadth first from the entry)."""
        return list(self._sequential_order)

    def embedded_computations(self) -> list[HloComputation]:
        """The computations that run inside an operation, in module order."""
        return [c for c in self.module.computations if self.is_embedded(c)]

    def reachable_computations(self) -> list[HloComputation]:
        """The computations the entry reaches, in module order."""
        return [c for c in self.module.computations if self.node(c).context is not Context.NONE]
