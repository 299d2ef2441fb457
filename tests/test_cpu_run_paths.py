"""CpuProgram.run's two paths: the short one (every parameter one row-major array that no
output aliases, every output a fresh allocation of its own, called with C-contiguous
arrays of the right dtypes) and the general one (anything else). Both must give the
interpreter's results; outputs never share memory with arguments or each other."""

from __future__ import annotations

import numpy as np
import pytest

from xlapy.backends.cpu.backend import CpuProgram
from xlapy.backends.interpreter import evaluate
from xlapy.errors import EvaluationError
from xlapy.ir.parser import parse_module

DOT_TUPLE = """HloModule t
ENTRY e {
  a = f32[8,16] parameter(0)
  b = f32[16,4] parameter(1)
  d = f32[8,4] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  e = f32[8,4] exponential(d)
  t = f32[4,8] transpose(e), dimensions={1,0}
  z = f32[] constant(0)
  r = f32[4] reduce(t, z), dimensions={1}, to_apply=add
  ROOT o = (f32[4,8], f32[4]) tuple(t, r)
}
add {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = f32[] add(x, y)
}"""

SCALE = """HloModule s
ENTRY e {
  a = f32[] parameter(0)
  x = s32[3,5] parameter(1)
  c = f32[3,5] convert(x)
  b = f32[3,5] broadcast(a), dimensions={}
  ROOT m = f32[3,5] multiply(b, c)
}"""

ALIASED = """HloModule al, input_output_alias={ {}: (0, {}, may-alias) }
ENTRY e {
  p = f32[6] parameter(0)
  ROOT n = f32[6] negate(p)
}"""


pytestmark = pytest.mark.usefixtures("kernel_cache")


def _leaves(value):
    return list(value) if isinstance(value, tuple) else [value]


def _check(text: str, args: list, rtol: float = 1e-5) -> list[np.ndarray]:
    module = parse_module(text)
    got = _leaves(CpuProgram(parse_module(text)).run(args))
    want = _leaves(evaluate(module, [np.array(a, order="C") for a in args]))
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=rtol, atol=1e-5)
        assert g.flags.c_contiguous
        assert not any(np.shares_memory(g, a) for a in args)
    return got


def _dot_args(rng):
    return [rng.standard_normal(s).astype(np.float32) for s in ((8, 16), (16, 4))]


def test_short_path_applies_to_plain_programs_only():
    assert CpuProgram(parse_module(DOT_TUPLE))._simple is not None
    assert CpuProgram(parse_module(SCALE))._simple is not None
    assert CpuProgram(parse_module(ALIASED))._simple is None


def test_short_path_with_temps_and_a_tuple_result():
    rng = np.random.default_rng(1)
    program = CpuProgram(parse_module(DOT_TUPLE))
    assert program._temps  # the arena path of the short run
    a, b = _dot_args(rng)
    first = _leaves(program.run([a, b]))
    second = _leaves(program.run([a, b]))
    for x, y in zip(first, second, strict=True):
        np.testing.assert_array_equal(x, y)
        assert not np.shares_memory(x, y)  # every call gets fresh outputs
    assert not np.shares_memory(first[0], first[1])
    _check(DOT_TUPLE, [a, b])


@pytest.mark.parametrize(
    "layout",
    ["c", "fortran", "strided", "read-only", "0-d scalar"],
)
def test_every_argument_layout_gives_the_same_result(layout):
    rng = np.random.default_rng(2)
    a = np.float32(rng.standard_normal())
    x = rng.integers(-50, 50, (3, 5)).astype(np.int32)
    if layout == "fortran":
        x = np.asfortranarray(x)
    elif layout == "strided":
        x = rng.integers(-50, 50, (3, 10)).astype(np.int32)[:, ::2]
    elif layout == "read-only":
        x.flags.writeable = False
    a_arg = a if layout == "0-d scalar" else np.array(a)
    _check(SCALE, [a_arg, x])
    if layout == "read-only":
        assert not x.flags.writeable


def test_wrong_arguments_raise_on_either_path():
    program = CpuProgram(parse_module(SCALE))
    good = np.ones((3, 5), np.int32)
    with pytest.raises(EvaluationError, match=r"expects s32\[3,5\]"):
        program.run([np.array(2, np.float32), good.astype(np.float32)])
    with pytest.raises(EvaluationError, match=r"expects s32\[3,5\]"):
        program.run([np.array(2, np.float32), np.ones((5, 3), np.int32)])
    with pytest.raises(EvaluationError, match="takes 2 arguments, 1 were given"):
        program.run([good])


def test_aliased_program_still_writes_donated_arguments_in_place():
    program = CpuProgram(parse_module(ALIASED))
    x = np.random.default_rng(3).standard_normal(6).astype(np.float32)
    kept = x.copy()
    out = program.run([x], frozenset({0}))
    assert out is x
    np.testing.assert_array_equal(x, -kept)
    y = kept.copy()
    fresh = program.run([y])
    np.testing.assert_array_equal(y, kept)
    np.testing.assert_array_equal(fresh, -kept)
