"""The custom-call registry and the interpreter's custom-call rule: Python targets, tuple
operands and results, opaque strings, output-to-operand aliasing, and the errors."""

import numpy as np
import pytest

from xlapy.backends import custom_calls
from xlapy.backends.custom_calls import ApiVersion, CustomCallRegistry
from xlapy.backends.interpreter import evaluate
from xlapy.errors import CustomCallError
from xlapy.ir.parser import parse_module

RNG = np.random.default_rng(77)


def run_hlo(text, *args, **state):
    return evaluate(parse_module(text), list(args), **state)


SEED_EXAMPLE = """HloModule m
ENTRY e {
  p0 = f32[128] parameter(0)
  p1 = f32[2048] parameter(1)
  ROOT c = f32[2048] custom-call(p0, p1), custom_call_target="do_custom_call"
}"""


def do_custom_call(ins, opaque):
    in0, in1 = ins
    return in0[np.arange(2048) % 128] + in1


def test_registered_python_target_computes_the_seed_example():
    registry = CustomCallRegistry()
    registry.register("do_custom_call", do_custom_call)
    b = RNG.standard_normal(128).astype(np.float32)
    c = RNG.standard_normal(2048).astype(np.float32)
    ours = run_hlo(SEED_EXAMPLE, b, c, custom_calls=registry)
    np.testing.assert_array_equal(ours, b[np.arange(2048) % 128] + c)


def test_global_registry_and_dict_of_targets():
    name = "test_registry_global_target"
    custom_calls.register(name, lambda ins, opaque: ins[0] * 2)
    try:
        assert custom_calls.lookup(name).name == name
        x = RNG.standard_normal(3).astype(np.float32)
        text = f"""HloModule m
ENTRY e {{
  x = f32[3] parameter(0)
  ROOT c = f32[3] custom-call(x), custom_call_target="{name}"
}}"""
        np.testing.assert_array_equal(run_hlo(text, x), x * 2)
        local = {name: lambda ins, opaque: ins[0] * 3}
        np.testing.assert_array_equal(run_hlo(text, x, custom_calls=local), x * 3)
    finally:
        custom_calls.GLOBAL_REGISTRY.unregister(name)


TUPLE_CALL = """HloModule m
ENTRY e {
  p0 = (f32[32], (f32[64], f32[128]), f32[256]) parameter(0)
  ROOT c = (f32[512], (f32[1024], s32[])) custom-call(p0),
      custom_call_target="tuple_target", backend_config="scale=3"
}"""


def tuple_target(ins, opaque):
    assert [a.shape for a in ins] == [(32,), (64,), (128,), (256,)]
    assert opaque == "scale=3"
    scale = np.float32(opaque.split("=")[1])
    first = np.concatenate([*ins, ins[0]]) * scale
    return (first, (np.zeros(1024, np.float32), np.array(len(ins), np.int32)))


def tuple_target_flat(ins, opaque):
    nested = tuple_target(ins, opaque)
    return [nested[0], *nested[1]]


@pytest.mark.parametrize("fn", [tuple_target, tuple_target_flat], ids=["nested", "flat"])
def test_tuple_operands_flatten_preorder_and_tuple_results(fn):
    registry = CustomCallRegistry()
    registry.register("tuple_target", fn)
    leaves = [RNG.standard_normal(n).astype(np.float32) for n in (32, 64, 128, 256)]
    arg = (leaves[0], (leaves[1], leaves[2]), leaves[3])
    first, (scratch, count) = run_hlo(TUPLE_CALL, arg, custom_calls=registry)
    expected = np.concatenate([*leaves, leaves[0]]) * 3
    np.testing.assert_array_equal(first, expected)
    assert scratch.shape == (1024,) and int(count) == 4


ALIASED = """HloModule m
ENTRY e {
  buf = f32[8] parameter(0)
  upd = f32[2] parameter(1)
  ROOT c = (f32[8], f32[4]) custom-call(buf, upd),
      custom_call_target="inplace", output_to_operand_aliasing={{0}: (0, {})}
}"""


def test_output_to_operand_aliasing_starts_from_the_operand_and_outs_are_filled():
    def inplace(ins, opaque, outs):
        buf_out, scratch = outs
        assert not ins[0].flags.writeable
        np.testing.assert_array_equal(buf_out, ins[0])
        buf_out[:2] += ins[1]
        scratch[:] = 1.0

    registry = CustomCallRegistry()
    registry.register("inplace", inplace)
    buf = RNG.standard_normal(8).astype(np.float32)
    upd = RNG.standard_normal(2).astype(np.float32)
    before = buf.copy()
    out, scratch = run_hlo(ALIASED, buf, upd, custom_calls=registry)
    expected = before.copy()
    expected[:2] += upd
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(scratch, np.ones(4, np.float32))
    np.testing.assert_array_equal(buf, before)


