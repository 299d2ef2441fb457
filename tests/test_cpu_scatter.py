"""The CPU backend's native scatter kernel (emit_scatter.py) against the interpreter, bit for
bit: a table of dimension-number arrangements (rows, partial windows, index vector first,
window dims before scatter dims, scalar updates, batching dims, 2-D scatter dims, a column
major updates layout) crossed with combiners and element types, on random data with
duplicate and out-of-bounds indices; plus scatters JAX lowers, in place and not."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from xlapy.backends import execute
from xlapy.backends.cpu.backend import CpuProgram
from xlapy.backends.interpreter import evaluate
from xlapy.ir.parser import parse_module

RNG = np.random.default_rng(20261123)

# name -> (operand dims, indices dims, updates dims, attributes, which index components
# address which operand dims: used to draw indices around each addressed dim's size)
ARRANGEMENTS = {
    "rows": (
        (8, 5), (40, 1), (40, 5),
        "update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, "
        "index_vector_dim=1", (0,),
    ),
    "partial_window": (
        (6, 7, 4), (30, 2), (30, 3, 4),
        "update_window_dims={1,2}, inserted_window_dims={0}, "
        "scatter_dims_to_operand_dims={0,1}, index_vector_dim=1", (0, 1),
    ),
    "vector_dim_first": (
        (5, 9), (2, 30), (30,),
        "update_window_dims={}, inserted_window_dims={0,1}, "
        "scatter_dims_to_operand_dims={1,0}, index_vector_dim=0", (1, 0),
    ),
    "window_before_scatter": (
        (8, 5), (40, 1), (5, 40),
        "update_window_dims={0}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, "
        "index_vector_dim=1", (0,),
    ),
    "scalar_updates": (
        (10,), (50,), (50,),
        "update_window_dims={}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, "
        "index_vector_dim=1", (0,),
    ),
    "two_row_window": (
        (9, 6), (25, 1), (25, 2, 6),
        "update_window_dims={1,2}, inserted_window_dims={}, scatter_dims_to_operand_dims={0}, "
        "index_vector_dim=1", (0,),
    ),
    "batching": (
        (3, 8, 4), (3, 20, 1), (3, 20, 4),
        "update_window_dims={2}, inserted_window_dims={1}, scatter_dims_to_operand_dims={1}, "
        "input_batching_dims={0}, scatter_indices_batching_dims={0}, index_vector_dim=2", (1,),
    ),
    "scatter_2d": (
        (8, 5), (4, 6, 1), (4, 6, 5),
        "update_window_dims={2}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, "
        "index_vector_dim=2", (0,),
    ),
}  # fmt: skip

_PARAMS = "a = T[] parameter(0)\n  b = T[] parameter(1)\n  "
COMBINERS = {
    "add": _PARAMS + "ROOT r = T[] add(a, b)",
    "multiply": _PARAMS + "ROOT r = T[] multiply(a, b)",
    "maximum": _PARAMS + "ROOT r = T[] maximum(a, b)",
    "minimum": _PARAMS + "ROOT r = T[] minimum(a, b)",
    "replace": "a = T[] parameter(0)\n  ROOT b = T[] parameter(1)",
    "keep": "ROOT a = T[] parameter(0)\n  b = T[] parameter(1)",
    "subtract": _PARAMS + "ROOT r = T[] subtract(a, b)",
}

TYPES = {"f32": np.float32, "f64": np.float64, "s32": np.int32, "bf16": ml_dtypes.bfloat16}


def _module(arrangement: str, combiner: str, t: str, index_type: str = "s32", layout="") -> str:
    operand, indices, updates, attrs, _ = ARRANGEMENTS[arrangement]
    root = COMBINERS[combiner].replace("T[]", f"{t}[]")

    def shape(ty, dims, lay=""):
        return f"{ty}[{','.join(map(str, dims))}]{lay}"

    return f"""HloModule scatter_{arrangement}_{combiner}_{t}

combine {{
  {root}
}}

