"""An FFI handler asking for user data of its execution context
(`XLA_FFI_ExecutionContext_Get`), on XLA:CPU and on xlapy in one process.

XLA:CPU answers from the user data the caller attached to the execution and returns
NOT_FOUND for any other type; JAX attaches user data only to XLA:CPU's own executions
(its host callbacks), never to a PJRT plugin's. So on both platforms a handler's lookup of
its own registered type fails the call with "not found", and xlapy's message names the
type; the device stays usable.
"""

import ctypes

import cffi
import jax
import numpy as np
import pytest

XLAPY = jax.devices("xlapy")[0]
CPU = jax.devices("cpu")[0]

SOURCE = r"""
#include <string.h>
#include "xla/ffi/api/c_api.h"

XLA_FFI_TypeId user_type = {0};

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

/* y = x + *(float*)user_data, the user data found by its type in the execution context. */
XLA_FFI_Error* add_user_data(XLA_FFI_CallFrame* frame) {
  if (metadata(frame)) return NULL;
  XLA_FFI_ExecutionContext_Get_Args args;
  memset(&args, 0, sizeof(args));
  args.struct_size = XLA_FFI_ExecutionContext_Get_Args_STRUCT_SIZE;
  args.ctx = frame->ctx;
  args.type_id = &user_type;
  XLA_FFI_Error* err = frame->api->XLA_FFI_ExecutionContext_Get(&args);
  if (err) return err;
  XLA_FFI_Buffer* x = (XLA_FFI_Buffer*)frame->args.args[0];
  XLA_FFI_Buffer* y = (XLA_FFI_Buffer*)frame->rets.rets[0];
  float add = *(float*)args.data;
  for (int64_t i = 0; i < x->dims[0]; ++i) ((float*)y->data)[i] = ((float*)x->data)[i] + add;
  return NULL;
}

void* user_type_address(void) { return &user_type; }
"""


@pytest.fixture(scope="module")
def add_user_data(tmp_path_factory):
    builder = cffi.FFI()
    builder.cdef("void* add_user_data(void* frame); void* user_type_address(void);")
    builder.set_source("_xlapy_ffi_context", SOURCE, include_dirs=[jax.ffi.include_dir()])
    library = ctypes.CDLL(builder.compile(tmpdir=str(tmp_path_factory.mktemp("ffi_context"))))
    library.user_type_address.restype = ctypes.c_void_p
    new_capsule = ctypes.pythonapi.PyCapsule_New
    new_capsule.restype = ctypes.py_object
    new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    type_id = new_capsule(library.user_type_address(), None, None)
    handler = jax.ffi.pycapsule(library.add_user_data)
    for platform in ("cpu", "xlapy"):
        jax.ffi.register_ffi_type("xlapy_test_user_data", {"type_id": type_id}, platform=platform)
        jax.ffi.register_ffi_target("xlapy_test_add_user_data", handler, platform=platform)
    return library


def test_user_data_lookup_is_not_found_on_both(add_user_data):
    x = np.random.default_rng(13).standard_normal(5).astype(np.float32)
    call = jax.jit(
        jax.ffi.ffi_call("xlapy_test_add_user_data", jax.ShapeDtypeStruct(x.shape, x.dtype))
    )
    messages = {}
    for device in (CPU, XLAPY):
        with pytest.raises(jax.errors.JaxRuntimeError) as failed:
            np.asarray(call(jax.device_put(x, device)))
        messages[device.platform] = str(failed.value)
    assert "not found in execution context" in messages["cpu"]
    assert "not found in the execution context" in messages["xlapy"]
    assert "'xlapy_test_user_data'" in messages["xlapy"]  # the type, by name
    assert "error code 5" in messages["xlapy"]  # NOT_FOUND, as XLA:CPU's status
    assert messages["cpu"].startswith("NOT_FOUND"), messages["cpu"]
    assert messages["xlapy"].startswith("NOT_FOUND"), messages["xlapy"]  # the call's status
    y = jax.jit(lambda a: a * 2)(jax.device_put(x, XLAPY))  # the device is still sound
    np.testing.assert_allclose(np.asarray(y), x * 2, rtol=1e-6)
