"""JAX programs on the "xlapy" platform (the PJRT plugin) against the same programs on
"cpu", in one process: primitives, control flow, RNG, sort, pytrees, transfers of every
dtype, donation, errors, and a training loop."""

import threading
import warnings

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

XLAPY = jax.devices("xlapy")[0]
CPU = jax.devices("cpu")[0]


def on(device, tree):
    return jax.device_put(tree, device)


def run_both(fn, *args, **jit_kwargs):
    """fn jitted on cpu and on xlapy with the same host arguments; both results (host)."""
    results = []
    for device in (CPU, XLAPY):
        out = jax.jit(fn, **jit_kwargs)(*on(device, args))
        leaves = jax.tree_util.tree_leaves(out)
        assert all(device in leaf.devices() for leaf in leaves)
        results.append(jax.tree_util.tree_map(np.asarray, out))
    return results


def check(fn, *args, rtol=1e-5, atol=1e-6):
    want, got = run_both(fn, *args)
    jax.tree_util.tree_map(
        lambda w, g: np.testing.assert_allclose(g, w, rtol=rtol, atol=atol), want, got
    )


RNG = np.random.default_rng(0)
F = RNG.standard_normal((3, 5)).astype(np.float32)
G = RNG.standard_normal((3, 5)).astype(np.float32)
P = np.abs(F) + 0.5
INTS = RNG.integers(-20, 20, (3, 5)).astype(np.int32)
DIVISORS = RNG.integers(1, 7, (3, 5)).astype(np.int32)

UNARY = [
    jnp.sin,
    jnp.cos,
    jnp.tanh,
    jnp.exp,
    jnp.abs,
    jnp.negative,
    jnp.floor,
    jnp.ceil,
    jnp.sign,
    jnp.round,
    jax.nn.sigmoid,
    jax.nn.relu,
    jax.nn.gelu,
    jnp.square,
    lax.erf,
    jnp.expm1,
    jnp.log1p,
    jnp.isfinite,
]
POSITIVE = [jnp.log, jnp.sqrt, lax.rsqrt, jnp.cbrt]
BINARY = [
    jnp.add,
    jnp.subtract,
    jnp.multiply,
    jnp.divide,
    jnp.maximum,
    jnp.minimum,
    jnp.arctan2,
    jnp.less,
    jnp.greater_equal,
    jnp.equal,
    jnp.not_equal,
    lambda a, b: jnp.where(a > b, a, b),
]
INTEGER = [
    jnp.add,
    jnp.multiply,
    lax.div,
    lax.rem,
    jnp.bitwise_and,
    jnp.bitwise_or,
    jnp.bitwise_xor,
    lambda a, b: lax.shift_left(a, b % 5),
    lambda a, b: a // b,
    lambda a, b: jnp.clip(a, -3, 4),
    lambda a, b: a.astype(jnp.float32) * 0.5,
]


