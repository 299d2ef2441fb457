"""normalize-layouts: which instructions lose their lowering-given layouts (table of HLO
before and the layouts after), what is pinned (parameters, the result, control flow,
layout-sensitive modules), and JAX programs whose values and CPU results stay the same."""

from __future__ import annotations

import numpy as np
import pytest
from jax_programs import PROGRAMS, hlo_texts
from test_jax_programs import assert_leaf_matches, leaves

from xlapy.backends import execute
from xlapy.backends.interpreter import evaluate
from xlapy.ir.parser import parse_module
from xlapy.ir.verifier import verify
from xlapy.passes.layout_normalize import NormalizeLayouts
from xlapy.passes.pipelines import default_cpu_pipeline

RNG = np.random.default_rng(11)


def _layouts(text: str) -> tuple[bool, dict[str, str]]:
    module = parse_module(text)
    changed = NormalizeLayouts().run(module)
    verify(module)
    return changed, {
        i.name: str(i.shape.layout)
        for c in module.computations
        for i in c.instructions
        if i.shape.is_array and i.shape.layout is not None
    }


def test_transposed_intermediates_become_row_major():
    changed, got = _layouts("""HloModule m
ENTRY e {
  a = f32[8,4]{1,0} parameter(0)
  b = f32[8,6]{1,0} parameter(1)
  d = f32[4,6]{1,0} dot(a, b), lhs_contracting_dims={0}, rhs_contracting_dims={0}
  t = f32[6,4]{0,1} transpose(d), dimensions={1,0}
  m = f32[6,4]{0,1} multiply(t, t)
  w = f32[6,4]{1,0} parameter(2)
  ROOT s = f32[6,4]{1,0} subtract(w, m)
}""")
    assert changed
    assert got["t"] == got["m"] == "{1,0}"
    assert got["a"] == got["d"] == got["s"] == "{1,0}"


RESULT_LAYOUT = "(f32[4,6]{0,1})->(f32[6,4]{0,1}, f32[6,4]{0,1})"


def test_parameters_and_result_keep_their_layouts():
    changed, got = _layouts(
        f"HloModule m, entry_computation_layout={{{RESULT_LAYOUT}}}\n"
        """ENTRY e {
  p = f32[4,6]{0,1} parameter(0)
  t = f32[6,4]{0,1} transpose(p), dimensions={1,0}
  n = f32[6,4]{0,1} negate(t)
  a = f32[6,4]{0,1} abs(t)
  ROOT r = (f32[6,4]{0,1}, f32[6,4]{0,1}) tuple(n, a)
}"""
    )
    assert got["p"] == got["n"] == got["a"] == "{0,1}"
    assert got["t"] == "{1,0}" and changed


def test_control_flow_operands_and_results_are_pinned():
    changed, got = _layouts("""HloModule m
body {
  s = f32[3,2]{0,1} parameter(0)
  ROOT n = f32[3,2]{0,1} negate(s)
}
cond {
  q = f32[3,2]{0,1} parameter(0)
  ROOT c = pred[] constant(false)
}
ENTRY e {
  p = f32[2,3]{1,0} parameter(0)
  t = f32[3,2]{0,1} transpose(p), dimensions={1,0}
  w = f32[3,2]{0,1} while(t), condition=cond, body=body
  ROOT x = f32[3,2]{0,1} exponential(w)
}""")
    assert not changed
    assert set(got.values()) - {"{1,0}"} == {"{0,1}"}
    assert got["t"] == got["w"] == got["n"] == "{0,1}"


@pytest.mark.parametrize(
    "op",
    [
        "b = f32[4,3]{0,1} bitcast(t)",
        'b = f32[4,3]{0,1} custom-call(t), custom_call_target="f"',
    ],
)
def test_layout_sensitive_modules_are_left_alone(op):
    changed, got = _layouts(f"""HloModule m
ENTRY e {{
  p = f32[3,4]{{1,0}} parameter(0)
  t = f32[4,3]{{0,1}} transpose(p), dimensions={{1,0}}
  {op}
  ROOT r = f32[4,3]{{1,0}} negate(b)
}}""")
    assert not changed
    assert got["t"] == "{0,1}"


NAMES = [
    "mlp_train_step",
    "transformer_block_grad",
    "convnet_train_step",
    "attention_causal",
    "rnn_scan_grad",
]


@pytest.mark.parametrize("name", NAMES)
def test_programs_keep_their_values(name):
    """The normalized module computes what the lowered one does, in the interpreter and on
    the CPU backend (whose pipeline runs the pass)."""
    prog = PROGRAMS[name]
    text = hlo_texts(prog).lowered
    args = prog.args()
    expected = leaves(evaluate(parse_module(text), args))
    module = parse_module(text)
    NormalizeLayouts().run(module)
    verify(module)
    runs = {
        "normalized": leaves(evaluate(module, args)),
        "cpu": leaves(execute(parse_module(text), args, "cpu")),
    }
    for what, got in runs.items():
        assert len(got) == len(expected)
        for g, e in zip(got, expected, strict=True):
            assert_leaf_matches(g, e, prog, what)


def test_weight_gradient_dot_writes_row_major():
    """The MLP step's weight gradients: after the CPU pipeline no dot result is transposed
    and no value is read back in another layout than it was written in."""
    module = parse_module(hlo_texts(PROGRAMS["mlp_train_step"]).lowered)
    assert any(
        i.shape.is_array and i.shape.layout is not None and not i.shape.layout.is_default
        for i in module.entry.instructions
    ), "the lowering no longer transposes through layouts: this test checks nothing"
    default_cpu_pipeline(verify=False).run(module)
    for instr in module.entry.instructions:
        if instr.opcode.text in ("dot", "fusion"):
            assert instr.shape.layout is None or instr.shape.layout.is_default, instr
