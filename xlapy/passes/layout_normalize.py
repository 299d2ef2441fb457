"""Layouts of intermediate values become row-major before the CPU pipeline optimizes.

JAX's lowered HLO carries a layout on every instruction, and where its lowering transposes
a value it often gives the result the layout that makes the transpose free (`f32[784,512]{0,1}
transpose(dot)`): the transposed order then flows on through the elementwise ops after it.
Those layouts are not part of the program's contract. Only the entry computation's layout
(parameters and result) is; XLA's layout assignment discards the others and chooses its own,
so that, for instance, a weight gradient is computed by the dot straight into the weight's
row-major order instead of being read back transposed by the update.

This pass does the discarding: every array instruction of the entry computation, and of the
computations it runs in sequence (while conditions and bodies, conditional branches, called
computations, transitively), that is not a parameter, does not feed its computation's result
(directly or through tuples), and does not cross into another computation (operands and
results of while / conditional / call / fusion) gets the default row-major layout. Inside a
loop body this matters as much as outside: a weight gradient accumulated across a scan's
iterations is otherwise read back transposed by the accumulating add on every iteration.
The simplifier then sees transposes as real data movement and folds them into dots
(rules.py: transpose(dot) and dot(transpose) rules), and reshape-to-bitcast later turns
back into bitcasts the reshapes and transposes that still move no bytes.

An entry result that aliases a parameter (`input_output_alias`) shares that parameter's
buffer, so it takes the parameter's layout: JAX may hand over a training step whose root
returns an optimizer state `f32[64,256]{0,1}` (an update computed in a transposed
gradient's order, and so declared in `entry_computation_layout`) in place of the donated
`f32[64,256]{1,0}` parameter. Kept, the update's kernel would write the parameter's bytes in
another order than it reads them (a run through a scratch copy, and the next step reads
its state transposed). XLA compiles such a step from JAX with every layout row-major; here
the value the root returns (through tuples) is computed in its parameter's layout, and the
declared result layout says so, where the value is free to change: not a parameter, no
operand or result of control flow, not returned at two places in different layouts.

Modules whose meaning depends on physical layouts are left alone: anything holding a
`bitcast` (a reinterpretation of bytes, as in XLA's own optimized dumps) or a custom call
(native code reads its operands' bytes as laid out).
"""

from __future__ import annotations

from dataclasses import replace

from xlapy.ir.call_graph import CallGraph
from xlapy.ir.computation import HloComputation
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.module import HloModule
from xlapy.ir.names import NameUniquer
from xlapy.ir.opcodes import CallContext, Category, Opcode
from xlapy.ir.shapes import Layout, Shape
from xlapy.passes.pass_base import HloPass, register_pass

LAYOUT_SENSITIVE = frozenset({Opcode.BITCAST, Opcode.CUSTOM_CALL})
"""Opcodes whose results depend on physical layouts: their modules keep every layout."""

"""Opcodes whose operands and results are the parameters and roots of other computations."""


def _crosses(op: Opcode) -> bool:
    """Whether `op`'s operands and results are the parameters and roots of other
    computations: control flow, and fusions (whose fused parameters and root carry the
    layouts its kernel reads and writes)."""
    return op.call_context is CallContext.SEQUENTIAL or op is Opcode.FUSION


def _pinned(entry, with_root: bool = True) -> set[int]:
    """ids of the instructions of a computation (`entry`) whose layouts are part of a
    contract: parameters, the values the root returns (through tuples and
    get-tuple-elements; not `with_root`: left out), and the operands and results of control
    flow (a tuple operand of a while or call through its tuples too: its elements share the
    state's buffers)."""
    pinned: set[int] = set()
    stack: list[HloInstruction] = [entry.root] if with_root else []
    for instr in entry.instructions:
        if instr.opcode is Opcode.PARAMETER or _crosses(instr.opcode):
            pinned.add(id(instr))
            stack.extend(instr.operands)
        if instr.opcode is Opcode.GET_TUPLE_ELEMENT and _crosses(instr.operands[0].opcode):
            pinned.add(id(instr))
    while stack:
        instr = stack.pop()
        if id(instr) in pinned and instr is not entry.root:
            continue
        pinned.add(id(instr))
        if instr.opcode.category is Category.TUPLE:
            stack.extend(o for o in instr.operands if id(o) not in pinned)
    return pinned


