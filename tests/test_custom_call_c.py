"""C custom-call targets, compiled with cffi at test time: the three CPU conventions
(original, status-returning, unified), tuple operands and results as nested pointer tables
(seed 002's layout, its own example included), opaque strings, status
failure messages, output-to-operand aliasing, tuple outputs as scratch memory, the ways to
hand over a function pointer, the GPU `buffers` layout and convention, side effects, and
the example in examples/custom_call."""

import ctypes
import importlib.util
import runpy
from pathlib import Path

import cffi
import numpy as np
import pytest

from xlapy.backends import custom_calls
from xlapy.backends.custom_calls import (
    GPU_TARGETS,
    ApiVersion,
    CustomCallRegistry,
    check_custom_calls,
    gpu_buffer_layout,
)
from xlapy.backends.interpreter import evaluate
from xlapy.errors import CustomCallError
from xlapy.ir.parser import parse_module

RNG = np.random.default_rng(9)
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "custom_call"

CDEF = """
typedef struct XlaCustomCallStatus_ XlaCustomCallStatus;
void seed_example(void* out, const void** ins);
void tuple_sums(void* out, const void** ins);
void checked_sqrt(void* out, const void** ins, XlaCustomCallStatus* status);
void scale_by_opaque(void* out, const void** ins, const char* opaque, size_t opaque_len,
                     XlaCustomCallStatus* status);
void with_scratch(void* out, const void** ins, XlaCustomCallStatus* status);
void add_in_place(void* out, const void** ins, XlaCustomCallStatus* status);
void gpu_add(void* stream, void** buffers, const char* opaque, size_t opaque_len);
void seed_tuples_v1(void* out, const void** ins);
void seed_tuples_v2(void* out, const void** ins, XlaCustomCallStatus* status);
void seed_tuples_v3(void* out, const void** ins, const char* opaque, size_t opaque_len,
                    XlaCustomCallStatus* status);
void add_into_nested(void* out, const void** ins, XlaCustomCallStatus* status);
void gpu_fail(void* stream, void** buffers, const char* opaque, size_t opaque_len,
              XlaCustomCallStatus* status);
"""

