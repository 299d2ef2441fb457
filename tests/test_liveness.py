"""Live ranges over the flattened schedule, interference, and reachability."""

from __future__ import annotations

from test_dataflow import TUPLES, WHILE

from xlapy.analysis.dataflow import DataflowAnalysis
from xlapy.analysis.liveness import LivenessAnalysis
from xlapy.analysis.reachability import Reachability
from xlapy.ir.parser import parse_module


def _live(text):
    m = parse_module(text)
    df = DataflowAnalysis.run(m)
    return m, df, LivenessAnalysis.run(m, df)


def test_straight_line_ranges():
    m, df, lv = _live(TUPLES)
    e = m.entry
    at = {i.name: lv.span(i)[0] for i in e.instructions}
    rng = {v.name: lv.live_range(v) for v in df.values}
    assert rng["p"] == (0, at["a"])  # entry parameter: from the start; tuple use does not count
    assert rng["a"] == (at["a"], at["n"])  # read by negate through gte and bitcast
    assert rng["q"] == (0, lv.end_time)  # live-out through the root tuple
    assert rng["n"] == (at["n"], lv.end_time)
    assert lv.executes_before(e.get_instruction("a"), e.get_instruction("n"))
    assert {v.name for v in lv.live_at(at["n"])} >= {"a", "n", "q"}


def test_loop_body_nests_inside_the_while_span():
    m, df, lv = _live(WHILE)
    w = m.entry.get_instruction("w")
    body, cond = w.attrs["body"], w.attrs["condition"]
    ws, we = lv.span(w)
    bs, be = lv.computation_spans[body]
    cs, ce = lv.computation_spans[cond]
    assert ws < cs <= ce < bs <= be < we
    x0 = df.defining_value(m.entry.get_instruction("x0"))
    assert lv.live_range(x0) == (0, ws)  # consumed when the loop starts
    x1 = df.defining_value(body.get_instruction("x1"))
    assert lv.live_range(x1)[1] == be  # the body's result lives to the body's end
    assert lv.live_range(df.defining_value(w, (1,)))[0] == we


def test_conflicts_in_a_would_be_buffer():
    m, df, lv = _live(WHILE)
    body = m.entry.get_instruction("w").attrs["body"]
    x1 = df.defining_value(body.get_instruction("x1"))
    bp1 = df.defining_value(body.parameter(0), (1,))
    i1 = df.defining_value(body.get_instruction("i1"))
    # multiply(x, x) may overwrite x, which dies there.
    assert lv.conflicts([x1, bp1]) is None
    # i1 is written while the loop state x is still needed by the multiply.
    assert lv.conflicts([i1, bp1]) is not None
    x0 = df.defining_value(m.entry.get_instruction("x0"))
    assert "entry parameter" in lv.conflicts([x0, x1])
    assert lv.conflicts([x0, x1], writable=frozenset({x0})) is None


def test_reachability():
    m = parse_module(TUPLES)
    e = m.entry
    r = Reachability(e)
    get = e.get_instruction
    assert r.reaches(get("p"), get("n"))
    assert r.reaches(get("a"), get("a"))
    assert not r.reaches(get("n"), get("a"))
    assert r.independent(get("p"), get("q"))
    assert not r.independent(get("q"), get("r"))


IN_PLACE_RESHAPE = """HloModule m
fused {
  p = f32[2,6,4] parameter(0)
  b = f32[2,6,4] parameter(1)
  a = f32[2,6,4] add(p, b)
  r = f32[2,6,4,1] reshape(a)
  ROOT n = f32[2,6,4,1] negate(r)
}
fused_t {
  p = f32[2,6,4] parameter(0)
  t = f32[2,4,6] transpose(p), dimensions={0,2,1}
  ROOT r = f32[2,4,6,1] reshape(t)
}
ENTRY e {
  x = f32[2,6,4] parameter(0)
  y = f32[2,6,4] parameter(1)
  s = f32[2,6,4] sine(x)
  f = f32[2,6,4,1] fusion(s, y), kind=kLoop, calls=fused
  c = f32[2,6,4] cosine(x)
  g = f32[2,4,6,1] fusion(c), kind=kLoop, calls=fused_t
  ROOT t = (f32[2,6,4,1], f32[2,4,6,1]) tuple(f, g)
}
"""


def test_elementwise_fusion_through_a_reshape_may_write_over_its_operand():
    """Row-major reshapes keep each element's position: the fusion's output element k is
    computed from its operand's element k, so it may take the dying operand's bytes; a
    transpose on the way moves elements, so it may not."""
    from xlapy.analysis.liveness import may_update_in_place

    module = parse_module(IN_PLACE_RESHAPE)
    dataflow = DataflowAnalysis.run(module)
    by_name = {i.name: i for i in module.entry.instructions}

    def can(out: str, operand: str) -> bool:
        value = dataflow.value_at(by_name[out], ())
        return may_update_in_place(value, dataflow.value_at(by_name[operand], ()), dataflow)

    assert can("f", "s") and can("f", "y")
    assert not can("g", "c")
