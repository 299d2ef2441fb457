"""While-loop state simplification: merge repeated state elements, drop dead ones.

Every element of a while loop's state tuple is a buffer live across the whole loop (and, on
the CPU, a copy at each iteration's end when the body cannot write it in place). Two kinds of
elements are pure cost:
  repeated  elements j < k whose initial values are the same and whose next values are the
            same expression once element k is read as element j. By induction they hold
            equal values on every iteration, so every read of k (in the body, the condition
            and after the loop) may read j instead. JAX's fori_loop makes one: its own
            counter beside the body's copy of the loop index (XLA's WhileLoopSimplifier
            merges them the same way);
  dead      an element nobody reads: not the condition, not the body (except to pass it
            through or compute its own next value), not after the loop. It leaves the
            state; its next value's computation dies with it (unless it has side effects).

The pass rewrites a loop only when its state is a tuple built in the caller and the body
returns a tuple, every read of the state is a get-tuple-element, the body and condition are
called by this loop alone, and the loop carries no backend_config (which could name state
indices). Element positions shift down past a removed element everywhere they are read.
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

_MAX_DEPTH = 16  # how deep two next-value expressions are compared


def _gte_reads(param: HloInstruction) -> list[HloInstruction] | None:
    """The get-tuple-elements reading `param`, or None if anything else reads it."""
    reads = []
    for user in param.users:
        if user.opcode is not Opcode.GET_TUPLE_ELEMENT:
            return None
        reads.append(user)
    return reads


def _used(read: HloInstruction) -> bool:
    """Whether a get-tuple-element is read (or is its computation's root)."""
    parent = read.parent
    return bool(read.users or read.control_successors) or (
        parent is not None and parent.root is read
    )


class _Loop:
    """A while loop the pass may rewrite, and the reads of its state."""

    def __init__(self, loop: HloInstruction, callers: dict[HloComputation, int]):
        self.loop = loop
        self.ok = False
        if loop.backend_config is not None or loop.control_predecessors:
            return
        init, body, cond = loop.operands[0], loop.while_body, loop.while_condition
        if init.opcode is not Opcode.TUPLE or not loop.shape.is_tuple:
            return
        if body.root is None or body.root.opcode is not Opcode.TUPLE:
            return
        if callers.get(body) != 1 or callers.get(cond) != 1 or body is cond:
            return
        body_reads = _gte_reads(body.parameter(0))
        cond_reads = _gte_reads(cond.parameter(0))
        after = _gte_reads(loop)
        if body_reads is None or cond_reads is None or after is None:
            return
        caller = loop.parent
        if caller is None or caller.root is loop:
            return
        self.init, self.body, self.cond, self.caller = init, body, cond, caller
        self.root: HloInstruction = body.root
        self.body_reads, self.cond_reads, self.after = body_reads, cond_reads, after
        self.ok = True

    def used(self, index: int, where: str = "body cond after") -> bool:
        """Whether element `index` is read (by a used get-tuple-element) in the places named."""
        groups = {"body": self.body_reads, "cond": self.cond_reads, "after": self.after}
        return any(g.tuple_index == index and _used(g) for w in where.split() for g in groups[w])


def _same_init(a: HloInstruction, b: HloInstruction) -> bool:
    if a is b:
        return True
    return (
        a.opcode is Opcode.CONSTANT
        and b.opcode is Opcode.CONSTANT
        and a.shape == b.shape
        and a.literal is not None
        and a.literal == b.literal
    )


_NOT_SEMANTIC = frozenset({"metadata", "frontend_attributes", "statistics_viz"})


def _semantic_attrs(instr: HloInstruction) -> dict:
    return {k: v for k, v in instr.attrs.items() if k not in _NOT_SEMANTIC}


def _same_next(a, b, param, j: int, k: int, depth: int = 0) -> bool:
    """Whether `a` (next value of j) and `b` (of k) compute the same once k reads as j."""
    if a is b:
        return True
    if depth > _MAX_DEPTH or a.opcode is not b.opcode or a.shape != b.shape:
        return False
    if a.opcode is Opcode.GET_TUPLE_ELEMENT and a.operands[0] is param is b.operands[0]:
        return a.tuple_index == j and b.tuple_index == k
    if a.opcode.category is Category.CONSTANT or a.has_side_effect:
        return a.opcode is Opcode.CONSTANT and a.literal is not None and a.literal == b.literal
    if _semantic_attrs(a) != _semantic_attrs(b) or len(a.operands) != len(b.operands):
        return False
    return all(
        _same_next(x, y, param, j, k, depth + 1)
        for x, y in zip(a.operands, b.operands, strict=True)
    )


@register_pass
class WhileLoopSimplifier(HloPass):
    """Merge repeated while-loop state elements and remove dead ones."""

    name = "while-loop-simplifier"

    def run(self, module: HloModule) -> bool:
        changed = False
        names = NameUniquer(module)
        self._callers: dict[HloComputation, int] | None = None  # call_counts, until a change
        for comp in list(module.computations):
            for instr in list(comp.instructions):
                if instr.opcode is not Opcode.WHILE or instr.parent is not comp:
                    continue
                while self._simplify(module, instr, names):
                    changed = True
                    self._callers = None
        return changed

    def _simplify(self, module: HloModule, loop: HloInstruction, names: NameUniquer) -> bool:
        """One merge or one removal on `loop`; True if it changed anything."""
        if self._callers is None:
            self._callers = call_counts(module)
        info = _Loop(loop, self._callers)
        if not info.ok:
            return False
        n = len(loop.shape.tuple_shapes)
        for k in range(n):
            if self._is_dead(info, k):
                self._remove(info, k, names)
                return True
        for j in range(n):
            for k in range(j + 1, n):
                if self._repeats(info, j, k):
                    self._merge(info, j, k, names)
                    return True
        return False

    @staticmethod
    def _is_dead(info: _Loop, k: int) -> bool:
        if info.used(k, "cond after"):
            return False
        root = info.root
        for g in info.body_reads:
            if g.tuple_index != k:
                continue
            if any(u is not root for u in g.users) or g.control_successors:
                return False
            if any(root.operands[i] is g for i in range(len(root.operands)) if i != k):
                return False
        value = root.operands[k]
        return value.opcode is Opcode.GET_TUPLE_ELEMENT or not has_side_effect_deep(value)

    @staticmethod
    def _repeats(info: _Loop, j: int, k: int) -> bool:
        shapes = info.loop.shape.tuple_shapes
        if shapes[j] != shapes[k] or not shapes[j].is_array:
            return False
        if not info.used(k):
            return False  # nothing reads k: a merge would change nothing
        if not _same_init(info.init.operands[j], info.init.operands[k]):
            return False
        root = info.root
        param = info.body.parameter(0)
        return _same_next(root.operands[j], root.operands[k], param, j, k)

    @staticmethod
    def _read(comp: HloComputation, source, index: int, names, existing) -> HloInstruction:
        """A get-tuple-element of `source` at `index` in `comp` (an existing one if any)."""
        for g in existing:
            if g.tuple_index == index and g.operands[0] is source:
                return g
        gte = HloInstruction(
            names.fresh("get-tuple-element"),
            Opcode.GET_TUPLE_ELEMENT,
            source.shape.tuple_shapes[index],
            [source],
            {"index": index},
        )
        Editor(comp, names).insert_after(gte, source)
        return gte

    def _merge(self, info: _Loop, j: int, k: int, names: NameUniquer) -> None:
        """Read element j wherever element k is read (its next value included); k is then
        read by nobody and is removed next."""
        for comp, source, reads in (
            (info.body, info.body.parameter(0), info.body_reads),
            (info.cond, info.cond.parameter(0), info.cond_reads),
            (info.caller, info.loop, info.after),
        ):
            olds = [g for g in reads if g.tuple_index == k]
            if not olds:
                continue
            new = self._read(comp, source, j, names, reads)
            for old in olds:
                old.replace_all_uses_with(new)

    def _remove(self, info: _Loop, k: int, names: NameUniquer) -> None:
        """Drop element k from the loop's state, its init, its next value and its reads."""
        loop, caller = info.loop, info.caller
        for reads, comp in ((info.body_reads, info.body), (info.cond_reads, info.cond)):
            for g in reads:
                if g.tuple_index == k and not _used(g):
                    comp.remove_instruction(g)
        for g in info.after:
            if g.tuple_index == k:  # unused (the element is dead)
                caller.remove_instruction(g)
        info.after = [g for g in info.after if g.tuple_index != k]
        shapes = [s for i, s in enumerate(loop.shape.tuple_shapes) if i != k]
        state = Shape.tuple(shapes)
        init = HloInstruction(
            names.fresh("tuple"),
            Opcode.TUPLE,
            state,
            [o for i, o in enumerate(info.init.operands) if i != k],
        )
        caller.add_instruction(init, before=loop)
        loop.replace_operand_at(0, init)
        old_root = info.root
        root = HloInstruction(
            names.fresh("tuple"),
            Opcode.TUPLE,
            state,
            [o for i, o in enumerate(old_root.operands) if i != k],
        )
        info.body.add_instruction(root)
        info.body.root = root
        for comp in (info.body, info.cond):
            source = comp.parameter(0)
            source.shape = state
            for g in _gte_reads(source) or []:
                if g.tuple_index > k:
                    g.attrs["index"] = g.tuple_index - 1
            Editor(comp, names).remove_dead()
        loop.shape = state
        for g in info.after:
            if g.tuple_index > k:
                g.attrs["index"] = g.tuple_index - 1
        Editor(caller, names).remove_dead([info.init, *info.init.operands])


_SINK_LIMIT_BYTES = 1 << 16
"""A constant the loop's caller also uses elsewhere is copied into the loop only up to this
size (one the loop alone reads moves: its element then dies and the caller's copy with it)."""


@register_pass
class WhileLoopConstantSinking(HloPass):
    """XLA's WhileLoopConstantSinking: a state element that starts as a constant and that
    the body passes through unchanged holds that constant on every iteration, so its reads
    in the body and the condition become the constant itself (and its reads after the loop
    the caller's constant). Kernels then see the value: JAX's rolled threefry loop carries
    its rotation amounts this way, and with them read from memory each shift keeps an
    out-of-range test that LLVM unswitches loop by loop (2^6 copies of a kernel; minutes of
    compile time), where constant amounts fold the tests away. The element, read by nobody
    after this, leaves the state in the while-loop simplifier."""

    name = "while-loop-constant-sinking"

    def run(self, module: HloModule) -> bool:
        changed = False
        names = NameUniquer(module)
        callers = call_counts(module)
        for comp in list(module.computations):
            for instr in list(comp.instructions):
                if instr.opcode is Opcode.WHILE and instr.parent is comp:
                    changed |= self._sink(_Loop(instr, callers), names)
        return changed

    def _sink(self, info: _Loop, names: NameUniquer) -> bool:
        if not info.ok:
            return False
        changed = False
        param = info.body.parameter(0)
        for k, init in enumerate(info.init.operands):
            if init.opcode is not Opcode.CONSTANT or init.literal is None:
                continue
            passed = info.root.operands[k]
            if not (
                passed.opcode is Opcode.GET_TUPLE_ELEMENT
                and passed.operands[0] is param
                and passed.tuple_index == k
            ):
                continue
            alone = all(u is info.init for u in init.users)
            if init.shape.byte_size > _SINK_LIMIT_BYTES and not alone:
                continue
            for comp, reads in ((info.body, info.body_reads), (info.cond, info.cond_reads)):
                for read in reads:
                    if read.tuple_index != k or not _used(read):
                        continue
                    users = [u for u in read.users if not (comp is info.body and u is info.root)]
                    if not users and comp.root is not read:
                        continue
                    copy = HloInstruction(
                        names.fresh("constant"), Opcode.CONSTANT, init.shape, literal=init.literal
                    )
                    Editor(comp, names).insert_after(copy, read)
                    read.replace_all_uses_with(copy, keep=(info.root,) if comp is info.body else ())
                    if comp.root is read:
                        comp.root = copy
                    changed = True
            for read in info.after:
                if read.tuple_index == k and _used(read):
                    read.replace_all_uses_with(init)
                    if info.caller.root is read:
                        info.caller.root = init
                    changed = True
        return changed