ENTRY main {{
  x = {shape(t, operand)} parameter(0)
  i = {shape(index_type, indices)} parameter(1)
  u = {shape(t, updates, layout)} parameter(2)
  ROOT s = {shape(t, operand)} scatter(x, i, u), {attrs}, to_apply=combine
}}
"""


def _values(dims, dtype) -> np.ndarray:
    """Random values with repeats; floats also with NaN, +-0 and +-inf."""
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        return RNG.integers(-(2**30), 2**30, dims).astype(dtype)
    x = (RNG.standard_normal(dims) * 4).astype(dtype)
    flat = x.reshape(-1)
    picks = RNG.choice(flat.size, size=max(flat.size // 6, 1), replace=False)
    specials = np.array([np.nan, 0.0, -0.0, np.inf, -np.inf, 1.5], dtype)
    flat[picks] = specials[RNG.integers(0, len(specials), len(picks))]
    return x


def _indices(arrangement: str, index_dtype) -> np.ndarray:
    operand, indices, _, attrs, addressed = ARRANGEMENTS[arrangement]
    ivd = int(attrs.split("index_vector_dim=")[1])
    idx = np.empty(indices, np.int64)
    moved = np.moveaxis(idx[..., None] if ivd == len(indices) else idx, ivd, -1)
    for k, d in enumerate(addressed):
        moved[..., k] = RNG.integers(-2, operand[d] + 2, moved.shape[:-1])
    if np.dtype(index_dtype).kind == "u":
        idx = np.where(idx < 0, 2**31 + 7, idx)  # far out of bounds, no int64 overflow
    return idx.astype(index_dtype)


def _bits(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a if a.dtype.kind in "biu" else a.view(f"u{a.dtype.itemsize}")


def _assert_same(got, expected) -> None:
    """Bit for bit, except that a computed NaN's sign and payload are free (as in XLA)."""
    got, expected = np.asarray(got), np.asarray(expected)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    if got.dtype.kind not in "biu":
        nan = np.isnan(got.astype(np.float64))
        np.testing.assert_array_equal(nan, np.isnan(expected.astype(np.float64)))
        got, expected = np.where(nan, 0, got), np.where(nan, 0, expected)
    np.testing.assert_array_equal(_bits(got), _bits(expected))


def _check(text: str, args, native: bool = True) -> None:
    listing = CpuProgram(parse_module(text)).thunk_listing()
    lines = [line.strip() for line in listing.splitlines() if "= scatter" in line]
    assert lines, listing
    assert all(line.startswith("kernel") == native for line in lines), lines
    got = execute(parse_module(text), args, "cpu")
    expected = evaluate(parse_module(text), args)
    if isinstance(expected, tuple):
        for g, e in zip(got, expected, strict=True):
            _assert_same(g, e)
    else:
        _assert_same(got, expected)


def _run(arrangement, combiner, t, index_type="s32", layout=""):
    operand, _, updates, _, _ = ARRANGEMENTS[arrangement]
    dtype = TYPES[t]
    index_dtype = {"s32": np.int32, "s64": np.int64, "u32": np.uint32, "u64": np.uint64}
    args = [
        _values(operand, dtype),
        _indices(arrangement, index_dtype[index_type]),
        _values(updates, dtype),
    ]
    _check(_module(arrangement, combiner, t, index_type, layout), args)


@pytest.mark.parametrize("arrangement", sorted(ARRANGEMENTS))
@pytest.mark.parametrize("combiner", ["add", "replace"])
def test_arrangements(arrangement, combiner):
    _run(arrangement, combiner, "f32")


@pytest.mark.parametrize("combiner", sorted(COMBINERS))
@pytest.mark.parametrize("t", sorted(TYPES))
def test_combiners_and_types(combiner, t):
    _run("rows", combiner, t)


@pytest.mark.parametrize("combiner", ["maximum", "subtract", "multiply"])
@pytest.mark.parametrize("arrangement", ["window_before_scatter", "scalar_updates"])
def test_combiners_direct_and_scalar(arrangement, combiner):
    _run(arrangement, combiner, "f32")


@pytest.mark.parametrize("index_type", ["s64", "u32", "u64"])
def test_index_types(index_type):
    _run("partial_window", "add", "f32", index_type)


@pytest.mark.parametrize(
    ("index_type", "huge"),
    [("u64", 2**63), ("u64", 2**64 - 1), ("u64", 2**63 - 1), ("s64", 2**63 - 1)],
)
def test_indices_near_the_64_bit_limits_skip_their_window(index_type, huge):
    """A start past the operand (even one whose start + window overflows int64) skips its
    window in the interpreter and the kernel alike."""
    dtype = {"u64": np.uint64, "s64": np.int64}[index_type]
    idx = _indices("partial_window", dtype)
    idx.reshape(-1)[::3] = huge
    operand, _, updates, _, _ = ARRANGEMENTS["partial_window"]
    args = [_values(operand, np.float32), idx, _values(updates, np.float32)]
    _check(_module("partial_window", "add", "f32", index_type), args)


