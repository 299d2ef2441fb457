"""Numeric edge cases of the CPU backend against XLA:CPU (jax.jit), the issue 16 attack's
numeric class: float -> int conversions (saturation, NaN, infinities), integer division
and remainder by 0 and INT_MIN / -1, shifts by negative and oversized amounts, rounding,
and transcendental functions at their edges. Every case runs one HLO program on xlapy's
"cpu" client and the same lax operation under jax.jit on XLA:CPU, and compares bit for
bit (transcendentals: within a few ulp). Run:

    PYTHONPATH=. python benchmarks/runtime_attack_numeric.py [--seed S]

Prints every mismatch and a summary line; exit status 1 when any case differs."""

from __future__ import annotations

import argparse
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from xlapy.runtime import Client

jax.config.update("jax_platforms", "cpu")
jax.config.update("jax_enable_x64", True)

HLO_TYPE = {
    np.float32: "f32", np.float64: "f64", np.int8: "s8", np.int16: "s16", np.int32: "s32",
    np.int64: "s64", np.uint8: "u8", np.uint16: "u16", np.uint32: "u32", np.uint64: "u64",
}  # fmt: skip


def hlo_type(dtype) -> str:
    return HLO_TYPE[np.dtype(dtype).type]


def float_edges(dtype, rng) -> np.ndarray:
    info = np.finfo(dtype)
    fixed = [0.0, -0.0, 0.5, -0.5, 1.5, 2.5, -2.5, 127.5, 128.0, 255.5, 256.0, -129.0,
             32767.5, 65535.5, 2.0**31, -(2.0**31), 2.0**31 - 128, 2.0**32, 2.0**63,
             -(2.0**63), 2.0**64, 1e20, -1e20, float(info.max), -float(info.max),
             float(info.tiny), np.inf, -np.inf, np.nan]  # fmt: skip
    random = rng.standard_normal(16) * 10.0 ** rng.integers(-3, 12, 16)
    return np.array(fixed + list(random), dtype)


def run_xlapy(client, text: str, args) -> np.ndarray:
    exe = client.compile(text)
    bufs = [client.buffer_from_pyval(np.asarray(a)) for a in args]
    return exe.execute([bufs])[0][0].to_numpy()


def unary_program(op: str, src, dst, attrs: str = "") -> str:
    return (
        f"HloModule m\nENTRY e {{\n  x = {hlo_type(src)}[N] parameter(0)\n"
        f"  ROOT r = {hlo_type(dst)}[N] {op}(x){attrs}\n}}"
    )


def binary_program(op: str, dtype) -> str:
    t = hlo_type(dtype)
    return (
        f"HloModule m\nENTRY e {{\n  x = {t}[N] parameter(0)\n  y = {t}[N] parameter(1)\n"
        f"  ROOT r = {t}[N] {op}(x, y)\n}}"
    )


