"""The CPU backend's fast library paths (sort_thunk, window_thunk, indexing_thunk) against the
interpreter's rules, on HLO lowered from JAX and on hand-written HLO: NaN, -0, ties,
duplicate and out-of-bounds indices, integer wrapping. Results must match bit for bit (the
fast paths do the same operations in the same order), and each case checks whether the
fast path claimed the instruction."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

from xlapy.backends import execute
from xlapy.backends.cpu.backend import CpuProgram
from xlapy.backends.interpreter import evaluate
from xlapy.ir.opcodes import Opcode
from xlapy.ir.parser import parse_module

RNG = np.random.default_rng(20261122)


def _floats(shape, dtype=np.float32):
    """Random floats with NaN (both signs), +-0, +-inf and repeated values."""
    x = RNG.standard_normal(shape).astype(dtype)
    flat = x.reshape(-1)
    n = flat.size
    picks = RNG.choice(n, size=max(n // 3, 1), replace=False)
    specials = np.array([np.nan, -np.nan, 0.0, -0.0, np.inf, -np.inf, 1.5, 1.5], dtype)
    flat[picks] = specials[RNG.integers(0, len(specials), len(picks))]
    return x


def _ints(shape, lo=-5, hi=5, dtype=np.int32):
    return RNG.integers(lo, hi, shape).astype(dtype)


def _hlo(fn, *args) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return jax.jit(fn).lower(*args).as_text(dialect="hlo")


def _leaves(value):
    if isinstance(value, (tuple, list)):
        return [leaf for v in value for leaf in _leaves(v)]
    return [np.asarray(value)]


def _bits(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a if a.dtype.kind in "biu" else a.view(f"u{a.dtype.itemsize}")


def _assert_same(got: np.ndarray, expected: np.ndarray, moved: bool) -> None:
    """Bit for bit; where the op computes (not only moves) values, a NaN's sign is free, as
    in XLA, so NaN positions must agree and other values bit for bit."""
    assert got.dtype == expected.dtype and got.shape == expected.shape
    if not moved and got.dtype.kind not in "biu":
        nan = np.isnan(got.astype(np.float64))
        np.testing.assert_array_equal(nan, np.isnan(expected.astype(np.float64)))
        got, expected = np.where(nan, 0, got), np.where(nan, 0, expected)
    np.testing.assert_array_equal(_bits(got), _bits(expected))


def _check(text: str, args, opcode: str, fast: bool):
    module = parse_module(text)
    listing = CpuProgram(parse_module(text)).thunk_listing()
    lines = [line for line in listing.splitlines() if f"= {opcode} " in line]
    assert lines, listing
    # fast: a NumPy fast path, or a native kernel (prefix scans: codegen/emit_scan.py;
    # pooling: codegen/emit_window.py)
    scan = opcode == "reduce-window"
    claimed = [
        "fast NumPy path" in line or (scan and line.strip().startswith("kernel")) for line in lines
    ]
    assert all(c == fast for c in claimed), lines
    got = _leaves(execute(module, args, "cpu"))
    expected = _leaves(evaluate(parse_module(text), args))
    assert len(got) == len(expected)
    # native pooling kernels' max / min are IEEE maximum / minimum (-0 < +0), NumPy's may
    # return either zero of a (-0, +0) pair
    kernel = scan and any(line.strip().startswith("kernel") for line in lines)
    for g, e in zip(got, expected, strict=True):
        if kernel and g.dtype.kind == "f":
            g, e = np.where(g == 0, 0, g).astype(g.dtype), np.where(e == 0, 0, e).astype(e.dtype)
        _assert_same(g, e, moved=opcode in ("sort", "topk", "gather"))


# -- sort, argsort, topk ---------------------------------------------------------------------

SORTS = [
    ("sort_f32", jnp.sort, lambda: (_floats((257,)),)),
    ("sort_f32_axis0", lambda x: jnp.sort(x, axis=0), lambda: (_floats((33, 5)),)),
    ("sort_bf16", jnp.sort, lambda: (_floats((64,)).astype(jnp.bfloat16),)),
    ("sort_s32", jnp.sort, lambda: (_ints((100,), -(2**31), 2**31 - 1),)),
    ("sort_u8", jnp.sort, lambda: (_ints((100,), 0, 256, np.uint8),)),
    ("sort_descending", lambda x: jnp.sort(x, descending=True), lambda: (_floats((77,)),)),
    ("argsort_rows", lambda x: jnp.argsort(x, axis=1), lambda: (_floats((8, 50)),)),
    (
        "argsort_descending",
        lambda x: jnp.argsort(x, descending=True, stable=True),
        lambda: (_ints((90,)),),
    ),
    (
        "sort_two_keys",
        lambda a, b: lax.sort((a, b), num_keys=2),
        lambda: (_ints((120,), 0, 3), _floats((120,))),
    ),
    (
        "sort_key_and_payload",
        lambda a, b: lax.sort((a, b), num_keys=1),
        lambda: (_floats((64,)), _ints((64,), 0, 100)),
    ),
]


@pytest.mark.parametrize("name,fn,make", SORTS, ids=[s[0] for s in SORTS])
def test_sort_fast_path(name, fn, make):
    args = make()
    _check(_hlo(fn, *args), list(args), "sort", fast=True)


def _no_nan(shape, dtype=np.float32):
    """Random floats with +-0, +-inf and repeated values but no NaN (the pruned path)."""
    x = _floats(shape, dtype)
    return np.where(np.isnan(x), dtype(2.5), x)


def _ties(shape, dtype=np.float32):
    """Few distinct values, so the k-th largest ties across many pruning groups."""
    return RNG.integers(-2, 3, shape).astype(dtype)


def _quiet_twins(shape):
    """NaNs whose float32 payloads differ only in the quiet bit (equal once widened, as the
    interpreter compares them), of both signs, among +-0 and ordinary values."""
    x = _no_nan(shape)
    bits = x.view(np.uint32)
    rows = np.arange(shape[0])
    for col, word in ((3, 0x7F800001), (9, 0x7FC00001), (17, 0xFF800001), (30, 0xFFC00001)):
        bits[rows, col] = word
    return x


TOPKS = [
    ("k3_ties_nan", 3, lambda: _floats((6, 40))),
    ("k_all", 40, lambda: _floats((3, 40))),
    ("k_partition", 25, lambda: _floats((4, 64))),
    ("k5_ints", 5, lambda: _ints((5, 30), -3, 3)),
    ("pruned", 8, lambda: _no_nan((16, 1024))),
    ("pruned_ties", 8, lambda: _ties((8, 512))),
    ("pruned_zeros", 4, lambda: RNG.choice(np.array([0.0, -0.0], np.float32), (4, 256))),
    ("pruned_3d", 5, lambda: _no_nan((2, 3, 320))),
    ("pruned_nan_declines", 8, lambda: _floats((4, 1024))),
    ("pruned_s32", 6, lambda: _ints((8, 768), -(2**31), 2**31 - 1)),
    ("pruned_s32_ties", 6, lambda: _ints((8, 768), -2, 2)),
    ("pruned_u32", 7, lambda: _ints((8, 512), 0, 2**32 - 1, np.uint32)),
    ("quiet_twin_nans", 6, lambda: _quiet_twins((3, 256))),
    ("quiet_twin_nans_all", 256, lambda: _quiet_twins((2, 256))),
]


@pytest.mark.parametrize("name,k,make", TOPKS, ids=[t[0] for t in TOPKS])
def test_topk_fast_path(name, k, make):
    x = make()
    _check(_hlo(lambda v: lax.top_k(v, k), x), [x], "topk", fast=True)


_SMALLEST_TOPK = """
HloModule smallest
ENTRY main {
  x = DT[6,512] parameter(0)
  ROOT t = (DT[6,K], s32[6,K]) topk(x), k=K, largest=false
}
"""


@pytest.mark.parametrize("k", [1, 8, 20])
@pytest.mark.parametrize(
    "make",
    [
        lambda: _no_nan((6, 512)),
        lambda: _ties((6, 512)),
        lambda: _ints((6, 512), -3, 3),
        lambda: _quiet_twins((6, 512)),
    ],
    ids=["floats", "float_ties", "int_ties", "quiet_twin_nans"],
)
def test_topk_smallest_fast_path(k, make):
    x = make()
    dt = "f32" if x.dtype == np.float32 else "s32"
    text = _SMALLEST_TOPK.replace("DT", dt).replace("K", str(k))
    _check(text, [x], "topk", fast=True)


_CUSTOM_SORT = """
HloModule custom_sort

