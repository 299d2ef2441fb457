"""Program images (xlapy/backends/cpu/jit/program_image.py): a warm compile of program text
loads the whole CPU program from one authenticated entry, without parsing the text or
running the passes, buffer assignment or lowering; its executables compute bit for bit
what the cold compile's do; every ingredient of the key is a miss; a damaged, truncated,
foreign or malformed entry is never used (a CacheEntryWarning, a full compile, the entry
written again), and the unpickler resolves nothing outside xlapy, NumPy and a few builtins
even for an authentic entry."""

from __future__ import annotations

import importlib
import io
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from test_cpu_executable_cache import damage_flip, damage_foreign_key, damage_truncate

import xlapy.stablehlo
from xlapy.backends import ffi
from xlapy.backends.cpu import backend as cpu_backend
from xlapy.backends.cpu.jit import engine as jit
from xlapy.backends.cpu.jit import program_image
from xlapy.backends.cpu.jit.disk_cache import CacheEntryWarning
from xlapy.backends.cpu.jit.kernel import clear_kernel_cache
from xlapy.backends.cpu.runtime.loadable import PENDING
from xlapy.backends.interpreter import evaluate
from xlapy.errors import CustomCallError, XlapyError
from xlapy.ir.parser import parse_module
from xlapy.runtime import Client, CompileOptions
from xlapy.runtime.profiler import profile_program


def softmax_loop(x, w, b):
    """Fused kernels, a dot, and a while loop that becomes one native function."""
    p = jax.nn.softmax(x @ w + b, axis=-1)

    def body(i, acc):
        row = lax.dynamic_slice_in_dim(acc, i, 1) * 0.5 + jnp.tanh(p[i])
        return lax.dynamic_update_slice_in_dim(acc, row, i, 0)

    return lax.fori_loop(0, x.shape[0], body, p * 2.0), p.sum(axis=0)


