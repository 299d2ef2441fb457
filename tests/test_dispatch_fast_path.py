"""The short dispatch path of a cheap one-device call, end to end: a CPU program that is
native kernels in a row calls them directly and reports a fixed cost; the runtime runs
such a program inline from its first call without timing it; the PJRT plugin's Execute
hands such a call to `LoadedExecutable.execute_inline` and answers with the shared
completed event. Everything else (donation, errors, tuples, loops) keeps the general path,
and the answers are the interpreter's either way."""

import threading

import jax
import numpy as np
import pytest

from xlapy.backends.base import PROFILE
from xlapy.backends.interpreter.evaluator import evaluate
from xlapy.ir.parser import parse_module
from xlapy.pjrt import abi, capi, core
from xlapy.pjrt.executables import PExecutable, executable_of
from xlapy.runtime import Client, CompileOptions
from xlapy.runtime.execution import FIXED_CHEAP_SECONDS

XLAPY = jax.devices("xlapy")[0]

TWO_KERNELS = """HloModule two
ENTRY e {
  x = f32[16] parameter(0)
  y = f32[16] parameter(1)
  s = f32[16] add(x, y)
  m = f32[16] multiply(x, y)
  ROOT t = (f32[16], f32[16]) tuple(s, m)
}"""

ELEMENTWISE = """HloModule ew
ENTRY e {
  x = f32[8] parameter(0)
  c = f32[] constant(1.5)
  b = f32[8] broadcast(c), dimensions={}
  ROOT r = f32[8] multiply(x, b)
}"""

LOOP = """HloModule loop
cond {
  cp = (s32[], f32[4]) parameter(0)
  ci = s32[] get-tuple-element(cp), index=0
  n = s32[] constant(3)
  ROOT lt = pred[] compare(ci, n), direction=LT
}
body {
  p = (s32[], f32[4]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  v = f32[4] get-tuple-element(p), index=1
  one = s32[] constant(1)
  j = s32[] add(i, one)
  w = f32[4] add(v, v)
  ROOT t = (s32[], f32[4]) tuple(j, w)
}
ENTRY e {
  x = f32[4] parameter(0)
  z = s32[] constant(0)
  init = (s32[], f32[4]) tuple(z, x)
  r = (s32[], f32[4]) while(init), condition=cond, body=body
  ROOT out = f32[4] get-tuple-element(r), index=1
}"""


def _random(rng, n):
    return rng.standard_normal(n).astype(np.float32)


# -- backend ----------------------------------------------------------------------------------
@pytest.mark.parametrize("text,shapes", [(ELEMENTWISE, [8]), (TWO_KERNELS, [16, 16])])
def test_straight_line_kernels_match_the_interpreter(text, shapes):
    client = Client("cpu")
    exe = client.compile(text)
    program = exe.backend_program()
    assert program.fixed_cost_seconds is not None
    assert 0 < program.fixed_cost_seconds < FIXED_CHEAP_SECONDS
    rng = np.random.default_rng(11)
    args = [_random(rng, n) for n in shapes]
    want = evaluate(parse_module(text), args)
    got = program.run(args)
    pairs = zip(*((v,) if not isinstance(v, tuple) else v for v in (got, want)), strict=True)
    for g, w in pairs:
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6)


def test_a_loop_has_no_fixed_cost_and_is_timed():
    client = Client("cpu")
    exe = client.compile(LOOP)
    assert exe.backend_program().fixed_cost_seconds is None
    x = _random(np.random.default_rng(2), 4)
    [out] = exe.execute([[client.buffer_from_pyval(x)]])[0]
    np.testing.assert_allclose(out.to_numpy(), x * 8, rtol=1e-6)
    assert exe._signature.last_run_seconds is not None  # timed to decide on inline runs


def test_thunk_profiling_still_sees_the_kernels():
    client = Client("cpu")
    program = client.compile(ELEMENTWISE).backend_program()
    seen = []

    class Recorder:
        def run_sequence(self, name, thunks, run):
            for thunk in thunks:
                seen.append(thunk.kind)
                run(thunk)

    token = PROFILE.set(Recorder())
    try:
        x = _random(np.random.default_rng(5), 8)
        np.testing.assert_allclose(program.run([x]), x * 1.5, rtol=1e-6)
    finally:
        PROFILE.reset(token)
    assert seen == ["kernel"]


