"""Typed FFI handlers: attribute decoding, typed arguments and results, type errors found at
compile time by check_custom_calls, and handler errors at run time."""

import numpy as np
import pytest

from xlapy.backends import ffi
from xlapy.backends.custom_calls import ApiVersion, CustomCallRegistry, check_custom_calls
from xlapy.backends.interpreter import evaluate
from xlapy.errors import CustomCallError
from xlapy.ir.parser import parse_module

RNG = np.random.default_rng(2024)

ATTRIBUTE_TEXTS = [
    ("{}", {}),
    ("", {}),
    ("{uplo = 76 : ui8}", {"uplo": 76}),
    (
        '{n = 10 : i64, eps = 1.0e-05 : f32, name = "x", flag = true}',
        {"n": 10, "eps": 1.0e-05, "name": "x", "flag": True},
    ),
    ("{off = false, neg = -3 : i32, big = 2.5e3}", {"off": False, "neg": -3, "big": 2500.0}),
    ('{s = "a \\"q\\" b", nested = {k = 1 : i32}}', {"s": 'a "q" b', "nested": {"k": 1}}),
    ('{l = [1, 2.5, "t"], f = 7 : f64}', {"l": [1, 2.5, "t"], "f": 7.0}),
    ("{info = 3, unit_attr}", {"info": 3, "unit_attr": True}),
]


@pytest.mark.parametrize(("text", "expected"), ATTRIBUTE_TEXTS)
def test_attribute_dictionaries_decode(text, expected):
    decoded = ffi.parse_attributes(text)
    assert decoded == expected
    assert [type(v) for v in decoded.values()] == [type(v) for v in expected.values()]


@pytest.mark.parametrize(
    ("text", "dtype", "values"),
    [
        ("{a = array<i64: 1, -2, 3>}", np.int64, [1, -2, 3]),
        ("{a = array<i32>}", np.int32, []),
        ("{a = array<f32: 1.5, -2.0e-1>}", np.float32, [1.5, -0.2]),
        ("{a = array<i1: true, false>}", np.bool_, [True, False]),
    ],
)
def test_dense_array_attributes(text, dtype, values):
    array = ffi.parse_attributes(text)["a"]
    assert array.dtype == dtype
    np.testing.assert_array_equal(array, np.array(values, dtype))


@pytest.mark.parametrize("text", ["{n = }", "{n = 1", "{= 3}", "{n = 1} x", "{a = array<q8: 1>}"])
def test_malformed_attribute_text_is_a_value_error(text):
    with pytest.raises(ValueError):
        ffi.parse_attributes(text)


@ffi.handler(
    args=[ffi.Buffer("f32", rank=2), ffi.Buffer("f32", rank=1)],
    results=[ffi.Buffer("f32", rank=2), ffi.Buffer("s32", rank=0)],
    attrs={
        "scale": ffi.Attr(float),
        "offsets": ffi.Attr(np.ndarray),
        "mode": ffi.Attr(str, default="add"),
        "strict": ffi.Attr(bool, default=False),
    },
)
def affine(x, bias, out, count, *, scale, offsets, mode, strict):
    if strict and np.any(x < -100):
        return ffi.Error("value below -100")
    if mode not in ("add", "sub"):
        raise ValueError(f"unknown mode {mode}")
    sign = 1 if mode == "add" else -1
    out[...] = x * scale + sign * bias + offsets.sum()
    count[...] = x.size


def affine_module(config, x_type="f32[3,4]", bias_type="f32[4]", result="(f32[3,4], s32[])"):
    return parse_module(f"""HloModule m
ENTRY e {{
  x = {x_type} parameter(0)
  b = {bias_type} parameter(1)
  ROOT c = {result} custom-call(x, b), custom_call_target="affine",
      api_version=API_VERSION_TYPED_FFI, backend_config={config}
}}""")


def registry_with(name, fn):
    registry = CustomCallRegistry()
    registry.register(name, fn)
    return registry


