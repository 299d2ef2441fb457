"""The native Execute of xlapy's PJRT plugin (xlapy/pjrt/native_execute.py), through JAX:
results equal XLA:CPU's and the interpreter's on fresh random inputs; the native path is
taken for one-device calls of native-kernels-in-a-row programs (counted per executable)
and not taken for donation, deleted or donated arguments, several devices or other
programs; outputs made natively behave like any other (to host, delete, donation, use as
arguments of the Python path); memory statistics stay exact over many calls and 8 threads."""

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xlapy.backends.interpreter.evaluator import evaluate
from xlapy.pjrt import abi, core, native
from xlapy.pjrt.executables import PExecutable, executable_of

ffi = abi.ffi
XLAPY = jax.devices("xlapy")[0]
CPU = jax.devices("cpu")[0]
ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(not native.ADDRESSES, reason="native fast paths are off")


def rng():
    return np.random.default_rng(int.from_bytes(os.urandom(4), "little"))


def loaded(fn, *args) -> list[PExecutable]:
    """The plugin's loaded executables of `fn` on `args` (jitted, compiled already)."""
    compiled = executable_of(fn.lower(*args).compile())
    return [
        o
        for o in list(core.OBJECTS.values())
        if isinstance(o, PExecutable) and o.loaded and o.info.executable is compiled
    ]


def fast_calls(fn, *args) -> int:
    return sum(e.c.fast_calls for e in loaded(fn, *args))


def has_native_entry(fn, *args) -> bool:
    entries = [e.c.fast != ffi.NULL for e in loaded(fn, *args)]
    assert entries, "the executable was not found"
    return any(entries)


def stats() -> dict:
    return dict(XLAPY.memory_stats())


# (name, function, argument generator, tolerance)
PROGRAMS = [
    ("add_one_f32", lambda x: x + 1, lambda r: [r.standard_normal(8).astype(np.float32)], 0),
    (
        "mul_add_f32",
        lambda x, y: x * y + 3.0,
        lambda r: [r.standard_normal((16, 5)).astype(np.float32) for _ in "xy"],
        1e-6,
    ),
    (
        "two_outputs_f64",
        lambda x, y: (x - y, jnp.exp(x) * 2.0),
        lambda r: [r.standard_normal((3, 7)) for _ in "xy"],
        1e-12,
    ),
    (
        "int32",
        lambda x, y: x * 3 - y,
        lambda r: [r.integers(-1000, 1000, (33,)).astype(np.int32) for _ in "xy"],
        0,
    ),
    (
        "tanh_chain_f32",
        lambda x: jnp.tanh(x * 0.5) + jnp.sin(x),
        lambda r: [r.standard_normal((64, 64)).astype(np.float32)],
        2e-6,
    ),
    (  # a library kernel: its parameter block passed by the native Execute
        "small_gemm_f32",
        lambda x, w: jnp.tanh(x @ w),
        lambda r: [r.standard_normal(s).astype(np.float32) for s in ((3, 40), (40, 48))],
        2e-5,
    ),
]


@pytest.mark.parametrize("name,fn,make,tol", PROGRAMS, ids=[p[0] for p in PROGRAMS], scope="module")
def test_native_results_equal_xla_and_the_interpreter(x64_mode, name, fn, make, tol):
    r = rng()
    host = make(r)
    jitted = jax.jit(fn)
    args = [jax.device_put(a, XLAPY) for a in host]
    jitted(*args)  # compiled; the first call may take the Python path
    before = fast_calls(jitted, *args)
    got = jitted(*args)
    assert fast_calls(jitted, *args) == before + 1, "the native Execute was not taken"
    want = jax.jit(fn)(*[jax.device_put(a, CPU) for a in host])
    module = executable_of(jitted.lower(*args).compile()).module
    oracle = evaluate(module, host)
    got_l, want_l = jax.tree.leaves(got), jax.tree.leaves(want)
    oracle_l = list(oracle) if isinstance(oracle, tuple) else [oracle]
    for g, w, o in zip(got_l, want_l, oracle_l, strict=True):
        g = np.asarray(g)
        assert g.dtype == np.asarray(w).dtype
        np.testing.assert_allclose(g, np.asarray(w), rtol=tol, atol=tol)
        np.testing.assert_allclose(g, np.asarray(o), rtol=tol, atol=tol)