cmp {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  one = f32[] constant(1)
  b1 = f32[] add(b, one)
  ROOT lt = pred[] compare(a, b1), direction=LT
}

ENTRY main {
  x = f32[50] parameter(0)
  ROOT s = f32[50] sort(x), dimensions={0}, is_stable=true, to_apply=cmp
}
"""

_FLOAT_COMPARE_SORT = """
HloModule float_sort

cmp {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT lt = pred[] compare(a, b), direction=LT
}

ENTRY main {
  x = f32[50] parameter(0)
  ROOT s = f32[50] sort(x), dimensions={0}, is_stable=true, to_apply=cmp
}
"""


def test_sort_custom_comparator_keeps_rule():
    x = RNG.standard_normal(50).astype(np.float32)
    _check(_CUSTOM_SORT, [x], "sort", fast=False)


@pytest.mark.parametrize("with_nan", [False, True])
def test_sort_float_compare(with_nan):
    """A plain float compare is claimed; a NaN key makes the run fall back to the rule."""
    x = RNG.standard_normal(50).astype(np.float32)
    x[::7] = -0.0
    if with_nan:
        x[3] = np.nan
    _check(_FLOAT_COMPARE_SORT, [x], "sort", fast=True)


# -- reduce-window ---------------------------------------------------------------------------

WINDOWS = [
    ("cumsum_f32", lambda x: jnp.cumsum(x, axis=1), lambda: _floats((6, 70)), True),
    ("cumsum_axis0", lambda x: jnp.cumsum(x, axis=0), lambda: _floats((40, 3)), True),
    (
        "cumsum_s32_wraps",
        lambda x: jnp.cumsum(x, axis=0),
        lambda: _ints((50,), 2**30, 2**31 - 1),
        True,
    ),
    ("cumprod_f32", lambda x: jnp.cumprod(x, axis=1), lambda: _floats((4, 30)), True),
    ("cummax_f32", lambda x: lax.cummax(x, axis=1), lambda: _floats((4, 30)), True),
    (
        "cummin_s8",
        lambda x: lax.cummin(x, axis=0),
        lambda: _ints((30, 3), -100, 100, np.int8),
        True,
    ),
    (
        "maxpool_2x2",
        lambda x: lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID"),
        lambda: _floats((2, 8, 8, 3)),
        True,
    ),
    (
        "sumpool_3x3_stride1",
        lambda x: lax.reduce_window(x, 0.0, lax.add, (3, 3), (1, 1), "VALID"),
        lambda: _floats((9, 11)),
        True,
    ),
    (
        "sumpool_padded",
        lambda x: lax.reduce_window(x, 0.0, lax.add, (3, 3), (1, 1), "SAME"),
        lambda: _floats((9, 11)),
        True,
    ),
    (
        "maxpool_same_stride2",
        lambda x: lax.reduce_window(x, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "SAME"),
        lambda: _floats((2, 7, 6, 3)),
        True,
    ),
    (
        "sumpool_uneven_and_negative_padding",
        lambda x: lax.reduce_window(x, 0.0, lax.add, (2, 3), (1, 2), ((2, 0), (1, -1))),
        lambda: _floats((6, 9)),
        True,
    ),
    (
        "sumpool_base_dilation",
        lambda x: lax.reduce_window(x, 0.0, lax.add, (2, 2), (1, 1), "VALID", base_dilation=(2, 1)),
        lambda: _floats((5, 6)),
        True,
    ),
    (
        "minpool_s32_padded_dilated_window",
        lambda x: lax.reduce_window(
            x, jnp.iinfo(jnp.int32).max, lax.min, (2, 2), (1, 1), "SAME", window_dilation=(2, 1)
        ),
        lambda: _ints((7, 5), -1000, 1000),
        True,
    ),
    (  # init 2 is not neutral for a sum: the padding must stay out, the rule runs it
        "sumpool_padded_init_not_neutral",
        lambda x: lax.reduce_window(x, 2.0, lax.add, (3, 3), (1, 1), "SAME"),
        lambda: _floats((5, 4)),
        True,
    ),
]


@pytest.mark.parametrize("name,fn,make,fast", WINDOWS, ids=[w[0] for w in WINDOWS])
def test_reduce_window(name, fn, make, fast):
    x = make()
    _check(_hlo(fn, x), [x], "reduce-window", fast=fast)


# -- gather and scatter ----------------------------------------------------------------------


def _table_and_ids(rows=20, cols=6, n=40):
    table = RNG.standard_normal((rows, cols)).astype(np.float32)
    ids = RNG.integers(-rows - 5, rows + 5, n).astype(np.int32)  # out of bounds both ways
    return table, ids


GATHERS = [
    ("rows", lambda t, i: t[i], lambda: _table_and_ids()),
    ("rows_2d_ids", lambda t, i: t[i], lambda: (_table_and_ids()[0], _ints((4, 5), -30, 30))),
    ("columns", lambda t, i: t[:, i], lambda: _table_and_ids()),
    ("embedding_sum", lambda t, i: jnp.sum(t[i], axis=1), lambda: (
        _table_and_ids()[0], _ints((3, 7), 0, 20))),
    ("take_along_axis", lambda t, i: jnp.take_along_axis(t, i, axis=1), lambda: (
        _table_and_ids()[0], _ints((20, 3), -2, 8))),
]  # fmt: skip


@pytest.mark.parametrize("name,fn,make", GATHERS, ids=[g[0] for g in GATHERS])
def test_gather(name, fn, make):
    args = make()
    text = _hlo(fn, *args)
    module = parse_module(text)
    got = _leaves(execute(module, list(args), "cpu"))
    expected = _leaves(evaluate(parse_module(text), list(args)))
    for g, e in zip(got, expected, strict=True):
        _assert_same(g, e, moved=False)


def test_gather_rows_claimed_and_clamps():
    """Row gathers are native kernels where the emitter can (test_cpu_gather.py); the fast
    path still claims those it declines, e.g. f8e8m0fnu tables (the one f8 type kernels
    do not take),
    and clamps out-of-range indices as the rule does."""
    from test_cpu_gather import _module

    t, _ = _table_and_ids(8, 5)
    i = RNG.integers(-12, 12, (12, 1)).astype(np.int32)  # out of bounds both ways
    table = np.abs(t).astype(ml_dtypes.float8_e8m0fnu)
    _check(_module("rows", "f8e8m0fnu"), [table, i], "gather", True)


def _scatter_args(dtype=np.float32, rows=16, cols=5, n=60):
    x = RNG.standard_normal((rows, cols)).astype(dtype)
    ids = RNG.integers(-3, rows + 3, n).astype(np.int32)  # duplicates and out of bounds
    u = RNG.standard_normal((n, cols)).astype(dtype)
    return x, ids, u


SCATTERS = [
    ("add_f32", lambda x, i, u: x.at[i].add(u, mode="drop"), lambda: _scatter_args()),
    ("set_dupes", lambda x, i, u: x.at[i].set(u, mode="drop"), lambda: _scatter_args()),
    ("mul_f32", lambda x, i, u: x.at[i].multiply(u, mode="drop"), lambda: _scatter_args()),
    (
        "add_s32_wraps",
        lambda x, i, u: x.at[i].add(u, mode="drop"),
        lambda: tuple(
            a if k == 1 else (np.clip(a, -1.9, 1.9) * 2**30).astype(np.int32)
            for k, a in enumerate(_scatter_args(np.float32))
        ),
    ),
    (
        "max_s32",
        lambda x, i, u: x.at[i].max(u, mode="drop"),
        lambda: tuple(
            a if k == 1 else (a * 100).astype(np.int32) for k, a in enumerate(_scatter_args())
        ),
    ),
    (
        "segment_sum",
        lambda d, s: jax.ops.segment_sum(d, s, num_segments=12),
        lambda: (RNG.standard_normal((80, 3)).astype(np.float32), np.sort(_ints((80,), 0, 14))),
    ),
]


@pytest.fixture
def no_scatter_kernel(monkeypatch):
    """One-operand scatters normally become native kernels (emit_scatter.py); with this
    fixture the lowering table lacks that strategy, so the NumPy fast path (the fallback for
    what the kernel cannot take) is what runs."""
    from xlapy.backends.cpu import lowering

    strategies = lowering.LOWERING[Opcode.SCATTER]
    kept = tuple(s for s in strategies if s.name != "native scatter")
    assert len(kept) == len(strategies) - 1
    monkeypatch.setitem(lowering.LOWERING, Opcode.SCATTER, kept)


@pytest.mark.parametrize("name,fn,make", SCATTERS, ids=[s[0] for s in SCATTERS])
def test_scatter_fast_path(name, fn, make, no_scatter_kernel):
    args = make()
    _check(_hlo(fn, *args), list(args), "scatter", fast=True)


@pytest.mark.parametrize("name,fn,make", SCATTERS, ids=[s[0] for s in SCATTERS])
def test_scatter_native_kernel_by_default(name, fn, make):
    args = make()
    text = _hlo(fn, *args)
    listing = CpuProgram(parse_module(text)).thunk_listing()
    assert any(line.strip().startswith("kernel scatter") for line in listing.splitlines())
    _check(text, list(args), "scatter", fast=False)


def test_scatter_float_max_keeps_rule(no_scatter_kernel):
    """Float max follows XLA's NaN / -0 rule, not NumPy's: the fast path leaves it alone."""
    args = _scatter_args()
    _check(_hlo(lambda x, i, u: x.at[i].max(u, mode="drop"), *args), list(args), "scatter", False)


def test_scatter_many_duplicates_uses_ufunc_at(no_scatter_kernel):
    x = RNG.standard_normal((4, 3)).astype(np.float32)
    ids = np.zeros(600, np.int32)
    ids[::5] = 2
    u = RNG.standard_normal((600, 3)).astype(np.float32)
    _check(_hlo(lambda x, i, u: x.at[i].add(u), x, ids, u), [x, ids, u], "scatter", fast=True)


def test_scatter_narrow_rows_many_rounds_uses_flat_ufunc_at(no_scatter_kernel):
    """Many updates per narrow row (a segment sum) take the flat ufunc.at path: still the
    interpreter's order bit for bit."""
    d = RNG.standard_normal((3000, 2)).astype(np.float32) * 1e3
    d[::7] = 1e-3  # magnitudes that make the addition order visible
    s = np.sort(_ints((3000,), 0, 9))
    fn = lambda d, s: jax.ops.segment_sum(d, s, num_segments=9)  # noqa: E731
    _check(_hlo(fn, d, s), [d, s], "scatter", fast=True)