def same(got: np.ndarray, want: np.ndarray, ulps: int = 0) -> np.ndarray:
    """Per element: equal bits (NaNs equal), or within `ulps` for floats."""
    if got.dtype.kind != "f":
        return got == want
    both_nan = np.isnan(got) & np.isnan(want)
    if ulps == 0:
        return both_nan | (got == want) & (np.signbit(got) == np.signbit(want))
    spacing = np.spacing(np.abs(want).astype(want.dtype))
    close = np.abs(got.astype(np.float64) - want.astype(np.float64)) <= ulps * spacing
    return both_nan | (got == want) | close


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=16)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    client = Client("cpu")
    cases = failures = 0

    def check(name: str, text: str, inputs, reference, ulps: int = 0) -> None:
        nonlocal cases, failures
        n = len(inputs[0])
        text = text.replace("[N]", f"[{n}]")
        want = np.asarray(jax.jit(reference)(*[jnp.asarray(a) for a in inputs]))
        try:
            got = run_xlapy(client, text, inputs)
        except Exception as e:  # an error where XLA answers is a defect too
            failures += 1
            print(f"FAIL {name}: {type(e).__name__}: {e}")
            return
        ok = same(got, want, ulps)
        cases += n
        if not ok.all():
            failures += int((~ok).sum())
            bad = np.flatnonzero(~ok)[:6]
            rows = ", ".join(f"{inputs[0][i]!r}->{got[i]!r} (xla {want[i]!r})" for i in bad)
            print(f"FAIL {name}: {int((~ok).sum())} of {n}: {rows}")

    floats = (np.float32, np.float64)
    ints = (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64)
    for src in floats:
        x = float_edges(src, rng)
        for dst in ints:
            check(f"convert {hlo_type(src)}->{hlo_type(dst)}", unary_program("convert", src, dst),
                  [x], lambda v, d=dst: lax.convert_element_type(v, d))  # fmt: skip
        other = np.float64 if src == np.float32 else np.float32
        check(f"convert {hlo_type(src)}->{hlo_type(other)}", unary_program("convert", src, other),
              [x], lambda v, d=other: lax.convert_element_type(v, d))  # fmt: skip
        for op, ref in (
            ("round-nearest-even", lambda v: lax.round(v, lax.RoundingMethod.TO_NEAREST_EVEN)),
            ("round-nearest-afz", lambda v: lax.round(v, lax.RoundingMethod.AWAY_FROM_ZERO)),
            ("floor", lax.floor),
            ("ceil", lax.ceil),
            ("sign", lax.sign),
            ("abs", lax.abs),
        ):
            check(f"{op} {hlo_type(src)}", unary_program(op, src, src), [x], ref)
        ulps = 4 if src == np.float32 else 2
        for op, ref in (
            ("sine", lax.sin), ("cosine", lax.cos), ("tan", lax.tan), ("exponential", lax.exp),
            ("log", lax.log), ("tanh", lax.tanh), ("sqrt", lax.sqrt), ("rsqrt", lax.rsqrt),
            ("log-plus-one", lax.log1p), ("exponential-minus-one", lax.expm1),
            ("logistic", lax.logistic), ("cbrt", lax.cbrt), ("erf", lax.erf),
        ):  # fmt: skip
            check(f"{op} {hlo_type(src)}", unary_program(op, src, src), [x], ref, ulps)
    for dtype in ints:
        info = np.iinfo(dtype)
        base = [0, 1, -1, 2, -2, 7, -7, info.min, info.max, info.min + 1, info.max - 1]
        vals = np.array([v for v in base if info.min <= v <= info.max], dtype)
        x = np.repeat(vals, len(vals)).astype(dtype)
        y = np.tile(vals, len(vals)).astype(dtype)
        check(f"divide {hlo_type(dtype)}", binary_program("divide", dtype), [x, y], lax.div)
        check(f"remainder {hlo_type(dtype)}", binary_program("remainder", dtype), [x, y], lax.rem)
        bits = 8 * np.dtype(dtype).itemsize
        amounts = [0, 1, bits - 1, bits, bits + 1, 3 * bits, info.max]
        amounts += [-1, info.min] if info.min < 0 else []
        amount = np.array(amounts, dtype)
        sx = np.repeat(vals, len(amount)).astype(dtype)
        sy = np.tile(amount, len(vals)).astype(dtype)
        for op, ref in (
            ("shift-left", lax.shift_left),
            ("shift-right-arithmetic", lax.shift_right_arithmetic),
            ("shift-right-logical", lax.shift_right_logical),
        ):
            check(f"{op} {hlo_type(dtype)}", binary_program(op, dtype), [sx, sy], ref)
        check(f"convert {hlo_type(dtype)}->f32", unary_program("convert", dtype, np.float32),
              [vals], lambda v: lax.convert_element_type(v, np.float32))  # fmt: skip
    client.close()
    print(f"numeric attack, seed {args.seed}: {cases} values compared, {failures} differ")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
