"""The algebraic simplifier: applies the rewrite rules of rules.py until none fires.

Each sweep visits every instruction of every reachable computation in post order and tries
the rules registered for its opcode, in table order; the first rule whose pattern matches
and whose rewrite returns a replacement of the same shape (layouts included) wins. The
replaced instruction and whatever only it kept alive are removed at once. Sweeps repeat
until one changes nothing (a fixed point), so rules compose: reshape(reshape(reshape(x)))
merges in two sweeps.
"""

from __future__ import annotations

from xlapy.ir.computation import HloComputation
from xlapy.ir.module import HloModule
from xlapy.ir.names import NameUniquer
from xlapy.passes.hlo_edit import Editor, reachable_computations, same_shape
from xlapy.passes.pass_base import HloPass, register_pass
from xlapy.passes.rules import RULES, Match, Rule, SimplifierOptions, match, rules_by_opcode


@register_pass
class AlgebraicSimplifier(HloPass):
    """Rewrites by the identities of rules.RULES (or `rules`) to a fixed point."""

    name = "algsimp"

    def __init__(
        self,
        options: SimplifierOptions | None = None,
        rules: list[Rule] | None = None,
        max_sweeps: int = 50,
    ):
        self.options = options or SimplifierOptions()
        self.table = rules_by_opcode(RULES if rules is None else rules)
        self.max_sweeps = max_sweeps
        self.fired: dict[str, int] = {}  # identity text -> times applied (last run)

    def run(self, module: HloModule) -> bool:
        self.fired = {}
        namer = NameUniquer(module)
        changed = False
        # Settled (a second run would find nothing) when every computation's last sweep
        # found nothing and none changed after a computation calling it had its sweeps:
        # rules read other computations only through calls (a reduce's reducer).
        self.settled = True
        visited: list[HloComputation] = []
        for comp in reachable_computations(module):
            editor = Editor(comp, namer)
            comp_changed = False
            for _ in range(self.max_sweeps):
                if not self._sweep(editor):
                    break
                changed = comp_changed = True
            else:
                self.settled = False  # still changing at the sweep limit
            if comp_changed and comp is not module.entry and _calls_any(visited, comp):
                self.settled = False
            visited.append(comp)
        return changed

    def _sweep(self, editor: Editor) -> bool:
        changed = False
        memo: dict = {}
        for instr in editor.comp.post_order():
            if instr.parent is not editor.comp:
                continue
            for identity, pattern, rewrite in self.table.get(instr.opcode, ()):
                bindings: dict = {}
                if not match(pattern, instr, bindings, self.options, memo):
                    continue
                m = Match(instr, bindings, self.options, editor)
                new = rewrite(m)
                if new is None or new is instr or not same_shape(new.shape, instr.shape):
                    editor.remove_dead(m.created)
                    continue
                editor.replace(instr, new)
                editor.remove_dead([instr])
                self.fired[identity] = self.fired.get(identity, 0) + 1
                changed = True
                break
        return changed


def _calls_any(callers: list[HloComputation], comp: HloComputation) -> bool:
    """Whether an instruction of one of `callers` calls `comp`."""
    return any(c is comp for caller in callers for c in caller.called_computations())