# -- select-and-scatter (max-pool gradients) -------------------------------------------------


def _pool_grad(window, strides, padding, init=-jnp.inf, op=lax.max):
    def pool_loss(x, g):
        return jnp.sum(lax.reduce_window(x, init, op, window, strides, padding) * g)

    return jax.grad(pool_loss)


def _tied(shape, dtype=np.float32, nan=True):
    """Few distinct values, so windows hold ties, plus -0 and (with nan) NaN."""
    x = RNG.integers(-2, 3, shape).astype(dtype)
    if np.dtype(dtype).kind == "f":
        flat = x.reshape(-1)
        if nan:
            flat[RNG.choice(flat.size, flat.size // 10, replace=False)] = np.nan
        flat[RNG.choice(flat.size, flat.size // 10, replace=False)] = -0.0
    return x


def _pool_args(shape, out_shape, dtype=np.float32, nan=True):
    return _tied(shape, dtype, nan), RNG.standard_normal(out_shape).astype(dtype)


POOL_GRADS = [
    ("2x2_stride2", ((1, 2, 2, 1), (1, 2, 2, 1), "VALID"), (2, 8, 8, 3), (2, 4, 4, 3), np.float32),
    ("3x3_stride1_overlap", ((3, 3), (1, 1), "VALID"), (9, 10), (7, 8), np.float32),
    ("3x3_stride2_same", ((1, 3, 3, 1), (1, 2, 2, 1), "SAME"), (2, 7, 9, 2), (2, 4, 5, 2),
     np.float32),
    ("3x3_stride1_same", ((3, 3), (1, 1), "SAME"), (6, 7), (6, 7), np.float32),
    ("3x3_stride2_no_nan", ((3, 3), (2, 2), "VALID"), (9, 11), (4, 5), np.float32),
    ("2x2_stride1_no_nan_min", ((2, 2), (1, 1), "VALID"), (6, 5), (5, 4), np.float32),
    ("2x3_stride1_min", ((2, 3), (1, 1), "VALID"), (5, 6), (4, 4), np.float32),
]  # fmt: skip


@pytest.mark.parametrize("name,pool,shape,out_shape,dtype", POOL_GRADS,
                         ids=[p[0] for p in POOL_GRADS])  # fmt: skip
def test_select_and_scatter_fast_path(name, pool, shape, out_shape, dtype):
    x, g = _pool_args(shape, out_shape, dtype, nan="no_nan" not in name)
    op, init = (lax.min, jnp.inf) if name.endswith("_min") else (lax.max, -jnp.inf)
    text = _hlo(_pool_grad(*pool, init=init, op=op), x, g)
    assert "select-and-scatter" in text
    _check(text, [x, g], "select-and-scatter", fast=True)


def test_select_and_scatter_int_max_pool():
    text = """
HloModule m
ge { a = s32[] parameter(0)  b = s32[] parameter(1)  ROOT c = pred[] compare(a, b), direction=GE }
add { a = s32[] parameter(0)  b = s32[] parameter(1)  ROOT c = s32[] add(a, b) }
ENTRY e {
  x = s32[6,7] parameter(0)
  s = s32[5,3] parameter(1)
  z = s32[] constant(3)
  ROOT r = s32[6,7] select-and-scatter(x, s, z), window={size=2x3 stride=1x2},
    select=ge, scatter=add
}
"""
    x, s = _ints((6, 7), -2, 2), _ints((5, 3), -(2**31), 2**31 - 1)
    _check(text, [x, s], "select-and-scatter", fast=True)


def test_select_and_scatter_total_order_keeps_rule():
    text = """
HloModule m
ge { a = f32[] parameter(0)  b = f32[] parameter(1)
     ROOT c = pred[] compare(a, b), direction=GE, type=TOTALORDER }
add { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT c = f32[] add(a, b) }
ENTRY e {
  x = f32[4,4] parameter(0)
  s = f32[2,2] parameter(1)
  z = f32[] constant(0)
  ROOT r = f32[4,4] select-and-scatter(x, s, z), window={size=2x2 stride=2x2},
    select=ge, scatter=add
}
"""
    x, s = _tied((4, 4)), RNG.standard_normal((2, 2)).astype(np.float32)
    _check(text, [x, s], "select-and-scatter", fast=False)
