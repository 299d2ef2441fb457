"""Loop-invariant code motion out of while bodies: what moves (and what must not), the shape
of the loop afterwards, and that programs compute what they computed before (the
interpreter on the module as written, the CPU backend on the optimized one)."""

from __future__ import annotations

import numpy as np
import pytest

from xlapy.backends import get_backend
from xlapy.ir.opcodes import Opcode
from xlapy.ir.parser import parse_module
from xlapy.ir.verifier import verify
from xlapy.passes.dce import DeadCodeElimination
from xlapy.passes.while_licm import WhileLoopInvariantCodeMotion
from xlapy.passes.while_simplify import WhileLoopSimplifier

# An RNN-like loop: `e = exp(transpose(w))` reads only the passed-through weights (it
# moves; the transpose goes with it), the dot reads the carried state h (it stays), and the
# row read by the loop index from `s` stays (a dynamic slice by the induction variable).
RNN = """HloModule rnn
body {
  p = (s32[], f32[8,16], f32[16,16], f32[4,16]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  one = s32[] constant(1)
  next = s32[] add(i, one)
  h = f32[8,16] get-tuple-element(p), index=1
  w = f32[16,16] get-tuple-element(p), index=2
  wt = f32[16,16] transpose(w), dimensions={1,0}
  e = f32[16,16] exponential(wt)
  d = f32[8,16] dot(h, e), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  t = f32[8,16] tanh(d)
  s = f32[4,16] get-tuple-element(p), index=3
  zb = s32[] constant(0)
  row = f32[1,16] dynamic-slice(s, i, zb), dynamic_slice_sizes={1,16}
  flat = f32[16] reshape(row)
  r8 = f32[8,16] broadcast(flat), dimensions={1}
  o = f32[8,16] add(t, r8)
  ROOT tup = (s32[], f32[8,16], f32[16,16], f32[4,16]) tuple(next, o, w, s)
}
cond {
  pc = (s32[], f32[8,16], f32[16,16], f32[4,16]) parameter(0)
  ic = s32[] get-tuple-element(pc), index=0
  n = s32[] constant(4)
  ROOT lt = pred[] compare(ic, n), direction=LT
}
ENTRY main {
  h0 = f32[8,16] parameter(0)
  w0 = f32[16,16] parameter(1)
  s0 = f32[4,16] parameter(2)
  z = s32[] constant(0)
  init = (s32[], f32[8,16], f32[16,16], f32[4,16]) tuple(z, h0, w0, s0)
  wl = (s32[], f32[8,16], f32[16,16], f32[4,16]) while(init), condition=cond, body=body
  ROOT out = f32[8,16] get-tuple-element(wl), index=1
}
"""


def _args(module, seed):
    rng = np.random.default_rng(seed)
    return [
        (0.3 * rng.standard_normal(p.shape.dims)).astype(np.float32)
        for p in module.entry.parameters
    ]


def _interpret(text_or_module, args):
    module = parse_module(text_or_module) if isinstance(text_or_module, str) else text_or_module
    out = get_backend("interpreter").compile(module).run(args)
    return [np.asarray(v) for v in out] if isinstance(out, (list, tuple)) else [np.asarray(out)]


def _licm(text: str, simplify: bool = True):
    module = parse_module(text)
    changed = WhileLoopInvariantCodeMotion().run(module)
    if simplify:
        WhileLoopSimplifier().run(module)
    DeadCodeElimination().run(module)
    verify(module)
    return module, changed


def _loops(module):
    return [i for c in module.computations for i in c.instructions if i.opcode is Opcode.WHILE]


def _opcodes(comp):
    return [i.opcode for i in comp.instructions]


