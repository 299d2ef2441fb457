"""Loop-invariant code motion out of while bodies (XLA's WhileLoopInvariantCodeMotion).

An instruction of a while body whose operands hold the same value on every iteration
computes the same value on every iteration. It can run once, before the loop, in the
computation around it; its value then enters the loop as a new element of the loop state
that the body passes through unchanged, and the body reads that element where it computed
the instruction.

What is invariant (the body is walked operands first):
  - a get-tuple-element of the body's parameter at index i where the body's root passes
    element i through unchanged (root operand i is a read of element i);
  - a constant;
  - an instruction whose operands are all invariant and that may move: no side effect (nor
    one in what it calls), no control edges, not a parameter, token, collective, random
    number, infeed/outfeed, async, domain, barrier or control-flow op.

What moves (XLA's rules, with its CPU defaults):
  - constants never move on their own, nor do the cheap shape ops (bitcast, broadcast, iota,
    reshape, reverse, slice, transpose, tuple): moved alone they only stop fusion and
    simplification in the body. They are invariant, so an instruction that reads them and
    moves takes a copy of them along;
  - a value much larger than the state elements and constants it is computed from stays in
    the loop (it would be live across the whole loop): at most INFLATION times their bytes
    (an outer product of two invariant vectors stays; a matrix scaled by a broadcast
    vector moves);
  - nothing moves out of a loop that runs at most once (its trip count known or read from
    the usual counter pattern) or that holds a domain, SPMD shard-shape or host-offload
    custom call, whose placement matters.

Hoisted values are appended to the state, so every existing element keeps its index (a
backend_config naming the induction variable stays right). The caller's reads of the loop
keep their shape: a get-tuple-element reads the same index; any other read (a tuple user,
the computation's root) reads a tuple of the old elements. The pass rewrites a loop only
when its body and condition are called by this loop alone, its body's root is a tuple and
every read of the body's and condition's parameter is a get-tuple-element. Loops are
visited callees first, so a nested loop's invariants move out into the outer body and from
there, when invariant in it too, out of the outer loop. The element that fed the moved
instructions, when nothing else reads it, leaves the state in the while-loop simplifier.
"""

from __future__ import annotations

from xlapy.ir.computation import HloComputation
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.module import HloModule
from xlapy.ir.names import NameUniquer
from xlapy.ir.opcodes import Category, Opcode
from xlapy.ir.shapes import Shape
from xlapy.passes.hlo_edit import Editor, call_counts, has_side_effect_deep
from xlapy.passes.pass_base import HloPass, register_pass

INFLATION = 2
"""A hoisted value may be at most this many times the bytes it is computed from."""

_NOT_ALONE = frozenset(
    {
        Opcode.CONSTANT,
        Opcode.BITCAST,
        Opcode.BROADCAST,
        Opcode.IOTA,
        Opcode.RESHAPE,
        Opcode.REVERSE,
        Opcode.SLICE,
        Opcode.TRANSPOSE,
        Opcode.TUPLE,
    }
)
"""Invariant but not worth hoisting unless an instruction reading them is hoisted."""

_NEVER = frozenset(
    {
        Opcode.PARAMETER,
        Opcode.AFTER_ALL,
        Opcode.ADD_DEPENDENCY,
        Opcode.OPTIMIZATION_BARRIER,
        Opcode.DOMAIN,
        Opcode.GET_TUPLE_ELEMENT,  # of the parameter: invariant by the rule above, or not
        Opcode.WHILE,
        Opcode.CONDITIONAL,
        Opcode.CALL,
    }
)
_NEVER_CATEGORIES = frozenset(
    {Category.RNG, Category.COLLECTIVE, Category.IO, Category.ASYNC, Category.TUPLE}
)

_PINNED_TARGETS = frozenset(
    {"SPMDFullToShardShape", "SPMDShardShapeToFull", "MoveToHost", "MoveToDevice"}
)
"""Custom calls whose placement in the loop matters: a loop holding one is left alone."""

_NOT_ALONE_TARGETS = frozenset({"Sharding"})


def _bytes(shape: Shape) -> int:
    if shape.is_tuple:
        return sum(_bytes(s) for s in shape.tuple_shapes)
    return shape.byte_size if shape.is_array else 0