def test_native_outputs_feed_both_paths_and_read_back():
    r = rng()
    x = r.standard_normal((4, 6)).astype(np.float32)
    step = jax.jit(lambda a: a * 2.0 - 1.0)
    total = jax.jit(lambda a: jnp.sum(a, axis=1))
    a = jax.device_put(x, XLAPY)
    y = step(a)
    calls = fast_calls(step, a)
    for _ in range(5):
        y = step(y)  # native output in, native output out
    assert fast_calls(step, a) == calls + 5
    want = x
    for _ in range(6):
        want = want * 2.0 - 1.0
    np.testing.assert_allclose(np.asarray(y), want, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(total(y)), want.sum(1), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(np.asarray(jax.device_put(y, CPU)), want, rtol=1e-5)
    assert y.unsafe_buffer_pointer() != 0
    assert y.on_device_size_in_bytes() == want.nbytes


def test_not_taken_with_donation_and_donation_still_invalidates():
    r = rng()
    x = r.standard_normal(32).astype(np.float32)
    plain = jax.jit(lambda a: a + 1.0)
    donating = jax.jit(lambda a: a * 3.0, donate_argnums=0)
    a = jax.device_put(x, XLAPY)
    y = plain(a)  # a native output, never seen by Python
    y = plain(a)
    assert not has_native_entry(donating, y)
    z = donating(y)
    assert y.is_deleted()
    np.testing.assert_allclose(np.asarray(z), (x + 1.0) * 3.0, rtol=1e-6)
    with pytest.raises((RuntimeError, ValueError), match=r"deleted|donated"):
        plain(y)  # JAX or the plugin's Python (the handle was retired) says so
    # the output of the donating call (maybe not ready when its handle was made) is armed
    # when the Python path first meets it; later calls on it are native
    calls = fast_calls(plain, a)
    for _ in range(3):
        np.testing.assert_allclose(np.asarray(plain(z)), (x + 1.0) * 3.0 + 1.0, rtol=1e-6)
    assert fast_calls(plain, a) >= calls + 2


def test_delete_then_use_raises_and_is_not_taken():
    r = rng()
    x = r.standard_normal(16).astype(np.float32)
    f = jax.jit(lambda a: a - 2.0)
    a = jax.device_put(x, XLAPY)
    y = f(a)
    y.delete()
    calls = fast_calls(f, a)
    with pytest.raises((RuntimeError, ValueError), match="deleted"):
        f(y)
    with pytest.raises((RuntimeError, ValueError), match="deleted"):
        np.asarray(y)
    a.delete()  # a Python-made handle: retired before its buffer goes
    with pytest.raises((RuntimeError, ValueError), match="deleted"):
        f(a)
    assert fast_calls(f, jax.device_put(x, XLAPY)) == calls


def test_not_taken_for_programs_that_are_not_kernels_in_a_row():
    r = rng()
    x = r.standard_normal(20).astype(np.float32)
    a = jax.device_put(x, XLAPY)
    looped = jax.jit(lambda v: jax.lax.fori_loop(0, 3, lambda i, c: c * 1.5, v))
    sort = jax.jit(jnp.sort)
    for fn, want in ((looped, x * 1.5**3), (sort, np.sort(x))):
        assert not has_native_entry(fn, a)
        np.testing.assert_allclose(np.asarray(fn(a)), want, rtol=1e-6)


def test_python_made_arguments_of_another_shape_get_their_own_entry():
    r = rng()
    f = jax.jit(lambda a: a * a)
    for n in (8, 9):
        x = r.standard_normal(n).astype(np.float32)
        a = jax.device_put(x, XLAPY)  # a handle the plugin's Python made: armed
        f(a)
        calls = fast_calls(f, a)
        np.testing.assert_allclose(np.asarray(f(a)), x * x, rtol=1e-6)
        assert fast_calls(f, a) == calls + 1


def test_memory_stats_exact_after_many_calls():
    r = rng()
    x = r.standard_normal((10, 10)).astype(np.float32)
    f = jax.jit(lambda a: (a + 1.0, a * 2.0))
    a = jax.device_put(x, XLAPY)
    outs = f(a)
    del outs
    start = stats()
    calls = fast_calls(f, a)
    for _ in range(500):
        outs = f(a)
    during = stats()
    assert during["bytes_in_use"] == start["bytes_in_use"] + 2 * x.nbytes
    del outs
    end = stats()
    assert fast_calls(f, a) == calls + 500
    assert end["bytes_in_use"] == start["bytes_in_use"]
    assert end["num_allocs"] == start["num_allocs"] + 1000
    assert end["peak_bytes_in_use"] >= start["bytes_in_use"] + 2 * x.nbytes
    # materialized outputs are uncounted when the runtime lets go of them (host arrays
    # JAX made may borrow the bytes through external references until they go)
    kept = [np.asarray(o) for o in f(a)]
    np.testing.assert_allclose(kept[0], x + 1.0, rtol=1e-6)
    np.testing.assert_allclose(kept[1], x * 2.0, rtol=1e-6)
    del kept
    assert stats()["bytes_in_use"] == start["bytes_in_use"]


def test_eight_threads_call_one_jitted_function():
    f = jax.jit(lambda a, b: a * b + a)
    r = rng()
    inputs = [
        [jax.device_put(r.standard_normal(256).astype(np.float32), XLAPY) for _ in "ab"]
        for _ in range(8)
    ]
    f(*inputs[0])
    start = stats()["bytes_in_use"]
    calls = fast_calls(f, *inputs[0])
    errors: list[BaseException] = []

    def work(a, b):
        try:
            want = np.asarray(a) * np.asarray(b) + np.asarray(a)
            for i in range(200):
                out = f(a, b)
                if i % 50 == 0:
                    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-6)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=pair) for pair in inputs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert fast_calls(f, *inputs[0]) >= calls + 8 * 150  # the reads go the Python path
    assert stats()["bytes_in_use"] == start