@pytest.mark.parametrize("op", UNARY, ids=lambda f: getattr(f, "__name__", "op"))
def test_unary(op):
    check(op, F, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("op", POSITIVE, ids=lambda f: getattr(f, "__name__", "op"))
def test_unary_positive(op):
    check(op, P, rtol=2e-5)


@pytest.mark.parametrize("op", BINARY, ids=lambda f: getattr(f, "__name__", "op"))
def test_binary(op):
    check(op, F, G)


@pytest.mark.parametrize("op", INTEGER, ids=lambda f: getattr(f, "__name__", "op"))
def test_integer(op):
    check(op, INTS, DIVISORS)


STRUCTURAL = {
    "reshape_transpose": lambda a: a.reshape(5, 3).T,
    "broadcast": lambda a: a[:, None, :] + a[None, :1, :],
    "concat": lambda a: jnp.concatenate([a, a * 2], axis=0),
    "slice_rev": lambda a: a[1:, ::-2],
    "pad": lambda a: jnp.pad(a, ((1, 0), (0, 2))),
    "reduce": lambda a: (a.sum(0), a.max(1), a.min(), jnp.prod(a[:, :2], 1)),
    "argmax": lambda a: (jnp.argmax(a, 1), jnp.argmin(a, 0)),
    "cumsum": lambda a: jnp.cumsum(a, 1),
    "dot": lambda a: a @ a.T,
    "einsum": lambda a: jnp.einsum("ij,kj->ik", a, a + 1),
    "gather": lambda a: a[jnp.array([2, 0]), 1:4],
    "scatter": lambda a: a.at[jnp.array([0, 2]), 1].add(10.0),
    "dynamic_slice": lambda a: lax.dynamic_slice(a, (1, 2), (2, 2)),
    "dynamic_update": lambda a: lax.dynamic_update_slice(a, jnp.ones((1, 2)), (2, 3)),
    "iota_convert": lambda a: a + jnp.arange(5).astype(jnp.float32),
    "sort": lambda a: jnp.sort(a, axis=1),
    "argsort": lambda a: jnp.argsort(a[0]),
    "softmax": lambda a: jax.nn.softmax(a, axis=-1),
    "logsumexp": lambda a: jax.nn.logsumexp(a, axis=0),
    "select_n": lambda a: lax.select(a > 0, a, -a),
    "clamp": lambda a: lax.clamp(-0.5, a, 0.5),
    "conv": lambda a: lax.conv(a[None, None], jnp.ones((1, 1, 2, 2)), (1, 1), "SAME"),
    "reduce_window": lambda a: lax.reduce_window(a, -jnp.inf, lax.max, (2, 2), (1, 1), "VALID"),
    "tuple_out": lambda a: {"x": a, "y": (a.sum(), a[0])},
}


@pytest.mark.parametrize("name", sorted(STRUCTURAL))
def test_structural(name):
    check(STRUCTURAL[name], F, rtol=1e-5, atol=1e-5)


def test_control_flow():
    def loop(x):
        y = lax.fori_loop(0, 5, lambda i, c: c * 1.1 + i, x)
        z = lax.while_loop(lambda c: c[0] < 10, lambda c: (c[0] + 1, c[1] * 0.9), (0, y))[1]
        w = lax.cond(z.sum() > 0, lambda v: v + 1, lambda v: v - 1, z)
        return lax.scan(lambda c, v: (c + v, c * v), jnp.zeros(5), w)

    check(loop, F, rtol=1e-4, atol=1e-5)


def test_rng_matches_cpu():
    def sample(seed):
        key = jax.random.key(seed)
        k1, k2 = jax.random.split(key)
        return jax.random.normal(k1, (4, 3)), jax.random.uniform(k2, (5,)), jax.random.bits(k2)

    check(sample, np.uint32(7))


def test_pytrees_and_grad():
    params = {"w": F, "b": G[0]}

    def loss(p, x):
        return jnp.mean((x @ p["w"] + p["b"]) ** 2)

    check(jax.value_and_grad(loss), params, F.T, rtol=1e-4, atol=1e-5)


DTYPES = [
    np.bool_,
    np.int8,
    np.int16,
    np.int32,
    np.uint8,
    np.uint16,
    np.uint32,
    np.float16,
    np.float32,
    ml_dtypes.bfloat16,
    np.complex64,
    ml_dtypes.float8_e4m3fn,
]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_device_put_round_trip(dtype):
    host = (np.arange(24) % 7 - 3).astype(dtype).reshape(2, 3, 4)
    x = jax.device_put(host, XLAPY)
    assert x.dtype == host.dtype and x.shape == host.shape
    np.testing.assert_array_equal(np.asarray(x), host)
    np.testing.assert_array_equal(np.asarray(x[1:, ::2]), host[1:, ::2])
    back = jax.device_put(x, CPU)
    np.testing.assert_array_equal(np.asarray(back), host)


def test_non_contiguous_and_scalar_inputs():
    host = np.arange(20, dtype=np.float32).reshape(4, 5)
    for value in (host.T, host[::2, 1::2], np.float32(3.5), np.zeros((0, 3), np.float32)):
        np.testing.assert_array_equal(np.asarray(jax.device_put(value, XLAPY)), value)


def test_donation_invalidates_input_and_updates_in_place():
    step = jax.jit(lambda a, b: a * 2 + b, donate_argnums=0)
    a = jax.device_put(np.ones(8, np.float32), XLAPY)
    b = jax.device_put(np.full(8, 3, np.float32), XLAPY)
    out = step(a, b)
    assert a.is_deleted() and not b.is_deleted()
    np.testing.assert_array_equal(np.asarray(out), np.full(8, 5, np.float32))
    with pytest.raises(RuntimeError, match="deleted"):
        np.asarray(a)
    # a non-donated run of the same program leaves its input alone
    c = jax.device_put(np.ones(8, np.float32), XLAPY)
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda a, b: a * 2 + b)(c, b)), 5)
    assert not c.is_deleted()


