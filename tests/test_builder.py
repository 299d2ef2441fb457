"""The XlaBuilder API: modules built op by op print, parse back, verify and evaluate to what
NumPy computes; misuse fails with a clear error."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg

from xlapy.backends.interpreter import evaluate
from xlapy.builder import (
    ELEMENTWISE_METHODS,
    BuilderError,
    XlaBuilder,
    XlaOp,
    gt_comparator,
    lt_comparator,
    scalar_add_computation,
    scalar_max_computation,
    scalar_min_computation,
)
from xlapy.errors import ShapeError, VerifierError
from xlapy.ir.opcodes import Category, Opcode
from xlapy.ir.parser import parse_module
from xlapy.ir.printer import PrintOptions, print_module
from xlapy.ir.shapes import Shape

TOL = {np.float32: 1e-5, np.float64: 1e-12, np.float16: 1e-3, np.complex64: 1e-5}


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def rand(shape, dtype=np.float32, seed=0, low=-2.0, high=2.0) -> np.ndarray:
    g = rng(seed)
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        lo = 0 if dtype.kind == "u" else int(low) * 10
        return g.integers(lo, int(high) * 10 + 1, size=shape).astype(dtype)
    if dtype.kind == "b":
        return g.integers(0, 2, size=shape).astype(bool)
    if dtype.kind == "c":
        return (g.uniform(low, high, shape) + 1j * g.uniform(low, high, shape)).astype(dtype)
    return g.uniform(low, high, shape).astype(dtype)


def round_trip(module) -> str:
    """The printed text, checking that parse -> print gives it back (short and long forms)."""
    text = module.to_text()
    assert parse_module(text).to_text() == text
    long_text = print_module(module, PrintOptions.long())
    assert print_module(parse_module(long_text), PrintOptions.long()) == long_text
    return text


def check(module, args, expected, rtol=1e-5, atol=1e-5):
    """Round-trip the module's text, evaluate it on `args` and compare with `expected`."""
    round_trip(module)
    got = evaluate(module, args)
    _close(got, expected, rtol, atol)
    again = evaluate(parse_module(module.to_text()), args)
    _close(again, expected, rtol, atol)
    return got


def _close(got, expected, rtol, atol):
    if isinstance(expected, tuple):
        assert isinstance(got, tuple) and len(got) == len(expected)
        for g, e in zip(got, expected, strict=True):
            _close(g, e, rtol, atol)
        return
    expected = np.asarray(expected)
    assert isinstance(got, np.ndarray)
    assert got.shape == expected.shape
    if expected.dtype.kind in "fc":
        np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol)
    else:
        np.testing.assert_array_equal(got, expected)


# -- elementwise ----------------------------------------------------------------------------

UNARY = [
    ("abs", np.float32, np.abs),
    ("negate", np.int32, np.negative),
    ("exp", np.float32, np.exp),
    ("expm1", np.float32, np.expm1),
    ("log", np.float32, lambda x: np.log(np.abs(x) + 0.5)),
    ("log1p", np.float32, lambda x: np.log1p(np.abs(x))),
    ("sqrt", np.float64, lambda x: np.sqrt(np.abs(x))),
    ("rsqrt", np.float32, lambda x: 1 / np.sqrt(np.abs(x) + 0.5)),
    ("tanh", np.float32, np.tanh),
    ("sin", np.float32, np.sin),
    ("cos", np.float32, np.cos),
    ("floor", np.float32, np.floor),
    ("ceil", np.float32, np.ceil),
    ("sign", np.float32, np.sign),
    ("logistic", np.float32, lambda x: 1 / (1 + np.exp(-x))),
    ("not_", np.int32, np.invert),
    ("popcnt", np.uint8, lambda x: np.unpackbits(x[..., None], axis=-1).sum(-1).astype(np.uint8)),
    ("is_finite", np.float32, np.isfinite),
    ("round_even", np.float32, np.round),
    ("real", np.complex64, np.real),
    ("imag", np.complex64, np.imag),
]
# Ops whose input must be made valid first: (builder op, arg transform before NumPy).
_PRE = {
    "log": lambda b, x: b.log(b.abs(x) + 0.5),
    "log1p": lambda b, x: b.log1p(b.abs(x)),
    "sqrt": lambda b, x: b.sqrt(b.abs(x)),
    "rsqrt": lambda b, x: b.rsqrt(b.abs(x) + 0.5),
}


@pytest.mark.parametrize("method,dtype,ref", UNARY, ids=[u[0] for u in UNARY])
def test_unary_ops_match_numpy(method, dtype, ref):
    b = XlaBuilder(f"unary_{method}")
    x = b.parameter(0, Shape.array(_etype(dtype), (3, 5)))
    if method in _PRE:
        _PRE[method](b, x)
    else:
        getattr(b, method)(x)
    arg = rand((3, 5), dtype, seed=len(method))
    expected = ref(arg)
    tol = TOL.get(np.dtype(expected.dtype).type, 1e-5)
    check(b.build(), [arg], expected.astype(expected.dtype), rtol=tol, atol=tol)


