"""What fusion may put together, and what it costs: the tables both fusion passes read.

An instruction is *loop-fusible* when a fused kernel can compute any one element of its
result from elements of its operands: every elementwise op but copy, the data-movement ops
(broadcast, reshape, bitcast, transpose, slice, concatenate, pad, reverse, dynamic-slice,
gather: each element is one operand element at a place its indices give, as XLA's CPU
fusion allows), iota and constants. A reduce may join a fusion only as its root (XLA's input fusion,
`kInput`); a variadic reduce (argmax: values and indices reduced together) only as the root
itself. Dots, convolutions, custom calls, sorts, scatters, control flow, random
numbers and anything with a side effect stay out. An existing fusion takes part when its kind is
kLoop or kInput and everything inside it obeys the same rules.

When asked for (`in_place_roots`), a dynamic-update-slice may also be the root of a loop fusion,
with its update and start indices computed inside it and its operand 0 left a parameter, so
buffer assignment can give the fusion that operand's bytes (XLA's in-place dynamic-update-slice
fusion). Such a fusion is never a producer and never takes its operand 0 in.

Cost follows XLA's instruction fusion: an *expensive* producer (transcendental functions,
divide, power, remainder, gather; a fusion containing one) is never duplicated (a widening
convert aside) and never fused into a consumer that reads each of its elements many times (an
expanding broadcast, a dynamic-slice index, a gather's operands: its indices once per window
element, its operand wherever indices repeat). A cheap producer may be duplicated into several
consumers; one that is not *light* (more than one operand as large as its result, and more
elements read than written) only where it can be fused into all its users (passes/fusion.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from xlapy.errors import VerifierError
from xlapy.ir.attributes import Enum
from xlapy.ir.computation import HloComputation
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.opcodes import Opcode

O = Opcode  # noqa: E741  (short name for the tables below)

LOOP_FUSIBLE_NON_ELEMENTWISE = frozenset(
    {
        O.BITCAST,
        O.BROADCAST,
        O.CONCATENATE,
        O.CONSTANT,
        O.DYNAMIC_SLICE,
        O.GATHER,
        O.IOTA,
        O.PAD,
        O.RESHAPE,
        O.REVERSE,
        O.SLICE,
        O.TRANSPOSE,
    }
)

# Elementwise by category, but kept out: a copy in a module is there for aliasing or
# layout (copy insertion's copies must survive re-fusion of an optimized module).
NEVER_FUSED = frozenset({O.COPY})

# Only as the root of a fusion.
ROOT_ONLY = frozenset({O.REDUCE})

# Ops that run as their own thunk (a library call or a kernel of their own), never inside a
# loop fusion. Another compiler's fusion around one (XLA's output fusion of a dot and its
# bias add, its fusions holding a reduce-window or a scatter) is undone by the defuser
# (passes/inline.py) before xlapy fuses again by its own rules.
OWN_THUNK = frozenset(
    {
        O.CHOLESKY,
        O.CONVOLUTION,
        O.CUSTOM_CALL,
        O.DOT,
        O.FFT,
        O.REDUCE_WINDOW,
        O.RNG_BIT_GENERATOR,
        O.SCATTER,
        O.SELECT_AND_SCATTER,
        O.SORT,
        O.TOPK,
        O.TRIANGULAR_SOLVE,
    }
)

# Only as the root of a fusion, with this operand a fusion parameter (updated in place).
IN_PLACE_ROOT_OPERAND = {O.DYNAMIC_UPDATE_SLICE: 0}

LOOP = Enum("kLoop")
INPUT = Enum("kInput")
FUSIBLE_KINDS = frozenset({"kLoop", "kInput"})


def fused_computation(instr: HloInstruction) -> HloComputation | None:
    """The computation a fusion instruction calls (None for anything else)."""
    if instr.opcode is not O.FUSION:
        return None
    return instr.calls_or_none


def fusion_body(fusion: HloInstruction) -> HloComputation:
    """The computation `fusion` calls; VerifierError when it is not a fusion that calls one."""
    comp = fused_computation(fusion)
    if comp is None:
        raise VerifierError(f"{fusion.name} is not a fusion with a fused computation")
    return comp


def _plain_array(instr: HloInstruction) -> bool:
    shape = instr.shape
    return shape.is_array and not shape.is_dynamic


def is_loop_fusible_op(instr: HloInstruction) -> bool:
    """An op (not a fusion) that may sit anywhere inside a loop fusion."""
    op = instr.opcode
    if not (op.is_elementwise or op in LOOP_FUSIBLE_NON_ELEMENTWISE) or op in NEVER_FUSED:
        return False
    if instr.has_side_effect or instr.control_predecessors:
        return False
    return _plain_array(instr)


def _root_outputs(comp: HloComputation) -> list[HloInstruction]:
    root = comp.root_instruction()
    return list(root.operands) if root.opcode is O.TUPLE else [root]


def _in_place_root_ok(instr: HloInstruction) -> bool:
    """A dynamic-update-slice that may be an in-place fusion root: a plain array result."""
    k = IN_PLACE_ROOT_OPERAND.get(instr.opcode)
    if k is None or instr.has_side_effect or instr.control_predecessors:
        return False
    return _plain_array(instr) and len(instr.operands) == 2 + instr.shape.rank


def in_place_root(comp: HloComputation) -> HloInstruction | None:
    """The root of `comp` when it is an in-place root (see the module comment) whose updated
    operand is a parameter, else None."""
    root = comp.root_instruction()
    if not _in_place_root_ok(root):
        return None
    operand = root.operands[IN_PLACE_ROOT_OPERAND[root.opcode]]
    return root if operand.opcode is O.PARAMETER else None


def in_place_operand(instr: HloInstruction) -> int | None:
    """The operand index of `instr` (a dynamic-update-slice or a fusion rooted at one) that
    is updated in place and so must not be fused into it; None for anything else."""
    k = IN_PLACE_ROOT_OPERAND.get(instr.opcode)
    if k is not None:
        return k
    comp = fused_computation(instr)
    root = in_place_root(comp) if comp is not None else None
    if root is None:
        return None
    return root.operands[IN_PLACE_ROOT_OPERAND[root.opcode]].parameter_number


def unfusible_members(comp: HloComputation) -> list[HloInstruction]:
    """The instructions of `comp`, parameters aside, that are not loop-fusible ops: the only
    ones `fusion_body_is_fusible` has to judge (a root may still excuse them)."""
    return [
        i for i in comp.instructions if i.opcode is not O.PARAMETER and not is_loop_fusible_op(i)
    ]


# How the checks below learn a body's unfusible members: by walking it, or from an index
# that whoever edits the bodies keeps current (FusionEditor.unfusible).
Unfusible = Callable[[HloComputation], Iterable[HloInstruction]]


def fusion_body_is_fusible(
    comp: HloComputation, in_place_roots: bool = False, unfusible: Unfusible = unfusible_members
) -> bool:
    """Everything in `comp` is loop-fusible, reduces appear only as outputs, and the root is
    one such instruction or a tuple of them (or, with `in_place_roots`, an in-place root)."""
    outputs: set[int] | None = None
    for instr in unfusible(comp):
        if in_place_roots and instr is comp.root and in_place_root(comp) is not None:
            continue
        if instr.opcode is O.TUPLE and instr is comp.root:
            continue
        if outputs is None:
            outputs = {id(i) for i in _root_outputs(comp)}
        if (
            instr.opcode in ROOT_ONLY
            and id(instr) in outputs
            and (not instr.shape.is_tuple or instr is comp.root)  # a variadic reduce: the root
        ):
            continue
        return False
    return True


def is_fusible_fusion(
    instr: HloInstruction, in_place_roots: bool = False, unfusible: Unfusible = unfusible_members
) -> bool:
    """A fusion the passes may grow or merge: kLoop/kInput with a fusible body (rooted at an
    in-place dynamic-update-slice only with `in_place_roots`)."""
    comp = fused_computation(instr)
    if comp is None or instr.control_predecessors:
        return False
    kind = instr.fusion_kind
    if kind is None or str(kind) not in FUSIBLE_KINDS:
        return False
    return fusion_body_is_fusible(comp, in_place_roots, unfusible)


def has_reduce_output(comp: HloComputation) -> bool:
    return any(i.opcode in ROOT_ONLY for i in _root_outputs(comp))


def can_be_producer(instr: HloInstruction, unfusible: Unfusible = unfusible_members) -> bool:
    """May `instr` be fused into a consumer (its value computed inside the consumer)?"""
    if instr.opcode is O.FUSION:
        if not is_fusible_fusion(instr, False, unfusible) or not _plain_array(instr):
            return False
        comp = fusion_body(instr)
        return comp.root_instruction().opcode is not O.TUPLE and not has_reduce_output(comp)
    return is_loop_fusible_op(instr)


def can_be_consumer(
    instr: HloInstruction, in_place_roots: bool = False, unfusible: Unfusible = unfusible_members
) -> bool:
    """May producers be fused into `instr` (which becomes, or is, the fusion)? With
    `in_place_roots`, a dynamic-update-slice may (into every operand but the updated one)."""
    if instr.opcode is O.FUSION:
        return is_fusible_fusion(instr, in_place_roots, unfusible)
    if not instr.operands:
        return False
    if instr.opcode in IN_PLACE_ROOT_OPERAND:
        return in_place_roots and _in_place_root_ok(instr)
    if instr.opcode in ROOT_ONLY:
        leaves = instr.shape.tuple_shapes if instr.shape.is_tuple else (instr.shape,)
        return (
            not instr.has_side_effect
            and not instr.control_predecessors
            and all(s.is_array and not s.is_dynamic for s in leaves)
        )
    return is_loop_fusible_op(instr)


def is_variadic_reduce_kernel(instr: HloInstruction) -> bool:
    """A variadic (tuple-shaped) reduce, or a fusion rooted at one: its tuple is the
    kernel's own output list, so it cannot become one output of a multi-output fusion."""
    comp = fused_computation(instr)
    root = comp.root_instruction() if comp is not None else instr
    return root.opcode in ROOT_ONLY and root.shape.is_tuple


