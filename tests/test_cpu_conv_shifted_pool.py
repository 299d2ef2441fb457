"""The CPU backend's shifted-slices convolutions (conv_thunk.py, `_shifted`) and pooling
reduce-windows whose init pass is left out (window_thunk.py) against the interpreter: every
convolution of the fast-path table forced through the shifted path where it applies, the
convnet's first layer at its own size, kept buffers across runs; max / min pools with
identity and other inits, NaN, signed zeros and integers, bit for bit."""

import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from test_cpu_conv import (
    CONVS,
    GRADS,
    check,
    conv,
    convolutions_stay,  # noqa: F401 (autouse fixture: 1x1 cases stay convolutions)
    no_gather_path,  # noqa: F401 (autouse fixture: the small cases keep their paths)
    random,
    test_convolution_gradients_match_interpreter,
    use_blas_paths,
)

from xlapy.backends.cpu import lowering
from xlapy.backends.cpu.backend import CpuProgram
from xlapy.backends.cpu.runtime import conv_thunk, window_thunk
from xlapy.backends.interpreter import evaluate
from xlapy.ir.opcodes import Opcode
from xlapy.ir.parser import parse_module

pytestmark = pytest.mark.usefixtures("x64_mode")


def library_pooling(monkeypatch) -> None:
    """Pooling reduce-windows take the library path (window_thunk.py), not the native kernel."""
    strategies = lowering.LOWERING[Opcode.REDUCE_WINDOW]
    kept = tuple(s for s in strategies if s.name != "native window")
    monkeypatch.setitem(lowering.LOWERING, Opcode.REDUCE_WINDOW, kept)


@pytest.fixture
def shift_everywhere(monkeypatch):
    """Make every eligible convolution take the shifted path; count the runs that took it."""
    use_blas_paths(monkeypatch)
    monkeypatch.setattr(conv_thunk, "_SHIFT_MAX_FEATURES", 10**9)
    monkeypatch.setattr(conv_thunk, "_SHIFT_MAX_WASTE", 10**9)
    monkeypatch.setattr(conv_thunk, "_SHIFT_BLOCK_BYTES", 1)  # many small blocks
    monkeypatch.setattr(conv_thunk, "_CHUNK_BYTES", 1)  # one batch item a staged block
    monkeypatch.setattr(conv_thunk, "_BAND_MIN_DEPTH", 10**9)
    calls, body = [], conv_thunk._shifted
    monkeypatch.setattr(conv_thunk, "_shifted", lambda *a: calls.append(body(*a)))
    return calls


# strided windows, groups, 1x1 windows (JAX splits complex convolutions into real ones)
NOT_SHIFTED = {"nhwc_strided_same", "lhs_and_rhs_dilation_strided", "feature_groups",
               "depthwise", "depthwise_multiplier_strided", "batch_groups", "conv1d_strided",
               "conv3d", "conv3d_ndhwc", "pointwise_1x1", "pointwise_1x1_strided",
               "int32_grouped", "int32_depthwise"}  # fmt: skip


@pytest.mark.parametrize("name,xdims,kdims,dtype,f", CONVS, ids=[c[0] for c in CONVS])
def test_shifted_matches_interpreter(shift_everywhere, name, xdims, kdims, dtype, f):
    rng = np.random.default_rng(zlib.crc32(name.encode()) + 3)
    x, k = random(rng, xdims, dtype), random(rng, kdims, dtype)
    check(f, x, k, opcode=Opcode.CONVOLUTION, scale=4.0)
    assert bool(shift_everywhere) == (name not in NOT_SHIFTED), name


@pytest.mark.parametrize(
    "name,xdims,kdims,strides,padding,groups", GRADS, ids=[g[0] for g in GRADS]
)
def test_shifted_gradients_match_interpreter(
    shift_everywhere, name, xdims, kdims, strides, padding, groups
):
    test_convolution_gradients_match_interpreter(name, xdims, kdims, strides, padding, groups)
    assert shift_everywhere or groups > 1


