"""jax.ffi targets on the "xlapy" platform: `jax.ffi.register_ffi_target(name, capsule,
platform="xlapy")` + `jax.ffi.ffi_call` run XLA FFI handlers in C through xlapy's call
frames (xlapy.backends.xla_ffi): jaxlib's own compiled LAPACK handlers, and handlers
written here in C against XLA's c_api.h (compiled with cffi) that read every kind of
attribute, return errors and finish asynchronously. Each result is compared with XLA:CPU
running the same handler in the same process."""

import ctypes

import cffi
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.lib import lapack

from xlapy.backends import xla_ffi

XLAPY = jax.devices("xlapy")[0]
CPU = jax.devices("cpu")[0]
RNG = np.random.default_rng(11)

C_HELPERS = r"""
#include <string.h>
#include "xla/ffi/api/c_api.h"

static XLA_FFI_Error* fail(const XLA_FFI_Api* api, const char* message) {
  XLA_FFI_Error_Create_Args args;
  memset(&args, 0, sizeof(args));
  args.struct_size = XLA_FFI_Error_Create_Args_STRUCT_SIZE;
  args.message = message;
  args.errc = XLA_FFI_Error_Code_INVALID_ARGUMENT;
  return api->XLA_FFI_Error_Create(&args);
}

/* XLA:CPU asks a handler for its metadata when it is registered (a call frame with the
   metadata extension), as XLA's C++ bindings answer. */
static int metadata(XLA_FFI_CallFrame* frame) {
  XLA_FFI_Extension_Base* ext = frame->extension_start;
  if (ext == NULL || ext->type != XLA_FFI_Extension_Metadata) return 0;
  XLA_FFI_Metadata* m = ((XLA_FFI_Metadata_Extension*)ext)->metadata;
  m->api_version.struct_size = XLA_FFI_Api_Version_STRUCT_SIZE;
  m->api_version.extension_start = NULL;
  m->api_version.major_version = XLA_FFI_API_MAJOR;
  m->api_version.minor_version = XLA_FFI_API_MINOR;
  m->traits = 0;
  return 1;
}

"""

