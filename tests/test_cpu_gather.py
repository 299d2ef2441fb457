"""The CPU backend's gather kernel (elemental.py's gather rule) against the interpreter, bit
for bit: a table of dimension-number arrangements (row gathers, 1-D takes, label picks with
and without batching dims, 2-D batches, index_vector_dim first or in the middle, windows
wider than one that clamp, window dims before batch dims) crossed with index and element
types and non-default layouts, on random data with out-of-range indices; and gathers the
emitter declines keep the library path."""

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

RNG = np.random.default_rng(20261207)

# name -> (operand dims, indices dims, result dims, attributes, the operand dim each index
# component addresses: indices are drawn around that dim's size)
ARRANGEMENTS = {
    "rows": (
        (8, 5), (12, 1), (12, 5),
        "offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, "
        "slice_sizes={1,5}", (0,),
    ),
    "rows_implicit_vector": (
        (8, 5), (12,), (12, 5),
        "offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, "
        "slice_sizes={1,5}", (0,),
    ),
    "take_1d": (
        (10,), (7,), (7,),
        "offset_dims={}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, "
        "slice_sizes={1}", (0,),
    ),
    "label_pick_pairs": (
        (6, 10), (6, 2), (6,),
        "offset_dims={}, collapsed_slice_dims={0,1}, start_index_map={0,1}, index_vector_dim=1, "
        "slice_sizes={1,1}", (0, 1),
    ),
    "label_pick_batching": (
        (6, 10), (6, 1), (6,),
        "offset_dims={}, collapsed_slice_dims={1}, start_index_map={1}, "
        "operand_batching_dims={0}, start_indices_batching_dims={0}, index_vector_dim=1, "
        "slice_sizes={1,1}", (1,),
    ),
    "batch_2d": (
        (8, 5), (3, 4, 1), (3, 4, 5),
        "offset_dims={2}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=2, "
        "slice_sizes={1,5}", (0,),
    ),
    "vector_dim_middle": (
        (7, 9, 5), (3, 2, 4), (3, 4, 5),
        "offset_dims={2}, collapsed_slice_dims={0,1}, start_index_map={1,0}, "
        "index_vector_dim=1, slice_sizes={1,1,5}", (1, 0),
    ),
    "vector_dim_first": (
        (7, 9), (2, 11), (11,),
        "offset_dims={}, collapsed_slice_dims={0,1}, start_index_map={0,1}, index_vector_dim=0, "
        "slice_sizes={1,1}", (0, 1),
    ),
    "wide_windows_clamp": (
        (9, 8), (10, 2), (10, 3, 4),
        "offset_dims={1,2}, collapsed_slice_dims={}, start_index_map={0,1}, index_vector_dim=1, "
        "slice_sizes={3,4}", (0, 1),
    ),
    "partial_uncollapsed": (
        (9, 8, 6), (10, 1), (10, 1, 8, 2),
        "offset_dims={1,2,3}, collapsed_slice_dims={}, start_index_map={0}, index_vector_dim=1, "
        "slice_sizes={1,8,2}", (0,),
    ),
    "window_before_batch": (
        (8, 5), (12, 1), (5, 12),
        "offset_dims={0}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, "
        "slice_sizes={1,5}", (0,),
    ),
    "batching": (
        (3, 8, 4), (3, 10, 1), (3, 10, 4),
        "offset_dims={2}, collapsed_slice_dims={1}, start_index_map={1}, "
        "operand_batching_dims={0}, start_indices_batching_dims={0}, index_vector_dim=2, "
        "slice_sizes={1,1,4}", (1,),
    ),
    "batching_after_vector_dim": (
        (3, 8, 4), (1, 10, 3), (10, 3, 4),
        "offset_dims={2}, collapsed_slice_dims={1}, start_index_map={1}, "
        "operand_batching_dims={0}, start_indices_batching_dims={2}, index_vector_dim=0, "
        "slice_sizes={1,1,4}", (1,),
    ),
}  # fmt: skip