def is_expensive(instr: HloInstruction) -> bool:
    """Work that must not be duplicated or recomputed per reuse."""
    comp = fused_computation(instr)
    if comp is not None:
        return any(is_expensive(i) for i in comp.instructions)
    if instr.opcode.is_expensive or instr.opcode is O.GATHER:
        return True
    if instr.opcode.is_elementwise or instr.opcode in LOOP_FUSIBLE_NON_ELEMENTWISE:
        return False
    return instr.opcode not in (O.PARAMETER, O.TUPLE, O.GET_TUPLE_ELEMENT)


def concatenates_computed_values(instr: HloInstruction) -> bool:
    """Whether a fusion computes arithmetic under a concatenate, or a concatenate reads
    computed values (which a consumer pulls in after it): a consumer it is copied into
    evaluates every operand of the concatenate at every element and selects one (the
    kernel that writes the fusion itself loops once per operand), so a copy costs as many
    times the work as the concatenate has operands."""
    comp = fused_computation(instr)
    if comp is None:  # a concatenate whose operands compute (and would be fused next)
        return instr.opcode is O.CONCATENATE and any(
            arithmetic_work(op) > 0 and op.opcode is not O.PARAMETER for op in instr.operands
        )
    for concat in comp.instructions:
        if concat.opcode is not O.CONCATENATE or len(concat.operands) < 2:
            continue
        stack, seen = list(concat.operands), set()
        while stack:
            node = stack.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            if node.opcode.is_elementwise and node.operands:
                return True
            stack.extend(node.operands)
    return False