SOURCE = (
    C_HELPERS
    + r"""
static int named(XLA_FFI_Attrs* attrs, int64_t i, const char* name) {
  XLA_FFI_ByteSpan* span = attrs->names[i];
  return span->len == strlen(name) && memcmp(span->ptr, name, span->len) == 0;
}

/* y = x * scale + bias + opts.repeat + shift[i % n], for f32 x; label must be "ok".
   Attributes (sorted by name): bias f64, label string, opts {repeat i64}, scale f32,
   shift array<i64>. */
XLA_FFI_Error* affine(XLA_FFI_CallFrame* frame) {
  const XLA_FFI_Api* api = frame->api;
  if (metadata(frame)) return NULL;
  if (frame->struct_size != XLA_FFI_CallFrame_STRUCT_SIZE) return fail(api, "frame size");
  if (frame->stage != XLA_FFI_ExecutionStage_EXECUTE) return fail(api, "stage");
  if (frame->args.size != 1 || frame->rets.size != 1) return fail(api, "one arg, one result");
  if (frame->args.types[0] != XLA_FFI_ArgType_BUFFER) return fail(api, "arg type");
  XLA_FFI_Buffer* x = (XLA_FFI_Buffer*)frame->args.args[0];
  XLA_FFI_Buffer* y = (XLA_FFI_Buffer*)frame->rets.rets[0];
  if (x->dtype != XLA_FFI_DataType_F32 || y->dtype != XLA_FFI_DataType_F32)
    return fail(api, "affine takes f32");
  XLA_FFI_Attrs* attrs = &frame->attrs;
  if (attrs->size != 5 || !named(attrs, 0, "bias") || !named(attrs, 1, "label") ||
      !named(attrs, 2, "opts") || !named(attrs, 3, "scale") || !named(attrs, 4, "shift"))
    return fail(api, "attributes bias, label, opts, scale, shift expected in this order");
  if (attrs->types[0] != XLA_FFI_AttrType_SCALAR || attrs->types[1] != XLA_FFI_AttrType_STRING ||
      attrs->types[2] != XLA_FFI_AttrType_DICTIONARY ||
      attrs->types[3] != XLA_FFI_AttrType_SCALAR || attrs->types[4] != XLA_FFI_AttrType_ARRAY)
    return fail(api, "attribute kinds");
  XLA_FFI_Scalar* bias = (XLA_FFI_Scalar*)attrs->attrs[0];
  XLA_FFI_ByteSpan* label = (XLA_FFI_ByteSpan*)attrs->attrs[1];
  XLA_FFI_Attrs* opts = (XLA_FFI_Attrs*)attrs->attrs[2];
  XLA_FFI_Scalar* scale = (XLA_FFI_Scalar*)attrs->attrs[3];
  XLA_FFI_Array* shift = (XLA_FFI_Array*)attrs->attrs[4];
  if (bias->dtype != XLA_FFI_DataType_F64 || scale->dtype != XLA_FFI_DataType_F32 ||
      shift->dtype != XLA_FFI_DataType_S64 || shift->size == 0)
    return fail(api, "attribute types");
  if (opts->size != 1 || !named(opts, 0, "repeat") || opts->types[0] != XLA_FFI_AttrType_SCALAR)
    return fail(api, "opts must be {repeat}");
  XLA_FFI_Scalar* repeat = (XLA_FFI_Scalar*)opts->attrs[0];
  if (repeat->dtype != XLA_FFI_DataType_S64) return fail(api, "repeat must be i64");
  if (label->len != 2 || memcmp(label->ptr, "ok", 2) != 0) return fail(api, "label is not ok");
  XLA_FFI_DeviceOrdinal_Get_Args ordinal;
  memset(&ordinal, 0, sizeof(ordinal));
  ordinal.struct_size = XLA_FFI_DeviceOrdinal_Get_Args_STRUCT_SIZE;
  ordinal.ctx = frame->ctx;
  XLA_FFI_Error* err = api->XLA_FFI_DeviceOrdinal_Get(&ordinal);
  if (err) return err;
  if (ordinal.device_ordinal != 0) return fail(api, "device ordinal");
  int64_t n = 1;
  for (int64_t d = 0; d < x->rank; ++d) {
    if (x->dims[d] != y->dims[d]) return fail(api, "shapes differ");
    n *= x->dims[d];
  }
  const float* in = (const float*)x->data;
  float* out = (float*)y->data;
  float s = *(float*)scale->value;
  double b = *(double*)bias->value + (double)*(int64_t*)repeat->value;
  const int64_t* sh = (const int64_t*)shift->data;
  for (int64_t i = 0; i < n; ++i) out[i] = (float)(in[i] * s + b + sh[i % shift->size]);
  return NULL;
}

/* Asynchronous: y = 2 x, computed by a task on XLA's thread pool that completes a future. */
typedef struct { const XLA_FFI_Api* api; XLA_FFI_Future* future; const float* in;
                 float* out; int64_t n; } Work;
static Work work;

static void doubling(void* data) {
  Work* w = (Work*)data;
  for (int64_t i = 0; i < w->n; ++i) w->out[i] = 2.0f * w->in[i];
  XLA_FFI_Future_SetAvailable_Args done;
  memset(&done, 0, sizeof(done));
  done.struct_size = XLA_FFI_Future_SetAvailable_Args_STRUCT_SIZE;
  done.future = w->future;
  w->api->XLA_FFI_Future_SetAvailable(&done);
}

XLA_FFI_Error* double_async(XLA_FFI_CallFrame* frame) {
  const XLA_FFI_Api* api = frame->api;
  if (metadata(frame)) return NULL;
  XLA_FFI_Buffer* x = (XLA_FFI_Buffer*)frame->args.args[0];
  XLA_FFI_Buffer* y = (XLA_FFI_Buffer*)frame->rets.rets[0];
  XLA_FFI_Future_Create_Args create;
  memset(&create, 0, sizeof(create));
  create.struct_size = XLA_FFI_Future_Create_Args_STRUCT_SIZE;
  XLA_FFI_Error* err = api->XLA_FFI_Future_Create(&create);
  if (err) return err;
  work.api = api; work.future = create.future;
  work.in = (const float*)x->data; work.out = (float*)y->data; work.n = 1;
  for (int64_t d = 0; d < x->rank; ++d) work.n *= x->dims[d];
  XLA_FFI_ThreadPool_Schedule_Args schedule;
  memset(&schedule, 0, sizeof(schedule));
  schedule.struct_size = XLA_FFI_ThreadPool_Schedule_Args_STRUCT_SIZE;
  schedule.ctx = frame->ctx;
  schedule.task = doubling;
  schedule.data = &work;
  err = api->XLA_FFI_ThreadPool_Schedule(&schedule);
  if (err) return err;
  frame->future = create.future;
  return NULL;
}

/* Asks for a stream (there is none on the CPU): the API's error travels back. */
XLA_FFI_Error* wants_stream(XLA_FFI_CallFrame* frame) {
  if (metadata(frame)) return NULL;
  XLA_FFI_Stream_Get_Args args;
  memset(&args, 0, sizeof(args));
  args.struct_size = XLA_FFI_Stream_Get_Args_STRUCT_SIZE;
  args.ctx = frame->ctx;
  return frame->api->XLA_FFI_Stream_Get(&args);
}
"""
)