TYPES = {
    "f32": np.float32,
    "bf16": ml_dtypes.bfloat16,
    "s32": np.int32,
    "pred": np.bool_,
    "f64": np.float64,
    "u8": np.uint8,
}
INDEX_TYPES = {
    "s32": np.int32,
    "s64": np.int64,
    "u32": np.uint32,
    "u64": np.uint64,
    "s8": np.int8,
    "u16": np.uint16,
}


def _shape(t: str, dims, layout: str = "") -> str:
    return f"{t}[{','.join(map(str, dims))}]{layout}"


def _module(arrangement: str, t: str, index_type: str = "s32", layouts=("", "", "")) -> str:
    operand, indices, result, attrs, _ = ARRANGEMENTS[arrangement]
    return f"""HloModule gather_{arrangement}_{t}_{index_type}

ENTRY main {{
  x = {_shape(t, operand, layouts[0])} parameter(0)
  i = {_shape(index_type, indices, layouts[1])} parameter(1)
  ROOT g = {_shape(t, result, layouts[2])} gather(x, i), {attrs}
}}
"""


def _values(dims, dtype) -> np.ndarray:
    """Random values; floats also with NaN, +-0 and +-inf (a gather moves them unchanged)."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return RNG.integers(0, 2, dims).astype(bool)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return RNG.integers(info.min, info.max, dims, endpoint=True).astype(dtype)
    x = (RNG.standard_normal(dims) * 4).astype(dtype)
    flat = x.reshape(-1)
    picks = RNG.choice(flat.size, size=max(flat.size // 6, 1), replace=False)
    specials = np.array([np.nan, 0.0, -0.0, np.inf, -np.inf, 1.5], dtype)
    flat[picks] = specials[RNG.integers(0, len(specials), len(picks))]
    return x


def _indices(arrangement: str, index_dtype) -> np.ndarray:
    """Indices around each addressed dim's size: some below 0, some past the end; unsigned
    types get values far out of range instead of negative ones (u64: past INT64_MAX)."""
    operand, indices, _, attrs, addressed = ARRANGEMENTS[arrangement]
    ivd = int(attrs.split("index_vector_dim=")[1].split(",")[0])
    idx = np.empty(indices, np.int64)
    moved = np.moveaxis(idx[..., None] if ivd == len(indices) else idx, ivd, -1)
    for k, d in enumerate(addressed):
        moved[..., k] = RNG.integers(-3, operand[d] + 3, moved.shape[:-1])
    dtype = np.dtype(index_dtype)
    if dtype.kind == "u":
        far = np.iinfo(dtype).max - 2 if dtype.itemsize < 8 else 2**63 + 5
        return np.where(idx < 0, far, idx).astype(dtype)
    return idx.astype(dtype)


def _bits(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a if a.dtype.kind in "biu" else a.view(f"u{a.dtype.itemsize}")


def _check(text: str, args, native: bool = True) -> None:
    listing = CpuProgram(parse_module(text)).thunk_listing()
    lines = [  # the gather alone, or fused with the ops that compute its indices
        line.strip()
        for line in listing.splitlines()
        if "= gather" in line or ("gather" in line.split("=")[0] and "= fusion" in line)
    ]
    assert lines, listing
    assert all(line.startswith("kernel") == native for line in lines), lines
    got = np.asarray(execute(parse_module(text), args, "cpu"))
    expected = np.asarray(evaluate(parse_module(text), args))
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_array_equal(_bits(got), _bits(expected))


def _run(arrangement, t="f32", index_type="s32", layouts=("", "", "")) -> None:
    operand = ARRANGEMENTS[arrangement][0]
    args = [_values(operand, TYPES[t]), _indices(arrangement, INDEX_TYPES[index_type])]
    _check(_module(arrangement, t, index_type, layouts), args)


@pytest.mark.parametrize("arrangement", sorted(ARRANGEMENTS))
def test_arrangements(arrangement):
    _run(arrangement)


@pytest.mark.parametrize("t", sorted(TYPES))
@pytest.mark.parametrize("arrangement", ["rows", "label_pick_batching"])
def test_element_types(arrangement, t):
    _run(arrangement, t)


@pytest.mark.parametrize("index_type", sorted(INDEX_TYPES))
@pytest.mark.parametrize("arrangement", ["wide_windows_clamp", "vector_dim_middle"])
def test_index_types(arrangement, index_type):
    _run(arrangement, "f32", index_type)


@pytest.mark.parametrize(
    ("arrangement", "layouts"),
    [
        ("rows", ("{0,1}", "", "{0,1}")),
        ("wide_windows_clamp", ("{0,1}", "{0,1}", "{0,2,1}")),
        ("vector_dim_middle", ("{0,2,1}", "{2,0,1}", "{1,0,2}")),
        ("batching", ("{1,2,0}", "{0,1,2}", "{0,1,2}")),
    ],
)
def test_layouts(arrangement, layouts):
    _run(arrangement, "s32", "s32", layouts)


def test_slice_as_large_as_the_operand():
    """upper = dim - size = 0: every start clamps to 0."""
    ARRANGEMENTS["whole"] = (
        (4, 6), (5, 1), (5, 4, 6),
        "offset_dims={1,2}, collapsed_slice_dims={}, start_index_map={0}, index_vector_dim=1, "
        "slice_sizes={4,6}", (0,),
    )  # fmt: skip
    _run("whole", "bf16", "s64")


def test_computed_indices():
    """Indices computed by an earlier kernel (a narrowing convert that wraps), in a module
    that goes through the whole pipeline."""
    text = """HloModule g
