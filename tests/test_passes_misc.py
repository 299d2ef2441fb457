"""DCE, CSE, constant folding, tuple simplification, call inlining, expanders and buffer
donors: HLO text in, the pass run, the printed result (or its properties) checked."""

# ruff: noqa: E501  (HLO lines and table rows read best one per line)

from __future__ import annotations

import numpy as np
import pytest

from xlapy.backends.interpreter import evaluate
from xlapy.ir.module import AliasEntry, BufferDonor
from xlapy.ir.opcodes import Opcode
from xlapy.ir.parser import parse_module
from xlapy.ir.verifier import verify
from xlapy.passes.constant_folding import ConstantFolding
from xlapy.passes.cse import CommonSubexpressionElimination
from xlapy.passes.dce import DeadCodeElimination
from xlapy.passes.donors import BufferDonorToAlias
from xlapy.passes.expanders import BatchNormExpander, DotUpcast, LogisticExpander
from xlapy.passes.inline import CallInliner
from xlapy.passes.tuple_simplify import TupleSimplifier


def run(pass_, text: str):
    module = parse_module(text)
    verify(module)
    changed = pass_.run(module)
    verify(module)
    again = pass_.run(module)
    assert not again, f"{pass_.name} changed the module a second time"
    return module, changed


def opcodes(module) -> list[str]:
    return [i.opcode.text for i in module.entry.instructions]


