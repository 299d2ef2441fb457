"""Loop fusion and multi-output fusion: HLO text in, the fused module's structure out, and the
interpreter's results bit for bit the same before and after (fusion only regroups work).
Every JAX program of the table is fused in both its lowered and XLA-optimized forms."""

from __future__ import annotations

import functools
import re

import numpy as np
import pytest
from jax_programs import PROGRAMS, hlo_texts

from xlapy.backends.interpreter import evaluate
from xlapy.ir.module import HloModule
from xlapy.ir.opcodes import Opcode
from xlapy.ir.parser import parse_module
from xlapy.ir.verifier import verify
from xlapy.passes.fusion import LoopFusion
from xlapy.passes.fusion_multi_output import MultiOutputFusion, Reachability
from xlapy.passes.pass_base import PASSES, make_pass

BOTH = (LoopFusion, MultiOutputFusion)


def leaves(value) -> list[np.ndarray]:
    if isinstance(value, tuple | list):
        return [leaf for v in value for leaf in leaves(v)]
    return [value]


def random_args(module: HloModule, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    args = []
    for p in module.entry.parameters:
        dtype = p.shape.dtype
        if np.issubdtype(dtype, np.floating):
            args.append(rng.standard_normal(p.shape.dims).astype(dtype))
        elif dtype == np.bool_:
            args.append(rng.random(p.shape.dims) < 0.5)
        else:
            args.append(rng.integers(1, 7, p.shape.dims).astype(dtype))
    return args


def assert_same_bits(before, after, what: str) -> None:
    a_leaves, b_leaves = leaves(before), leaves(after)
    assert len(a_leaves) == len(b_leaves), what
    for i, (a, b) in enumerate(zip(a_leaves, b_leaves, strict=True)):
        assert a.dtype == b.dtype and a.shape == b.shape, f"{what}: leaf {i}"
        assert a.tobytes() == b.tobytes(), f"{what}: leaf {i} differs after fusion"


def run_passes(module: HloModule, passes=BOTH, args=None, what: str = "module") -> list:
    """Run `passes` on `module` in place, verifying after each; the interpreter's results
    must not change and the text must round-trip. Returns the pass objects."""
    args = random_args(module, 7) if args is None else args
    before = evaluate(module, args)
    done = []
    for cls in passes:
        p = cls()
        p.run(module)
        verify(module)
        done.append(p)
    assert_same_bits(before, evaluate(module, args), what)
    text = module.to_text()
    assert parse_module(text).to_text() == text
    return done


def fused(text: str, passes=BOTH) -> HloModule:
    module = parse_module(text)
    run_passes(module, passes)
    return module


def entry_ops(module: HloModule) -> list[str]:
    return [i.opcode.text for i in module.entry.instructions]


def fusions(module: HloModule):
    return [i for i in module.entry.instructions if i.opcode is Opcode.FUSION]


def body_ops(fusion) -> list[str]:
    comp = fusion.attrs["calls"]
    return sorted(i.opcode.text for i in comp.instructions if i.opcode is not Opcode.PARAMETER)


# -- the pass registry -------------------------------------------------------------------------


def test_passes_are_registered():
    assert PASSES["fusion"] is LoopFusion
    assert PASSES["multi-output-fusion"] is MultiOutputFusion
    assert isinstance(make_pass("fusion"), LoopFusion)


# -- loop fusion -------------------------------------------------------------------------------

CHAIN = """
HloModule chain

ENTRY main {
  x = f32[16,32] parameter(0)
  y = f32[16,32] parameter(1)
  a = f32[16,32] add(x, y)
  m = f32[16,32] multiply(a, x)
  c = f32[16,32] convert(m)
  t = f32[16,32] tanh(c)
  cmp = pred[16,32] compare(t, y), direction=LT
  ROOT s = f32[16,32] select(cmp, t, x)
}
"""


def test_elementwise_chain_becomes_one_fusion():
    module = fused(CHAIN, (LoopFusion,))
    assert entry_ops(module) == ["parameter", "parameter", "fusion"]
    (fusion,) = fusions(module)
    assert str(fusion.attrs["kind"]) == "kLoop"
    assert body_ops(fusion) == sorted(["add", "multiply", "convert", "tanh", "compare", "select"])
    assert sorted(op.name for op in fusion.operands) == ["x", "y"]
    comp = fusion.attrs["calls"]
    assert re.fullmatch(r"fused_computation(\.\d+)?", comp.name)
    assert [p.name.split(".")[0] for p in comp.parameters] == ["param_0", "param_1"]
    assert module.entry.root is fusion
    assert fusion.name.endswith("_fusion")
    # the fused instructions keep their names; the fused computation prints before its caller
    assert {"a", "m", "t", "s"} <= {i.name for i in comp.instructions}
    assert module.computations.index(comp) < module.computations.index(module.entry)


def test_fusion_is_idempotent():
    module = fused(CHAIN, (LoopFusion,))
    text = module.to_text()
    assert not LoopFusion().run(module)
    assert module.to_text() == text


BROADCAST_MULTIPLY = """
HloModule bm

ENTRY main {
  x = f32[8,64] parameter(0)
  s = f32[] parameter(1)
  v = f32[64] parameter(2)
  bs = f32[8,64] broadcast(s), dimensions={}
  bv = f32[8,64] broadcast(v), dimensions={1}
  m = f32[8,64] multiply(x, bs)
  ROOT r = f32[8,64] add(m, bv)
}
"""


def test_broadcast_and_multiply_fuse():
    module = fused(BROADCAST_MULTIPLY, (LoopFusion,))
    (fusion,) = fusions(module)
    assert body_ops(fusion) == ["add", "broadcast", "broadcast", "multiply"]
    assert sorted(op.name for op in fusion.operands) == ["s", "v", "x"]


DOT_EPILOGUE = """
HloModule dot_epilogue

ENTRY main {
  a = f32[8,16] parameter(0)
  b = f32[16,32] parameter(1)
  bias = f32[32] parameter(2)
  d = f32[8,32] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  bb = f32[8,32] broadcast(bias), dimensions={1}
  z = f32[] constant(0)
  zb = f32[8,32] broadcast(z), dimensions={}
  add = f32[8,32] add(d, bb)
  ROOT relu = f32[8,32] maximum(add, zb)
}
"""


def test_dot_is_not_fused_but_its_epilogue_is():
    module = fused(DOT_EPILOGUE)
    assert "dot" in entry_ops(module)
    (fusion,) = fusions(module)
    assert body_ops(fusion) == ["add", "broadcast", "broadcast", "constant", "maximum"]
    dot = next(i for i in module.entry.instructions if i.opcode is Opcode.DOT)
    assert dot in fusion.operands
    # a scalar constant is copied into the fusion, not passed as an operand
    assert all(op.opcode is not Opcode.CONSTANT for op in fusion.operands)


MULTI_USER_EXP = """
HloModule multi_user_exp

ENTRY main {
  x = f32[32,32] parameter(0)
  y = f32[32,32] parameter(1)
  e = f32[32,32] exponential(x)
  a = f32[32,32] add(e, y)
  n = f32[32,32] negate(a)
  m = f32[32,32] multiply(e, y)
  s = f32[32,32] sqrt(m)
  ROOT t = (f32[32,32], f32[32,32]) tuple(n, s)
}
"""


def test_expensive_multi_user_producer_is_not_duplicated():
    module = fused(MULTI_USER_EXP, (LoopFusion,))
    exps = [i for i in module.instructions() if i.opcode is Opcode.EXP]
    assert len(exps) == 1 and exps[0].parent is module.entry
    assert len(fusions(module)) == 2
    assert all(exps[0] in f.operands for f in fusions(module))


CHEAP_BROADCAST = """
HloModule cheap_broadcast

ENTRY main {
  x = f32[32,32] parameter(0)
  y = f32[32,32] parameter(1)
  s = f32[] parameter(2)
  b = f32[32,32] broadcast(s), dimensions={}
  a = f32[32,32] add(x, b)
  m = f32[32,32] multiply(y, b)
  ROOT t = (f32[32,32], f32[32,32]) tuple(a, m)
}
"""


def test_cheap_multi_user_broadcast_is_duplicated():
    module = fused(CHEAP_BROADCAST, (LoopFusion,))
    assert "broadcast" not in entry_ops(module)
    fs = fusions(module)
    assert len(fs) == 2
    assert all(body_ops(f).count("broadcast") == 1 for f in fs)
    assert all(any(op.name == "s" for op in f.operands) for f in fs)


CHEAP_SHARED_ADD = """
HloModule shared_add

ENTRY main {
  x = f32[32,32] parameter(0)
  y = f32[32,32] parameter(1)
  a = f32[32,32] add(x, y)
  n = f32[32,32] negate(a)
  d = f32[16,64] reshape(a)
  ROOT t = (f32[32,32], f32[16,64], f32[32,32]) tuple(n, d, a)
}
"""


def test_cheap_producer_that_must_stay_is_not_duplicated():
    # `a` reads twice the bytes it writes and is also an output, so copying it into its
    # users would add memory traffic: it stays a kernel of its own.
    module = fused(CHEAP_SHARED_ADD, (LoopFusion,))
    assert entry_ops(module).count("add") == 1
    assert not any("add" in body_ops(f) for f in fusions(module))


EXPENSIVE_INTO_BROADCAST = """
HloModule reuse

ENTRY main {
  v = f32[64] parameter(0)
  big = f32[128,64] parameter(1)
  e = f32[64] exponential(v)
  b = f32[128,64] broadcast(e), dimensions={1}
  ROOT r = f32[128,64] add(big, b)
}
"""


def test_expensive_producer_not_fused_into_a_consumer_that_reuses_it():
    module = fused(EXPENSIVE_INTO_BROADCAST, (LoopFusion,))
    assert "exponential" in entry_ops(module)
    (fusion,) = fusions(module)
    assert body_ops(fusion) == ["add", "broadcast"]


SOFTMAX = """
HloModule softmax

max_f32 {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT m = f32[] maximum(a, b)
}

add_f32 {
  a.1 = f32[] parameter(0)
  b.1 = f32[] parameter(1)
  ROOT s = f32[] add(a.1, b.1)
}

ENTRY main {
  logits = f32[32,128] parameter(0)
  bias = f32[128] parameter(1)
  bb = f32[32,128] broadcast(bias), dimensions={1}
  x = f32[32,128] add(logits, bb)
  ninf = f32[] constant(-inf)
  mx = f32[32] reduce(x, ninf), dimensions={1}, to_apply=max_f32
  mb = f32[32,128] broadcast(mx), dimensions={0}
  sh = f32[32,128] subtract(x, mb)
  e = f32[32,128] exponential(sh)
  zero = f32[] constant(0)
  sum = f32[32] reduce(e, zero), dimensions={1}, to_apply=add_f32
  sb = f32[32,128] broadcast(sum), dimensions={0}
  ROOT y = f32[32,128] divide(e, sb)
}
"""


def test_softmax_makes_reduction_fusions():
    module = parse_module(SOFTMAX)
    run_passes(module, (LoopFusion,))
    kinds = [str(f.attrs["kind"]) for f in fusions(module)]
    assert kinds == ["kInput", "kLoop", "kLoop"]
    (max_fusion, exp_fusion, div_fusion) = fusions(module)
    # the cheap bias add is computed again inside both of its users
    assert body_ops(max_fusion) == ["add", "broadcast", "constant", "reduce"]
    assert body_ops(exp_fusion) == ["add", "broadcast", "broadcast", "exponential", "subtract"]
    assert body_ops(div_fusion) == ["broadcast", "divide"]
    # the exp has two users (the sum and the divide): computed once, not duplicated, and
    # the sum, whose only producer is that exp, stays a plain reduce
    assert sum(body_ops(f).count("exponential") for f in fusions(module)) == 1
    assert entry_ops(module).count("reduce") == 1
    # reducer computations are left alone
    assert [i.opcode.text for i in module.get_computation("add_f32").instructions] == [
        "parameter",
        "parameter",
        "add",
    ]


def test_softmax_multi_output_keeps_exp_once():
    module = parse_module(SOFTMAX)
    run_passes(module, BOTH)
    fs = fusions(module)
    assert sum(body_ops(f).count("exponential") for f in fs) == 1
    (multi,) = [f for f in fs if f.shape.is_tuple]
    assert str(multi.attrs["kind"]) == "kInput"
    assert "exponential" in body_ops(multi) and "reduce" in body_ops(multi)
    gtes = [i for i in module.entry.instructions if i.opcode is Opcode.GET_TUPLE_ELEMENT]
    assert {g.attrs["index"] for g in gtes} == {0, 1}
    assert all(g.operands == [multi] for g in gtes)


REDUCE_PRODUCER = """
HloModule reduce_producer

add_f32 {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY main {
  x = f32[16,16] parameter(0)
  e = f32[16,16] exponential(x)
  zero = f32[] constant(0)
  r = f32[16] reduce(e, zero), dimensions={1}, to_apply=add_f32
  ROOT n = f32[16] negate(r)
}
"""


def test_reduce_is_only_a_root():
    module = fused(REDUCE_PRODUCER)
    assert entry_ops(module) == ["parameter", "fusion", "negate"]
    (fusion,) = fusions(module)
    assert str(fusion.attrs["kind"]) == "kInput"
    assert body_ops(fusion) == ["constant", "exponential", "reduce"]


NOT_FUSIBLE = """
HloModule not_fusible

lt {
  l0 = f32[] parameter(0)
  l1 = f32[] parameter(1)
  ROOT lc = pred[] compare(l0, l1), direction=LT
}

ENTRY main {
  x = f32[64] parameter(0)
  i = s32[2,1] parameter(1)
  n = f32[64] negate(x)
  srt = f32[64] sort(n), dimensions={0}, to_apply=lt
  cc = f32[64] custom-call(n), custom_call_target="unknown_target"
  cp = f32[64] copy(x)
  a = f32[64] add(srt, cp)
  ROOT t = (f32[64], f32[64], s32[2,1]) tuple(a, cc, i)
}
"""


def test_sort_custom_call_and_copy_stay_out():
    module = parse_module(NOT_FUSIBLE)
    verify(module)
    text = module.to_text()
    assert not LoopFusion().run(module)
    assert module.to_text() == text


DYNAMIC_SLICE_CONCAT = """
HloModule movement

ENTRY main {
  x = f32[8,8] parameter(0)
  y = f32[8,8] parameter(1)
  k = s32[] parameter(2)
  t = f32[8,8] transpose(x), dimensions={1,0}
  r = f32[8,8] reverse(y), dimensions={0}
  c = f32[16,8] concatenate(t, r), dimensions={0}
  zero = f32[] constant(0)
  p = f32[18,10] pad(c, zero), padding=1_1x1_1
  z = s32[] constant(0)
  ds = f32[4,10] dynamic-slice(p, k, z), dynamic_slice_sizes={4,10}
  sl = f32[2,10] slice(ds), slice={[1:3], [0:10]}
  io = f32[2,10] iota(), iota_dimension=1
  ROOT o = f32[2,10] add(sl, io)
}
"""


def test_data_movement_ops_fuse():
    module = fused(DYNAMIC_SLICE_CONCAT, (LoopFusion,))
    assert entry_ops(module) == ["parameter", "parameter", "parameter", "fusion"]
    (fusion,) = fusions(module)
    for op in ("transpose", "reverse", "concatenate", "pad", "dynamic-slice", "slice", "iota"):
        assert op in body_ops(fusion), op


def test_parameter_limit():
    n = 70
    params = "\n".join(f"  p{i} = f32[4] parameter({i})" for i in range(n))
    negs = "\n".join(f"  n{i} = f32[4] negate(p{i})" for i in range(n))
    names = ", ".join(f"n{i}" for i in range(n))
    text = (
        f"HloModule wide\n\nENTRY main {{\n{params}\n{negs}\n"
        f"  ROOT c = f32[{4 * n}] concatenate({names}), dimensions={{0}}\n}}\n"
    )
    module = parse_module(text)
    run_passes(module, (LoopFusion,))
    for f in fusions(module):
        assert len(f.operands) <= 64
    assert entry_ops(module).count("negate") >= n - 64


FUSION_MERGE = """
HloModule merge

fc0 {
  q0 = f32[32,32] parameter(0)
  q1 = f32[32,32] parameter(1)
  ROOT qa = f32[32,32] add(q0, q1)
}

fc1 {
  r0 = f32[32,32] parameter(0)
  ROOT rn = f32[32,32] negate(r0)
}

ENTRY main {
  x = f32[32,32] parameter(0)
  y = f32[32,32] parameter(1)
  f0 = f32[32,32] fusion(x, y), kind=kLoop, calls=fc0
  ROOT f1 = f32[32,32] fusion(f0), kind=kLoop, calls=fc1
}
"""


def test_producer_fusion_merges_into_consumer_fusion():
    module = fused(FUSION_MERGE, (LoopFusion,))
    (fusion,) = fusions(module)
    assert fusion.name == "f1"
    assert body_ops(fusion) == ["add", "negate"]
    assert [c.name for c in module.computations] == ["fc1", "main"]


CUSTOM_KIND = """
HloModule custom_kind

fd {
  a = f32[8,8] parameter(0)
  b = f32[8,8] parameter(1)
  ROOT d = f32[8,8] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY main {
  x = f32[8,8] parameter(0)
  y = f32[8,8] parameter(1)
  n = f32[8,8] negate(x)
  f = f32[8,8] fusion(n, y), kind=kCustom, calls=fd
  ROOT e = f32[8,8] abs(f)
}
"""


def test_custom_fusions_are_left_alone():
    module = fused(CUSTOM_KIND)
    assert entry_ops(module).count("fusion") == 1
    f = fusions(module)[0]
    assert str(f.attrs["kind"]) == "kCustom"
    assert body_ops(f) == ["dot"]
    assert "negate" in entry_ops(module) and "abs" in entry_ops(module)


WHILE_BODY = """
HloModule loop

body {
  p = (s32[], f32[16]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  x = f32[16] get-tuple-element(p), index=1
  one = s32[] constant(1)
  j = s32[] add(i, one)
  h = f32[] constant(0.5)
  hb = f32[16] broadcast(h), dimensions={}
  y = f32[16] multiply(x, hb)
  z = f32[16] add(y, x)
  ROOT t = (s32[], f32[16]) tuple(j, z)
}

cond {
  p.1 = (s32[], f32[16]) parameter(0)
  i.1 = s32[] get-tuple-element(p.1), index=0
  n = s32[] constant(4)
  ROOT lt = pred[] compare(i.1, n), direction=LT
}

ENTRY main {
  k = s32[] parameter(0)
  x.2 = f32[16] parameter(1)
  init = (s32[], f32[16]) tuple(k, x.2)
  ROOT w = (s32[], f32[16]) while(init), condition=cond, body=body
}
"""


def test_fusion_inside_while_body():
    module = fused(WHILE_BODY)
    body = module.get_computation("body")
    ops = [i.opcode.text for i in body.instructions]
    assert ops.count("fusion") == 1
    assert "multiply" not in ops and "broadcast" not in ops
    # a lone scalar op whose only fusible operand is a constant is not wrapped
    assert ops.count("add") == 1
    (fusion,) = [i for i in body.instructions if i.opcode is Opcode.FUSION]
    assert body_ops(fusion) == ["add", "broadcast", "constant", "multiply"]


# -- multi-output fusion ---------------------------------------------------------------------

SIBLINGS = """
HloModule siblings

add_f32 {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY main {
  x = f32[64,64] parameter(0)
  c = f32[] constant(2)
  cb = f32[64,64] broadcast(c), dimensions={}
  n = f32[64,64] negate(x)
  m = f32[64,64] multiply(n, cb)
  e = f32[64,64] exponential(x)
  l = f32[64,64] log(e)
  ROOT t = (f32[64,64], f32[64,64]) tuple(m, l)
}
"""


def test_siblings_sharing_a_big_operand_become_one_fusion():
    module = parse_module(SIBLINGS)
    run_passes(module, (LoopFusion,))
    assert len(fusions(module)) == 2
    module = parse_module(SIBLINGS)
    run_passes(module, BOTH)
    (multi,) = fusions(module)
    assert multi.shape.is_tuple and len(multi.shape.tuple_shapes) == 2
    assert [op.name for op in multi.operands] == ["x"]
    assert str(multi.attrs["kind"]) == "kLoop"
    root = module.entry.root
    assert all(op.opcode is Opcode.GET_TUPLE_ELEMENT for op in root.operands)
    assert sorted(op.attrs["index"] for op in root.operands) == [0, 1]
    assert multi.attrs["calls"].root.opcode is Opcode.TUPLE


SIBLING_REDUCES = """
HloModule moments

add_f32 {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY main {
  x = f32[32,64] parameter(0)
  zero = f32[] constant(0)
  s1 = f32[32] reduce(x, zero), dimensions={1}, to_apply=add_f32
  sq = f32[32,64] multiply(x, x)
  s2 = f32[32] reduce(sq, zero), dimensions={1}, to_apply=add_f32
  s3 = f32[64] reduce(x, zero), dimensions={0}, to_apply=add_f32
  ROOT t = (f32[32], f32[32], f32[64]) tuple(s1, s2, s3)
}
"""


def test_sibling_reductions_merge_only_with_the_same_reduced_dims():
    module = fused(SIBLING_REDUCES)
    fs = fusions(module)
    multi = [f for f in fs if f.shape.is_tuple]
    assert len(multi) == 1
    assert body_ops(multi[0]).count("reduce") == 2
    assert str(multi[0].attrs["kind"]) == "kInput"
    # the column sum runs a different loop and stays apart
    column = module.entry.root.operands[2]
    assert column.opcode is Opcode.REDUCE and column.attrs["dimensions"] == (0,)


SMALL_SIBLINGS = SIBLINGS.replace("64,64", "2,2")


def test_siblings_with_a_small_shared_operand_are_not_merged():
    module = fused(SMALL_SIBLINGS)
    assert len(fusions(module)) == 2
    assert not any(f.shape.is_tuple for f in fusions(module))


CYCLE = """
HloModule cycle

ENTRY main {
  x = f32[64,64] parameter(0)
  e = f32[64,64] exponential(x)
  n = f32[64,64] negate(e)
  ROOT c = f32[64,64] add(e, n)
}
"""


def test_cycle_creating_fusion_is_refused():
    module = parse_module(CYCLE)
    entry = module.entry
    e, n, c = (entry.get_instruction(k) for k in ("e", "n", "c"))
    reach = Reachability(entry)
    assert MultiOutputFusion.creates_cycle(reach, e, c)  # c also reads e through n
    assert not MultiOutputFusion.creates_cycle(reach, e, n)
    run_passes(module, (MultiOutputFusion,))
    # e went into n's fusion (the safe consumer) as a second output; c reads both outputs
    (multi,) = fusions(module)
    assert sorted(body_ops(multi)) == ["exponential", "negate", "tuple"]
    c = module.entry.root
    assert c.opcode is Opcode.ADD
    assert all(
        op.opcode is Opcode.GET_TUPLE_ELEMENT and op.operands == [multi] for op in c.operands
    )


DEPENDENT_SIBLINGS = """
HloModule dependent

ENTRY main {
  x = f32[64,64] parameter(0)
  s = f32[64,64] sqrt(x)
  e = f32[64,64] exponential(s)
  t = f32[64,64] tanh(x)
  a = f32[64,64] add(t, e)
  ROOT r = (f32[64,64], f32[64,64], f32[64,64]) tuple(a, s, e)
}
"""


def test_siblings_that_depend_on_each_other_are_not_merged():
    module = parse_module(DEPENDENT_SIBLINGS)
    entry = module.entry
    reach = Reachability(entry)
    s, a = entry.get_instruction("s"), entry.get_instruction("a")
    assert reach.reaches(s, a) and not reach.reaches(a, s)
    run_passes(module, (LoopFusion,))
    # sqrt and the add's fusion both read x, but the fusion reads the sqrt: no sibling merge
    run_passes(module, (MultiOutputFusion,))
    # the sqrt and the exp went into the add's fusion as producers with extra outputs instead
    (multi,) = fusions(module)
    assert [op.name for op in multi.operands] == ["x"]
    assert body_ops(multi) == ["add", "exponential", "sqrt", "tanh", "tuple"]
    assert len(multi.shape.tuple_shapes) == 3


# -- the JAX programs ------------------------------------------------------------------------

NAMES = list(PROGRAMS)


@pytest.mark.parametrize("form", ["lowered", "optimized"])
@pytest.mark.parametrize("name", NAMES)
def test_jax_program_results_unchanged(name, form):
    prog = PROGRAMS[name]
    module = parse_module(getattr(hlo_texts(prog), form))
    with prog.context():
        args = prog.args()
    run_passes(module, BOTH, args, f"{name} ({form})")


def _count(module: HloModule) -> tuple[int, int, int]:
    """(instructions outside fused computations, fusions, loop/input fusions)."""
    fused_comps = {id(i.attrs["calls"]) for i in module.instructions() if i.opcode is Opcode.FUSION}
    outside = sum(len(c.instructions) for c in module.computations if id(c) not in fused_comps)
    fs = [i for i in module.instructions() if i.opcode is Opcode.FUSION]
    loopish = [f for f in fs if str(f.attrs.get("kind")) in ("kLoop", "kInput")]
    return outside, len(fs), len(loopish)


@pytest.mark.parametrize(
    "name", ["mlp_train_step", "transformer_block_grad", "layer_norm_and_gelu"]
)
def test_fusion_statistics(name, capsys):
    texts = hlo_texts(PROGRAMS[name])
    module = parse_module(texts.lowered)
    before, _, _ = _count(module)
    lf, mof = run_passes(module, BOTH, random_args(module, 3), name)
    after, n_fusions, _ = _count(module)
    xla_outside, xla_fusions, xla_loop = _count(parse_module(texts.optimized))
    assert lf.fusions_made > 0 and after < before
    with capsys.disabled():
        print(
            f"\n[fusion stats] {name}: {before} -> {after} unfused instructions; "
            f"{lf.fusions_made} loop/input fusions ({lf.producers_fused} producers fused), "
            f"{mof.fusions_made} multi-output merges, {n_fusions} fusions in all | "
            f"XLA optimized: {xla_fusions} fusions ({xla_loop} kLoop/kInput), "
            f"{xla_outside} unfused instructions"
        )


# -- in-place dynamic-update-slice roots (LoopFusion's in_place_roots) --------------------

DUS_UPDATE = """
HloModule dus

ENTRY main {
  cache = f32[8,16,4] parameter(0)
  new = f32[6,4] parameter(1)
  i = s32[] parameter(2)
  fi = f32[] convert(i)
  b = f32[6,4] broadcast(fi), dimensions={}
  m = f32[6,4] multiply(new, b)
  r = f32[1,6,4] reshape(m)
  eight = s32[] constant(8)
  row = s32[] and(i, eight)
  z = s32[] constant(0)
  ROOT d = f32[8,16,4] dynamic-update-slice(cache, r, row, i, z)
}
"""


def _in_place_fusion():
    return LoopFusion(in_place_roots=True)


def test_dynamic_update_slice_is_not_a_fusion_root_when_switched_off():
    module = parse_module(DUS_UPDATE)
    LoopFusion(in_place_roots=False).run(module)
    verify(module)
    assert "dynamic-update-slice" in entry_ops(module)
    assert all(f.attrs["calls"].root.opcode is not Opcode.DYNAMIC_UPDATE_SLICE
               for f in fusions(module))  # fmt: skip


def test_dynamic_update_slice_root_takes_in_its_update_and_indices():
    from xlapy.analysis.dataflow import in_place_operands

    for seed, i in ((1, 2), (2, 9), (3, -3)):
        module = parse_module(DUS_UPDATE)
        args = [*random_args(module, seed)[:2], np.array(i, np.int32)]
        run_passes(module, (_in_place_fusion,), args=args)
    (fusion,) = fusions(module)
    assert entry_ops(module) == ["parameter"] * 3 + ["fusion"]
    assert str(fusion.attrs["kind"]) == "kLoop"
    comp = fusion.attrs["calls"]
    assert comp.root.opcode is Opcode.DYNAMIC_UPDATE_SLICE
    assert comp.root.operands[0].opcode is Opcode.PARAMETER
    assert fusion.operands[comp.root.operands[0].parameter_number].name == "cache"
    assert {"multiply", "broadcast", "convert", "and"} <= set(body_ops(fusion))
    assert in_place_operands(fusion) == [((), comp.root.operands[0].parameter_number, ())]


DUS_OWN_SLICE = """
HloModule dus_self

ENTRY main {
  c = f32[16,4] parameter(0)
  i = s32[] parameter(1)
  z = s32[] constant(0)
  s = f32[2,4] slice(c), slice={[3:5], [0:4]}
  e = f32[2,4] exponential(s)
  ROOT d = f32[16,4] dynamic-update-slice(c, e, i, z)
}
"""


def test_producer_reading_the_updated_operand_stays_out():
    module = parse_module(DUS_OWN_SLICE)
    run_passes(module, (_in_place_fusion,), args=[random_args(module, 3)[0], np.array(7, np.int32)])
    assert "dynamic-update-slice" in entry_ops(module)
    (fusion,) = fusions(module)
    assert {"slice", "exponential"} <= set(body_ops(fusion))


def test_dynamic_update_slice_fusion_is_never_a_producer_or_sibling():
    module = parse_module(DUS_UPDATE.replace(
        "ROOT d = f32[8,16,4] dynamic-update-slice(cache, r, row, i, z)",
        "d = f32[8,16,4] dynamic-update-slice(cache, r, row, i, z)\n"
        "  ROOT n = f32[8,16,4] negate(d)",
    ))  # fmt: skip
    run_passes(module, (_in_place_fusion, MultiOutputFusion))
    roots = [f.attrs["calls"].root.opcode.text for f in fusions(module)]
    assert roots == ["dynamic-update-slice"]
    assert "negate" in entry_ops(module)


# -- duplication of multi-user producers (XLA's rules) ---------------------------------------


def residual_stream(layers: int, dtype: str = "f32") -> str:
    """A pre-norm residual stream: x_k = x_{k-1} + relu(center(x_{k-1}) @ w_k + b_k), where
    center subtracts the row mean (a reduction on the path from x_{k-1} to its users)."""
    body = [
        "  x0 = f32[8,16] parameter(0)",
        "  zero = f32[] constant(0)",
        "  n = f32[] constant(16)",
        "  nb = f32[8] broadcast(n), dimensions={}",
    ]
    for k in range(1, layers + 1):
        body += [
            f"  w{k} = f32[16,16] parameter({k})",
            f"  b{k} = f32[16] parameter({layers + k})",
            f"  s{k} = f32[8] reduce(x{k - 1}, zero), dimensions={{1}}, to_apply=add_f32",
            f"  mu{k} = f32[8] divide(s{k}, nb)",
            f"  mub{k} = f32[8,16] broadcast(mu{k}), dimensions={{0}}",
            f"  c{k} = f32[8,16] subtract(x{k - 1}, mub{k})",
            f"  d{k} = f32[8,16] dot(c{k}, w{k}), lhs_contracting_dims={{1}}, "
            "rhs_contracting_dims={0}",
            f"  bb{k} = f32[8,16] broadcast(b{k}), dimensions={{1}}",
            f"  h{k} = f32[8,16] add(d{k}, bb{k})",
            f"  zb{k} = f32[8,16] broadcast(zero), dimensions={{}}",
            f"  r{k} = f32[8,16] maximum(h{k}, zb{k})",
            f"  x{k} = f32[8,16] add(x{k - 1}, r{k})",
        ]
    body[-1] = body[-1].replace(f"  x{layers} =", f"  ROOT x{layers} =")
    return (
        "HloModule residual\n\nadd_f32 {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n"
        "  ROOT s = f32[] add(a, b)\n}\n\nENTRY main {\n" + "\n".join(body) + "\n}\n"
    )


def fused_op_count(module: HloModule, opcode: Opcode) -> int:
    """How many `opcode` instructions run: in the entry and in every fused body."""
    count = sum(1 for i in module.entry.instructions if i.opcode is opcode)
    return count + sum(body_ops(f).count(opcode.text) for f in fusions(module))


@pytest.mark.parametrize("layers", [1, 4, 8])
def test_residual_stream_is_not_recomputed_in_every_layer(layers):
    # x_{k-1} = add(x_{k-2}, r) reads two arrays as large as itself, and one path to its
    # users runs through the row-mean reduction, which cannot take it in: XLA's rule marks it
    # do-not-duplicate, so each residual add runs once (before: 2 + 4 + ... adds, the whole
    # stream from x_0 recomputed inside every layer's kernels, 32 adds for 4 layers).
    module = fused(residual_stream(layers), (LoopFusion,))
    assert fused_op_count(module, Opcode.ADD) == 2 * layers
    assert fused_op_count(module, Opcode.MAXIMUM) == layers


def test_residual_stream_runs_like_the_interpreter():
    from xlapy.runtime.client import Client

    module = parse_module(residual_stream(4))
    args = random_args(module, 11)
    expected = evaluate(module, args)
    client = Client("cpu")
    exe = client.compile(residual_stream(4))
    (out,) = exe.execute([[client.buffer_from_pyval(a) for a in args]])[0]
    np.testing.assert_allclose(np.asarray(out), expected, rtol=2e-5, atol=2e-5)


LIGHT_SHARED = """
HloModule light

ENTRY main {
  x = f32[64,32] parameter(0)
  b = f32[32] parameter(1)
  bb = f32[64,32] broadcast(b), dimensions={1}
  a = f32[64,32] add(x, bb)
  n = f32[64,32] negate(a)
  m = f32[64,32] multiply(a, a)
  ROOT t = (f32[64,32], f32[64,32]) tuple(n, m)
}
"""


def test_effectively_unary_producer_is_duplicated():
    # add(x, broadcast(b)) reads one large array (the broadcast is negligible): copying it
    # into both users reads x twice instead of writing and reading `a`, so it is duplicated
    module = fused(LIGHT_SHARED, (LoopFusion,))
    assert "add" not in entry_ops(module)
    assert fused_op_count(module, Opcode.ADD) == 2


GATHER_SHARED = """
HloModule gather_shared

ENTRY main {
  table = f32[50,16] parameter(0)
  ids = s32[8,1] parameter(1)
  g = f32[8,16] gather(table, ids), offset_dims={1}, collapsed_slice_dims={0},
    start_index_map={0}, index_vector_dim=1, slice_sizes={1,16}
  n = f32[8,16] negate(g)
  m = f32[8,16] multiply(g, g)
  ROOT t = (f32[8,16], f32[8,16]) tuple(n, m)
}
"""


def test_gather_is_not_duplicated():
    # XLA counts a gather as expensive: an embedding lookup with several users runs once
    module = parse_module(GATHER_SHARED)
    args = [
        np.random.default_rng(5).standard_normal((50, 16)).astype(np.float32),
        np.array([[3], [7], [0], [49], [3], [12], [30], [8]], np.int32),
    ]
    run_passes(module, (LoopFusion,), args)
    assert fused_op_count(module, Opcode.GATHER) == 1


WIDENING_CONVERT = """
HloModule widen

ENTRY main {
  x = bf16[64,32] parameter(0)
  y = f32[64,32] parameter(1)
  c = f32[64,32] convert(x)
  e = f32[64,32] exponential(c)
  m = f32[64,32] multiply(c, y)
  ROOT t = (f32[64,32], f32[64,32]) tuple(e, m)
}
"""


def test_widening_convert_is_duplicated():
    module = fused(WIDENING_CONVERT, (LoopFusion,))
    assert "convert" not in entry_ops(module)
    assert fused_op_count(module, Opcode.CONVERT) == 2


@pytest.mark.parametrize("fraction", [0.0, 0.25, 1.0])
def test_duplicated_work_is_bounded(fraction):
    # a long cheap unary chain with two users: copies may add at most `fraction` of the
    # computation's arithmetic (26 ops of 2048 elements); unbounded, the chain is copied
    # whole into both users (48 negates)
    chain = ["  x = f32[64,32] parameter(0)", "  v0 = f32[64,32] negate(x)"]
    for k in range(1, 24):
        chain.append(f"  v{k} = f32[64,32] negate(v{k - 1})")
    chain += [
        "  e = f32[64,32] exponential(v23)",
        "  l = f32[64,32] log(v23)",
        "  ROOT t = (f32[64,32], f32[64,32]) tuple(e, l)",
    ]
    text = "HloModule chain\n\nENTRY main {\n" + "\n".join(chain) + "\n}\n"
    module = fused(
        text,
        (functools.partial(LoopFusion, max_duplicated_fraction=fraction, min_duplicated_work=0),),
    )
    assert 24 <= fused_op_count(module, Opcode.NEGATE) <= 24 + int(fraction * 26)
    assert fused_op_count(module, Opcode.EXP) == 1


# An LSTM's backward step: four gate gradients joined by a concatenate that a dot reads (it
# is written to memory anyway) and that the bias gradient's reduce reads too.
GATES_JOINED = """
HloModule gates_joined

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}

ENTRY main {
  g = f32[4,8] parameter(0)
  h = f32[4,8] parameter(1)
  w = f32[32,6] parameter(2)
  x0 = f32[4,8] multiply(g, h)
  x1 = f32[4,8] add(g, h)
  x2 = f32[4,8] subtract(g, h)
  x3 = f32[4,8] multiply(x0, h)
  cat = f32[4,32] concatenate(x0, x1, x2, x3), dimensions={1}
  d = f32[4,6] dot(cat, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  z = f32[] constant(0)
  bias = f32[32] reduce(cat, z), dimensions={0}, to_apply=add
  ROOT t = (f32[4,6], f32[32]) tuple(d, bias)
}
"""


def test_a_concatenate_of_computed_values_is_not_copied_into_a_second_user():
    """Copied into the reduce, the concatenate would compute all four gradients at each
    element and select one; the reduce reads the fusion that writes it instead."""
    module = fused(GATES_JOINED, (LoopFusion,))
    cats = [i for i in module.instructions() if i.opcode is Opcode.CONCATENATE]
    assert len(cats) == 1
    (reduce,) = [i for i in module.instructions() if i.opcode is Opcode.REDUCE]
    writer = cats[0].parent
    assert reduce.parent is not writer
    fs = fusions(module)
    assert any(f.attrs["calls"] is writer for f in fs)
    # but a concatenate of parameters is copied as before: nothing is computed twice
    plain = GATES_JOINED.replace(
        "cat = f32[4,32] concatenate(x0, x1, x2, x3)", "cat = f32[4,32] concatenate(g, h, g, h)"
    )
    module = fused(plain, (LoopFusion,))
    assert len([i for i in module.instructions() if i.opcode is Opcode.CONCATENATE]) == 2
