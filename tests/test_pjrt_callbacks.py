"""Host callbacks on the xlapy platform (jax.debug.print / debug.callback, pure_callback,
io_callback) against the same programs on "cpu", in one process: what the callbacks see,
what they print, the order they run in, their results, and their failures. Subprocesses
cover JAX_PLATFORMS=xlapy alone (no CPU backend to stage arguments on) and several devices
(pmap, shard_map, a sharded jit). Inputs are fresh random arrays each run."""

import gc
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.experimental import io_callback

from xlapy.errors import CustomCallError
from xlapy.runtime import Client
from xlapy.runtime.host_callbacks import HostCallback, lookup

ROOT = Path(__file__).resolve().parent.parent
XLAPY = jax.devices("xlapy")[0]
CPU = jax.devices("cpu")[0]
RNG = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def on_both(fn, *args):
    """fn jitted on cpu, then on xlapy, on the same host arguments: the two results."""
    outs = []
    for device in (CPU, XLAPY):
        out = jax.jit(fn)(*jax.device_put(args, device))
        outs.append(jax.tree_util.tree_map(np.asarray, out))
    return outs


def same(want, got):
    jax.tree_util.tree_map(np.testing.assert_array_equal, want, got)


# -- jax.debug.print / jax.debug.callback --------------------------------------------------
def test_debug_print_inside_jit_prints_what_cpu_prints(capsys):
    # The printed sum is compared as text: its inputs are multiples of 1/64 below 8 in
    # magnitude, so every order of summation gives the same float32 (no last-digit flip).
    x, y = np.round(rand(2, 3) * 64) / 64, rand(4)

    def f(a, b):
        jax.debug.print("a={a} sum={s:.3f}", a=a, s=a.sum())
        jax.debug.print("tree {t} and {}", b * 2, t={"k": (a[0], b[:2])}, ordered=True)
        jax.debug.print("static {} {}", 7, "text")
        return a.sum() + b.sum()

    texts = []
    for device in (CPU, XLAPY):
        out = jax.jit(f)(*jax.device_put((x, y), device))
        out.block_until_ready()
        jax.effects_barrier()
        texts.append(capsys.readouterr().out)
    assert sorted(texts[0].splitlines()) == sorted(texts[1].splitlines())  # unordered prints
    assert f"sum={x.sum():.3f}" in texts[1] and "static 7 text" in texts[1]