def test_several_devices_take_the_python_path():
    script = textwrap.dedent(
        """
        import numpy as np, jax, jax.numpy as jnp
        from xlapy.pjrt import core
        from xlapy.pjrt.executables import PExecutable
        devs = jax.devices("xlapy")
        assert len(devs) == 2, devs
        rng = np.random.default_rng()
        x = rng.standard_normal((2, 6)).astype(np.float32)
        got = jax.pmap(lambda a: a * 2.0 + 1.0)(x)
        np.testing.assert_allclose(np.asarray(got), x * 2.0 + 1.0, rtol=1e-6)
        one = jax.jit(lambda a: a - 1.0)
        b = jax.device_put(x[0], devs[1])
        for _ in range(3):
            out = one(b)
        np.testing.assert_allclose(np.asarray(out), x[0] - 1.0, rtol=1e-6)
        execs = [o for o in core.OBJECTS.values() if isinstance(o, PExecutable) and o.loaded]
        multi = [e for e in execs if len(e.info.executable.addressable_devices) > 1]
        single = [e for e in execs if len(e.info.executable.addressable_devices) == 1]
        assert multi and all(e.c.fast == core.ffi.NULL for e in multi)
        assert any(e.c.fast_calls for e in single)
        print("ok")
        """
    )
    env = {**os.environ, "XLAPY_DEVICE_COUNT": "2", "JAX_PLATFORMS": "xlapy,cpu"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    run = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "ok" in run.stdout


def test_questions_about_native_outputs_are_answered_natively(monkeypatch):
    """JAX asks each output of a call for its device and memory (PJRT_Buffer_Device,
    PJRT_Buffer_Memory). The native getters answered only Python-made handles: every
    native output was materialized in Python to say which device it is on, a cffi
    callback and a PBuffer per call (about 30 us of a 40 us call). Now nothing of a plain
    call enters Python."""
    from xlapy.pjrt import native_execute

    made = []
    original = native_execute._materialize_locked
    monkeypatch.setattr(
        native_execute, "_materialize_locked", lambda ptr: made.append(1) or original(ptr)
    )
    x = rng().standard_normal(8).astype(np.float32)
    f = jax.jit(lambda a: a * 3.0 + 1.0)
    a = jax.device_put(x, XLAPY)
    calls = fast_calls(f, a)
    for _ in range(50):
        out = f(a)
        assert out.devices() == {XLAPY} and not out.is_deleted()
    assert fast_calls(f, a) == calls + 50
    assert made == []
    np.testing.assert_allclose(np.asarray(out), x * 3.0 + 1.0, rtol=1e-6)  # materialized now
    assert made == [1]
    gone, given = f(a), f(a)  # deleted, donated: answered by Python from then on
    gone.delete()
    jax.jit(lambda v: v + 1.0, donate_argnums=0)(given)
    assert gone.is_deleted() and given.is_deleted()
