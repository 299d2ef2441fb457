"""Custom calls through the runtime (Client("interpreter") and Client("cpu")): Python, C
(cffi-compiled at test time, all three CPU conventions, seed 002's tuple layout) and typed
FFI targets; unknown targets and typed-FFI mismatches as compile-time errors; per-client
registries and the compile cache; status failures on the output's first use; aliasing with
and without donation; side effects once per execution; LAPACK targets from jnp.linalg."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_custom_call_c import CDEF, SOURCE, build_cffi_module

import xlapy.runtime
from xlapy.backends import custom_calls
from xlapy.errors import CustomCallError
from xlapy.runtime import ApiVersion, Client, CompileOptions, ExecutionError, ffi

RNG = np.random.default_rng(2024)
NAMES = (f"rt_target_{i}" for i in itertools.count())  # fresh global names per test

RUNTIME_CDEF = """
void affine_v1(void* out, const void** ins);
void affine_v2(void* out, const void** ins, XlaCustomCallStatus* status);
void affine_v3(void* out, const void** ins, const char* opaque, size_t opaque_len,
               XlaCustomCallStatus* status);
void accumulate(void* out, const void** ins, XlaCustomCallStatus* status);
"""

RUNTIME_SOURCE = r"""
/* f32[16] -> f32[16]: 2x + 1. v2 fails on a value above 100; v3 reads "a,b" from opaque. */
void affine_v1(void* out, const void** ins) {
  const float* x = (const float*)ins[0];
  float* o = (float*)out;
  for (int i = 0; i < 16; ++i) o[i] = 2.0f * x[i] + 1.0f;
}
void affine_v2(void* out, const void** ins, XlaCustomCallStatus* status) {
  const float* x = (const float*)ins[0];
  for (int i = 0; i < 16; ++i) {
    if (x[i] > 100.0f) {
      char message[64];
      int len = snprintf(message, sizeof message, "value %g above 100 at %d", x[i], i);
      xlapy_custom_call_status_set_failure(status, message, (size_t)len);
      return;
    }
  }
  affine_v1(out, ins);
}
void affine_v3(void* out, const void** ins, const char* opaque, size_t opaque_len,
               XlaCustomCallStatus* status) {
  char text[64];
  float a, b;
  if (opaque_len >= sizeof text) {
    XlaCustomCallStatusSetFailure(status, "opaque too long", 15);
    return;
  }
  memcpy(text, opaque, opaque_len);
  text[opaque_len] = 0;
  if (sscanf(text, "%f,%f", &a, &b) != 2) {
    XlaCustomCallStatusSetFailure(status, "opaque must be 'a,b'", 20);
    return;
  }
  const float* x = (const float*)ins[0];
  float* o = (float*)out;
  for (int i = 0; i < 16; ++i) o[i] = a * x[i] + b;
}
/* (f32[16] acc, f32[16] x) -> f32[16] aliased to acc: acc += x, in place. */
void accumulate(void* out, const void** ins, XlaCustomCallStatus* status) {
  if (ins[0] != out) {
    XlaCustomCallStatusSetFailure(status, "output does not alias operand 0", 31);
    return;
  }
  float* acc = (float*)out;
  const float* x = (const float*)ins[1];
  for (int i = 0; i < 16; ++i) acc[i] += x[i];
}
"""


@pytest.fixture(scope="module")
def c_lib(tmp_path_factory):
    module, _ = build_cffi_module(
        tmp_path_factory.mktemp("rtcc"),
        "_xlapy_rt_cc_targets",
        CDEF + RUNTIME_CDEF,
        SOURCE + RUNTIME_SOURCE,
    )
    return module


def c_pointer(c_lib, name):
    return c_lib.ffi.addressof(c_lib.lib, name)


@pytest.fixture(params=["interpreter", "cpu"])
def client(request):
    c = Client(request.param)
    yield c
    c.close()


def f32(*dims):
    return RNG.standard_normal(dims).astype(np.float32)


def run(client, text, *args, **donation):
    exe = client.compile(text)
    buffers = [
        tuple(client.buffer_from_pyval(a) for a in arg)
        if isinstance(arg, tuple)
        else client.buffer_from_pyval(arg)
        for arg in args
    ]
    outs = exe.execute_portable(buffers, client.devices()[0], **donation)
    return outs, buffers


def values(client, text, *args):
    outs, _ = run(client, text, *args)
    return [o.to_numpy() for o in outs]


def unary(target, extra=""):
    return f"""HloModule unary
