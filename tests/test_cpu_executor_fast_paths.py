"""The CPU executor's fast paths against the interpreter: while loops whose condition is a
compare of two integer scalars evaluated on the host (counter types, directions, constants on
either side, zero trips, unsigned values past the signed range), conditions that must keep
their kernel (floats, fused, side effects), bound loop bodies holding nested loops,
conditionals, split and scratch kernels, kernels of every argument count, and byte copies."""

from __future__ import annotations

import numpy as np
import pytest

from xlapy.backends.cpu import CpuBackend
from xlapy.backends.cpu.backend import CpuProgram
from xlapy.backends.cpu.runtime.control_flow_thunk import WhileThunk
from xlapy.backends.cpu.runtime.thunk import ThunkSequence
from xlapy.backends.custom_calls import CustomCallRegistry
from xlapy.backends.interpreter import evaluate
from xlapy.errors import XlapyError
from xlapy.ir.parser import parse_module

pytestmark = pytest.mark.usefixtures("kernel_cache")

RNG = np.random.default_rng(11)


def compile_text(text: str, **options) -> CpuProgram:
    """The program of `text`, its while loops kept in Python (the paths this file tests;
    test_cpu_native_loops.py tests native loops)."""
    options.setdefault("native_loops", False)
    return CpuBackend().compile(parse_module(text), options)


def leaves(v) -> list:
    return [x for e in v for x in leaves(e)] if isinstance(v, tuple) else [np.asarray(v)]