def _etype(dtype) -> str:
    return {
        np.float16: "f16",
        np.float32: "f32",
        np.float64: "f64",
        np.int32: "s32",
        np.uint8: "u8",
        np.uint32: "u32",
        np.complex64: "c64",
        np.bool_: "pred",
    }[np.dtype(dtype).type]


BINARY = [
    ("add", np.float32, np.add),
    ("subtract", np.int32, np.subtract),
    ("multiply", np.float64, np.multiply),
    ("divide", np.float32, lambda a, b: a / b),
    ("maximum", np.int32, np.maximum),
    ("minimum", np.float32, np.minimum),
    ("power", np.float32, lambda a, b: np.power(np.abs(a) + 0.5, b)),
    ("atan2", np.float32, np.arctan2),
    ("and_", np.int32, np.bitwise_and),
    ("or_", np.uint8, np.bitwise_or),
    ("xor", np.int32, np.bitwise_xor),
    ("shift_left", np.uint32, lambda a, b: (a << (b % 8)).astype(np.uint32)),
]


@pytest.mark.parametrize("method,dtype,ref", BINARY, ids=[b[0] for b in BINARY])
def test_binary_ops_match_numpy(method, dtype, ref):
    b = XlaBuilder(f"binary_{method}")
    shape = Shape.array(_etype(dtype), (4, 3))
    x, y = b.parameter(0, shape), b.parameter(1, shape)
    if method == "power":
        b.power(b.abs(x) + 0.5, y)
    elif method == "shift_left":
        b.shift_left(x, b.remainder(y, b.constant(8, "u32")))
    elif method == "divide":
        b.divide(x, b.abs(y) + 0.5)
    else:
        getattr(b, method)(x, y)
    lhs, rhs = rand((4, 3), dtype, seed=1), rand((4, 3), dtype, seed=2)
    expected = ref(lhs, np.abs(rhs) + 0.5 if method == "divide" else rhs)
    check(b.build(), [lhs, rhs], expected.astype(dtype))


def test_every_elementwise_opcode_has_a_generated_method():
    irregular = {"convert", "bitcast-convert", "reduce-precision", "compare", "stochastic-convert"}
    for op in Opcode:
        if op.category in (Category.UNARY, Category.BINARY) and op.text not in irregular:
            assert op in ELEMENTWISE_METHODS, op
            assert callable(getattr(XlaBuilder, ELEMENTWISE_METHODS[op]))
    assert ELEMENTWISE_METHODS[Opcode.SHIFT_RIGHT_LOGICAL] == "shift_right_logical"
    assert ELEMENTWISE_METHODS[Opcode.NOT] == "not_"


def test_operator_overloads_and_scalar_broadcast():
    b = XlaBuilder("ops")
    x = b.parameter(0, "f32[2,3]")
    y = b.parameter(1, "f32[2,3]")
    r = (x + y) * 3.0 - y / 2.0
    r = -r + 1.0
    r = 2.0 * r
    assert isinstance(r, XlaOp) and r.shape == Shape.array("f32", (2, 3))
    assert x == x and x != y
    a, c = rand((2, 3), seed=3), rand((2, 3), seed=4)
    check(b.build(), [a, c], 2.0 * (-((a + c) * 3.0 - c / 2.0) + 1.0))


def test_broadcast_dimensions_in_binary_ops():
    b = XlaBuilder("bias")
    x = b.parameter(0, "f32[4,3]")
    col = b.parameter(1, "f32[4]")
    b.add(x, col, broadcast_dimensions=(0,))
    a, c = rand((4, 3), seed=5), rand((4,), seed=6)
    check(b.build(), [a, c], a + c[:, None])


@pytest.mark.parametrize(
    "direction,compare_type,ref",
    [("LT", None, np.less), ("GE", "TOTALORDER", np.greater_equal), ("NE", None, np.not_equal)],
)
def test_compare(direction, compare_type, ref):
    b = XlaBuilder("cmp")
    x, y = b.parameter(0, "f32[6]"), b.parameter(1, "f32[6]")
    b.compare(x, y, direction, compare_type)
    text = b.build().to_text()
    assert f"direction={direction}" in text
    if compare_type:
        assert f"type={compare_type}" in text
    a, c = rand(6, seed=7), rand(6, seed=8)
    c[0] = a[0]
    check(b.build(), [a, c], ref(a, c))


def test_convert_bitcast_convert_select_clamp_reduce_precision():
    b = XlaBuilder("misc")
    x = b.parameter(0, "f32[5]")
    lo, hi = b.constant(-0.5), b.constant(0.75)
    clamped = b.clamp(lo, x, hi)
    as_int = b.convert(b.multiply(x, b.constant(10.0)), "s32")
    bits = b.bitcast_convert(x, "u32")
    pred = b.gt(x, b.constant(0.0))
    chosen = b.select(pred, x, b.negate(x))
    reduced = b.reduce_precision(x, 5, 10)
    b.tuple([clamped, as_int, bits, chosen, reduced])
    a = rand(5, seed=9)
    expected = (
        np.clip(a, -0.5, 0.75),
        (a * np.float32(10)).astype(np.int32),
        a.view(np.uint32),
        np.abs(a),
        a.astype(np.float16).astype(np.float32),
    )
    check(b.build(), [a], expected)