# (name, lhs dims, rhs dims, kwargs): shapes the default thresholds send down the path
NATURAL = [
    ("convnet_first_layer", (3, 17, 19, 3), (3, 3, 3, 16), dict(padding="SAME")),
    ("one_feature_dilated", (2, 25, 24, 1), (3, 2, 1, 5),
     dict(padding=((2, 1), (0, 3)), rhs_dilation=(2, 3))),
    ("odd_valid_f64", (1, 21, 17, 2), (2, 3, 2, 3), dict(padding="VALID")),
    ("conv1d_long", (2, 50, 4), (5, 4, 6), dict(padding=((2, 2),))),
]  # fmt: skip


@pytest.mark.parametrize("name,xdims,kdims,kw", NATURAL, ids=[c[0] for c in NATURAL])
def test_shifted_at_natural_sizes(monkeypatch, name, xdims, kdims, kw):
    use_blas_paths(monkeypatch)
    calls, body = [], conv_thunk._shifted
    monkeypatch.setattr(conv_thunk, "_shifted", lambda *a: calls.append(body(*a)))
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    dtype = np.float64 if "f64" in name else np.float32
    x, k = random(rng, xdims, dtype), random(rng, kdims, dtype)
    specs = ("NWC", "WIO", "NWC") if len(xdims) == 3 else ("NHWC", "HWIO", "NHWC")
    f = conv(*specs, window_strides=(1,) * (len(xdims) - 2), **kw)
    check(f, x, k, opcode=Opcode.CONVOLUTION, scale=4.0)
    assert calls


def test_shifted_kept_buffers_give_fresh_results_each_run():
    """The feature-major padded input lives across runs; its padding must stay zero."""
    f = conv("NHWC", "HWIO", window_strides=(1, 1), padding=((2, 1), (1, 2)), lhs_dilation=(2, 1))
    rng = np.random.default_rng(12)
    x, k = random(rng, (3, 7, 9, 2), np.float32), random(rng, (3, 3, 2, 5), np.float32)
    text = jax.jit(f).lower(x, k).as_text(dialect="hlo")
    program = CpuProgram(parse_module(text))
    for _ in range(3):
        x, k = random(rng, x.shape, np.float32), random(rng, k.shape, np.float32)
        want = evaluate(parse_module(text), [x, k])
        np.testing.assert_allclose(program.run([x, k]), want, rtol=1e-4, atol=1e-4)


# -- pooling -----------------------------------------------------------------------------------


