# Custom-call thunks: a C target ("Host" platform) is called on pointers into the arena with
# the nested pointer-table layout; aliased outputs (output_to_operand_aliasing) are the
# operand's bytes, copied first where buffer assignment gave them two slices. Python and
# typed-FFI targets go through the interpreter's rule (XLA-internal targets never reach this
# thunk: the lowering gives them a library or rule thunk).

from __future__ import annotations

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
        self.target_name = instr.attrs.get("custom_call_target")
        config = instr.attrs.get("backend_config")
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