# -- shape ops ------------------------------------------------------------------------------


def test_shape_ops_match_numpy():
    b = XlaBuilder("shapes")
    x = b.parameter(0, "f32[4,6]")
    outs = [
        b.reshape(x, (3, 8)),
        b.transpose(x, (1, 0)),
        b.slice(x, (1, 0), (4, 6), (2, 3)),
        b.slice_in_dim(x, 2, 5, 1, 1),
        b.concatenate([x, b.negate(x)], 0),
        b.pad(x, b.constant(7.0), [(1, 0, 0), (0, 2, 1)]),
        b.reverse(x, (0, 1)),
        b.broadcast(b.slice(x, (0, 0), (1, 6)), (3, 1, 6), (1, 2)),
        b.broadcast(b.constant(2.5), (2, 2)),
        b.iota("s32[3,4]", 1),
    ]
    b.tuple(outs)
    a = rand((4, 6), seed=10)
    padded = np.full((5, 6 + 5 + 2), 7.0, np.float32)
    padded[1:, 0:11:2] = a
    expected = (
        a.reshape(3, 8),
        a.T,
        a[1:4:2, 0:6:3],
        a[:, 2:5],
        np.concatenate([a, -a], 0),
        padded,
        a[::-1, ::-1],
        np.broadcast_to(a[0:1], (3, 1, 6)),
        np.full((2, 2), 2.5, np.float32),
        np.broadcast_to(np.arange(4, dtype=np.int32), (3, 4)),
    )
    check(b.build(), [a], expected)


def test_dynamic_slice_and_update():
    b = XlaBuilder("dyn")
    x = b.parameter(0, "f32[5,4]")
    i = b.parameter(1, "s32[]")
    j = b.parameter(2, "s32[]")
    piece = b.dynamic_slice(x, [i, j], (2, 3))
    b.tuple([piece, b.dynamic_update_slice(x, b.multiply(piece, b.constant(10.0)), [i, j])])
    a = rand((5, 4), seed=11)
    updated = a.copy()
    updated[2:4, 1:4] = a[2:4, 1:4] * 10
    check(b.build(), [a, np.array(2, np.int32), np.array(1, np.int32)], (a[2:4, 1:4], updated))


# -- contractions ---------------------------------------------------------------------------


def test_dot_and_dot_general():
    b = XlaBuilder("dots")
    x = b.parameter(0, "f32[3,4]")
    y = b.parameter(1, "f32[4,5]")
    bx = b.parameter(2, "f32[2,3,4]")
    by = b.parameter(3, "f32[2,5,4]")
    mm = x @ y
    batched = b.dot_general(bx, by, (2,), (2,), (0,), (0,), precision="highest")
    wide = b.dot(b.convert(x, "f16"), y, preferred_element_type="f32")
    b.tuple([mm, batched, wide])
    m = b.build()
    text = round_trip(m)
    assert "lhs_batch_dims={0}, lhs_contracting_dims={2}" in text
    assert "operand_precision={highest,highest}" in text
    a, c = rand((3, 4), seed=12), rand((4, 5), seed=13)
    ba, bc = rand((2, 3, 4), seed=14), rand((2, 5, 4), seed=15)
    wide_ref = a.astype(np.float16).astype(np.float32) @ c
    check(m, [a, c, ba, bc], (a @ c, np.einsum("bik,bjk->bij", ba, bc), wide_ref), 1e-3, 1e-3)


def _conv_nhwc(x, k, stride, pads):
    x = np.pad(x, [(0, 0), pads[0], pads[1], (0, 0)])
    n, h, w, _ = x.shape
    kh, kw, _, o = k.shape
    oh, ow = (h - kh) // stride[0] + 1, (w - kw) // stride[1] + 1
    out = np.zeros((n, oh, ow, o), np.float64)
    for i in range(oh):
        for j in range(ow):
            patch = x[:, i * stride[0] : i * stride[0] + kh, j * stride[1] : j * stride[1] + kw]
            out[:, i, j] = np.einsum("nhwc,hwco->no", patch, k)
    return out.astype(np.float32)


@pytest.mark.parametrize(
    "padding,stride", [("VALID", (1, 1)), ("SAME", (2, 1)), ([(1, 2), (0, 1)], (1, 2))]
)
def test_convolution_matches_numpy(padding, stride):
    b = XlaBuilder("conv")
    x = b.parameter(0, "f32[2,7,6,3]")
    k = b.parameter(1, "f32[3,2,3,4]")
    b.convolution(x, k, stride, padding, dim_labels="b01f_01io->b01f")
    m = b.build()
    assert "dim_labels=b01f_01io->b01f" in round_trip(m)
    a, w = rand((2, 7, 6, 3), seed=16), rand((3, 2, 3, 4), seed=17)
    if padding == "VALID":
        pads = [(0, 0), (0, 0)]
    elif padding == "SAME":
        # rows: out ceil(7/2)=4 needs (4-1)*2+3-7=2 pads; columns: out 6 needs 5+2-6=1
        pads = [(1, 1), (0, 1)]
    else:
        pads = padding
    check(m, [a, w], _conv_nhwc(a, w, stride, pads), 1e-4, 1e-4)


