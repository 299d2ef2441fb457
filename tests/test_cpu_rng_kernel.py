"""The native rng-bit-generator kernel (codegen/emit_rng.py) against the interpreter's rule
(itself bit-exact with XLA, tests/test_interp_rng.py) and XLA: every algorithm, state size,
bits type and a table of shapes (three-fry's split dimension even, odd, last), a wrapping
counter and the philox carry, large outputs split over the kernel's tiles."""

from __future__ import annotations

import itertools

import jax
import ml_dtypes
import numpy as np
import pytest
from jax import lax

from xlapy.backends import execute
from xlapy.backends.cpu.backend import CpuProgram
from xlapy.backends.cpu.codegen.emit_rng import emit_rng, rng_reason
from xlapy.backends.cpu.jit.kernel import Kernel
from xlapy.backends.interpreter import evaluate
from xlapy.ir.parser import parse_module

pytestmark = pytest.mark.usefixtures("kernel_cache")

RNG = np.random.default_rng(20261127)
ALGORITHMS = ["rng_three_fry", "rng_philox", "rng_default"]
TYPES = ["u8", "s16", "u32", "f32", "u64", "s64", "bf16"]
SHAPES = [(), (1,), (5,), (8,), (3, 7), (4, 6), (2, 3, 5), (3, 4, 6), (1031,), (33, 65), (3, 1),
          (5, 3), (7, 5, 3)]  # fmt: skip


def _module(algorithm, words, t, shape):
    dims = ",".join(map(str, shape))
    return f"""HloModule r
ENTRY e {{
  s = u64[{words}]{{0}} parameter(0)
  ROOT r = (u64[{words}]{{0}}, {t}[{dims}]) rng-bit-generator(s), algorithm={algorithm}
}}"""


def _bits(a):
    a = np.ascontiguousarray(a)
    return a if a.dtype.kind in "biu" else a.view(f"u{a.dtype.itemsize}")


def _check(text, state):
    listing = CpuProgram(parse_module(text)).thunk_listing()
    lines = [line.strip() for line in listing.splitlines() if "= rng-bit-generator" in line]
    assert lines and all(line.startswith("kernel") for line in lines), listing
    got = execute(parse_module(text), [state], "cpu")
    want = evaluate(parse_module(text), [state])
    for g, w in zip(got, want, strict=True):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(_bits(g), _bits(w))
    return got


@pytest.mark.parametrize(("algorithm", "t"), itertools.product(ALGORITHMS, TYPES))
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_kernel_matches_the_rule(algorithm, t, shape):
    state = RNG.integers(0, 2**63, size=2, dtype=np.uint64)
    _check(_module(algorithm, 2, t, shape), state)


@pytest.mark.parametrize("algorithm", ["rng_three_fry", "rng_philox"])
def test_counter_wraps(algorithm):
    state = np.array([0x0123456789ABCDEF, 2**64 - 3], np.uint64)
    _check(_module(algorithm, 2, "u32", (4, 9)), state)


def test_philox_three_word_state_carries():
    state = np.array([0x1234567890ABCDEF, 0xFFFFFFFFFFFFFFFE, 0x42], np.uint64)
    new_state, bits = _check(_module("rng_philox", 3, "u32", (7,)), state)
    want = [2762751903, 2754971893, 3505153807, 2120519428, 4020337074, 2853511149, 3942579033]
    np.testing.assert_array_equal(np.asarray(bits), np.array(want, np.uint32))  # XLA's numbers
    np.testing.assert_array_equal(np.asarray(new_state), [0x1234567890ABCDEF, 0, 0x43])


@pytest.mark.parametrize("algorithm", ["rng_three_fry", "rng_philox"])
def test_jax_program_matches_xla(algorithm):
    key = RNG.integers(0, 2**32, size=4, dtype=np.uint32)
    alg = {"rng_three_fry": lax.RandomAlgorithm.RNG_THREE_FRY}.get(
        algorithm, lax.RandomAlgorithm.RNG_PHILOX
    )

    def fn(k):
        return lax.rng_bit_generator(k, (64, 130), np.uint32, algorithm=alg)

    text = jax.jit(fn).lower(key).as_text(dialect="hlo")
    got = execute(parse_module(text), [key], "cpu")
    want = jax.jit(fn)(key)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


@pytest.mark.parametrize("algorithm", ["rng_three_fry", "rng_philox"])
def test_tiles_in_pieces_equal_the_whole(algorithm):
    text = _module(algorithm, 2, "u32", (100, 101))
    instr = parse_module(text).entry_computation().root_instruction()
    spec = emit_rng(instr)
    assert spec.outer_extent > 3
    kernel = Kernel(spec, "rng")
    state = RNG.integers(0, 2**63, size=2, dtype=np.uint64)
    outs = [(np.zeros(2, np.uint64), np.zeros((100, 101), np.uint32)) for _ in range(2)]
    kernel.run_raw([outs[0][0].ctypes.data, outs[0][1].ctypes.data, state.ctypes.data])
    bounds = np.linspace(0, spec.outer_extent, 4).astype(int)
    for lo, hi in itertools.pairwise(bounds):
        ptrs = [outs[1][0].ctypes.data, outs[1][1].ctypes.data, state.ctypes.data]
        kernel.run_raw(ptrs, lo, hi)
    np.testing.assert_array_equal(outs[0][1], outs[1][1])
    np.testing.assert_array_equal(outs[0][0], outs[1][0])
    want_state, want_bits = evaluate(parse_module(text), [state])
    np.testing.assert_array_equal(outs[0][1], want_bits)
    np.testing.assert_array_equal(outs[0][0], want_state)


def test_declines_what_it_cannot_make():
    bad = _module("rng_three_fry", 3, "u32", (4,))
    assert "state" in rng_reason(parse_module(bad).entry_computation().root_instruction())
    layout = _module("rng_philox", 2, "u32", (4, 6)).replace("u32[4,6]", "u32[4,6]{0,1}")
    reason = rng_reason(parse_module(layout).entry_computation().root_instruction())
    assert reason is not None and "layout" in reason


def test_bf16_bits_are_raw_bits():
    """Bits of a 16-bit float type are the low 16 bits of the words, NaN patterns included."""
    state = np.array([7, 9], np.uint64)
    _, bits = _check(_module("rng_philox", 2, "bf16", (40,)), state)
    assert np.asarray(bits).dtype == ml_dtypes.bfloat16