def _aliased_result_layouts(module: HloModule, entry: HloComputation) -> dict[int, Layout]:
    """id -> layout of each array instruction that the entry's root returns (through tuples)
    as an output aliasing a parameter whose layout differs, where the instruction is free to
    take that layout (see the file comment)."""
    root = entry.root
    if root is None or not module.config.input_output_alias:
        return {}
    params = entry.parameters
    contract = _pinned(entry, with_root=False)
    found: dict[int, Layout | None] = {}
    for alias in module.config.input_output_alias:
        if not 0 <= alias.param_number < len(params) or not root.shape.has_index(
            alias.output_index
        ):
            continue
        param = params[alias.param_number].shape
        if not param.has_index(alias.param_index):
            continue
        layout = param.subshape(alias.param_index).layout
        instr = _returned_at(root, alias.output_index)
        if instr is None or not instr.shape.is_array or layout is None:
            continue
        if layout.tiles or layout.element_size_bits or layout.memory_space:
            continue
        if instr.opcode is Opcode.GET_TUPLE_ELEMENT or id(instr) in contract:
            continue  # a get-tuple-element's shape is its tuple's; contract: see _pinned
        key = id(instr)
        found[key] = layout if found.get(key, layout) == layout else None
    return {key: layout for key, layout in found.items() if layout is not None}


def _returned_at(root: HloInstruction, index: tuple[int, ...]) -> HloInstruction | None:
    """The instruction a root returns at output `index` through its tuples (None where the
    index passes through anything else)."""
    instr = root
    for i in index:
        if instr.opcode is not Opcode.TUPLE:
            return None
        instr = instr.operands[i]
    return instr


def _declare_aliased_layouts(module: HloModule, root: HloInstruction) -> None:
    """Make `entry_computation_layout`'s result say the layouts the root now returns at
    its aliased outputs."""
    declared = module.config.entry_computation_layout
    if declared is None or not declared.result.compatible(root.shape):
        return

    def rebuilt(shape: Shape, now: Shape, index: tuple[int, ...]) -> Shape:
        if shape.is_tuple:
            parts = [rebuilt(s, n, (*index, i)) for i, (s, n) in
                     enumerate(zip(shape.tuple_shapes, now.tuple_shapes, strict=True))]  # fmt: skip
            return Shape.tuple(parts)
        return now if module.config.alias_for_output(index) is not None else shape

    result = rebuilt(declared.result, root.shape, ())
    if result != declared.result:
        module.config.entry_computation_layout = replace(declared, result=result)


def _retuple(instr: HloInstruction) -> bool:
    """Give a root tuple (and the tuples under it) its operands' shapes; whether one
    changed."""
    if instr.opcode is not Opcode.TUPLE:
        return False
    changed = False
    for o in instr.operands:
        changed |= _retuple(o)
    shape = Shape.tuple(o.shape for o in instr.operands)
    if shape != instr.shape:
        instr.shape = shape
        changed = True
    return changed


def _follow_operands(instr: HloInstruction) -> bool:
    """Give a free tuple its operands' shapes, and a free get-tuple-element its tuple's
    element shape (a tuple left from an inlined call whose elements were normalized must
    not keep their old layouts, nor its get-tuple-elements: the backend shares their
    buffers and would read the bytes in the old order). Whether the shape changed."""
    if instr.opcode is Opcode.TUPLE:
        shape = Shape.tuple(o.shape for o in instr.operands)
    else:
        shape = instr.operands[0].shape.tuple_shapes[instr.tuple_index]
    if shape == instr.shape:
        return False
    instr.shape = shape
    return True


