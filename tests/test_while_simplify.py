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


# -- constant sinking ------------------------------------------------------------------------
# A loop whose state carries constants: element 2 (a u32[4] table the body slices, passed
# through) and element 3 (a scale read after the loop too); element 4 swaps with element 2's
# twin each step, like JAX's rolled threefry rotations, and is NOT invariant.
SINK = """HloModule sink
body {
  p = (s32[], f32[6], u32[4], f32[], u32[4], u32[4]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  one = s32[] constant(1)
  next_i = s32[] add(i, one)
  x = f32[6] get-tuple-element(p), index=1
  table = u32[4] get-tuple-element(p), index=2
  pick = u32[1] slice(table), slice={[1:2]}
  amount = u32[] reshape(pick)
  af = f32[] convert(amount)
  scale = f32[] get-tuple-element(p), index=3
  s = f32[] multiply(af, scale)
  sb = f32[6] broadcast(s), dimensions={}
  nx = f32[6] add(x, sb)
  ra = u32[4] get-tuple-element(p), index=4
  rb = u32[4] get-tuple-element(p), index=5
  ROOT t = (s32[], f32[6], u32[4], f32[], u32[4], u32[4]) tuple(next_i, nx, table, scale, rb, ra)
}
cond {
  pc = (s32[], f32[6], u32[4], f32[], u32[4], u32[4]) parameter(0)
  ic = s32[] get-tuple-element(pc), index=0
  sc = f32[] get-tuple-element(pc), index=3
  n = s32[] constant(5)
  lt = pred[] compare(ic, n), direction=LT
  pos = f32[] constant(0)
  ok = pred[] compare(sc, pos), direction=GT
  ROOT both = pred[] and(lt, ok)
}
ENTRY main {
  x0 = f32[6] parameter(0)
  z = s32[] constant(0)
  tbl = u32[4] constant({13, 15, 26, 6})
  k = f32[] constant(0.5)
  r0 = u32[4] constant({1, 2, 3, 4})
  r1 = u32[4] constant({5, 6, 7, 8})
  init = (s32[], f32[6], u32[4], f32[], u32[4], u32[4]) tuple(z, x0, tbl, k, r0, r1)
  w = (s32[], f32[6], u32[4], f32[], u32[4], u32[4]) while(init), condition=cond, body=body
  out = f32[6] get-tuple-element(w), index=1
  kk = f32[] get-tuple-element(w), index=3
  rr = u32[4] get-tuple-element(w), index=4
  rf = f32[4] convert(rr)
  ks = f32[6] broadcast(kk), dimensions={}
  prod = f32[6] multiply(out, ks)
  ROOT res = (f32[6], f32[4]) tuple(prod, rf)
}
"""


def test_invariant_constants_sink_into_the_loop_and_leave_its_state():
    from xlapy.passes.while_simplify import WhileLoopConstantSinking

    module = parse_module(SINK)
    assert WhileLoopConstantSinking().run(module)
    assert WhileLoopSimplifier().run(module)
    DeadCodeElimination().run(module)
    verify(module)
    loop = _loop(module)
    # the table and the scale left the state; the swapping pair stays
    assert [s.to_text() for s in loop.shape.tuple_shapes] == ["s32[]", "f32[6]", "u32[4]", "u32[4]"]
    body_constants = [i for i in loop.while_body.instructions if i.opcode is Opcode.CONSTANT]
    assert any(c.shape.to_text() == "u32[4]" for c in body_constants)
    cond_constants = [i for i in loop.while_condition.instructions if i.opcode is Opcode.CONSTANT]
    assert any(
        c.shape.to_text() == "f32[]"
        and c.literal == parse_module(SINK).entry.instructions[3].literal
        for c in cond_constants
    )
    for seed in (1, 2):
        args = [np.random.default_rng(seed).standard_normal(6).astype(np.float32)]
        got, want = _run_tuple(module, args), _run_tuple(SINK, args)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w)


def test_the_cpu_pipeline_sinks_and_runs_the_same():
    args = [np.random.default_rng(3).standard_normal(6).astype(np.float32)]
    compiled = get_backend("cpu").compile(parse_module(SINK))
    loops = [
        i for c in compiled.module.computations for i in c.instructions if i.opcode is Opcode.WHILE
    ]
    assert all(len(w.shape.tuple_shapes) == 4 for w in loops)
    for g, w in zip(compiled.run(args), _run_tuple(SINK, args), strict=True):
        np.testing.assert_array_equal(np.asarray(g), w)


def _run_tuple(text_or_module, args):
    module = parse_module(text_or_module) if isinstance(text_or_module, str) else text_or_module
    return [np.asarray(v) for v in get_backend("interpreter").compile(module).run(args)]
