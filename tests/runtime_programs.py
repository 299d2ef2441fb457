"""HLO programs shared by the runtime tests."""

from xlapy.backends.custom_calls import GLOBAL_REGISTRY

INCREMENT = """HloModule increment, input_output_alias={ {}: 0 }
ENTRY entry {
%p = f32[] parameter(0)
%c = f32[] constant(1)
ROOT %out = f32[] add(%p, %c)
}"""
"""The seed's example (seeds 000/001), with the short `{ {}: 0 }` alias form."""

AXPY = """HloModule axpy, input_output_alias={ {}: (1, {}, may-alias) }
ENTRY entry {
  a = f32[] parameter(0)
  x = f32[4] parameter(1)
  y = f32[4] parameter(2)
  ab = f32[4] broadcast(a), dimensions={}
  ax = f32[4] multiply(ab, x)
  ROOT r = f32[4] add(ax, y)
}"""
"""a*x + y written over x (parameter 1 aliased, may-alias)."""

MUST = """HloModule must, input_output_alias={ {}: (0, {}, must-alias) }
ENTRY entry {
  p = f32[4] parameter(0)
  ROOT n = f32[4] negate(p)
}"""

TWO_OUT = """HloModule two, input_output_alias={ {0}: (0, {}, may-alias) }
ENTRY entry {
  p = f32[4] parameter(0)
  q = f32[4] parameter(1)
  s = f32[4] add(p, q)
  d = f32[4] subtract(p, q)
  ROOT t = (f32[4], f32[4]) tuple(s, d)
}"""
"""Output {0} (p+q) aliases p; output {1} (p-q) is fresh."""

DONOR = """HloModule donor, buffer_donor={ (0, {}) }
ENTRY entry {
  p = f32[2,3] parameter(0)
  ROOT e = f32[2,3] exponential(p)
}"""

TUPLE_PARAM = """HloModule tup, input_output_alias={ {}: (0, {0}, may-alias) }
ENTRY entry {
  t = (f32[3], s32[2]) parameter(0)
  a = f32[3] get-tuple-element(t), index=0
  ROOT m = f32[3] multiply(a, a)
}"""
"""Parameter 0 is a tuple; the output aliases its leaf {0}; donating it donates both leaves."""

FAILS = """HloModule fails
ENTRY entry {
  p = f32[3] parameter(0)
  ROOT r = f32[3] custom-call(p), custom_call_target="xlapy_test_fails_at_run_time"
}"""
"""Compiles, but fails when it runs (its custom-call target raises; an unknown target would
be a compile-time error)."""


def _fails_at_run_time(ins, opaque):
    raise ValueError("xlapy_test_fails_at_run_time always fails")


if ("xlapy_test_fails_at_run_time", "Host") not in GLOBAL_REGISTRY:
    GLOBAL_REGISTRY.register("xlapy_test_fails_at_run_time", _fails_at_run_time)
