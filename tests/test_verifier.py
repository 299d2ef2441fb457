"""The HLO verifier: valid modules (hand-written and JAX's output, before and after XLA's
optimizations) pass; each kind of invalid module is rejected with a message naming the
computation and instruction."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from xlapy.errors import VerifierError
from xlapy.ir.computation import HloComputation
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.literal import Literal
from xlapy.ir.module import HloModule
from xlapy.ir.opcodes import Opcode
from xlapy.ir.parser import parse_module
from xlapy.ir.shapes import Layout, ProgramShape, Shape
from xlapy.ir.verifier import check_module, verify, verify_instruction

HEADER = (
    "HloModule valid, input_output_alias={ {0}: (0, {}, may-alias) }, buffer_donor={ (1, {}) }, "
    "entry_computation_layout={(f32[2,3]{1,0}, f32[2,3]{0,1}, s32[])->(f32[2,3]{1,0}, f32[3]{0})}"
)
VALID = (
    HEADER
    + """

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT r = f32[] add(a, b)
}

body {
  p = (s32[], f32[2,3]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  x = f32[2,3] get-tuple-element(p), index=1
  one = s32[] constant(1)
  j = s32[] add(i, one)
  y = f32[2,3] multiply(x, x)
  ROOT t = (s32[], f32[2,3]) tuple(j, y)
}

cond {
  p.1 = (s32[], f32[2,3]) parameter(0)
  i.1 = s32[] get-tuple-element(p.1), index=0
  n = s32[] constant(3)
  ROOT lt = pred[] compare(i.1, n), direction=LT
}

ENTRY main {
  x.2 = f32[2,3] parameter(0)
  y.2 = f32[2,3]{0,1} parameter(1)
  k = s32[] parameter(2)
  s = f32[2,3] add(x.2, y.2)
  init = (s32[], f32[2,3]) tuple(k, s)
  w = (s32[], f32[2,3]) while(init), condition=cond, body=body
  r.2 = f32[2,3] get-tuple-element(w), index=1
  zero = f32[] constant(0)
  red = f32[3] reduce(r.2, zero), dimensions={0}, to_apply=add
  ROOT out = (f32[2,3], f32[3]) tuple(r.2, red)
}
"""
)


def test_valid_module_passes():
    module = parse_module(VALID)
    verify(module)
    assert list(check_module(module)) == []


def _replace(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new)


# (name, edit of VALID, expected message substring)
INVALID_TEXT = [
    (
        "operand shape mismatch",
        ("s = f32[2,3] add(x.2, y.2)", "q = f32[3] parameter(3)\n  s = f32[2,3] add(x.2, q)"),
        "main/s: add: operand 1 has shape f32[3] but must have the dims of operand 0",
    ),
    (
        "declared shape mismatch",
        ("red = f32[3] reduce", "red = f32[2] reduce"),
        "main/red: declared shape f32[2] does not match the shape reduce produces, f32[3]",
    ),
    (
        "element type mismatch",
        ("s = f32[2,3] add(x.2, y.2)", "s = f32[2,3] add(x.2, k)"),
        "main/s: add: operand 1 has element type s32",
    ),
    (
        "reducer takes the wrong number of parameters",
        ("ROOT r = f32[] add(a, b)", "c = f32[] parameter(2)\n  ROOT r = f32[] add(a, b)"),
        "reducer add must take 2 parameters, takes 3",
    ),
    (
        "while condition does not return pred",
        ("ROOT lt = pred[] compare(i.1, n), direction=LT", "ROOT lt = s32[] add(i.1, n)"),
        "main/w: while: condition cond must return pred[], returns s32[]",
    ),
    (
        "while body changes the state shape",
        (
            "ROOT t = (s32[], f32[2,3]) tuple(j, y)",
            "ROOT t = (s32[], f32[2,3], s32[]) tuple(j, y, j)",
        ),
        "main/w: while: body body returns (s32[], f32[2,3], s32[])",
    ),
    (
        "alias output index out of range",
        ("{ {0}: (0, {}, may-alias) }", "{ {5}: (0, {}, may-alias) }"),
        "input_output_alias {5}: (0, {}): output index is not in the result shape",
    ),
    (
        "alias parameter does not exist",
        ("{ {0}: (0, {}, may-alias) }", "{ {0}: (7, {}, may-alias) }"),
        "the entry has no parameter 7",
    ),
    (
        "alias parameter index does not exist",
        ("{ {0}: (0, {}, may-alias) }", "{ {0}: (0, {1}, may-alias) }"),
        "parameter index is not in f32[2,3]",
    ),
    (
        "alias sizes differ",
        ("{ {0}: (0, {}, may-alias) }", "{ {1}: (0, {}, may-alias) }"),
        "output f32[3] has 12 bytes but parameter f32[2,3] has 24",
    ),
    (
        "output aliased twice",
        ("{ {0}: (0, {}, may-alias) }", "{ {0}: (0, {}, may-alias), {0}: (1, {}, may-alias) }"),
        "output {0} is aliased twice",
    ),
    (
        "parameter aliased twice",
        ("{ {0}: (0, {}, may-alias) }", "{ {0}: (0, {}, may-alias), {1}: (0, {}, may-alias) }"),
        "parameter 0 at {} is aliased twice",
    ),
    (
        "buffer donor parameter does not exist",
        ("buffer_donor={ (1, {}) }", "buffer_donor={ (4, {}) }"),
        "buffer_donor (4, {}): the entry has no parameter 4",
    ),
    (
        "buffer donor also aliased",
        ("buffer_donor={ (1, {}) }", "buffer_donor={ (0, {}) }"),
        "buffer_donor (0, {}) is also in input_output_alias",
    ),
    (
        "entry layout parameter mismatch",
        ("{(f32[2,3]{1,0}, f32[2,3]{0,1}, s32[])", "{(f32[2,3]{1,0}, f32[3,2]{0,1}, s32[])"),
        "entry_computation_layout parameter 1 is f32[3,2] but y.2 is f32[2,3]",
    ),
    (
        "entry layout result mismatch",
        ("->(f32[2,3]{1,0}, f32[3]{0})}", "->(f32[2,3]{1,0})}"),
        "entry_computation_layout result is (f32[2,3]) but main returns (f32[2,3], f32[3])",
    ),
    (
        "gte index out of range",
        (
            "r.2 = f32[2,3] get-tuple-element(w), index=1",
            "r.2 = f32[2,3] get-tuple-element(w), index=2",
        ),
        "main/r.2: get-tuple-element: index 2 is out of range",
    ),
    (
        "reduce dimension out of range",
        ("dimensions={0}, to_apply=add", "dimensions={2}, to_apply=add"),
        "main/red: reduce: reduce dimension 2 is out of range for rank 2",
    ),
]


@pytest.mark.parametrize(
    ("name", "edit", "message"), INVALID_TEXT, ids=[row[0] for row in INVALID_TEXT]
)
def test_invalid_text_module(name, edit, message):
    module = parse_module(_replace(VALID, *edit))
    with pytest.raises(VerifierError) as info:
        verify(module)
    assert message in str(info.value)


# -- invalid modules built or edited as IR objects ------------------------------------------


def _valid():
    return parse_module(VALID)


def _expect(module, message):
    with pytest.raises(VerifierError) as info:
        verify(module)
    assert message in str(info.value), str(info.value)


def test_no_entry():
    module = HloModule("m")
    p = HloInstruction("p", Opcode.PARAMETER, Shape.array("f32", (2,)), parameter_number=0)
    module.add_computation(HloComputation("c", [p]))
    _expect(module, "module m: has no entry computation")


def test_duplicate_computation_names():
    module = _valid()
    module.get_computation("cond").name = "body"
    _expect(module, "duplicate computation name 'body'")


def test_duplicate_instruction_names_across_computations():
    module = _valid()
    module.get_computation("cond").get_instruction("n").name = "one"
    _expect(module, "duplicate instruction name (names are module-wide) 'one'")


def test_operand_from_another_computation():
    module = _valid()
    main = module.entry
    foreign = module.get_computation("body").get_instruction("x")
    main.get_instruction("s").operands[1] = foreign
    _expect(module, "main/s: operand 1 (x) is not in computation main")


def test_control_predecessor_from_another_computation():
    module = _valid()
    foreign = module.get_computation("body").get_instruction("x")
    module.entry.get_instruction("s").control_predecessors.append(foreign)
    _expect(module, "main/s: control predecessor x is not in computation main")


def test_called_computation_not_in_module():
    module = _valid()
    module.computations.remove(module.get_computation("add"))
    _expect(module, "main/red: calls computation add, which is not in the module")


def test_cycle_in_computation():
    module = _valid()
    body = module.get_computation("body")
    j, y = body.get_instruction("j"), body.get_instruction("y")
    y.operands = [j, j]
    j.operands[0] = body.get_instruction("t")
    _expect(module, "body: cycle in computation body")


def test_recursive_call():
    module = _valid()
    body = module.get_computation("body")
    y = body.get_instruction("y")
    y.opcode = Opcode.CALL
    y.operands = [body.get_instruction("p")]
    y.attrs = {"to_apply": body}
    _expect(module, "body: calls itself (body -> body)")


def test_root_not_in_computation():
    module = _valid()
    module.get_computation("cond").root = module.entry.get_instruction("s")
    _expect(module, "cond: root s is not an instruction of the computation")


def test_constant_literal_shape_mismatch():
    module = _valid()
    zero = module.entry.get_instruction("zero")
    zero.literal = Literal.from_array(np.array([1.5, 2.5], np.float32))
    _expect(module, "main/zero: literal has shape f32[2] but the constant is declared f32[]")


def test_wrong_operand_count():
    module = _valid()
    s = module.entry.get_instruction("s")
    s.operands.append(s.operands[0])
    _expect(module, "main/s: add: expects 2 operands, got 3")


def test_comparator_must_return_pred():
    text = """
HloModule m

cmp {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT r = f32[] add(a, b)
}

ENTRY main {
  x = f32[4] parameter(0)
  ROOT s = f32[4] sort(x), dimensions={0}, to_apply=cmp
}
"""
    _expect(parse_module(text), "main/s: sort: comparator cmp must return pred[], returns f32[]")


def test_conditional_branch_parameter_mismatch():
    text = """
HloModule m

b0 {
  a = f32[2] parameter(0)
  ROOT n = f32[2] negate(a)
}

b1 {
  a.1 = s32[2] parameter(0)
  ROOT c = f32[2] convert(a.1)
}

ENTRY main {
  i = s32[] parameter(0)
  x = f32[2] parameter(1)
  ROOT r = f32[2] conditional(i, x, x), branch_computations={b0, b1}
}
"""
    _expect(
        parse_module(text),
        "main/r: conditional: operand 0 has shape f32[2] but parameter 0 of branch 1 b1 is s32[2]",
    )


def test_fusion_and_map_parameter_checks():
    text = """
HloModule m

fused {
  a = f32[2] parameter(0)
  ROOT n = f32[2] negate(a)
}

mapped {
  u = f32[] parameter(0)
  ROOT v = f32[] negate(u)
}

ENTRY main {
  x = f32[2] parameter(0)
  y = f32[2] parameter(1)
  f = f32[2] fusion(x, y), kind=kLoop, calls=fused
  ROOT m = f32[2] map(x, y), dimensions={0}, to_apply=mapped
}
"""
    with pytest.raises(VerifierError) as info:
        verify(parse_module(text))
    text_ = str(info.value)
    assert "2 problems in module m:" in text_
    assert (
        "main/f: fusion: fused computation fused takes 1 parameter but is given 2 operands" in text_
    )
    assert "main/m: map: mapped computation mapped takes 1 parameter but is given 2" in text_


def test_parameter_numbers_not_contiguous():
    module = _valid()
    module.entry.get_instruction("k").parameter_number = 3
    _expect(module, "main: parameter numbers [0, 1, 3] are not 0..2")


def test_parameter_number_used_twice():
    module = _valid()
    module.entry.get_instruction("k").parameter_number = 1
    _expect(module, "main: parameter number 1 is used more than once")


def test_invalid_layout():
    module = _valid()
    y = module.entry.get_instruction("y.2")
    y.shape = y.shape.with_layout(Layout((0, 2)))
    _expect(module, "main/y.2: layout {0,2} of shape (f32[2,3]) is not a permutation of 0..1")


def test_entry_layout_with_invalid_layout():
    module = _valid()
    layout = module.config.entry_computation_layout
    bad = Shape.tuple(
        [layout.result.tuple_shapes[0].with_layout(Layout((1, 1))), layout.result.tuple_shapes[1]]
    )
    module.config.entry_computation_layout = ProgramShape(layout.parameters, bad)
    _expect(module, "layout {1,1} of module valid: entry_computation_layout result at {0}")


def test_all_problems_are_listed():
    text = _replace(VALID, "red = f32[3] reduce", "red = f32[2] reduce")
    module = parse_module(text)
    module.entry.get_instruction("k").parameter_number = 3
    problems = list(check_module(module))
    assert len(problems) >= 2
    assert any(p.startswith("main/red:") for p in problems)
    assert any(p.startswith("main: parameter numbers") for p in problems)


def test_verify_instruction():
    module = _valid()
    s = module.entry.get_instruction("s")
    verify_instruction(s)
    s.shape = Shape.array("f32", (3, 2))
    with pytest.raises(VerifierError, match=r"main/s: declared shape f32\[3,2\] does not match"):
        verify_instruction(s)


# -- JAX's output verifies cleanly ----------------------------------------------------------


def _mlp_grad(params, x):
    def loss(params, x):
        w1, b1, w2 = params
        h = jax.nn.relu(x @ w1 + b1)
        return jnp.mean((h @ w2) ** 2)

    return jax.grad(loss)(params, x)


def _conv_grad(x, k):
    def f(x, k):
        y = lax.conv_general_dilated(
            x, k, (2, 1), "SAME", rhs_dilation=(1, 2), dimension_numbers=("NCHW", "OIHW", "NCHW")
        )
        return y.sum()

    return jax.grad(f, argnums=(0, 1))(x, k)


def _scan(x):
    return lax.scan(lambda c, y: (c * 0.5 + y, jnp.sin(c)), jnp.zeros(x.shape[1:]), x)


def _cond(p, x):
    return lax.cond(p > 0, lambda x: x * 2, jnp.cos, x), lax.switch(
        p.astype(jnp.int32), [jnp.sin, jnp.cos, jnp.exp], x
    )


def _sort(x, y):
    return lax.sort((x, y), dimension=1, num_keys=1), jnp.argsort(x, axis=0), lax.top_k(x, 2)


def _gather_scatter(x, idx, u):
    return x[idx], x.at[idx].add(u), jnp.take_along_axis(x, jnp.argsort(x, axis=1), axis=1)


def _rng(key):
    return jax.random.normal(key, (3, 4)), jax.random.randint(key, (5,), 0, 10)


def _misc(x):
    return (
        jnp.fft.irfft(jnp.fft.rfft(x), n=8),
        jnp.cumsum(x),
        lax.bitcast_convert_type(x, jnp.uint8),
        lax.pad(x, 0.0, ((1, -2, 1),)),
        lax.dynamic_update_slice(x, x[:2], (3,)),
    )


def _collectives(x):
    return jax.pmap(lambda v: (lax.psum(v, "i"), lax.all_gather(v, "i")), axis_name="i")(x)


F32 = np.float32
JAX_PROGRAMS = {
    "mlp_grad": (
        _mlp_grad,
        ((np.ones((3, 8), F32), np.ones((8,), F32), np.ones((8, 2), F32)), np.ones((5, 3), F32)),
    ),
    "conv_grad": (_conv_grad, (np.ones((2, 3, 9, 9), F32), np.ones((4, 3, 3, 3), F32))),
    "scan": (_scan, (np.ones((6, 3), F32),)),
    "cond": (_cond, (F32(1), np.ones((3,), F32))),
    "sort": (_sort, (np.ones((3, 4), F32), np.ones((3, 4), np.int32))),
    "gather_scatter": (
        _gather_scatter,
        (np.ones((5, 4), F32), np.array([0, 2, 1], np.int32), np.ones((3, 4), F32)),
    ),
    "rng": (_rng, (jax.random.PRNGKey(0),)),
    "misc": (_misc, (np.ones((8,), F32),)),
    "collectives": (_collectives, (np.ones((1, 4), F32),)),
}


@pytest.mark.parametrize("stage", ["lowered", "compiled"])
@pytest.mark.parametrize("name", list(JAX_PROGRAMS))
def test_jax_output_verifies(name, stage):
    fn, args = JAX_PROGRAMS[name]
    lowered = jax.jit(fn).lower(*args)
    text = lowered.as_text(dialect="hlo") if stage == "lowered" else lowered.compile().as_text()
    module = parse_module(text)
    assert list(check_module(module)) == []
    assert sum(1 for _ in module.instructions()) > 3
