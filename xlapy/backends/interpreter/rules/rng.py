"""Random numbers: rng-bit-generator (bit-exact with XLA), rng and rng-get-and-update-state.

rng-bit-generator is a counter-based generator: the state operand (u64 words) holds a key
and a counter, the result is (new state, bits). A block i encrypts counter + i and the
counter advances by the number of blocks used:

- three-fry (Threefry-2x32, 20 rounds): key = state[0], counter = state[1]; a block yields
  two words. 32-bit results pair the two words along the first even-sized dimension (else
  the first largest one, padded: u32[3,1] pairs along dimension 0 and advances the counter
  by 2, as XLA does); 64-bit results take one block per element, (low, high) words.
- philox (Philox-4x32, 10 rounds; also what rng_default means on CPU): key = state[0]; the
  128-bit counter is (state[1], state[2]) as (low, high) halves, and with a two-word state
  the high half is state[0] itself, as in XLA. Blocks yield four words each, laid out
  row-major; 64-bit results take two consecutive words (low first).

Types narrower than 32 bits keep the low bits of the 32-bit result. All of it was checked
bit for bit against XLA on CPU (jax 0.10.2).

The legacy `rng` op draws from the run's NumPy generator: XLA leaves its numbers
unspecified, so only the distribution is promised.
"""

from __future__ import annotations

import math

import numpy as np

from xlapy.backends.interpreter.registry import evaluates
from xlapy.errors import EvaluationError
from xlapy.ir.opcodes import Opcode
from xlapy.ir.types import PrimitiveType

_LOW32 = np.uint64(0xFFFFFFFF)
_THREEFRY_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_THREEFRY_PARITY = np.uint32(0x1BD11BDA)
_PHILOX_MULTIPLIERS = (np.uint64(0xD2511F53), np.uint64(0xCD9E8D57))
_PHILOX_KEY_STEPS = (np.uint32(0x9E3779B9), np.uint32(0xBB67AE85))


