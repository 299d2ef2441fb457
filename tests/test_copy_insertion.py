"""Copy insertion: copies where shared buffers would interfere, none where they would not."""

from __future__ import annotations

import numpy as np
import pytest
from test_arena_run import assert_bitwise_equal
from test_dataflow import WHILE

from xlapy.backends.interpreter import evaluate
from xlapy.backends.interpreter.arena import evaluate_in_arena
from xlapy.ir.opcodes import Opcode
from xlapy.ir.parser import parse_module
from xlapy.ir.verifier import verify
from xlapy.memory.buffer_assignment import assign_buffers, prepare_for_buffer_assignment
from xlapy.passes import PASSES

SWAP = """
HloModule swap
cond {
  cp = (s32[], f32[4], f32[4]) parameter(0)
  ci = s32[] get-tuple-element(cp), index=0
  three = s32[] constant(3)
  ROOT lt = pred[] compare(ci, three), direction=LT
}
body {
  bp = (s32[], f32[4], f32[4]) parameter(0)
  i = s32[] get-tuple-element(bp), index=0
  a = f32[4] get-tuple-element(bp), index=1
  b = f32[4] get-tuple-element(bp), index=2
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  ROOT out = (s32[], f32[4], f32[4]) tuple(i1, b, a)
}
ENTRY e {
  x = f32[4] parameter(0)
  y = f32[4] parameter(1)
  zero = s32[] constant(0)
  init = (s32[], f32[4], f32[4]) tuple(zero, x, y)
  w = (s32[], f32[4], f32[4]) while(init), condition=cond, body=body
  ROOT r = (f32[4], f32[4]) get-tuple-element(w), index=1
}
""".replace(
    "ROOT r = (f32[4], f32[4]) get-tuple-element(w), index=1",
    "g1 = f32[4] get-tuple-element(w), index=1\n"
    "  g2 = f32[4] get-tuple-element(w), index=2\n"
    "  ROOT r = (f32[4], f32[4]) tuple(g1, g2)",
)

DIRECT = """
HloModule direct
ENTRY e {
  p = f32[8] parameter(0)
  c = f32[8] constant({1, 2, 3, 4, 5, 6, 7, 8})
  n = f32[8] negate(p)
  ROOT r = (f32[8], f32[8], f32[8], f32[8]) tuple(p, c, n, n)
}
"""

DONATED = """
HloModule donated, input_output_alias={ {}: (0, {}, may-alias) }
ENTRY e {
  p = f32[8] parameter(0)
  c = f32[] constant(1)
  b = f32[8] broadcast(c), dimensions={}
  ROOT out = f32[8] add(p, b)
}
"""


def _copies(module):
    return [i for i in module.instructions() if i.opcode is Opcode.COPY]


def _args(module, seed=0):
    rng = np.random.default_rng(seed)
    return [
        rng.standard_normal(p.shape.dims).astype(p.shape.dtype) for p in module.entry.parameters
    ]


def _check_runs(text, module):
    args = _args(module)
    expected = evaluate(parse_module(text), args)
    assert_bitwise_equal(evaluate(module, args), expected, "after copy insertion")
    assert_bitwise_equal(evaluate_in_arena(assign_buffers(module), args).result, expected, "arena")


def test_registered():
    assert "copy-insertion" in PASSES and "flatten-call-graph" in PASSES


def test_swapping_loop_state_keeps_the_copies_it_needs():
    m = parse_module(SWAP)
    prepare_for_buffer_assignment(m)
    verify(m)
    body = m.entry.get_instruction("w").attrs["body"]
    assert len([i for i in body.instructions if i.opcode is Opcode.COPY]) >= 2
    _check_runs(SWAP, m)


def test_loop_that_updates_in_place_needs_no_copy_in_the_body():
    m = parse_module(WHILE)
    prepare_for_buffer_assignment(m)
    body = m.entry.get_instruction("w").attrs["body"]
    assert not [i for i in body.instructions if i.opcode is Opcode.COPY]
    _check_runs(WHILE, m)


def test_entry_root_returning_parameter_constant_or_duplicate_is_copied():
    m = parse_module(DIRECT)
    prepare_for_buffer_assignment(m)
    a = assign_buffers(m)
    root = m.entry.root
    slices = [a.slice_of(root, (i,)) for i in range(4)]
    assert len(set(slices)) == 4
    for i in range(4):
        alloc = a.allocation_of(root, (i,))
        assert alloc.kind == "output", (i, alloc.describe())
    _check_runs(DIRECT, m)


def test_donated_parameter_updated_in_place_without_copies():
    m = parse_module(DONATED)
    prepare_for_buffer_assignment(m)
    assert not _copies(m)
    a = assign_buffers(m)
    assert a.slice_of(m.entry.root) == a.slice_of(m.entry.parameter(0))
    _check_runs(DONATED, m)