ENTRY e {{
  x = f32[16] parameter(0)
  ROOT c = f32[16] custom-call(x), custom_call_target="{target}"{extra}
}}"""


# -- Python, C and typed FFI targets -------------------------------------------------------


def test_python_target_on_the_client_registry(client):
    client.register_custom_call("py_affine", lambda ins, opaque: ins[0] * float(opaque) - 1)
    x = f32(16)
    [got] = values(client, unary("py_affine", ', backend_config="3"'), x)
    np.testing.assert_allclose(got, x * 3 - 1, rtol=1e-6)


C_VERSIONS = [
    ("affine_v1", ApiVersion.ORIGINAL, "", (2.0, 1.0)),
    ("affine_v2", ApiVersion.STATUS_RETURNING, "", (2.0, 1.0)),
    (
        "affine_v3",
        ApiVersion.STATUS_RETURNING_UNIFIED,
        ', backend_config="-1.5,0.25"',
        (-1.5, 0.25),
    ),
]


@pytest.mark.parametrize(("symbol", "version", "config", "ab"), C_VERSIONS)
def test_c_target_in_each_convention(client, c_lib, symbol, version, config, ab):
    client.register_custom_call("c_affine", c_pointer(c_lib, symbol), "Host", version)
    x = f32(16)
    text = unary("c_affine", f"{config}, api_version={version.value}")
    [got] = values(client, text, x)
    np.testing.assert_allclose(got, ab[0] * x + ab[1], rtol=1e-6)


def test_seed_tuple_layout_through_the_runtime(client, c_lib):
    client.register_custom_call("do_custom_call", c_pointer(c_lib, "seed_tuples_v1"))
    text = """HloModule seed_tuples