def _computation_post_order(module: HloModule) -> list[HloComputation]:
    """Every computation after the ones it calls (callees first)."""
    order: list[HloComputation] = []
    seen: set[int] = set()

    def visit(comp: HloComputation) -> None:
        stack = [(comp, iter(list(comp.called_computations())))]
        seen.add(id(comp))
        while stack:
            node, callees = stack[-1]
            callee = next(callees, None)
            if callee is None:
                stack.pop()
                order.append(node)
            elif id(callee) not in seen:
                seen.add(id(callee))
                stack.append((callee, iter(list(callee.called_computations()))))

    for comp in module.computations:
        if id(comp) not in seen:
            visit(comp)
    return order


def _int_constant(instr: HloInstruction) -> int | None:
    if instr.opcode is not Opcode.CONSTANT or instr.literal is None or instr.shape.rank != 0:
        return None
    value = instr.literal.array
    if value is None or value.dtype.kind not in "iu":
        return None
    return int(value)


def _is_read_of(instr: HloInstruction, param: HloInstruction, index: int) -> bool:
    return (
        instr.opcode is Opcode.GET_TUPLE_ELEMENT
        and instr.operands[0] is param
        and instr.tuple_index == index
    )


def _at_most_one_trip(loop: HloInstruction, init: list[HloInstruction]) -> bool:
    """Whether the loop runs its body at most once: its known trip count, or the counter
    pattern `i = c0; while i < n: i += 1` with constants c0 and n (either side of the
    compare)."""
    known = loop.known_trip_count
    if known is not None:
        return known <= 1
    cond, body = loop.while_condition, loop.while_body
    test = cond.root
    if test is None or test.opcode is not Opcode.COMPARE or body.root is None:
        return False
    direction = str(test.comparison_direction)
    lhs, rhs = test.operands
    if direction == "GT":  # n > i is i < n
        lhs, rhs, direction = rhs, lhs, "LT"
    if direction != "LT" or lhs.opcode is not Opcode.GET_TUPLE_ELEMENT:
        return False
    if lhs.operands[0] is not cond.parameter(0):
        return False
    k, limit = lhs.tuple_index, _int_constant(rhs)
    start = _int_constant(init[k]) if k < len(init) else None
    if limit is None or start is None:
        return False
    step = body.root.operands[k]
    if step.opcode is not Opcode.ADD:
        return False
    a, b = step.operands
    if not _is_read_of(a, body.parameter(0), k):
        a, b = b, a
    if not _is_read_of(a, body.parameter(0), k) or _int_constant(b) != 1:
        return False
    return limit - start <= 1


class _Hoist:
    """The hoisting of one loop: which body instructions move, and their copies before the
    loop."""

    def __init__(self, loop: HloInstruction, names: NameUniquer):
        self.loop, self.names = loop, names
        self.body: HloComputation = loop.while_body
        self.cond: HloComputation = loop.while_condition
        self.caller: HloComputation = loop.parent  # type: ignore[assignment]
        self.param = self.body.parameter(0)
        self.root: HloInstruction = self.body.root  # type: ignore[assignment]
        self.copies: dict[int, HloInstruction] = {}  # id(body instr) -> its copy before
        self.init_values: list[HloInstruction] = []

    def invariant_reads(self) -> set[int]:
        """ids of the body's array-shaped reads of elements the body passes through."""
        out = set()
        for read in self.param.users:
            i = read.tuple_index
            if read.shape.is_array and _is_read_of(self.root.operands[i], self.param, i):
                out.add(id(read))
        return out

    def init_value(self, index: int) -> HloInstruction:
        """The loop's initial value of element `index`, in the caller."""
        if not self.init_values:
            init = self.loop.operands[0]
            if init.opcode is Opcode.TUPLE:
                self.init_values = list(init.operands)
            else:
                for i, shape in enumerate(init.shape.tuple_shapes):
                    read = HloInstruction(
                        self.names.fresh("get-tuple-element"),
                        Opcode.GET_TUPLE_ELEMENT,
                        shape,
                        [init],
                        {"index": i},
                    )
                    self.caller.add_instruction(read, before=self.loop)
                    self.init_values.append(read)
        return self.init_values[index]

    def copy_out(self, instr: HloInstruction) -> HloInstruction:
        """`instr`'s copy in the caller, just before the loop (copying its invariant
        operands first)."""
        done = self.copies.get(id(instr))
        if done is not None:
            return done
        if instr.opcode is Opcode.GET_TUPLE_ELEMENT:
            copy = self.init_value(instr.tuple_index)
        else:
            operands = [self.copy_out(op) for op in instr.operands]
            copy = HloInstruction(
                self.names.fresh(instr.name),
                instr.opcode,
                instr.shape,
                operands,
                dict(instr.attrs),
                literal=instr.literal,
            )
            self.caller.add_instruction(copy, before=self.loop)
        self.copies[id(instr)] = copy
        return copy


