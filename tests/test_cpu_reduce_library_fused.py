"""The kernel library's reductions with a prologue (codegen/emit_reduce_library.py's
"mul" and "sqdiff": a fused sum of x * y, x * x or (x - c)^2) against the interpreter and the
per-shape kernel: random shapes, reduced dims, layouts and types (f32, f64); the matcher's
exact menu (what it takes, what keeps the per-shape kernel); the init from the fusion's
constant (also -0 and R = 0); NaN and infinities; the bits of the per-shape kernel where
the order is the same (the columns order); JAX's layer-norm and column variance."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from xlapy.backends.cpu.backend import CpuProgram
from xlapy.backends.cpu.codegen.emit_reduce_library import (
    FusedReduce,
    fused_reduce_library_kernel,
    menu,
)
from xlapy.backends.cpu.runtime.kernel_thunk import KernelThunk
from xlapy.backends.interpreter import evaluate
from xlapy.ir.opcodes import Opcode
from xlapy.ir.parser import parse_module

RNG = np.random.default_rng(20261127_10)
NP = {"f32": np.float32, "f64": np.float64}
LANES = 8


def _layout(layout) -> str:
    return "" if layout is None else "{" + ",".join(map(str, layout)) + "}"


def fused_hlo(
    t: str,
    shape: tuple[int, ...],
    dims: tuple[int, ...],
    body: str,
    layout=None,
    out_layout=None,
    init: str = "0",
    reducer: str = "add",
) -> str:
    """A module whose root is a kInput fusion summing `body` over `dims`: "fx" x (through a
    reshape that moves nothing), "neg" -x, "cvt_bf16" / "cvt_f16" convert(x) of a bf16 / f16
    x, "sq" x * x, "mul" x * y (y another parameter), "sqdiff" (x - broadcast(c))^2,
    "csqdiff" (broadcast(c) - x)^2, "exp" exp(x)."""
    kept = [d for d in range(len(shape)) if d not in dims]
    dims_text = f"[{','.join(map(str, shape))}]{_layout(layout)}"
    s = f"{t}{dims_text}"
    out = f"{t}[{','.join(str(shape[d]) for d in kept)}]{_layout(out_layout)}"
    bdims = "{" + ",".join(map(str, kept)) + "}"
    narrow = {"cvt_bf16": f"bf16{dims_text}", "cvt_f16": f"f16{dims_text}"}
    params = {"sqdiff": [s, out], "csqdiff": [s, out], "mul": [s, s]}.get(
        body, [narrow.get(body, s)]
    )
    lines = [f"  p{i} = {shape} parameter({i})" for i, shape in enumerate(params)]
    if body == "fx":
        lines.append(f"  v = {s} reshape(p0)")
    elif body == "neg":
        lines.append(f"  v = {s} negate(p0)")
    elif body in narrow:
        lines.append(f"  v = {s} convert(p0)")
    elif body == "sq":
        lines.append(f"  v = {s} multiply(p0, p0)")
    elif body == "mul":
        lines.append(f"  v = {s} multiply(p0, p1)")
    elif body == "exp":
        lines.append(f"  v = {s} exponential(p0)")
    else:
        lines.append(f"  cb = {s} broadcast(p1), dimensions={bdims}")
        d = "p0, cb" if body == "sqdiff" else "cb, p0"
        lines += [f"  d = {s} subtract({d})", f"  v = {s} multiply(d, d)"]
    fparams = ", ".join(f"x{i}" for i in range(len(params)))
    entry = [f"  x{i} = {shape} parameter({i})" for i, shape in enumerate(params)]
    reduced = "{" + ",".join(map(str, dims)) + "}"
    body_text = "\n".join(lines)
    return f"""HloModule fused_{body}
