# ruff: noqa: E501  (HLO modules are written with lines as long as XLA prints them)
"""HLO text printed by newer XLA (jaxlib 0.11.x, seen on a lent machine with jax 0.11.2 by
benchmarks/jax_version_probe.py): a compare's ordering is printed `order=TOTAL` where older
XLA printed `type=TOTALORDER`, and topk carries `is_stable=`. xlapy reads both forms with
the same meaning, on the interpreter and the CPU backend."""

import numpy as np
import pytest

from xlapy.errors import XlapyError
from xlapy.ir.parser import parse_module
from xlapy.ir.printer import print_module
from xlapy.ir.verifier import verify
from xlapy.runtime import Client

pytestmark = pytest.mark.usefixtures("kernel_cache")

# JAX's sort comparator for floats: -0 and NaN canonicalised, then a total-order less-than.
SORT = """HloModule jit_sort, entry_computation_layout={{(f32[{n}]{{0}})->f32[{n}]{{0}}}}

cmp {{
  a = f32[] parameter(0)
  a_nan = pred[] compare(a, a), direction=NE
  nan = f32[] constant(nan)
  zero = f32[] constant(0)
  a_zero = pred[] compare(a, zero), direction=EQ
  a0 = f32[] select(a_zero, zero, a)
  a1 = f32[] select(a_nan, nan, a0)
  b = f32[] parameter(1)
  b_nan = pred[] compare(b, b), direction=NE
  b_zero = pred[] compare(b, zero), direction=EQ
  b0 = f32[] select(b_zero, zero, b)
  b1 = f32[] select(b_nan, nan, b0)
  ROOT lt = pred[] compare(a1, b1), direction=LT, {ordering}
}}

ENTRY main {{
  x = f32[{n}]{{0}} parameter(0)
  ROOT s = f32[{n}]{{0}} sort(x), dimensions={{0}}, is_stable=true, to_apply=cmp
}}
"""

TOTAL_LT = """HloModule lt, entry_computation_layout={{(f32[{n}]{{0}}, f32[{n}]{{0}})->pred[{n}]{{0}}}}

ENTRY main {{
  x = f32[{n}]{{0}} parameter(0)
  y = f32[{n}]{{0}} parameter(1)
  ROOT lt = pred[{n}]{{0}} compare(x, y), direction=LT, {ordering}
}}
"""

TOPK = """HloModule topk, entry_computation_layout={(f32[6,16]{1,0})->(f32[6,4]{1,0}, s32[6,4]{1,0})}

ENTRY main {
  x = f32[6,16]{1,0} parameter(0)
  t = (f32[6,4]{1,0}, s32[6,4]{1,0}) topk(x), k=4, largest=true, is_stable=true
  v = f32[6,4]{1,0} get-tuple-element(t), index=0
  i = s32[6,4]{1,0} get-tuple-element(t), index=1
  ROOT r = (f32[6,4]{1,0}, s32[6,4]{1,0}) tuple(v, i)
}
"""


def run(platform: str, text: str, *args: np.ndarray) -> list[np.ndarray]:
    client = Client(platform)
    executable = client.compile(text)
    buffers = [client.buffer_from_pyval(a) for a in args]
    return [b.to_numpy() for b in executable.execute([buffers])[0]]


def values(rng: np.random.Generator, n: int) -> np.ndarray:
    special = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0], np.float32)
    x = rng.standard_normal(n).astype(np.float32)
    x[rng.choice(n, special.size, replace=False)] = special
    return x


@pytest.mark.parametrize("platform", ["interpreter", "cpu"])
def test_order_total_reads_as_type_totalorder(platform):
    rng = np.random.default_rng(11)
    n = 40
    x, y = values(rng, n), values(rng, n)
    y[:8] = x[:8]  # equal pairs, NaN against NaN and -0 against -0 included
    old = run(platform, TOTAL_LT.format(n=n, ordering="type=TOTALORDER"), x, y)
    new = run(platform, TOTAL_LT.format(n=n, ordering="order=TOTAL"), x, y)
    np.testing.assert_array_equal(new[0], old[0])

    # total order: -NaN < -inf < ... < -0 < +0 < ... < +inf < +NaN, by sign-magnitude bits
    def key(v):
        bits = v.view(np.int32).astype(np.int64)
        return np.where(bits < 0, -(bits & 0x7FFFFFFF), bits)

    np.testing.assert_array_equal(new[0], key(x) < key(y))


@pytest.mark.parametrize("platform", ["interpreter", "cpu"])
def test_order_partial_is_the_ieee_comparison(platform):
    rng = np.random.default_rng(12)
    n = 24
    x, y = values(rng, n), values(rng, n)
    got = run(platform, TOTAL_LT.format(n=n, ordering="order=PARTIAL"), x, y)
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(got[0], x < y)


@pytest.mark.parametrize("platform", ["interpreter", "cpu"])
def test_jax_011_sort_comparator(platform):
    rng = np.random.default_rng(13)
    n = 64
    x = values(rng, n)
    got = run(platform, SORT.format(n=n, ordering="order=TOTAL"), x)[0]
    old = run(platform, SORT.format(n=n, ordering="type=TOTALORDER"), x)[0]
    np.testing.assert_array_equal(got.view(np.int32), old.view(np.int32))
    finite = np.sort(x[~np.isnan(x)])
    np.testing.assert_array_equal(got[: finite.size], finite)
    assert np.isnan(got[finite.size :]).all()


@pytest.mark.parametrize("platform", ["interpreter", "cpu"])
def test_topk_is_stable_attribute(platform):
    rng = np.random.default_rng(14)
    x = rng.integers(0, 5, (6, 16)).astype(np.float32)  # many ties: stable = lower index first
    values_, indices = run(platform, TOPK, x)
    order = np.argsort(-x, axis=1, kind="stable")[:, :4]
    np.testing.assert_array_equal(indices, order)
    np.testing.assert_array_equal(values_, np.take_along_axis(x, order, axis=1))


def test_order_attribute_round_trips():
    text = TOTAL_LT.format(n=4, ordering="order=TOTAL")
    module = parse_module(text)
    verify(module)
    assert "order=TOTAL" in print_module(module)
    assert parse_module(TOPK).entry.root.operands[0].operands[0].attrs["is_stable"] is True


def test_order_and_type_that_disagree_are_refused():
    text = TOTAL_LT.format(n=4, ordering="type=FLOAT, order=TOTAL")
    with pytest.raises(XlapyError, match="disagree"):
        verify(parse_module(text))


def test_unknown_order_is_a_parse_error_naming_the_values():
    text = TOTAL_LT.format(n=4, ordering="order=WEAK")
    with pytest.raises(XlapyError, match="WEAK") as info:
        parse_module(text)
    assert "PARTIAL" in str(info.value) and "TOTAL" in str(info.value)
