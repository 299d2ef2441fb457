"""All-reduce combiner: independent all-reduces over the same device groups become one.

XLA's AllReduceCombiner, for what the SPMD partitioner emits. Several gradients reduced
after a loop (or the partial sums of a layer's weights) each get their own all-reduce; on
a real interconnect every collective pays a fixed latency, and XLA:CPU's optimized
programs show one all-reduce of a tuple instead. Two all-reduces combine when they reduce
one array each, with the same replica groups, channel/global-id mode, element type and an
equivalent reducer (the same computation object: the partitioner makes one adder per
element type), and neither depends on the other through any path (a combined op reading
the result of one of its members would be a cycle). Members are taken greedily in post
order; each group becomes one variadic all-reduce whose users read get-tuple-elements.
"""

from __future__ import annotations

from xlapy.ir.computation import HloComputation
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.module import HloModule
from xlapy.ir.names import NameUniquer
from xlapy.ir.opcodes import Opcode
from xlapy.ir.shapes import Shape
from xlapy.passes.pass_base import HloPass, register_pass


def _key(instr: HloInstruction):
    if instr.opcode is not Opcode.ALL_REDUCE or len(instr.operands) != 1:
        return None
    if not instr.shape.is_array:
        return None
    groups = instr.replica_groups
    if groups is None:
        return None
    return (
        groups,
        instr.use_global_device_ids,
        instr.channel_id is not None,
        id(instr.to_apply_or_none),
        str(instr.shape.element_type),
    )


def combine_all_reduces(comp: HloComputation, namer: NameUniquer) -> int:
    """Combine the independent all-reduces of `comp`; returns how many were folded away."""
    order = comp.post_order()
    keys = {id(i): _key(i) for i in order}
    # deps[i]: the candidate all-reduces instruction i depends on (through any path)
    deps: dict[int, frozenset[int]] = {}
    for instr in order:
        found: set[int] = set()
        for o in (*instr.operands, *instr.control_predecessors):
            found |= deps[id(o)]
            if keys[id(o)] is not None:
                found.add(id(o))
        deps[id(instr)] = frozenset(found)
    clusters: dict[object, list[list[HloInstruction]]] = {}
    for instr in order:
        key = keys[id(instr)]
        if key is None:
            continue
        for cluster in clusters.setdefault(key, []):
            if not any(id(m) in deps[id(instr)] for m in cluster):
                cluster.append(instr)
                break
        else:
            clusters[key].append([instr])
    folded = 0
    for key_clusters in clusters.values():
        for cluster in key_clusters:
            if len(cluster) < 2:
                continue
            first = cluster[0]
            shape = Shape.tuple([m.shape for m in cluster])
            combined = HloInstruction(
                namer.fresh("all-reduce"),
                Opcode.ALL_REDUCE,
                shape,
                [m.operands[0] for m in cluster],
                dict(first.attrs),
            )
            comp.add_instruction(combined)
            for k, m in enumerate(cluster):
                part = HloInstruction(
                    namer.fresh("get-tuple-element"),
                    Opcode.GET_TUPLE_ELEMENT,
                    m.shape,
                    [combined],
                    {"index": k},
                )
                comp.add_instruction(part)
                comp.replace_all_uses(m, part)
                comp.remove_instruction(m)
            folded += len(cluster) - 1
    if folded:
        comp.reorder(comp.post_order())
    return folded


@register_pass
class AllReduceCombiner(HloPass):
    """Combine independent all-reduces of the entry (see the module docstring)."""

    name = "all-reduce-combiner"

    def run(self, module: HloModule) -> bool:
        if module.entry is None:
            return False
        return combine_all_reduces(module.entry_computation(), NameUniquer(module)) > 0