SOURCE = r"""
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include "xlapy_custom_call.h"

/* The seed's example: out[i] = in0[i % 128] + in1[i], f32[128], f32[2048] -> f32[2048]. */
void seed_example(void* out, const void** ins) {
  float* o = (float*)out;
  const float* a = (const float*)ins[0];
  const float* b = (const float*)ins[1];
  for (int i = 0; i < 2048; ++i) o[i] = a[i % 128] + b[i];
}

/* (f32[4], (s32[3], f64[2])) -> (f64[], s32[]): sums of the float and integer leaves.
   ins[0] is the tuple operand's pointer table {f, {n, d}}. */
void tuple_sums(void* out, const void** ins) {
  void** outs = (void**)out;
  void* const* p = (void* const*)ins[0];
  void* const* inner = (void* const*)p[1];
  const float* f = (const float*)p[0];
  const int32_t* n = (const int32_t*)inner[0];
  const double* d = (const double*)inner[1];
  double total = d[0] + d[1];
  for (int i = 0; i < 4; ++i) total += f[i];
  *(double*)outs[0] = total;
  *(int32_t*)outs[1] = n[0] + n[1] + n[2];
}

/* f32[8] -> f32[8]; fails on a negative input. */
void checked_sqrt(void* out, const void** ins, XlaCustomCallStatus* status) {
  const float* x = (const float*)ins[0];
  float* o = (float*)out;
  for (int i = 0; i < 8; ++i) {
    if (x[i] < 0) {
      char message[64];
      int len = snprintf(message, sizeof message, "negative input %g at index %d", x[i], i);
      xlapy_custom_call_status_set_failure(status, message, (size_t)len);
      return;
    }
    o[i] = sqrtf(x[i]);
  }
}

/* f32[8] -> f32[8], scaled by the number written in `opaque`. */
void scale_by_opaque(void* out, const void** ins, const char* opaque, size_t opaque_len,
                     XlaCustomCallStatus* status) {
  char text[64];
  if (opaque_len == 0 || opaque_len >= sizeof text) {
    XlaCustomCallStatusSetFailure(status, "opaque must hold the scale", 26);
    return;
  }
  memcpy(text, opaque, opaque_len);
  text[opaque_len] = 0;
  float scale = strtof(text, NULL);
  const float* x = (const float*)ins[0];
  float* o = (float*)out;
  for (int i = 0; i < 8; ++i) o[i] = x[i] * scale;
}

/* f32[8] -> (f32[8], f32[8]); the second output is scratch: squares, then result = sq + 1 */
void with_scratch(void* out, const void** ins, XlaCustomCallStatus* status) {
  void** outs = (void**)out;
  const float* x = (const float*)ins[0];
  float* result = (float*)outs[0];
  float* scratch = (float*)outs[1];
  for (int i = 0; i < 8; ++i) scratch[i] = x[i] * x[i];
  for (int i = 0; i < 8; ++i) result[i] = scratch[7 - i] + 1.0f;
  XlaCustomCallStatusSetSuccess(status);
}

/* (f32[8] buf, f32[8] upd) -> f32[8] aliased to buf: buf += upd in place. */
void add_in_place(void* out, const void** ins, XlaCustomCallStatus* status) {
  if (ins[0] != out) {
    xlapy_custom_call_status_set_failure(status, "output does not alias operand 0", 31);
    return;
  }
  float* buf = (float*)out;
  const float* upd = (const float*)ins[1];
  for (int i = 0; i < 8; ++i) buf[i] += upd[i];
}

/* GPU convention on host memory: buffers = {in0 f32[n], in1 f32[n], out f32[n]}. */
/* Seed 002's tuple example. ins[0] = p0 = {subbuf0 f32[32], subtuple, subbuf3 f32[256]},
   subtuple = {subbuf1 f32[64], subbuf2 f32[128]}; out = {f32[512], f32[1024] scratch}.
   The scratch gets every operand element in order (480 of them), then -1s; the result is
   the scratch read backwards and doubled, then i for the last 32 slots. */
static void seed_tuples_body(void* out, const void** ins) {
  void* const* p0 = (void* const*)ins[0];
  void* const* subtuple = (void* const*)p0[1];
  const float* parts[4] = {(const float*)p0[0], (const float*)subtuple[0],
                           (const float*)subtuple[1], (const float*)p0[2]};
  const int sizes[4] = {32, 64, 128, 256};
  void** outs = (void**)out;
  float* result = (float*)outs[0];
  float* scratch = (float*)outs[1];
  int k = 0;
  for (int part = 0; part < 4; ++part)
    for (int i = 0; i < sizes[part]; ++i) scratch[k++] = parts[part][i];
  for (int i = k; i < 1024; ++i) scratch[i] = -1.0f;
  for (int i = 0; i < 480; ++i) result[i] = 2.0f * scratch[479 - i];
  for (int i = 480; i < 512; ++i) result[i] = (float)i;
}
void seed_tuples_v1(void* out, const void** ins) { seed_tuples_body(out, ins); }
void seed_tuples_v2(void* out, const void** ins, XlaCustomCallStatus* status) {
  (void)status;
  seed_tuples_body(out, ins);
}
void seed_tuples_v3(void* out, const void** ins, const char* opaque, size_t opaque_len,
                    XlaCustomCallStatus* status) {
  if (opaque_len != 5 || memcmp(opaque, "seed!", 5) != 0) {
    XlaCustomCallStatusSetFailure(status, "opaque is not 'seed!'", 21);
    return;
  }
  seed_tuples_body(out, ins);
}

/* (f32[8], (f32[4], f32[8])) -> f32[8] aliased to the operand's leaf {1,1}:
   that leaf += the first leaf, in place. */
void add_into_nested(void* out, const void** ins, XlaCustomCallStatus* status) {
  void* const* p = (void* const*)ins[0];
  void* const* inner = (void* const*)p[1];
  if (inner[1] != out) {
    XlaCustomCallStatusSetFailure(status, "output does not alias operand 0 {1,1}", 37);
    return;
  }
  const float* a = (const float*)p[0];
  float* buf = (float*)out;
  for (int i = 0; i < 8; ++i) buf[i] += a[i];
}

void gpu_add(void* stream, void** buffers, const char* opaque, size_t opaque_len) {
  (void)stream;
  int n = (int)strtol(opaque, NULL, 10);
  const float* a = (const float*)buffers[0];
  const float* b = (const float*)buffers[1];
  float* o = (float*)buffers[2];
  for (int i = 0; i < n; ++i) o[i] = a[i] + b[i];
}

void gpu_fail(void* stream, void** buffers, const char* opaque, size_t opaque_len,
              XlaCustomCallStatus* status) {
  XlaCustomCallStatusSetFailure(status, opaque, opaque_len);
}
"""


