"""The call graph: callers and call context (sequential / embedded) of each computation."""

from xlapy.ir import parse_module
from xlapy.ir.call_graph import CallGraph, Context

TEXT = """
HloModule calls

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

twice {
  x = f32[] parameter(0)
  ROOT y = f32[] add(x, x)
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
  c = f32[] constant(0)
  r = f32[] reduce(x, c), dimensions={0}, to_apply=add
  s = f32[] call(r), to_apply=twice
  b = f32[4] broadcast(s), dimensions={}
  ROOT out = (s32[], f32[4]) tuple(j, b)
}

unused {
  ROOT z = f32[] constant(1)
}

ENTRY main {
  p = f32[4] parameter(0)
  zero = s32[] constant(0)
  t = (s32[], f32[4]) tuple(zero, p)
  w = (s32[], f32[4]) while(t), condition=cond, body=body
  x = f32[4] get-tuple-element(w), index=1
  c = f32[] constant(0)
  ROOT r = f32[] reduce(x, c), dimensions={0}, to_apply=twice_reducer
}

twice_reducer {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  s = f32[] add(a, b)
  ROOT t = f32[] call(s), to_apply=twice
}
"""


def test_contexts_and_callers():
    module = parse_module(TEXT)
    graph = CallGraph(module)
    comp = module.get_computation
    assert graph.context(module.entry_computation()) is Context.SEQUENTIAL
    assert graph.context(comp("body")) is Context.SEQUENTIAL
    assert graph.context(comp("cond")) is Context.SEQUENTIAL
    assert graph.context(comp("add")) is Context.EMBEDDED
    assert graph.context(comp("twice_reducer")) is Context.EMBEDDED
    # called by a call in the loop body (sequential) and from inside a reducer (embedded)
    assert graph.context(comp("twice")) is Context.BOTH
    assert graph.is_sequential(comp("twice")) and graph.is_embedded(comp("twice"))
    assert graph.context(comp("unused")) is Context.NONE
    assert [i.name for i in graph.callers(comp("body"))] == ["w"]
    assert sorted(i.name for i in graph.callers(comp("twice"))) == ["s", "t"]
    assert [c.name for c in graph.sequential_computations()] == ["main", "cond", "body", "twice"]
    assert {c.name for c in graph.embedded_computations()} == {"add", "twice_reducer", "twice"}
    assert "unused" not in {c.name for c in graph.reachable_computations()}
    assert [c.name for c in graph.node(comp("body")).callees] == ["add", "twice"]