def sort_and_conv(x, k):
    """A library sort (a planner's fast path) and a direct convolution kernel."""
    y = lax.conv_general_dilated(x, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return jnp.sort(y.reshape(-1)), jnp.argsort(x[0, 0, :, 0])


def nested_loops(x, w):
    """A native loop inside a native loop, and a gemm each iteration."""

    def outer(i, h):
        return lax.fori_loop(0, 3, lambda j, g: jnp.tanh(g @ w) + 0.1 * j, h) * 0.5

    return lax.fori_loop(0, 4, outer, x)


def attention(x, w, wo):
    """Native runs of the entry (kernels, gemms and a batched gemm list in one function)."""
    q, k, v = jnp.split(x @ w, 3, axis=-1)
    heads = lambda a: a.reshape(3, 16, 2, 8)  # noqa: E731
    probs = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", heads(q), heads(k)), axis=-1)
    return jnp.tanh(jnp.einsum("bhqk,bkhd->bqhd", probs, heads(v)).reshape(3, 16, 16) @ wo)


PROGRAMS = {
    "softmax_loop": (softmax_loop, [(8, 16), (16, 12), (12,)]),
    "attention": (attention, [(3, 16, 16), (16, 48), (16, 16)]),
    "sort_and_conv": (sort_and_conv, [(1, 8, 8, 4), (3, 3, 4, 8)]),
    "nested_loops": (nested_loops, [(4, 16), (16, 16)]),
}


def lowered(name: str) -> str:
    fn, shapes = PROGRAMS[name]
    args = [jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes]
    return jax.jit(fn).lower(*args).as_text(dialect="hlo")


@pytest.fixture(scope="module")
def texts() -> dict[str, str]:
    return {name: lowered(name) for name in PROGRAMS}


def inputs(name: str, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in PROGRAMS[name][1]]


def run(exe, args: list[np.ndarray]) -> list[np.ndarray]:
    client = exe.client
    outs = exe.execute([[client.buffer_from_pyval(a) for a in args]])[0]
    return [o.to_numpy() for o in outs]


def images(directory: Path) -> list[Path]:
    return sorted(directory.glob(f"*{program_image.SUFFIX}"))


def cold_then_warm(image_cache: Path, monkeypatch, text: str, args: list[np.ndarray]):
    """Compile `text` (one image written) and run it on `args`; forget the process's kernels
    and compile it again, which must come from the image (nothing parsed or compiled), and
    run that: (cold outputs, warm executable, warm outputs)."""
    cold = run(Client("cpu").compile(text), args)
    assert len(images(image_cache)) == 1
    clear_kernel_cache()
    with monkeypatch.context() as m:
        forbid_compiling(m)
        exe = Client("cpu").compile(text)
        warm = run(exe, args)
    return cold, exe, warm


def forbid_compiling(monkeypatch) -> None:
    """Fail the test if a compile parses the text or compiles the module."""

    def fail(*args, **kwargs):
        raise AssertionError("a warm compile parsed or compiled the program")

    monkeypatch.setattr(xlapy.stablehlo, "load", fail)
    monkeypatch.setattr(cpu_backend, "compile_module", fail)


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_warm_compile_loads_the_program_and_computes_the_same_bits(
    image_cache, texts, monkeypatch, name
):
    text = texts[name]
    cold = Client("cpu").compile(text)
    assert len(images(image_cache)) == 1
    cold_out = [run(cold, inputs(name, seed)) for seed in (1, 2)]
    clear_kernel_cache()
    with monkeypatch.context() as m:
        forbid_compiling(m)
        warm = Client("cpu").compile(text)
        warm_out = [run(warm, inputs(name, seed)) for seed in (1, 2)]
    for w_run, c_run in zip(warm_out, cold_out, strict=True):
        for w, c in zip(w_run, c_run, strict=True):
            np.testing.assert_array_equal(w, c)  # the same kernels, the same bits
    want = evaluate(parse_module(text), inputs(name, 1))
    want = want if isinstance(want, tuple) else (want,)
    for w, r in zip(warm_out[0], want, strict=True):
        np.testing.assert_allclose(w, np.asarray(r), rtol=3e-5, atol=3e-5)
    # what the runtime reports needs no compile either, and agrees with the cold one's
    assert warm.name == cold.name and warm.fingerprint == cold.fingerprint
    assert warm.hlo_text() == cold.hlo_text()
    assert warm.parameter_shapes == cold.parameter_shapes
    assert warm.output_shape == cold.output_shape
    assert warm.memory_stats() == cold.memory_stats()
    assert warm.backend_program().compiled.thunk_listing() == (
        cold.backend_program().compiled.thunk_listing()
    )
    assert warm.module.to_text() == cold.module.to_text()  # parsed on first use


def report_part(compiled):
    """The report part of a program loaded from an image (what its compiled module's
    deferred `module` points at)."""
    (box, _number) = vars(compiled)[PENDING]["module"]
    return box[0]


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_loading_and_running_an_image_leaves_its_report_part_unread(image_cache, texts, name):
    """Running needs neither the module nor its buffer assignment: a warm compile and its
    runs unpickle no part of the HLO graph (the reports' part), and the first report
    unpickles it once."""
    text = texts[name]
    Client("cpu").compile(text)
    clear_kernel_cache()
    warm = Client("cpu").compile(text)
    for seed in (3, 4):
        run(warm, inputs(name, seed))
    compiled = warm.backend_program().compiled
    report = report_part(compiled)
    assert report.loads == 0 and "module" not in vars(compiled)
    assert warm.backend_program().compiled.thunk_listing()
    warm.memory_stats()
    assert report.loads == 1


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_reports_of_an_imaged_program_are_a_fresh_compiles(image_cache, texts, name):
    """What a user reads of an executable loaded from an image (thunk listing, optimized
    module, buffer assignment and memory figures, fallbacks, a profile of its runs) is what
    the compile that wrote the image gives."""
    text = texts[name]
    cold = Client("cpu").compile(text)
    clear_kernel_cache()
    warm = Client("cpu").compile(text)
    c, w = cold.backend_program(), warm.backend_program()
    assert report_part(w.compiled).loads == 0
    assert w.compiled.thunk_listing() == c.compiled.thunk_listing()
    assert w.module.to_text() == c.module.to_text()
    assert w.buffer_assignment.to_text() == c.buffer_assignment.to_text()
    assert warm.memory_plan().to_text() == cold.memory_plan().to_text()
    assert w.fallbacks == c.fallbacks and w.python_loops == c.python_loops
    args = inputs(name, 5)

    def steps(program):
        rows = profile_program(program, args, runs=1).rows()
        return sorted((s.sequence, s.kind, s.name, s.opcode, s.hlo, s.parent) for s in rows)

    assert steps(w) == steps(c)


def test_a_malformed_report_part_is_an_error_and_the_entry_goes(image_cache, texts, monkeypatch):
    """An authentic entry whose report part names other code (what a reader of the key
    could write) still runs (running reads no report) but its first report is a clear
    error that calls nothing, and the entry is removed so the next compile writes it
    again."""
    text = texts["softmax_loop"]
    args = inputs("softmax_loop", 7)
    cold = run(Client("cpu").compile(text), args)
    (path,) = images(image_cache)
    evil = _pickle(HOSTILE["os.system"])
    called: list[tuple] = []
    monkeypatch.setattr(os, "system", lambda *a: called.append(a))

    def edit(payload: bytes) -> bytes:
        head, _, rest = payload.partition(b"\n")
        doc = json.loads(head)
        kept = rest[: len(rest) - doc["report"]]
        doc["report"] = len(evil)
        return json.dumps(doc).encode() + b"\n" + kept + evil

    rewrite_authentic(path, edit)
    clear_kernel_cache()
    warm = Client("cpu").compile(text)
    assert warm._module is None
    for a, c in zip(run(warm, args), cold, strict=True):
        np.testing.assert_array_equal(a, c)
    with pytest.raises(XlapyError, match=r"malformed report part.*may not"):
        warm.backend_program().compiled.thunk_listing()
    assert called == [] and images(image_cache) == []
    clear_kernel_cache()
    Client("cpu").compile(text)
    assert len(images(image_cache)) == 1


def test_a_module_compiled_with_options_is_imaged_by_its_text(image_cache, texts, monkeypatch):
    """The PJRT plugin hands the client a module (and its options): it compiles as its
    printed text does, so that text keys its image."""
    text = texts["nested_loops"]
    options = CompileOptions.make(num_replicas=1, num_partitions=1)
    args = inputs("nested_loops", 5)
    Client("cpu").compile(parse_module(text))  # without options: no image
    assert images(image_cache) == []
    cold = Client("cpu").compile(parse_module(text), options)
    assert len(images(image_cache)) == 1
    cold_out = run(cold, args)
    clear_kernel_cache()
    module = parse_module(text)
    with monkeypatch.context() as m:
        forbid_compiling(m)
        warm = Client("cpu").compile(module, options)
        warm_out = run(warm, args)
    assert warm._module is None and warm.fingerprint == cold.fingerprint
    for w, c in zip(warm_out, cold_out, strict=True):
        np.testing.assert_array_equal(w, c)
    other = CompileOptions.make(backend_options={"native_loops": False})
    assert Client("cpu").compile(parse_module(text), other)._module is not None  # a miss


def test_a_client_compiling_the_same_text_again_returns_its_executable(image_cache, texts):
    client = Client("cpu")
    first = client.compile(texts["softmax_loop"])
    assert client.compile(texts["softmax_loop"]) is first
    assert client.compile_cache_stats()["hits"] == 1
    other = Client("cpu")
    warm = other.compile(texts["softmax_loop"])
    assert other.compile(texts["softmax_loop"]) is warm


def test_every_ingredient_of_the_key_is_a_miss(texts, monkeypatch):
    text = texts["softmax_loop"]
    base = program_image.image_key(text, "null")
    assert program_image.image_key(text, "null") == base
    changed = [
        program_image.image_key(text.replace("0.5", "0.25"), "null"),
        program_image.image_key(text + " ", "null"),
        program_image.image_key(text.encode(), "null"),  # bytes are another format
        program_image.image_key(text, json.dumps({"num_replicas": 1})),
    ]
    for var, value in [
        ("XLAPY_CPU_DENORMALS", "ieee"),
        ("XLAPY_CPU_CONCURRENCY", "off"),
        ("XLAPY_NUM_THREADS", "1"),
        ("XLAPY_STRICT_KERNELS", "0"),  # (the tests run with 1)
        ("XLAPY_SOMETHING_NEW", "x"),
    ]:
        with monkeypatch.context() as m:
            m.setenv(var, value)
            changed.append(program_image.image_key(text, "null"))
    with monkeypatch.context() as m:
        m.setattr(program_image, "package_fingerprint", lambda: "other sources")
        changed.append(program_image.image_key(text, "null"))
    with monkeypatch.context() as m:
        m.setattr(program_image, "pool_size", lambda: 977)
        changed.append(program_image.image_key(text, "null"))
    with monkeypatch.context() as m:
        host = jit.host_target()
        other = type(host)(host.triple, host.cpu, host.features.replace("+", "-", 1))
        m.setattr(jit, "host_target", lambda: other)
        changed.append(program_image.image_key(text, "null"))
    assert base not in changed and len(set(changed)) == len(changed)
    with monkeypatch.context() as m:  # where the cache is does not name what is in it
        m.setenv("XLAPY_CACHE_DIR", "/elsewhere")
        assert program_image.image_key(text, "null") == base


def test_other_options_miss_and_compute_their_own_result(image_cache, texts):
    text = texts["softmax_loop"]
    args = inputs("softmax_loop", 3)
    native = Client("cpu").compile(text)
    options = CompileOptions.make(backend_options={"native_loops": False})
    clear_kernel_cache()
    python = Client("cpu").compile(text, options)
    assert len(images(image_cache)) == 2
    assert python.backend_program().compiled.python_loops  # not the native program's image
    for a, b in zip(run(native, args), run(python, args), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def rewrite_authentic(path: Path, edit) -> None:
    """What someone holding the user's key could write: an authentic entry whose payload
    is `edit(payload)`."""
    key = path.name[: -len(program_image.SUFFIX)]
    payload = jit.read_entry(key, program_image.SUFFIX)
    assert payload is not None
    jit.write_entry(key, program_image.SUFFIX, edit(payload))


def extra_bytes(payload: bytes) -> bytes:
    return payload + b"\0"


def longer_pickle(payload: bytes) -> bytes:
    head, _, rest = payload.partition(b"\n")
    doc = json.loads(head)
    doc["pickle"] = len(rest) + 1
    return json.dumps(doc).encode() + b"\n" + rest


@pytest.mark.parametrize(
    "damage", [damage_flip, damage_truncate, damage_foreign_key, "extra_bytes", "longer_pickle"]
)
def test_rejected_image_warns_recompiles_and_is_rewritten(image_cache, texts, damage):
    text = texts["softmax_loop"]
    args = inputs("softmax_loop", 4)
    cold = run(Client("cpu").compile(text), args)
    (path,) = images(image_cache)
    if isinstance(damage, str):
        rewrite_authentic(path, globals()[damage])
    else:
        damage(path)
    clear_kernel_cache()
    with pytest.warns(CacheEntryWarning, match=r"\.image is not used"):
        again = Client("cpu").compile(text)
    assert again._module is not None  # compiled from the text, not the image
    for a, c in zip(run(again, args), cold, strict=True):
        np.testing.assert_array_equal(a, c)
    assert jit.read_entry(path.name[: -len(program_image.SUFFIX)], program_image.SUFFIX)
    clear_kernel_cache()
    assert Client("cpu").compile(text)._module is None  # the rewritten image is used


def _text(value: str) -> bytes:
    data = value.encode()
    return b"\x8c" + bytes([len(data)]) + data  # SHORT_BINUNICODE


def _global(module: str, name: str) -> bytes:
    return _text(module) + _text(name) + b"\x93"  # STACK_GLOBAL (a dotted name is a path)


def _call(function: bytes, *args: bytes) -> bytes:
    return function + b"(" + b"".join(args) + b"tR"  # MARK args TUPLE REDUCE


def _pickle(body: bytes) -> bytes:
    return b"\x80\x04" + body + b"."


FORGED_KEY = "f" * 64
HOSTILE = {
    "os.system": _call(_global("os", "system"), _text("echo owned")),
    "getattr": _call(
        _global("builtins", "getattr"),
        _call(_global("builtins", "__import__"), _text("os")),
        _text("system"),
    ),
    "a dotted path through xlapy": _call(
        _global("xlapy.backends.cpu.jit.program_image", "os.system"), _text("echo owned")
    ),
    "a module xlapy imports": _call(
        _call(
            _global("builtins", "getattr"),
            _global("xlapy.backends.cpu.jit.program_image", "os"),
            _text("system"),
        ),
        _text("echo owned"),
    ),
    "a function of xlapy not marked loadable": _call(
        _global("xlapy.backends.cpu.jit.engine", "write_entry"),
        _text(FORGED_KEY),
        _text(".o"),
        b"C\x01x",  # SHORT_BINBYTES b"x"
    ),
    "attrgetter": _call(
        _call(_global("operator", "attrgetter"), _text("system")), _text("echo owned")
    ),
}


@pytest.mark.parametrize("hostile", list(HOSTILE))
def test_an_authentic_image_naming_other_code_is_not_unpickled(
    image_cache, texts, monkeypatch, hostile
):
    """Even an entry authenticated with the user's key (what a reader of the key could
    write) resolves only the names program_image.allowed lets it: one that names os.system,
    getattr, a path or a module through xlapy's modules, or an xlapy function not marked
    loadable is rejected before anything is called, compiled again and rewritten."""
    text = texts["softmax_loop"]
    args = inputs("softmax_loop", 6)
    cold = run(Client("cpu").compile(text), args)
    (path,) = images(image_cache)
    evil = _pickle(HOSTILE[hostile])
    called: list[tuple] = []
    monkeypatch.setattr(os, "system", lambda *a: called.append(a))

    def edit(payload: bytes) -> bytes:
        head, _, rest = payload.partition(b"\n")
        doc = json.loads(head)
        objects = rest[doc["pickle"] :]
        doc["pickle"] = len(evil)
        return json.dumps(doc).encode() + b"\n" + evil + objects

    rewrite_authentic(path, edit)
    clear_kernel_cache()
    with pytest.warns(CacheEntryWarning, match="may not"):
        exe = Client("cpu").compile(text)
    assert called == []
    assert list(image_cache.rglob(f"{FORGED_KEY}*")) == []
    assert exe._module is not None
    for a, c in zip(run(exe, args), cold, strict=True):
        np.testing.assert_array_equal(a, c)
    clear_kernel_cache()
    assert Client("cpu").compile(text)._module is None  # the rewritten image is used


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("os", "system"),
        ("builtins", "eval"),
        ("builtins", "getattr"),
        ("builtins", "__import__"),
        ("subprocess", "Popen"),
        ("operator", "attrgetter"),
        ("operator", "methodcaller"),
        ("operator", "getitem"),
        ("ctypes", "CDLL"),
        ("ctypes", "memmove"),
        ("numpy", "load"),
        ("numpy", "fromfile"),
        ("numpy.lib.npyio", "savetxt"),
        ("functools", "reduce"),
        ("xlapy.backends.cpu.jit.program_image", "os"),  # a module it imports
        ("xlapy.backends.cpu.jit.program_image", "os.system"),  # a path
        ("xlapy.backends.cpu.jit.program_image", "read"),  # a function not marked
        ("xlapy.backends.cpu.jit.program_image", "_restore.__globals__"),
        ("xlapy.backends.cpu.runtime.rule_thunk", "rule_for"),  # imported there
        ("xlapy.backends.cpu.runtime.pool", "ThreadPoolExecutor"),
        ("xlapy.runtime.client", "Client"),  # a class outside compiled programs
        ("xlapy.tools.cli", "main"),
        ("xlapy.backends.cpu.jit.disk_cache", "CacheEntryWarning"),
    ],
)
def test_unpickler_refuses_names_outside_its_list(module, name):
    data = _pickle(_global(module, name))
    with pytest.raises(pickle.UnpicklingError, match="may not"):
        program_image._Unpickler(io.BytesIO(data)).load()


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("builtins", "slice"),
        ("numpy", "dtype"),
        ("numpy", "float32"),
        ("ml_dtypes", "bfloat16"),
        ("ctypes", "c_int64"),
        ("_operator", "lt"),
        ("xlapy.ir.shapes", "Shape"),
        ("xlapy.backends.cpu.runtime.dot_thunk", "plan_dot"),
        ("xlapy.backends.cpu.jit.kernel", "_kernel_from_image"),
        ("xlapy.backends.cpu.jit.program_image", "_restore"),
    ],
)
def test_unpickler_resolves_what_images_hold(module, name):
    found = program_image._Unpickler(io.BytesIO(_pickle(_global(module, name)))).load()
    assert found is getattr(importlib.import_module(module), name)


