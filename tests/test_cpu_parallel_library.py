"""Library thunks split over the pool (window_thunk's scans, pooling and select-and-scatter;
conv_thunk's blocks): results equal to the interpreter whether a thunk runs whole or in 2, 3
or 5 blocks (extents smaller than the block count and odd remainders included), several
Python threads running programs that use the pool at once, and the cost model's limits."""

from __future__ import annotations

import re
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from many_threads import run_on_threads

import xlapy
from xlapy.backends.cpu import lowering
from xlapy.backends.cpu.runtime import conv_thunk, pool, window_thunk
from xlapy.backends.interpreter import evaluate
from xlapy.ir.opcodes import Opcode

# a fresh kernel cache: Client.compile loads a program image another compile of the same
# text left (in another run, without this file's lowering patches) and would not lower it
pytestmark = pytest.mark.usefixtures("kernel_cache")


def _maxpool(x):
    return lax.reduce_window(x, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "SAME")


def _avgpool(x):
    return lax.reduce_window(x, 0.0, lax.add, (1, 2, 2, 1), (1, 2, 2, 1), "VALID") / 4


def _conv(x):
    w = jnp.asarray(np.linspace(-1, 1, 3 * 3 * x.shape[-1] * 8, dtype=np.float32))
    w = w.reshape(3, 3, x.shape[-1], 8)
    dims = ("NHWC", "HWIO", "NHWC")
    return lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=dims)


# Prefix scans are native kernels (codegen/emit_scan.py), split like the other kernels
# through their (lo, hi) range: tests/test_cpu_scan_kernel.py checks those splits.
CASES = {
    "maxpool": _maxpool,
    "maxpool_grad": jax.grad(lambda x: jnp.sum(_maxpool(x) ** 2)),
    "avgpool": _avgpool,
    "avgpool_grad": jax.grad(lambda x: jnp.sum(_avgpool(x) ** 2)),
    "conv": _conv,
}
SHAPES = [(1, 5, 6, 3), (3, 7, 9, 2), (5, 8, 8, 4), (7, 17, 16, 5)]


def library_pooling(monkeypatch) -> None:
    """Pooling reduce-windows take the library path split here, not the native kernel
    (codegen/emit_window.py, split through its row range: tests/test_cpu_window_kernel.py),
    and convolutions the library's paths, not a direct kernel (tests/test_cpu_direct_conv.py
    checks those splits)."""
    monkeypatch.setattr(lowering, "direct_geometry", lambda instr: None)
    monkeypatch.setattr(lowering, "arena_geometry", lambda instr: None)
    strategies = lowering.LOWERING[Opcode.REDUCE_WINDOW]
    kept = tuple(s for s in strategies if s.name != "native window")
    monkeypatch.setitem(lowering.LOWERING, Opcode.REDUCE_WINDOW, kept)


def _forced(parts: int, calls: list[int] | None = None):
    """split_over that always cuts into `parts` blocks (whatever the cost model says),
    noting each split's unit count in `calls`."""

    def split_over(units, seconds, body):
        if calls is not None:
            calls.append(units)
        pool.run_blocks(body, pool.even_blocks(units, parts))

    return split_over


def _run(fn, x):
    text = jax.jit(fn).lower(x).as_text()
    client = xlapy.Client("cpu")
    executable = client.compile(text)
    assert not executable._programs[executable._devices[0].id].fallbacks
    ((out,),) = executable.execute([[client.buffer_from_pyval(x)]])
    return np.asarray(out), np.asarray(evaluate(xlapy.load(text), [x]))


def _check(name, got, want):
    if "max" in name and "grad" not in name:
        np.testing.assert_array_equal(got, want)
    else:
        scale = float(np.max(np.abs(want))) + 1.0
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * scale)


@pytest.mark.parametrize("parts", [1, 2, 3, 5])
@pytest.mark.parametrize("name", sorted(CASES))
def test_split_library_thunks_match_the_interpreter(name, parts, monkeypatch):
    library_pooling(monkeypatch)
    calls: list[int] = []
    monkeypatch.setattr(window_thunk, "split_over", _forced(parts, calls))
    monkeypatch.setattr(conv_thunk, "split_run", _forced(parts, calls))
    for i, shape in enumerate(SHAPES):
        rng = np.random.default_rng(1000 * parts + i)
        x = rng.standard_normal(shape).astype(np.float32)
        got, want = _run(CASES[name], x)
        _check(name, got, want)
    assert any(units > 1 for units in calls), "no thunk of the program split"


def test_threads_running_split_programs_at_once(monkeypatch):
    """8 Python threads execute programs whose thunks all split over the same pool."""
    library_pooling(monkeypatch)
    monkeypatch.setattr(window_thunk, "split_over", _forced(3))
    monkeypatch.setattr(conv_thunk, "split_run", _forced(3))
    names = sorted(CASES)
    rng = np.random.default_rng(7)
    inputs = [rng.standard_normal((6, 12, 10, 3)).astype(np.float32) for _ in names]
    client = xlapy.Client("cpu")
    programs = []
    for name, x in zip(names, inputs, strict=True):
        text = jax.jit(CASES[name]).lower(x).as_text()
        want = np.asarray(evaluate(xlapy.load(text), [x]))
        programs.append((name, client.compile(text), client.buffer_from_pyval(x), want))

    def worker(k: int) -> None:
        for r in range(6):
            name, executable, buf, want = programs[(k + r) % len(programs)]
            ((out,),) = executable.execute([[buf]])
            _check(name, np.asarray(out), want)

    run_on_threads(worker, 8)


