"""The per-iteration cost of native loops (codegen/emit_loop.py): kernels called with the
flush mode set once around the loop (`LoopCall.flushed`: they leave the MXCSR alone), and
small kernels compiled into the loop's function (option inline_loop_kernels,
`LoopCall.inline`). The loop programs of test_cpu_native_loops on fresh random inputs give
the same bits with the loop in Python, native, and native with its kernels compiled in;
0, 1 and many trips; subnormals flushed or kept as the kernels called on their own do, with
the caller's floating-point mode restored after the loop; a kernel above the size limit
stays a call."""

from __future__ import annotations

import zlib

import jax
import numpy as np
import pytest
from jax import lax
from test_cpu_native_loops import CASES, compile_text, leaves, lowered, while_thunks

from xlapy.backends.cpu.lowering import INLINE_MAX_ELEMENTS
from xlapy.backends.interpreter import evaluate
from xlapy.ir.parser import parse_module

pytestmark = pytest.mark.usefixtures("kernel_cache")


def table_sizes(program) -> list[int]:
    loops = while_thunks(program.compiled.entry)
    assert loops and all(w.native is not None for w in loops), program.thunk_listing()
    return [len(w.native.entries) for w in loops]


def run(program, args) -> list[np.ndarray]:
    return leaves(program.run([np.asarray(a) for a in jax.tree_util.tree_leaves(args)]))


def inlining(text: str, **options):
    return compile_text(text, inline_loop_kernels=True, **options)


@pytest.mark.parametrize("name", list(CASES))
def test_kernels_compiled_into_the_loop_give_the_same_bits(name):
    fn, make = CASES[name]
    args = make(np.random.default_rng(zlib.crc32(b"inline " + name.encode())))
    text = lowered(fn, args)
    inlined, called = inlining(text), compile_text(text)
    python = compile_text(text, native_loops=False)
    assert sum(table_sizes(inlined)) < sum(table_sizes(called))
    want = run(python, args)
    for program in (called, inlined):
        for a, b in zip(run(program, args), want, strict=True):
            np.testing.assert_array_equal(a, b)


def counted(x, n):
    def cond(s):
        return s[0] < n

    return lax.while_loop(cond, lambda s: (s[0] + 1, s[1] * 0.75 + 0.5), (np.int32(0), x))


@pytest.mark.parametrize("trips", [0, 1, 2, 1000])
def test_zero_one_and_many_trips(trips):
    x = np.random.default_rng(trips).standard_normal(8).astype(np.float32)
    text = lowered(counted, (x, np.int32(trips)))
    program = inlining(text)
    assert table_sizes(program) == [0]  # the compare, the counter and the update compiled in
    got = program.run([x, np.int32(trips)])
    want = evaluate(parse_module(text), [x, np.int32(trips)])
    assert int(got[0]) == int(want[0]) == trips
    np.testing.assert_allclose(got[1], want[1], rtol=1e-6, atol=1e-6)


def halve(x):
    return lax.fori_loop(0, 30, lambda i, v: v * 0.5 + v * 0.25, x)


@pytest.mark.parametrize("denormals", ["flush", "ieee"])
def test_subnormals_as_the_called_kernels_and_the_mode_restored(denormals):
    rng = np.random.default_rng(5)
    x = (rng.uniform(1, 2, 16) * 1e-37).astype(np.float32)  # ~1e-41 (subnormal) after 30 trips
    text = lowered(halve, (x,))
    inlined = inlining(text, denormals=denormals)
    called = compile_text(text, denormals=denormals)
    python = compile_text(text, denormals=denormals, native_loops=False)
    assert table_sizes(inlined) == [0]
    got = inlined.run([x])
    np.testing.assert_array_equal(got, called.run([x]))
    np.testing.assert_array_equal(got, python.run([x]))
    if denormals == "flush":
        assert not np.any(got)
    else:
        assert np.all(got) and np.all(got < np.finfo(np.float32).tiny)
        np.testing.assert_array_equal(got, evaluate(parse_module(text), [x]))
    tiny = np.float32(1e-39)
    assert tiny * np.float32(1.0) == tiny  # this thread keeps IEEE subnormals after the loop


def small_and_large(x, y):
    def body(i, s):
        a, b = s
        return a * 0.5 + 1.0, b * 0.999 + a[0]

    return lax.fori_loop(0, 7, body, (x, y))


def test_a_kernel_above_the_size_limit_stays_a_call():
    rng = np.random.default_rng(11)
    x = rng.standard_normal(4).astype(np.float32)
    y = rng.standard_normal(INLINE_MAX_ELEMENTS + 64).astype(np.float32)
    text = lowered(small_and_large, (x, y))
    program = inlining(text)
    assert table_sizes(program) == [1], program.thunk_listing()
    called = compile_text(text)
    for a, b in zip(leaves(program.run([x, y])), leaves(called.run([x, y])), strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_loop_from_the_disk_cache_runs_the_same():
    x = np.random.default_rng(2).standard_normal(8).astype(np.float32)
    text = lowered(counted, (x, np.int32(50)))
    first = inlining(text).run([x, np.int32(50)])
    again = inlining(text).run([x, np.int32(50)])
    np.testing.assert_array_equal(first[1], again[1])