# -- runtime ----------------------------------------------------------------------------------
def test_fixed_cost_program_runs_inline_from_its_first_call_untimed():
    client = Client("cpu")
    exe = client.compile(ELEMENTWISE)
    x = _random(np.random.default_rng(7), 8)
    buf = client.buffer_from_pyval(x)
    outputs = exe.execute_inline([buf])
    assert outputs is not None  # no earlier run was needed to call it cheap
    [out] = outputs
    assert out.ready().done()
    np.testing.assert_allclose(out.to_numpy(), x * 1.5, rtol=1e-6)
    assert exe._signature.last_run_seconds is None  # not timed
    np.testing.assert_array_equal(buf.to_numpy(), x)  # the input is untouched


def test_execute_inline_declines_what_it_cannot_run():
    client = Client("cpu")
    exe = client.compile(ELEMENTWISE)
    buf = client.buffer_from_pyval(_random(np.random.default_rng(8), 8))
    wrong = client.buffer_from_pyval(np.zeros(4, np.float32) + 1)
    assert exe.execute_inline([wrong]) is None  # the general path reports the error
    assert exe.execute_inline([buf, buf]) is None
    assert exe.execute_inline([np.ones(8, np.float32)]) is None
    buf.delete()
    assert exe.execute_inline([buf]) is None
    pair = Client("cpu", device_count=2)
    two = pair.compile(ELEMENTWISE, CompileOptions.make(num_replicas=2))
    b0 = pair.buffer_from_pyval(np.ones(8, np.float32), two.addressable_devices[0])
    assert two.execute_inline([b0]) is None  # two devices: the general path


def test_execute_inline_from_many_threads():
    client = Client("cpu")
    exe = client.compile(TWO_KERNELS)
    rng = np.random.default_rng(9)
    pairs = [(_random(rng, 16), _random(rng, 16)) for _ in range(8)]
    bufs = [(client.buffer_from_pyval(a), client.buffer_from_pyval(b)) for a, b in pairs]
    errors = []

    def work(k):
        a, b = pairs[k]
        try:
            for _ in range(200):
                s, m = exe.execute([list(bufs[k])])[0]
                np.testing.assert_allclose(s.to_numpy(), a + b, rtol=1e-6)
                np.testing.assert_allclose(m.to_numpy(), a * b, rtol=1e-6)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert client.devices()[0].memory_stats().live_allocations == 16  # the inputs alone


# -- PJRT plugin ------------------------------------------------------------------------------
def _live_buffers():
    from xlapy.pjrt.buffers import PBuffer

    return sum(isinstance(o, PBuffer) for o in list(core.OBJECTS.values()))


def test_jit_through_the_fast_path_matches_xla_cpu():
    rng = np.random.default_rng(13)
    fn = jax.jit(lambda a, b: (a + b, a * b - 1.0))
    a, b = _random(rng, 32), _random(rng, 32)
    xa, xb = jax.device_put(a, XLAPY), jax.device_put(b, XLAPY)
    want = fn(a, b)  # on XLA:CPU
    for _ in range(3):
        got = fn(xa, xb)
        for g, w in zip(got, want, strict=True):
            assert g.devices() == {XLAPY}
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6)
    compiled = executable_of(fn.lower(xa, xb).compile())
    assert compiled.backend_program().fixed_cost_seconds is not None  # took the short path


def test_jit_outputs_are_freed_when_dropped():
    fn = jax.jit(lambda a: a * 2.0 + 1.0)
    x = jax.device_put(_random(np.random.default_rng(14), 64), XLAPY)
    fn(x).block_until_ready()
    before = _live_buffers()
    for _ in range(500):
        fn(x)
    assert _live_buffers() <= before + 1


def test_donation_still_invalidates_through_jit():
    fn = jax.jit(lambda a, b: a + b, donate_argnums=0)
    rng = np.random.default_rng(15)
    a, b = _random(rng, 16), _random(rng, 16)
    xa, xb = jax.device_put(a, XLAPY), jax.device_put(b, XLAPY)
    out = fn(xa, xb)
    np.testing.assert_allclose(np.asarray(out), a + b, rtol=1e-6)
    assert xa.is_deleted()
    assert not xb.is_deleted()
    with pytest.raises(RuntimeError, match=r"deleted|donated"):
        np.asarray(xa)


