"""The kernel library's direct convolution (codegen/emit_conv_library.py: the geometry read
at run time, padding in its loops; option conv_library, on by default where it is no slower:
short last tiles) against the
interpreter over random geometries (strides, padding, negative padding, window and base
dilation, odd sizes, batch 1, output features that fill whole vectors, part of one and
several blocks, one input feature, edge tiles too large to stage), and bit for bit against
the kernel compiled per geometry (`conv_library=False`, emit_conv.py); f16/bf16 operands
through the padded copy (NCHW on the arena keeps the per-shape kernel); window reversal;
grouped convolutions keep the other paths; one library object serves convolutions of every
geometry."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from xlapy.backends.cpu.backend import CpuProgram
from xlapy.backends.cpu.codegen.emit_conv import DirectConv, vector_shape
from xlapy.backends.cpu.codegen.emit_conv_library import (
    conv_kernel,
    conv_params,
    library_by_default,
    menu,
)
from xlapy.backends.cpu.jit.engine import host_target
from xlapy.backends.cpu.jit.kernel import clear_kernel_cache
from xlapy.backends.cpu.runtime import conv_thunk
from xlapy.backends.cpu.runtime.conv_thunk import arena_geometry, direct_geometry
from xlapy.backends.interpreter import evaluate
from xlapy.ir.parser import parse_module

LIBRARY = "library c = convolution"  # through the padded copy
ARENA = "library convolution on the arena"
PER_SHAPE = "direct convolution on the arena"


@pytest.fixture(autouse=True)
def library(tmp_path, monkeypatch):
    """A fresh kernel cache and library directory; no gather path (these are small)."""
    monkeypatch.setenv("XLAPY_CACHE_DIR", str(tmp_path / "kernels"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XLAPY_LIBRARY_DIR", str(tmp_path / "library"))
    monkeypatch.setattr(conv_thunk, "_GATHER_MAX", 0)
    clear_kernel_cache()
    yield tmp_path / "library"
    clear_kernel_cache()


def conv_hlo(n, hw, c, k, o, stride=(1, 1), pads=((0, 0), (0, 0)), rhs=(1, 1), lhs=(1, 1),
             t="f32", labels="b01f_01io->b01f") -> tuple[str, tuple, tuple]:  # fmt: skip
    """A convolution's HLO text and its input and kernel shapes (NHWC / HWIO labels, or
    NCHW / OIHW with labels="bf01_oi01->bf01")."""
    outs = []
    for d in range(2):
        dilated = (hw[d] - 1) * lhs[d] + 1 + pads[d][0] + pads[d][1]
        window = (k[d] - 1) * rhs[d] + 1
        outs.append((dilated - window) // stride[d] + 1)
    nchw = labels.startswith("bf01")
    xs = (n, c, *hw) if nchw else (n, *hw, c)
    ks = (o, c, *k) if nchw else (*k, c, o)
    ys = (n, o, *outs) if nchw else (n, *outs, o)
    window = (f"size={k[0]}x{k[1]} stride={stride[0]}x{stride[1]} "
              f"pad={pads[0][0]}_{pads[0][1]}x{pads[1][0]}_{pads[1][1]} "
              f"lhs_dilate={lhs[0]}x{lhs[1]} rhs_dilate={rhs[0]}x{rhs[1]}")  # fmt: skip
    dims = ",".join
    text = f"""HloModule conv