def check(program: CpuProgram, text: str, args) -> None:
    got = program.run(args)
    want = evaluate(parse_module(text), args)
    for g, w in zip(leaves(got), leaves(want), strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        if g.dtype.kind == "f":  # native sine and exp may differ from NumPy's in the last bit
            np.testing.assert_allclose(g, w, rtol=2e-6, atol=1e-6)
        else:
            np.testing.assert_array_equal(g, w)


def while_thunks(seq: ThunkSequence) -> list[WhileThunk]:
    found = []
    for t in seq.thunks:
        if isinstance(t, WhileThunk):
            found += [t, *while_thunks(t.condition), *while_thunks(t.body)]
        for nested in getattr(t, "branches", ()):
            found += while_thunks(nested)
    return found


def host_compared(program: CpuProgram) -> list[bool]:
    return [w.host_compare is not None for w in while_thunks(program.compiled.entry)]


COUNTED = """HloModule counted
cond {
  s = (T[], f32[8], T[]) parameter(0)
  i = T[] get-tuple-element(s), index=0
  n = T[] get-tuple-element(s), index=2
  ROOT c = pred[] compare(LHS, RHS), direction=DIR
}
body {
  s = (T[], f32[8], T[]) parameter(0)
  i = T[] get-tuple-element(s), index=0
  x = f32[8] get-tuple-element(s), index=1
  n = T[] get-tuple-element(s), index=2
  step = T[] constant(STEP)
  i1 = T[] STEPOP(i, step)
  y = f32[8] sine(x)
  x1 = f32[8] add(y, x)
  ROOT t = (T[], f32[8], T[]) tuple(i1, x1, n)
}
ENTRY e {
  i0 = T[] parameter(0)
  x = f32[8] parameter(1)
  n = T[] parameter(2)
  init = (T[], f32[8], T[]) tuple(i0, x, n)
  w = (T[], f32[8], T[]) while(init), condition=cond, body=body
  i = T[] get-tuple-element(w), index=0
  r = f32[8] get-tuple-element(w), index=1
  ROOT out = (T[], f32[8]) tuple(i, r)
}"""

# (counter type, lhs, rhs, direction, step op, first, limit): "K" is a constant operand 6
LOOPS = [
    ("s32", "i", "n", "LT", "add", 0, 5),
    ("s32", "i", "n", "LT", "add", 9, 5),  # zero trips
    ("s32", "i", "K", "LT", "add", -3, 0),
    ("s32", "K", "i", "GT", "add", 2, 0),  # constant on the left
    ("s32", "i", "n", "GT", "subtract", 4, -2),
    ("s64", "i", "n", "LE", "add", -(2**40), -(2**40) + 3),
    ("s64", "i", "n", "NE", "add", 2**40, 2**40 + 4),
    ("u32", "i", "n", "LT", "add", 2**31 - 2, 2**31 + 2),  # read signed, this runs 0 trips
    ("u32", "n", "i", "GE", "subtract", 7, 3),
    ("u64", "i", "n", "LT", "add", 2**63 - 1, 2**63 + 1),
    ("s8", "i", "n", "LT", "add", -128, -120),
    ("u8", "i", "n", "NE", "add", 250, 255),
    ("s16", "i", "n", "EQ", "add", 3, 3),  # one trip
]


def counted(t: str, lhs: str, rhs: str, direction: str, step_op: str) -> str:
    text = COUNTED.replace("LHS", lhs).replace("RHS", rhs).replace("DIR", direction)
    text = text.replace("STEPOP", step_op).replace("STEP", "1").replace("T[]", f"{t}[]")
    if "K" in (lhs, rhs):
        text = text.replace("  ROOT c", f"  K = {t}[] constant(6)\n  ROOT c")
    return text


@pytest.mark.parametrize(("t", "lhs", "rhs", "direction", "step_op", "first", "limit"), LOOPS)
def test_counted_loop_condition_on_host(t, lhs, rhs, direction, step_op, first, limit):
    text = counted(t, lhs, rhs, direction, step_op)
    program = compile_text(text)
    assert host_compared(program) == [True]
    assert "condition compared on the host" in program.thunk_listing()
    dtype = np.dtype(t.replace("s", "int").replace("u", "uint"))
    args = [np.array(first, dtype), RNG.standard_normal(8).astype(np.float32)]
    check(program, text, [*args, np.array(limit, dtype)])


def test_float_condition_keeps_its_kernel():
    text = counted("f32", "i", "n", "LT", "add")
    program = compile_text(text)
    assert host_compared(program) == [False]
    args = [np.float32(0.5), RNG.standard_normal(8).astype(np.float32), np.float32(4.0)]
    check(program, text, [np.asarray(a) for a in args])


FUSED_CONDITION = """HloModule fused_cond
cond {
  s = (s32[], f32[8]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  x = f32[8] get-tuple-element(s), index=1
  lim = s32[] constant(6)
  small = pred[] compare(i, lim), direction=LT
  zero = f32[] constant(0)
  add = f32[] reduce(x, zero), dimensions={0}, to_apply=sum
  big = f32[] constant(1e6)
  bounded = pred[] compare(add, big), direction=LT
  ROOT both = pred[] and(small, bounded)
}
sum {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}
body {
  s = (s32[], f32[8]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  x = f32[8] get-tuple-element(s), index=1
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  x1 = f32[8] multiply(x, x)
  ROOT t = (s32[], f32[8]) tuple(i1, x1)
}
ENTRY e {
  x = f32[8] parameter(0)
  zero = s32[] constant(0)
  init = (s32[], f32[8]) tuple(zero, x)
  w = (s32[], f32[8]) while(init), condition=cond, body=body
  ROOT r = f32[8] get-tuple-element(w), index=1
}"""


@pytest.mark.parametrize("optimize", [True, False])
def test_compound_condition_keeps_its_kernels(optimize):
    program = compile_text(FUSED_CONDITION, optimize=optimize)
    assert host_compared(program) == [False]
    x = (RNG.standard_normal(8) * 3).astype(np.float32)
    check(program, FUSED_CONDITION, [x])


SIDE_EFFECT_CONDITION = """HloModule side_effect_cond
cond {
  s = (s32[], f32[8]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  seen = s32[] custom-call(i), custom_call_target="count", custom_call_has_side_effect=true
  lim = s32[] constant(4)
  ROOT lt = pred[] compare(seen, lim), direction=LT
}
body {
  s = (s32[], f32[8]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  x = f32[8] get-tuple-element(s), index=1
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  x1 = f32[8] cosine(x)
  ROOT t = (s32[], f32[8]) tuple(i1, x1)
}
ENTRY e {
  x = f32[8] parameter(0)
  zero = s32[] constant(0)
  init = (s32[], f32[8]) tuple(zero, x)
  w = (s32[], f32[8]) while(init), condition=cond, body=body
  ROOT r = f32[8] get-tuple-element(w), index=1
}"""


def test_condition_with_side_effects_runs_every_time():
    calls = []
    registry = CustomCallRegistry()
    registry.register("count", lambda ins, opaque: calls.append(int(ins[0])) or ins[0])
    program = CpuBackend().compile(parse_module(SIDE_EFFECT_CONDITION), {"custom_calls": registry})
    assert host_compared(program) == [False]
    x = RNG.standard_normal(8).astype(np.float32)
    want = np.cos(np.cos(np.cos(np.cos(x))))
    np.testing.assert_allclose(program.run([x]), want, rtol=2e-6, atol=1e-6)
    assert calls == [0, 1, 2, 3, 4]


def test_host_condition_respects_max_while_iterations():
    text = counted("s32", "i", "n", "LT", "add")
    program = compile_text(text, max_while_iterations=3)
    assert host_compared(program) == [True]
    x = RNG.standard_normal(8).astype(np.float32)
    program.run([np.array(0, np.int32), x, np.array(3, np.int32)])
    with pytest.raises(XlapyError, match="ran past 3 iterations"):
        program.run([np.array(0, np.int32), x, np.array(4, np.int32)])


NESTED = """HloModule nested
inner_cond {
  s = (s32[], f32[16]) parameter(0)
  j = s32[] get-tuple-element(s), index=0
  three = s32[] constant(3)
  ROOT lt = pred[] compare(j, three), direction=LT
}
inner_body {
  s = (s32[], f32[16]) parameter(0)
  j = s32[] get-tuple-element(s), index=0
  x = f32[16] get-tuple-element(s), index=1
  one = s32[] constant(1)
  j1 = s32[] add(j, one)
  half = f32[] constant(0.5)
  h = f32[16] broadcast(half), dimensions={}
  x1 = f32[16] multiply(x, h)
  x2 = f32[16] sine(x1)
  ROOT t = (s32[], f32[16]) tuple(j1, x2)
}
b0 {
  p = f32[16] parameter(0)
  ROOT r = f32[16] exponential(p)
}
b1 {
  p = f32[16] parameter(0)
  ROOT r = f32[16] negate(p)
}
outer_cond {
  s = (s32[], f32[16], f32[300,300]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  four = s32[] constant(4)
  ROOT lt = pred[] compare(four, i), direction=GT
}
outer_body {
  s = (s32[], f32[16], f32[300,300]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  x = f32[16] get-tuple-element(s), index=1
  big = f32[300,300] get-tuple-element(s), index=2
  zero = s32[] constant(0)
  init = (s32[], f32[16]) tuple(zero, x)
  w = (s32[], f32[16]) while(init), condition=inner_cond, body=inner_body
  y = f32[16] get-tuple-element(w), index=1
  two = s32[] constant(2)
  odd = s32[] remainder(i, two)
  c0 = s32[] constant(0)
  even = pred[] compare(odd, c0), direction=EQ
  z = f32[16] conditional(even, y, y), true_computation=b0, false_computation=b1
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  big1 = f32[300,300] sine(big)
  big2 = f32[300,300] transpose(big1), dimensions={1,0}
  ROOT t = (s32[], f32[16], f32[300,300]) tuple(i1, z, big2)
}
ENTRY e {
  x = f32[16] parameter(0)
  big = f32[300,300] parameter(1)
  zero = s32[] constant(0)
  init = (s32[], f32[16], f32[300,300]) tuple(zero, x, big)
  w = (s32[], f32[16], f32[300,300]) while(init), condition=outer_cond, body=outer_body
  r = f32[16] get-tuple-element(w), index=1
  b = f32[300,300] get-tuple-element(w), index=2
  ROOT out = (f32[16], f32[300,300]) tuple(r, b)
}"""


@pytest.mark.parametrize("optimize", [True, False])
def test_nested_loops_conditionals_and_split_kernels_in_a_body(optimize):
    program = compile_text(NESTED, optimize=optimize)
    assert host_compared(program) == [True, True]
    args = [RNG.standard_normal(16).astype(np.float32), RNG.standard_normal((300, 300))]
    args[1] = args[1].astype(np.float32)
    for _ in range(3):  # the split choice tries both ways
        check(program, NESTED, args)


ARITIES = """HloModule arities
ENTRY e {
  a = f32[5,7] parameter(0)
  b = f32[5,7] parameter(1)
  c = f32[5,7] parameter(2)
  d = f32[5,7] parameter(3)
  p = pred[5,7] parameter(4)
  io = f32[5,7] iota(), iota_dimension=1
  n = f32[5,7] negate(a)
  s = f32[5,7] add(n, io)
  sel = f32[5,7] select(p, s, b)
  cl = f32[5,7] clamp(c, sel, d)
  m = f32[5,7] multiply(cl, a)
  cp = f32[5,7] copy(m)
  e0 = f32[0] parameter(5)
  e1 = f32[0] copy(e0)
  ROOT r = (f32[5,7], f32[5,7], f32[0]) tuple(cp, sel, e1)
}"""

FUSED_ARITIES = """HloModule fused_arities
ENTRY e {
  a = f32[64] parameter(0)
  b = f32[64] parameter(1)
  c = f32[64] parameter(2)
  d = f32[64] parameter(3)
  e = f32[64] parameter(4)
  f = f32[64] parameter(5)
  ab = f32[64] multiply(a, b)
  cd = f32[64] subtract(c, d)
  ef = f32[64] maximum(e, f)
  s = f32[64] add(ab, cd)
  ROOT r = f32[64] add(s, ef)
}"""


@pytest.mark.parametrize("optimize", [True, False])
def test_kernels_of_every_argument_count(optimize):
    program = compile_text(ARITIES, optimize=optimize)
    args = [RNG.standard_normal((5, 7)).astype(np.float32) for _ in range(4)]
    args += [RNG.random((5, 7)) < 0.5, np.zeros(0, np.float32)]
    check(program, ARITIES, args)
    fused = compile_text(FUSED_ARITIES, optimize=optimize)
    check(fused, FUSED_ARITIES, [RNG.standard_normal(64).astype(np.float32) for _ in range(6)])


PRED_CONDITIONAL = """HloModule pred_conditional
t {
  p = f32[16] parameter(0)
  ROOT r = f32[16] exponential(p)
}
f {
  p = f32[16] parameter(0)
  ROOT r = f32[16] negate(p)
}
ENTRY e {
  c = pred[] parameter(0)
  x = f32[16] parameter(1)
  ROOT r = f32[16] conditional(c, x, x), true_computation=t, false_computation=f
}"""


@pytest.mark.parametrize("pred", [True, False])
def test_pred_conditional(pred):
    program = compile_text(PRED_CONDITIONAL)
    check(program, PRED_CONDITIONAL, [np.array(pred), RNG.standard_normal(16).astype(np.float32)])
