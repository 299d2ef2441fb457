"""Interpreter shape and data-movement ops, as HLO text, checked against NumPy and JAX."""

import ml_dtypes
import numpy as np
import pytest
from jax import lax

from xlapy.backends.interpreter import evaluate
from xlapy.errors import EvaluationError
from xlapy.ir.parser import parse_module

pytestmark = pytest.mark.usefixtures("x64_mode")


def run_hlo(text, *args):
    return evaluate(parse_module(text), list(args))


def one_op(operand, result, op_text):
    return f"""HloModule m
ENTRY e {{
  x = {operand} parameter(0)
  ROOT r = {result} {op_text}
}}"""


RNG = np.random.default_rng(2024)
X234 = RNG.standard_normal((2, 3, 4)).astype(np.float32)

# (id, operand shape text, result shape text, op text, input, expected)
CASES = [
    (
        "broadcast-scalar",
        "f32[]",
        "f32[2,3]",
        "broadcast(x), dimensions={}",
        np.array(1.5, np.float32),
        np.full((2, 3), 1.5, np.float32),
    ),
    (
        "broadcast-middle",
        "f32[3]",
        "f32[2,3,4]",
        "broadcast(x), dimensions={1}",
        X234[0, :, 0],
        np.broadcast_to(X234[0, :, 0][None, :, None], (2, 3, 4)),
    ),
    (
        "broadcast-transposing",
        "f32[2,3]",
        "f32[3,5,2]",
        "broadcast(x), dimensions={2,0}",
        X234[:, :, 0],
        np.broadcast_to(X234[:, :, 0].T[:, None, :], (3, 5, 2)),
    ),
    ("reshape", "f32[2,3,4]", "f32[4,6]", "reshape(x)", X234, X234.reshape(4, 6)),
    (
        "transpose",
        "f32[2,3,4]",
        "f32[4,2,3]",
        "transpose(x), dimensions={2,0,1}",
        X234,
        np.transpose(X234, (2, 0, 1)),
    ),
    (
        "slice",
        "f32[2,3,4]",
        "f32[1,2,2]",
        "slice(x), slice={[1:2], [0:3:2], [1:4:2]}",
        X234,
        X234[1:2, 0:3:2, 1:4:2],
    ),
    (
        "reverse",
        "f32[2,3,4]",
        "f32[2,3,4]",
        "reverse(x), dimensions={0,2}",
        X234,
        X234[::-1, :, ::-1],
    ),
    ("copy", "f32[2,3,4]", "f32[2,3,4]", "copy(x)", X234, X234),
    ("bitcast-reshape", "f32[2,3,4]", "f32[6,4]", "bitcast(x)", X234, X234.reshape(6, 4)),
    (
        "get-dimension-size",
        "f32[2,3,4]",
        "s32[]",
        "get-dimension-size(x), dimensions={2}",
        X234,
        np.array(4, np.int32),
    ),
]