CDEF = """
void* affine(void* frame);
void* double_async(void* frame);
void* wants_stream(void* frame);
"""


@pytest.fixture(scope="module")
def handlers(tmp_path_factory):
    """The C handlers above, compiled, registered for "cpu" and "xlapy" as PyCapsules."""
    folder = tmp_path_factory.mktemp("xla_ffi")
    builder = cffi.FFI()
    builder.cdef(CDEF)
    builder.set_source("_xlapy_ffi_handlers", SOURCE, include_dirs=[jax.ffi.include_dir()])
    library = ctypes.CDLL(builder.compile(tmpdir=str(folder)))
    for name in ("affine", "double_async", "wants_stream"):
        capsule = jax.ffi.pycapsule(getattr(library, name))
        for platform in ("cpu", "xlapy"):
            jax.ffi.register_ffi_target(f"test_{name}", capsule, platform=platform)
    return library


def on_both(fn, *args):
    """fn jitted on XLA:CPU and on xlapy; both results as NumPy."""
    results = []
    for device in (CPU, XLAPY):
        out = jax.jit(fn)(*jax.device_put(args, device))
        assert all(device in leaf.devices() for leaf in jax.tree_util.tree_leaves(out))
        results.append(jax.tree_util.tree_map(np.asarray, out))
    return results


def affine_call(x, **attrs):
    return jax.ffi.ffi_call("test_affine", jax.ShapeDtypeStruct(x.shape, x.dtype))(x, **attrs)


def test_c_handler_reads_every_kind_of_attribute(handlers):
    x = RNG.standard_normal((3, 5)).astype(np.float32)
    attrs = dict(
        scale=np.float32(1.5),
        bias=np.float64(0.25),
        label="ok",
        opts={"repeat": np.int64(2)},
        shift=np.array([1, -2, 3], np.int64),
    )
    want, got = on_both(lambda a: affine_call(a, **attrs), x)
    expected = x * 1.5 + 2.25 + np.resize(np.array([1, -2, 3]), 15).reshape(3, 5)
    np.testing.assert_allclose(want, expected, rtol=1e-6)
    np.testing.assert_array_equal(got, want)


def test_c_handler_error_reaches_jax_with_its_message(handlers):
    x = RNG.standard_normal(4).astype(np.float32)
    attrs = dict(
        scale=np.float32(1.0),
        bias=np.float64(0.0),
        label="no",
        opts={"repeat": np.int64(0)},
        shift=np.array([0], np.int64),
    )
    with pytest.raises(jax.errors.JaxRuntimeError, match="label is not ok"):
        np.asarray(jax.jit(lambda a: affine_call(a, **attrs))(jax.device_put(x, XLAPY)))


def test_c_handler_with_wrong_attribute_type_fails_cleanly(handlers):
    x = RNG.standard_normal(4).astype(np.float32)
    attrs = dict(
        scale=np.float64(1.0),  # the handler wants f32
        bias=np.float64(0.0),
        label="ok",
        opts={"repeat": np.int64(0)},
        shift=np.array([0], np.int64),
    )
    with pytest.raises(jax.errors.JaxRuntimeError, match="attribute types"):
        np.asarray(jax.jit(lambda a: affine_call(a, **attrs))(jax.device_put(x, XLAPY)))