def test_donated_parameter_read_after_the_update_gets_one_copy():
    text = DONATED.replace(
        "ROOT out = f32[8] add(p, b)",
        "out = f32[8] add(p, b)\n  ROOT t = (f32[8], f32[8]) tuple(out, p)",
    ).replace("{ {}: (0, {}, may-alias) }", "{ {0}: (0, {}, may-alias) }")
    m = parse_module(text)
    prepare_for_buffer_assignment(m)
    assert len(_copies(m)) == 1
    _check_runs(text, m)


@pytest.mark.parametrize("text", [SWAP, WHILE, DIRECT], ids=["swap", "while", "direct"])
def test_second_run_changes_nothing_needed(text):
    m = parse_module(text)
    prepare_for_buffer_assignment(m)
    count = len(_copies(m))
    prepare_for_buffer_assignment(m)
    assert len(_copies(m)) == count
    _check_runs(text, m)


# The body reads `table` (a parameter) and `k` (a constant) every iteration and passes both
# through unchanged: read-only loop state needs no copy of its init.
READ_ONLY_STATE = """
HloModule read_only
cond {
  cp = (s32[], f32[8], f32[8], f32[8]) parameter(0)
  ci = s32[] get-tuple-element(cp), index=0
  five = s32[] constant(5)
  ROOT lt = pred[] compare(ci, five), direction=LT
}
body {
  bp = (s32[], f32[8], f32[8], f32[8]) parameter(0)
  i = s32[] get-tuple-element(bp), index=0
  acc = f32[8] get-tuple-element(bp), index=1
  tb = f32[8] get-tuple-element(bp), index=2
  kb = f32[8] get-tuple-element(bp), index=3
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  t = f32[8] multiply(tb, kb)
  acc1 = f32[8] add(acc, t)
  ROOT out = (s32[], f32[8], f32[8], f32[8]) tuple(i1, acc1, tb, kb)
}
ENTRY e {
  a = f32[8] parameter(0)
  table = f32[8] parameter(1)
  k = f32[8] constant({1, 2, 3, 4, 5, 6, 7, 8})
  zero = s32[] constant(0)
  init = (s32[], f32[8], f32[8], f32[8]) tuple(zero, a, table, k)
  w = (s32[], f32[8], f32[8], f32[8]) while(init), condition=cond, body=body
  ROOT r = f32[8] get-tuple-element(w), index=1
}
"""


def test_read_only_loop_state_shares_the_callers_bytes():
    m = parse_module(READ_ONLY_STATE)
    prepare_for_buffer_assignment(m)
    verify(m)
    a = assign_buffers(m)
    e = m.entry
    w = e.get_instruction("w")
    # the parameter and the constant are the loop state themselves: no copy, no temp
    assert a.slice_of(w, (2,)) == a.slice_of(e.parameter(1))
    assert a.allocation_of(w, (3,)).is_constant
    body = w.attrs["body"]
    for index in (2, 3):
        assert a.slice_of(body.parameter(0), (index,)) == a.slice_of(w, (index,))
    # the counter and the accumulator, written every iteration, keep their init copies
    assert a.slice_of(w, (1,)) != a.slice_of(e.parameter(0))
    copied = sorted(c.operands[0].name for c in _copies(m) if c.parent is e)
    assert copied == ["a", "zero"]
    _check_runs(READ_ONLY_STATE, m)


def test_written_loop_state_keeps_the_copy_of_a_parameter():
    text = READ_ONLY_STATE.replace("tuple(i1, acc1, tb, kb)", "tuple(i1, acc1, t, kb)")
    m = parse_module(text)
    prepare_for_buffer_assignment(m)
    a = assign_buffers(m)
    w = m.entry.get_instruction("w")
    assert a.allocation_of(w, (2,)).kind != "parameter"
    _check_runs(text, m)


def test_no_tuple_is_left_rebuilding_its_source():
    m = parse_module(WHILE)
    prepare_for_buffer_assignment(m)
    for comp in m.computations:
        for instr in comp.instructions:
            ops = instr.operands
            if instr.opcode is not Opcode.TUPLE or not ops:
                continue
            rebuilt = all(
                o.opcode is Opcode.GET_TUPLE_ELEMENT
                and o.operands[0] is ops[0].operands[0]
                and o.attrs["index"] == n
                for n, o in enumerate(ops)
            ) and (ops[0].operands[0].shape == instr.shape)
            assert not rebuilt, instr.name
    assert m.entry.root.name == "res"  # the program's own names survive
    _check_runs(WHILE, m)
