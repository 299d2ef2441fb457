"""Direct convolution kernels (codegen/emit_conv.py, run on the arena by conv_thunk.py's
DirectConvThunk for f32 input and result, else by the library's `_direct` on a padded copy)
against the interpreter: output features that fill whole vectors, part of one, several
blocks; rows whose last tile is short; strides, window and base dilation, padding (negative
too, and windows that lie wholly in padding), window reversal, NCHW / OIHW layouts, a result
laid out otherwise, non-default layouts, f16 / bf16 operands, training-step gradients in
NHWC and NCHW; tiles that read outside x run on a staged copy of their input (every padding
width on each side, in NHWC, NCHW and CHWN, rows shorter than a window, dilations and
strides with padding, a heavy kernel's short tile) with one copy of the reduction in the
IR; every case checks the direct kernel ran, and f32 cases that it ran on the arena. Then
the split:
tile counts and even blocks for 16 threads from batch 1 on, and the same bits at
XLAPY_NUM_THREADS=1, 2, 3 and 16 (one subprocess each)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zlib
from dataclasses import replace

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

from xlapy.backends.cpu.codegen.emit_conv import DirectConv, emit_direct_conv
from xlapy.backends.cpu.runtime import conv_thunk
from xlapy.backends.cpu.runtime.conv_thunk import direct_geometry
from xlapy.backends.cpu.runtime.pool import even_blocks
from xlapy.ir.parser import parse_module

pytestmark = pytest.mark.usefixtures("kernel_cache")

BF16 = ml_dtypes.bfloat16
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def direct_runs(monkeypatch):
    """No gather path (these convolutions are small); count the direct kernels' runs."""
    monkeypatch.setattr(conv_thunk, "_GATHER_MAX", 0)
    calls: list[int] = []
    tiles = conv_thunk.run_tiles
    monkeypatch.setattr(conv_thunk, "run_tiles",
                        lambda fn, p, n, f: calls.append(n) or tiles(fn, p, n, f))  # fmt: skip
    return calls


def conv(lhs="NHWC", rhs="HWIO", out=None, **kw):
    return lambda x, k: lax.conv_general_dilated(x, k, dimension_numbers=(lhs, rhs, out or lhs),
                                                 **kw)  # fmt: skip