def test_split_over_from_a_pool_worker_does_not_hang():
    """A block running on a pool worker that itself splits (every worker at once)."""
    workers = pool.pool_size()
    seen = np.zeros(workers * 40, np.int64)
    lock = threading.Lock()

    def leaf(lo, hi):
        with lock:
            seen[lo:hi] += 1

    def outer(k):
        pool.run_blocks(
            lambda lo, hi: leaf(k * 40 + lo, k * 40 + hi), pool.even_blocks(40, workers + 2)
        )

    futures = [pool.default_pool().submit(outer, k) for k in range(workers)]
    for f in futures:
        f.result(timeout=60)
    assert (seen == 1).all()


def test_split_parts_cost_model(monkeypatch):
    monkeypatch.setattr(pool, "pool_size", lambda: 8)
    monkeypatch.setattr(pool, "task_seconds", lambda: 1e-5)
    per_block = pool.MIN_BLOCK_TASKS * 1e-5
    assert pool.split_parts(100, 0.5 * per_block) == 1  # too little work to hand off
    assert pool.split_parts(100, 3.5 * per_block) == 3
    most = pool.BLOCKS_PER_THREAD * 8
    assert pool.split_parts(1000, 1.0) == most  # at most BLOCKS_PER_THREAD per thread
    assert pool.split_parts(1000, 12.5 * per_block) == 12  # the cost model, past the threads
    assert pool.split_parts(5, 1.0) == 5  # at most one block per unit
    assert pool.split_parts(1, 1.0) == 1
    monkeypatch.setattr(pool, "pool_size", lambda: 1)
    assert pool.split_parts(100, 1.0) == 1


def test_measured_costs_are_positive():
    assert pool.byte_seconds() > 0
    assert pool.task_seconds() >= 0


@pytest.mark.parametrize(
    "m,n,parts,want",
    [
        (512, 512, 16, (4, 4)),
        (8192, 32, 16, (16, 1)),
        (32, 8192, 16, (1, 16)),
        (512, 512, 5, (1, 5)),
        (3, 2, 16, (3, 2)),
        (1, 1, 4, (1, 1)),
    ],
)
def test_tile_grid(m, n, parts, want):
    from xlapy.backends.cpu.runtime.dot_thunk import tile_grid

    rows, cols = tile_grid(m, n, parts)
    assert rows * cols <= parts and rows <= m and cols <= n
    assert (rows, cols) == want or rows * cols == want[0] * want[1]


@pytest.mark.parametrize("parts", [2, 3, 4, 5, 16])
@pytest.mark.parametrize("shape", [(200, 96, 300), (37, 500, 530), (130, 900, 47)])
def test_split_gemm_tiles_match_the_interpreter(parts, shape, monkeypatch):
    """A planned gemm split into `parts` tiles (rows, columns or a grid of both) equals the
    interpreter: both SplitChoice ways run (the first runs alternate)."""
    from xlapy.backends.cpu.backend import CpuProgram
    from xlapy.backends.cpu.runtime import dot_thunk
    from xlapy.ir.parser import parse_module

    monkeypatch.setattr(dot_thunk, "pool_size", lambda: parts)
    m, k, n = shape
    text = f"""HloModule tiles

ENTRY main {{
  p0 = f32[{m},{k}] parameter(0)
  p1 = f32[{k},{n}] parameter(1)
  ROOT d = f32[{m},{n}] dot(p0, p1), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
}}
"""
    program = CpuProgram(parse_module(text))
    assert re.search(r"cblas gemm(, subnormals flushed)?, split", program.thunk_listing())
    rng = np.random.default_rng(parts * 1000 + m)
    args = [rng.standard_normal((m, k)).astype(np.float32),
            rng.standard_normal((k, n)).astype(np.float32)]  # fmt: skip
    want = np.asarray(evaluate(parse_module(text), args))
    for _ in range(5):
        got = np.asarray(program.run(args))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("parts", [1, 2, 3, 5])
@pytest.mark.parametrize("shape", [(1, 32, 32, 16), (3, 27, 41, 12)])
def test_banded_convolution_split_within_batch_items(parts, shape, monkeypatch):
    """Fewer batch items than threads: a band-row convolution splits into (item, block of
    output rows) units, equal to the interpreter however they are cut."""
    monkeypatch.setattr(lowering, "direct_geometry", lambda instr: None)  # the BLAS paths
    monkeypatch.setattr(lowering, "arena_geometry", lambda instr: None)
    calls: list[int] = []
    monkeypatch.setattr(conv_thunk, "pool_size", lambda: 16)
    monkeypatch.setattr(conv_thunk, "split_run", _forced(parts, calls))
    x = np.random.default_rng(parts).standard_normal(shape).astype(np.float32)
    got, want = _run(_conv, x)
    _check("conv", got, want)
    assert max(calls) > shape[0], "the convolution did not split within batch items"