def rand_args(module, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for p in module.entry.parameters:
        if np.issubdtype(p.shape.dtype, np.floating):
            out.append(rng.standard_normal(p.shape.dims).astype(p.shape.dtype))
        else:
            out.append(rng.integers(-20, 20, p.shape.dims).astype(p.shape.dtype))
    return out


# -- DCE ------------------------------------------------------------------------------------

DCE_IN = """HloModule m
unused {
  a.0 = f32[] parameter(0)
  ROOT n.0 = f32[] negate(a.0)
}
used {
  a.1 = f32[] parameter(0)
  b.1 = f32[] parameter(1)
  ROOT c.1 = f32[] add(a.1, b.1)
}
ENTRY e {
  x = f32[4] parameter(0)
  dead1 = f32[4] exponential(x)
  dead2 = f32[4] negate(dead1)
  dead_call = f32[4] map(x), dimensions={0}, to_apply=unused
  tok = token[] after-all()
  out = token[] outfeed(x, tok)
  cc = f32[4] custom-call(x), custom_call_target="log_it", custom_call_has_side_effect=true
  pure_cc = f32[4] custom-call(x), custom_call_target="pure"
  z = f32[] constant(0)
  ROOT r = f32[] reduce(x, z), dimensions={0}, to_apply=used
}
"""


def test_dce_removes_dead_code_and_unreachable_computations():
    module, changed = run(DeadCodeElimination(), DCE_IN)
    assert changed
    names = [i.name for i in module.entry.instructions]
    assert names == ["x", "tok", "out", "cc", "z", "r"]
    assert [c.name for c in module.computations] == ["used", "e"]


def test_dce_keeps_while_with_side_effecting_body():
    text = """HloModule m
cond {
  s.0 = s32[] parameter(0)
  k.0 = s32[] constant(3)
  ROOT lt.0 = pred[] compare(s.0, k.0), direction=LT
}
body {
  s.1 = s32[] parameter(0)
  t.1 = token[] after-all()
  o.1 = token[] outfeed(s.1, t.1)
  one.1 = s32[] constant(1)
  ROOT n.1 = s32[] add(s.1, one.1)
}
ENTRY e {
  x = s32[] parameter(0)
  w = s32[] while(x), condition=cond, body=body
  ROOT r = s32[] copy(x)
}
"""
    module, changed = run(DeadCodeElimination(), text)
    assert not changed
    assert "while" in opcodes(module)


def test_dce_nothing_to_do():
    text = "HloModule m\nENTRY e {\n  x = f32[4] parameter(0)\n  ROOT r = f32[4] negate(x)\n}\n"
    _, changed = run(DeadCodeElimination(), text)
    assert not changed


# -- CSE ------------------------------------------------------------------------------------

CSE_IN = """HloModule m
ENTRY e {
  x = f32[4] parameter(0)
  y = f32[4] parameter(1)
  c1 = f32[] constant(2)
  c2 = f32[] constant(2)
  b1 = f32[4] broadcast(c1), dimensions={}
  b2 = f32[4] broadcast(c2), dimensions={}, metadata={op_name="other"}
  a1 = f32[4] add(x, b1)
  a2 = f32[4] add(x, b2)
  swapped = f32[4] add(b1, x)
  r1 = f32[4] rng(c1, c2), distribution=rng_uniform
  r2 = f32[4] rng(c1, c2), distribution=rng_uniform
  s1 = f32[4] custom-call(x), custom_call_target="fx", custom_call_has_side_effect=true
  s2 = f32[4] custom-call(x), custom_call_target="fx", custom_call_has_side_effect=true
  m1 = f32[4] multiply(a1, a2)
  ROOT t = (f32[4], f32[4], f32[4], f32[4], f32[4], f32[4], f32[4]) tuple(m1, swapped, r1, r2, s1, s2, y)
}
"""


def test_cse_merges_identical_but_not_side_effects():
    module, changed = run(CommonSubexpressionElimination(), CSE_IN)
    assert changed
    names = [i.name for i in module.entry.instructions]
    for gone in ("c2", "b2", "a2"):
        assert gone not in names
    for kept in ("swapped", "r1", "r2", "s1", "s2"):
        assert kept in names
    m1 = module.entry.get_instruction("m1")
    assert m1.operands[0] is m1.operands[1]


def test_cse_keeps_different_attributes_and_elided_constants():
    text = """HloModule m
ENTRY e {
  x = f32[2,3] parameter(0)
  z = f32[] constant(0)
  a = f32[2] reduce(x, z), dimensions={1}, to_apply=add
  k1 = f32[3] constant({...})
  k2 = f32[3] constant({...})
  ROOT t = (f32[2], f32[3], f32[3]) tuple(a, k1, k2)
}
add {
  p = f32[] parameter(0)
  q = f32[] parameter(1)
  ROOT s = f32[] add(p, q)
}
"""
    _, changed = run(CommonSubexpressionElimination(), text)
    assert not changed


# -- constant folding -----------------------------------------------------------------------

FOLD_IN = """HloModule m
add {
  p = f32[] parameter(0)
  q = f32[] parameter(1)
  ROOT sum = f32[] add(p, q)
}
ENTRY e {
  x = f32[3] parameter(0)
  a = f32[3] constant({1, 2, 3})
  b = f32[3] constant({10, 20, 30})
  s = f32[3] add(a, b)
  n = f32[3] negate(s)
  z = f32[] constant(0)
  total = f32[] reduce(n, z), dimensions={0}, to_apply=add
  big = f32[1000,1000] broadcast(z), dimensions={}
  io = s32[3] iota(), iota_dimension=0
  r = f32[3] rng(z, total), distribution=rng_uniform
  bt = f32[3] broadcast(total), dimensions={}
  y = f32[3] add(x, bt)
  ROOT t = (f32[3], f32[1000,1000], s32[3], f32[3]) tuple(y, big, io, r)
}
"""


def test_constant_folding_folds_chains_and_reductions():
    module, changed = run(ConstantFolding(), FOLD_IN)
    assert changed
    entry = module.entry
    total = entry.get_instruction("bt").operands[0]
    assert total.opcode is Opcode.CONSTANT
    assert float(total.literal.array) == -66.0
    kinds = {i.name: i.opcode.text for i in entry.instructions}
    assert kinds["big"] == "broadcast" and kinds["io"] == "iota" and kinds["r"] == "rng"
    assert "s" not in kinds and "n" not in kinds


def test_constant_folding_respects_element_limit_and_errors():
    text = """HloModule m
ENTRY e {
  a = f32[64] constant({...})
  n = f32[64] negate(a)
  i = s32[2] constant({7, 8})
  k = s32[2] constant({0, 0})
  d = s32[2] divide(i, k)
  c = f32[2] constant({1, 2})
  e1 = f32[2] exponential(c)
  ROOT t = (f32[64], s32[2], f32[2]) tuple(n, d, e1)
}
"""
    module, changed = run(ConstantFolding(max_elements=1), text)
    assert not changed
    module, changed = run(ConstantFolding(), text)
    assert changed
    folded = module.entry.root.operands
    assert folded[0].opcode is Opcode.NEGATE  # elided operand: nothing to fold
    assert folded[1].opcode is Opcode.CONSTANT  # integer division by zero is defined in HLO
    np.testing.assert_allclose(folded[2].literal.array, np.exp([1.0, 2.0]).astype(np.float32))


# -- tuple simplification -------------------------------------------------------------------

TUPLE_IN = """HloModule m
ENTRY e {
  p = (f32[2], s32[3]) parameter(0)
  x = f32[2] parameter(1)
  g0 = f32[2] get-tuple-element(p), index=0
  g1 = s32[3] get-tuple-element(p), index=1
  rebuilt = (f32[2], s32[3]) tuple(g0, g1)
  t = (f32[2], (f32[2], s32[3])) tuple(x, rebuilt)
  inner = (f32[2], s32[3]) get-tuple-element(t), index=1
  back = f32[2] get-tuple-element(inner), index=0
  swapped = (s32[3], f32[2]) tuple(g1, g0)
  ROOT r = (f32[2], (s32[3], f32[2])) tuple(back, swapped)
}
"""


def test_tuple_simplifier_forwards_elements_and_drops_rebuilt_tuples():
    module, changed = run(TupleSimplifier(), TUPLE_IN)
    assert changed
    root = module.entry.root
    first = root.operands[0]  # gte(gte(tuple(x, p), 1), 0) -> gte(p, 0)
    assert first.opcode is Opcode.GET_TUPLE_ELEMENT and first.operands[0].name == "p"
    assert root.operands[1].name == "swapped"  # not the same order: stays
    names = [i.name for i in module.entry.instructions]
    assert "rebuilt" not in names and "t" not in names and "inner" not in names


def test_tuple_simplifier_replaces_whole_rebuilt_tuple():
    text = """HloModule m
ENTRY e {
  p = (f32[2], s32[3]) parameter(0)
  g0 = f32[2] get-tuple-element(p), index=0
  g1 = s32[3] get-tuple-element(p), index=1
  ROOT rebuilt = (f32[2], s32[3]) tuple(g0, g1)
}
"""
    module, changed = run(TupleSimplifier(), text)
    assert changed and module.entry.root.name == "p"
    assert len(module.entry.instructions) == 1


# -- call inlining --------------------------------------------------------------------------

INLINE_IN = """HloModule m
inner {
  a.2 = f32[4] parameter(0)
  ROOT e.2 = f32[4] exponential(a.2)
}
outer {
  a.1 = f32[4] parameter(0)
  b.1 = f32[4] parameter(1)
  s.1 = f32[4] add(a.1, b.1)
  ROOT c.1 = f32[4] call(s.1), to_apply=inner
}
ident {
  a.3 = f32[4] parameter(0)
  ROOT a.3.root = f32[4] parameter(1)
}
ENTRY e {
  x = f32[4] parameter(0)
  y = f32[4] parameter(1)
  c1 = f32[4] call(x, y), to_apply=outer
  c2 = f32[4] call(y, x), to_apply=outer
  c3 = f32[4] call(c1, c2), to_apply=ident
  ROOT r = f32[4] multiply(c1, c3)
}
"""


def test_call_inliner_inlines_nested_calls():
    before = parse_module(INLINE_IN)
    module, changed = run(CallInliner(), INLINE_IN)
    assert changed
    assert "call" not in opcodes(module)
    assert [c.name for c in module.computations] == ["e"]
    assert opcodes(module).count("exponential") == 2
    args = rand_args(module)
    np.testing.assert_array_equal(evaluate(module, args), evaluate(before, args))


# -- expanders ------------------------------------------------------------------------------

BN_IN = """HloModule m
ENTRY e {
  x = f32[2,3,4] parameter(0)
  scale = f32[3] parameter(1)
  offset = f32[3] parameter(2)
  mean = f32[3] parameter(3)
  var = f32[3] parameter(4)
  grad = f32[2,3,4] parameter(5)
  tr = (f32[2,3,4], f32[3], f32[3]) batch-norm-training(x, scale, offset), epsilon=0.001, feature_index=1
  inf = f32[2,3,4] batch-norm-inference(x, scale, offset, mean, var), epsilon=0.001, feature_index=1
  gr = (f32[2,3,4], f32[3], f32[3]) batch-norm-grad(x, scale, mean, var, grad), epsilon=0.001, feature_index=1
  ROOT t = ((f32[2,3,4], f32[3], f32[3]), f32[2,3,4], (f32[2,3,4], f32[3], f32[3])) tuple(tr, inf, gr)
}
"""


def _flat(v):
    return [leaf for x in v for leaf in _flat(x)] if isinstance(v, tuple) else [v]


def test_batchnorm_expander_matches_the_ops():
    before = parse_module(BN_IN)
    module, changed = run(BatchNormExpander(), BN_IN)
    assert changed
    assert not any("batch-norm" in op for op in opcodes(module))
    args = rand_args(module, seed=5)
    args[4] = np.abs(args[4]) + 0.5  # a variance
    for a, e in zip(_flat(evaluate(module, args)), _flat(evaluate(before, args)), strict=True):
        np.testing.assert_allclose(a, e, rtol=2e-5, atol=2e-5)


def test_logistic_expander():
    text = "HloModule m\nENTRY e {\n  x = f32[8] parameter(0)\n  ROOT r = f32[8] logistic(x)\n}\n"
    before = parse_module(text)
    module, changed = run(LogisticExpander(), text)
    assert changed and "logistic" not in opcodes(module)
    x = (np.random.default_rng(1).standard_normal(8) * 10).astype(np.float32)
    np.testing.assert_allclose(evaluate(module, [x]), evaluate(before, [x]), rtol=1e-6)


# (name, lhs type, rhs type, result type, whether dot-upcast rewrites it)
UPCAST_CASES = [
    ("bf16 in and out", "bf16", "bf16", "bf16", True),
    ("bf16 in, f32 out", "bf16", "bf16", "f32", True),
    ("f16 in and out", "f16", "f16", "f16", True),
    ("f32 and bf16 in, f32 out", "f32", "bf16", "f32", True),
    ("f32 in, bf16 out", "f32", "f32", "bf16", True),
    ("f32 alone", "f32", "f32", "f32", False),
    ("f64 with bf16", "f64", "bf16", "f64", False),
    ("s8 in, s32 out", "s8", "s8", "s32", False),
]


@pytest.mark.parametrize("name,lt,rt,ot,fires", UPCAST_CASES, ids=[c[0] for c in UPCAST_CASES])
def test_dot_upcast_computes_in_f32_with_the_same_numbers(name, lt, rt, ot, fires):
    text = (
        "HloModule m\nENTRY e {\n"
        f"  a = {lt}[2,5,24] parameter(0)\n  b = {rt}[2,24,7] parameter(1)\n"
        f"  ROOT d = {ot}[2,5,7] dot(a, b), lhs_batch_dims={{0}}, rhs_batch_dims={{0}}, "
        "lhs_contracting_dims={2}, rhs_contracting_dims={1}, operand_precision={highest,default}\n}\n"
    )
    before = parse_module(text)
    module, changed = run(DotUpcast(), text)
    assert changed == fires
    dots = [i for i in module.entry.instructions if i.opcode is Opcode.DOT]
    assert len(dots) == 1
    if fires:
        assert dots[0].shape.element_type.text == "f32"
        assert all(o.shape.element_type.text == "f32" for o in dots[0].operands)
        assert dots[0].attrs["operand_precision"] == before.entry.root.attrs["operand_precision"]
    assert module.entry.root.shape == before.entry.root.shape
    rng = np.random.default_rng(len(name))
    args = []
    for p in before.entry.parameters:
        x = rng.standard_normal(p.shape.dims) * 3
        args.append(x.astype(np.int8) if p.shape.dtype == np.int8 else x.astype(p.shape.dtype))
    got, want = evaluate(module, args), evaluate(before, args)
    assert got.dtype == want.dtype
    # f32 accumulation either way, rounded once to the result type
    np.testing.assert_allclose(
        got.astype(np.float64), want.astype(np.float64), rtol=1e-6, atol=1e-6
    )


@pytest.mark.parametrize("expander", [BatchNormExpander(), LogisticExpander(), DotUpcast()])
def test_expanders_do_nothing_without_their_ops(expander):
    text = "HloModule m\nENTRY e {\n  x = f32[8] parameter(0)\n  ROOT r = f32[8] negate(x)\n}\n"
    _, changed = run(expander, text)
    assert not changed


# -- buffer donors --------------------------------------------------------------------------

DONOR_IN = """HloModule m, buffer_donor={ (0, {}), (1, {}), (2, {1}), (3, {}) }
ENTRY e {
  a = f32[4] parameter(0)
  b = s32[4] parameter(1)
  c = (f32[2], f32[4]) parameter(2)
  d = f32[100] parameter(3)
  c1 = f32[4] get-tuple-element(c), index=1
  s = f32[4] add(a, c1)
  n = s32[4] negate(b)
  u = u32[4] bitcast-convert(n)
  ROOT r = (f32[4], u32[4], f32[4], s32[4]) tuple(s, u, s, n)
}
"""


def test_donors_become_aliases_in_a_deterministic_order():
    module, changed = run(BufferDonorToAlias(), DONOR_IN)
    assert changed
    cfg = module.config
    assert cfg.input_output_alias == (
        AliasEntry((0,), 0, ()),
        AliasEntry((2,), 2, (1,)),
        AliasEntry((3,), 1, ()),
    )
    assert cfg.buffer_donors == (BufferDonor(3, ()),)  # f32[100]: no output of its size
    assert "input_output_alias" in module.to_text()


def test_donors_skip_outputs_already_aliased():
    text = DONOR_IN.replace(
        "HloModule m,", "HloModule m, input_output_alias={ {0}: (2, {1}, may-alias) },"
    )
    text = text.replace("(2, {1}), ", "")
    module, changed = run(BufferDonorToAlias(), text)
    assert changed
    assert module.config.input_output_alias == (
        AliasEntry((0,), 2, (1,)),
        AliasEntry((2,), 0, ()),
        AliasEntry((3,), 1, ()),
    )


def test_no_donors_no_change():
    text = "HloModule m\nENTRY e {\n  x = f32[8] parameter(0)\n  ROOT r = f32[8] negate(x)\n}\n"
    _, changed = run(BufferDonorToAlias(), text)
    assert not changed