def _movable(instr: HloInstruction) -> bool:
    if instr.opcode in _NEVER or instr.opcode.category in _NEVER_CATEGORIES:
        return False
    if instr.control_predecessors or instr.control_successors:
        return False
    if not instr.shape.is_array:
        return False
    return not has_side_effect_deep(instr)


def _not_alone(instr: HloInstruction) -> bool:
    if instr.opcode is Opcode.CUSTOM_CALL:
        return instr.custom_call_target in _NOT_ALONE_TARGETS
    return instr.opcode in _NOT_ALONE


def _source_bytes(instr: HloInstruction) -> int:
    """The bytes of the loop state elements and constants `instr`'s value is computed from
    (the leaves of its invariant expression, each counted once)."""
    seen: set[int] = set()
    total = 0
    stack = [instr]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if node.opcode in (Opcode.GET_TUPLE_ELEMENT, Opcode.CONSTANT):
            total += _bytes(node.shape)
        else:
            stack.extend(node.operands)
    return total


def _dot_operands(
    body: HloComputation, invariant: set[int], hoisted: list[HloInstruction]
) -> list[HloInstruction]:
    """Invariant cheap shape ops (left in the body by the rule above) that a dot or a
    convolution of the body reads, and that move bytes (not only reshapes and bitcasts).
    XLA leaves them for fusion, but no fusion takes them into a dot: on the CPU each is a
    copy kernel on every iteration (a bidirectional GRU's scan slices its stacked weights
    six times a step). Moved out, each copy runs once; the result is no larger than what
    it reads (the inflation rule), so the loop's memory grows by at most that."""
    out: list[HloInstruction] = []
    taken = {id(i) for i in hoisted}
    for instr in body.instructions:
        if id(instr) in invariant or instr.opcode.category is not Category.CONTRACTION:
            continue
        for op in instr.operands:
            if id(op) in taken or id(op) not in invariant or not _not_alone(op):
                continue
            if op.opcode is Opcode.CONSTANT or not _moves_bytes(op, invariant):
                continue
            taken.add(id(op))
            out.append(op)
    return out


def _moves_bytes(instr: HloInstruction, invariant: set[int]) -> bool:
    """Whether the chain of invariant shape ops ending at `instr` does more than reshape."""
    stack = [instr]
    while stack:
        node = stack.pop()
        if node.opcode in (Opcode.CONSTANT, Opcode.GET_TUPLE_ELEMENT):
            continue
        if node.opcode not in (Opcode.RESHAPE, Opcode.BITCAST):
            return True
        stack.extend(op for op in node.operands if id(op) in invariant)
    return False


def _pinned(body: HloComputation) -> bool:
    for instr in body.instructions:
        if instr.opcode is Opcode.DOMAIN:
            return True
        if instr.opcode is Opcode.CUSTOM_CALL and instr.custom_call_target in _PINNED_TARGETS:
            return True
    return False