def test_asynchronous_c_handler_is_waited_for(handlers):
    x = RNG.standard_normal((64,)).astype(np.float32)
    call = jax.ffi.ffi_call("test_double_async", jax.ShapeDtypeStruct(x.shape, x.dtype))
    want, got = on_both(call, x)
    np.testing.assert_array_equal(want, 2 * x)
    np.testing.assert_array_equal(got, want)


def test_api_function_xlapy_lacks_returns_an_error_not_a_crash(handlers):
    x = RNG.standard_normal(2).astype(np.float32)
    call = jax.ffi.ffi_call("test_wants_stream", jax.ShapeDtypeStruct(x.shape, x.dtype))
    with pytest.raises(jax.errors.JaxRuntimeError, match="no streams"):
        np.asarray(jax.jit(call)(jax.device_put(x, XLAPY)))


# -- jaxlib's own compiled handlers (XLA's C++ FFI bindings) ---------------------------------
LAPACK = lapack._lapack


@pytest.fixture(scope="module")
def lapack_targets():
    LAPACK.initialize()  # jaxlib's LAPACK handlers call SciPy's LAPACK
    names = {}
    for kernel in ("lapack_spotrf_ffi", "lapack_dgetrf_ffi"):
        name = "test_" + kernel
        for platform in ("cpu", "xlapy"):
            jax.ffi.register_ffi_target(name, LAPACK.registrations()[kernel], platform=platform)
        names[kernel] = name
    return names


def test_jaxlib_cholesky_handler_runs_on_xlapy(lapack_targets):
    a = RNG.standard_normal((6, 6)).astype(np.float32)
    spd = a @ a.T + 6 * np.eye(6, dtype=np.float32)
    call = jax.ffi.ffi_call(
        lapack_targets["lapack_spotrf_ffi"],
        (jax.ShapeDtypeStruct(spd.shape, spd.dtype), jax.ShapeDtypeStruct((), jnp.int32)),
        input_output_aliases={0: 0},
    )
    want, got = on_both(lambda m: call(m, uplo=np.uint8(ord("L"))), spd)
    np.testing.assert_array_equal(got[0], want[0])
    assert int(got[1]) == 0
    # LAPACK is column-major: "L" of the row-major matrix is its upper factor U, A = U^T U
    upper = np.triu(got[0])
    np.testing.assert_allclose(upper.T @ upper, spd, rtol=1e-4, atol=1e-4)


def test_jaxlib_lu_handler_runs_on_xlapy(lapack_targets):
    a = RNG.standard_normal((5, 5))
    call = jax.ffi.ffi_call(
        lapack_targets["lapack_dgetrf_ffi"],
        (
            jax.ShapeDtypeStruct(a.shape, np.float64),
            jax.ShapeDtypeStruct((5,), jnp.int32),
            jax.ShapeDtypeStruct((), jnp.int32),
        ),
        input_output_aliases={0: 0},
    )
    with jax.enable_x64(True):
        want, got = on_both(call, a)
    for w, g in zip(want, got):
        np.testing.assert_array_equal(g, w)


def test_missing_attribute_is_the_handlers_error(lapack_targets):
    spd = np.eye(3, dtype=np.float32) * 2
    call = jax.ffi.ffi_call(
        lapack_targets["lapack_spotrf_ffi"],
        (jax.ShapeDtypeStruct(spd.shape, spd.dtype), jax.ShapeDtypeStruct((), jnp.int32)),
    )
    with pytest.raises(jax.errors.JaxRuntimeError, match="xlapy"):
        jax.block_until_ready(jax.jit(call)(jax.device_put(spd, XLAPY)))


def test_type_ids_are_assigned_once_per_name():
    first = xla_ffi.ffi.new("XLA_FFI_TypeId *")
    again = xla_ffi.ffi.new("XLA_FFI_TypeId *")
    other = xla_ffi.ffi.new("XLA_FFI_TypeId *")
    a = xla_ffi.register_type("test.State", first)
    assert xla_ffi.register_type("test.State", again) == a == first.type_id == again.type_id
    assert xla_ffi.register_type("test.Other", other) != a
    wrong = xla_ffi.ffi.new("XLA_FFI_TypeId *", [a + 1000])
    with pytest.raises(xla_ffi.FfiError, match="has id"):
        xla_ffi.register_type("test.State", wrong)


def test_stage_dict_without_execute_is_refused():
    with pytest.raises(ValueError, match="execute stage"):
        jax.ffi.register_ffi_target(
            "test_only_instantiate",
            {"instantiate": LAPACK.registrations()["lapack_spotrf_ffi"]},
            platform="xlapy",
        )