def test_aliased_leaf_returned_as_none_keeps_the_operand_copy():
    registry = CustomCallRegistry()
    registry.register("inplace", lambda ins, opaque: (None, np.full(4, 2.0, np.float32)))
    buf = RNG.standard_normal(8).astype(np.float32)
    out, other = run_hlo(ALIASED, buf, np.ones(2, np.float32), custom_calls=registry)
    np.testing.assert_array_equal(out, buf)
    np.testing.assert_array_equal(other, np.full(4, 2.0, np.float32))


def test_unknown_target_names_it_and_lists_similar_names():
    registry = CustomCallRegistry()
    registry.register("do_custom_cal", do_custom_call)
    with pytest.raises(CustomCallError, match=r"'do_custom_call'.*Host.*do_custom_cal"):
        run_hlo(
            SEED_EXAMPLE, np.ones(128, np.float32), np.ones(2048, np.float32), custom_calls=registry
        )
    with pytest.raises(CustomCallError, match="no custom-call target 'nope'"):
        registry.lookup("nope")


def test_double_registration_is_an_error_per_platform():
    registry = CustomCallRegistry()
    registry.register("t", do_custom_call)
    registry.register("t", do_custom_call, platform="CUDA")
    with pytest.raises(CustomCallError, match="'t' is already registered for platform Host"):
        registry.register("t", do_custom_call)
    with pytest.raises(CustomCallError, match="platform"):
        registry.register("u", do_custom_call, platform="TPU")


def test_wrong_result_shape_and_failing_target_are_custom_call_errors():
    registry = CustomCallRegistry()
    registry.register("do_custom_call", lambda ins, opaque: np.zeros(3, np.float32))
    args = (np.ones(128, np.float32), np.ones(2048, np.float32))
    with pytest.raises(CustomCallError, match=r"result leaf 0.*float32\[3\].*f32\[2048\]"):
        run_hlo(SEED_EXAMPLE, *args, custom_calls=registry)

    def boom(ins, opaque):
        raise ValueError("bad input")

    registry = CustomCallRegistry()
    registry.register("do_custom_call", boom)
    with pytest.raises(CustomCallError, match="'do_custom_call' failed: ValueError: bad input"):
        run_hlo(SEED_EXAMPLE, *args, custom_calls=registry)


def test_api_versions_are_checked_at_registration():
    registry = CustomCallRegistry()
    with pytest.raises(CustomCallError, match="API_VERSION_TYPED_FFI needs a handler"):
        registry.register("t", do_custom_call, api_version="API_VERSION_TYPED_FFI")
    with pytest.raises(CustomCallError, match="not a C function pointer"):
        registry.register("t", do_custom_call, api_version=ApiVersion.ORIGINAL)
    with pytest.raises(CustomCallError, match="unknown custom-call api_version"):
        registry.register("x", do_custom_call, api_version="API_VERSION_NINE")
    assert ApiVersion.parse(3) is ApiVersion.STATUS_RETURNING_UNIFIED
    assert ApiVersion.parse("typed_ffi") is ApiVersion.TYPED_FFI
    assert registry.register("p", do_custom_call).api_version is ApiVersion.PYTHON


@pytest.mark.parametrize("target", custom_calls.BUILTIN_IDENTITY_TARGETS)
def test_builtin_marker_targets_are_identity(target):
    text = f"""HloModule m
ENTRY e {{
  x = f32[2,3] parameter(0)
  ROOT c = f32[2,3] custom-call(x), custom_call_target="{target}"
}}"""
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_array_equal(run_hlo(text, x), x)
    assert custom_calls.lookup(target, "CUDA").name == target


def test_cuda_platform_is_chosen_by_state():
    registry = CustomCallRegistry()
    registry.register("do_custom_call", lambda ins, opaque: ins[1] + 1, platform="CUDA")
    args = (np.ones(128, np.float32), np.zeros(2048, np.float32))
    with pytest.raises(CustomCallError, match="platform Host"):
        run_hlo(SEED_EXAMPLE, *args, custom_calls=registry)
    ours = run_hlo(SEED_EXAMPLE, *args, custom_calls=registry, platform="CUDA")
    np.testing.assert_array_equal(ours, np.ones(2048, np.float32))


def test_compile_time_check_accepts_known_targets_and_names_unknown_ones():
    module = parse_module(SEED_EXAMPLE)
    with pytest.raises(CustomCallError, match="c: no custom-call target 'do_custom_call'"):
        custom_calls.check_custom_calls(module)
    custom_calls.check_custom_calls(module, registry={"do_custom_call": do_custom_call})
    registry = CustomCallRegistry()
    registry.register("do_custom_call", do_custom_call, platform="CUDA")
    custom_calls.check_custom_calls(module, "CUDA", registry)
    with pytest.raises(CustomCallError, match="platform Host"):
        custom_calls.check_custom_calls(module, "Host", registry)