def test_debug_callback_under_vmap_grad_and_control_flow():
    x = rand(3, 4)

    def program(log):
        def record(tag):
            return lambda *v: log.append((tag, *(np.array(a) for a in v)))

        def loss(w):
            jax.debug.callback(record("w"), w)
            h = jnp.tanh(w)
            jax.debug.callback(record("h"), h, ordered=True)

            def body(c, i):
                jax.debug.callback(record("scan"), c, i, ordered=True)
                return c * 0.5 + i, None

            c, _ = jax.lax.scan(body, h.sum(), jnp.arange(3.0))
            jax.lax.cond(
                c > 0,
                lambda: jax.debug.callback(record("pos")),
                lambda: jax.debug.callback(record("neg")),
            )
            jax.lax.while_loop(
                lambda s: s < 2, lambda s: (jax.debug.callback(record("while"), s), s + 1)[1], 0
            )
            return c

        def f(w):
            per_row = jax.vmap(lambda r: (jax.debug.callback(record("row"), r), r.sum())[1])(w)
            return jax.grad(loss)(w), per_row

        return f

    logs = [[], []]
    outs = [
        jax.tree_util.tree_map(np.asarray, jax.jit(program(log))(jax.device_put(x, d)))
        for log, d in zip(logs, (CPU, XLAPY), strict=True)
    ]
    jax.effects_barrier()
    np.testing.assert_allclose(outs[1][0], outs[0][0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(outs[1][1], outs[0][1], rtol=1e-5, atol=1e-6)

    # The callbacks that see inputs or integers see exactly the same values on both
    # platforms, in any order; the ordered ones see computed values (tanh, a sum), equal to
    # rounding, in program order.
    def exact(log):
        return sorted(
            str((e[0], *(a.tolist() for a in e[1:]))) for e in log if e[0] not in ("h", "scan")
        )

    assert exact(logs[1]) == exact(logs[0])
    ordered = [[e for e in log if e[0] in ("h", "scan")] for log in logs]
    assert [e[0] for e in ordered[1]] == [e[0] for e in ordered[0]] == ["h", "scan", "scan", "scan"]
    for got, want in zip(ordered[1], ordered[0], strict=True):
        for a, b in zip(got[1:], want[1:], strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


# -- pure_callback --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "vmap_method", ["sequential", "sequential_unrolled", "expand_dims", "broadcast_all"]
)
def test_pure_callback_under_vmap(vmap_method):
    x, y = rand(5, 3), rand(3)
    calls = []

    def host(a, b):
        calls.append(np.shape(a))
        return np.sin(np.asarray(a)) * np.asarray(b)

    def f(a, b):
        return jax.pure_callback(
            host, jax.ShapeDtypeStruct(a.shape, a.dtype), a, b, vmap_method=vmap_method
        )

    want, got = on_both(jax.vmap(f, in_axes=(0, None)), x, y)
    same(want, got)
    np.testing.assert_allclose(got, np.sin(x) * y, rtol=1e-6)
    assert calls[: len(calls) // 2] == calls[len(calls) // 2 :]  # the same calls on both


def test_pure_callback_results_of_several_dtypes_and_shapes():
    x = rand(2, 3)
    kinds = jax.ShapeDtypeStruct

    def host(a, tree):
        a = np.asarray(a)
        return (
            a.astype(ml_dtypes.bfloat16),
            np.float32(a.sum()),
            (a > 0).astype(np.bool_),
            {"i": np.asarray(tree["n"]) * 3, "u": np.uint8(7)},
            np.zeros((0, 2), np.float32),
        )

    def f(a, n):
        shapes = (
            kinds(a.shape, jnp.bfloat16),
            kinds((), jnp.float32),
            kinds(a.shape, jnp.bool_),
            {"i": kinds(n.shape, n.dtype), "u": kinds((), jnp.uint8)},
            kinds((0, 2), jnp.float32),
        )
        return jax.pure_callback(host, shapes, a, {"n": n})

    n = RNG.integers(-100, 100, (4,)).astype(np.int32)
    want, got = on_both(f, x, n)
    same(want, got)
    assert got[0].dtype == ml_dtypes.bfloat16 and got[1].shape == () and got[4].shape == (0, 2)
    np.testing.assert_array_equal(got[3]["i"], n * 3)


@pytest.mark.parametrize(
    ("result", "message"),
    [
        (lambda a: np.ones(a.size + 1, np.float32), "Incorrect output shape for return value #0"),
        (lambda a: np.ones(a.shape, np.int32), "Incorrect output dtype for return value #0"),
    ],
)
def test_pure_callback_wrong_result_is_a_jax_error(result, message):
    x = rand(4)
    f = jax.jit(lambda a: jax.pure_callback(result, jax.ShapeDtypeStruct(a.shape, a.dtype), a))
    for device in (CPU, XLAPY):
        with pytest.raises(jax.errors.JaxRuntimeError, match=message):
            f(jax.device_put(x, device)).block_until_ready()


def test_exception_in_callback_surfaces_and_device_stays_usable():
    x = rand(3)

    def boom(a):
        raise ValueError(f"callback refused {np.asarray(a).shape}")

    f = jax.jit(lambda a: jax.pure_callback(boom, jax.ShapeDtypeStruct(a.shape, a.dtype), a))
    g = jax.jit(lambda a: io_callback(boom, None, a, ordered=True))
    for fn in (f, g):
        refused = r"ValueError: callback refused \(3,\)"
        with pytest.raises(jax.errors.JaxRuntimeError, match=refused):
            jax.block_until_ready(fn(jax.device_put(x, XLAPY)))
    ok = jax.jit(lambda a: jax.pure_callback(np.cos, jax.ShapeDtypeStruct(a.shape, a.dtype), a))
    np.testing.assert_allclose(np.asarray(ok(jax.device_put(x, XLAPY))), np.cos(x), rtol=1e-6)


def test_callback_calling_jax_runs_on_the_cpu_as_on_cpu():
    x = rand(6)
    seen = []

    def host(a):
        seen.append(next(iter(a.devices())).platform)
        return jnp.sin(a) * 2

    want, got = on_both(
        lambda a: jax.pure_callback(host, jax.ShapeDtypeStruct(a.shape, a.dtype), a), x
    )
    same(want, got)
    assert seen == ["cpu", "cpu"]


# -- io_callback ----------------------------------------------------------------------------
def test_ordered_io_callback_keeps_order_across_calls_and_in_loops():
    starts = rand(3)

    def run(device):
        log = []

        def step(c, i):
            io_callback(lambda v, j: log.append((float(v), int(j))), None, c, i, ordered=True)
            return c * 1.5 + 1, None

        def f(c):
            c, _ = jax.lax.scan(step, c, jnp.arange(4))
            return io_callback(
                lambda v: np.float32(v) + 1, jax.ShapeDtypeStruct((), jnp.float32), c, ordered=True
            )

        fn = jax.jit(f)
        outs = [np.asarray(fn(jax.device_put(s, device))) for s in starts]
        jax.effects_barrier()
        return outs, log

    (want, want_log), (got, got_log) = run(CPU), run(XLAPY)
    # XLA:CPU may fuse c * 1.5 + 1 into an FMA; a value that passes near 0 then differs in
    # its last bits relative to its size
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert [j for _, j in got_log] == [j for _, j in want_log] == [0, 1, 2, 3] * 3
    np.testing.assert_allclose(
        [v for v, _ in got_log], [v for v, _ in want_log], rtol=1e-5, atol=1e-6
    )


def test_unordered_io_callback_results():
    x = rand(2, 2)
    calls = []

    def host(a):
        calls.append(1)
        return np.asarray(a).T.copy()

    want, got = on_both(
        lambda a: io_callback(host, jax.ShapeDtypeStruct(a.shape[::-1], a.dtype), a) + 1, x
    )
    same(want, got)
    assert len(calls) == 2


# -- threads, the native Execute, lifetimes, serialization ----------------------------------
def test_callbacks_from_several_threads():
    x = rand(8)
    errors = []

    def worker(k):
        try:
            f = jax.jit(
                lambda a: (
                    jax.pure_callback(
                        lambda b: np.asarray(b) * k, jax.ShapeDtypeStruct(a.shape, a.dtype), a
                    )
                    + 1
                )
            )
            for _ in range(15):
                np.testing.assert_allclose(
                    np.asarray(f(jax.device_put(x, XLAPY))), x * k + 1, rtol=1e-6
                )
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and not any(t.is_alive() for t in threads)


def test_callback_programs_next_to_native_execute_programs():
    x = rand(16)
    plain = jax.jit(lambda a: a * 2 + 1)  # takes the native Execute
    calls = []
    with_cb = jax.jit(lambda a: (jax.debug.callback(lambda v: calls.append(1), a), a - 1)[1])
    arg = jax.device_put(x, XLAPY)
    for _ in range(5):
        np.testing.assert_allclose(np.asarray(plain(arg)), x * 2 + 1, rtol=1e-6)
        np.testing.assert_allclose(np.asarray(with_cb(arg)), x - 1, rtol=1e-6)
    jax.effects_barrier()
    assert len(calls) == 5


def test_each_lowering_names_its_own_callables():
    """Two programs with the same text but for their callbacks: each runs its own (the
    ids differ, so no cache entry made for one can serve the other)."""
    x = rand(5)
    f1 = jax.jit(
        lambda a: jax.pure_callback(
            lambda b: np.asarray(b) + 1, jax.ShapeDtypeStruct(a.shape, a.dtype), a
        )
    )
    f2 = jax.jit(
        lambda a: jax.pure_callback(
            lambda b: np.asarray(b) - 1, jax.ShapeDtypeStruct(a.shape, a.dtype), a
        )
    )
    arg = jax.device_put(x, XLAPY)
    assert f1.lower(arg).as_text() != f2.lower(arg).as_text()
    np.testing.assert_allclose(np.asarray(f1(arg)), x + 1, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(f2(arg)), x - 1, rtol=1e-6)


def test_serialized_executable_keeps_working_while_its_callbacks_live():
    from jax._src import xla_bridge

    x = rand(4)
    compiled = (
        jax.jit(lambda a: jax.pure_callback(np.exp, jax.ShapeDtypeStruct(a.shape, a.dtype), a))
        .lower(jax.device_put(x, XLAPY))
        .compile()
    )
    data = compiled.runtime_executable().serialize()
    backend = xla_bridge.get_backend("xlapy")
    loaded = backend.deserialize_executable(data, backend.devices()[:1], None)
    out = loaded.execute_sharded([jax.device_put(x, XLAPY)])
    got = out.disassemble_into_single_device_arrays()[0][0]
    np.testing.assert_allclose(np.asarray(got), np.exp(x), rtol=1e-6)


def test_callback_table_holds_callables_weakly_and_names_missing_ones():
    cb = HostCallback(lambda: (), [], name="probe")
    number = cb.id
    assert lookup(number) is cb
    del cb
    gc.collect()
    with pytest.raises(CustomCallError, match="no host callback"):
        lookup(number)


HLO_LOOP = """
HloModule ordered_loop

cond {
  cs = (token[], s32[]) parameter(0)
  ci = s32[] get-tuple-element(cs), index=1
  three = s32[] constant(3)
  ROOT lt = pred[] compare(ci, three), direction=LT
}

body {
  s = (token[], s32[]) parameter(0)
  t = token[] get-tuple-element(s), index=0
  i = s32[] get-tuple-element(s), index=1
  t2 = token[] custom-call(t, i), custom_call_target="xlapy_host_callback",
    custom_call_has_side_effect=true, backend_config="ID"
  one = s32[] constant(1)
  next = s32[] add(i, one)
  ROOT out = (token[], s32[]) tuple(t2, next)
}

ENTRY main {
  t0 = token[] after-all()
  x = f32[] parameter(0)
  zero = s32[] constant(0)
  init = (token[], s32[]) tuple(t0, zero)
  loop = (token[], s32[]) while(init), condition=cond, body=body
  ROOT n = s32[] get-tuple-element(loop), index=1
}
"""


def test_runtime_host_callback_threading_a_token_through_a_loop():
    log = []
    cb = HostCallback(lambda i: log.append(int(i)) or (), [], token=True, name="probe")
    client = Client("cpu")
    exe = client.compile(HLO_LOOP.replace("ID", str(cb.id)))
    out = exe.execute([[client.buffer_from_pyval(np.float32(1))]])
    assert int(np.asarray(out[0][0])) == 3 and log == [0, 1, 2]
    missing = client.compile(HLO_LOOP.replace("ID", str(cb.id + 1)))
    with pytest.raises(Exception, match="no host callback"):
        np.asarray(missing.execute([[client.buffer_from_pyval(np.float32(1))]])[0][0])


# -- other processes: no CPU backend; several devices ----------------------------------------
def run_script(script: str, **env) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


ONLY_XLAPY = """
import numpy as np, jax, jax.numpy as jnp
from jax.experimental import io_callback
assert [d.platform for d in jax.devices()] == ["xlapy"]
x = jnp.asarray(np.random.default_rng().standard_normal(3).astype(np.float32))
like = jax.ShapeDtypeStruct(x.shape, x.dtype)
close = lambda got, want: np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)
jax.debug.print("eager {}", x)  # no CPU backend: staged on xlapy
f = jax.jit(lambda a: (jax.debug.print("jit {}", a.sum() > -100),
                       jax.pure_callback(lambda b: jnp.sin(b), like, a))[1])
close(f(x), np.sin(np.asarray(x)))
close(io_callback(lambda b: np.asarray(b) * 2, like, x, ordered=True), np.asarray(x) * 2)
g = jax.jit(lambda a: jax.pure_callback(lambda b: np.asarray(b) + 1, like, a))
nested = jax.jit(lambda a: jax.pure_callback(lambda b: g(b), like, a))
close(nested(x), np.asarray(x) + 1)  # runs nested on the busy device, as on XLA:CPU
close(g(x), np.asarray(x) + 1)
print("only xlapy ok")
"""


def test_without_a_cpu_backend():
    out = run_script(ONLY_XLAPY, JAX_PLATFORMS="xlapy")
    assert "eager [" in out and "jit True" in out and "only xlapy ok" in out


SEVERAL_DEVICES = """
import numpy as np, jax, jax.numpy as jnp
from jax.experimental import io_callback
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
x = np.random.default_rng().standard_normal(4).astype(np.float32)
results = {}
for plat in ("cpu", "xlapy"):
    devs = jax.devices(plat)[:2]
    mesh = Mesh(np.array(devs), ("x",))
    log = []
    note = lambda tag: lambda v: log.append((tag, np.asarray(v).round(5).tolist()))
    double = lambda a: jax.pure_callback(lambda b: np.asarray(b) * 2,
                                         jax.ShapeDtypeStruct(a.shape, a.dtype), a)
    pm = jax.pmap(lambda a: (jax.debug.callback(note("pmap"), a), double(a))[1], devices=devs)
    r1 = np.asarray(pm(x.reshape(2, 2)))
    total = lambda a: io_callback(lambda b: np.asarray(b).sum(keepdims=True),
                                  jax.ShapeDtypeStruct((1,), jnp.float32), a)
    sh = jax.jit(lambda a: (jax.debug.callback(lambda v: log.append(("jit", v.shape)), a),
                            total(a))[1] + a, in_shardings=NamedSharding(mesh, P("x")))
    r2 = np.asarray(sh(x))
    piece = lambda a: (jax.debug.callback(note("shard"), a), a * 3)[1]
    sm = jax.jit(jax.shard_map(piece, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
    r3 = np.asarray(sm(x))
    on_pieces = jax.jit(lambda a: jax.debug.callback(note("piece"), a * 2, partitioned=True),
                        in_shardings=NamedSharding(mesh, P("x")))
    on_pieces(x)
    jax.effects_barrier()
    results[plat] = (r1.tolist(), r2.tolist(), r3.tolist(), sorted(map(str, log)))
assert results["cpu"] == results["xlapy"], results
assert sum(e.startswith("('jit'") for e in results["xlapy"][3]) == 1  # once, not per device
assert sum(e.startswith("('pmap'") for e in results["xlapy"][3]) == 2  # once per device
assert sum(e.startswith("('piece'") for e in results["xlapy"][3]) == 2  # each its piece
print("several devices ok")
"""


def test_callbacks_on_several_devices():
    out = run_script(
        SEVERAL_DEVICES,
        JAX_PLATFORMS="cpu,xlapy",
        XLAPY_DEVICE_COUNT="2",
        XLA_FLAGS="--xla_force_host_platform_device_count=2",
    )
    assert "several devices ok" in out