def _same(module, text, seeds=(1, 2)):
    for seed in seeds:
        args = _args(module, seed)
        for got, want in zip(_interpret(module, args), _interpret(text, args), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_invariant_work_moves_before_the_loop_and_the_index_read_stays():
    module, changed = _licm(RNN)
    assert changed
    (loop,) = _loops(module)
    body = loop.while_body
    assert Opcode.EXP not in _opcodes(body)
    assert Opcode.TRANSPOSE not in _opcodes(body)
    assert Opcode.DYNAMIC_SLICE in _opcodes(body)  # reads s at the loop index: not invariant
    assert Opcode.DOT in _opcodes(body)
    entry_ops = _opcodes(module.entry)
    assert Opcode.EXP in entry_ops and Opcode.TRANSPOSE in entry_ops
    # w is read by nobody in the loop now and left the state; exp(w^T) joined it
    assert [s.to_text() for s in loop.shape.tuple_shapes] == [
        "s32[]",
        "f32[8,16]",
        "f32[4,16]",
        "f32[16,16]",
    ]
    _same(module, RNN)


def test_without_the_simplifier_the_new_element_is_appended_and_indices_hold():
    module, _ = _licm(RNN, simplify=False)
    (loop,) = _loops(module)
    assert len(loop.shape.tuple_shapes) == 5
    root = loop.while_body.root
    added = root.operands[4]
    assert added.opcode is Opcode.GET_TUPLE_ELEMENT and added.tuple_index == 4
    assert loop.operands[0].operands[4].opcode is Opcode.EXP
    _same(module, RNN)


def test_a_loop_that_runs_at_most_once_is_left_alone():
    once = RNN.replace("n = s32[] constant(4)", "n = s32[] constant(1)")
    _, changed = _licm(once)
    assert not changed
    known = RNN.replace(
        "condition=cond, body=body",
        'condition=cond, body=body, backend_config={"known_trip_count":{"n":"1"}}',
    )
    _, changed = _licm(known)
    assert not changed


# A body op X that reads only the passed-through weights w; its result feeds the carried
# value, so it would move if it were allowed to.
GENERIC = """HloModule fx
sum {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}
body {
  p = (s32[], f32[16], f32[16]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  one = s32[] constant(1)
  next = s32[] add(i, one)
  h = f32[16] get-tuple-element(p), index=1
  w = f32[16] get-tuple-element(p), index=2
  OP
  o = f32[16] add(h, x)
  ROOT tup = (s32[], f32[16], f32[16]) tuple(next, o, w)
}
cond {
  pc = (s32[], f32[16], f32[16]) parameter(0)
  ic = s32[] get-tuple-element(pc), index=0
  n = s32[] constant(5)
  ROOT lt = pred[] compare(ic, n), direction=LT
}
ENTRY main {
  h0 = f32[16] parameter(0)
  w0 = f32[16] parameter(1)
  z = s32[] constant(0)
  init = (s32[], f32[16], f32[16]) tuple(z, h0, w0)
  wl = (s32[], f32[16], f32[16]) while(init), condition=cond, body=body
  ROOT out = f32[16] get-tuple-element(wl), index=1
}
"""

NEVER_MOVED = {
    "rng": """lo = f32[] constant(0)
  hi = f32[] constant(1)
  r = f32[16] rng(lo, hi), distribution=rng_uniform
  x = f32[16] multiply(w, r)""",
    "custom-call with a side effect": (
        'x = f32[16] custom-call(w), custom_call_target="xlapy_test_effect", '
        "custom_call_has_side_effect=true"
    ),
    "infeed": """tok = token[] after-all()
  inf = (f32[16], token[]) infeed(tok)
  got = f32[16] get-tuple-element(inf), index=0
  x = f32[16] multiply(w, got)""",
    "outfeed": """tok = token[] after-all()
  sent = token[] outfeed(w, tok), outfeed_shape=f32[16]
  x = f32[16] negate(w), control-predecessors={sent}""",
    "all-reduce": """x = f32[16] all-reduce(w), replica_groups={}, to_apply=sum""",
    "collective-permute": """x = f32[16] collective-permute(w), source_target_pairs={{0,0}}""",
    "replica-id": """rid = u32[] replica-id()
  ridf = f32[] convert(rid)
  rb = f32[16] broadcast(ridf), dimensions={}
  x = f32[16] multiply(w, rb)""",
    "optimization barrier": """x = f32[16] opt-barrier(w)""",
    "instruction with a control predecessor": """y = f32[16] exponential(w)
  x = f32[16] negate(w), control-predecessors={y}""",
}


@pytest.mark.parametrize("what", sorted(NEVER_MOVED))
def test_side_effects_collectives_and_ordered_instructions_never_move(what):
    text = GENERIC.replace("OP", NEVER_MOVED[what])
    module = parse_module(text)
    verify(module)
    changed = WhileLoopInvariantCodeMotion().run(module)
    assert not changed, what
    body = _loops(module)[0].while_body
    assert any(i.name == "x" for i in body.instructions)


MOVED = {
    "elementwise": "x = f32[16] exponential(w)",
    "scaled by a broadcast scalar, normalized by a reduce": """c = f32[] constant(0.5)
  cb = f32[16] broadcast(c), dimensions={}
  sq = f32[16] multiply(w, w)
  zr = f32[] constant(0)
  ss = f32[] reduce(sq, zr), dimensions={0}, to_apply=sum
  nb = f32[16] broadcast(ss), dimensions={}
  scaled = f32[16] multiply(w, cb)
  x = f32[16] divide(scaled, nb)""",
    "a chain with a cheap op inside": """e = f32[16] exponential(w)
  rv = f32[16] reverse(e), dimensions={0}
  x = f32[16] sine(rv)""",
    "an op on a constant and an invariant": """c = f32[2,8] constant(
    {{1.5, 2, -3, 4, 1, 1, 2, 2}, {0, 1, 2, 3, 4, 5, 6, 7}})
  c16 = f32[16] reshape(c)
  x = f32[16] multiply(w, c16)""",
}


@pytest.mark.parametrize("what", sorted(MOVED))
def test_pure_invariant_work_moves_and_computes_the_same(what):
    text = GENERIC.replace("OP", MOVED[what])
    module, changed = _licm(text)
    assert changed, what
    (loop,) = _loops(module)
    assert not any(i.name == "x" for i in loop.while_body.instructions)
    assert any(i.name.startswith("x.") for i in module.entry.instructions)
    # x alone joined the state (not the values it was computed from); w left it
    assert len(loop.shape.tuple_shapes) == 3
    _same(module, text)


CHEAP_ALONE = {
    "broadcast of a scalar": """c = f32[] constant(2)
  x = f32[16] broadcast(c), dimensions={}""",
    "reverse": "x = f32[16] reverse(w), dimensions={0}",
    "slice and concatenate of slices": """s = f32[8] slice(w), slice={[0:8]}
  x = f32[16] concatenate(s, s), dimensions={0}""",
}


@pytest.mark.parametrize("what", sorted(CHEAP_ALONE))
def test_cheap_shape_ops_move_only_with_an_instruction_that_reads_them(what):
    text = GENERIC.replace("OP", CHEAP_ALONE[what])
    module = parse_module(text)
    changed = WhileLoopInvariantCodeMotion().run(module)
    body = _loops(module)[0].while_body
    if what.startswith("slice"):  # the concatenate moves, taking its slice along
        assert changed and Opcode.SLICE not in _opcodes(body)
        assert Opcode.SLICE in _opcodes(module.entry)
        _same(module, text)
    else:
        assert not changed and any(i.name == "x" for i in body.instructions)


def test_a_result_much_larger_than_its_operands_stays():
    # an outer product of an invariant 16-vector with itself: 1 KiB out of 128 bytes read
    text = GENERIC.replace(
        "OP",
        """wa = f32[16,1] reshape(w)
  wb = f32[1,16] reshape(w)
  outer = f32[16,16] dot(wa, wb), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  hb = f32[16,16] broadcast(h), dimensions={0}
  prod = f32[16,16] multiply(hb, outer)
  zr = f32[] constant(0)
  x = f32[16] reduce(prod, zr), dimensions={1}, to_apply=sum""",
    )
    module = parse_module(text)
    verify(module)
    assert not WhileLoopInvariantCodeMotion().run(module)
    assert Opcode.DOT in _opcodes(_loops(module)[0].while_body)


# A bidirectional GRU's scan reads its stacked weights by a constant slice every step and
# multiplies by it; the slice (and its reshape) is a copy kernel per iteration on the CPU.
# The loop is the entry's root: the program's result keeps its four elements.
SLICED = """HloModule sliced
body {
  p = (s32[], f32[4,8], f32[3,8,8], f32[3,8]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  one = s32[] constant(1)
  next = s32[] add(i, one)
  h = f32[4,8] get-tuple-element(p), index=1
  ws = f32[3,8,8] get-tuple-element(p), index=2
  bs = f32[3,8] get-tuple-element(p), index=3
  w1 = f32[1,8,8] slice(ws), slice={[1:2], [0:8], [0:8]}
  w = f32[8,8] reshape(w1)
  d = f32[4,8] dot(h, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  b1 = f32[1,8] slice(bs), slice={[1:2], [0:8]}
  b = f32[8] reshape(b1)
  bb = f32[4,8] broadcast(b), dimensions={1}
  a = f32[4,8] add(d, bb)
  o = f32[4,8] tanh(a)
  ROOT tup = (s32[], f32[4,8], f32[3,8,8], f32[3,8]) tuple(next, o, ws, bs)
}
cond {
  pc = (s32[], f32[4,8], f32[3,8,8], f32[3,8]) parameter(0)
  ic = s32[] get-tuple-element(pc), index=0
  n = s32[] constant(6)
  ROOT lt = pred[] compare(ic, n), direction=LT
}
ENTRY main {
  h0 = f32[4,8] parameter(0)
  ws0 = f32[3,8,8] parameter(1)
  bs0 = f32[3,8] parameter(2)
  z = s32[] constant(0)
  init = (s32[], f32[4,8], f32[3,8,8], f32[3,8]) tuple(z, h0, ws0, bs0)
  ROOT wl = (s32[], f32[4,8], f32[3,8,8], f32[3,8]) while(init), condition=cond, body=body
}
"""


def test_a_slice_of_invariant_weights_read_by_a_dot_moves_the_bias_slice_stays():
    module, changed = _licm(SLICED)
    assert changed
    (loop,) = _loops(module)
    body = loop.while_body
    dot = next(i for i in body.instructions if i.opcode is Opcode.DOT)
    assert dot.operands[1].opcode is Opcode.GET_TUPLE_ELEMENT  # the weights, read whole
    # the bias slice feeds an elementwise add (fusion takes it): it stays
    assert [i.name for i in body.instructions if i.opcode is Opcode.SLICE] == ["b1"]
    # the sliced matrix joined the state (the stacked weights stay: the result holds them)
    assert [s.to_text() for s in loop.shape.tuple_shapes][-1] == "f32[8,8]"
    assert module.entry.root.opcode is Opcode.TUPLE
    assert module.entry.root.shape == parse_module(SLICED).entry.root.shape
    _same(module, SLICED)


def test_a_slice_read_by_the_induction_variable_does_not_move():
    by_index = SLICED.replace(
        "w1 = f32[1,8,8] slice(ws), slice={[1:2], [0:8], [0:8]}",
        "zi = s32[] constant(0)\n  k = s32[] remainder(i, zi3)\n"
        "  zi3 = s32[] constant(3)\n"
        "  w1 = f32[1,8,8] dynamic-slice(ws, k, zi, zi), dynamic_slice_sizes={1,8,8}",
    )
    # parse order: zi3 must come first
    by_index = by_index.replace(
        "k = s32[] remainder(i, zi3)\n  zi3 = s32[] constant(3)",
        "zi3 = s32[] constant(3)\n  k = s32[] remainder(i, zi3)",
    )
    module, _ = _licm(by_index)
    body = _loops(module)[0].while_body
    assert Opcode.DYNAMIC_SLICE in _opcodes(body)
    assert not any(s.to_text() == "f32[8,8]" for s in _loops(module)[0].shape.tuple_shapes)
    _same(module, by_index)


# Nested loops: the inner body's exp(w) is invariant in the inner loop (w passes through)
# and in the outer one (the outer body passes w through too).
NESTED = """HloModule nested
ibody {
  p = (s32[], f32[8], f32[8]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  one = s32[] constant(1)
  next = s32[] add(i, one)
  h = f32[8] get-tuple-element(p), index=1
  w = f32[8] get-tuple-element(p), index=2
  e = f32[8] exponential(w)
  m = f32[8] multiply(h, e)
  o = f32[8] sine(m)
  ROOT tup = (s32[], f32[8], f32[8]) tuple(next, o, w)
}
icond {
  pc = (s32[], f32[8], f32[8]) parameter(0)
  ic = s32[] get-tuple-element(pc), index=0
  n = s32[] constant(3)
  ROOT lt = pred[] compare(ic, n), direction=LT
}
obody {
  q = (s32[], f32[8], f32[8]) parameter(0)
  j = s32[] get-tuple-element(q), index=0
  onej = s32[] constant(1)
  nextj = s32[] add(j, onej)
  hq = f32[8] get-tuple-element(q), index=1
  wq = f32[8] get-tuple-element(q), index=2
  zi = s32[] constant(0)
  iinit = (s32[], f32[8], f32[8]) tuple(zi, hq, wq)
  inner = (s32[], f32[8], f32[8]) while(iinit), condition=icond, body=ibody
  ho = f32[8] get-tuple-element(inner), index=1
  c = f32[8] cosine(wq)
  hn = f32[8] add(ho, c)
  ROOT tupq = (s32[], f32[8], f32[8]) tuple(nextj, hn, wq)
}
ocond {
  qc = (s32[], f32[8], f32[8]) parameter(0)
  jc = s32[] get-tuple-element(qc), index=0
  no = s32[] constant(4)
  ROOT ltq = pred[] compare(jc, no), direction=LT
}
ENTRY main {
  h0 = f32[8] parameter(0)
  w0 = f32[8] parameter(1)
  z = s32[] constant(0)
  init = (s32[], f32[8], f32[8]) tuple(z, h0, w0)
  outer = (s32[], f32[8], f32[8]) while(init), condition=ocond, body=obody
  ROOT out = f32[8] get-tuple-element(outer), index=1
}
"""


def test_nested_loops_move_inner_invariants_out_of_both_loops():
    module, changed = _licm(NESTED)
    assert changed
    entry_ops = _opcodes(module.entry)
    assert Opcode.EXP in entry_ops  # out of the inner loop, then out of the outer
    assert Opcode.COS in entry_ops
    for loop in _loops(module):
        ops = _opcodes(loop.while_body)
        assert Opcode.EXP not in ops and Opcode.COS not in ops
    _same(module, NESTED)


def test_a_shared_body_or_a_pinned_custom_call_leaves_the_loop_alone():
    shared = NESTED.replace(
        "ROOT out = f32[8] get-tuple-element(outer), index=1",
        "again = (s32[], f32[8], f32[8]) while(init), condition=icond, body=ibody\n"
        "  o1 = f32[8] get-tuple-element(outer), index=1\n"
        "  o2 = f32[8] get-tuple-element(again), index=1\n"
        "  ROOT out = f32[8] add(o1, o2)",
    )
    module = parse_module(shared)
    WhileLoopInvariantCodeMotion().run(module)
    inner = [w for w in _loops(module) if w.while_body.name == "ibody"]
    assert len(inner) == 2
    assert Opcode.EXP in _opcodes(inner[0].while_body)  # called twice: left alone
    pinned = GENERIC.replace(
        "OP",
        """y = f32[16] custom-call(w), custom_call_target="MoveToHost"
  x = f32[16] exponential(w)""",
    )
    module = parse_module(pinned)
    assert not WhileLoopInvariantCodeMotion().run(module)


def test_the_cpu_pipeline_hoists_and_runs_like_the_interpreter():
    cpu = get_backend("cpu")
    for text in (RNN, SLICED, NESTED):
        compiled = cpu.compile(parse_module(text))
        bodies = [w.while_body for w in _loops(compiled.module)]
        assert bodies
        for body in bodies:  # no exp, cosine or weight slice left in any body
            for instr in body.instructions:
                inner = [instr]
                if instr.opcode is Opcode.FUSION:
                    inner = list(instr.called_computations().__next__().instructions)
                for i in inner:
                    assert i.opcode not in (Opcode.EXP, Opcode.COS), text[:20]
                    if i.opcode is Opcode.SLICE:
                        assert i.shape.to_text() != "f32[1,8,8]"
        for seed in (5, 6):
            args = _args(parse_module(text), seed)
            out = compiled.run(args)
            got = [np.asarray(v) for v in out] if isinstance(out, (list, tuple)) else [out]
            for g, w in zip(got, _interpret(text, args), strict=True):
                np.testing.assert_allclose(np.asarray(g), w, rtol=2e-5, atol=2e-5)