@register_pass
class WhileLoopInvariantCodeMotion(HloPass):
    """Hoist the invariant instructions of while bodies out of their loops."""

    name = "while-loop-invariant-code-motion"

    def run(self, module: HloModule) -> bool:
        changed = False
        names = NameUniquer(module)
        self._callers: dict[HloComputation, int] | None = None  # call_counts, until a change
        for comp in _computation_post_order(module):
            for instr in list(comp.instructions):
                if instr.parent is not comp or instr.opcode is not Opcode.WHILE:
                    continue
                if self._hoist(module, instr, names):
                    changed = True
                    self._callers = None
        return changed

    def _eligible(self, module: HloModule, loop: HloInstruction) -> bool:
        if not loop.shape.is_tuple or loop.control_predecessors or loop.parent is None:
            return False
        body, cond = loop.while_body, loop.while_condition
        if body is cond or body.root is None or body.root.opcode is not Opcode.TUPLE:
            return False
        if self._callers is None:
            self._callers = call_counts(module)
        callers = self._callers
        if callers.get(body) != 1 or callers.get(cond) != 1:
            return False
        for comp in (body, cond):
            param = comp.parameter(0)
            if comp.root is param:
                return False
            if any(u.opcode is not Opcode.GET_TUPLE_ELEMENT for u in param.users):
                return False
        init = loop.operands[0]
        values = list(init.operands) if init.opcode is Opcode.TUPLE else []
        return not _at_most_one_trip(loop, values) and not _pinned(body)

    def _hoist(self, module: HloModule, loop: HloInstruction, names: NameUniquer) -> bool:
        if not self._eligible(module, loop):
            return False
        plan = _Hoist(loop, names)
        invariant = plan.invariant_reads()  # ids; hoisted ones join, so do "not alone" ones
        hoisted: list[HloInstruction] = []
        for instr in plan.body.post_order():
            if id(instr) in invariant and instr.opcode is Opcode.GET_TUPLE_ELEMENT:
                continue
            if instr.opcode is Opcode.CONSTANT:
                invariant.add(id(instr))
                continue
            if not _movable(instr):
                continue
            if not all(id(op) in invariant for op in instr.operands):
                continue
            invariant.add(id(instr))
            if not _not_alone(instr):
                hoisted.append(instr)
        hoisted += _dot_operands(plan.body, invariant, hoisted)
        # a value kept back as too large is computed before the loop where a moved value
        # reads it (and in the body where the body still does)
        hoisted = [i for i in hoisted if _bytes(i.shape) <= INFLATION * _source_bytes(i)]
        # only values the body still reads after the move enter the state
        moved = {id(i) for i in hoisted}
        memo: dict[int, bool] = {}

        def live(user: HloInstruction) -> bool:
            """Whether `user` is still computed in the body after the move."""
            if id(user) in moved:
                return False
            if id(user) not in invariant or user is plan.root:
                return True
            if id(user) not in memo:
                memo[id(user)] = False  # no cycles in a computation; guard anyway
                memo[id(user)] = user.parent is not None and (
                    user.parent.root is user or any(live(u) for u in user.users)
                )
            return memo[id(user)]

        hoisted = [i for i in hoisted if any(live(u) for u in i.users)]
        if not hoisted:
            return False
        values = [plan.copy_out(instr) for instr in hoisted]
        self._widen(plan, hoisted, values, names)
        return True

    @staticmethod
    def _widen(
        plan: _Hoist,
        hoisted: list[HloInstruction],
        values: list[HloInstruction],
        names: NameUniquer,
    ) -> None:
        """Append `values` to the loop's state; the body reads them for `hoisted`."""
        loop, body, cond, caller = plan.loop, plan.body, plan.cond, plan.caller
        old_shape = loop.shape
        n = len(old_shape.tuple_shapes)
        state = Shape.tuple([*old_shape.tuple_shapes, *(v.shape for v in values)])
        init_values = [plan.init_value(i) for i in range(n)]
        init = HloInstruction(names.fresh("tuple"), Opcode.TUPLE, state, [*init_values, *values])
        caller.add_instruction(init, before=loop)
        old_init = loop.operands[0]
        loop.replace_operand_at(0, init)
        for comp in (body, cond):
            comp.parameter(0).shape = state
        param = body.parameter(0)
        editor = Editor(body, names)
        passed = []
        for j, instr in enumerate(hoisted):
            read = HloInstruction(
                names.fresh("get-tuple-element"),
                Opcode.GET_TUPLE_ELEMENT,
                instr.shape,
                [param],
                {"index": n + j},
            )
            editor.insert_after(read, param)
            editor.replace(instr, read)
            passed.append(read)
        old_root = plan.root
        root = HloInstruction(
            names.fresh("tuple"), Opcode.TUPLE, state, [*old_root.operands, *passed]
        )
        body.add_instruction(root)
        body.root = root
        editor.remove_dead()

        # the caller reads the old elements where it read the loop
        others = [u for u in loop.users if u.opcode is not Opcode.GET_TUPLE_ELEMENT]
        loop.shape = state
        if others or caller.root is loop:
            reads = []
            for i, shape in enumerate(old_shape.tuple_shapes):
                read = HloInstruction(
                    names.fresh("get-tuple-element"),
                    Opcode.GET_TUPLE_ELEMENT,
                    shape,
                    [loop],
                    {"index": i},
                )
                Editor(caller, names).insert_after(read, loop)
                reads.append(read)
            narrow = HloInstruction(names.fresh("tuple"), Opcode.TUPLE, old_shape, reads)
            Editor(caller, names).insert_after(narrow, reads[-1])
            for user in others:
                user.replace_operand(loop, narrow)
            if caller.root is loop:
                caller.root = narrow
        Editor(caller, names).remove_dead([old_init])
