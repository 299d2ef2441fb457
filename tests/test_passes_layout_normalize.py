"""normalize-layouts: which instructions lose their lowering-given layouts (table of HLO
before and the layouts after), what is pinned (parameters, the result, control flow,
layout-sensitive modules), and JAX programs whose values and CPU results stay the same."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
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


def test_loop_body_intermediates_become_row_major():
    """Inside a while body (and a conditional branch in it) the free values lose their
    layouts too; the body's parameter and root, and the loop's operand and result, keep
    theirs."""
    changed, got = _layouts("""HloModule m
branch {
  bp = f32[4,6]{1,0} parameter(0)
  bt = f32[6,4]{0,1} transpose(bp), dimensions={1,0}
  bn = f32[6,4]{0,1} negate(bt)
  ROOT br = f32[4,6]{1,0} transpose(bn), dimensions={1,0}
}
body {
  s = (s32[], f32[4,6]{1,0}) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  acc = f32[4,6]{1,0} get-tuple-element(s), index=1
  tr = f32[6,4]{0,1} transpose(acc), dimensions={1,0}
  d = f32[6,4]{1,0} negate(tr)
  t = f32[4,6]{0,1} transpose(d), dimensions={1,0}
  a = f32[4,6]{1,0} add(acc, t)
  one = s32[] constant(1)
  n = s32[] add(i, one)
  yes = pred[] constant(true)
  c = f32[4,6]{1,0} conditional(yes, a, a), true_computation=branch, false_computation=branch
  ROOT r = (s32[], f32[4,6]{1,0}) tuple(n, c)
}
cond {
  q = (s32[], f32[4,6]{1,0}) parameter(0)
  k = s32[] get-tuple-element(q), index=0
  three = s32[] constant(3)
  ROOT lt = pred[] compare(k, three), direction=LT
}
ENTRY e {
  p = f32[4,6]{1,0} parameter(0)
  z = s32[] constant(0)
  init = (s32[], f32[4,6]{1,0}) tuple(z, p)
  w = (s32[], f32[4,6]{1,0}) while(init), condition=cond, body=body
  ROOT x = f32[4,6]{1,0} get-tuple-element(w), index=1
}""")
    assert changed
    assert got["tr"] == got["t"] == got["bt"] == got["bn"] == "{1,0}"
    assert got["acc"] == got["a"] == got["br"] == got["bp"] == "{1,0}"
    assert set(got.values()) == {"{1,0}"}


TUPLE_IN_LOOP = """HloModule m
body {
  s = (s32[], f32[4,6]{1,0}) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  acc = f32[4,6]{1,0} get-tuple-element(s), index=1
  t = f32[6,4]{0,1} transpose(acc), dimensions={1,0}
  tp = (f32[6,4]{0,1}, s32[]) tuple(t, i)
  g = f32[6,4]{0,1} get-tuple-element(tp), index=0
  e = f32[6,4]{0,1} exponential(g)
  back = f32[4,6]{1,0} transpose(e), dimensions={1,0}
  one = s32[] constant(1)
  n = s32[] add(i, one)
  ROOT r = (s32[], f32[4,6]{1,0}) tuple(n, back)
}
cond {
  q = (s32[], f32[4,6]{1,0}) parameter(0)
  k = s32[] get-tuple-element(q), index=0
  two = s32[] constant(2)
  ROOT lt = pred[] compare(k, two), direction=LT
}
ENTRY e {
  p = f32[4,6]{1,0} parameter(0)
  z = s32[] constant(0)
  init = (s32[], f32[4,6]{1,0}) tuple(z, p)
  w = (s32[], f32[4,6]{1,0}) while(init), condition=cond, body=body
  ROOT x = f32[4,6]{1,0} get-tuple-element(w), index=1
}"""


def test_tuples_and_their_elements_keep_agreeing():
    """A tuple left by an inlined call inside a loop body: when its element is normalized,
    the tuple's shape and its get-tuple-element's follow (a get-tuple-element shares its
    element's buffer: another layout there would read the bytes transposed)."""
    changed, got = _layouts(TUPLE_IN_LOOP)
    assert changed
    assert got["t"] == got["g"] == got["e"] == "{1,0}"
    module = parse_module(TUPLE_IN_LOOP)
    NormalizeLayouts().run(module)
    for comp in module.computations:
        for instr in comp.instructions:
            if instr.opcode.text == "tuple":
                assert instr.shape.tuple_shapes == tuple(o.shape for o in instr.operands)
            if instr.opcode.text == "get-tuple-element":
                element = instr.operands[0].shape.tuple_shapes[instr.attrs["index"]]
                assert instr.shape == element, instr
    x = RNG.standard_normal((4, 6)).astype(np.float32) * 0.1
    want = evaluate(parse_module(TUPLE_IN_LOOP), [x])
    np.testing.assert_allclose(
        execute(parse_module(TUPLE_IN_LOOP), [x], "cpu"), want, rtol=1e-5, atol=1e-6
    )


def test_scan_over_layers_gradient_on_cpu_matches_the_interpreter():
    """The gradient of a scan over stacked layers: the backward loop body holds an inlined
    call's tuple whose element is a transposed dot (its layout normalized with it)."""

    def loss(ws, bs, x):
        def layer(h, wb):
            w, b = wb
            return jnp.tanh(h @ w + b) + h, None

        return jnp.mean(lax.scan(layer, x, (ws, bs))[0] ** 2)

    args = [
        (RNG.standard_normal(s) * 0.3).astype(np.float32) for s in ((5, 16, 16), (5, 16), (4, 16))
    ]
    text = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(*args).as_text(dialect="hlo")
    want = leaves(evaluate(parse_module(text), args))
    got = leaves(execute(parse_module(text), args, "cpu"))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_elements_of_a_loop_state_tuple_are_pinned():
    """A value that enters a loop's state through a tuple keeps its layout: the tuple is
    the while's operand, and the state's buffers are its elements'."""
    changed, got = _layouts("""HloModule m
body {
  s = (f32[3,2]{0,1}, s32[]) parameter(0)
  v = f32[3,2]{0,1} get-tuple-element(s), index=0
  k = s32[] get-tuple-element(s), index=1
  n = f32[3,2]{0,1} negate(v)
  ROOT r = (f32[3,2]{0,1}, s32[]) tuple(n, k)
}
cond {
  q = (f32[3,2]{0,1}, s32[]) parameter(0)
  ROOT c = pred[] constant(false)
}
ENTRY e {
  p = f32[2,3]{1,0} parameter(0)
  t = f32[3,2]{0,1} transpose(p), dimensions={1,0}
  z = s32[] constant(0)
  init = (f32[3,2]{0,1}, s32[]) tuple(t, z)
  w = (f32[3,2]{0,1}, s32[]) while(init), condition=cond, body=body
  x = f32[3,2]{0,1} get-tuple-element(w), index=0
  ROOT y = f32[3,2]{1,0} exponential(x)
}""")
    assert not changed
    assert got["t"] == got["v"] == got["n"] == got["x"] == "{0,1}"


def test_lstm_gradient_loop_reads_nothing_transposed():
    """The LSTM backward scan accumulates its weight gradients in the loop state: after the
    CPU pipeline no dot or fusion inside any loop body writes a transposed layout (the
    accumulating add would read it back transposed on every iteration)."""

    def loss(w, u, xs):
        def cell(carry, x):
            h, c = carry
            i, f, g, o = jnp.split(x @ w + h @ u, 4, axis=-1)
            c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
            h = jax.nn.sigmoid(o) * jnp.tanh(c)
            return (h, c), h

        h0 = jnp.zeros(xs.shape[1:], xs.dtype)
        return jnp.mean(lax.scan(cell, (h0, h0), xs)[1] ** 2)

    args = (
        RNG.standard_normal((8, 32)),
        RNG.standard_normal((8, 32)),
        RNG.standard_normal((5, 2, 8)),
    )
    args = tuple(a.astype(np.float32) for a in args)
    text = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(*args).as_text(dialect="hlo")
    module = parse_module(text)
    bodies = [c for c in module.computations if c is not module.entry]
    assert any(
        i.shape.is_array and i.shape.layout is not None and not i.shape.layout.is_default
        for c in bodies
        for i in c.instructions
    ), "the lowering no longer transposes through layouts in loops: this test checks nothing"
    default_cpu_pipeline(verify=False).run(module)
    fused = {
        id(c)
        for comp in module.computations
        for i in comp.instructions
        if i.opcode.text == "fusion"
        for c in i.called_computations()
    }
    for comp in module.computations:
        if id(comp) in fused:
            continue
        for instr in comp.instructions:
            if instr.opcode.text in ("dot", "fusion", "add"):
                assert instr.shape.layout is None or instr.shape.layout.is_default, instr


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


# JAX's layout-insensitive HLO: a transposed value enters a loop's state in the layout the
# transpose printed ({0,1}) while the body's parameter says {1,0} (a bidirectional GRU from
# flax did this); the body slices a row of it each step.
LOOP_LAYOUTS = """HloModule loop_layouts
body {
  p = (s32[], f32[4,3]{1,0}, f32[3]{0}) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  x = f32[4,3]{1,0} get-tuple-element(p), index=1
  acc = f32[3]{0} get-tuple-element(p), index=2
  z = s32[] constant(0)
  row = f32[1,3]{1,0} dynamic-slice(x, i, z), dynamic_slice_sizes={1,3}
  r = f32[3]{0} reshape(row)
  two = f32[] constant(2)
  twos = f32[3]{0} broadcast(two), dimensions={}
  scaled = f32[3]{0} multiply(r, twos)
  next_acc = f32[3]{0} add(acc, scaled)
  one = s32[] constant(1)
  next_i = s32[] add(i, one)
  ROOT t = (s32[], f32[4,3]{1,0}, f32[3]{0}) tuple(next_i, x, next_acc)
}
cond {
  q = (s32[], f32[4,3]{1,0}, f32[3]{0}) parameter(0)
  k = s32[] get-tuple-element(q), index=0
  n = s32[] constant(4)
  ROOT lt = pred[] compare(k, n), direction=LT
}
ENTRY e {
  a = f32[3,4]{1,0} parameter(0)
  t = f32[4,3]{0,1} transpose(a), dimensions={1,0}
  zero = s32[] constant(0)
  z3 = f32[] constant(0)
  acc0 = f32[3]{0} broadcast(z3), dimensions={}
  init = (s32[], f32[4,3]{0,1}, f32[3]{0}) tuple(zero, t, acc0)
  w = (s32[], f32[4,3]{0,1}, f32[3]{0}) while(init), condition=cond, body=body
  x_out = f32[4,3]{0,1} get-tuple-element(w), index=1
  acc_out = f32[3]{0} get-tuple-element(w), index=2
  ROOT out = (f32[3]{0}, f32[4,3]{0,1}) tuple(acc_out, x_out)
}
"""


def test_a_loop_whose_state_layouts_disagree_runs_in_the_body_parameters_layouts():
    from xlapy.backends import get_backend

    a = np.random.default_rng(7).standard_normal((3, 4)).astype(np.float32)
    want = get_backend("interpreter").compile(parse_module(LOOP_LAYOUTS)).run([a])
    for options in ({}, {"native_loops": False}):
        got = get_backend("cpu").compile(parse_module(LOOP_LAYOUTS), options).run([a])
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    np.testing.assert_array_equal(np.asarray(want[0]), 2 * a.sum(axis=1))


def test_a_loop_returned_whole_keeps_the_declared_result_layouts():
    from xlapy.backends import get_backend

    text = LOOP_LAYOUTS.replace(
        "  x_out = f32[4,3]{0,1} get-tuple-element(w), index=1\n"
        "  acc_out = f32[3]{0} get-tuple-element(w), index=2\n"
        "  ROOT out = (f32[3]{0}, f32[4,3]{0,1}) tuple(acc_out, x_out)\n",
        "",
    ).replace("  w = (s32[]", "  ROOT w = (s32[]")
    a = np.random.default_rng(8).standard_normal((3, 4)).astype(np.float32)
    want = get_backend("interpreter").compile(parse_module(text)).run([a])
    compiled = get_backend("cpu").compile(parse_module(text))
    assert compiled.module.entry.root_instruction().shape.to_text() == (
        "(s32[], f32[4,3]{0,1}, f32[3]{0})"
    )
    for g, w in zip(compiled.run([a]), want, strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


# An optimizer update as JAX hands it over in HLO text: the new state `mu2` is computed in a
# transposed gradient's order ({0,1}) and declared so, while the donated parameter it
# aliases is row-major; `other` is returned (not aliased) in {0,1}.
ALIASED_HEADER = (
    "HloModule adam, input_output_alias={ {0}: (0, {}, may-alias), {1}: (1, {}, may-alias) }, "
    "entry_computation_layout={(f32[8,6]{1,0}, f32[8,6]{1,0}, f32[6,8]{1,0})->"
)
ALIASED_UPDATE = (
    ALIASED_HEADER
    + """(f32[8,6]{1,0}, f32[8,6]{0,1}, f32[8,6]{0,1})}
ENTRY e {
  w = f32[8,6]{1,0} parameter(0)
  mu = f32[8,6]{1,0} parameter(1)
  g = f32[6,8]{1,0} parameter(2)
  t = f32[8,6]{0,1} transpose(g), dimensions={1,0}
  c = f32[] constant(0.9)
  cb = f32[8,6]{1,0} broadcast(c), dimensions={}
  m1 = f32[8,6]{1,0} multiply(mu, cb)
  mu2 = f32[8,6]{0,1} add(m1, t)
  w2 = f32[8,6]{1,0} subtract(w, mu2)
  other = f32[8,6]{0,1} negate(t)
  ROOT r = (f32[8,6]{1,0}, f32[8,6]{0,1}, f32[8,6]{0,1}) tuple(w2, mu2, other)
}"""
)


def test_an_aliased_result_takes_its_parameters_layout():
    module = parse_module(ALIASED_UPDATE)
    assert NormalizeLayouts().run(module)
    verify(module)
    by_name = {i.name: i for i in module.entry.instructions}
    assert str(by_name["mu2"].shape.layout) == "{1,0}"
    assert str(by_name["other"].shape.layout) == "{0,1}"  # not aliased: as declared
    assert by_name["r"].shape.to_text() == "(f32[8,6]{1,0}, f32[8,6]{1,0}, f32[8,6]{0,1})"
    declared = module.config.entry_computation_layout
    assert declared is not None
    assert declared.result.to_text() == "(f32[8,6]{1,0}, f32[8,6]{1,0}, f32[8,6]{0,1})"
    assert ALIASED_HEADER + "(f32[8,6]{1,0}, f32[8,6]{1,0}, f32[8,6]{0,1})}" in module.to_text()


def test_an_aliased_update_runs_in_place_on_cpu():
    """The state update writes its parameter's bytes in the order it reads them: no kernel
    runs through scratch, and the results (donated or not) are the interpreter's."""
    from xlapy.backends import get_backend
    from xlapy.backends.cpu.runtime.kernel_thunk import KernelThunk

    rng = np.random.default_rng(12)
    args = [rng.standard_normal(s).astype(np.float32) for s in ((8, 6), (8, 6), (6, 8))]
    want = get_backend("interpreter").compile(parse_module(ALIASED_UPDATE)).run(args)
    compiled = get_backend("cpu").compile(parse_module(ALIASED_UPDATE))
    kernels = [t for t in compiled.compiled.entry.thunks if isinstance(t, KernelThunk)]
    assert kernels and not any(t.scratch for t in kernels)
    for g, w in zip(compiled.run([a.copy() for a in args]), want, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6, atol=1e-6)
