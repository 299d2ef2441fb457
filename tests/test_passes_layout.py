"""reshape-to-bitcast: which reshapes and transposes become bitcasts (a table of HLO before
and the expected opcode after), an exhaustive check over small shapes and every layout that
the pass's answer equals the brute-force one, and whole programs through the CPU pipeline
whose values stay the same in their assigned bytes."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from jax_programs import PROGRAMS, hlo_texts
from test_jax_programs import assert_leaf_matches, leaves

from xlapy.backends import get_backend
from xlapy.backends.interpreter import evaluate
from xlapy.backends.interpreter.arena import evaluate_in_arena
from xlapy.ir.opcodes import Opcode
from xlapy.ir.parser import parse_module
from xlapy.ir.verifier import verify
from xlapy.passes.reshape_to_bitcast import ReshapeToBitcast, reshape_is_bitcast

# (name, entry body whose root is the instruction under test, expected root opcode after)
CASES = [
    (
        "reshape row-major",
        "p = f32[6]{0} parameter(0)\n  ROOT r = f32[2,3]{1,0} reshape(p)",
        "bitcast",
    ),
    (
        "reshape adds a unit dim",
        "p = s32[8]{0} parameter(0)\n  ROOT r = s32[8,1]{1,0} reshape(p)",
        "bitcast",
    ),
    (
        "reshape without layouts",
        "p = f32[4,6] parameter(0)\n  ROOT r = f32[2,2,6] reshape(p)",
        "bitcast",
    ),
    (
        "reshape of column-major",
        "p = f32[2,3]{0,1} parameter(0)\n  ROOT r = f32[6]{0} reshape(p)",
        "reshape",
    ),
    (
        "reshape column-major to column-major",
        "p = f32[2,3]{0,1} parameter(0)\n  ROOT r = f32[3,2]{0,1} reshape(p)",
        "reshape",
    ),
    (
        "reshape unit dims in any order",
        "p = f32[1,4,1]{0,2,1} parameter(0)\n  ROOT r = f32[4]{0} reshape(p)",
        "bitcast",
    ),
    (
        "transpose of unit dims",
        "p = f32[1,4]{1,0} parameter(0)\n  ROOT r = f32[4,1]{1,0} transpose(p), dimensions={1,0}",
        "bitcast",
    ),
    (
        "transpose into the layout",
        "p = f32[2,3]{1,0} parameter(0)\n  ROOT r = f32[3,2]{0,1} transpose(p), dimensions={1,0}",
        "bitcast",
    ),
    (
        "transpose that moves bytes",
        "p = f32[2,3]{1,0} parameter(0)\n  ROOT r = f32[3,2]{1,0} transpose(p), dimensions={1,0}",
        "transpose",
    ),
    (
        "tiled layout left alone",
        "p = f32[8,128]{1,0:T(8,128)} parameter(0)\n  ROOT r = f32[1024]{0} reshape(p)",
        "reshape",
    ),
]


def _module(body: str):
    return parse_module(f"HloModule m\nENTRY e {{\n  {body}\n}}\n")


@pytest.mark.parametrize("name,body,expected", CASES, ids=[c[0] for c in CASES])
def test_reshape_to_bitcast_table(name, body, expected):
    before, after = _module(body), _module(body)
    changed = ReshapeToBitcast().run(after)
    verify(after)
    root = after.entry.root
    assert root.opcode.text == expected
    assert changed == (expected == "bitcast")
    assert root.shape == before.entry.root.shape
    if changed:
        assert root.operands[0] is after.entry.parameters[0]
        assert set(root.attrs) <= {"metadata"}
    x = np.random.default_rng(len(name)).standard_normal(before.entry.parameters[0].shape.dims)
    x = x.astype(before.entry.parameters[0].shape.dtype)
    assert np.array_equal(evaluate(after, [x]), evaluate(before, [x]))


def test_before_and_after_text():
    module = _module("p = s32[8]{0} parameter(0)\n  ROOT r = s32[8,1]{1,0} reshape(p)")
    ReshapeToBitcast().run(module)
    assert module.entry.root.to_text() == "ROOT bitcast.1 = s32[8,1]{1,0} bitcast(p)"


def _layouts(rank: int):
    return ["{" + ",".join(map(str, p)) + "}" for p in itertools.permutations(range(rank))]


def _dims(dims) -> str:
    return ",".join(map(str, dims))


RESHAPES = [
    ((2, 3), (6,)),
    ((2, 3), (3, 2)),
    ((2, 1, 3), (6, 1)),
    ((4, 1), (2, 2)),
    ((2, 3, 2), (6, 2)),
]


@pytest.mark.parametrize("src,dst", RESHAPES, ids=[f"{a}->{b}" for a, b in RESHAPES])
def test_reshape_decision_equals_brute_force(src, dst):
    """For every pair of layouts: a bitcast exactly when reinterpreting the bytes gives the
    reshape's values (the interpreter's bitcast is layout-aware)."""
    x = np.random.default_rng(7).standard_normal(src).astype(np.float32)
    seen = set()
    for lin, lout in itertools.product(_layouts(len(src)), _layouts(len(dst))):
        text = f"p = f32[{_dims(src)}]{lin} parameter(0)\n  ROOT r = f32[{_dims(dst)}]{lout}"
        reshape = _module(f"{text} reshape(p)")
        bitcast = _module(f"{text} bitcast(p)")
        same = np.array_equal(evaluate(reshape, [x]), evaluate(bitcast, [x]))
        assert reshape_is_bitcast(reshape.entry.root) == same, f"{lin} -> {lout}"
        seen.add(same)
    assert seen == {True, False}


def test_fused_computations_keep_their_reshapes():
    text = """HloModule m