ENTRY e {{
  x = {t}[{dims(map(str, xs))}] parameter(0)
  k = {t}[{dims(map(str, ks))}] parameter(1)
  ROOT c = {t}[{dims(map(str, ys))}] convolution(x, k), window={{{window}}}, dim_labels={labels}
}}"""
    return text, xs, ks


def _random_case(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    k = tuple(int(v) for v in rng.integers(1, 6, 2))
    rhs = tuple(int(v) for v in rng.choice([1, 1, 2, 3], 2))
    lhs = tuple(int(v) for v in rng.choice([1, 1, 1, 2], 2))
    pads = tuple((int(a), int(b)) for a, b in rng.integers(-1, 4, (2, 2)))
    hw = tuple(int(kk - 1) * r + int(rng.integers(1, 14)) for kk, r in zip(k, rhs, strict=True))
    return {
        "n": int(rng.choice([1, 1, 2, 3])),
        "hw": hw,
        "c": int(rng.choice([1, 2, 3, 5, 8, 13])),
        "k": k,
        "o": int(rng.choice([4, 5, 8, 16, 19, 32, 33, 48, 70])),
        "stride": tuple(int(v) for v in rng.integers(1, 4, 2)),
        "pads": pads,
        "rhs": rhs,
        "lhs": lhs,
    }


def _run(text: str, args, library: bool) -> tuple[np.ndarray, str]:
    program = CpuProgram(parse_module(text), {"conv_library": library})
    return np.asarray(program.run(args)), program.compiled.thunk_listing()


def _check(text: str, xs, ks, seed: int, dtype=np.float32) -> None:
    rng = np.random.default_rng(seed)
    args = [rng.standard_normal(xs).astype(dtype), rng.standard_normal(ks).astype(dtype)]
    got, listing = _run(text, args, True)
    assert (LIBRARY in listing or ARENA in listing) and PER_SHAPE not in listing, listing
    want = np.asarray(evaluate(parse_module(text), args)).astype(np.float64)
    tol = 1e-5 if dtype == np.float32 else 3e-2
    mag = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol * mag)
    if dtype == np.float32:
        per_shape, listing = _run(text, args, False)
        assert ARENA not in listing, listing  # on the arena, or its padded copy
        assert np.array_equal(got, per_shape), "not the per-shape kernel's bits"


CASES = [_random_case(seed) for seed in range(24)]


@pytest.mark.parametrize("case", CASES, ids=[f"random{i}" for i in range(len(CASES))])
def test_random_geometries_match_the_interpreter_and_the_per_shape_kernel(case):
    text, xs, ks = conv_hlo(**case)
    if direct_geometry(parse_module(text).entry.root) is None:
        pytest.skip("outside the direct path (an empty output)")
    _check(text, xs, ks, zlib.crc32(text.encode()))


@pytest.mark.parametrize(
    "case",
    [
        {"n": 1, "hw": (9, 11), "c": 3, "k": (3, 3), "o": 8, "pads": ((1, 1), (1, 1))},
        {"n": 2, "hw": (7, 30), "c": 6, "k": (3, 3), "o": 70},  # blocks, then a part vector
        {
            "n": 2,
            "hw": (17, 19),
            "c": 4,
            "k": (5, 5),
            "o": 32,
            "stride": (2, 2),
            "pads": ((2, 2), (2, 2)),
        },
        {"n": 1, "hw": (3, 4), "c": 3, "k": (3, 3), "o": 8, "pads": ((4, 4), (5, 3))},
        {"n": 3, "hw": (9, 1), "c": 4, "k": (3, 1), "o": 16, "pads": ((1, 1), (0, 0))},
        {"n": 5, "hw": (16, 16), "c": 1, "k": (3, 3), "o": 16, "pads": ((1, 1), (1, 1))},
        {"n": 1, "hw": (5, 12), "c": 700, "k": (3, 3), "o": 16, "pads": ((1, 1), (1, 1))},
    ],
    ids=[
        "batch1_same",
        "two_blocks_tail",
        "wide_strided",
        "padding_only",
        "one_column",
        "one_input_feature",
        "edge_tiles_too_large_to_stage",
    ],
)
def test_named_geometries(case):
    text, xs, ks = conv_hlo(**case)
    _check(text, xs, ks, zlib.crc32(text.encode()))


SAME = ((1, 1), (1, 1))
DEFAULT_CASES = {
    # small convolutions keep the per-geometry kernel (in a program the library's call
    # costs more there, RESULTS.md)
    "small": ({"n": 2, "hw": (9, 11), "c": 3, "k": (3, 3), "o": 8, "pads": SAME}, False),
    "small_many_features": ({"n": 6, "hw": (4, 4), "c": 8, "k": (3, 3), "o": 40}, False),
    "mid": ({"n": 4, "hw": (16, 16), "c": 16, "k": (3, 3), "o": 16, "pads": SAME}, False),
    # a heavy kernel whose tile (6) does not divide its row (10): the library
    "short_tile": ({"n": 1, "hw": (10, 10), "c": 64, "k": (3, 3), "o": 64, "pads": SAME}, True),
}


@pytest.mark.parametrize("name", DEFAULT_CASES)
def test_default_rule(name):
    """Without the option the library runs where library_by_default says (short last
    tiles), with the per-shape kernel's bits."""
    case, library = DEFAULT_CASES[name]
    text, xs, ks = conv_hlo(**case)
    lanes = vector_shape(host_target().features)[0]
    geometry = arena_geometry(parse_module(text).entry.root)
    assert geometry is not None
    expected = library_by_default(geometry, lanes)
    if lanes == 16:  # the cases are chosen for AVX-512's tiles
        assert expected == library
    rng = np.random.default_rng(zlib.crc32(text.encode()))
    args = [rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ks).astype(np.float32)]
    program = CpuProgram(parse_module(text))
    listing = program.compiled.thunk_listing()
    assert (ARENA in listing) == expected and (PER_SHAPE in listing) != expected, listing
    per_shape, _ = _run(text, args, False)
    assert np.array_equal(np.asarray(program.run(args)), per_shape)


def test_window_reversal():
    text, xs, ks = conv_hlo(2, (5, 6), 3, (3, 2), 4, pads=((1, 1), (0, 1)))
    text = text.replace(" rhs_dilate=1x1}", " rhs_dilate=1x1 rhs_reversal=1x0}")
    assert "rhs_reversal" in text
    _check(text, xs, ks, 5)


