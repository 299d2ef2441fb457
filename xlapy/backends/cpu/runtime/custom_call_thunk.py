# Custom-call thunks: a C target ("Host" platform) is called on pointers into the arena with
# the nested pointer-table layout; aliased outputs (output_to_operand_aliasing) are the
# operand's bytes, copied first where buffer assignment gave them two slices. Python targets
# go through the interpreter's rule (XLA-internal targets never reach this thunk: the
# lowering gives them a library or rule thunk).
#
# FfiCallThunk: a typed-FFI handler (the LAPACK targets among them) found at compile time is
# checked and its attributes decoded once; a run calls it on logical NumPy views of the
# arena, whatever the layouts (a column-major `{1,2,0}` result is a view LAPACK works on in
# place), read-only views for the operands, the other results zeroed (the interpreter's
# contract). An aliased result first gets its operand's values: copied where buffer
# assignment gave it other bytes, rearranged in place where it shares the operand's bytes in
# another layout (a row-major operand, a column-major result); the handler then sees that
# operand as a read-only view of the result. A target registered again under the same name
# after compiling runs through the interpreter's rule. Neither thunk pickles a target (a
# program image's load looks it up again and binds a typed handler: bind_target).

from __future__ import annotations

import numpy as np

from xlapy.backends.base import replace_leaf
from xlapy.backends.cpu.runtime.rule_thunk import RuleThunk
from xlapy.backends.cpu.runtime.thunk import (
    ExecutionContext,
    Thunk,
    ValueTree,
    tree_at,
    tree_leaves,
    tree_lines,
)
from xlapy.errors import CustomCallError


class CustomCallThunk(Thunk):
    """A C target called on arena pointers (see the file comment); others use the rule."""

    kind = "custom-call"

    def __init__(self, instr, operands: list[ValueTree], result: ValueTree, aliases):
        self.instr, self.operands, self.result = instr, operands, result
        self.target_name = instr.custom_call_target
        config = instr.backend_config
        self.opaque = config.text if config is not None else ""
        self.fallback = RuleThunk(instr, operands, result, "")
        # (operand number, operand index, result tree leaf) for each aliased output
        self.aliases = aliases
        leaves = [leaf for leaf in tree_leaves(result) if leaf is not None]
        self.unaliased = [leaf for leaf in leaves if not any(leaf is a[2] for a in aliases)]

    def run(self, ctx: ExecutionContext) -> None:
        from xlapy.backends.custom_calls import call_cpu_c_target, find

        target = find(self.target_name, "Host", ctx.state.get("custom_calls"))
        if not target.api_version.is_c:
            self.fallback.run(ctx)
            return
        operands = [_physical_tree(ctx, t) for t in self.operands]
        for number, index, out in self.aliases:
            src = tree_at(self.operands[number], index)
            if not src.same_bytes(out):
                ctx.copy(src, out)
            operands[number] = replace_leaf(operands[number], index, ctx.physical(out))
        for leaf in self.unaliased:
            ctx.physical(leaf).fill(0)
        try:
            call_cpu_c_target(target, operands, _physical_tree(ctx, self.result), self.opaque)
        except CustomCallError as e:
            raise CustomCallError(
                f"{self.instr.name}: custom-call target {self.target_name!r} failed: {e}"
            ) from e

    def describe(self) -> list[str]:
        lines = [f"custom-call {self.instr.name} -> {self.target_name!r}"]
        for i, t in enumerate(self.operands):
            lines += tree_lines(f"in{i}", t)
        return lines + tree_lines("out", self.result)


def _physical_tree(ctx: ExecutionContext, tree: ValueTree):
    if isinstance(tree, tuple):
        return tuple(_physical_tree(ctx, t) for t in tree)
    if tree is None:
        return None
    return ctx.physical(tree)


class FfiCallThunk(Thunk):
    """A typed-FFI handler called on views of the arena (see the file comment)."""

    kind = "custom-call"
    IMAGE_DEFERRED = ()
    IMAGE_DETACHED = ("instr",)
    """It reads its instruction to load or run: a program image keeps a copy of it that
    shares nothing with the module (loadable.detached), so neither reads the module."""

    def __init__(self, instr, operands: list[ValueTree], result: ValueTree, aliases, target):
        self.instr, self.operands, self.result = instr, operands, result
        self.target_name = target.name
        self.bind_target(target)
        self.fallback = RuleThunk(instr, operands, result, "")
        self.ins = [leaf for t in operands for leaf in tree_leaves(t)]
        self.outs = tree_leaves(result)
        # (source slice, result slice, the source's position in self.ins) per aliased output
        self.aliased = []
        for number, index, out in aliases:
            position = sum(len(tree_leaves(t)) for t in operands[:number])
            tree = operands[number]
            for i in index:
                position += sum(len(tree_leaves(t)) for t in tree[:i])
                tree = tree[i]
            self.aliased.append((tree_at(operands[number], index), out, position))
        aliased = [a[2] for a in aliases]
        self.zeroed = [leaf for leaf in self.outs if not any(leaf is a for a in aliased)]

    def bind_target(self, target) -> None:
        """Call `target` (a typed-FFI handler registered under this call's name): its
        attributes are decoded and checked once, here."""
        from xlapy.backends.ffi import FfiHandler, prepare_handler

        handler = target.fn
        if not isinstance(handler, FfiHandler):
            raise CustomCallError(
                f"{self.instr.name}: target {target.name!r} is not a typed handler"
            )
        self.target, self.handler = target, handler
        self.attrs = prepare_handler(handler, self.instr)

    def __getstate__(self) -> dict:
        """The thunk without its target (a registry's object, in this process): a program
        image binds the target it finds where it is loaded (bind_target)."""
        return {**self.__dict__, "target": None, "handler": None, "attrs": None}

    def run(self, ctx: ExecutionContext) -> None:
        from xlapy.backends.custom_calls import calling, find
        from xlapy.backends.ffi import invoke_handler

        name, handler = self.target_name, self.handler
        if handler is None:
            raise CustomCallError(f"{self.instr.name}: target {name!r} was never bound")
        if find(name, "Host", ctx.state.get("custom_calls")).fn is not handler:
            self.fallback.run(ctx)
            return
        for leaf in self.zeroed:
            ctx.physical(leaf).fill(0)
        ins = [ctx.view(leaf) for leaf in self.ins]
        for src, out, position in self.aliased:
            same_layout = src.shape.layout_or_default == out.shape.layout_or_default
            if not (src.same_bytes(out) and same_layout):
                np.copyto(ctx.view(out), ins[position])  # NumPy buffers an overlapping source
            ins[position] = ctx.view(out)
        for view in ins:
            view.flags.writeable = False
        outs = [ctx.view(leaf) for leaf in self.outs]
        with calling(name):
            invoke_handler(handler, self.instr, self.attrs, ins, outs)

    def describe(self) -> list[str]:
        lines = [f"custom-call {self.instr.name} -> {self.target_name!r} (typed FFI handler)"]
        for i, t in enumerate(self.operands):
            lines += tree_lines(f"in{i}", t)
        return lines + tree_lines("out", self.result)