ENTRY main {
  x = f32[16,6] parameter(0)
  i = s64[9] parameter(1)
  n = s8[9] convert(i)
  c = s8[9,1] reshape(n)
  ROOT g = f32[9,6] gather(x, c), offset_dims={1}, collapsed_slice_dims={0},
    start_index_map={0}, index_vector_dim=1, slice_sizes={1,6}
}
"""
    idx = RNG.integers(-300, 300, 9).astype(np.int64)
    _check(text, [_values((16, 6), np.float32), idx])


def test_complex_rows_gather_is_native():
    """A gather only moves values: complex tables gather in kernels too (a {re, im} pair)."""
    text = _module("rows", "c64")
    x = (RNG.standard_normal((8, 5)) + 1j * RNG.standard_normal((8, 5))).astype(np.complex64)
    _check(text, [x, _indices("rows", np.int32)], native=True)


def test_unsupported_operand_type_keeps_library_path():
    text = _module("rows", "f8e8m0fnu")  # f8e4m3fn and friends are kernel types now
    x = np.abs(RNG.standard_normal((8, 5))).astype(ml_dtypes.float8_e8m0fnu)
    _check(text, [x, _indices("rows", np.int32)], native=False)


JAX_GATHERS = {
    "rows": (lambda t, i: t[i], lambda: (_values((20, 6), np.float32), _ids((13,), 20))),
    "label_pick": (
        lambda x, y: jnp.take_along_axis(x, y[:, None], axis=1),
        lambda: (_values((8, 10), np.float32), _ids((8,), 10)),
    ),
    "columns_clip": (
        lambda t, i: jnp.take(t, i, axis=1, mode="clip"),
        lambda: (_values((5, 9), ml_dtypes.bfloat16), _ids((4, 3), 9)),
    ),
}


def _ids(dims, n) -> np.ndarray:
    return RNG.integers(-n - 3, n + 3, dims).astype(np.int32)


@pytest.mark.parametrize("name", sorted(JAX_GATHERS))
def test_jax_gathers_are_kernels(name):
    fn, make = JAX_GATHERS[name]
    args = make()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        text = jax.jit(fn).lower(*args).as_text(dialect="hlo")
    _check(text, list(args))