r {{
  a = {t}[] parameter(0)
  b = {t}[] parameter(1)
  ROOT c = {t}[] {reducer}(a, b)
}}
fc {{
{body_text}
  i = {t}[] constant({init})
  ROOT y = {out} reduce(v, i), dimensions={reduced}, to_apply=r
}}
ENTRY e {{
{chr(10).join(entry)}
  ROOT f = {out} fusion({fparams}), kind=kInput, calls=fc
}}"""


def _fusion(text: str):
    return parse_module(text).entry_computation().root_instruction()


def _args(text: str, t: str) -> list[np.ndarray]:
    module = parse_module(text)
    types = {"f32": np.float32, "f64": np.float64, "bf16": ml_dtypes.bfloat16, "f16": np.float16}
    return [
        RNG.standard_normal(p.shape.dims).astype(types[p.shape.element_type.name.lower()])
        for p in module.entry_computation().parameters
    ]


def _fused_thunk(program: CpuProgram) -> KernelThunk:
    (thunk,) = [t for t in program.compiled.entry.thunks if t.instr.opcode is Opcode.FUSION]
    assert isinstance(thunk, KernelThunk), program.thunk_listing()
    return thunk


def _run(text: str, args, library: bool = True) -> np.ndarray:
    program = CpuProgram(parse_module(text), {"optimize": False, "reduce_library": library})
    assert (_fused_thunk(program).data is not None) == library
    return np.asarray(program.run(args))


def _close(got, want, t: str, r: int) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype
    tol = (1e-14 if t == "f64" else 2e-6) * max(r, 1) ** 0.5 * 4
    scale = max(float(np.max(np.abs(want))) if want.size else 0.0, 1.0)
    assert np.max(np.abs(got - want), initial=0.0) <= tol * scale


# (shape, reduced dims, input layout, result layout)
CASES = [
    ((37, 53), (1,), None, None),  # rows: one step + 21 left
    ((37, 53), (0,), None, None),  # columns: a register tile + outputs left to scalars
    ((37, 53), (0, 1), None, None),  # full
    ((5, 67, 19), (1,), None, None),  # middle axis
    ((6, 129, 200), (1,), None, None),  # middle axis, a tile on the stack
    ((2, 3, 1500), (0, 1), None, None),  # columns: Q above the largest tile
    ((37, 53), (1,), (0, 1), None),  # a row sum read column-major: the columns order
    ((4, 5, 6), (1,), (0, 2, 1), (0, 1)),  # permuted input layout, the result's alike
    ((4, 0, 3), (1,), None, None),  # R = 0: the init
    ((7, 1, 9), (1,), None, None),  # R = 1
    ((9, 2), (1,), None, None),  # rows shorter than a vector
]


def _reduced(shape, dims) -> int:
    return int(np.prod([shape[d] for d in dims]))


BODIES = ["fx", "neg", "cvt_bf16", "cvt_f16", "sq", "mul", "sqdiff"]


def test_the_cases_reach_every_fused_kernel_of_the_menu():
    reached = set()
    for t in ("f32",):
        for body in BODIES:
            for shape, dims, layout, out_layout in CASES:
                found = fused_reduce_library_kernel(
                    _fusion(fused_hlo(t, shape, dims, body, layout, out_layout)), LANES
                )
                assert isinstance(found, FusedReduce), (body, shape, dims, found)
                assert found.kernel.prologue == body
                reached.add(found.kernel)
    assert reached == {k for k in menu(LANES) if k.prologue != "x"}


@pytest.mark.parametrize("body", BODIES)
@pytest.mark.parametrize("case", CASES)
def test_fused_library_reductions_match_the_interpreter(case, body):
    shape, dims, layout, out_layout = case
    text = fused_hlo("f32", shape, dims, body, layout, out_layout, init="0.5")
    args = _args(text, "f32")
    want = np.asarray(evaluate(parse_module(text), args))
    got = _run(text, args)
    _close(got, want, "f32", _reduced(shape, dims))
    _close(got, _run(text, args, library=False), "f32", _reduced(shape, dims))


@pytest.mark.parametrize("body", ["sq", "mul", "sqdiff"])
def test_f64_fusions_keep_their_per_shape_kernels(body):
    text = fused_hlo("f64", (37, 53), (1,), body)
    assert "f64" in fused_reduce_library_kernel(_fusion(text), LANES)
    args = _args(text, "f64")
    want = np.asarray(evaluate(parse_module(text), args))
    _close(_run(text, args, library=False), want, "f64", 53)
    program = CpuProgram(parse_module(text), {"optimize": False})
    assert _fused_thunk(program).data is None


@pytest.mark.parametrize("body", BODIES)
@pytest.mark.parametrize("case", [((300, 64), (0,)), ((6, 129, 200), (1,)), ((3, 70, 13), (1,))])
def test_the_columns_order_gives_the_per_shape_kernels_bits(case, body):
    """The columns order folds in the per-shape column kernel's order (blocks of 32 rows,
    16 blocks a level) and each element is computed by the same operations: the same bits."""
    shape, dims = case
    text = fused_hlo("f32", shape, dims, body)
    args = _args(text, "f32")
    np.testing.assert_array_equal(_run(text, args), _run(text, args, library=False))


def test_random_geometries_against_the_interpreter():
    """Random ranks, extents, reduced dims and layouts (those the library takes run by it,
    the others by the per-shape kernel: either way the interpreter's values)."""
    taken = 0
    for _ in range(32):
        rank = int(RNG.integers(1, 4))
        shape = tuple(int(RNG.integers(1, 40)) for _ in range(rank))
        dims = tuple(sorted(RNG.choice(rank, size=int(RNG.integers(1, rank + 1)), replace=False)))
        layout = tuple(int(d) for d in RNG.permutation(rank))
        t = str(RNG.choice(["f32", "f64"]))
        body = str(RNG.choice(BODIES if t == "f32" else BODIES[:2] + BODIES[4:]))
        text = fused_hlo(t, shape, dims, body, layout)
        found = fused_reduce_library_kernel(_fusion(text), LANES)
        taken += isinstance(found, FusedReduce)
        program = CpuProgram(parse_module(text), {"optimize": False})
        assert (_fused_thunk(program).data is not None) == isinstance(found, FusedReduce)
        args = _args(text, t)
        want = np.asarray(evaluate(parse_module(text), args))
        _close(np.asarray(program.run(args)), want, t, _reduced(shape, dims))
    assert taken >= 8


@pytest.mark.parametrize("case", [((40, 33), (1,)), ((40, 33), (0,)), ((200,), (0,))])
def test_nan_infinities_and_the_init(case):
    shape, dims = case
    text = fused_hlo("f32", shape, dims, "sqdiff", init="-2.5")
    x, _ = args = _args(text, "f32")
    flat = x.reshape(-1)
    flat[RNG.choice(flat.size, size=3, replace=False)] = np.nan
    flat[RNG.choice(flat.size, size=2, replace=False)] = np.inf
    want = np.asarray(evaluate(parse_module(text), args))
    got = _run(text, args)
    assert np.array_equal(np.isnan(got), np.isnan(want)) and np.isnan(got).any()
    assert np.array_equal(np.isinf(got), np.isinf(want))
    finite = np.isfinite(want)
    _close(got[finite], want[finite], "f32", _reduced(shape, dims))


@pytest.mark.parametrize("case", [((4, 0, 3), (1,)), ((0, 5), (0,)), ((3, 0), (1,))])
def test_an_empty_sum_is_the_init_bits_and_all(case):
    shape, dims = case
    text = fused_hlo("f32", shape, dims, "mul", init="-0")
    args = _args(text, "f32")
    got = _run(text, args)
    want = np.asarray(evaluate(parse_module(text), args))
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    assert np.signbit(got).all()


REFUSED = [
    ("exp", {}, "not one the library computes"),
    ("csqdiff", {}, "not read as the library reads them"),
    ("sq", {"reducer": "maximum"}, "other than a sum"),
    ("sq", {"reducer": "multiply"}, "reducer other than"),
]


@pytest.mark.parametrize("body, kwargs, why", REFUSED)
def test_fusions_the_matcher_leaves_to_per_shape_kernels(body, kwargs, why):
    init = {"maximum": "-inf", "multiply": "1"}.get(kwargs.get("reducer", ""), "0")
    text = fused_hlo("f32", (16, 40), (1,), body, init=init, **kwargs)
    found = fused_reduce_library_kernel(_fusion(text), LANES)
    assert isinstance(found, str) and why in found
    program = CpuProgram(parse_module(text), {"optimize": False})
    assert _fused_thunk(program).data is None
    args = _args(text, "f32")
    want = np.asarray(evaluate(parse_module(text), args))
    got = np.asarray(program.run(args))
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)


