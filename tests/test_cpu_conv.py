"""The CPU backend's fast convolutions and dots (conv_thunk.py, dot_thunk.py) against the
interpreter's rules on HLO lowered from JAX: floats within per-dtype tolerances (the order of
the additions differs), integers bit for bit; every case checks that the fast path, not the
rule, ran the instruction."""

import zlib

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

from xlapy.backends.cpu import lowering
from xlapy.backends.cpu.backend import CpuProgram
from xlapy.backends.cpu.runtime import conv_thunk, dot_thunk
from xlapy.backends.cpu.runtime.conv_thunk import plan_convolution
from xlapy.backends.cpu.runtime.dot_thunk import plan_dot, work_dtype
from xlapy.backends.interpreter import evaluate
from xlapy.ir.opcodes import Opcode
from xlapy.ir.parser import parse_module
from xlapy.passes import conv_to_dot

pytestmark = pytest.mark.usefixtures("x64_mode")


@pytest.fixture(autouse=True)
def no_gather_path(monkeypatch):
    """These small test convolutions would all take the gather path
    (test_cpu_conv_gather.py checks it); here they exercise the paths for larger ones."""
    monkeypatch.setattr(conv_thunk, "_GATHER_MAX", 0)


def use_blas_paths(monkeypatch) -> None:
    """Convolutions take conv_thunk's BLAS paths, not a direct kernel (codegen/emit_conv.py,
    which takes every f32 two-dimensional ungrouped convolution first)."""
    monkeypatch.setattr(lowering, "direct_geometry", lambda instr: None)
    monkeypatch.setattr(lowering, "arena_geometry", lambda instr: None)


@pytest.fixture(autouse=True)
def convolutions_stay(monkeypatch, tmp_path):
    """The pipeline's conv-to-dot pass (passes/conv_to_dot.py, tested on its own in
    tests/test_conv_to_dot.py) is off here, so the 1x1 cases test the convolution paths."""
    monkeypatch.setattr(conv_to_dot, "pointwise_reason", lambda conv: "off in these tests")
    # The compile caches on disk (the optimized module, the whole executable) are keyed by
    # xlapy's sources, not by what a test patches: an entry written with the pass on, or
    # with other paths (another test, a benchmark), would give these tests its dot or its
    # path. Each test compiles into a cache directory of its own.
    monkeypatch.setenv("XLAPY_CACHE_DIR", str(tmp_path / "kernels"))


@pytest.fixture
def blas_paths(monkeypatch):
    use_blas_paths(monkeypatch)


BF16 = ml_dtypes.bfloat16
TOL = {
    np.dtype(np.float32): 2e-5,
    np.dtype(np.float64): 1e-12,
    np.dtype(np.complex64): 2e-5,
    np.dtype(BF16): 1e-2,
    np.dtype(np.float16): 2e-3,
}


def random(rng, shape, dtype):
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        lo, hi = max(info.min, -100), min(info.max, 100)
        return rng.integers(lo, hi, shape, endpoint=True).astype(dtype)
    if dtype.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def check(f, *args, opcode, scale=1.0):
    """Run the lowered HLO of `f` on the CPU backend and the interpreter; compare, and check
    that every `opcode` instruction took the fast path (a library one, or a direct
    convolution kernel on the arena)."""
    text = jax.jit(f).lower(*args).as_text(dialect="hlo")
    module = parse_module(text)
    want = evaluate(module, list(args))
    program = CpuProgram(parse_module(text))
    listing = program.thunk_listing()
    lines = [ln for ln in listing.splitlines() if f"= {opcode.text}" in ln]
    assert lines, listing
    fast = (
        "fast NumPy path",
        "direct convolution on the arena",
        "library convolution on the arena",
    )
    native = ("blas", "kernel")  # a BLAS gemm or a native (small-gemm, gemv) kernel
    assert all(any(f in ln for f in fast) or ln.strip().startswith(native) for ln in lines), listing
    got = program.run(list(args))
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape
        if g.dtype.kind in "iub":
            np.testing.assert_array_equal(g, w)
            continue
        tol = TOL[g.dtype] * scale
        mag = max(1.0, float(np.max(np.abs(w.astype(np.complex128))))) if w.size else 1.0
        np.testing.assert_allclose(
            g.astype(np.complex128), w.astype(np.complex128), rtol=tol, atol=tol * mag
        )