def build_cffi_module(folder: Path, name: str, cdef: str, source: str):
    """Compile `source` with cffi into `folder` and import it (the module has .ffi, .lib)."""
    custom_calls.write_c_header(folder)
    builder = cffi.FFI()
    builder.cdef(cdef)
    builder.set_source(
        name, '#include "xlapy_custom_call.h"\n' + source, include_dirs=[str(folder)]
    )
    path = builder.compile(tmpdir=str(folder))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, path


@pytest.fixture(scope="module")
def c_lib(tmp_path_factory):
    return build_cffi_module(tmp_path_factory.mktemp("cc"), "_xlapy_cc_targets", CDEF, SOURCE)


def pointer(c_lib, name):
    module, _ = c_lib
    return module.ffi.addressof(module.lib, name)


def run(text, args, registry, **state):
    module = parse_module(text)
    check_custom_calls(module, state.get("platform", "Host"), registry=registry)
    return evaluate(module, args, custom_calls=registry, **state)


SEED = """HloModule m
ENTRY e {
  p0 = f32[128] parameter(0)
  p1 = f32[2048] parameter(1)
  ROOT c = f32[2048] custom-call(p0, p1), custom_call_target="do_custom_call"
}"""


@pytest.mark.parametrize("form", ["cffi", "int", "ctypes"])
def test_original_convention_runs_the_seed_example(c_lib, form):
    address = int(c_lib[0].ffi.cast("uintptr_t", pointer(c_lib, "seed_example")))
    fn = {
        "cffi": pointer(c_lib, "seed_example"),
        "int": address,
        "ctypes": ctypes.CDLL(c_lib[1]).seed_example,
    }[form]
    registry = CustomCallRegistry()
    target = registry.register("do_custom_call", fn, api_version=ApiVersion.ORIGINAL)
    assert target.api_version is ApiVersion.ORIGINAL
    b = RNG.standard_normal(128).astype(np.float32)
    c = RNG.standard_normal(2048).astype(np.float32)
    np.testing.assert_array_equal(run(SEED, [b, c], registry), b[np.arange(2048) % 128] + c)


def test_tuple_operand_and_tuple_result_are_pointer_tables(c_lib):
    registry = CustomCallRegistry()
    registry.register("tuple_sums", pointer(c_lib, "tuple_sums"))  # inferred: ORIGINAL
    text = """HloModule m
ENTRY e {
  p = (f32[4], (s32[3], f64[2])) parameter(0)
  ROOT c = (f64[], s32[]) custom-call(p), custom_call_target="tuple_sums"
}"""
    f = RNG.standard_normal(4).astype(np.float32)
    n = RNG.integers(-50, 50, 3).astype(np.int32)
    d = RNG.standard_normal(2)
    total, count = run(text, [(f, (n, d))], registry)
    np.testing.assert_allclose(total, f.astype(np.float64).sum() + d.sum(), rtol=1e-12)
    assert total.dtype == np.float64 and total.shape == ()
    assert count.dtype == np.int32 and int(count) == int(n.sum())


SEED_TUPLES = """HloModule m
ENTRY e {
  p0 = (f32[32], (f32[64], f32[128]), f32[256]) parameter(0)
  ROOT c = (f32[512], f32[1024]) custom-call(p0), custom_call_target="do_custom_call",
      backend_config="seed!", api_version=VERSION
}"""