def test_fft_cholesky_triangular_solve():
    b = XlaBuilder("linalg")
    x = b.parameter(0, "f32[3,8]")
    spd = b.parameter(1, "f64[4,4]")
    rhs = b.parameter(2, "f64[4,2]")
    spectrum = b.fft(x, "RFFT", (8,))
    back = b.fft(spectrum, "IRFFT", (8,))
    chol = b.cholesky(spd, lower=True)
    solved = b.triangular_solve(chol, rhs, left_side=True, lower=True)
    b.tuple([spectrum, back, chol, solved])
    a = rand((3, 8), seed=18)
    m_ = rand((4, 4), np.float64, seed=19)
    s = m_ @ m_.T + 4 * np.eye(4)
    r = rand((4, 2), np.float64, seed=20)
    lower = np.linalg.cholesky(s)
    expected = (
        np.fft.rfft(a).astype(np.complex64),
        a,
        lower,
        scipy.linalg.solve_triangular(lower, r, lower=True),
    )
    check(b.build(), [a, s, r], expected, 1e-4, 1e-4)


# -- reductions -----------------------------------------------------------------------------


def test_reduce_with_sub_builder_reducer():
    b = XlaBuilder("reduce_max")
    sub = b.create_sub_builder("my_max")
    p, q = sub.parameter(0, "f32[]"), sub.parameter(1, "f32[]")
    sub.maximum(p, q)
    reducer = sub.build()
    x = b.parameter(0, "f32[3,4,5]")
    b.reduce(x, b.constant(-np.inf), reducer, (0, 2))
    m = b.build()
    assert [c.name for c in m.computations] == ["my_max", "reduce_max"]
    a = rand((3, 4, 5), seed=21)
    check(m, [a], a.max(axis=(0, 2)))


def test_variadic_reduce_argmax():
    b = XlaBuilder("argmax")
    sub = b.create_sub_builder("argmax_reducer")
    av, ai = sub.parameter(0, "f32[]"), sub.parameter(1, "s32[]")
    bv, bi = sub.parameter(2, "f32[]"), sub.parameter(3, "s32[]")
    take_a = sub.ge(av, bv)
    sub.tuple([sub.select(take_a, av, bv), sub.select(take_a, ai, bi)])
    x = b.parameter(0, "f32[4,6]")
    idx = b.iota("s32[4,6]", 1)
    out = b.reduce([x, idx], [b.constant(-np.inf), b.constant(0, "s32")], sub.build(), (1,))
    assert out.shape.is_tuple
    a = rand((4, 6), seed=22)
    check(b.build(), [a], (a.max(1), a.argmax(1).astype(np.int32)))