# (name, lhs dims, rhs dims, dtype, function)
CASES = [
    ("one_vector", (2, 9, 11, 3), (3, 3, 3, 8), np.float32, conv(window_strides=(1, 1),
                                                                   padding="SAME")),
    ("part_vector", (2, 9, 11, 5), (3, 3, 5, 5), np.float32, conv(window_strides=(1, 1),
                                                                    padding="SAME")),
    ("two_blocks_tail", (1, 7, 30, 6), (3, 3, 6, 70), np.float32, conv(window_strides=(1, 1),
                                                                         padding="VALID")),
    ("wide_strided", (2, 17, 19, 4), (5, 5, 4, 32), np.float32, conv(window_strides=(2, 2),
                                                                       padding="SAME")),
    ("window_dilation", (1, 13, 12, 3), (3, 2, 3, 12), np.float32,
     conv(window_strides=(1, 2), padding=((2, 1), (0, 3)), rhs_dilation=(2, 3))),
    ("base_dilation", (2, 6, 5, 4), (3, 3, 4, 9), np.float32,
     conv(window_strides=(1, 1), padding=((2, 2), (1, 2)), lhs_dilation=(2, 2))),
    ("negative_padding", (2, 8, 8, 3), (3, 3, 3, 6), np.float32,
     conv(window_strides=(1, 1), padding=((-1, 2), (1, -2)))),
    ("nchw_oihw", (2, 3, 10, 9), (7, 3, 3, 2), np.float32,
     conv("NCHW", "OIHW", window_strides=(1, 1), padding="SAME")),
    ("staged_result", (2, 8, 9, 3), (3, 3, 3, 10), np.float32,
     conv("NHWC", "HWIO", "NCHW", window_strides=(1, 1), padding="SAME")),
    ("f16", (2, 8, 9, 3), (3, 3, 3, 10), np.float16, conv(window_strides=(1, 1), padding="SAME")),
    ("bf16", (2, 8, 9, 3), (3, 3, 3, 10), BF16, conv(window_strides=(1, 1), padding="SAME")),
    ("bf16_to_f32", (2, 8, 9, 3), (3, 3, 3, 10), BF16,
     conv(window_strides=(1, 1), padding="SAME", preferred_element_type=jnp.float32)),
    ("one_column", (3, 9, 1, 4), (3, 1, 4, 16), np.float32, conv(window_strides=(1, 1),
                                                                   padding="SAME")),
    ("padding_only_rows", (2, 3, 4, 3), (3, 3, 3, 8), np.float32,
     conv(window_strides=(1, 1), padding=((4, 4), (5, 3)))),
    ("dilated_nchw_both", (2, 3, 5, 6), (9, 3, 3, 2), np.float32,
     conv("NCHW", "OIHW", window_strides=(2, 1), padding=((3, 1), (2, 4)), lhs_dilation=(3, 2),
          rhs_dilation=(1, 2))),
    ("chwn_iohw_to_nwhc", (3, 7, 8, 2), (3, 12, 2, 3), np.float32,
     conv("CHWN", "IOHW", "NWHC", window_strides=(1, 2), padding="SAME")),
    ("nchw_looped_blocks", (2, 3, 6, 7), (40, 3, 3, 3), np.float32,
     conv("NCHW", "OIHW", window_strides=(1, 1), padding="SAME")),
    ("one_input_feature", (5, 1, 16, 16), (16, 1, 3, 3), np.float32,
     conv("NCHW", "OIHW", window_strides=(1, 1), padding="SAME")),
    # input features past _UNROLL_ALL_CHANNELS: the feature loop unrolled by 2, odd counts
    ("odd_features_unrolled_by_2", (2, 9, 13, 7), (3, 3, 7, 16), np.float32,
     conv(window_strides=(1, 1), padding="SAME")),
    ("odd_features_strided_nchw", (2, 9, 11, 9), (12, 9, 3, 3), np.float32,
     conv("NHWC", "OIHW", "NCHW", window_strides=(2, 1), padding=((1, 2), (2, 0)))),
]  # fmt: skip
TOL = {np.dtype(np.float32): 1e-5, np.dtype(np.float16): 4e-3, np.dtype(BF16): 3e-2}


def _check(f, x, k, direct_runs):
    from xlapy.backends.cpu.backend import CpuProgram
    from xlapy.backends.interpreter import evaluate

    text = jax.jit(f).lower(x, k).as_text(dialect="hlo")
    program = CpuProgram(parse_module(text), {"conv_library": False})
    listing = program.compiled.thunk_listing()
    if x.dtype == np.float32:
        assert "direct convolution on the arena" in listing, listing
    got = program.run([x, k])
    want = evaluate(parse_module(text), [x, k])
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape
        tol = TOL[g.dtype] * 4
        mag = max(1.0, float(np.max(np.abs(w.astype(np.float64)))))
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=tol,
                                   atol=tol * mag)  # fmt: skip
    assert direct_runs, "no direct kernel ran"


