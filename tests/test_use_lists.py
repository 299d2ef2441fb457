"""Use-lists: every instruction's users and control successors stay equal to a
recomputation from the operands, whatever sequence of edits is made (property test), and
through the whole CPU pipeline."""

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xlapy.ir import HloInstruction, Opcode, parse_module
from xlapy.passes.hlo_edit import Editor
from xlapy.passes.pipelines import default_cpu_pipeline

TEXT = """
HloModule uses

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

cond {
  t = (s32[], f32[4]) parameter(0)
  i = s32[] get-tuple-element(t), index=0
  n = s32[] constant(3)
  ROOT lt = pred[] compare(i, n), direction=LT
}

body {
  t = (s32[], f32[4]) parameter(0)
  i = s32[] get-tuple-element(t), index=0
  one = s32[] constant(1)
  j = s32[] add(i, one)
  x = f32[4] get-tuple-element(t), index=1
  y = f32[4] multiply(x, x)
  ROOT r = (s32[], f32[4]) tuple(j, y)
}

ENTRY main {
  p0 = f32[4] parameter(0)
  p1 = f32[4] parameter(1)
  a = f32[4] add(p0, p1)
  m = f32[4] multiply(a, a)
  e = f32[4] exponential(m), control-predecessors={a}
  zero = s32[] constant(0)
  t = (s32[], f32[4]) tuple(zero, e)
  w = (s32[], f32[4]) while(t), condition=cond, body=body
  x = f32[4] get-tuple-element(w), index=1
  c = f32[] constant(0)
  r = f32[] reduce(x, c), dimensions={0}, to_apply=add
  ROOT out = (f32[4], f32[]) tuple(m, r)
}
"""

EDITS = (
    "add",
    "remove",
    "replace_operand",
    "replace_operand_at",
    "set_operands",
    "replace_all_uses",
    "editor_replace",
    "add_control",
    "remove_control",
    "set_root",
)


def _check(module):
    for comp in module.computations:
        assert comp.use_list_problems() == []


def test_parsed_module_has_current_use_lists():
    module = parse_module(TEXT)
    _check(module)
    entry = module.entry_computation()
    a = entry.get_instruction("a")
    assert [u.name for u in a.users] == ["m"]
    assert [s.name for s in a.control_successors] == ["e"]
    m = entry.get_instruction("m")
    assert m.users == [entry.get_instruction("e"), entry.get_instruction("out")]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(EDITS), st.integers(0, 999), st.integers(0, 999))))
def test_use_lists_equal_recomputation_after_random_edits(edits):
    module = parse_module(TEXT)
    comp = module.entry_computation()
    editor = Editor(comp)
    counter = 0
    for kind, x, y in edits:
        instrs = comp.instructions
        pick = instrs[x % len(instrs)]
        other = instrs[y % len(instrs)]
        if kind == "add":
            counter += 1
            operands = [pick, other, pick][: 1 + y % 3]
            new = HloInstruction(f"new{counter}", Opcode.ADD, pick.shape, operands)
            if x % 2:
                new.control_predecessors.append(other)
            comp.add_instruction(new, before=other if y % 2 else None)
        elif kind == "remove":
            if editor.is_dead(pick):
                comp.remove_instruction(pick)
        elif kind == "replace_operand" and pick.operands:
            pick.replace_operand(pick.operands[y % len(pick.operands)], other)
        elif kind == "replace_operand_at" and pick.operands:
            pick.replace_operand_at(y % len(pick.operands), other)
        elif kind == "set_operands":
            pick.set_operands([other, *pick.operands[1:], other][: len(pick.operands) + 1])
        elif kind == "replace_all_uses":
            comp.replace_all_uses(pick, other)
        elif kind == "editor_replace":
            editor.replace(pick, other, keep=pick.users[:1])
        elif kind == "add_control" and other is not pick:
            pick.add_control_predecessor(other)
        elif kind == "remove_control" and pick.control_predecessors:
            pick.remove_control_predecessor(pick.control_predecessors[0])
        elif kind == "set_root":
            comp.set_root(pick)
        _check(module)


def test_detached_instruction_is_in_no_use_list():
    module = parse_module(TEXT)
    comp = module.entry_computation()
    p0 = comp.get_instruction("p0")
    loose = HloInstruction("loose", Opcode.NEGATE, p0.shape, [p0])
    assert loose not in p0.users
    comp.add_instruction(loose)
    assert loose in p0.users
    loose.set_operands([comp.get_instruction("p1")])
    assert loose not in p0.users
    comp.remove_instruction(loose)
    assert loose not in comp.get_instruction("p1").users
    _check(module)


TESTS = Path(__file__).parent
HLO_PROGRAMS = sorted(
    p.relative_to(TESTS.parent).as_posix()
    for p in [*TESTS.rglob("*.hlo"), TESTS.parent / "examples" / "mlp_train_step.hlo"]
)


def _program_text(name: str) -> str:
    if name.endswith(".hlo"):
        return (TESTS.parent / name).read_text()
    from jax_programs import PROGRAMS, hlo_texts

    return hlo_texts(PROGRAMS[name]).lowered


def _every_program() -> list[str]:
    from jax_programs import PROGRAMS

    return [*PROGRAMS, *HLO_PROGRAMS]


@pytest.mark.parametrize("name", _every_program())
def test_use_lists_current_after_every_pass_of_the_cpu_pipeline(name):
    """Every test program (the JAX programs, every .hlo under tests/, the example): the
    default CPU pipeline with verification checks every computation's use-lists after each
    pass that changed the module, fusion and copy insertion included."""
    module = parse_module(_program_text(name))
    pipeline = default_cpu_pipeline(verify=True)
    assert pipeline.verify_between
    pipeline.run(module)  # raises VerifierError("after pass X ... stale use-lists") if not
    _check(module)