def seed_tuples_expected(parts):
    flat = np.concatenate(parts)
    scratch = np.concatenate([flat, np.full(1024 - flat.size, -1, np.float32)])
    result = np.concatenate([2 * flat[::-1], np.arange(480, 512, dtype=np.float32)])
    return result, scratch


@pytest.mark.parametrize("version", [1, 2, 3])
def test_seed_tuple_layout_nested_pointer_tables_and_scratch_output(c_lib, version):
    api = custom_calls.C_API_VERSIONS[version - 1]
    registry = CustomCallRegistry()
    registry.register("do_custom_call", pointer(c_lib, f"seed_tuples_v{version}"), "Host", api)
    parts = [RNG.standard_normal(n).astype(np.float32) for n in (32, 64, 128, 256)]
    p0 = (parts[0], (parts[1], parts[2]), parts[3])
    result, scratch = run(SEED_TUPLES.replace("VERSION", api.value), [p0], registry)
    want_result, want_scratch = seed_tuples_expected(parts)
    np.testing.assert_array_equal(result, want_result)
    np.testing.assert_array_equal(scratch, want_scratch)


def test_seed_tuple_layout_for_a_tuple_built_in_the_program(c_lib):
    registry = CustomCallRegistry()
    registry.register("do_custom_call", pointer(c_lib, "seed_tuples_v1"))
    text = """HloModule m
ENTRY e {
  a = f32[64,2] parameter(0)
  b = f32[64,1] slice(a), slice={[0:64], [1:2]}
  r = f32[64] reshape(b)
  x = f32[32] parameter(1)
  y = f32[128] parameter(2)
  z = f32[256] parameter(3)
  sub = (f32[64], f32[128]) tuple(r, y)
  p0 = (f32[32], (f32[64], f32[128]), f32[256]) tuple(x, sub, z)
  ROOT c = (f32[512], f32[1024]) custom-call(p0), custom_call_target="do_custom_call"
}"""
    a = RNG.standard_normal((64, 2)).astype(np.float32)
    x, y, z = (RNG.standard_normal(n).astype(np.float32) for n in (32, 128, 256))
    result, scratch = run(text, [a, x, y, z], registry)
    want_result, want_scratch = seed_tuples_expected([x, a[:, 1], y, z])
    np.testing.assert_array_equal(result, want_result)
    np.testing.assert_array_equal(scratch, want_scratch)


def test_aliasing_a_leaf_inside_a_tuple_operand(c_lib):
    registry = CustomCallRegistry()
    registry.register("add_into_nested", pointer(c_lib, "add_into_nested"), api_version=2)
    text = """HloModule m
ENTRY e {
  p = (f32[8], (f32[4], f32[8])) parameter(0)
  ROOT c = f32[8] custom-call(p), custom_call_target="add_into_nested",
      output_to_operand_aliasing={{}: (0, {1, 1})}, api_version=API_VERSION_STATUS_RETURNING
}"""
    a, b, c = (RNG.standard_normal(n).astype(np.float32) for n in (8, 4, 8))
    before = c.copy()
    np.testing.assert_allclose(run(text, [(a, (b, c))], registry), before + a, rtol=1e-6)
    np.testing.assert_array_equal(c, before)
    with pytest.raises(CustomCallError, match=r"does not alias operand 0 \{1,1\}"):
        run(
            text.replace("output_to_operand_aliasing={{}: (0, {1, 1})}, ", ""),
            [(a, (b, c))],
            registry,
        )


SQRT = """HloModule m
ENTRY e {
  x = f32[8] parameter(0)
  ROOT c = f32[8] custom-call(x), custom_call_target="checked_sqrt",
      api_version=API_VERSION_STATUS_RETURNING
}"""


def test_status_returning_success_and_failure_message(c_lib):
    registry = CustomCallRegistry()
    registry.register("checked_sqrt", pointer(c_lib, "checked_sqrt"), api_version=2)
    x = RNG.uniform(0.5, 4.0, 8).astype(np.float32)
    np.testing.assert_allclose(run(SQRT, [x], registry), np.sqrt(x), rtol=1e-6)
    x[5] = -2.0
    with pytest.raises(CustomCallError, match=r"c: .*'checked_sqrt' failed: negative input -2 at"):
        run(SQRT, [x], registry)