def _random(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("name,xdims,kdims,dtype,f", CASES, ids=[c[0] for c in CASES])
def test_direct_convolution_matches_interpreter(direct_runs, name, xdims, kdims, dtype, f):
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    x, k = _random(rng, xdims, dtype), _random(rng, kdims, dtype)
    _check(f, x, k, direct_runs)


@pytest.mark.parametrize("channels,count", [(3, None), (4, None), (5, 2), (16, 2)])
def test_feature_loop_unroll_count(channels, count):
    """The reduction over input features carries `llvm.loop.unroll.count 2` past a few
    features (LLVM unrolled it fully, doubling the kernel's optimized IR and its compile
    time), and LLVM's own choice up to them."""
    x_strides = (64 * channels, 8 * channels, channels, 1)
    cv = DirectConv(nb=2, sizes=(8, 8), pads=(1, 1), base_dilations=(1, 1), checked=(True, True),
                    channels=channels, outs=(8, 8), ksizes=(3, 3), strides=(1, 1),
                    dilations=(1, 1), features=16, x_strides=x_strides,
                    out_strides=(1024, 128, 16, 1), vector=8, registers=16)  # fmt: skip
    text = emit_direct_conv(cv)
    counts = re.findall(r'"llvm.loop.unroll.count", i32 (\d+)', text)
    if count is None:
        assert not counts, text
    else:
        assert counts and set(counts) == {str(count)}, counts


# Tiles that read outside x along the last spatial dim run the one reduction on a staged
# copy of their input (0 in padding): every padding width 0..k-1 on each side, in the three
# ways the copy runs (features adjacent: NHWC; columns adjacent: NCHW; element by element:
# CHWN), so the first, last and inner tiles of a row each read outside on one side or both.
_EDGE_LAYOUTS = {
    "nhwc": (("NHWC", "HWIO", "NHWC"), lambda n, h, w, c: (n, h, w, c)),
    "nchw": (("NCHW", "OIHW", "NCHW"), lambda n, h, w, c: (n, c, h, w)),
    "chwn": (("CHWN", "HWIO", "NHWC"), lambda n, h, w, c: (c, h, w, n)),
}
_EDGE_PADS = [(3, lo, hi) for lo in range(3) for hi in range(3)] + [
    (5, lo, hi) for lo, hi in ((0, 4), (4, 0), (2, 2), (1, 3), (4, 4))
]


def _kernel_dims(lhs: str, k0: int, k1: int, c: int, o: int) -> tuple[int, ...]:
    return (o, c, k0, k1) if lhs == "NCHW" else (k0, k1, c, o)


@pytest.mark.parametrize("layout", list(_EDGE_LAYOUTS))
@pytest.mark.parametrize("k,lo,hi", _EDGE_PADS, ids=[f"k{k}_{lo}_{hi}" for k, lo, hi in _EDGE_PADS])
def test_staged_edges_every_padding(direct_runs, layout, k, lo, hi):
    dims, order = _EDGE_LAYOUTS[layout]
    rng = np.random.default_rng(zlib.crc32(f"{layout}{k}{lo}{hi}".encode()))
    x = _random(rng, order(2, 5, 17, 6), np.float32)
    w = _random(rng, _kernel_dims(dims[0], 2, k, 6, 16), np.float32)
    f = conv(*dims, window_strides=(1, 1), padding=((1, 0), (lo, hi)))
    _check(f, x, w, direct_runs)


# (name, lhs dims NHWC, kernel (k0, k1), features, conv keywords): rows shorter than a tile
# (every tile a row's last and part-filled), window dilation and strides with padding, base
# dilation (every tile staged), a kernel too large for L1 (a short-tile copy) with padding
_EDGE_CASES = [
    ("row_of_one", (2, 4, 1, 5), (3, 3), 8, dict(window_strides=(1, 1), padding="SAME")),
    ("row_of_two_padded", (1, 3, 2, 4), (2, 3), 12, dict(window_strides=(1, 1),
                                                         padding=((0, 1), (2, 2)))),
    ("row_shorter_than_window", (2, 5, 3, 3), (3, 5), 8, dict(window_strides=(1, 1),
                                                              padding=((1, 1), (4, 4)))),
    ("dilated_padded", (2, 6, 19, 4), (3, 3), 16, dict(window_strides=(1, 1),
                                                       padding=((2, 2), (3, 1)),
                                                       rhs_dilation=(2, 3))),
    ("dilated_strided_padded", (1, 7, 23, 5), (3, 4), 9, dict(window_strides=(2, 3),
                                                              padding=((1, 2), (5, 2)),
                                                              rhs_dilation=(1, 2))),
    ("base_dilated_padded", (2, 4, 6, 3), (3, 3), 8, dict(window_strides=(1, 1),
                                                          padding=((1, 2), (2, 1)),
                                                          lhs_dilation=(1, 3))),
    ("heavy_short_tile_padded", (1, 4, 14, 64), (3, 3), 64, dict(window_strides=(1, 1),
                                                                 padding="SAME")),
    ("heavy_rows_of_one", (2, 3, 1, 48), (3, 3), 96, dict(window_strides=(1, 1),
                                                          padding="SAME")),
]  # fmt: skip


@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
@pytest.mark.parametrize("name,xdims,ks,o,kw", _EDGE_CASES, ids=[c[0] for c in _EDGE_CASES])
def test_staged_edges_shapes(direct_runs, layout, name, xdims, ks, o, kw):
    dims, order = _EDGE_LAYOUTS[layout]
    rng = np.random.default_rng(zlib.crc32(f"{layout}{name}".encode()))
    x = _random(rng, order(*xdims), np.float32)
    w = _random(rng, _kernel_dims(dims[0], *ks, xdims[3], o), np.float32)
    _check(conv(*dims, **kw), x, w, direct_runs)


def _fmas(cv: DirectConv) -> int:
    return len(re.findall(r"call <8 x float> @\"?llvm\.fma", emit_direct_conv(cv)))


def test_one_copy_of_the_reduction():
    """A padded kernel holds the reduction once (R x NV fused multiply-adds a block kind):
    no masked copy for tiles that read padding, no short copy for a row's last tile where R
    divides the row or the kernel fits L1; a heavy kernel (over L1) keeps one short copy."""
    cv = _geometry((8, 32, 32, 16), (3, 3, 16, 32), window_strides=(1, 1), padding="SAME")
    arena = replace(cv, pads=(1, 1), checked=(True, True), sizes=(32, 32))
    assert arena.outs[1] % arena.tile == 0 and arena.staging is not None
    assert _fmas(arena) == arena.tile * arena.block
    odd = replace(arena, outs=(32, 31), sizes=(32, 31))  # no divisor kept: last tile staged
    assert odd.outs[1] % odd.tile and not odd.short
    assert _fmas(odd) == odd.tile * odd.block
    heavy = _geometry((1, 14, 14, 64), (3, 3, 64, 64), window_strides=(1, 1), padding="SAME")
    heavy = replace(heavy, pads=(1, 1), checked=(True, True), sizes=(14, 14))
    assert heavy.heavy and heavy.short == 14 % heavy.tile
    assert _fmas(heavy) == (heavy.tile + heavy.short) * heavy.block


def test_light_pipeline_same_bits_as_o3():
    """The kernel compiled by the JIT's light pipeline (what the lowering asks for) and by
    O3 gives the same bits: neither reorders the sums of the one reduction."""
    import ctypes

    from xlapy.backends.cpu.codegen.common import SYMBOL
    from xlapy.backends.cpu.jit.kernel import request_function

    cv = _geometry((2, 7, 13, 5), (3, 3, 5, 12), window_strides=(1, 1), padding="SAME")
    cv = replace(cv, sizes=(7, 13), pads=(1, 1), checked=(True, True),
                 x_strides=(7 * 13 * 5, 13 * 5, 5, 1))  # fmt: skip
    rng = np.random.default_rng(9)
    x = _random(rng, (2, 7, 13, 5), np.float32)
    w = np.zeros((3, 3, 5, cv.kernel_width), np.float32)
    w[..., : cv.features] = _random(rng, (3, 3, 5, cv.features), np.float32)
    proto = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * 3), ctypes.c_int64, ctypes.c_int64)
    results = []
    for light in (False, True):
        emit = lambda: emit_direct_conv(cv)  # noqa: E731
        function = request_function(cv.description(True), emit, SYMBOL, light=light)
        fn = proto(function.address())  # (the code lives while `function` does)
        y = np.full((2, *cv.outs, cv.features), np.nan, np.float32)
        fn(y.ctypes.data, x.ctypes.data, w.ctypes.data, 0, cv.extent)
        results.append(y)
    assert not np.isnan(results[0]).any()
    np.testing.assert_array_equal(results[0].view(np.uint32), results[1].view(np.uint32))