def test_delete_and_block_until_ready():
    x = jax.jit(lambda a: a + 1)(jax.device_put(np.zeros(3, np.float32), XLAPY))
    assert x.block_until_ready() is x
    x.delete()
    assert x.is_deleted()
    with pytest.raises(RuntimeError):
        np.asarray(x)


def test_rejected_program_raises_xlapy_message():
    from jax import ffi

    def call(x):
        return ffi.ffi_call("xlapy_no_such_target", jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    with pytest.raises(Exception, match="xlapy_no_such_target") as info:
        jax.jit(call)(jax.device_put(np.ones(3, np.float32), XLAPY))
    assert "xlapy" in str(info.value)


def test_compiled_reports_xlapy_memory_and_cost():
    spec = jax.ShapeDtypeStruct(
        (256,), jnp.float32, sharding=jax.sharding.SingleDeviceSharding(XLAPY)
    )
    compiled = jax.jit(lambda a, b: (a * b).sum()).lower(spec, spec).compile()
    memory = compiled.memory_analysis()
    assert memory.argument_size_in_bytes == 2 * 256 * 4
    assert memory.output_size_in_bytes == 4
    cost = compiled.cost_analysis()
    assert cost["flops"] >= 256
    assert "multiply" in compiled.as_text()
    donated = jax.jit(lambda a, b: a * b, donate_argnums=0).lower(spec, spec).compile()
    assert donated.memory_analysis().alias_size_in_bytes == 256 * 4


def test_memory_analysis_is_the_plan_the_cpu_backend_runs():
    from xlapy.runtime import Client

    spec = jax.ShapeDtypeStruct(
        (64, 64), jnp.float32, sharding=jax.sharding.SingleDeviceSharding(XLAPY)
    )
    compiled = jax.jit(lambda a, w: jnp.tanh(jnp.tanh(a @ w) @ w).sum(0)).lower(spec, spec)
    memory = compiled.compile().memory_analysis()
    client = Client("cpu")
    stats = client.compile(compiled.compile().as_text()).memory_stats()
    assert stats.temp_bytes > 0
    assert (
        memory.argument_size_in_bytes,
        memory.output_size_in_bytes,
        memory.alias_size_in_bytes,
        memory.temp_size_in_bytes,
    ) == (stats.argument_bytes, stats.output_bytes, stats.alias_bytes, stats.temp_bytes)
    client.close()


PLUGIN_MEMORY_PROGRAMS = (
    "mlp_train_step",
    "convnet_train_step",
    "attention_causal",
    "rnn_scan_grad",
    "cond_inside_scan",
    "while_newton_sqrt",
    "lax_sort_multi_operand",
)


@pytest.mark.parametrize("name", PLUGIN_MEMORY_PROGRAMS)
def test_plugin_memory_analysis_is_the_executed_plan_for_jax_programs(name):
    """JAX programs through the plugin: `compiled.memory_analysis()` gives the figures of
    the buffer assignment the plugin's executable runs over (the very object its CPU
    program executes), and `xlapy.pjrt.memory_report` reports that plan (it re-planned the
    module on its own before)."""
    from jax_programs import PROGRAMS

    from xlapy.memory import report
    from xlapy.pjrt.executables import executable_of, memory_report

    prog = PROGRAMS[name]
    with prog.context(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = jax.device_put(prog.args(), XLAPY)
        compiled = prog.jitted().lower(*args).compile()
    memory = compiled.memory_analysis()
    exe = executable_of(compiled)
    plan = exe.memory_plan()
    assert plan is exe.backend_program().compiled.assignment  # the plan the program runs
    stats = plan.memory_analysis()
    assert (
        memory.argument_size_in_bytes,
        memory.output_size_in_bytes,
        memory.alias_size_in_bytes,
        memory.temp_size_in_bytes,
    ) == (stats.argument_bytes, stats.output_bytes, stats.alias_bytes, stats.temp_bytes)
    assert memory_report(compiled).startswith(report.stats_text(plan))

    # a run moves the device allocator by the figures (CompiledMemoryStats's rule: the
    # output's tuple tables are counted, never allocated)
    from xlapy.runtime.executable import tuple_table_bytes

    device = exe.addressable_devices[0]
    jax.block_until_ready(args)
    before = device.memory_stats().bytes_in_use
    device.allocator.reset_peak()
    with prog.context(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = jax.block_until_ready(compiled(*args))
    grown = device.memory_stats().peak_bytes_in_use - before
    leaves = sum(x.nbytes for x in jax.tree_util.tree_leaves(out))
    assert leaves == stats.output_bytes - tuple_table_bytes(exe.output_shape)
    assert grown == leaves + stats.temp_bytes  # nothing donated: every output leaf is new


def test_mlp_training_matches_cpu():
    def init(key):
        k1, k2 = jax.random.split(key)
        return {
            "w1": jax.random.normal(k1, (8, 16)) * 0.3,
            "b1": jnp.zeros(16),
            "w2": jax.random.normal(k2, (16, 1)) * 0.3,
            "b2": jnp.zeros(1),
        }

    def loss(p, x, y):
        h = jax.nn.tanh(x @ p["w1"] + p["b1"])
        return jnp.mean((h @ p["w2"] + p["b2"] - y) ** 2)

    @jax.jit
    def step(p, x, y):
        value, grads = jax.value_and_grad(loss)(p, x, y)
        return jax.tree_util.tree_map(lambda a, g: a - 0.1 * g, p, grads), value

    x = RNG.standard_normal((32, 8)).astype(np.float32)
    y = np.sin(x.sum(1, keepdims=True))
    losses = {}
    for device in (CPU, XLAPY):
        p = jax.device_put(init(jax.random.key(0)), device)
        xs, ys = jax.device_put((x, y), device)
        trace = []
        for _ in range(10):
            p, value = step(p, xs, ys)
            trace.append(float(value))
        losses[device.platform] = trace
    np.testing.assert_allclose(losses["xlapy"], losses["cpu"], rtol=1e-4)
    assert losses["xlapy"][-1] < losses["xlapy"][0]


def test_many_threads_call_one_function():
    fn = jax.jit(lambda a, k: a * k + 1)
    x = jax.device_put(np.arange(64, dtype=np.float32), XLAPY)
    errors, results = [], {}

    def worker(k):
        try:
            for _ in range(20):
                results[k] = np.asarray(fn(x, np.float32(k)))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for k, got in results.items():
        np.testing.assert_array_equal(got, np.arange(64, dtype=np.float32) * k + 1)


def test_transformer_block_training_matches_cpu():
    def init(key, d=16, v=32):
        ks = jax.random.split(key, 6)
        w = [jax.random.normal(k, s) * 0.1 for k, s in zip(ks, [(v, d)] + [(d, d)] * 4)]
        out = jax.random.normal(ks[5], (d, v)) * 0.1
        return dict(zip(["emb", "wq", "wk", "wv", "wo"], w), ln=jnp.ones(d), out=out)

    def loss(p, tokens):
        x = p["emb"][tokens]
        mean = x.mean(-1, keepdims=True)
        h = (x - mean) * lax.rsqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5) * p["ln"]
        q, k, v = h @ p["wq"], h @ p["wk"], h @ p["wv"]
        scores = jnp.einsum("btd,bsd->bts", q, k) / 4.0
        causal = jnp.tril(jnp.ones((tokens.shape[1],) * 2, bool))
        attn = jax.nn.softmax(jnp.where(causal, scores, -1e9), -1)
        x = x + jnp.einsum("bts,bsd->btd", attn, v) @ p["wo"]
        logp = jax.nn.log_softmax(x @ p["out"])
        target = jnp.roll(tokens, -1, 1)[..., None]
        return -jnp.mean(jnp.take_along_axis(logp, target, -1))

    @jax.jit
    def step(p, tokens):
        value, grads = jax.value_and_grad(loss)(p, tokens)
        return jax.tree_util.tree_map(lambda a, g: a - 0.5 * g, p, grads), value

    tokens = RNG.integers(0, 32, (4, 8)).astype(np.int32)
    losses = {}
    for device in (CPU, XLAPY):
        p, t = jax.device_put((init(jax.random.key(1)), tokens), device)
        losses[device.platform] = []
        for _ in range(4):
            p, value = step(p, t)
            losses[device.platform].append(float(value))
    np.testing.assert_allclose(losses["xlapy"], losses["cpu"], rtol=1e-4)


SPD = (F @ F.T + 3 * np.eye(3)).astype(np.float32)
LINALG = {
    "inv": lambda a: jnp.linalg.inv(a),
    "solve": lambda a: jnp.linalg.solve(a, jnp.ones((3, 2))),
    "cholesky": lambda a: jnp.linalg.cholesky(a),
    "qr": lambda a: jnp.linalg.qr(a),
    "eigh": lambda a: jnp.linalg.eigh(a)[0],
    "svd": lambda a: jnp.linalg.svd(a, compute_uv=False),
    "slogdet": lambda a: jnp.linalg.slogdet(a),
    "triangular": lambda a: jax.scipy.linalg.solve_triangular(a, jnp.ones(3), lower=True),
}


@pytest.mark.parametrize("name", sorted(LINALG))
def test_linalg(name):
    check(LINALG[name], SPD, rtol=1e-4, atol=1e-5)


# LAPACK routines xlapy has no handler of its own for: jaxlib's handlers run them, with
# JAX's layout convention (column-major matrices after num_batch_dims batch dimensions).
_M = np.random.default_rng().standard_normal((2, 5, 5)).astype(np.float32)
_DIAG = np.random.default_rng().standard_normal((3, 2, 6)).astype(np.float32)
_B = np.random.default_rng().standard_normal((2, 6, 4)).astype(np.float32)
JAXLIB_LAPACK = {
    "gtsv": (
        lambda dl, d, du, b: lax.linalg.tridiagonal_solve(dl, d + 4.0, du, b),
        (_DIAG[0], _DIAG[1], _DIAG[2], _B),
    ),
    "gehrd": (lambda a: lax.linalg.hessenberg(a), (_M,)),
    "sytrd": (lambda a: lax.linalg.tridiagonal(a + jnp.swapaxes(a, -1, -2)), (_M,)),
    "geqp3": (lambda a: jax.scipy.linalg.qr(a, pivoting=True), (_M[0],)),
    "gees": (lambda a: lax.linalg.schur(a), (_M[0],)),
}


@pytest.mark.parametrize("name", sorted(JAXLIB_LAPACK))
def test_lapack_routines_run_by_jaxlib_handlers(name):
    fn, args = JAXLIB_LAPACK[name]
    check(fn, *args, rtol=1e-4, atol=1e-4)