fused {
  q = f32[6]{0} parameter(0)
  s = f32[2,3]{1,0} reshape(q)
  ROOT n = f32[2,3]{1,0} negate(s)
}
ENTRY e {
  p = f32[6]{0} parameter(0)
  ROOT f = f32[2,3]{1,0} fusion(p), kind=kLoop, calls=fused
}
"""
    module = parse_module(text)
    assert not ReshapeToBitcast().run(module)
    assert module.to_text() == parse_module(text).to_text()


def test_loop_bodies_are_rewritten():
    text = """HloModule m
body {
  s = (s32[], f32[6]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  one = s32[] constant(1)
  j = s32[] add(i, one)
  v = f32[6]{0} get-tuple-element(s), index=1
  m = f32[2,3]{1,0} reshape(v)
  e = f32[2,3]{1,0} exponential(m)
  w = f32[6]{0} reshape(e)
  ROOT t = (s32[], f32[6]) tuple(j, w)
}
cond {
  c = (s32[], f32[6]) parameter(0)
  k = s32[] get-tuple-element(c), index=0
  n = s32[] constant(3)
  ROOT lt = pred[] compare(k, n), direction=LT
}
ENTRY e {
  z = s32[] constant(0)
  p = f32[6]{0} parameter(0)
  init = (s32[], f32[6]) tuple(z, p)
  ROOT loop = (s32[], f32[6]) while(init), condition=cond, body=body
}
"""
    module = parse_module(text)
    x = np.random.default_rng(2).standard_normal(6).astype(np.float32) * 0.1
    want = evaluate(parse_module(text), [x])
    assert ReshapeToBitcast().run(module)
    body = next(c for c in module.computations if c.name == "body")
    ops = [i.opcode for i in body.instructions]
    assert Opcode.RESHAPE not in ops and ops.count(Opcode.BITCAST) == 2
    got = evaluate(module, [x])
    assert np.array_equal(got[1], want[1])


def test_root_bitcast_of_a_parameter_gets_its_own_output_bytes():
    """The output of `reshape(p)` must not become the caller's parameter buffer."""
    module = _module("p = f32[6]{0} parameter(0)\n  ROOT r = f32[2,3]{1,0} reshape(p)")
    x = np.random.default_rng(3).standard_normal(6).astype(np.float32)
    assignment = get_backend("cpu").plan_memory(module)  # the plan the CPU program runs
    planned = assignment.module
    root = planned.entry.root
    assert assignment.slice_of(root, ()) != assignment.slice_of(planned.entry.parameters[0], ())
    run = evaluate_in_arena(assignment, [x])
    assert np.array_equal(run.result, x.reshape(2, 3))


PROGRAM_NAMES = ["segment_sum_and_max", "rnn_scan_grad", "cond_inside_scan", "attention_causal"]
# Programs whose planned module keeps a layout-preserving reshape/transpose outside any
# fusion (in the two scans, in-place dynamic-update-slice fusions absorb theirs).
BITCAST_PROGRAMS = {"segment_sum_and_max", "attention_causal"}


@pytest.mark.parametrize("name", PROGRAM_NAMES)
def test_programs_through_the_cpu_pipeline(name):
    """Bitcasts appear where a reshape/transpose moves no bytes, and the arena run of the
    planned module matches the interpreter on the lowered module (within the program's
    tolerance: fusion reorders arithmetic)."""
    prog = PROGRAMS[name]
    args = prog.args()
    lowered = parse_module(hlo_texts(prog).lowered)
    assignment = get_backend("cpu").plan_memory(lowered)
    module = assignment.module
    ops = {i.opcode for c in module.computations for i in c.instructions}
    if name in BITCAST_PROGRAMS:
        assert Opcode.BITCAST in ops
    got, want = evaluate_in_arena(assignment, args).result, evaluate(lowered, args)
    for i, (g, w) in enumerate(zip(leaves(got), leaves(want), strict=True)):
        assert_leaf_matches(g, w, prog, f"{name} leaf {i}")