@pytest.mark.parametrize("opaque", ["2.5", "-0.75"])
def test_unified_convention_reads_the_opaque_string(c_lib, opaque):
    registry = CustomCallRegistry()
    registry.register(
        "scale",
        pointer(c_lib, "scale_by_opaque"),
        api_version="API_VERSION_STATUS_RETURNING_UNIFIED",
    )
    text = f"""HloModule m
ENTRY e {{
  x = f32[8] parameter(0)
  ROOT c = f32[8] custom-call(x), custom_call_target="scale", backend_config="{opaque}",
      api_version=API_VERSION_STATUS_RETURNING_UNIFIED
}}"""
    x = RNG.standard_normal(8).astype(np.float32)
    np.testing.assert_allclose(run(text, [x], registry), x * np.float32(opaque), rtol=1e-6)
    with pytest.raises(CustomCallError, match="opaque must hold the scale"):
        run(text.replace(f', backend_config="{opaque}"', ""), [x], registry)


def test_tuple_output_as_scratch_memory(c_lib):
    registry = CustomCallRegistry()
    registry.register("with_scratch", pointer(c_lib, "with_scratch"), api_version=2)
    text = """HloModule m
ENTRY e {
  x = f32[8] parameter(0)
  c = (f32[8], f32[8]) custom-call(x), custom_call_target="with_scratch",
      api_version=API_VERSION_STATUS_RETURNING
  ROOT r = f32[8] get-tuple-element(c), index=0
}"""
    x = RNG.standard_normal(8).astype(np.float32)
    np.testing.assert_allclose(run(text, [x], registry), (x * x)[::-1] + 1, rtol=1e-6)


def test_output_to_operand_aliasing_updates_the_operand_copy_in_place(c_lib):
    registry = CustomCallRegistry()
    registry.register("add_in_place", pointer(c_lib, "add_in_place"), api_version=2)
    text = """HloModule m
ENTRY e {
  buf = f32[8] parameter(0)
  upd = f32[8] parameter(1)
  ROOT c = f32[8] custom-call(buf, upd), custom_call_target="add_in_place",
      output_to_operand_aliasing={{}: (0, {})}, api_version=API_VERSION_STATUS_RETURNING
}"""
    buf = RNG.standard_normal(8).astype(np.float32)
    upd = RNG.standard_normal(8).astype(np.float32)
    before = buf.copy()
    np.testing.assert_allclose(run(text, [buf, upd], registry), before + upd, rtol=1e-6)
    np.testing.assert_array_equal(buf, before)
    no_alias = text.replace("output_to_operand_aliasing={{}: (0, {})}, ", "")
    with pytest.raises(CustomCallError, match="output does not alias operand 0"):
        run(no_alias, [buf, upd], registry)


def test_compile_time_check_names_every_unknown_target_and_version_clashes(c_lib):
    registry = CustomCallRegistry()
    registry.register("checked_sqrt", pointer(c_lib, "checked_sqrt"), api_version=2)
    module = parse_module("""HloModule m
ENTRY e {
  x = f32[8] parameter(0)
  a = f32[8] custom-call(x), custom_call_target="checked_sqrt",
      api_version=API_VERSION_STATUS_RETURNING_UNIFIED
  b = f32[8] custom-call(a), custom_call_target="not_there"
  ROOT c = f32[8] custom-call(b), custom_call_target="checked_sqr"
}""")
    with pytest.raises(CustomCallError) as info:
        check_custom_calls(module, registry=registry)
    message = str(info.value)
    assert "b: no custom-call target 'not_there' is registered for platform Host" in message
    assert "c: no custom-call target 'checked_sqr'" in message
    assert "similar registered names: checked_sqrt" in message
    assert "a: target 'checked_sqrt' is registered as API_VERSION_STATUS_RETURNING" in message