def is_always_duplicable(instr: HloInstruction) -> bool:
    """A widening convert: duplicated into its consumers, they read the narrow operand."""
    if instr.opcode is not O.CONVERT or not instr.shape.is_array:
        return False
    return instr.operands[0].shape.byte_size < instr.shape.byte_size


def arithmetic_work(instr: HloInstruction) -> int:
    """Elements computed by arithmetic in `instr` (a fusion: in its body); data movement,
    constants and iotas are free."""
    comp = fused_computation(instr)
    if comp is not None:
        return sum(arithmetic_work(i) for i in comp.instructions)
    if not instr.opcode.is_elementwise or not instr.shape.is_array or instr.shape.is_dynamic:
        return 0
    return instr.shape.num_elements


def _true_rank(shape) -> int:
    return sum(1 for d in shape.dims if d != 1) if shape.is_array else 0


def is_light_to_duplicate(instr: HloInstruction) -> bool:
    """Duplicating `instr` into several consumers does not multiply what they read: at most
    one operand is as large as the result (broadcasts, iotas and scalar constants count as
    negligible: XLA's "effectively at most unary"), or its operands hold no more elements
    than its result."""
    out_rank = _true_rank(instr.shape)
    large = 0
    for op in instr.operands:
        if op.opcode in (O.BROADCAST, O.IOTA):
            continue
        if op.opcode is O.CONSTANT and op.shape.is_array and op.shape.num_elements == 1:
            continue
        large += _true_rank(op.shape) >= out_rank
    if large <= 1:
        return True
    unique = dict.fromkeys(instr.operands)
    elements = sum(op.shape.num_elements for op in unique if op.shape.is_array)
    return instr.shape.is_array and elements <= instr.shape.num_elements