def test_staging_too_large_for_the_stack_falls_back(direct_runs):
    """A tile whose staged input would pass STAGE_LIMIT floats does not run on the arena
    (the library's padded copy, or its other paths, run it), still matching."""
    from xlapy.backends.cpu.backend import CpuProgram
    from xlapy.backends.interpreter import evaluate

    rng = np.random.default_rng(8)
    x, k = _random(rng, (1, 5, 9, 1024), np.float32), _random(rng, (5, 5, 1024, 8), np.float32)
    f = conv(window_strides=(1, 1), padding="SAME")
    text = jax.jit(f).lower(x, k).as_text(dialect="hlo")
    (instr,) = [i for i in parse_module(text).entry.instructions if i.opcode.text == "convolution"]
    geometry = conv_thunk.arena_geometry(instr)
    assert geometry is not None
    assert not DirectConv(**geometry, vector=8, registers=16).fits
    program = CpuProgram(parse_module(text), {"conv_library": False})
    assert "direct convolution on the arena" not in program.compiled.thunk_listing()
    got, want = program.run([x, k]), evaluate(parse_module(text), [x, k])
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4,
                               atol=1e-4 * float(np.abs(np.asarray(want)).max()))  # fmt: skip


def test_window_reversal_transposed_kernel(direct_runs):
    rng = np.random.default_rng(4)
    x, k = _random(rng, (2, 5, 6, 4), np.float32), _random(rng, (3, 3, 8, 4), np.float32)

    def f(x, k):
        return lax.conv_transpose(x, k, (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                  transpose_kernel=True)  # fmt: skip

    _check(f, x, k, direct_runs)


def test_training_step_gradients(direct_runs):
    """Forward, input gradient (reversed kernel, base dilation) and filter gradient (batch
    and features swapped, an image-sized window) of a strided convolution."""
    rng = np.random.default_rng(5)
    x, k = _random(rng, (2, 9, 9, 4), np.float32), _random(rng, (3, 3, 4, 8), np.float32)

    def loss(x, k):
        y = lax.conv_general_dilated(x, k, (2, 2), "SAME",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))  # fmt: skip
        return jnp.sum(jnp.tanh(y))

    _check(jax.grad(loss, argnums=(0, 1)), x, k, direct_runs)
    assert len(direct_runs) >= 2