def conv(lhs_spec, rhs_spec, out_spec=None, **kw):
    specs = (lhs_spec, rhs_spec, out_spec or lhs_spec)
    return lambda x, k: lax.conv_general_dilated(x, k, dimension_numbers=specs, **kw)


# (name, lhs dims, rhs dims, dtype, function)
CONVS = [
    ("nhwc_same", (2, 9, 9, 3), (3, 3, 3, 4), np.float32,
     conv("NHWC", "HWIO", window_strides=(1, 1), padding="SAME")),
    ("nhwc_strided_same", (2, 9, 9, 3), (3, 3, 3, 4), np.float32,
     conv("NHWC", "HWIO", window_strides=(2, 2), padding="SAME")),
    ("nchw_oihw_valid", (2, 3, 10, 9), (4, 3, 3, 2), np.float32,
     conv("NCHW", "OIHW", window_strides=(1, 1), padding="VALID")),
    ("rhs_dilation", (1, 3, 10, 9), (4, 3, 3, 3), np.float32,
     conv("NCHW", "OIHW", window_strides=(1, 1), padding="VALID", rhs_dilation=(2, 2))),
    ("lhs_dilation", (2, 5, 5, 3), (3, 3, 3, 2), np.float32,
     conv("NHWC", "HWIO", window_strides=(1, 1), padding=((2, 2), (1, 2)), lhs_dilation=(2, 2))),
    ("lhs_and_rhs_dilation_strided", (2, 6, 7, 2), (3, 2, 2, 3), np.float32,
     conv("NHWC", "HWIO", window_strides=(2, 1), padding=((1, 3), (2, 0)), lhs_dilation=(2, 3),
          rhs_dilation=(1, 2))),
    ("negative_padding", (2, 4, 4, 3), (3, 3, 3, 5), np.float32,
     conv("NHWC", "HWIO", window_strides=(1, 1), padding=((-1, 2), (1, -1)))),
    ("negative_padding_dilated", (1, 6, 6, 2), (2, 2, 2, 3), np.float32,
     conv("NHWC", "HWIO", window_strides=(1, 1), padding=((-3, 1), (-2, -1)), lhs_dilation=(2, 2))),
    ("feature_groups", (1, 4, 6, 6), (6, 2, 3, 3), np.float32,
     conv("NCHW", "OIHW", window_strides=(1, 2), padding=((2, 1), (0, 3)), feature_group_count=2)),
    ("depthwise", (2, 7, 7, 4), (3, 3, 1, 4), np.float32,
     conv("NHWC", "HWIO", window_strides=(1, 1), padding="SAME", feature_group_count=4)),
    ("depthwise_multiplier_strided", (2, 8, 7, 3), (3, 2, 1, 6), np.float32,
     conv("NHWC", "HWIO", window_strides=(2, 1), padding="SAME", feature_group_count=3)),
    ("batch_groups", (4, 5, 5, 2), (3, 3, 2, 6), np.float32,
     conv("NHWC", "HWIO", window_strides=(1, 1), padding="VALID", batch_group_count=2)),
    ("conv1d_strided", (2, 12, 3), (5, 3, 4), np.float32,
     conv("NWC", "WIO", window_strides=(2,), padding=((1, 1),))),
    ("conv1d_ncw", (3, 2, 11), (4, 2, 3), np.float64,
     conv("NCW", "OIW", window_strides=(1,), padding=((2, 0),))),
    ("conv3d", (1, 2, 5, 6, 4), (3, 2, 2, 3, 2), np.float32,
     conv("NCDHW", "OIDHW", window_strides=(1, 2, 1), padding="SAME")),
    ("conv3d_ndhwc", (2, 4, 5, 3, 2), (2, 3, 2, 2, 3), np.float32,
     conv("NDHWC", "DHWIO", window_strides=(1, 1, 2), padding="VALID")),
    ("pointwise_1x1", (2, 6, 5, 8), (1, 1, 8, 7), np.float32,
     conv("NHWC", "HWIO", window_strides=(1, 1), padding="VALID")),
    ("pointwise_1x1_strided", (2, 6, 5, 8), (1, 1, 8, 7), np.float32,
     conv("NHWC", "HWIO", window_strides=(2, 2), padding="VALID")),
    ("output_layout_chwn", (2, 6, 6, 3), (3, 3, 3, 4), np.float32,
     conv("NHWC", "HWIO", "CHWN", window_strides=(1, 1), padding="SAME")),
    ("float64", (2, 6, 6, 3), (3, 3, 3, 4), np.float64,
     conv("NHWC", "HWIO", window_strides=(1, 1), padding="SAME")),
    ("complex64", (1, 5, 5, 2), (2, 2, 2, 3), np.complex64,
     conv("NHWC", "HWIO", window_strides=(1, 1), padding="VALID")),
    ("bf16_to_bf16", (2, 6, 6, 4), (3, 3, 4, 5), BF16,
     conv("NHWC", "HWIO", window_strides=(1, 1), padding="SAME")),
    ("bf16_to_f32", (2, 6, 6, 4), (3, 3, 4, 5), BF16,
     conv("NHWC", "HWIO", window_strides=(1, 1), padding="SAME",
          preferred_element_type=jnp.float32)),
    ("f16", (2, 6, 6, 4), (3, 3, 4, 5), np.float16,
     conv("NHWC", "HWIO", window_strides=(1, 1), padding="SAME")),
    ("int8_to_int32", (2, 6, 6, 4), (3, 3, 4, 5), np.int8,
     conv("NHWC", "HWIO", window_strides=(1, 1), padding="SAME",
          preferred_element_type=jnp.int32)),
    ("int32_grouped", (2, 6, 6, 4), (3, 3, 2, 6), np.int32,
     conv("NHWC", "HWIO", window_strides=(1, 1), padding="SAME", feature_group_count=2)),
    ("int32_depthwise", (2, 6, 6, 4), (3, 3, 1, 4), np.int32,
     conv("NHWC", "HWIO", window_strides=(1, 1), padding="SAME", feature_group_count=4)),
    ("uint8_to_uint32", (1, 5, 5, 3), (2, 2, 3, 2), np.uint8,
     conv("NHWC", "HWIO", window_strides=(1, 1), padding="VALID",
          preferred_element_type=jnp.uint32)),
]  # fmt: skip


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "blas"])
@pytest.mark.parametrize("name,xdims,kdims,dtype,f", CONVS, ids=[c[0] for c in CONVS])
def test_convolution_matches_interpreter(monkeypatch, name, xdims, kdims, dtype, f, direct):
    if not direct:
        use_blas_paths(monkeypatch)
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    x, k = random(rng, xdims, dtype), random(rng, kdims, dtype)
    check(f, x, k, opcode=Opcode.CONVOLUTION, scale=4.0)