def test_reduce_window_and_select_and_scatter():
    b = XlaBuilder("pool")
    x = b.parameter(0, "f32[4,6]")
    pooled = b.reduce_window(x, b.constant(-np.inf), scalar_max_computation("f32"), (2, 2), (2, 2))
    source = b.parameter(1, "f32[2,3]")
    ge = b.create_sub_builder("ge")
    ge.ge(ge.parameter(0, "f32[]"), ge.parameter(1, "f32[]"))
    grad = b.select_and_scatter(
        x,
        ge.build(),
        (2, 2),
        (2, 2),
        "VALID",
        source,
        b.constant(0.0),
        scalar_add_computation("f32"),
    )
    b.tuple([pooled, grad])
    a, s = rand((4, 6), seed=23), rand((2, 3), seed=24)
    windows = a.reshape(2, 2, 3, 2).transpose(0, 2, 1, 3).reshape(2, 3, 4)
    expected_grad = np.zeros_like(a)
    for i in range(2):
        for j in range(3):
            k = int(np.argmax(windows[i, j]))
            expected_grad[2 * i + k // 2, 2 * j + k % 2] += s[i, j]
    check(b.build(), [a, s], (windows.max(-1), expected_grad))


# -- indexing -------------------------------------------------------------------------------


def test_gather_rows():
    b = XlaBuilder("take")
    table = b.parameter(0, "f32[6,3]")
    idx = b.parameter(1, "s32[4]")
    b.gather(
        table,
        idx,
        offset_dims=(1,),
        collapsed_slice_dims=(0,),
        start_index_map=(0,),
        slice_sizes=(1, 3),
    )
    a = rand((6, 3), seed=25)
    i = rng(26).integers(0, 6, 4).astype(np.int32)
    check(b.build(), [a, i], a[i])


def test_scatter_add():
    b = XlaBuilder("scatter_add")
    x = b.parameter(0, "f32[5,2]")
    idx = b.parameter(1, "s32[6,1]")
    upd = b.parameter(2, "f32[6,2]")
    b.scatter(
        x,
        idx,
        upd,
        scalar_add_computation("f32"),
        update_window_dims=(1,),
        inserted_window_dims=(0,),
        scatter_dims_to_operand_dims=(0,),
        index_vector_dim=1,
    )
    a, u = rand((5, 2), seed=27), rand((6, 2), seed=28)
    i = rng(29).integers(0, 5, (6, 1)).astype(np.int32)
    expected = a.copy()
    np.add.at(expected, i[:, 0], u)
    check(b.build(), [a, i, u], expected)


# -- sorting --------------------------------------------------------------------------------


def test_sort_keys_and_values_with_comparator():
    b = XlaBuilder("sort")
    keys = b.parameter(0, "s32[3,7]")
    vals = b.parameter(1, "f32[3,7]")
    b.sort([keys, vals], lt_comparator(["s32", "f32"]), dimension=1, is_stable=True)
    m = b.build()
    assert "is_stable=true" in round_trip(m)
    k = rng(30).integers(0, 4, (3, 7)).astype(np.int32)
    v = rand((3, 7), seed=31)
    order = np.argsort(k, axis=1, kind="stable")
    check(m, [k, v], (np.take_along_axis(k, order, 1), np.take_along_axis(v, order, 1)))


def test_sort_default_comparator_and_descending_and_topk():
    b = XlaBuilder("sort2")
    x = b.parameter(0, "f32[9]")
    up = b.sort(x)
    down = b.sort(x, gt_comparator("f32"))
    top = b.topk(x, 3)
    b.tuple([up, down, b.get_tuple_element(top, 0), b.get_tuple_element(top, 1)])
    a = rand(9, seed=32)
    order = np.argsort(-a, kind="stable")[:3].astype(np.int32)
    check(b.build(), [a], (np.sort(a), np.sort(a)[::-1], a[order], order))


# -- control flow ---------------------------------------------------------------------------


def test_while_loop_counts_to_n():
    n = 7
    b = XlaBuilder("count")
    state_shape = "(s32[], f32[3])"
    cond = b.create_sub_builder("cond")
    s = cond.parameter(0, state_shape)
    cond.lt(cond.get_tuple_element(s, 0), cond.constant(n, "s32"))
    body = b.create_sub_builder("body")
    s = body.parameter(0, state_shape)
    i, acc = body.get_tuple_element(s, 0), body.get_tuple_element(s, 1)
    body.tuple([i + 1, acc * 2.0 + 1.0])
    x = b.parameter(0, "f32[3]")
    loop = b.while_loop(cond.build(), body.build(), b.tuple([b.constant(0, "s32"), x]))
    b.get_tuple_element(loop, 1)
    a = rand(3, seed=33)
    expected = a.copy()
    for _ in range(n):
        expected = expected * 2 + 1
    check(b.build(), [a], expected)


def test_conditional_pred_and_index():
    b = XlaBuilder("cond")
    branches = []
    for name, fn in (("double", lambda s, v: v * 2.0), ("neg", lambda s, v: -v), ("exp", None)):
        sub = b.create_sub_builder(name)
        v = sub.parameter(0, "f32[4]")
        sub.exp(v) if fn is None else fn(sub, v)
        branches.append(sub.build())
    x = b.parameter(0, "f32[4]")
    p = b.parameter(1, "pred[]")
    k = b.parameter(2, "s32[]")
    by_pred = b.conditional(p, branches[:2], [x, x])
    by_index = b.conditional(k, branches, [x, x, x])
    b.tuple([by_pred, by_index])
    m = b.build()
    text = round_trip(m)
    assert "true_computation=double, false_computation=neg" in text
    assert "branch_computations={double, neg, exp}" in text
    a = rand(4, seed=34)
    for pred, index, expected in ((True, 2, (a * 2, np.exp(a))), (False, 1, (-a, -a))):
        check(m, [a, np.array(pred), np.array(index, np.int32)], expected)


def test_call_map_opt_barrier_after_all():
    b = XlaBuilder("calls")
    f = b.create_sub_builder("axpy")
    fa, fx = f.parameter(0, "f32[]"), f.parameter(1, "f32[]")
    f.add(f.multiply(fa, fx), fx)
    scalar_fn = f.build()
    x = b.parameter(0, "f32[5]")
    y = b.parameter(1, "f32[5]")
    mapped = b.map([x, y], scalar_fn)
    g = b.create_sub_builder("sum3")
    g.add(g.parameter(0, "f32[5]"), g.parameter(1, "f32[5]"))
    called = b.call(g.build(), [mapped, x])
    barrier = b.opt_barrier(b.tuple([called, b.after_all()]))
    b.get_tuple_element(barrier, 0)
    a, c = rand(5, seed=35), rand(5, seed=36)
    check(b.build(), [a, c], a * c + c + a)


def test_rng_bit_generator_shape_and_text():
    b = XlaBuilder("rng")
    state = b.parameter(0, "u64[2]")
    out = b.rng_bit_generator("three_fry", state, "u32[4,4]")
    assert out.shape == Shape.tuple([Shape.array("u64", (2,)), Shape.array("u32", (4, 4))])
    m = b.build()
    assert "algorithm=rng_three_fry" in round_trip(m)
    seed = np.array([42, 7], np.uint64)
    first = evaluate(m, [seed])
    assert first[1].shape == (4, 4) and first[1].dtype == np.uint32
    assert len(np.unique(first[1])) > 1
    np.testing.assert_array_equal(evaluate(m, [seed])[1], first[1])


def test_legacy_rng_and_stochastic_convert():
    b = XlaBuilder("random")
    x = b.parameter(0, "f32[64]")
    bits = b.parameter(1, "u32[64]")
    uniform = b.rng_uniform(b.constant(1.0), b.constant(3.0), "f32[8,8]")
    rounded = b.stochastic_convert(x * 10.0, bits, "s32")
    b.tuple([uniform, rounded])
    m = b.build()
    assert "distribution=rng_uniform" in round_trip(m)
    a = rand(64, seed=45)
    r = rng(46).integers(0, 2**32, 64, dtype=np.uint64).astype(np.uint32)
    values, out = evaluate(m, [a, r])
    assert values.shape == (8, 8) and values.min() >= 1.0 and values.max() < 3.0
    assert values.std() > 0.1
    assert out.dtype == np.int32
    assert np.all((out == np.floor(a * 10)) | (out == np.ceil(a * 10)))


def test_sub_builder_may_be_passed_unbuilt():
    b = XlaBuilder("unbuilt")
    sub = b.create_sub_builder("plus")
    sub.add(sub.parameter(0, "f32[]"), sub.parameter(1, "f32[]"))
    x = b.parameter(0, "f32[3]")
    b.reduce(x, b.constant(0.0), sub, (0,))
    a = rand(3, seed=47)
    check(b.build(), [a], np.array(a.sum(), np.float32))


# -- custom calls and aliasing --------------------------------------------------------------


def test_custom_call_seed_example_with_opaque_aliasing_side_effect():
    # A[i] = B[i % 128] + C[i], the custom call of seed 002, with an opaque string.
    b = XlaBuilder("do_it")
    p0 = b.parameter(0, "f32[128]", "p0")
    p1 = b.parameter(1, "f32[2048]", "p1")
    b.custom_call(
        "do_custom_call",
        [p0, p1],
        "f32[2048]",
        opaque="scale=2",
        api_version="status_returning",
        output_to_operand_aliasing={(): (1, ())},
        has_side_effect=True,
        schedule="latest",
    )
    m = b.build()
    text = round_trip(m)
    line = next(ln for ln in text.splitlines() if "custom-call(" in ln)
    assert 'custom_call_target="do_custom_call"' in line
    assert "custom_call_has_side_effect=true" in line
    assert "output_to_operand_aliasing={{}: (1, {})}" in line
    assert "schedule=SCHEDULE_LATEST" in line
    assert "api_version=API_VERSION_STATUS_RETURNING" in line
    assert 'backend_config="scale=2"' in line
    assert m.entry.root.has_side_effect

    def do_custom_call(ins, opaque):
        scale = float(opaque.split("=")[1])
        return (ins[0][np.arange(2048) % 128] + ins[1]) * np.float32(scale)

    b_, c_ = rand(128, seed=37), rand(2048, seed=38)
    got = evaluate(m, [b_, c_], custom_calls={"do_custom_call": do_custom_call})
    np.testing.assert_allclose(got, (b_[np.arange(2048) % 128] + c_) * 2, rtol=1e-6)


def test_custom_call_tuple_output_as_scratch_and_layouts():
    b = XlaBuilder("scratch")
    x = b.parameter(0, "f32[4]")
    out = b.custom_call(
        "fill",
        [x],
        "(f32[4], f32[16])",
        operand_layouts=["f32[4]{0}"],
    )
    b.get_tuple_element(out, 0)
    m = b.build()
    assert "operand_layout_constraints={f32[4]{0}}" in round_trip(m)

    def fill(ins, opaque, outs):
        outs[1][:] = 3.0  # scratch
        outs[0][:] = ins[0] + outs[1][:4]

    a = rand(4, seed=39)
    np.testing.assert_allclose(evaluate(m, [a], custom_calls={"fill": fill}), a + 3)


def test_alias_and_donor_config_in_the_header():
    b = XlaBuilder("update")
    p = b.parameter(0, "f32[2]")
    q = b.parameter(1, "f32[2]")
    b.tuple([p + q, q])
    b.set_up_alias((0,), 0, ())
    b.add_buffer_donor(1, ())
    m = b.build()
    header = round_trip(m).splitlines()[0]
    assert header == (
        "HloModule update, input_output_alias={ {0}: (0, {}, may-alias) }, buffer_donor={ (1, {}) }"
    )
    a, c = rand(2, seed=40), rand(2, seed=41)
    check(m, [a, c], (a + c, c))


def test_seed_increment_module_with_whole_output_alias():
    b = XlaBuilder("increment")
    p = b.parameter(0, "f32[]", "p")
    b.add(p, b.constant(1.0))
    b.set_up_alias((), 0, (), kind="must-alias")
    m = b.build()
    text = round_trip(m)
    assert text.startswith("HloModule increment, input_output_alias={ {}: (0, {}, must-alias) }")
    short = parse_module(
        "HloModule increment, input_output_alias={ {}: 0 }\n\nENTRY entry {\n"
        "  p = f32[] parameter(0)\n  c = f32[] constant(1)\n  ROOT out = f32[] add(p, c)\n}\n"
    )
    assert short.config.input_output_alias[0].param_number == 0
    check(m, [np.array(2.5, np.float32)], np.array(3.5, np.float32))


# -- module assembly ------------------------------------------------------------------------


def test_shared_reducer_appears_once_and_names_are_unique():
    add = scalar_add_computation("f32")
    b = XlaBuilder("two_sums")
    x = b.parameter(0, "f32[3,4]")
    zero = b.constant(0.0)
    rows = b.reduce(x, zero, add, (1,))
    cols = b.reduce(x, zero, add, (0,))
    other = b.create_sub_builder("add_f32")  # same name as the shared reducer
    other.add(other.parameter(0, "f32[]"), other.parameter(1, "f32[]"))
    total = b.reduce(x, zero, other.build(), (0, 1))
    b.tuple([rows, cols, total])
    m = b.build()
    names = [c.name for c in m.computations]
    assert len(names) == 3 and len(set(names)) == 3 and names[-1] == "two_sums"
    assert m.entry is m.computations[-1]
    instr_names = [i.name for i in m.instructions()]
    assert len(instr_names) == len(set(instr_names))
    a = rand((3, 4), seed=42)
    check(m, [a], (a.sum(1), a.sum(0), np.array(a.sum(), np.float32)), 1e-5, 1e-5)


def test_build_twice_gives_independent_modules_and_explicit_root():
    b = XlaBuilder("twice")
    x = b.parameter(0, "f32[3]")
    y = b.exp(x)
    b.negate(y)
    first, second = b.build(), b.build(root=y)
    assert first.entry.root.opcode is Opcode.NEGATE
    assert second.entry.root.opcode is Opcode.EXP
    assert first.entry.instructions[0] is not second.entry.instructions[0]
    assert b.build().to_text() == first.to_text()
    a = rand(3, seed=43)
    check(second, [a], np.exp(a))


def test_helper_computations_are_valid_reducers():
    for make, ref, init in (
        (scalar_add_computation, np.sum, 0),
        (scalar_max_computation, np.max, -1000),
        (scalar_min_computation, np.min, 1000),
    ):
        b = XlaBuilder("r")
        x = b.parameter(0, "s32[8]")
        b.reduce(x, b.constant(init, "s32"), make("s32"), (0,))
        a = rng(44).integers(-50, 50, 8).astype(np.int32)
        check(b.build(), [a], np.array(ref(a), np.int32))


# -- misuse ---------------------------------------------------------------------------------


def _two_builders():
    a, b = XlaBuilder("a"), XlaBuilder("b")
    return a, b, a.parameter(0, "f32[2]"), b.parameter(0, "f32[2]")


def _mixed():
    a, _, x, y = _two_builders()
    a.add(x, y)


def _sub_uses_parent():
    b = XlaBuilder("main")
    x = b.parameter(0, "f32[]")
    sub = b.create_sub_builder("sub")
    sub.add(sub.parameter(0, "f32[]"), x)


def _param_twice():
    b = XlaBuilder("p")
    b.parameter(0, "f32[]")
    b.parameter(0, "f32[2]")


def _param_gap():
    b = XlaBuilder("gap")
    b.parameter(0, "f32[]")
    b.parameter(2, "f32[]")
    b.build()


def _alias_missing_output():
    b = XlaBuilder("al")
    b.exp(b.parameter(0, "f32[2]"))
    b.set_up_alias((1,), 0)
    b.build()


def _alias_missing_param():
    b = XlaBuilder("al")
    b.exp(b.parameter(0, "f32[2]"))
    b.set_up_alias((), 3)
    b.build()


def _alias_twice():
    b = XlaBuilder("al")
    b.exp(b.parameter(0, "f32[2]"))
    b.set_up_alias((), 0)
    b.set_up_alias((), 0)


def _alias_size_mismatch():
    b = XlaBuilder("al")
    p = b.parameter(0, "f32[3]")
    b.reduce(p, b.constant(0.0), scalar_add_computation("f32"), (0,))
    b.set_up_alias((), 0)
    b.build()


def _alias_bad_kind():
    b = XlaBuilder("al")
    b.set_up_alias((), 0, kind="maybe")


def _donor_missing_param():
    b = XlaBuilder("d")
    b.exp(b.parameter(0, "f32[2]"))
    b.add_buffer_donor(1)
    b.build()


def _alias_on_sub_builder():
    XlaBuilder("m").create_sub_builder("s").set_up_alias((), 0)


def _reducer_arity():
    b = XlaBuilder("r")
    x = b.parameter(0, "f32[4]")
    i = b.iota("s32[4]")
    b.reduce([x, i], [b.constant(0.0), b.constant(0, "s32")], scalar_add_computation("f32"), (0,))


def _reducer_type():
    b = XlaBuilder("r")
    x = b.parameter(0, "s32[4]")
    b.reduce(x, b.constant(0, "s32"), scalar_add_computation("f32"), (0,))


def _shape_mismatch():
    b = XlaBuilder("s")
    b.add(b.parameter(0, "f32[2]"), b.parameter(1, "f32[3]"))


def _bad_reshape():
    b = XlaBuilder("s")
    b.reshape(b.parameter(0, "f32[2,3]"), (4, 2))


def _bad_dot():
    b = XlaBuilder("s")
    b.dot(b.parameter(0, "f32[2,3]"), b.parameter(1, "f32[4,5]"))


def _while_body_mismatch():
    b = XlaBuilder("w")
    cond = b.create_sub_builder("c")
    cond.lt(cond.parameter(0, "s32[]"), cond.constant(3, "s32"))
    body = b.create_sub_builder("body")
    body.convert(body.parameter(0, "s32[]"), "f32")
    b.while_loop(cond.build(), body.build(), b.constant(0, "s32"))


def _comparator_arity():
    b = XlaBuilder("s")
    x, y = b.parameter(0, "f32[4]"), b.parameter(1, "f32[4]")
    b.sort([x, y], lt_comparator("f32"))


def _bad_direction():
    b = XlaBuilder("s")
    x = b.parameter(0, "f32[4]")
    b.compare(x, x, "LESS")


def _not_an_op():
    XlaBuilder("s").exp(np.ones(3))


def _not_a_computation():
    b = XlaBuilder("s")
    b.call("foo", [b.parameter(0, "f32[]")])


def _empty_build():
    XlaBuilder("empty").build()


def _bad_api_version():
    b = XlaBuilder("s")
    b.custom_call("t", [], "f32[]", api_version="v9")


def _custom_call_alias_operand():
    b = XlaBuilder("s")
    b.custom_call(
        "t", [b.parameter(0, "f32[2]")], "f32[2]", output_to_operand_aliasing=[((), (3, ()))]
    )


def _bad_padding():
    b = XlaBuilder("s")
    x = b.parameter(0, "f32[4]")
    b.reduce_window(x, b.constant(0.0), scalar_add_computation("f32"), (2,), padding="FULL")


def _bad_dim_labels():
    b = XlaBuilder("s")
    b.convolution(b.parameter(0, "f32[1,4,4,1]"), b.parameter(1, "f32[2,2,1,1]"), dim_labels="nhwc")


MISUSE = [
    (_mixed, BuilderError, "belongs to builder 'b', not to 'a'"),
    (_sub_uses_parent, BuilderError, "ops of different builders cannot be mixed"),
    (_param_twice, BuilderError, "parameter number 0 is already taken"),
    (_param_gap, BuilderError, "numbers must be 0..1"),
    (_alias_missing_output, BuilderError, "output index {1}, which does not exist"),
    (_alias_missing_param, BuilderError, "names parameter 3, which does not exist"),
    (_alias_twice, BuilderError, "output {} is already aliased"),
    (_alias_size_mismatch, VerifierError, "has 4 bytes but parameter f32[3] has 12"),
    (_alias_bad_kind, BuilderError, "kind must be one of may-alias, must-alias"),
    (_donor_missing_param, BuilderError, "donor (1, {}) names parameter 1"),
    (_alias_on_sub_builder, BuilderError, "'s' is a sub-builder"),
    (_reducer_arity, ShapeError, "reduce(): reduce: reducer add_f32 must take 4 parameters"),
    (_reducer_type, ShapeError, "reducer add_f32 result 0 is f32[]"),
    (_shape_mismatch, ShapeError, "add(): add: operand 1 has shape f32[3]"),
    (_bad_reshape, ShapeError, "reshape(): reshape: cannot reshape f32[2,3]"),
    (_bad_dot, ShapeError, "dot(): dot: contracting dimension"),
    (_while_body_mismatch, ShapeError, "while_loop(): while: body body"),
    (_comparator_arity, ShapeError, "comparator lt_f32 must take 4 parameters"),
    (_bad_direction, BuilderError, "direction must be one of EQ"),
    (_not_an_op, BuilderError, "operand 0 must be an XlaOp"),
    (_not_a_computation, BuilderError, "computation must be an HloComputation"),
    (_empty_build, BuilderError, "has no ops"),
    (_bad_api_version, BuilderError, "api_version must be one of"),
    (_custom_call_alias_operand, ShapeError, "names operand 3, which does not exist"),
    (_bad_padding, BuilderError, "padding must be VALID, SAME"),
    (_bad_dim_labels, BuilderError, "dim_labels 'nhwc' must look like"),
]


@pytest.mark.parametrize("make,error,message", MISUSE, ids=[m[0].__name__ for m in MISUSE])
def test_misuse_gives_a_clear_error(make, error, message):
    with pytest.raises(error) as info:
        make()
    assert message in str(info.value)