def test_training_step_gradients_nchw(direct_runs):
    """A strided NCHW / OIHW training step (equinox's layout, vmapped): forward, input and
    filter gradients all on the arena where they have at least 4 output features."""
    rng = np.random.default_rng(6)
    x, k = _random(rng, (3, 5, 11, 10), np.float32), _random(rng, (8, 5, 3, 3), np.float32)

    def loss(x, k):
        def one(image):
            dims = ("NCHW", "OIHW", "NCHW")
            return lax.conv_general_dilated(image[None], k, (2, 1), ((1, 1), (0, 2)),
                                            dimension_numbers=dims)[0]  # fmt: skip

        return jnp.sum(jax.nn.gelu(jax.vmap(one)(x)))

    _check(jax.grad(loss, argnums=(0, 1)), x, k, direct_runs)
    assert len(direct_runs) >= 3


def test_non_default_layouts(direct_runs):
    """Operands and result in layouts that are not row-major (strides from minor_to_major)."""
    from xlapy.backends.cpu.backend import CpuProgram
    from xlapy.backends.interpreter import evaluate

    text = """HloModule layouts

ENTRY main {
  x = f32[2,6,7,3]{0,3,2,1} parameter(0)
  k = f32[3,3,3,9]{2,3,1,0} parameter(1)
  ROOT y = f32[2,6,7,9]{1,2,0,3} convolution(x, k), window={size=3x3 pad=1_1x1_1},
    dim_labels=b01f_01io->b01f
}
"""
    rng = np.random.default_rng(7)
    x, k = _random(rng, (2, 6, 7, 3), np.float32), _random(rng, (3, 3, 3, 9), np.float32)
    program = CpuProgram(parse_module(text), {"conv_library": False})
    assert "direct convolution on the arena" in program.compiled.thunk_listing()
    got = np.asarray(program.run([x, k]))
    want = np.asarray(evaluate(parse_module(text), [x, k]))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    assert direct_runs