# -- per-instruction state: a handler with an instantiate stage -------------------------------
STATE_SOURCE = (
    C_HELPERS
    + r"""
#include <stdlib.h>

typedef struct { int64_t base; int64_t calls; } Counter;
XLA_FFI_TypeId counter_type = {0};
int64_t instantiated = 0, deleted = 0;
static void delete_counter(void* object) { ++deleted; free(object); }
XLA_FFI_TypeInfo counter_info = {XLA_FFI_TypeInfo_STRUCT_SIZE, NULL, delete_counter};

/* Instantiate: one attribute, base (i64), no buffers; the state is a Counter. */
XLA_FFI_Error* counter_instantiate(XLA_FFI_CallFrame* frame) {
  const XLA_FFI_Api* api = frame->api;
  if (metadata(frame)) return NULL;
  if (frame->stage != XLA_FFI_ExecutionStage_INSTANTIATE) return fail(api, "stage");
  if (frame->args.size != 0 || frame->rets.size != 0) return fail(api, "buffers at instantiate");
  if (frame->attrs.size != 1 || frame->attrs.types[0] != XLA_FFI_AttrType_SCALAR)
    return fail(api, "one scalar attribute expected");
  int64_t base = *(int64_t*)((XLA_FFI_Scalar*)frame->attrs.attrs[0])->value;
  if (base < 0) return fail(api, "base must not be negative");
  Counter* counter = (Counter*)malloc(sizeof(Counter));
  counter->base = base;
  counter->calls = 0;
  XLA_FFI_State_Set_Args set;
  memset(&set, 0, sizeof(set));
  set.struct_size = XLA_FFI_State_Set_Args_STRUCT_SIZE;
  set.ctx = frame->ctx;
  set.stage = XLA_FFI_ExecutionStage_INSTANTIATE;
  set.type_id = &counter_type;
  set.state = counter;
  XLA_FFI_Error* err = api->XLA_FFI_State_Set(&set);
  if (err) { free(counter); return err; }
  ++instantiated;
  return NULL;
}

/* Execute: y = x + base + (number of earlier runs of this instruction). */
XLA_FFI_Error* counter_execute(XLA_FFI_CallFrame* frame) {
  const XLA_FFI_Api* api = frame->api;
  if (metadata(frame)) return NULL;
  if (frame->stage != XLA_FFI_ExecutionStage_EXECUTE) return fail(api, "stage");
  XLA_FFI_State_Get_Args get;
  memset(&get, 0, sizeof(get));
  get.struct_size = XLA_FFI_State_Get_Args_STRUCT_SIZE;
  get.ctx = frame->ctx;
  get.stage = XLA_FFI_ExecutionStage_INSTANTIATE;
  get.type_id = &counter_type;
  XLA_FFI_Error* err = api->XLA_FFI_State_Get(&get);
  if (err) return err;
  Counter* counter = (Counter*)get.state;
  XLA_FFI_Buffer* x = (XLA_FFI_Buffer*)frame->args.args[0];
  XLA_FFI_Buffer* y = (XLA_FFI_Buffer*)frame->rets.rets[0];
  int64_t n = 1;
  for (int64_t d = 0; d < x->rank; ++d) n *= x->dims[d];
  for (int64_t i = 0; i < n; ++i)
    ((float*)y->data)[i] = ((const float*)x->data)[i] + (float)(counter->base + counter->calls);
  ++counter->calls;
  return NULL;
}
"""
)