@register_pass
class NormalizeLayouts(HloPass):
    """Give the free intermediate values of the entry computation, and of the computations
    it runs in sequence, row-major layouts."""

    name = "normalize-layouts"

    def run(self, module: HloModule) -> bool:
        entry = module.entry
        if entry is None:
            return False
        for comp in module.computations:
            if any(i.opcode in LAYOUT_SENSITIVE for i in comp.instructions):
                return False
        changed = False
        returned = _aliased_result_layouts(module, entry)
        for comp in CallGraph(module).sequential_computations():
            pinned = _pinned(comp)
            for instr in comp.post_order():
                shape = instr.shape
                want = returned.get(id(instr)) if comp is entry else None
                if want is not None and shape.layout != want:
                    instr.shape = shape.with_layout(want)
                    changed = True
                if id(instr) in pinned:
                    continue
                if instr.opcode.category is Category.TUPLE:
                    changed |= _follow_operands(instr)
                    continue
                if not shape.is_array or shape.layout is None:
                    continue
                layout = shape.layout
                if layout.is_default or layout.tiles or layout.element_size_bits:
                    continue
                if layout.memory_space:
                    continue
                instr.shape = shape.with_layout(Layout.default(shape.rank))
                changed = True
        if returned and entry.root is not None:
            changed |= _retuple(entry.root)
            _declare_aliased_layouts(module, entry.root)
        return changed


@register_pass
class WhileLayoutAgreement(HloPass):
    """A while loop's state is one set of buffers, so its init, the loop's result, the
    condition's and body's parameters and the body's root must agree on layouts, as XLA's
    layout assignment makes them. A layout-insensitive module (JAX's HLO before
    optimization) may not: a transposed value entering the state as f32[8,2,64]{2,0,1}
    while the body's parameter says {2,1,0} made the body read the bytes in the wrong
    order (a bidirectional GRU's forward gave wrong numbers). The body's parameter decides;
    the init, the body's root and the condition's parameter get copies in its layouts
    where theirs differ, and a read of the loop's result that declared other layouts gets
    a copy back to them."""

    name = "while-layout-agreement"

    def run(self, module: HloModule) -> bool:
        changed = False
        names = NameUniquer(module)
        for comp in list(module.computations):
            for instr in list(comp.instructions):
                if instr.opcode is Opcode.WHILE and instr.parent is comp:
                    changed |= _agree(comp, instr, names)
        return changed


@register_pass
class AliasLayoutAgreement(HloPass):
    """Values that share one buffer must agree on layouts; XLA's layout assignment makes
    them agree with copies, and so does this pass, for what while-layout-agreement leaves:
    a tuple's element and its operand (`(f32[2,4]) tuple(p)` of a `{0,1}` parameter), a
    get-tuple-element and its tuple's element, a conditional's or call's operands and its
    computations' parameters, and its computations' roots and its result. The shape the
    consumer declares decides (the tuple's, the get-tuple-element's, the called
    computation's parameter, the conditional's or call's result); the other side is copied
    into it. Without this, the backend shared the buffer and read its bytes transposed."""

    name = "alias-layout-agreement"

    def run(self, module: HloModule) -> bool:
        changed = False
        names = NameUniquer(module)
        for comp in list(module.computations):
            for instr in list(comp.instructions):
                if instr.parent is comp:
                    changed |= _agree_aliases(comp, instr, names)
        return changed


def _agree_aliases(comp: HloComputation, instr: HloInstruction, names: NameUniquer) -> bool:
    op = instr.opcode
    changed = False
    if op is Opcode.TUPLE:
        for i, operand in enumerate(instr.operands):
            want = instr.shape.tuple_shapes[i]
            if operand.shape != want and operand.shape.compatible(want):
                instr.replace_operand_at(i, _as(comp, operand, want, names, before=instr))
                changed = True
    elif op is Opcode.GET_TUPLE_ELEMENT:
        element = instr.operands[0].shape.tuple_shapes[instr.tuple_index]
        if instr.shape != element and instr.shape.compatible(element):
            declared = instr.shape
            instr.shape = element
            comp.replace_all_uses(
                instr, _as(comp, instr, declared, names, before=None, after=instr)
            )
            changed = True
    elif op is Opcode.CONDITIONAL or op is Opcode.CALL:
        callees = list(instr.branches) if op is Opcode.CONDITIONAL else [instr.to_apply]
        first = 1 if op is Opcode.CONDITIONAL else 0
        for k, callee in enumerate(callees):
            if op is Opcode.CONDITIONAL:
                pairs = [(first + k, callee.parameter(0))]
            else:
                pairs = [(n, callee.parameter(n)) for n in range(len(instr.operands))]
            for number, param in pairs:
                operand = instr.operands[number]
                if operand.shape != param.shape and operand.shape.compatible(param.shape):
                    copy = _as(comp, operand, param.shape, names, before=instr)
                    instr.replace_operand_at(number, copy)
                    changed = True
            root = callee.root_instruction()
            if root.shape != instr.shape and root.shape.compatible(instr.shape):
                callee.set_root(_as(callee, root, instr.shape, names, before=None))
                changed = True
    return changed