def _geometry(xdims, kdims, **kw):
    x, k = np.zeros(xdims, np.float32), np.zeros(kdims, np.float32)
    text = jax.jit(conv(**kw)).lower(x, k).as_text(dialect="hlo")
    (instr,) = [i for i in parse_module(text).entry.instructions if i.opcode.text == "convolution"]
    found = direct_geometry(instr)
    assert found is not None
    return DirectConv(**found, vector=8, registers=16)


@pytest.mark.parametrize("batch", [1, 2, 8])
def test_tiles_split_evenly_over_16_threads_from_batch_1(batch):
    """The benchmark's conv2d_3x3 layer at batch 1-8: at least 4 tiles per thread of 16, and
    blocks of the native pool (_BLOCKS_PER_THREAD per thread) within one tile of each other
    (every tile but a row's last one does the same work)."""
    cv = _geometry((batch, 32, 32, 16), (3, 3, 16, 32), window_strides=(1, 1), padding="SAME")
    assert cv.extent == batch * 32 * cv.tiles_per_row
    assert cv.extent >= 16 * 4
    blocks = min(cv.extent, 16 * conv_thunk._BLOCKS_PER_THREAD)
    sizes = [hi - lo for lo, hi in even_blocks(cv.extent, blocks)]
    assert len(sizes) == blocks and max(sizes) - min(sizes) <= 1
    # the kernel's registers: R x NV accumulators, NV kernel vectors and a broadcast fit 16
    assert cv.tile * cv.block + cv.block + 1 <= cv.registers


_CHILD = """
import hashlib, sys
import numpy as np, jax, jax.numpy as jnp
from jax import lax
from xlapy.backends.cpu.backend import CpuProgram
from xlapy.ir.parser import parse_module
def f(x, k):
    y = lax.conv_general_dilated(x, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    y = lax.reduce_window(y, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "SAME")
    return jnp.sum(y ** 2)
rng = np.random.default_rng(17)
x = rng.standard_normal((2, 24, 20, 8)).astype(np.float32)
k = rng.standard_normal((3, 3, 8, 24)).astype(np.float32)
text = jax.jit(jax.grad(f, argnums=(0, 1))).lower(x, k).as_text(dialect="hlo")
program = CpuProgram(parse_module(text), {"conv_library": False})
digest = hashlib.sha256()
for _ in range(3):  # the first run splits (SplitChoice's warm-up), later ones choose
    for leaf in program.run([x, k]):
        digest.update(np.ascontiguousarray(leaf).tobytes())
print(digest.hexdigest())
"""


def test_same_bits_at_any_thread_count(tmp_path):
    """A training step's convolutions and pooling (forward and gradients) in processes with
    1, 2, 3 and 16 threads: the same bits (each output element is summed by one tile in one
    order, and pooling rows are independent)."""
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    digests = {}
    for threads in (1, 2, 3, 16):
        env = dict(
            os.environ,
            XLAPY_NUM_THREADS=str(threads),
            JAX_PLATFORMS="cpu",
            PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
        )
        done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                              text=True, timeout=600)  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        digests[threads] = done.stdout.split()[-1]
    assert len(set(digests.values())) == 1, digests
