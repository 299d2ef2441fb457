"""The kernel library's pooling (codegen/emit_window_library.py: reduce-windows generic in
their geometry) against the interpreter, bit for bit, and against the kernel compiled per
shape (`window_library=False`, emit_window.py): random windows, strides, padding, window and
base dilation, odd sizes, batch 1, in NHWC (a contiguous run of features) and NCHW (none);
add, maximum and minimum; f32 and f64; a column-major layout; what the library leaves to the
per-shape kernel (other reducers and types, variadic reduce-windows); one library object for
pooling of every geometry."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from xlapy.backends.cpu.backend import CpuProgram
from xlapy.backends.cpu.codegen.emit_window_library import window_extent, window_library_kernel
from xlapy.backends.cpu.runtime.kernel_thunk import KernelThunk
from xlapy.backends.interpreter import evaluate
from xlapy.ir.opcodes import Opcode
from xlapy.ir.parser import parse_module

INITS = {"add": "0", "maximum": "-inf", "minimum": "inf", "multiply": "1"}
NP = {"f32": np.float32, "f64": np.float64, "f16": np.float16}
ON = {"optimize": False, "window_library": True}  # off by default: slower at run time


@pytest.fixture(autouse=True)
def _fresh_library(library):
    """Every test here on a fresh kernel cache and library directory (conftest's `library`)."""
    return library


def _out_size(n, size, stride, pad, wdil, bdil) -> int:
    padded = (n - 1) * bdil + 1 + pad[0] + pad[1]
    return max(0, (padded - ((size - 1) * wdil + 1)) // stride + 1)


def window_hlo(shape, sizes, strides, pads, wdils, bdils, op="maximum", t="f32", layout=None):
    outs = [_out_size(*a) for a in zip(shape, sizes, strides, pads, wdils, bdils, strict=True)]
    x = "x".join
    window = (f"size={x(map(str, sizes))} stride={x(map(str, strides))} "
              f"pad={x(f'{lo}_{hi}' for lo, hi in pads)} lhs_dilate={x(map(str, bdils))} "
              f"rhs_dilate={x(map(str, wdils))}")  # fmt: skip
    lay = "" if layout is None else "{" + ",".join(map(str, layout)) + "}"
    return f"""HloModule pool
r {{
  a = {t}[] parameter(0)
  b = {t}[] parameter(1)
  ROOT c = {t}[] {op}(a, b)
}}
ENTRY e {{
  x = {t}[{",".join(map(str, shape))}]{lay} parameter(0)
  i = {t}[] constant({INITS[op]})
  ROOT y = {t}[{",".join(map(str, outs))}]{lay} reduce-window(x, i), window={{{window}}}, to_apply=r
}}"""


def _random_case(seed: int, nchw: bool) -> dict:
    rng = np.random.default_rng(seed)
    sizes = [int(v) for v in rng.integers(1, 5, 2)]
    wdils = [int(v) for v in rng.choice([1, 1, 2], 2)]
    bdils = [int(v) for v in rng.choice([1, 1, 1, 2], 2)]
    pads = [tuple(int(v) for v in rng.integers(0, 3, 2)) for _ in range(2)]
    hw = [int(s - 1) * d + int(rng.integers(1, 12)) for s, d in zip(sizes, wdils, strict=True)]
    strides = [int(v) for v in rng.integers(1, 4, 2)]
    n, c = int(rng.choice([1, 2, 3])), int(rng.choice([1, 3, 5, 16, 33]))
    if nchw:
        return {"shape": (n, c, *hw), "sizes": (1, 1, *sizes), "strides": (1, 1, *strides),
                "pads": ((0, 0), (0, 0), *pads), "wdils": (1, 1, *wdils),
                "bdils": (1, 1, *bdils)}  # fmt: skip
    return {"shape": (n, *hw, c), "sizes": (1, *sizes, 1), "strides": (1, *strides, 1),
            "pads": ((0, 0), *pads, (0, 0)), "wdils": (1, *wdils, 1),
            "bdils": (1, *bdils, 1)}  # fmt: skip


def _thunk(program: CpuProgram):
    thunks = [t for t in program.compiled.entry.thunks if t.instr.opcode is Opcode.REDUCE_WINDOW]
    assert len(thunks) == 1
    return thunks[0]


def _check(text: str, shape, t: str = "f32") -> None:
    rng = np.random.default_rng(zlib.crc32(text.encode()))
    x = rng.standard_normal(shape).astype(NP[t])
    library = CpuProgram(parse_module(text), ON)
    thunk = _thunk(library)
    assert isinstance(thunk, KernelThunk) and thunk.data is not None  # the library's kernel
    got = np.asarray(library.run([x]))
    want = np.asarray(evaluate(parse_module(text), [x]))
    np.testing.assert_array_equal(got, want)
    own = CpuProgram(parse_module(text), {"optimize": False, "window_library": False})
    assert _thunk(own).data is None
    np.testing.assert_array_equal(got, np.asarray(own.run([x])))


CASES = [(_random_case(seed, nchw), nchw) for seed in range(12) for nchw in (False, True)]


@pytest.mark.parametrize("op", ["add", "maximum", "minimum"])
@pytest.mark.parametrize("case", CASES, ids=[f"{'nchw' if c[1] else 'nhwc'}{i}"
                                             for i, c in enumerate(CASES)])  # fmt: skip
def test_random_pooling_matches_the_interpreter_bit_for_bit(case, op):
    geometry, _ = case
    if 0 in [_out_size(*a) for a in zip(*geometry.values(), strict=True)]:
        pytest.skip("an empty result")
    _check(window_hlo(**geometry, op=op), geometry["shape"])


@pytest.mark.parametrize("op", ["add", "maximum"])
def test_f64_and_a_column_major_layout(op):
    args = {"shape": (2, 9, 7, 5), "sizes": (1, 3, 3, 1), "strides": (1, 2, 2, 1),
            "pads": ((0, 0), (1, 1), (1, 1), (0, 0)), "wdils": (1, 1, 1, 1),
            "bdils": (1, 1, 1, 1)}  # fmt: skip
    _check(window_hlo(**args, op=op, t="f64"), args["shape"], "f64")
    _check(window_hlo(**args, op=op, layout=(1, 2, 3, 0)), args["shape"])


def test_geometry_of_nhwc_max_pooling():
    text = window_hlo((2, 9, 7, 16), (1, 3, 3, 1), (1, 2, 2, 1), ((0, 0), (1, 1), (1, 1), (0, 0)),
                      (1, 1, 1, 1), (1, 1, 1, 1))  # fmt: skip
    found = window_library_kernel(parse_module(text).entry.root, 8)
    assert not isinstance(found, str)
    kernel, params = found
    assert kernel.name == "window_f32_maximum"
    # run (features), then per row dim (one padding dim, N, H, W):
    # o n xs ys size stride wdil bdil pad
    assert params == (16, 1, 1, 0, 0, 1, 1, 1, 1, 0,
                      2, 2, 9 * 7 * 16, 5 * 4 * 16, 1, 1, 1, 1, 0,
                      5, 9, 7 * 16, 4 * 16, 3, 2, 1, 1, 1,
                      4, 7, 16, 16, 3, 2, 1, 1, 1)  # fmt: skip
    assert window_extent(params) == 2 * 5 * 4


def test_off_by_default():
    geometry = {"shape": (2, 6, 6, 3), "sizes": (1, 2, 2, 1), "strides": (1, 2, 2, 1),
                "pads": ((0, 0),) * 4, "wdils": (1,) * 4, "bdils": (1,) * 4}  # fmt: skip
    program = CpuProgram(parse_module(window_hlo(**geometry)), {"optimize": False})
    assert _thunk(program).data is None


def test_what_the_library_leaves_to_the_per_shape_kernel():
    geometry = {"shape": (2, 6, 6, 3), "sizes": (1, 2, 2, 1), "strides": (1, 2, 2, 1),
                "pads": ((0, 0),) * 4, "wdils": (1,) * 4, "bdils": (1,) * 4}  # fmt: skip
    product = window_hlo(**geometry, op="multiply")
    assert "reducer" in window_library_kernel(parse_module(product).entry.root, 8)
    half = window_hlo(**geometry, t="f16")
    assert "element type" in window_library_kernel(parse_module(half).entry.root, 8)
    for text, t in ((product, "f32"), (half, "f16")):
        x = np.random.default_rng(1).standard_normal(geometry["shape"]).astype(NP[t])
        program = CpuProgram(parse_module(text), ON)
        assert _thunk(program).data is None
        np.testing.assert_array_equal(np.asarray(program.run([x])),
                                      np.asarray(evaluate(parse_module(text), [x])))  # fmt: skip


def test_one_library_object_for_every_geometry(library):
    for (geometry, _), op in zip(CASES[:4], ["maximum"] * 4, strict=True):
        text = window_hlo(**geometry, op=op)
        CpuProgram(parse_module(text), ON).run([np.ones(geometry["shape"], np.float32)])
    assert len([p for p in library.rglob("*") if p.is_file()]) == 1