def test_side_effecting_call_survives_dce_and_pure_one_does_not(c_lib):
    from xlapy.passes.dce import DeadCodeElimination

    text = """HloModule m
ENTRY e {
  x = f32[8] parameter(0)
  unused = f32[8] custom-call(x), custom_call_target="checked_sqrt"SIDE
  ROOT r = f32[8] add(x, x)
}"""
    kept = parse_module(text.replace("SIDE", ", custom_call_has_side_effect=true"))
    dropped = parse_module(text.replace("SIDE", ""))
    assert kept.entry.get_instruction("unused").has_side_effect
    DeadCodeElimination().run(kept)
    DeadCodeElimination().run(dropped)
    assert "unused" in {i.name for i in kept.entry.instructions}
    assert "unused" not in {i.name for i in dropped.entry.instructions}


def test_cse_merges_pure_calls_but_keeps_side_effecting_twins():
    from xlapy.passes.cse import CommonSubexpressionElimination

    text = """HloModule m
ENTRY e {
  x = f32[8] parameter(0)
  a = f32[8] custom-call(x), custom_call_target="t"SIDE
  b = f32[8] custom-call(x), custom_call_target="t"SIDE
  ROOT r = f32[8] add(a, b)
}"""
    kept = parse_module(text.replace("SIDE", ", custom_call_has_side_effect=true"))
    merged = parse_module(text.replace("SIDE", ""))
    CommonSubexpressionElimination().run(kept)
    CommonSubexpressionElimination().run(merged)
    calls = [
        sum(i.opcode.name == "CUSTOM_CALL" for i in m.entry.instructions) for m in (kept, merged)
    ]
    assert calls == [2, 1]


GPU_TUPLES = """HloModule m
ENTRY e {
  p0 = (f32[32], (f32[64], f32[128]), f32[256]) parameter(0)
  t = token[] after-all()
  ROOT c = (f32[512], f32[1024]) custom-call(p0, t), custom_call_target="do_custom_call"
}"""


def test_gpu_buffers_layout_is_operand_leaves_then_result_leaves_preorder():
    instr = parse_module(GPU_TUPLES).entry.root
    layout = gpu_buffer_layout(instr)
    assert [(s.role, s.number, s.index, s.shape.dims) for s in layout] == [
        ("operand", 0, (0,), (32,)),
        ("operand", 0, (1, 0), (64,)),
        ("operand", 0, (1, 1), (128,)),
        ("operand", 0, (2,), (256,)),
        ("operand", 1, (), ()),
        ("result", 0, (0,), (512,)),
        ("result", 0, (1,), (1024,)),
    ]
    assert [s.is_null for s in layout] == [False] * 4 + [True] + [False] * 2


def test_gpu_convention_call_with_host_buffers(c_lib):
    a = RNG.standard_normal(16).astype(np.float32)
    b = RNG.standard_normal(16).astype(np.float32)
    out = np.zeros(16, np.float32)
    table = [a.ctypes.data, b.ctypes.data, out.ctypes.data]
    GPU_TARGETS[ApiVersion.ORIGINAL].call(pointer(c_lib, "gpu_add"), None, table, "16")
    np.testing.assert_array_equal(out, a + b)
    with pytest.raises(CustomCallError, match="kernel launch failed"):
        GPU_TARGETS[ApiVersion.STATUS_RETURNING].call(
            pointer(c_lib, "gpu_fail"), None, table, "kernel launch failed"
        )
    assert "CUstream stream, void** buffers" in GPU_TARGETS[ApiVersion.ORIGINAL].signature


def test_gpu_c_targets_register_for_cuda_but_the_interpreter_does_not_call_them(c_lib):
    registry = CustomCallRegistry()
    registry.register("do_custom_call", pointer(c_lib, "gpu_add"), platform="CUDA")
    args = [np.ones(128, np.float32), np.ones(2048, np.float32)]
    with pytest.raises(CustomCallError, match="Host platform only"):
        run(SEED, args, registry, platform="CUDA")


def test_example_builds_and_runs(tmp_path):
    example = runpy.run_path(str(EXAMPLE / "run_example.py"))
    results = example["main"](tmp_path)
    assert set(results) == {"C/builder", "C/hlo", "Python/builder", "Python/hlo"}
    assert all(error < 1e-6 for error in results.values())