@pytest.mark.parametrize(
    "operand,result,op,x,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_shape_op(operand, result, op, x, expected):
    ours = run_hlo(one_op(operand, result, op), x)
    assert isinstance(ours, np.ndarray) and ours.dtype == expected.dtype
    np.testing.assert_array_equal(ours, expected)


def test_concatenate():
    text = """HloModule m
ENTRY e {
  a = s32[2,3] parameter(0)
  b = s32[2,1] parameter(1)
  c = s32[2,2] parameter(2)
  ROOT r = s32[2,6] concatenate(a, b, c), dimensions={1}
}"""
    a, b, c = (RNG.integers(-50, 50, s).astype(np.int32) for s in ((2, 3), (2, 1), (2, 2)))
    np.testing.assert_array_equal(run_hlo(text, a, b, c), np.concatenate([a, b, c], 1))


PAD_CASES = [
    ((1, 2, 0), (0, 0, 0)),
    ((0, 0, 1), (2, 1, 2)),
    ((-1, 1, 0), (1, -2, 1)),
    ((-2, -1, 1), (0, 3, 0)),
    ((3, -4, 2), (-1, -1, 3)),
]


@pytest.mark.parametrize("pad0,pad1", PAD_CASES, ids=str)
def test_pad_matches_lax_pad(pad0, pad1):
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    value = np.array(-7.0, np.float32)
    expected = np.asarray(lax.pad(x, value, [pad0, pad1]))
    spec = "x".join("_".join(str(v) for v in p) for p in (pad0, pad1))
    text = f"""HloModule m
ENTRY e {{
  x = f32[3,4] parameter(0)
  v = f32[] parameter(1)
  ROOT r = f32[{expected.shape[0]},{expected.shape[1]}] pad(x, v), padding={spec}
}}"""
    np.testing.assert_array_equal(run_hlo(text, x, value), expected)


@pytest.mark.parametrize(
    "t,dtype",
    [
        ("s32", np.int32),
        ("f32", np.float32),
        ("u8", np.uint8),
        ("bf16", ml_dtypes.bfloat16),
        ("f16", np.float16),
        ("s64", np.int64),
    ],
)
@pytest.mark.parametrize("dim", [0, 1])
def test_iota(t, dtype, dim):
    text = f"""HloModule m
ENTRY e {{
  ROOT r = {t}[300,3] iota(), iota_dimension={dim}
}}"""
    expected = np.asarray(lax.broadcasted_iota(dtype, (300, 3), dim))
    ours = run_hlo(text)
    assert ours.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(ours.astype(np.float64), expected.astype(np.float64))


def test_bitcast_changing_element_type_reinterprets_bytes():
    x = RNG.standard_normal(4).astype(np.float32)
    ours = run_hlo(one_op("f32[4]", "s32[2,2]", "bitcast(x)"), x)
    np.testing.assert_array_equal(ours, x.view(np.int32).reshape(2, 2))


def test_dynamic_reshape_and_set_dimension_size_keep_bounds():
    text = """HloModule m
ENTRY e {
  x = f32[2,6] parameter(0)
  n = s32[] parameter(1)
  s = f32[2,<=6] set-dimension-size(x, n), dimensions={1}
  ROOT r = f32[3,4] dynamic-reshape(x, n, n)
}"""
    x = RNG.standard_normal((2, 6)).astype(np.float32)
    np.testing.assert_array_equal(run_hlo(text, x, np.array(3, np.int32)), x.reshape(3, 4))


def test_bad_reshape_and_transpose_are_evaluation_errors():
    from xlapy.backends.interpreter.registry import rule_for
    from xlapy.ir.instruction import HloInstruction
    from xlapy.ir.opcodes import Opcode
    from xlapy.ir.shapes import Shape

    instr = HloInstruction("bad", Opcode.RESHAPE, Shape.array("f32", (5,)))
    with pytest.raises(EvaluationError, match="bad: cannot reshape 6 elements"):
        rule_for(Opcode.RESHAPE)(instr, [np.ones((2, 3), np.float32)], None)
    perm = HloInstruction(
        "perm", Opcode.TRANSPOSE, Shape.array("f32", (3, 2)), attrs={"dimensions": (1, 1)}
    )
    with pytest.raises(EvaluationError, match=r"perm: dimensions=\[1, 1\] is not a permutation"):
        rule_for(Opcode.TRANSPOSE)(perm, [np.ones((2, 3), np.float32)], None)


@pytest.mark.parametrize(
    "in_shape, out_shape, expected",
    [
        # Same layout: a plain reshape in row-major order.
        ("f32[2,3]{1,0}", "f32[3,2]{1,0}", lambda x: x.reshape(3, 2)),
        # A layout-changing bitcast is a physical transpose (what XLA's optimized HLO uses).
        ("f32[2,3]{1,0}", "f32[3,2]{0,1}", lambda x: x.T),
        ("f32[2,3]{0,1}", "f32[2,3]{1,0}", lambda x: x.T.reshape(2, 3)),
        ("f32[2,3,4]{2,1,0}", "f32[4,2,3]{0,2,1}", lambda x: x.transpose(2, 0, 1)),
    ],
)
def test_bitcast_follows_layouts(in_shape, out_shape, expected):
    from xlapy.backends.interpreter import evaluate
    from xlapy.ir.parser import parse_module

    text = (
        f"HloModule m\n\nENTRY main {{\n  p = {in_shape} parameter(0)\n"
        f"  ROOT b = {out_shape} bitcast(p)\n}}\n"
    )
    dims = tuple(int(d) for d in in_shape[4 : in_shape.index("]")].split(","))
    x = np.random.default_rng(0).standard_normal(dims).astype(np.float32)
    np.testing.assert_array_equal(evaluate(parse_module(text), [x]), expected(x))
