"""Dataflow analysis on hand-written HLO: which instructions define values and which forward
them, value uses and positions, in-place pairs."""

from __future__ import annotations

import pytest

from xlapy.analysis.dataflow import DataflowAnalysis, DataflowError
from xlapy.ir.parser import parse_module

TUPLES = """
HloModule tuples
ENTRY e {
  p = f32[4] parameter(0)
  q = f32[4] parameter(1)
  a = f32[4] add(p, q)
  t = (f32[4], f32[4]) tuple(a, p)
  g0 = f32[4] get-tuple-element(t), index=0
  b = f32[2,2] bitcast(g0)
  n = f32[2,2] negate(b)
  ROOT r = (f32[2,2], f32[4]) tuple(n, q)
}
"""

WHILE = """
HloModule loop
cond {
  cp = (s32[], f32[4]) parameter(0)
  ci = s32[] get-tuple-element(cp), index=0
  ten = s32[] constant(10)
  ROOT lt = pred[] compare(ci, ten), direction=LT
}
body {
  bp = (s32[], f32[4]) parameter(0)
  i = s32[] get-tuple-element(bp), index=0
  x = f32[4] get-tuple-element(bp), index=1
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  x1 = f32[4] multiply(x, x)
  ROOT out = (s32[], f32[4]) tuple(i1, x1)
}
ENTRY e {
  x0 = f32[4] parameter(0)
  zero = s32[] constant(0)
  init = (s32[], f32[4]) tuple(zero, x0)
  w = (s32[], f32[4]) while(init), condition=cond, body=body
  ROOT res = f32[4] get-tuple-element(w), index=1
}
"""

CONTROL = """
HloModule control
fused {
  fp = f32[8] parameter(0)
  fu = f32[2] parameter(1)
  fi = s32[] parameter(2)
  ROOT d = f32[8] dynamic-update-slice(fp, fu, fi)
}
callee {
  a = f32[8] parameter(0)
  ROOT n = f32[8] negate(a)
}
br0 {
  b0 = f32[8] parameter(0)
  ROOT e0 = f32[8] exponential(b0)
}
br1 {
  b1 = f32[8] parameter(0)
  ROOT c1 = f32[8] copy(b1)
}
ENTRY e {
  x = f32[8] parameter(0)
  u = f32[2] parameter(1)
  i = s32[] parameter(2)
  dus = f32[8] dynamic-update-slice(x, u, i)
  fus = f32[8] fusion(dus, u, i), kind=kLoop, calls=fused
  c = f32[8] call(fus), to_apply=callee
  ROOT k = f32[8] conditional(i, c, c), branch_computations={br0, br1}
}
"""


def test_tuple_defines_only_its_table_and_forwards_elements():
    m = parse_module(TUPLES)
    df = DataflowAnalysis.run(m)
    e = m.entry
    t, a, p, g0, b = (e.get_instruction(n) for n in ("t", "a", "p", "g0", "b"))
    assert df.defining_value(t, ()).instruction is t
    assert df.value_at(t, (0,)) is df.defining_value(a)
    assert df.value_at(t, (1,)) is df.defining_value(p)
    assert df.value_at(g0) is df.defining_value(a)
    assert df.value_at(b) is df.defining_value(a)
    assert not df.defines(b) and not df.defines(g0)
    with pytest.raises(DataflowError, match="does not define"):
        df.defining_value(g0)
    assert len(df.value_set(t, (0,))) == 1


def test_positions_and_uses_follow_forwarding():
    m = parse_module(TUPLES)
    df = DataflowAnalysis.run(m)
    e = m.entry
    a = df.defining_value(e.get_instruction("a"))
    holders = {(i.name, idx) for i, idx in df.positions(a)}
    assert holders == {("a", ()), ("t", (0,)), ("g0", ()), ("b", ())}
    # The negate reads `a` through get-tuple-element and bitcast.
    assert [u.instruction.name for u in df.uses(a)] == ["n"]
    q = df.defining_value(e.get_instruction("q"))
    # A tuple is not a use: the root tuple only forwards q (liveness sees it as live-out).
    assert {u.instruction.name for u in df.uses(q)} == {"a"}
    assert (m.entry.root, (1,)) in df.positions(q)
    # Values defined: p, q, a, t{}, n, r{}.
    assert len(df.values) == 6


def test_while_defines_its_results_and_parameters_define_theirs():
    m = parse_module(WHILE)
    df = DataflowAnalysis.run(m)
    w = m.entry.get_instruction("w")
    body, cond = w.attrs["body"], w.attrs["condition"]
    for index in ((), (0,), (1,)):
        assert df.defining_value(w, index).is_phi
        assert df.defining_value(body.parameter(0), index).defined_by_parameter
        assert df.defining_value(cond.parameter(0), index).defined_by_parameter
    assert df.value_at(m.entry.root) is df.defining_value(w, (1,))
    assert df.value_at(body.root, (1,)) is df.defining_value(body.get_instruction("x1"))
    assert set(df.computations) == {m.entry, body, cond}
    assert df.callers[body] is w and df.callers[cond] is w


def test_call_forwards_callee_root_and_in_place_pairs():
    m = parse_module(CONTROL)
    df = DataflowAnalysis.run(m)
    e = m.entry
    c = e.get_instruction("c")
    callee = c.attrs["to_apply"]
    assert df.value_at(c) is df.defining_value(callee.root)
    pairs = {(p.output.name, p.operand.name) for p in df.in_place_pairs}
    assert pairs == {("dus", "x"), ("fus", "dus")}
    fused = e.get_instruction("fus").attrs["calls"]
    assert fused in df.thread_local
    with pytest.raises(DataflowError, match="not analysed"):
        df.value_at(fused.root)


def test_conditional_defines_results_and_branch_parameters():
    m = parse_module(CONTROL)
    df = DataflowAnalysis.run(m)
    k = m.entry.root
    assert df.defining_value(k).is_phi
    for branch in k.attrs["branch_computations"]:
        assert df.defining_value(branch.parameter(0)).defined_by_parameter


def test_two_call_sites_need_flattening():
    text = CONTROL.replace(
        "ROOT k = f32[8] conditional(i, c, c), branch_computations={br0, br1}",
        "ROOT k = f32[8] call(c), to_apply=callee",
    )
    m = parse_module(text)
    with pytest.raises(DataflowError, match="flatten-call-graph"):
        DataflowAnalysis.run(m)