def _agree(comp: HloComputation, loop: HloInstruction, names: NameUniquer) -> bool:
    body, cond = loop.while_body, loop.while_condition
    want = body.parameter(0).shape
    init, root, cond_param = loop.operands[0], body.root_instruction(), cond.parameter(0)
    shapes = (loop.shape, init.shape, root.shape, cond_param.shape)
    if all(s == want for s in shapes) or not all(s.compatible(want) for s in shapes):
        return False  # (shapes that differ beyond layouts are the verifier's business)
    if init.shape != want:
        loop.replace_operand_at(0, _as(comp, init, want, names, before=loop))
    if root.shape != want:
        body.set_root(_as(body, root, want, names, before=None))
    if cond_param.shape != want:
        _retarget_reads(cond, cond_param, want, names)
    if loop.shape != want:
        _retarget_reads(comp, loop, want, names)
    return True


def _retarget_reads(
    comp: HloComputation, source: HloInstruction, want: Shape, names: NameUniquer
) -> None:
    """Give `source` (a tuple-shaped parameter or loop) shape `want`; each read of it that
    declared other layouts reads `want`'s and copies back to its own."""
    declared_whole = source.shape
    source.shape = want
    others = []
    for read in list(source.users):
        if read.opcode is not Opcode.GET_TUPLE_ELEMENT:
            others.append(read)
            continue
        element = want.tuple_shapes[read.tuple_index]
        if read.shape == element:
            continue
        declared = read.shape
        read.shape = element
        comp.replace_all_uses(read, _as(comp, read, declared, names, before=None, after=read))
    if source.opcode is not Opcode.PARAMETER and (others or comp.root is source):
        back = _as(comp, source, declared_whole, names, before=None, after=source)
        for user in others:
            user.replace_operand_at(user.operands.index(source), back)
        if comp.root is source:
            comp.set_root(back)


def _as(
    comp: HloComputation,
    value: HloInstruction,
    shape: Shape,
    names: NameUniquer,
    before: HloInstruction | None,
    after: HloInstruction | None = None,
) -> HloInstruction:
    """`value` in `shape`'s layouts (the same value): itself, a copy, or a tuple of its
    elements so converted; new instructions go before `before` (default: just after
    `after`, else before the root)."""
    if value.shape == shape:
        return value

    def add(instr: HloInstruction) -> HloInstruction:
        if before is not None:
            return comp.add_instruction(instr, before=before)
        anchor = after if after is not None else value
        order = comp.instructions
        position = max(order.index(anchor), order.index(value)) + 1
        target = order[position] if position < len(order) else None
        return comp.add_instruction(instr, before=target) if target else comp.add_instruction(instr)

    def convert(v: HloInstruction, s: Shape) -> HloInstruction:
        if v.shape == s:
            return v
        if not s.is_tuple:
            return add(HloInstruction(names.fresh("copy"), Opcode.COPY, s, [v]))
        parts = []
        for i, element in enumerate(s.tuple_shapes):
            gte = add(
                HloInstruction(
                    names.fresh("get-tuple-element"),
                    Opcode.GET_TUPLE_ELEMENT,
                    v.shape.tuple_shapes[i],
                    [v],
                    {"index": i},
                )
            )
            parts.append(convert(gte, element))
        return add(HloInstruction(names.fresh("tuple"), Opcode.TUPLE, s, parts))

    return convert(value, shape)