def _replace(text: str, old: str, new: str) -> str:
    assert old in text
    return text.replace(old, new)


def test_the_matcher_reads_every_operand_exactly():
    base = fused_hlo("f32", (16, 40), (1,), "sqdiff")
    assert isinstance(fused_reduce_library_kernel(_fusion(base), LANES), FusedReduce)
    # c broadcast along the reduced dim instead of the kept one
    wrong = _replace(base, "broadcast(p1), dimensions={0}", "broadcast(p1), dimensions={1}")
    wrong = _replace(wrong, "p1 = f32[16] parameter(1)", "p1 = f32[40] parameter(1)")
    wrong = _replace(wrong, "x1 = f32[16] parameter(1)", "x1 = f32[40] parameter(1)")
    assert "not read as" in fused_reduce_library_kernel(_fusion(wrong), LANES)
    # (x - c) * (x - c') with two subtracts
    two = _replace(base, "v = f32[16,40] multiply(d, d)", "e = f32[16,40] subtract(p0, cb)\n"
                   "  v = f32[16,40] multiply(d, e)")  # fmt: skip
    assert "not read in the reduce input's layout" in fused_reduce_library_kernel(
        _fusion(two), LANES
    )
    # a product whose second operand is read in another layout
    mul = fused_hlo("f32", (16, 40), (1,), "mul")
    other = _replace(mul, "p1 = f32[16,40] parameter(1)", "p1 = f32[16,40]{0,1} parameter(1)")
    other = _replace(other, "x1 = f32[16,40] parameter(1)", "x1 = f32[16,40]{0,1} parameter(1)")
    assert isinstance(fused_reduce_library_kernel(_fusion(other), LANES), str)
    # the init a parameter of the fusion, not a constant
    init = _replace(mul, "i = f32[] constant(0)", "i = f32[] parameter(2)")
    init = _replace(init, "fusion(x0, x1)", "fusion(x0, x1, x2)")
    init = _replace(init, "x1 = f32[16,40] parameter(1)\n",
                    "x1 = f32[16,40] parameter(1)\n  x2 = f32[] parameter(2)\n")  # fmt: skip
    assert "not a constant" in fused_reduce_library_kernel(_fusion(init), LANES)
    # a columns-order (x - c)^2 whose result is column-major: c not contiguous
    cols = fused_hlo("f32", (6, 7, 9), (1,), "sqdiff", out_layout=(0, 1))
    assert "not contiguous" in fused_reduce_library_kernel(_fusion(cols), LANES)
    args = _args(cols, "f32")
    want = np.asarray(evaluate(parse_module(cols), args))
    _close(np.asarray(CpuProgram(parse_module(cols)).run(args)), want, "f32", 7)


