"""Elementwise kernels that run as one flat loop over their buffers (emitter.py,
`_flat_elementwise`) against the interpreter: NHWC shapes with a short minor dim,
non-default layouts, scalar broadcasts and constants, multi-output roots, converts, pred
results, in-place variants and parallel chunks; kernels that must keep the loop nest do."""

from __future__ import annotations

import numpy as np
import pytest

from xlapy.backends.cpu import compile_computation, run_parallel
from xlapy.backends.interpreter.evaluator import Interpreter
from xlapy.ir.parser import parse_module


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("XLAPY_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "kernels"))


RNG = np.random.default_rng(20261122)


def _inputs(module):
    args = []
    for p in module.entry.parameters:
        shape = p.shape
        if shape.dtype == np.bool_:
            args.append(RNG.random(shape.dims) < 0.5)
        else:
            x = (RNG.standard_normal(shape.dims) * 3).reshape(-1)
            edges = np.array([np.nan, -0.0, np.inf, 0.0, -np.inf, 1.0, 2.0])
            x[RNG.choice(x.size, min(x.size, edges.size), replace=False)] = edges[: x.size]
            x = x.reshape(shape.dims)
            args.append(x.astype(shape.dtype))
    return args


# (name, body over parameters p0 and p1 declared with DECL, flat loop expected)
CASES = {
    "relu_nhwc": ("f32[6,5,7,3]", "c = f32[] constant(0)\n b = f32[6,5,7,3] broadcast(c), "
                  "dimensions={}\n ROOT r = f32[6,5,7,3] maximum(p0, b)", True),
    "layout_0123": ("f32[6,5,7,3]{0,1,2,3}", "a = f32[6,5,7,3]{0,1,2,3} add(p0, p1)\n"
                    " ROOT r = f32[6,5,7,3]{0,1,2,3} multiply(a, p0)", True),
    "convert_and_compare": ("f32[4,9,2]", "c = f16[4,9,2] convert(p0)\n"
                            " ROOT r = pred[4,9,2] compare(p0, p1), direction=LT", True),
    "multi_output": ("f32[3,11,5]", "a = f32[3,11,5] add(p0, p1)\n"
                     " s = f32[3,11,5] subtract(p0, p1)\n"
                     " ROOT r = (f32[3,11,5], f32[3,11,5]) tuple(a, s)", True),
    "select_clamp": ("f32[5,4,3]", "z = f32[] constant(-1)\n o = f32[] constant(1)\n"
                     " k = f32[5,4,3] clamp(z, p0, o)\n g = pred[5,4,3] compare(p0, p1), "
                     "direction=GT\n ROOT r = f32[5,4,3] select(g, k, p1)", True),
    "scalar_arithmetic": ("f32[7,6]", "c = f32[] constant(2)\n d = f32[] multiply(c, c)\n"
                          " b = f32[7,6] broadcast(d), dimensions={}\n"
                          " ROOT r = f32[7,6] divide(p0, b)", True),
    "row_broadcast_keeps_nest": ("f32[7,6]", "s = f32[1,6] slice(p0), slice={[0:1], [0:6]}\n"
                                 " t = f32[6] reshape(s)\n b = f32[7,6] broadcast(t), "
                                 "dimensions={1}\n ROOT r = f32[7,6] add(p1, b)", False),
    "mixed_layouts_keep_nest": ("f32[5,8]", "ROOT r = f32[5,8]{0,1} add(p0, p1)", False),
}  # fmt: skip


def _module(decl: str, body: str):
    text = (f"HloModule m\nENTRY e {{\n p0 = {decl} parameter(0)\n p1 = {decl} parameter(1)\n"
            f" {body}\n}}")  # fmt: skip
    return parse_module(text)


@pytest.mark.parametrize("name", list(CASES))
def test_flat_kernels_match_interpreter(name):
    decl, body, flat = CASES[name]
    module = _module(decl, body)
    kernel = compile_computation(module.entry, name)
    assert ("flat.header" in kernel.llvm_ir) == flat, kernel.llvm_ir
    if flat:
        assert kernel.outer_extent == module.entry.parameters[0].shape.num_elements
    args = _inputs(module)
    got, want = kernel(*args), Interpreter().run(module, list(args))
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)  # elementwise: the same operations, bit for bit
        if g.dtype.kind == "f":
            np.testing.assert_array_equal(np.signbit(g), np.signbit(w))
    chunks = run_parallel(kernel, args, chunks=5)
    for c, g in zip(chunks if isinstance(chunks, tuple) else (chunks,), got, strict=True):
        np.testing.assert_array_equal(c, g)


def test_flat_in_place_variant():
    module = _module("f32[4,6,5,3]", "c = f32[] constant(0)\n b = f32[4,6,5,3] broadcast(c), "
                     "dimensions={}\n ROOT r = f32[4,6,5,3] maximum(p0, b)")  # fmt: skip
    kernel = compile_computation(module.entry, "relu_in_place", in_place=((0, 0),))
    assert "flat.header" in kernel.llvm_ir
    x = RNG.standard_normal((4, 6, 5, 3)).astype(np.float32)
    want = np.maximum(x, 0)
    buf = x.copy()
    kernel.run_raw([buf.ctypes.data, buf.ctypes.data, x.ctypes.data])
    np.testing.assert_array_equal(buf, want)