ENTRY e {
  p0 = (f32[32], (f32[64], f32[128]), f32[256]) parameter(0)
  ROOT c = (f32[512], f32[1024]) custom-call(p0), custom_call_target="do_custom_call"
}"""
    parts = [f32(n) for n in (32, 64, 128, 256)]
    exe = client.compile(text)
    bufs = [client.buffer_from_pyval(p) for p in parts]
    result, scratch = exe.execute_portable(
        [(bufs[0], (bufs[1], bufs[2]), bufs[3])], client.devices()[0]
    )
    flat = np.concatenate(parts)
    np.testing.assert_array_equal(
        result.to_numpy(), np.concatenate([2 * flat[::-1], np.arange(480, 512, dtype=np.float32)])
    )
    np.testing.assert_array_equal(scratch.to_numpy()[:480], flat)


@ffi.handler(
    args=[ffi.Buffer("f32", rank=2)],
    results=[ffi.Buffer("f32", rank=2), ffi.Buffer("s32", rank=1)],
    attrs={"scale": ffi.Attr(float), "shift": ffi.Attr(int), "label": ffi.Attr(str, "")},
)
def scaled_argmax(x, out, idx, *, scale, shift, label):
    if label == "fail":
        return ffi.Error("asked to fail by its label")
    out[...] = x * scale + shift
    idx[...] = np.argmax(x, axis=1)
    return None


FFI_CALL = """HloModule typed
ENTRY e {
  x = ELEM[3,5] parameter(0)
  ROOT c = (f32[3,5], s32[3]) custom-call(x), custom_call_target="scaled_argmax",
      api_version=API_VERSION_TYPED_FFI, backend_config={ATTRS}
}"""


def ffi_call(attrs="scale = 2.5 : f32, shift = 3 : i64", dtype="f32"):
    return FFI_CALL.replace("ELEM", dtype).replace("ATTRS", attrs)


def test_typed_ffi_handler_with_attributes(client):
    client.register_custom_call("scaled_argmax", scaled_argmax)
    x = f32(3, 5)
    out, idx = values(client, ffi_call(), x)
    np.testing.assert_allclose(out, x * 2.5 + 3, rtol=1e-6)
    np.testing.assert_array_equal(idx, np.argmax(x, axis=1).astype(np.int32))
    assert idx.dtype == np.int32


# -- failures: at compile time, or on the output's first use -------------------------------


def test_unknown_target_is_a_compile_time_error_naming_it(client):
    client.register_custom_call("known_target", lambda ins, opaque: ins[0])
    with pytest.raises(CustomCallError) as info:
        client.compile(unary("known_targt"))
    message = str(info.value)
    assert "c: no custom-call target 'known_targt' is registered for platform Host" in message
    assert "similar registered names: known_target" in message
    assert client.compile_cache_stats()["entries"] == 0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (ffi_call(dtype="s32"), r"argument 0 'x' expects f32\[rank 2\], got s32\[3,5\]"),
        (ffi_call("scale = 2.5 : f32"), "missing attribute"),
        (ffi_call('scale = "big", shift = 1 : i64'), "attribute 'scale' expects float, got str"),
    ],
)
def test_typed_ffi_mismatch_is_a_compile_time_error(client, text, expected):
    client.register_custom_call("scaled_argmax", scaled_argmax)
    with pytest.raises(CustomCallError, match=expected) as info:
        client.compile(text)
    assert "c (target 'scaled_argmax')" in str(info.value)


def test_c_api_version_clash_is_a_compile_time_error(client, c_lib):
    client.register_custom_call("c_affine", c_pointer(c_lib, "affine_v2"), api_version=2)
    with pytest.raises(CustomCallError, match="registered as API_VERSION_STATUS_RETURNING"):
        client.compile(unary("c_affine", ", api_version=API_VERSION_STATUS_RETURNING_UNIFIED"))


@pytest.mark.parametrize("kind", ["c_status", "ffi_error", "python_raise"])
def test_target_failure_surfaces_on_the_outputs_first_use(client, c_lib, kind):
    x = f32(16)
    if kind == "c_status":
        client.register_custom_call("fails", c_pointer(c_lib, "affine_v2"), api_version=2)
        text, message = unary("fails", ", api_version=API_VERSION_STATUS_RETURNING"), "above 100"
        x[7] = 250.0
    elif kind == "ffi_error":
        client.register_custom_call("scaled_argmax", scaled_argmax)
        text = ffi_call('scale = 1.0 : f32, shift = 0 : i64, label = "fail"')
        message, x = "asked to fail by its label", f32(3, 5)
    else:
        client.register_custom_call("fails", lambda ins, opaque: 1 / 0)
        text, message = unary("fails"), "ZeroDivisionError"
    outs, [arg] = run(client, text, x)  # returns at once; the failure comes with the outputs
    error = outs[0].ready().exception(timeout=60)
    assert isinstance(error, ExecutionError) and message in str(error)
    assert isinstance(error.__cause__, CustomCallError)
    for out in outs:
        with pytest.raises(ExecutionError, match=message):
            out.to_numpy()
    np.testing.assert_array_equal(arg.to_numpy(), x)


def test_c_target_status_success_after_a_failure(client, c_lib):
    client.register_custom_call("c_affine", c_pointer(c_lib, "affine_v2"), api_version=2)
    text = unary("c_affine", ", api_version=API_VERSION_STATUS_RETURNING")
    bad = np.full(16, 500, np.float32)
    good = f32(16)
    bad_out, _ = run(client, text, bad)
    good_out, _ = run(client, text, good)
    np.testing.assert_allclose(good_out[0].to_numpy(), 2 * good + 1, rtol=1e-6)
    with pytest.raises(ExecutionError, match="value 500 above 100 at 0"):
        bad_out[0].to_numpy()


# -- registries and the compile cache -----------------------------------------------------


def test_registering_after_a_failed_compile_lets_a_recompile_succeed(client):
    text = unary("late_target")
    with pytest.raises(CustomCallError, match="late_target"):
        client.compile(text)
    client.register_custom_call("late_target", lambda ins, opaque: ins[0] + 2)
    x = f32(16)
    [got] = values(client, text, x)
    np.testing.assert_allclose(got, x + 2, rtol=1e-6)


def test_cache_key_follows_the_registries(client):
    client.register_custom_call("first", lambda ins, opaque: ins[0] * 3)
    text = unary("first")
    exe = client.compile(text)
    assert client.compile(text) is exe
    client.register_custom_call("unrelated", lambda ins, opaque: ins[0])
    again = client.compile(text)
    assert again is not exe
    client.unregister_custom_call("first")
    with pytest.raises(CustomCallError, match="no custom-call target 'first'"):
        client.compile(text)


def test_client_registry_wins_over_global_and_clients_are_separate():
    name = next(NAMES)
    xlapy.runtime.register_custom_call(name, lambda ins, opaque: ins[0] + 100)
    mine, other, bare = Client("cpu"), Client("interpreter"), Client("cpu")
    try:
        mine.register_custom_call(name, lambda ins, opaque: ins[0] - 100)
        other.register_custom_call("only_other", lambda ins, opaque: ins[0] * 0)
        x = f32(16)
        np.testing.assert_allclose(values(mine, unary(name), x)[0], x - 100, rtol=1e-6)
        np.testing.assert_allclose(values(bare, unary(name), x)[0], x + 100, rtol=1e-6)
        with pytest.raises(CustomCallError, match="only_other"):
            mine.compile(unary("only_other"))
        exe = other.compile(unary("only_other"))
        with pytest.raises(CustomCallError, match="only_other"):
            Client("interpreter").deserialize_executable(exe.serialize())
    finally:
        custom_calls.GLOBAL_REGISTRY.unregister(name)
        for c in (mine, other, bare):
            c.close()


def test_runtime_exports_the_custom_call_api():
    for name in ("register_custom_call", "CustomCallRegistry", "ApiVersion", "ffi"):
        assert name in xlapy.runtime.__all__
    assert xlapy.runtime.CustomCallRegistry is custom_calls.CustomCallRegistry
    assert xlapy.runtime.ffi.handler is ffi.handler


# -- aliasing and donation ----------------------------------------------------------------

ACCUMULATE = """HloModule accumulate, input_output_alias={ {}: (0, {}, may-alias) }
ENTRY e {
  acc = f32[16] parameter(0)
  x = f32[16] parameter(1)
  ROOT c = f32[16] custom-call(acc, x), custom_call_target="accumulate",
      output_to_operand_aliasing={{}: (0, {})}, api_version=API_VERSION_STATUS_RETURNING
}"""


@pytest.mark.parametrize("target", ["c", "python"])
def test_operand_aliasing_donated_in_place(client, c_lib, target):
    if target == "c":
        client.register_custom_call("accumulate", c_pointer(c_lib, "accumulate"), api_version=2)
        text = ACCUMULATE
    else:

        def accumulate(ins, opaque, outs):
            outs[0] += ins[1]

        client.register_custom_call("accumulate", accumulate)
        text = ACCUMULATE.replace(", api_version=API_VERSION_STATUS_RETURNING", "")
    acc, x = f32(16), f32(16)
    exe = client.compile(text)
    acc_buf, x_buf = client.buffer_from_pyval(acc), client.buffer_from_pyval(x)
    pointer = acc_buf.unsafe_buffer_pointer()
    [out] = exe.execute_portable([acc_buf, x_buf], client.devices()[0], donate=[0])
    np.testing.assert_allclose(out.to_numpy(), acc + x, rtol=1e-6)
    assert out.unsafe_buffer_pointer() == pointer
    assert acc_buf.is_donated and not x_buf.is_deleted


def test_operand_aliasing_not_donated_is_copy_protected(client, c_lib):
    client.register_custom_call("accumulate", c_pointer(c_lib, "accumulate"), api_version=2)
    acc, x = f32(16), f32(16)
    [out], [acc_buf, x_buf] = run(client, ACCUMULATE, acc, x)
    np.testing.assert_allclose(out.to_numpy(), acc + x, rtol=1e-6)
    assert out.unsafe_buffer_pointer() != acc_buf.unsafe_buffer_pointer()
    np.testing.assert_array_equal(acc_buf.to_numpy(), acc)
    np.testing.assert_array_equal(x_buf.to_numpy(), x)


# -- side effects -------------------------------------------------------------------------

SIDE_EFFECTS = """HloModule side_effects
ENTRY e {
  x = f32[16] parameter(0)
  unused = f32[16] custom-call(x), custom_call_target="count", custom_call_has_side_effect=true
  twin = f32[16] custom-call(x), custom_call_target="count", custom_call_has_side_effect=true
  ROOT r = f32[16] add(x, twin)
}"""


def test_side_effecting_calls_run_exactly_once_per_execution(client):
    calls = []

    def count(ins, opaque):
        calls.append(float(ins[0][0]))
        return ins[0]

    client.register_custom_call("count", count)
    exe = client.compile(SIDE_EFFECTS)
    xs = [f32(16) for _ in range(3)]
    outs = [exe.execute_portable([client.buffer_from_pyval(x)], client.devices()[0]) for x in xs]
    for x, [out] in zip(xs, outs, strict=True):
        np.testing.assert_allclose(out.to_numpy(), 2 * x, rtol=1e-6)
    assert calls == [float(x[0]) for x in xs for _ in range(2)]  # both calls, once each


def test_side_effects_run_once_per_replica():
    calls = []
    client = Client("cpu", device_count=2)
    try:
        client.register_custom_call("count", lambda ins, opaque: calls.append(1) or ins[0])
        exe = client.compile(SIDE_EFFECTS, CompileOptions.make(num_replicas=2))
        args = [[client.buffer_from_pyval(f32(16), d)] for d in client.devices()]
        for [out] in exe.execute(args):
            out.block_until_ready()
        assert len(calls) == 2 * 2
    finally:
        client.close()


# -- LAPACK targets from jnp.linalg -------------------------------------------------------


def spd(n):
    a = f32(n, n)
    return (a @ a.T + n * np.eye(n)).astype(np.float32)


LINALG = [
    ("cholesky", jnp.linalg.cholesky, lambda: (spd(5),)),
    ("solve", jnp.linalg.solve, lambda: (spd(4) + f32(4, 4), f32(4, 3))),
    ("eigh", lambda a: jnp.linalg.eigh(a)[0], lambda: (spd(6),)),
    ("qr", lambda a: jnp.abs(jnp.linalg.qr(a)[1]), lambda: (f32(5, 3),)),
]


@pytest.mark.parametrize(("name", "fn", "make_args"), LINALG, ids=[n for n, *_ in LINALG])
def test_lapack_targets_from_jax_run_through_the_runtime(client, name, fn, make_args):
    args = make_args()
    text = jax.jit(fn).lower(*args).as_text(dialect="hlo")
    assert "custom-call" in text and "lapack_" in text
    got = values(client, text, *args)
    want = [np.asarray(leaf) for leaf in jax.tree.leaves(jax.jit(fn)(*args))]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-4 * max(1.0, np.abs(w).max()))