def test_a_reshape_that_moves_no_element_is_read_through():
    """JAX's layer norm reads its mean as f32[N, 1] reshaped to f32[N]."""
    text = """HloModule ln
r {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}
fc {
  p0 = f32[24,100]{1,0} parameter(0)
  p1 = f32[24,1]{1,0} parameter(1)
  m = f32[24]{0} reshape(p1)
  mb = f32[24,100]{1,0} broadcast(m), dimensions={0}
  d = f32[24,100]{1,0} subtract(p0, mb)
  v = f32[24,100]{1,0} multiply(d, d)
  i = f32[] constant(0)
  ROOT y = f32[24]{0} reduce(v, i), dimensions={1}, to_apply=r
}
ENTRY e {
  x0 = f32[24,100]{1,0} parameter(0)
  x1 = f32[24,1]{1,0} parameter(1)
  ROOT f = f32[24]{0} fusion(x0, x1), kind=kInput, calls=fc
}"""
    found = fused_reduce_library_kernel(_fusion(text), LANES)
    assert isinstance(found, FusedReduce) and found.kernel.prologue == "sqdiff"
    args = _args(text, "f32")
    want = np.asarray(evaluate(parse_module(text), args))
    _close(_run(text, args), want, "f32", 100)


@pytest.mark.parametrize("program", ["layernorm", "column_mean_var"])
def test_jax_layer_norm_and_column_variance(program):
    """The fusions JAX's programs make (through the whole pipeline) reach the library."""
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    x = RNG.standard_normal((64, 96)).astype(np.float32)
    if program == "layernorm":

        def fn(x):
            mu = jnp.mean(x, axis=-1, keepdims=True)
            return jnp.mean((x - mu) ** 2, axis=-1)
    else:

        def fn(x):
            return jnp.mean(x, axis=0), jnp.var(x, axis=0)

    text = jax.jit(fn).lower(x).as_text(dialect="hlo")
    compiled = CpuProgram(parse_module(text))
    fused = [
        t
        for t in compiled.compiled.entry.thunks
        if t.instr.opcode is Opcode.FUSION and isinstance(t, KernelThunk) and t.data is not None
    ]
    assert fused, compiled.thunk_listing()
    got = compiled.run([x])
    want = evaluate(parse_module(text), [x])
    for g, w in zip(
        got if isinstance(got, (list, tuple)) else [got],
        want if isinstance(want, (list, tuple)) else [want],
        strict=True,
    ):
        _close(np.asarray(g), np.asarray(w), "f32", 96)