@pytest.fixture(scope="module")
def counters(tmp_path_factory):
    """The counter handler compiled twice (each platform's registry writes its own type id
    into its copy), registered as "test_counter" with both stages: {platform: library}."""
    libraries = {}
    for platform in ("cpu", "xlapy"):
        folder = tmp_path_factory.mktemp(f"xla_ffi_state_{platform}")
        builder = cffi.FFI()
        builder.cdef("extern int64_t instantiated, deleted;")
        source = STATE_SOURCE + "\nvoid* counter_type_address(void) { return &counter_type; }\n"
        source += "void* counter_info_address(void) { return &counter_info; }\n"
        builder.set_source(f"_xlapy_ffi_state_{platform}", source,
                           include_dirs=[jax.ffi.include_dir()])  # fmt: skip
        library = ctypes.CDLL(builder.compile(tmpdir=str(folder)))
        for fn in ("counter_type_address", "counter_info_address"):
            getattr(library, fn).restype = ctypes.c_void_p
        type_id = ctypes.cast(library.counter_type_address(), ctypes.c_void_p)
        type_info = ctypes.cast(library.counter_info_address(), ctypes.c_void_p)
        capsule = ctypes.pythonapi.PyCapsule_New
        capsule.restype, capsule.argtypes = ctypes.py_object, [ctypes.c_void_p] * 3
        jax.ffi.register_ffi_type(
            "test.Counter",
            {"type_id": capsule(type_id, None, None), "type_info": capsule(type_info, None, None)},
            platform=platform,
        )
        stages = {
            "instantiate": jax.ffi.pycapsule(library.counter_instantiate),
            "execute": jax.ffi.pycapsule(library.counter_execute),
        }
        jax.ffi.register_ffi_target("test_counter", stages, platform=platform, api_version=1)
        libraries[platform] = library
    return libraries


def _count(library, name: str) -> int:
    return ctypes.c_int64.in_dll(library, name).value


def counter_call(x, base):
    call = jax.ffi.ffi_call("test_counter", jax.ShapeDtypeStruct(x.shape, x.dtype))
    return call(x, base=np.int64(base))


def test_instantiate_stage_state_lives_with_the_compiled_instruction(counters):
    x = RNG.standard_normal((4, 3)).astype(np.float32)
    made = _count(counters["xlapy"], "instantiated")
    step = jax.jit(lambda a: counter_call(a, 5))
    runs = {}
    for platform, device in (("cpu", CPU), ("xlapy", XLAPY)):
        arg = jax.device_put(x, device)
        runs[platform] = [np.asarray(step(arg)) for _ in range(3)]
    for k, got in enumerate(runs["xlapy"]):
        np.testing.assert_array_equal(got, x + np.float32(5 + k))  # the state counts the runs
        np.testing.assert_array_equal(got, runs["cpu"][k])
    # one instantiation for the one compiled instruction, not one per run
    assert _count(counters["xlapy"], "instantiated") == made + 1


def test_each_compiled_instruction_has_its_own_state(counters):
    x = RNG.standard_normal(6).astype(np.float32)
    arg = jax.device_put(x, XLAPY)
    two = jax.jit(lambda a: (counter_call(a, 1), counter_call(a * 2, 100)))
    first, second = (jax.tree_util.tree_map(np.asarray, two(arg)) for _ in range(2))
    np.testing.assert_array_equal(first[0], x + 1)
    np.testing.assert_array_equal(first[1], 2 * x + 100)
    np.testing.assert_array_equal(second[0], x + 2)
    np.testing.assert_array_equal(second[1], 2 * x + 101)


def test_state_is_freed_by_its_types_deleter_when_the_program_dies(counters):
    """The state lives as long as the compiled program: here xlapy's own client, whose
    compile cache holds the program until it is cleared (JAX's caches hold it the same way
    through the plugin)."""
    import gc

    from xlapy.runtime import Client

    library = counters["xlapy"]
    client = Client("cpu")
    text = """HloModule counted
ENTRY e {
  x = f32[3] parameter(0)
  ROOT c = f32[3] custom-call(x), custom_call_target="test_counter",
      api_version=API_VERSION_TYPED_FFI, backend_config={base = 7 : i64}
}"""
    x = RNG.standard_normal(3).astype(np.float32)
    exe = client.compile(text)
    for k in range(2):
        (out,) = exe.execute_portable([client.buffer_from_pyval(x)], client.devices()[0])
        np.testing.assert_array_equal(out.to_numpy(), x + np.float32(7 + k))
    deleted = _count(library, "deleted")
    del exe, out
    client.clear_compile_cache()
    client.close()
    gc.collect()
    assert _count(library, "deleted") == deleted + 1


def test_failing_instantiate_stage_reaches_jax_with_its_message(counters):
    x = RNG.standard_normal(3).astype(np.float32)
    with pytest.raises(jax.errors.JaxRuntimeError, match="base must not be negative"):
        np.asarray(jax.jit(lambda a: counter_call(a, -1))(jax.device_put(x, XLAPY)))
