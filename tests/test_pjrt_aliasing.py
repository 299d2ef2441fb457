"""Programs whose outputs are their parameters, donated or not, once or several times, run
through the xlapy plugin as on "cpu" (the same JAX program on both in one process).

Found by JAX's mutable_array_test (`test_custom_vjp_differentiated_ref`,
`test_grad_jit_readonly_2`): reading a ref, `x_ref[...]`, dispatches
`main(%arg0 {tf.aliasing_output = 1}) -> (%arg0, %arg0)` with the ref's buffer donated;
JAX drops the old ref's buffer (output 1, which took over the donated memory) at once,
and when the run was still queued the parameter's memory was freed under it: "parameter 0
expects f32[], got object[]".
"""

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

XLAPY = jax.devices("xlapy")[0]
CPU = jax.devices("cpu")[0]


def on_both(program):
    """program(device) -> a pytree of arrays, run on cpu then xlapy; both results."""
    results = []
    for device in (CPU, XLAPY):
        with jax.default_device(device):
            results.append(jax.tree.map(np.asarray, program(device)))
    return results


def assert_same(want, got):
    for w, g in zip(jax.tree.leaves(want), jax.tree.leaves(got), strict=True):
        np.testing.assert_array_equal(g, w)


def reader():
    @jax.custom_vjp
    def f(x_ref):
        return x_ref[...]

    f.defvjp(lambda x_ref: (f(x_ref), None), lambda _, g: (g,))
    return f


@pytest.mark.parametrize("jit", [False, True])
def test_custom_vjp_reading_a_ref(jit):
    value = np.float32(np.random.default_rng(1).standard_normal())

    def program(device):
        f = jax.jit(reader()) if jit else reader()
        y = f(jax.new_ref(jnp.asarray(value)))
        primal, f_vjp = jax.vjp(lambda x: f(jax.new_ref(x)), jnp.asarray(value))
        (g,) = f_vjp(jnp.float32(1.5))
        assert device in y.devices() and device in g.devices()
        return y, primal, g

    want, got = on_both(program)
    assert_same(want, got)
    np.testing.assert_array_equal(got[0], value)
    np.testing.assert_array_equal(got[2], np.float32(1.5))


def test_grad_of_jit_reading_a_closed_over_ref():
    def f(x):
        x_ref = jax.new_ref(x)

        @jax.jit
        def inner():
            return jnp.sin(x_ref[...])

        return inner()

    def program(device):
        check_grads(f, (1.5,), 2, ["fwd", "rev"])
        return jax.grad(f)(1.5), jax.grad(jax.grad(f))(1.5)

    want, got = on_both(program)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_ref_reads_then_writes_keep_the_values_read():
    rng = np.random.default_rng(2)
    start, update = rng.standard_normal((2, 5)).astype(np.float32)

    def program(device):
        r = jax.new_ref(jnp.asarray(start))
        before = r[...]
        r[...] = jnp.asarray(update)
        after = r[...]
        r[...] += 1.0
        return before, after, r[...]

    want, got = on_both(program)
    assert_same(want, got)
    np.testing.assert_array_equal(got[0], start)
    np.testing.assert_array_equal(got[2], update + 1)


# (program, donate_argnums): outputs that are the parameter itself
CASES = {
    "not_donated_twice": (lambda x: (x, x), ()),
    "not_donated_three_times": (lambda x: (x, x, x), ()),
    "donated_twice": (lambda x: (x, x), (0,)),
    "donated_three_times": (lambda x: (x, x, x), (0,)),
    "donated_once_plus_its_alias": (lambda x: (x, x + 1), (0,)),
    "donated_alias_then_itself": (lambda x: (x * 2, x), (0,)),
    "two_params_crossed": (lambda x, y: (y, x, x), (0, 1)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_parameters_returned_as_outputs(name):
    fn, donate = CASES[name]
    rng = np.random.default_rng(abs(hash(name)) % 2**32)
    hosts = [rng.standard_normal(6).astype(np.float32) for _ in range(fn.__code__.co_argcount)]

    def program(device):
        args = [jax.device_put(h, device) for h in hosts]
        outs = jax.jit(fn, donate_argnums=donate)(*args)
        assert [a.is_deleted() for a in args] == [i in donate for i in range(len(args))]
        values = [np.asarray(o) for o in outs]
        # each output is its own array: donating one to a program that writes it in place
        # changes no other output
        bump = jax.jit(lambda o: o + 100, donate_argnums=0)
        bumped = bump(outs[0])
        return values, [np.asarray(o) for o in outs[1:]], bumped

    want, got = on_both(program)
    assert_same(want, got)


@pytest.mark.parametrize("dropped", [0, 1])
def test_aliased_output_dropped_while_the_run_is_queued(dropped):
    """The race itself, made certain: the device is busy with a program blocked in a host
    callback, the program that returns its donated parameter twice is queued behind it
    (JAX lowers it with `tf.aliasing_output = 0`), and one of its outputs (0: the one that
    took over the parameter's memory) is deleted before it runs."""
    host = np.random.default_rng(3).standard_normal(8).astype(np.float32)
    twice = jax.jit(lambda x: (x, x), donate_argnums=0)

    def program(device):
        gate, started = threading.Event(), threading.Event()

        def wait(x):
            started.set()
            assert gate.wait(60), "gate never opened"
            return x

        blocked = jax.jit(lambda x: jax.pure_callback(wait, x, x) + 1)
        held = []
        worker = threading.Thread(target=lambda: held.append(blocked(jax.device_put(host, device))))
        worker.start()
        assert started.wait(60)
        made = jax.device_put(host, device) * 1.0  # memory of the device's own, donatable
        outs = twice(made)
        outs[dropped].delete()
        gate.set()
        worker.join(60)
        assert not worker.is_alive()
        return outs[1 - dropped], held[0]

    want, got = on_both(program)
    assert_same(want, got)
    np.testing.assert_array_equal(got[0], host)


def test_donating_an_array_numpy_still_views_runs_on_a_copy():
    """`np.asarray(x)` lends x's memory to NumPy (an external reference); donating x then
    keeps x and runs on a copy, as XLA:CPU does (xlapy used to fail the call)."""
    host = np.random.default_rng(4).standard_normal(6).astype(np.float32)

    def program(device):
        x = jax.device_put(host, device) * 2.0
        view = np.asarray(x)
        y = jax.jit(lambda o: o + 100, donate_argnums=0)(x)
        assert not x.is_deleted()
        z = jax.jit(lambda o: o - 1, donate_argnums=0)(x * 1.0)  # no view: donated
        return view.copy(), np.asarray(x), y, z

    want, got = on_both(program)
    assert_same(want, got)
    np.testing.assert_array_equal(got[1], host * 2)