def test_typed_handler_runs_with_decoded_attributes():
    registry = registry_with("affine", affine)
    assert registry.lookup("affine").api_version is ApiVersion.TYPED_FFI
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    bias = RNG.standard_normal(4).astype(np.float32)
    for config, sign in [
        ("{scale = 2.5 : f32, offsets = array<i64: 1, 2>}", 1),
        ('{scale = 2 : i32, offsets = array<i64: 1, 2>, mode = "sub"}', -1),
    ]:
        module = affine_module(config)
        check_custom_calls(module, registry=registry)
        out, count = evaluate(module, [x, bias], custom_calls=registry)
        scale = 2.5 if sign == 1 else 2.0
        np.testing.assert_allclose(out, x * scale + sign * bias + 3, rtol=1e-6)
        assert count.dtype == np.int32 and int(count) == 12


TYPE_ERRORS = [
    (
        "{scale = 1.0, offsets = array<i64: 1>}",
        dict(x_type="f64[3,4]"),
        r"c \(target 'affine'\): argument 0 'x' expects f32\[rank 2\], got f64\[3,4\]",
    ),
    (
        "{scale = 1.0, offsets = array<i64: 1>}",
        dict(bias_type="f32[2,2]"),
        r"argument 1 'bias' expects f32\[rank 1\], got f32\[2,2\]",
    ),
    (
        "{scale = 1.0, offsets = array<i64: 1>}",
        dict(result="(f32[3,4], s32[], s32[])"),
        r"takes 2 results, the instruction has 3",
    ),
    (
        "{scale = 1.0, offsets = array<i64: 1>}",
        dict(result="(f32[3,4], f32[])"),
        r"result 1 'count' expects s32\[rank 0\], got f32\[\]",
    ),
    ("{offsets = array<i64: 1>}", {}, r"missing attribute\(s\) scale"),
    (
        "{scale = 1.0, offsets = array<i64: 1>, extra = 1}",
        {},
        r"unexpected attribute\(s\) extra",
    ),
    (
        '{scale = "big", offsets = array<i64: 1>}',
        {},
        r"attribute 'scale' expects float, got str",
    ),
    ("{scale = 1.0, offsets = 3}", {}, r"attribute 'offsets' expects ndarray, got int"),
    ("{scale = 1.0 offsets}", {}, r"cannot read backend_config"),
]


@pytest.mark.parametrize(("config", "types", "message"), TYPE_ERRORS)
def test_type_errors_are_found_at_compile_time(config, types, message):
    registry = registry_with("affine", affine)
    module = affine_module(config, **types)
    with pytest.raises(CustomCallError, match=message):
        check_custom_calls(module, registry=registry)


def test_handler_errors_surface_at_run_time():
    registry = registry_with("affine", affine)
    bias = RNG.standard_normal(4).astype(np.float32)
    module = affine_module("{scale = 1.0, offsets = array<i64: 1>, strict = true}")
    check_custom_calls(module, registry=registry)
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    x[1, 2] = -500.0
    with pytest.raises(CustomCallError, match="c: custom-call target 'affine' failed: value below"):
        evaluate(module, [x, bias], custom_calls=registry)
    module = affine_module('{scale = 1.0, offsets = array<i64: 1>, mode = "mul"}')
    with pytest.raises(CustomCallError, match="ValueError: unknown mode mul"):
        evaluate(module, [x, bias], custom_calls=registry)


def test_handler_may_return_results_and_results_alias_operands():
    @ffi.handler(args=[ffi.Buffer("f64", min_rank=1)], results=[ffi.Buffer("f64", min_rank=1)])
    def double_in_place(x, out):
        np.testing.assert_array_equal(out, x)
        return out * 2

    module = parse_module("""HloModule m
ENTRY e {
  x = f64[2,5] parameter(0)
  ROOT c = f64[2,5] custom-call(x), custom_call_target="dbl",
      output_to_operand_aliasing={{}: (0, {})}, api_version=API_VERSION_TYPED_FFI
}""")
    registry = registry_with("dbl", double_in_place)
    x = RNG.standard_normal((2, 5))
    np.testing.assert_array_equal(evaluate(module, [x], custom_calls=registry), x * 2)


def test_declaration_errors():
    with pytest.raises(CustomCallError, match="unknown element type 'f31'"):
        ffi.Buffer("f31")
    with pytest.raises(CustomCallError, match=r"ffi\.Attr kind"):
        ffi.Attr(complex)
    with pytest.raises(CustomCallError, match=r"must be an ffi\.Attr"):
        ffi.handler(attrs={"n": int})(lambda: None)
