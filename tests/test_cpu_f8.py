"""8-bit floats in CPU kernels (codegen/f8.py): converts from and to f32, f64, f16 and bf16
for every supported f8 type, bit for bit the interpreter (ml_dtypes), ties and specials
(NaN, infinities, overflow, -0, subnormals) included; arithmetic rounded after every op;
array constants and bitcasts; and the converts against XLA through JAX."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from xlapy.backends import execute
from xlapy.backends.cpu.backend import CpuProgram
from xlapy.backends.interpreter import evaluate
from xlapy.ir.parser import parse_module

pytestmark = pytest.mark.usefixtures("kernel_cache")

RNG = np.random.default_rng(20261127)
F8 = {
    "f8e4m3fn": ml_dtypes.float8_e4m3fn,
    "f8e5m2": ml_dtypes.float8_e5m2,
    "f8e4m3": ml_dtypes.float8_e4m3,
    "f8e3m4": ml_dtypes.float8_e3m4,
    "f8e4m3fnuz": ml_dtypes.float8_e4m3fnuz,
    "f8e5m2fnuz": ml_dtypes.float8_e5m2fnuz,
    "f8e4m3b11fnuz": ml_dtypes.float8_e4m3b11fnuz,
}
WIDE = {"f32": np.float32, "f64": np.float64, "f16": np.float16, "bf16": ml_dtypes.bfloat16}
N = 2048


def _inputs(t8: str, wide: str) -> np.ndarray:
    """Random magnitudes over the f8 range and beyond, every midpoint between neighbouring
    f8 values (ties), their neighbours, and the specials."""
    x = RNG.standard_normal(N) * np.exp2(RNG.integers(-20, 18, N))
    values = np.arange(256, dtype=np.uint8).view(F8[t8]).astype(np.float64)
    values = np.unique(values[np.isfinite(values)])
    mids = (values[1:] + values[:-1]) / 2
    x[: len(mids)] = mids
    x[len(mids) : 2 * len(mids)] = mids * (1 + 2**-12)
    x[-10:] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e30, -1e30, values[-1], -values[-1], 1e-30]
    return x.astype(WIDE[wide])


def _bits(a) -> np.ndarray:
    a = np.ascontiguousarray(np.asarray(a))
    return a if a.dtype.kind in "biu" else a.view(f"u{a.dtype.itemsize}")


def _same(got, want) -> None:
    """Bit for bit, except that a NaN's sign and payload are free (as in XLA)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    nan = np.isnan(got.astype(np.float64))
    np.testing.assert_array_equal(nan, np.isnan(want.astype(np.float64)))
    np.testing.assert_array_equal(_bits(got)[~nan], _bits(want)[~nan])


def _run(text: str, args) -> None:
    listing = CpuProgram(parse_module(text)).thunk_listing()
    assert "rule" not in listing, listing  # every instruction a kernel
    got = execute(parse_module(text), args, "cpu")
    want = evaluate(parse_module(text), args)
    for g, w in zip(got, want, strict=True):
        _same(g, w)


@pytest.mark.parametrize("wide", sorted(WIDE))
@pytest.mark.parametrize("t8", sorted(F8))
def test_convert_round_trip(t8, wide):
    text = f"""HloModule m
ENTRY e {{
  x = {wide}[{N}] parameter(0)
  c = {t8}[{N}] convert(x)
  y = {wide}[{N}] convert(c)
  ROOT r = ({wide}[{N}], {t8}[{N}]) tuple(y, c)
}}"""
    _run(text, [_inputs(t8, wide)])


@pytest.mark.parametrize("t8", ["f8e4m3fn", "f8e5m2", "f8e4m3fnuz"])
def test_arithmetic_rounds_after_every_op(t8):
    text = f"""HloModule m
ENTRY e {{
  a = {t8}[{N}] parameter(0)
  b = {t8}[{N}] parameter(1)
  s = {t8}[{N}] add(a, b)
  p = {t8}[{N}] multiply(s, a)
  e = {t8}[{N}] sqrt(b)
  m = {t8}[{N}] maximum(p, e)
  k = {t8}[4] constant({{0.5, -1.5, 3, 0.0625}})
  kb = {t8}[{N // 4},4] broadcast(k), dimensions={{1}}
  kr = {t8}[{N}] reshape(kb)
  d = {t8}[{N}] subtract(m, kr)
  bits = u8[{N}] bitcast-convert(d)
  ROOT r = ({t8}[{N}], u8[{N}]) tuple(d, bits)
}}"""
    a = (RNG.standard_normal(N) * 2).astype(F8[t8])
    b = (RNG.standard_normal(N)).astype(F8[t8])
    _run(text, [a, b])  # sqrt of negatives: NaN, whose bits are free


@pytest.mark.parametrize("t8", ["f8e4m3fn", "f8e5m2"])
def test_converts_match_xla(t8):
    """XLA:CPU's convert (through JAX) agrees: overflow is NaN for e4m3fn, inf for e5m2."""
    x = _inputs(t8, "f32")
    fn = jax.jit(lambda v: v.astype(F8[t8]))
    text = fn.lower(x).as_text(dialect="hlo")
    got = execute(parse_module(text), [x], "cpu")
    want = fn(jax.device_put(x, jax.devices("cpu")[0]))
    _same(got, want)
    back = jax.jit(lambda v: v.astype(jnp.float32))
    text = back.lower(np.asarray(want)).as_text(dialect="hlo")
    _same(execute(parse_module(text), [np.asarray(want)], "cpu"), back(want))