def _specials(rng, shape, dtype):
    x = rng.standard_normal(shape).astype(dtype)
    flat = x.reshape(-1)
    picks = rng.choice(flat.size, flat.size // 3, replace=False)
    specials = np.array([np.nan, -np.nan, 0.0, -0.0, np.inf, -np.inf, 1.5], dtype)
    flat[picks] = specials[rng.integers(0, specials.size, picks.size)]
    return x


def _bits(a):
    a = np.ascontiguousarray(a)
    return a if a.dtype.kind in "biu" else a.view(f"u{a.dtype.itemsize}")


# (name, function, input dims, dtype)
POOLS = [
    ("max_2x2_nhwc", lambda x: lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1),
                                                 (1, 2, 2, 1), "VALID"), (3, 8, 10, 5), np.float32),
    ("min_3x2_stride1", lambda x: lax.reduce_window(x, jnp.inf, lax.min, (3, 2), (1, 1), "VALID"),
     (9, 7), np.float64),
    ("max_dilated_strided", lambda x: lax.reduce_window(
        x, -jnp.inf, lax.max, (2, 3), (3, 2), "VALID", window_dilation=(2, 1)), (13, 11),
     np.float32),
    ("max_init_zero", lambda x: lax.reduce_window(
        x, np.float32(0), lax.max, (2, 2), (2, 2), "VALID"), (8, 6), np.float32),
    ("max_1x1_copy", lambda x: lax.reduce_window(x, -jnp.inf, lax.max, (1, 1), (2, 1), "VALID"),
     (7, 5), np.float32),
    ("max_int8", lambda x: lax.reduce_window(x, np.int8(-128), lax.max, (2, 2), (2, 2), "VALID"),
     (6, 8), np.int8),
    ("min_int32_not_identity", lambda x: lax.reduce_window(
        x, np.int32(3), lax.min, (2, 3), (1, 2), "VALID"), (6, 9), np.int32),
    # padding: folded in where init changes no accumulator, else the rule (run-time decline)
    ("max_3x3_stride2_padded", lambda x: lax.reduce_window(
        x, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1), ((0, 0), (0, 1), (0, 1), (0, 0))),
     (3, 8, 9, 4), np.float32),
    ("max_same_dilated", lambda x: lax.reduce_window(
        x, -jnp.inf, lax.max, (3, 2), (1, 2), ((2, 1), (1, 1)), window_dilation=(2, 1)),
     (7, 6), np.float64),
    ("sum_avgpool_same", lambda x: lax.reduce_window(
        x, np.float32(0), lax.add, (3, 3), (1, 1), "SAME"), (6, 7), np.float32),
    ("max_int16_padded", lambda x: lax.reduce_window(
        x, np.int16(-32768), lax.max, (2, 3), (2, 1), ((1, 0), (1, 1))), (5, 6), np.int16),
    ("sum_padded_init_one", lambda x: lax.reduce_window(
        x, np.float32(1), lax.add, (2, 2), (1, 1), ((1, 0), (0, 1))), (5, 4), np.float32),
    ("min_padded_init_not_identity", lambda x: lax.reduce_window(
        x, np.float32(0.5), lax.min, (2, 2), (2, 2), ((1, 1), (0, 1))), (6, 5), np.float32),
]  # fmt: skip


@pytest.mark.parametrize("path", ["native", "library"])
@pytest.mark.parametrize("name,fn,dims,dtype", POOLS, ids=[p[0] for p in POOLS])
def test_pools_match_interpreter_bit_for_bit(monkeypatch, name, fn, dims, dtype, path):
    """Both ways a pooling reduce-window runs: the native kernel (codegen/emit_window.py) and
    the library path it falls back to (window_thunk.py)."""
    if path == "library":
        library_pooling(monkeypatch)
    ran = []
    padded = window_thunk._padded_pooling

    def counted(*a):
        body = padded(*a)
        return lambda *v: ran.append(body(*v)) or ran[-1]

    monkeypatch.setattr(window_thunk, "_padded_pooling", counted)
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    if np.dtype(dtype).kind == "f":
        x = _specials(rng, dims, dtype)
    else:
        info = np.iinfo(dtype)
        x = rng.integers(max(info.min, -1000), min(info.max, 1000), dims, endpoint=True)
        x = x.astype(dtype)
        x.reshape(-1)[:3] = [info.min, info.max, 0]
    text = jax.jit(fn).lower(x).as_text(dialect="hlo")
    program = CpuProgram(parse_module(text))
    lines = [ln for ln in program.thunk_listing().splitlines() if "= reduce-window" in ln]
    mark = "fast NumPy path" if path == "library" else "kernel"
    assert lines and all(mark in ln for ln in lines), lines
    got = np.asarray(program.run([x]))
    want = np.asarray(evaluate(parse_module(text), [x]))
    assert got.dtype == want.dtype and got.shape == want.shape
    if path == "library":
        np.testing.assert_array_equal(_bits(got), _bits(want))
    else:  # the kernels' max / min (IEEE maximum): NaN payloads and max(-0, +0) may differ
        np.testing.assert_array_equal(got, want)
    # the padded path ran, or declined where it must
    if path == "library" and ("padded" in name or "same" in name):
        assert ran == ["not_identity" not in name and "init_one" not in name]