# Split kernels run on the native pool (native_pool.py) when there is one.

KERNEL_SHAPES = [(257, 300), (3, 40000), (70001, 1)]


def _kernel_fn(x, y):
    return jnp.tanh(x) * y + jnp.sum(x, axis=1, keepdims=True)


def _kernel_program(shape, seed):
    rng = np.random.default_rng(seed)
    x, y = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
    text = jax.jit(_kernel_fn).lower(x, y).as_text()
    want = np.asarray(evaluate(xlapy.load(text), [x, y]))
    return text, x, y, want


@pytest.mark.parametrize("shape", KERNEL_SHAPES)
def test_native_pool_kernels_match_the_interpreter(shape):
    """Five runs: the first split (SplitChoice's warm-up), then split and whole in turn."""
    text, x, y, want = _kernel_program(shape, sum(shape))
    client = xlapy.Client("cpu")
    executable = client.compile(text)
    listing = executable._programs[executable._devices[0].id].thunk_listing()
    assert "parallel x" in listing
    bufs = [client.buffer_from_pyval(x), client.buffer_from_pyval(y)]
    for _ in range(5):
        ((out,),) = executable.execute([bufs])
        np.testing.assert_allclose(np.asarray(out), want, rtol=2e-5, atol=1e-4)


def test_native_pool_runs_blocks_and_a_busy_pool_runs_whole():
    from xlapy.backends.cpu.runtime.native_pool import native_pool

    pool_obj = native_pool()
    if pool.pool_size() < 2:
        assert pool_obj is None
        return
    assert pool_obj is not None and pool_obj.workers == pool.pool_size() - 1
    with pytest.raises(ValueError, match="native pool"):
        pool_obj.run(0, [], 10, 2)


def test_runtime_helpers_come_from_the_installed_compiler(monkeypatch):
    """The runtime compiles nothing itself: the package installs the jit's compiler of its
    helpers, and a runtime without one says so instead of failing somewhere deeper."""
    from xlapy.backends.cpu.jit.native_helpers import JitNativeCode
    from xlapy.backends.cpu.runtime import native_code

    assert isinstance(native_code.native_code(), JitNativeCode)
    monkeypatch.setattr(native_code, "_installed", [])
    with pytest.raises(RuntimeError, match="need a compiler"):
        native_code.native_code()


def test_native_pool_with_8_threads_and_from_pool_workers():
    """8 Python threads, and every Python pool worker, execute split kernels at once: each
    call runs on the native pool or, finding it taken, whole on its own thread."""
    programs = [_kernel_program(shape, 3 + i) for i, shape in enumerate(KERNEL_SHAPES)]
    client = xlapy.Client("cpu")
    loaded = []
    for text, x, y, want in programs:
        bufs = [client.buffer_from_pyval(x), client.buffer_from_pyval(y)]
        loaded.append((client.compile(text), bufs, want))

    def execute(k: int) -> None:
        for r in range(8):
            executable, bufs, want = loaded[(k + r) % len(loaded)]
            ((out,),) = executable.execute([bufs])
            np.testing.assert_allclose(np.asarray(out), want, rtol=2e-5, atol=1e-4)

    futures = [pool.default_pool().submit(execute, k) for k in range(pool.pool_size())]
    errors: list[BaseException] = []

    def thread(k: int) -> None:
        try:
            execute(k)
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=thread, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for f in futures:
        f.result(timeout=120)
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert not errors, errors[0]


_CHILD = """
import numpy as np, jax, jax.numpy as jnp, xlapy
from xlapy.backends.cpu.runtime import native_pool, pool
rng = np.random.default_rng(5)
x, y = (rng.standard_normal((301, 257)).astype(np.float32) for _ in range(2))
fn = lambda x, y: jnp.tanh(x) * y + jnp.sum(x, axis=1, keepdims=True)
client = xlapy.Client("cpu")
ex = client.compile(jax.jit(fn).lower(x, y).as_text())
bufs = [client.buffer_from_pyval(x), client.buffer_from_pyval(y)]
want = np.tanh(x) * y + x.sum(axis=1, keepdims=True)
for _ in range(5):
    ((out,),) = ex.execute([bufs])
    np.testing.assert_allclose(np.asarray(out), want, rtol=2e-5, atol=1e-4)
p = native_pool.native_pool()
print(pool.pool_size(), 0 if p is None else p.workers)
"""


@pytest.mark.parametrize("threads", [1, 3, 5])
def test_native_pool_in_a_process_with_n_threads_exits_cleanly(threads):
    """XLAPY_NUM_THREADS=N: N - 1 workers, right results, and an exit with the workers
    alive that neither crashes nor hangs."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, XLAPY_NUM_THREADS=str(threads), JAX_PLATFORMS="cpu")
    done = subprocess.run(
        [sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-2:] == [str(threads), str(threads - 1 if threads > 1 else 0)]