def test_a_deleted_argument_is_still_an_error():
    fn = jax.jit(lambda a: a + 1.0)
    x = jax.device_put(_random(np.random.default_rng(16), 8), XLAPY)
    fn(x).block_until_ready()
    x.delete()
    with pytest.raises(RuntimeError, match="deleted"):
        fn(x)


def test_jit_from_many_threads():
    fn = jax.jit(lambda a, b: a * b + a)
    rng = np.random.default_rng(17)
    inputs = [(_random(rng, 24), _random(rng, 24)) for _ in range(6)]
    placed = [(jax.device_put(a, XLAPY), jax.device_put(b, XLAPY)) for a, b in inputs]
    fn(*placed[0]).block_until_ready()
    errors = []

    def work(k):
        a, b = inputs[k]
        try:
            for _ in range(150):
                np.testing.assert_allclose(np.asarray(fn(*placed[k])), a * b + a, rtol=1e-6)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_a_failing_run_raises_through_jax(monkeypatch):
    fn = jax.jit(lambda a: a * 3.0 - 2.0)
    x = jax.device_put(_random(np.random.default_rng(18), 8), XLAPY)
    compiled = executable_of(fn.lower(x).compile())
    program = compiled.backend_program()
    np.testing.assert_allclose(np.asarray(fn(x)), np.asarray(x) * 3.0 - 2.0, rtol=1e-6)

    def broken(values, donated=frozenset(), collectives=None):
        raise FloatingPointError("kernel fault injected by the test")

    monkeypatch.setattr(program, "run", broken)
    for e in list(core.OBJECTS.values()):  # the native Execute never calls `run`: off
        if isinstance(e, PExecutable) and e.loaded and e.info.executable is compiled:
            monkeypatch.setattr(e.c, "fast", abi.ffi.NULL)
    with pytest.raises(Exception, match="kernel fault injected by the test"):
        np.asarray(fn(x))
    monkeypatch.undo()
    np.testing.assert_allclose(np.asarray(fn(x)), np.asarray(x) * 3.0 - 2.0, rtol=1e-6)


def test_a_null_argument_is_a_pjrt_error():
    fn = jax.jit(lambda a: a + 1.0)
    x = jax.device_put(_random(np.random.default_rng(19), 8), XLAPY)
    compiled = executable_of(fn.lower(x).compile())
    fn(x).block_until_ready()
    loaded = next(
        o
        for o in list(core.OBJECTS.values())
        if isinstance(o, PExecutable) and o.loaded and o.info.executable is compiled
    )
    ffi = abi.ffi
    api = ffi.cast("PJRT_Api *", capi.api_pointer())
    execute = ffi.cast(
        "PJRT_Error *(*)(PJRT_LoadedExecutable_Execute_Args *)",
        api.slots[abi.SLOTS.index("LoadedExecutable_Execute")],
    )
    args = ffi.new("PJRT_LoadedExecutable_Execute_Args *")
    args.struct_size = ffi.sizeof("PJRT_LoadedExecutable_Execute_Args")
    args.executable = loaded.c
    row = ffi.new("PJRT_Buffer *[]", 1)  # NULL
    lists = ffi.new("PJRT_Buffer * const *[]", [row])
    outs = ffi.new("PJRT_Buffer *[]", 1)
    out_lists = ffi.new("PJRT_Buffer **[]", [outs])
    args.argument_lists, args.output_lists = lists, out_lists
    args.num_devices, args.num_args = 1, 1
    err = execute(args)
    assert err != ffi.NULL
    assert err.code == core.INVALID_ARGUMENT
    assert (
        "argument 0 is not a live xlapy PJRT buffer"
        in ffi.string(err.message, err.message_size).decode()
    )
    assert outs[0] == ffi.NULL


@pytest.mark.parametrize("writeable", [True, False])
def test_address_of_read_only_and_writable_arrays(writeable):
    from xlapy.backends.cpu.runtime.thunk import address

    rng = np.random.default_rng(20)
    arrays = [
        rng.standard_normal(8).astype(np.float32),
        rng.standard_normal((3, 4))[1:],
        np.zeros(0, np.float32),
        rng.standard_normal(10)[::2],  # not contiguous: NumPy's own answer
    ]
    for a in arrays:
        view = a.view()
        view.flags.writeable = writeable
        assert address(view) == view.ctypes.data
