"""The while-loop simplifier: repeated state elements merge, dead ones leave the state; the
programs compute what they computed before (the interpreter on the module as written)."""

from __future__ import annotations

import numpy as np
import pytest

from xlapy.backends import get_backend
from xlapy.ir.opcodes import Opcode
from xlapy.ir.parser import parse_module
from xlapy.ir.verifier import verify
from xlapy.passes.dce import DeadCodeElimination
from xlapy.passes.while_simplify import WhileLoopSimplifier

# JAX's fori_loop(0, 16, body, x) where body reads the index: the loop's own counter (0) and
# the body's copy of the index (1) start at 0 and both add 1 each step.
FORI = """HloModule fori
body {
  p = (s32[], s32[], f32[8,4], f32[4]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  one = s32[] constant(1)
  next_i = s32[] add(i, one)
  j = s32[] get-tuple-element(p), index=1
  one.b = s32[] constant(1)
  next_j = s32[] add(j, one.b)
  x = f32[8,4] get-tuple-element(p), index=2
  v = f32[4] get-tuple-element(p), index=3
  jf = f32[] convert(j)
  scaled = f32[4] broadcast(jf), dimensions={}
  row = f32[4] multiply(v, scaled)
  row2 = f32[1,4] reshape(row)
  eight = s32[] constant(8)
  r = s32[] remainder(j, eight)
  zero = s32[] constant(0)
  upd = f32[8,4] dynamic-update-slice(x, row2, r, zero)
  ROOT t = (s32[], s32[], f32[8,4], f32[4]) tuple(next_i, next_j, upd, v)
}
cond {
  pc = (s32[], s32[], f32[8,4], f32[4]) parameter(0)
  ic = s32[] get-tuple-element(pc), index=0
  n = s32[] constant(16)
  ROOT lt = pred[] compare(ic, n), direction=LT
}
ENTRY main {
  x0 = f32[8,4] parameter(0)
  v0 = f32[4] parameter(1)
  z = s32[] constant(0)
  init = (s32[], s32[], f32[8,4], f32[4]) tuple(z, z, x0, v0)
  w = (s32[], s32[], f32[8,4], f32[4]) while(init), condition=cond, body=body
  ROOT out = f32[8,4] get-tuple-element(w), index=2
}
"""


def _args(module, seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(p.shape.dims).astype(np.float32) for p in module.entry.parameters]


def _run(text_or_module, args):
    module = parse_module(text_or_module) if isinstance(text_or_module, str) else text_or_module
    return np.asarray(get_backend("interpreter").compile(module).run(args))


def _simplified(text: str):
    module = parse_module(text)
    changed = WhileLoopSimplifier().run(module)
    DeadCodeElimination().run(module)
    verify(module)
    return module, changed


def _loop(module):
    return next(i for i in module.entry.instructions if i.opcode is Opcode.WHILE)


def test_a_repeated_counter_merges_and_the_copy_leaves_the_state():
    module, changed = _simplified(FORI)
    assert changed
    loop = _loop(module)
    assert len(loop.shape.tuple_shapes) == 3  # (counter, x, v): the index copy is gone
    body = loop.while_body
    assert body.parameter(0).shape == loop.shape == loop.while_condition.parameter(0).shape
    assert [g.tuple_index for g in body.parameter(0).users] and all(
        g.tuple_index < 3 for g in body.parameter(0).users
    )
    for seed in (1, 2):
        args = _args(module, seed)
        np.testing.assert_array_equal(_run(module, args), _run(FORI, args))


def test_the_cpu_plan_of_the_simplified_loop_is_smaller_and_runs_the_same():
    args = _args(parse_module(FORI), 3)
    simplified = get_backend("cpu").compile(parse_module(FORI))
    assert len(_loop(simplified.module).shape.tuple_shapes) == 3
    np.testing.assert_array_equal(np.asarray(simplified.run(args)), _run(FORI, args))


def test_a_dead_pass_through_element_is_removed():
    """A fifth element the body only passes through and nobody reads after the loop."""
    text = FORI.replace(
        "(s32[], s32[], f32[8,4], f32[4])", "(s32[], s32[], f32[8,4], f32[4], f32[2])"
    )
    text = text.replace("tuple(next_i, next_j, upd, v)", "tuple(next_i, next_j, upd, v, junk)")
    text = text.replace("  ROOT t =", "  junk = f32[2] get-tuple-element(p), index=4\n  ROOT t =")
    text = text.replace(
        "  z = s32[] constant(0)\n", "  z = s32[] constant(0)\n  k0 = f32[2] parameter(2)\n"
    )
    text = text.replace("tuple(z, z, x0, v0)", "tuple(z, z, x0, v0, k0)")
    module, changed = _simplified(text)
    assert changed
    loop = _loop(module)
    assert [s.to_text() for s in loop.shape.tuple_shapes] == ["s32[]", "f32[8,4]", "f32[4]"]
    args = _args(parse_module(text), 4)
    np.testing.assert_array_equal(_run(module, args), _run(text, args))


@pytest.mark.parametrize(
    "why,old,new",
    [
        ("the copies start apart", "tuple(z, z, x0, v0)", "tuple(z, one.e, x0, v0)"),
        ("the copies step apart", "next_j = s32[] add(j, one.b)", "next_j = s32[] add(j, j)"),
    ],
)
def test_elements_that_may_differ_stay_apart(why, old, new):
    text = FORI.replace(old, new)
    text = text.replace(
        "  z = s32[] constant(0)\n", "  z = s32[] constant(0)\n  one.e = s32[] constant(1)\n"
    )
    module, _ = _simplified(text)
    assert len(_loop(module).shape.tuple_shapes) == 4, why
    args = _args(module, 5)
    np.testing.assert_array_equal(_run(module, args), _run(text, args))


def test_an_element_read_after_the_loop_stays():
    text = FORI.replace(
        "  ROOT out = f32[8,4] get-tuple-element(w), index=2",
        "  out = f32[8,4] get-tuple-element(w), index=2\n"
        "  jj = s32[] get-tuple-element(w), index=1\n"
        "  ROOT both = (f32[8,4], s32[]) tuple(out, jj)",
    )
    module, changed = _simplified(text)
    # the merge reads the counter after the loop in place of the copy; the copy then goes
    assert changed and len(_loop(module).shape.tuple_shapes) == 3
    args = _args(module, 6)
    got, want = (
        get_backend("interpreter").compile(m).run(args) for m in (module, parse_module(text))
    )
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_a_loop_with_a_shared_body_or_a_backend_config_is_left_alone():
    shared = FORI.replace(
        "  ROOT out = f32[8,4] get-tuple-element(w), index=2",
        "  w2 = (s32[], s32[], f32[8,4], f32[4]) while(init), condition=cond, body=body\n"
        "  a = f32[8,4] get-tuple-element(w), index=2\n"
        "  b = f32[8,4] get-tuple-element(w2), index=2\n"
        "  ROOT out = f32[8,4] add(a, b)",
    )
    _, changed = _simplified(shared)
    assert not changed
    configured = FORI.replace(
        "condition=cond, body=body",
        'condition=cond, body=body, backend_config={"known_trip_count":{"n":"16"}}',
    )
    _, changed = _simplified(configured)
    assert not changed
