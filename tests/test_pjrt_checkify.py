"""`checkify.check` as a runtime error (`jax_experimental_unsafe_xla_runtime_errors`) on
the xlapy platform, next to XLA:CPU in the same process.

JAX lowers a check left in a jitted program (not functionalized by `checkify.checkify`)
to a host callback that raises JaxRuntimeError with the check's message; on the CPU
through `emit_python_callback`, which serves JAX's own platforms only ("`EmitPythonCallback`
not supported on xlapy backend"). xlapy lowers it through its own host callbacks
(xlapy/pjrt/callbacks.py): the call fails with a JaxRuntimeError carrying the message.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src import config
from jax.experimental import checkify

XLAPY = jax.devices("xlapy")[0]
CPU = jax.devices("cpu")[0]


@pytest.fixture(autouse=True)
def runtime_errors():
    with config.xla_runtime_errors(True):
        yield


def positive_log(x):
    checkify.check(jnp.all(x > 0), "x must be positive, got {x}", x=x)
    return jnp.log(x)


def loop(x, n):
    def body(i, carry):
        checkify.check(carry < 100.0, "carry {c} too big at step {i}", c=carry, i=i)
        return carry * x

    return jax.lax.fori_loop(0, n, body, jnp.float32(1.0))


def two_checks(x, y):
    checkify.check(x > 0, "first: x={x}", x=x)
    z = x * y
    checkify.check(z < 10, "second: z={z}", z=z)
    return z + 1


def outcome(fn, args, device):
    """('ok', values) or ('error', the error's type, its message's last line)."""
    args = jax.device_put(args, device)
    try:
        out = jax.jit(fn)(*args)
        return ("ok", jax.tree.map(np.asarray, out))
    except Exception as e:  # the error itself is compared
        lines = [line for line in str(e).splitlines() if line.strip()]
        return ("error", type(e), lines[-1])


CASES = [
    ("pass", positive_log, (np.float32([0.5, 2.0, 3.0]),)),
    ("fail", positive_log, (np.float32([0.5, -2.0, 3.0]),)),
    ("loop_pass", loop, (np.float32(1.5), np.int32(5))),
    ("loop_fail", loop, (np.float32(3.0), np.int32(9))),
    ("first_of_two", two_checks, (np.float32(-1.0), np.float32(2.0))),
    ("second_of_two", two_checks, (np.float32(4.0), np.float32(3.0))),
    ("both_pass", two_checks, (np.float32(2.0), np.float32(3.0))),
    ("vmap", jax.vmap(positive_log), (np.float32([[1.0, 2.0], [3.0, -4.0]]),)),
    ("grad", jax.grad(lambda x: positive_log(x).sum()), (np.float32([1.0, -0.5]),)),
    ("grad_pass", jax.grad(lambda x: positive_log(x).sum()), (np.float32([1.0, 0.5]),)),
]


@pytest.mark.parametrize("name,fn,args", CASES, ids=[c[0] for c in CASES])
def test_check_like_cpu(name, fn, args):
    want = outcome(fn, args, CPU)
    got = outcome(fn, args, XLAPY)
    assert got[0] == want[0], (want, got)
    if want[0] == "ok":
        for w, g in zip(jax.tree.leaves(want[1]), jax.tree.leaves(got[1]), strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-6)
    else:
        assert issubclass(got[1], jax.errors.JaxRuntimeError)
        assert got[2].endswith("(`check` failed)")
        assert want[2].split("JaxRuntimeError: ")[-1] in got[2]  # the same message


def test_device_usable_after_a_failed_check():
    fn = jax.jit(positive_log)
    bad = jax.device_put(np.float32([-1.0]), XLAPY)
    with pytest.raises(jax.errors.JaxRuntimeError, match="x must be positive, got"):
        fn(bad).block_until_ready()
    good = np.random.default_rng(5).uniform(0.5, 2.0, 4).astype(np.float32)
    out = fn(jax.device_put(good, XLAPY))
    np.testing.assert_allclose(np.asarray(out), np.log(good), rtol=1e-6)


def test_functionalized_checks_are_unchanged():
    checked = jax.jit(checkify.checkify(positive_log))
    for device in (CPU, XLAPY):
        err, _ = checked(jax.device_put(np.float32([1.0, -1.0]), device))
        assert "x must be positive" in err.get()
        err, out = checked(jax.device_put(np.float32([1.0, 2.0]), device))
        assert err.get() is None
        np.testing.assert_allclose(np.asarray(out), np.log([1.0, 2.0]), rtol=1e-6)


def test_without_the_option_the_error_is_jaxs():
    with config.xla_runtime_errors(False):
        for device in (CPU, XLAPY):
            fresh = jax.jit(lambda x: positive_log(x))  # the option is read when lowering
            with pytest.raises(ValueError, match="not functionalized"):
                fresh(jax.device_put(np.float32([1.0]), device))