def test_nchw_on_the_arena_keeps_the_per_shape_kernel():
    text, _, _ = conv_hlo(2, (10, 9), 3, (3, 3), 7, pads=((1, 1), (1, 1)),
                          labels="bf01_oi01->bf01")  # fmt: skip
    program = CpuProgram(parse_module(text), {"conv_library": True})
    listing = program.compiled.thunk_listing()
    assert PER_SHAPE in listing and ARENA not in listing, listing


@pytest.mark.parametrize("t,dtype", [("f16", np.float16), ("bf16", None)])
def test_half_operands(t, dtype):
    import ml_dtypes

    text, xs, ks = conv_hlo(2, (8, 9), 3, (3, 3), 10, pads=((1, 1), (1, 1)), t=t)
    _check(text, xs, ks, 11, dtype or ml_dtypes.bfloat16)


def test_grouped_convolutions_keep_the_other_paths():
    text = """HloModule grouped
ENTRY e {
  x = f32[2,8,8,6] parameter(0)
  k = f32[3,3,3,8] parameter(1)
  ROOT c = f32[2,8,8,8] convolution(x, k), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f, feature_group_count=2
}"""  # noqa: E501
    rng = np.random.default_rng(3)
    args = [rng.standard_normal((2, 8, 8, 6), np.float32),
            rng.standard_normal((3, 3, 3, 8), np.float32)]  # fmt: skip
    got, _ = _run(text, args, True)
    want = np.asarray(evaluate(parse_module(text), args))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_one_library_object_for_every_geometry(library):
    """Convolutions whose rows take the same tile and block, in different geometries."""
    lanes = vector_shape(host_target().features)[0]
    kernels = set()
    for case in [
        {"n": 1, "hw": (9, 12), "c": 3, "k": (3, 3), "o": 16, "pads": ((1, 1), (1, 1))},
        {"n": 2, "hw": (12, 13), "c": 5, "k": (5, 2), "o": 16, "stride": (2, 1)},
        {"n": 3, "hw": (8, 16), "c": 2, "k": (2, 3), "o": 16, "rhs": (2, 2), "lhs": (2, 1)},
    ]:
        text, xs, ks = conv_hlo(**case)
        geometry = arena_geometry(parse_module(text).entry.root)
        assert geometry is not None
        kernels.add(conv_kernel(geometry, lanes))
        _run(text, [np.ones(xs, np.float32), np.ones(ks, np.float32)], True)
    objects = [p for p in library.rglob("*") if p.is_file()]
    assert len(kernels) == 1 and len(objects) == 1, (kernels, objects)


def test_parameter_block_of_a_geometry():
    text, _, _ = conv_hlo(2, (9, 11), 3, (3, 3), 19, stride=(2, 1), pads=((1, 1), (1, 1)))
    root = parse_module(text).entry.root
    padded, arena = direct_geometry(root), arena_geometry(root)
    assert padded is not None and arena is not None
    kernel = conv_kernel(padded, 8)  # 3 vectors of 8: NV = 3 (R = 3) beats 1 (R = 8) and 2
    assert kernel in menu(8) and kernel.tile == 3 and kernel.block == 3
    assert conv_kernel(arena, 8) == kernel
    # o0 o1 k0 k1 c s0 s1 d0 d1 features width h w p0 p1 e0 e1 x0..x3 y0..y3 tiles
    assert conv_params(kernel, padded) == (
        5, 11, 3, 3, 3, 2, 1, 1, 1, 19, 24, 11, 13, 0, 0, 1, 1, 11 * 13 * 3, 13 * 3, 3, 1,
        5 * 11 * 19, 11 * 19, 19, 1, 4,
    )  # fmt: skip
    assert conv_params(kernel, arena)[11:21] == (9, 11, 1, 1, 1, 1, 9 * 11 * 3, 11 * 3, 3, 1)


def test_menu_holds_the_tile_and_block_of_every_row():
    for lanes in (4, 8, 16):
        registers = 32 if lanes >= 16 else 16
        for o1 in range(1, 40):
            for features in (4, 8, 16, 24, 40, 64, 96, 128):
                geometry = {"nb": 1, "sizes": (3, o1 + 2), "pads": (0, 0),
                            "base_dilations": (1, 1), "checked": (False, False),
                            "channels": 300, "outs": (1, o1), "ksizes": (3, 3),
                            "strides": (1, 1), "dilations": (1, 1), "features": features,
                            "x_strides": (0, 0, 1, 1), "out_strides": (0, 0, 1, 1)}  # fmt: skip
                conv = DirectConv(**geometry, vector=lanes, registers=registers)
                kernel = conv_kernel(geometry, lanes)
                assert kernel.block == conv.block
                # a short last tile (emit_conv's `heavy` kernels): a tile dividing the row
                assert kernel.tile == conv.tile or (conv.short and o1 % kernel.tile == 0)
                assert kernel in menu(lanes), (kernel, o1, features)