def test_column_major_updates():
    _run("partial_window", "add", "f64", layout="{0,1,2}")


def test_bf16_sum_rounds_each_step():
    operand = np.full((4, 3), 1.0, ml_dtypes.bfloat16)
    ids = np.zeros((300, 1), np.int32)
    ids[::3] = 2
    upd = (RNG.standard_normal((300, 3)) * 0.01 + 0.003).astype(ml_dtypes.bfloat16)
    _check(_module_for(operand.shape, 300, "bf16"), [operand, ids, upd])


def _module_for(operand_dims, n, t):
    ARRANGEMENTS[f"rows_{n}"] = (
        operand_dims,
        (n, 1),
        (n, operand_dims[1]),
        ARRANGEMENTS["rows"][3],
        (0,),
    )
    return _module(f"rows_{n}", "add", t)


def test_variadic_scatter_keeps_library_path():
    text = """HloModule two
combine {
  a = f32[] parameter(0)
  b = s32[] parameter(1)
  c = f32[] parameter(2)
  d = s32[] parameter(3)
  e = f32[] add(a, c)
  f = s32[] add(b, d)
  ROOT r = (f32[], s32[]) tuple(e, f)
}

ENTRY main {
  x = f32[6,3] parameter(0)
  y = s32[6,3] parameter(1)
  i = s32[10,1] parameter(2)
  u = f32[10,3] parameter(3)
  v = s32[10,3] parameter(4)
  ROOT s = (f32[6,3], s32[6,3]) scatter(x, y, i, u, v), update_window_dims={1},
    inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1,
    to_apply=combine
}
"""
    ids = RNG.integers(-1, 7, (10, 1)).astype(np.int32)
    args = [_values((6, 3), np.float32), _values((6, 3), np.int32), ids]
    args += [_values((10, 3), np.float32), _values((10, 3), np.int32)]
    _check(text, args, native=False)


# -- scatters JAX lowers -------------------------------------------------------------------


def _hlo(fn, *args) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return jax.jit(fn).lower(*args).as_text(dialect="hlo")


def _floats(*dims):
    return RNG.standard_normal(dims).astype(np.float32)


JAX_SCATTERS = [
    ("add", lambda x, i, u: x.at[i].add(u), lambda: (
        _floats(16, 8), RNG.integers(-20, 20, 90).astype(np.int32), _floats(90, 8))),
    ("set_drop", lambda x, i, u: x.at[i].set(u, mode="drop"), lambda: (
        _floats(16, 8), RNG.integers(-3, 19, 90).astype(np.int32), _floats(90, 8))),
    ("segment_sum", lambda d, s: jax.ops.segment_sum(d, s, num_segments=12), lambda: (
        _floats(500, 3) * 1e3, np.sort(RNG.integers(0, 14, 500)).astype(np.int32))),
    ("segment_max", lambda d, s: jax.ops.segment_max(d, s, num_segments=7), lambda: (
        _values((200, 4), np.float32), RNG.integers(0, 8, 200).astype(np.int32))),
    ("histogram", lambda i: jnp.zeros(10, jnp.int32).at[i].add(1), lambda: (
        RNG.integers(0, 12, 1000).astype(np.int32),)),
    ("embedding_grad", lambda t, i, g: jax.grad(lambda t: jnp.sum(t[i] * t[i] * g))(t), lambda: (
        _floats(30, 6), RNG.integers(0, 30, (5, 7)).astype(np.int32), _floats(5, 7, 6))),
    ("column_updates", lambda x, i, u: x.at[:, i].add(u), lambda: (
        _floats(6, 16), RNG.integers(0, 16, 40).astype(np.int32), _floats(6, 40))),
]  # fmt: skip


@pytest.mark.parametrize("name,fn,make", JAX_SCATTERS, ids=[s[0] for s in JAX_SCATTERS])
def test_jax_scatters(name, fn, make):
    args = list(make())
    _check(_hlo(fn, *args), args)