def _split(words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """u64 words -> (low, high) u32 halves."""
    return (words & _LOW32).astype(np.uint32), (words >> np.uint64(32)).astype(np.uint32)


def _rotate_left(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def threefry2x32(key: tuple[np.ndarray, np.ndarray], x0: np.ndarray, x1: np.ndarray):
    """Threefry-2x32 with 20 rounds on the word pairs (x0, x1); returns the cipher pair."""
    k0, k1 = key
    schedule = (k0, k1, _THREEFRY_PARITY ^ k0 ^ k1)
    with np.errstate(over="ignore"):
        x0 = x0 + k0
        x1 = x1 + k1
        for i in range(5):
            for r in _THREEFRY_ROTATIONS[i % 2]:
                x0 = x0 + x1
                x1 = _rotate_left(x1, r) ^ x0
            x0 = x0 + schedule[(i + 1) % 3]
            x1 = x1 + schedule[(i + 2) % 3] + np.uint32(i + 1)
    return x0, x1


def philox4x32(key: tuple[np.ndarray, np.ndarray], counter: tuple[np.ndarray, ...]):
    """Philox-4x32 with 10 rounds on counter words (c0, c1, c2, c3); returns four words."""
    k0, k1 = key
    c0, c1, c2, c3 = counter
    m0, m1 = _PHILOX_MULTIPLIERS
    with np.errstate(over="ignore"):
        for _ in range(10):
            lo0, hi0 = _split(c0.astype(np.uint64) * m0)
            lo1, hi1 = _split(c2.astype(np.uint64) * m1)
            c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
            k0 = k0 + _PHILOX_KEY_STEPS[0]
            k1 = k1 + _PHILOX_KEY_STEPS[1]
    return c0, c1, c2, c3


def _threefry_u32(state: np.ndarray, dims: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """u32 bits shaped `dims` (and the new state) from a u64[2] three-fry state.

    One block yields a pair of words, placed next to each other along a split dimension:
    the first even-sized dimension, else the first largest one (padded to even, the pad
    dropped).
    Blocks are numbered row-major over the shape with that dimension halved.
    """
    dims = dims or (1,)
    split = next((d for d, size in enumerate(dims) if size % 2 == 0), dims.index(max(dims)))
    half = (*dims[:split], -(-dims[split] // 2), *dims[split + 1 :])
    blocks = math.prod(half)
    key = _split(state[0])
    with np.errstate(over="ignore"):
        counter = state[1] + np.arange(blocks, dtype=np.uint64)
        new_state = np.array([state[0], state[1] + np.uint64(blocks)], np.uint64)
    x0, x1 = threefry2x32(key, *_split(counter))
    paired = np.stack([x0.reshape(half), x1.reshape(half)], axis=split + 1)
    bits = paired.reshape(*dims[:split], 2 * half[split], *dims[split + 1 :])
    return bits[(slice(None),) * split + (slice(0, dims[split]),)], new_state


def _threefry_u64(state: np.ndarray, dims: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """u64 bits shaped `dims` from a three-fry state: one block per element, words (lo, hi)."""
    count = math.prod(dims)
    key = _split(state[0])
    with np.errstate(over="ignore"):
        counter = state[1] + np.arange(count, dtype=np.uint64)
        new_state = np.array([state[0], state[1] + np.uint64(count)], np.uint64)
    x0, x1 = threefry2x32(key, *_split(counter))
    return (x0.astype(np.uint64) | (x1.astype(np.uint64) << np.uint64(32))), new_state


def _philox_words(state: np.ndarray, nwords: int) -> tuple[np.ndarray, np.ndarray]:
    """`nwords` u32 words (and the new state) from a u64[2] or u64[3] philox state."""
    blocks = -(-nwords // 4)
    key = _split(state[0])
    low, high = state[1], state[2] if len(state) == 3 else state[0]
    with np.errstate(over="ignore"):
        counter_low = low + np.arange(blocks, dtype=np.uint64)
        counter_high = high + (counter_low < low).astype(np.uint64)
        new_state = state.copy()
        new_state[1] = low + np.uint64(blocks)
        if len(state) == 3:
            new_state[2] = high + (new_state[1] < low).astype(np.uint64)
    words = philox4x32(key, (*_split(counter_low), *_split(counter_high)))
    return np.stack(words, axis=1).reshape(-1)[:nwords], new_state


def _philox_u32(state: np.ndarray, dims: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    words, new_state = _philox_words(state, math.prod(dims))
    return words, new_state


def _philox_u64(state: np.ndarray, dims: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    words, new_state = _philox_words(state, 2 * math.prod(dims))
    pairs = words.reshape(-1, 2).astype(np.uint64)
    return pairs[:, 0] | (pairs[:, 1] << np.uint64(32)), new_state


# algorithm -> (32-bit generator, 64-bit generator, accepted state sizes)
_ALGORITHMS = {
    "rng_three_fry": (_threefry_u32, _threefry_u64, (2,)),
    "rng_philox": (_philox_u32, _philox_u64, (2, 3)),
    "rng_default": (_philox_u32, _philox_u64, (2, 3)),
}


def random_bits(algorithm: str, state: np.ndarray, element_type: PrimitiveType, dims):
    """(new state, bits of `element_type` shaped `dims`) as rng-bit-generator computes them.

    Types narrower than 32 bits take the low bits of the 32-bit result of the same shape.
    """
    dims = tuple(dims)
    gen32, gen64, _ = _ALGORITHMS[algorithm]
    if element_type.bits == 64:
        bits, new_state = gen64(state, dims)
    else:
        bits, new_state = gen32(state, dims)
    unsigned = np.dtype(f"u{element_type.byte_size}")
    bits = np.asarray(bits).astype(unsigned).view(element_type.dtype)
    return new_state, bits.reshape(dims)


@evaluates(Opcode.RNG_BIT_GENERATOR)
def _rng_bit_generator(instr, operands, ctx):
    algorithm = instr.rng_algorithm
    if algorithm not in _ALGORITHMS:
        raise EvaluationError(
            f"{instr.name}: unknown rng-bit-generator algorithm '{algorithm}' (expected one "
            f"of {', '.join(_ALGORITHMS)})"
        )
    (state,) = operands
    sizes = _ALGORITHMS[algorithm][2]
    if state.dtype != np.uint64 or state.ndim != 1 or state.shape[0] not in sizes:
        want = " or ".join(f"u64[{s}]" for s in sizes)
        raise EvaluationError(
            f"{instr.name}: {algorithm} needs a {want} state, got {state.dtype}{list(state.shape)}"
        )
    shape = instr.shape
    if not shape.is_tuple or len(shape.tuple_shapes) != 2:
        raise EvaluationError(f"{instr.name}: rng-bit-generator must return (state, bits)")
    bits_shape = shape.tuple_shapes[1]
    if bits_shape.element_type.bits not in (8, 16, 32, 64) or bits_shape.element_type.is_pred:
        raise EvaluationError(
            f"{instr.name}: rng-bit-generator cannot produce {bits_shape.element_type.text} "
            "bits (expected an 8, 16, 32 or 64-bit type)"
        )
    new_state, bits = random_bits(algorithm, state, bits_shape.element_type, bits_shape.dims)
    return new_state, bits


@evaluates(Opcode.RNG)
def _rng(instr, operands, ctx):
    distribution = instr.rng_distribution
    shape = instr.shape
    generator: np.random.Generator = ctx.state["rng"]
    a, b = (np.asarray(x) for x in operands)
    etype = shape.element_type
    if distribution == "rng_uniform":
        if etype.is_integral:
            lo, hi = int(a), int(b)
            if hi <= lo:
                raise EvaluationError(f"{instr.name}: rng_uniform needs a < b, got [{lo}, {hi})")
            values = generator.integers(lo, hi, size=shape.dims, endpoint=False)
        elif etype.is_float:
            values = generator.uniform(float(a), float(b), size=shape.dims).astype(shape.dtype)
            # [a, b): rounding to a narrow type may land on b.
            return np.where(values >= np.asarray(b, shape.dtype), a, values).astype(shape.dtype)
        else:
            raise EvaluationError(f"{instr.name}: rng_uniform of {etype.text} is not supported")
    elif distribution == "rng_normal":
        if not etype.is_float:
            raise EvaluationError(f"{instr.name}: rng_normal needs a float type, not {etype.text}")
        values = generator.normal(float(a), float(b), size=shape.dims)
    else:
        raise EvaluationError(
            f"{instr.name}: rng needs distribution=rng_uniform or rng_normal, got '{distribution}'"
        )
    return np.asarray(values).astype(shape.dtype)


@evaluates(Opcode.RNG_GET_AND_UPDATE_STATE)
def _rng_get_and_update_state(instr, operands, ctx):
    delta = instr.rng_delta
    current = ctx.state.get("rng_state", 0)
    ctx.state["rng_state"] = (current + delta) % (1 << 128)
    words = [(current >> (64 * i)) & ((1 << 64) - 1) for i in range(2)]
    return np.array(words, dtype=np.uint64).reshape(instr.shape.dims)