def test_loadable_functions_hand_out_no_attribute_by_name():
    from xlapy.backends.cpu.runtime import native_addresses

    with pytest.raises(ValueError, match="no '__class__'"):
        native_addresses.native_of(type("T", (), {"native": object()})(), "__class__")


def _unlisted() -> int:
    return 1


def test_an_image_that_would_name_other_code_is_not_written(image_cache):
    """Pickling checks every class and function against the same list, so an image that
    every load would reject is never written."""
    assert not program_image.write("0" * 64, {"f": _unlisted})
    assert not program_image.write("0" * 64, {"f": os.getcwd})
    assert images(image_cache) == []


def linalg(a):
    """LAPACK through typed-FFI custom calls (syevd, gesdd, geqrf/orgqr, getrf + trsm)."""
    w, v = jnp.linalg.eigh(a @ a.T)
    s = jnp.linalg.svd(a, compute_uv=False)
    q, r = jnp.linalg.qr(a)
    return w, v, s, q, r, jnp.linalg.solve(a @ a.T + 8 * jnp.eye(8), a)


def test_lapack_programs_are_imaged_and_compute_the_same_bits(image_cache, monkeypatch):
    text = jax.jit(linalg).lower(jax.ShapeDtypeStruct((8, 8), jnp.float32)).as_text(dialect="hlo")
    args = [np.random.default_rng(7).standard_normal((8, 8)).astype(np.float32)]
    cold, exe, warm = cold_then_warm(image_cache, monkeypatch, text, args)
    assert "typed FFI handler" in exe.backend_program().compiled.thunk_listing()
    for w, c in zip(warm, cold, strict=True):
        np.testing.assert_array_equal(w, c)
    a = args[0].astype(np.float64)
    np.testing.assert_allclose(warm[0], np.linalg.eigvalsh(a @ a.T), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(warm[2], np.linalg.svd(a, compute_uv=False), rtol=1e-4)
    np.testing.assert_allclose(warm[3] @ warm[4], a, rtol=1e-4, atol=1e-4)
    want = np.linalg.solve(a @ a.T + 8 * np.eye(8), a)
    np.testing.assert_allclose(warm[5], want, rtol=1e-4, atol=1e-4)


CUSTOM = """HloModule m
ENTRY e {
  x = f32[4] parameter(0)
  ROOT r = f32[4] custom-call(x), custom_call_target="scaled"
}"""


def typed_times(factor: float, dtype: str = "f32"):
    @ffi.handler(args=[ffi.Buffer(dtype, rank=1)], results=[ffi.Buffer(dtype, rank=1)])
    def times(x, out):
        out[...] = x * factor

    return times


def client_with(target=None) -> Client:
    client = Client("cpu")
    if target is not None:
        client.register_custom_call("scaled", target)
    return client


def test_custom_call_targets_are_looked_up_again_where_the_image_loads(image_cache, monkeypatch):
    """An image holds no target: loading it looks each one up in the loading client's
    registry, as a compile would. The same kind of target (a Python function, a typed
    handler) under the name runs from the image; an unknown target or one a compile would
    reject is the compile's error; a target of another kind (lowered another way) is a
    miss, compiled with it."""
    x = np.random.default_rng(8).standard_normal(4).astype(np.float32)
    first = client_with(lambda ins, opaque: ins[0] * 2).compile(CUSTOM)
    np.testing.assert_array_equal(run(first, [x])[0], x * 2)
    assert len(images(image_cache)) == 1
    clear_kernel_cache()
    with monkeypatch.context() as m:
        forbid_compiling(m)
        warm = client_with(lambda ins, opaque: ins[0] * 3).compile(CUSTOM)
        np.testing.assert_array_equal(run(warm, [x])[0], x * 3)
    with pytest.raises(CustomCallError, match="no custom-call target 'scaled'"):
        client_with().compile(CUSTOM)
    typed = client_with(typed_times(4.0)).compile(CUSTOM)  # a typed handler: a miss
    assert typed._module is not None
    assert "typed FFI handler" in typed.backend_program().compiled.thunk_listing()
    np.testing.assert_array_equal(run(typed, [x])[0], x * 4)
    clear_kernel_cache()
    with monkeypatch.context() as m:  # the image now holds a typed call, bound on load
        forbid_compiling(m)
        warm = client_with(typed_times(5.0)).compile(CUSTOM)
        np.testing.assert_array_equal(run(warm, [x])[0], x * 5)
    with pytest.raises(CustomCallError, match="f64"):  # the handler rejects the call
        client_with(typed_times(6.0, "f64")).compile(CUSTOM)
    python = client_with(lambda ins, opaque: ins[0] * 7).compile(CUSTOM)  # a miss again
    assert python._module is not None
    np.testing.assert_array_equal(run(python, [x])[0], x * 7)


def test_global_registry_changes_are_looked_up_again(image_cache, monkeypatch):
    from xlapy.backends import custom_calls

    x = np.random.default_rng(9).standard_normal(4).astype(np.float32)
    custom_calls.register("scaled", lambda ins, opaque: ins[0] * 2)
    try:
        np.testing.assert_array_equal(run(Client("cpu").compile(CUSTOM), [x])[0], x * 2)
        custom_calls.GLOBAL_REGISTRY.unregister("scaled")
        custom_calls.register("scaled", lambda ins, opaque: ins[0] - 1)
        clear_kernel_cache()
        with monkeypatch.context() as m:
            forbid_compiling(m)
            warm = Client("cpu").compile(CUSTOM)
            np.testing.assert_array_equal(run(warm, [x])[0], x - 1)
    finally:
        custom_calls.GLOBAL_REGISTRY.unregister("scaled")
    with pytest.raises(CustomCallError, match="no custom-call target 'scaled'"):
        Client("cpu").compile(CUSTOM)


def test_images_can_be_turned_off(image_cache, texts, monkeypatch):
    monkeypatch.setenv(program_image.ENABLE_ENV, "0")
    Client("cpu").compile(texts["softmax_loop"])
    assert images(image_cache) == []


def chain_text(length: int, op: str) -> str:
    """A program whose every instruction uses the one before: `length` steps of
    dot(x, w) (op "dot") or x * w (op "multiply"), on f32[2,2]."""
    lines = ["HloModule chain", "", "ENTRY main {"]
    lines += ["  p0 = f32[2,2]{1,0} parameter(0)", "  w = f32[2,2]{1,0} parameter(1)"]
    dims = ", lhs_contracting_dims={1}, rhs_contracting_dims={0}" if op == "dot" else ""
    for i in range(length):
        before = "p0" if i == 0 else f"v{i - 1}"
        lines.append(f"  v{i} = f32[2,2]{{1,0}} {op}({before}, w){dims}")
    lines[-1] = lines[-1].replace(f"  v{length - 1} =", f"  ROOT v{length - 1} =")
    return "\n".join([*lines, "}", ""])


def test_a_deep_graph_pickles_flat_and_comes_back_whole():
    """The report part pickles the HLO graph without recursing along its chains of operands
    and users: a chain far deeper than Python's recursion limit round-trips."""
    import sys

    length = 2 * sys.getrecursionlimit()
    module = parse_module(chain_text(length, "multiply"))
    data = io.BytesIO()
    program_image._GraphPickler(data).dump_graph((module,))
    (back,) = program_image._load_graph(data.getvalue())
    assert back.to_text() == module.to_text()
    entry = back.entry
    for instr in entry.instructions:
        assert instr.parent is entry
        for operand in instr.operands:
            assert instr in operand.users
    assert len(entry.instructions) == length + 2


def test_a_deep_program_is_imaged_and_computes_the_same_bits(image_cache, monkeypatch):
    """A program whose chain of dots (not fused: each its own thunk) is deep enough that a
    recursive pickle of its graph fails has an image all the same, and the warm compile
    computes the cold one's bits."""
    text = chain_text(400, "dot")
    rng = np.random.default_rng(7)
    args = [rng.standard_normal((2, 2)).astype(np.float32) * 0.5 for _ in range(2)]
    cold = Client("cpu").compile(text)
    assert len(images(image_cache)) == 1
    cold_out = run(cold, args)
    clear_kernel_cache()
    with monkeypatch.context() as m:
        forbid_compiling(m)
        warm = Client("cpu").compile(text)
        warm_out = run(warm, args)
    np.testing.assert_array_equal(warm_out[0], cold_out[0])
    want = np.asarray(evaluate(parse_module(text), args))
    np.testing.assert_allclose(warm_out[0], want, rtol=1e-4, atol=1e-6)
    assert warm.module.to_text() == cold.module.to_text()


FRESH = """
import sys, numpy as np
from xlapy.runtime import Client
client = Client("cpu")
exe = client.compile(open(sys.argv[1]).read())
compiler = ("xlapy.passes", "xlapy.backends.cpu.lowering", "xlapy.memory", "xlapy.stablehlo")
imported = sorted(m for m in (*compiler, "scipy") if m in sys.modules)
rng = np.random.default_rng(7)
args = [rng.standard_normal(s.dims).astype(np.float32) for s in exe.parameter_shapes]
outs = exe.execute([[client.buffer_from_pyval(a) for a in args]])[0]
print(imported)
print(" ".join(o.to_numpy().tobytes().hex() for o in outs))
print(exe.backend_program().thunk_listing() + repr(exe.memory_stats()))
"""


@pytest.mark.parametrize("name", ["softmax_loop", "attention", "nested_loops", "sort_and_conv"])
def test_a_warm_compile_in_a_fresh_process_imports_no_compiler(image_cache, texts, tmp_path, name):
    """A new process that finds the image imports neither the passes, the lowering, the
    buffer assignment, the StableHLO loader nor scipy (the import cost more than the
    compile), computes what the cold process did, and its reports load what they need."""
    source = tmp_path / "program.hlo"
    source.write_text(texts[name])
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": root, "PYTHONWARNINGS": "error::UserWarning"}
    done = [
        subprocess.run(
            [sys.executable, "-c", FRESH, str(source)],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        for _ in range(2)
    ]
    for d in done:
        assert d.returncode == 0, d.stderr[-3000:]
    cold, warm = (d.stdout.split("\n", 2) for d in done)
    assert len(images(image_cache)) == 1
    assert "xlapy.passes" in cold[0]
    assert warm[0] == "[]"
    assert warm[1:] == cold[1:]