def _op_reuses(instr: HloInstruction, operand_index: int) -> bool:
    """Does the op read some element of operand `operand_index` more than once?"""
    op = instr.opcode
    operand = instr.operands[operand_index]
    if op is O.BROADCAST:
        return instr.shape.num_elements > operand.shape.num_elements
    if op is O.DYNAMIC_SLICE:
        return operand_index > 0
    if op is O.GATHER:  # an index per window element; the operand at repeated indices
        return True
    if op is O.PAD:
        return operand_index == 1
    if op is O.REDUCE:
        return operand_index >= len(instr.operands) // 2
    if op is O.CLAMP or op is O.SELECT:
        return operand.shape.is_scalar and not instr.shape.is_scalar
    if op is O.DYNAMIC_UPDATE_SLICE:
        return operand_index > 1 or instr.shape.num_elements > operand.shape.num_elements
    return False


def reuses_operand(consumer: HloInstruction, operand_index: int) -> bool:
    """Would a fused kernel for `consumer` read an element of operand `operand_index` more
    than once? For a fusion, any path from the parameter through a reusing op counts."""
    comp = fused_computation(consumer)
    if comp is None:
        return _op_reuses(consumer, operand_index)
    start = comp.parameter(operand_index)
    # What reads the parameter, directly or not (tuples aside), through the use-lists: the
    # part of the body downstream of the parameter, not a post-order of all of it.
    reached = {id(start): start}
    work = [start]
    while work:
        for user in work.pop().users:
            if user.opcode is not O.TUPLE and id(user) not in reached:
                reached[id(user)] = user
                work.append(user)
    for instr in reached.values():
        for j, op in enumerate(instr.operands):
            if id(op) in reached and _op_reuses(instr, j):
                return True
    return False


def iteration_space(instr: HloInstruction) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
    """(dims, reduced dims) of the loop a fused kernel for `instr` runs: the output dims of
    a loop fusion, or the input dims and reduced dims of a reduction."""
    comp = fused_computation(instr)
    outputs = _root_outputs(comp) if comp is not None else [instr]
    hero = next((o for o in outputs if o.opcode in ROOT_ONLY), outputs[0])
    if hero.opcode in ROOT_ONLY:
        return hero.operands[0].shape.dims, hero.dimensions
    return hero.shape.dims, None


def spaces_compatible(a: HloInstruction, b: HloInstruction) -> bool:
    """Can one kernel run both `a` and `b`: the same loop, and the same reduced dims where
    both reduce."""
    dims_a, red_a = iteration_space(a)
    dims_b, red_b = iteration_space(b)
    if dims_a != dims_b:
        return False
    return red_a is None or red_b is None or red_a == red_b


def fusion_kind(comp: HloComputation) -> Enum:
    """kInput when an output of the fused computation is a reduction, else kLoop."""
    return INPUT if has_reduce_output(comp) else LOOP


def operand_bytes(instr: HloInstruction) -> int:
    return sum(op.shape.byte_size for op in dict.fromkeys(instr.operands) if op.shape.is_array)