def _window_reversed(x, k):
    # conv_transpose with transpose_kernel=True flips the kernel's spatial dims
    return lax.conv_transpose(
        x, k, (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"), transpose_kernel=True
    )


# gradients: JAX emits backward-data (reversed kernel, lhs dilation for strides) and
# backward-filter (batch and feature swapped, a large window) convolutions
GRADS = [
    ("grad_same", (2, 8, 8, 3), (3, 3, 3, 4), (1, 1), "SAME", 1),
    ("grad_strided", (2, 9, 9, 3), (3, 3, 3, 4), (2, 2), "SAME", 1),
    ("grad_valid_strided", (3, 10, 8, 2), (3, 2, 2, 5), (2, 3), "VALID", 1),
    ("grad_grouped", (2, 7, 7, 4), (3, 3, 2, 6), (1, 1), "SAME", 2),
    ("grad_depthwise", (2, 6, 6, 3), (3, 3, 1, 3), (1, 1), "SAME", 3),
]


@pytest.mark.parametrize(
    "name,xdims,kdims,strides,padding,groups", GRADS, ids=[g[0] for g in GRADS]
)
def test_convolution_gradients_match_interpreter(name, xdims, kdims, strides, padding, groups):
    """(The direct kernels where they apply; the BLAS paths' tests call this too.)"""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    x, k = random(rng, xdims, np.float32), random(rng, kdims, np.float32)

    def loss(x, k):
        y = lax.conv_general_dilated(
            x, k, strides, padding, dimension_numbers=("NHWC", "HWIO", "NHWC"),
            feature_group_count=groups,
        )  # fmt: skip
        return jnp.sum(jnp.tanh(y))

    check(jax.grad(loss, argnums=(0, 1)), x, k, opcode=Opcode.CONVOLUTION, scale=4.0)


def test_window_reversal_transpose_kernel():
    rng = np.random.default_rng(7)
    x, k = random(rng, (2, 4, 4, 3), np.float32), random(rng, (3, 3, 2, 3), np.float32)
    check(_window_reversed, x, k, opcode=Opcode.CONVOLUTION, scale=4.0)


REVERSED = """
HloModule m
ENTRY e {
  x = f32[2,5,6,3] parameter(0)
  k = f32[3,2,3,4] parameter(1)
  ROOT c = f32[2,5,3,4] convolution(x, k),
    window={size=3x2 stride=1x2 pad=1_1x0_1 rhs_reversal=1x0}, dim_labels=b01f_01io->b01f
}
"""


def test_window_reversal_attribute():
    """rhs_reversal in the window (JAX itself emits a separate rev op)."""
    rng = np.random.default_rng(5)
    x, k = random(rng, (2, 5, 6, 3), np.float32), random(rng, (3, 2, 3, 4), np.float32)
    want = evaluate(parse_module(REVERSED), [x, k])
    flipped = parse_module(REVERSED.replace(" rhs_reversal=1x0", ""))
    assert not np.allclose(want, evaluate(flipped, [x, k]))
    chosen = lowering.arena_geometry is not conv_thunk.arena_geometry  # a caller's BLAS paths
    for direct in (False,) if chosen else (True, False):  # the arena kernel packs it reversed
        with pytest.MonkeyPatch.context() as m:
            if not direct:
                use_blas_paths(m)
            program = CpuProgram(parse_module(REVERSED), {"conv_library": False})
            path = "direct convolution on the arena" if direct else "fast NumPy path"
            assert path in program.thunk_listing()
            np.testing.assert_allclose(program.run([x, k]), want, rtol=1e-5, atol=1e-5)


def test_large_convolution_runs_in_parallel_blocks():
    """Enough work to split across the pool and into several im2col blocks."""
    rng = np.random.default_rng(3)
    x, k = random(rng, (8, 24, 24, 16), np.float32), random(rng, (3, 3, 16, 32), np.float32)
    check(conv("NHWC", "HWIO", window_strides=(1, 1), padding="SAME"), x, k,
          opcode=Opcode.CONVOLUTION, scale=8.0)  # fmt: skip


# (name, lhs dims, rhs dims, dimension numbers, in dtype, preferred out dtype)
DOTS = [
    ("bf16_to_f32", (6, 5), (5, 7), (((1,), (0,)), ((), ())), BF16, jnp.float32),
    ("bf16_to_bf16", (6, 5), (5, 7), (((1,), (0,)), ((), ())), BF16, None),
    ("f16_to_f32_batched", (3, 4, 6), (3, 6, 2), (((2,), (1,)), ((0,), (0,))), np.float16,
     jnp.float32),
    ("s8_to_s32", (9, 16), (16, 5), (((1,), (0,)), ((), ())), np.int8, jnp.int32),
    ("s8_to_s32_transposed_contract", (16, 9), (5, 16), (((0,), (1,)), ((), ())), np.int8,
     jnp.int32),
    ("s32_batched_two_contracting", (2, 3, 4, 5), (2, 5, 4, 6), (((2, 3), (2, 1)), ((0,), (0,))),
     np.int32, None),
    ("u8_to_u32", (4, 8), (8, 3), (((1,), (0,)), ((), ())), np.uint8, jnp.uint32),
    ("s64", (5, 6), (6, 4), (((1,), (0,)), ((), ())), np.int64, None),
    ("s16_batch_middle", (4, 3, 5), (5, 3, 2), (((2,), (0,)), ((1,), (1,))), np.int16, None),
]  # fmt: skip


@pytest.mark.parametrize("name,ldims,rdims,dn,dtype,pref", DOTS, ids=[d[0] for d in DOTS])
def test_dot_matches_interpreter(name, ldims, rdims, dn, dtype, pref):
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    a, b = random(rng, ldims, dtype), random(rng, rdims, dtype)

    def f(a, b):
        return lax.dot_general(a, b, dn, preferred_element_type=pref)

    check(f, a, b, opcode=Opcode.DOT, scale=2.0)


def test_integer_dot_wraps_like_the_interpreter():
    """Products too large for exact float sums take the int64 path and wrap the same way."""
    rng = np.random.default_rng(11)
    a = rng.integers(-(2**31), 2**31, (4, 64), dtype=np.int64).astype(np.int32)
    b = rng.integers(-(2**31), 2**31, (64, 3), dtype=np.int64).astype(np.int32)
    assert work_dtype(np.dtype(np.int64), a, b, 64) == np.int64
    check(lambda a, b: a @ b, a, b, opcode=Opcode.DOT)


@pytest.mark.parametrize(
    "bound,work",
    [(100, np.float32), (5000, np.float64), (2**40, np.int64)],
)
def test_integer_work_dtype_is_exact(bound, work):
    a = np.array([bound, -3], np.int64)
    b = np.array([bound, 2], np.int64)
    assert work_dtype(np.dtype(np.int64), a, b, 1024) == work
    assert dot_thunk.work_dtype(np.dtype(np.float32), a, b, 1024) == np.float32


def test_planners_decline_what_they_do_not_handle():
    text = """
HloModule m
ENTRY e {
  a = pred[4,4] parameter(0)
  b = pred[4,4] parameter(1)
  d = pred[4,4] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  x = f32[1,4,4,2] parameter(2)
  k = f32[3,3,2,2] parameter(3)
  ROOT c = f32[1,4,4,2] convolution(x, k), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f
}
"""
    comp = parse_module(text).entry
    by_name = {i.name: i for i in comp.instructions}
    assert plan_dot(by_name["d"]) is None
    assert plan_convolution(by_name["c"]) is not None


@pytest.fixture
def bands_everywhere(monkeypatch):
    """Make every eligible convolution take the band-row path, however small, its products
    split into blocks of a few output rows."""
    use_blas_paths(monkeypatch)
    monkeypatch.setattr(conv_thunk, "_BAND_MIN_DEPTH", 1)
    monkeypatch.setattr(conv_thunk, "_BAND_MIN_ROWS", 1)
    monkeypatch.setattr(conv_thunk, "_BAND_BLOCK_ROWS", 7)


@pytest.mark.parametrize("name,xdims,kdims,dtype,f", CONVS, ids=[c[0] for c in CONVS])
def test_band_rows_match_interpreter(bands_everywhere, name, xdims, kdims, dtype, f):
    rng = np.random.default_rng(zlib.crc32(name.encode()) + 1)
    x, k = random(rng, xdims, dtype), random(rng, kdims, dtype)
    check(f, x, k, opcode=Opcode.CONVOLUTION, scale=4.0)


@pytest.mark.parametrize(
    "name,xdims,kdims,strides,padding,groups", GRADS, ids=[g[0] for g in GRADS]
)
def test_band_rows_gradients_match_interpreter(
    bands_everywhere, name, xdims, kdims, strides, padding, groups
):
    test_convolution_gradients_match_interpreter(name, xdims, kdims, strides, padding, groups)


@pytest.mark.parametrize("banded", [True, False], ids=["bands", "im2col"])
def test_kept_buffers_give_fresh_results_each_run(monkeypatch, banded):
    """Work buffers live across runs: a second run on other inputs (padding and base
    dilation leave zeros that must stay zero) matches the interpreter again."""
    use_blas_paths(monkeypatch)
    if not banded:
        monkeypatch.setattr(conv_thunk, "_BAND_MIN_DEPTH", 10**9)
    f = conv("NHWC", "HWIO", window_strides=(1, 1), padding=((2, 1), (1, 2)), lhs_dilation=(2, 1))
    rng = np.random.default_rng(11)
    x, k = random(rng, (3, 7, 40, 16), np.float32), random(rng, (3, 3, 16, 5), np.float32)
    text = jax.jit(f).lower(x, k).as_text(dialect="hlo")
    calls, banded_body = [], conv_thunk._banded
    monkeypatch.setattr(conv_thunk, "_banded", lambda *a: calls.append(banded_body(*a)))
    program = CpuProgram(parse_module(text))
    for _ in range(2):
        x, k = random(rng, x.shape, np.float32), random(rng, k.shape, np.float32)
        want = evaluate(parse_module(text), [x, k])
        np.testing.assert_allclose(program.run([x, k]), want, rtol=1e-4, atol=1e-4)
    assert len(calls) == (2 if banded else 0)


@pytest.fixture
def reduce_everywhere(monkeypatch):
    """Make every eligible convolution take the long-contraction path, however small; count
    the runs that took it."""
    use_blas_paths(monkeypatch)
    monkeypatch.setattr(conv_thunk, "_REDUCE_MIN_WINDOW", 1)
    monkeypatch.setattr(conv_thunk, "_BAND_MIN_DEPTH", 10**9)
    calls, body = [], conv_thunk._reducing
    monkeypatch.setattr(conv_thunk, "_reducing", lambda *a: calls.append(body(*a)))
    return calls


# not two spatial dims, groups, window dilation along the first spatial dim, complex numbers
NOT_REDUCING = {"rhs_dilation", "feature_groups", "depthwise", "depthwise_multiplier_strided",
                "batch_groups", "conv1d_strided", "conv1d_ncw", "conv3d", "conv3d_ndhwc",
                "complex64", "int32_grouped", "int32_depthwise"}  # fmt: skip


@pytest.mark.parametrize("name,xdims,kdims,dtype,f", CONVS, ids=[c[0] for c in CONVS])
def test_long_contractions_match_interpreter(reduce_everywhere, name, xdims, kdims, dtype, f):
    rng = np.random.default_rng(zlib.crc32(name.encode()) + 2)
    x, k = random(rng, xdims, dtype), random(rng, kdims, dtype)
    check(f, x, k, opcode=Opcode.CONVOLUTION, scale=4.0)
    assert reduce_everywhere or name in NOT_REDUCING


@pytest.mark.parametrize(
    "name,xdims,kdims,strides,padding,groups", GRADS, ids=[g[0] for g in GRADS]
)
def test_long_contraction_gradients_match_interpreter(
    reduce_everywhere, name, xdims, kdims, strides, padding, groups
):
    test_convolution_gradients_match_interpreter(name, xdims, kdims, strides, padding, groups)
    assert reduce_everywhere or groups > 1


# backward-filter convolutions as JAX emits them (batch and features swapped, a window as
# large as the image), at their natural size: (name, lhs dims, rhs dims, specs, dtype, kwargs)
FILTER_GRADS = [
    ("chwn_same", (16, 12, 12, 3), (16, 12, 12, 8), ("CHWN", "IHWO", "HWNC"), np.float32,
     dict(padding=((1, 1), (1, 1)))),
    ("chwn_f64_asymmetric_pad", (4, 11, 9, 5), (4, 10, 9, 6), ("CHWN", "IHWO", "HWNC"),
     np.float64, dict(padding=((0, 1), (2, 2)))),
    ("rhs_dilated_strided_out", (3, 13, 14, 2), (3, 11, 6, 4), ("CHWN", "IHWO", "HWNC"),
     np.float32, dict(padding=((1, 2), (0, 1)), window_strides=(2, 1), rhs_dilation=(1, 2))),
    ("lhs_dilated", (2, 7, 8, 3), (2, 12, 14, 4), ("CHWN", "IHWO", "HWNC"), np.float32,
     dict(padding=((1, 0), (0, 0)), lhs_dilation=(2, 2))),
    ("nhwc_labels_int8", (3, 10, 10, 4), (9, 9, 4, 5), ("NHWC", "HWIO", "NHWC"), np.int8,
     dict(padding=((1, 1), (1, 1)), preferred_element_type=jnp.int32)),
]  # fmt: skip


@pytest.mark.parametrize(
    "name,xdims,kdims,specs,dtype,kw", FILTER_GRADS, ids=[c[0] for c in FILTER_GRADS]
)
def test_filter_gradient_shapes_take_long_contractions(monkeypatch, name, xdims, kdims, specs,
                                                       dtype, kw):  # fmt: skip
    use_blas_paths(monkeypatch)
    calls, body = [], conv_thunk._reducing
    monkeypatch.setattr(conv_thunk, "_reducing", lambda *a: calls.append(body(*a)))
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    x, k = random(rng, xdims, dtype), random(rng, kdims, dtype)
    kw = {"window_strides": (1, 1), **kw}
    check(lambda x, k: lax.conv_general_dilated(x, k, dimension_numbers=specs, **kw), x, k,
          opcode=Opcode.CONVOLUTION, scale=8.0)  # fmt: skip
    assert calls


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_long_contraction_bits_do_not_depend_on_which_block_ends_first(monkeypatch, dtype):
    """The long-contraction path cuts the input features into blocks that run on the pool,
    each into a partial sum: the partials are added in feature order, so a run whose blocks
    finish in another order (any run with 3 or more pool threads) gives the same bits. The
    blocks are run here in forward and in reverse order, 4 of them."""
    from xlapy.backends.cpu.runtime.pool import even_blocks

    use_blas_paths(monkeypatch)
    calls, body = [], conv_thunk._reducing
    monkeypatch.setattr(conv_thunk, "_reducing", lambda *a: calls.append(body(*a)))
    rng = np.random.default_rng(11)
    x, k = random(rng, (16, 12, 12, 3), dtype), random(rng, (16, 12, 12, 8), dtype)

    def f(x, k):
        specs = ("CHWN", "IHWO", "HWNC")  # a backward-filter convolution as JAX emits it
        return lax.conv_general_dilated(x, k, (1, 1), ((1, 1), (1, 1)), dimension_numbers=specs)

    program = CpuProgram(parse_module(jax.jit(f).lower(x, k).as_text(dialect="hlo")))
    runs = []
    for order in (list, lambda blocks: list(reversed(blocks))):

        def split_run(units, flops, body, order=order):
            for lo, hi in order(even_blocks(units, 4)):
                body(lo, hi)

        monkeypatch.setattr(conv_thunk, "split_run", split_run)
        runs.append(np.array(program.run([x, k]), copy=True))
    assert len(calls) == 2
    assert runs[0].tobytes() == runs[1].tobytes()


def test_long_contraction_window_reversal(reduce_everywhere):
    """A reversed kernel cannot be used in place: the path copies it first."""
    test_window_reversal_attribute()
    test_window_reversal_transpose_kernel()
    assert len(reduce_everywhere) == 2
