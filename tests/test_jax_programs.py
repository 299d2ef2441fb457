"""End to end: every program of jax_programs.py is lowered by JAX, parsed, verified and run by
the reference interpreter, once as lowered HLO and once as XLA's optimized HLO, and each
output leaf is compared with what XLA's compiled executable returns on the same arguments.
"""

from __future__ import annotations

import jax_programs
import ml_dtypes
import numpy as np
import pytest
from jax_programs import DEFAULT_TOL, PROGRAMS, JaxProgram, hlo_texts, jax_outputs

from xlapy.backends.interpreter import evaluate
from xlapy.backends.interpreter.registry import EVAL_RULES
from xlapy.ir.module import HloModule
from xlapy.ir.parser import parse_module
from xlapy.ir.verifier import verify
from xlapy.tools import coverage_ops

NAMES = list(PROGRAMS)

# Tolerances of the 8-bit float types, which only appear as intermediate values in the table.
F8_TOL = {
    "float8_e4m3fn": (7e-2, 2e-2),
    "float8_e5m2": (1.3e-1, 3e-2),
}

_PARSED: dict[tuple[str, str], HloModule] = {}


def parsed(name: str, form: str, text: str | None = None) -> HloModule:
    """The program's text of `form` ("lowered" or "optimized"), parsed once per session."""
    key = (name, form)
    if key not in _PARSED:
        text = text if text is not None else getattr(hlo_texts(PROGRAMS[name]), form)
        _PARSED[key] = parse_module(text)
    return _PARSED[key]


def leaves(value) -> list[np.ndarray]:
    if isinstance(value, tuple | list):
        return [leaf for v in value for leaf in leaves(v)]
    return [value]


def _bits(a: np.ndarray) -> np.ndarray:
    if a.dtype == np.bool_:
        return a
    return a.view(np.dtype(f"u{a.dtype.itemsize}"))


def _is_float(dtype: np.dtype) -> bool:
    return np.issubdtype(dtype, np.inexact) or dtype in (
        np.dtype(ml_dtypes.bfloat16),
        *(np.dtype(getattr(ml_dtypes, n)) for n in F8_TOL),
    )


def assert_leaf_matches(actual, expected: np.ndarray, prog: JaxProgram, what: str) -> None:
    """Exact for integers, booleans and `exact` programs; per-dtype tolerance for floats,
    with the absolute part scaled by the largest finite magnitude of the expected leaf."""
    assert isinstance(actual, np.ndarray), f"{what}: interpreter gave {type(actual).__name__}"
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    if not _is_float(expected.dtype) or prog.exact:
        if _is_float(expected.dtype):
            both_nan = np.isnan(actual.astype(np.complex128)) & np.isnan(
                expected.astype(np.complex128)
            )
            same = (_bits(actual) == _bits(expected)) | both_nan
        else:
            same = actual == expected
        bad = np.flatnonzero(~same)
        assert bad.size == 0, (
            f"{what}: {bad.size}/{expected.size} elements differ (exact), first at flat index "
            f"{bad[0]}: got {actual.reshape(-1)[bad[0]]!r}, want {expected.reshape(-1)[bad[0]]!r}"
        )
        return
    name = expected.dtype.name
    rtol, atol = prog.tol.get(name) or DEFAULT_TOL.get(name) or F8_TOL[name]
    wide = np.complex128 if np.iscomplexobj(expected) else np.float64
    a, e = actual.astype(wide), expected.astype(wide)
    nan_a, nan_e = np.isnan(a), np.isnan(e)
    assert np.array_equal(nan_a, nan_e), (
        f"{what}: NaN at different positions: got {np.flatnonzero(nan_a)[:8]}, "
        f"want {np.flatnonzero(nan_e)[:8]}"
    )
    finite_e = np.isfinite(e)
    inf_mismatch = ~finite_e & ~nan_e & (a != e)
    assert not inf_mismatch.any(), (
        f"{what}: infinities differ at {np.flatnonzero(inf_mismatch)[:8]}"
    )
    scale = max(1.0, float(np.max(np.abs(e[finite_e]), initial=0.0)))
    err = np.where(finite_e, np.abs(a - e), 0.0)
    limit = atol * scale + rtol * np.abs(np.where(finite_e, e, 0.0))
    bad = np.flatnonzero(~(err <= limit))
    if bad.size:
        i = bad[np.argmax((err - limit).reshape(-1)[bad])]
        pytest.fail(
            f"{what}: {bad.size}/{e.size} elements out of tolerance (rtol={rtol}, atol={atol}x"
            f"{scale:.3g}); worst at flat index {i}: got {a.reshape(-1)[i]}, "
            f"want {e.reshape(-1)[i]}"
        )


def check_program(name: str, form: str) -> None:
    prog = PROGRAMS[name]
    module = parsed(name, form)
    verify(module)
    expected = jax_outputs(prog)
    got = leaves(evaluate(module, prog.args()))
    assert len(got) == len(expected), f"{len(got)} output leaves, JAX returned {len(expected)}"
    for i, (a, e) in enumerate(zip(got, expected, strict=True)):
        assert_leaf_matches(a, e, prog, f"{name} ({form}) output leaf {i}")


def test_table_is_large_and_well_formed():
    assert len(PROGRAMS) >= 85
    for prog in PROGRAMS.values():
        args = prog.args()
        assert args, f"{prog.name} takes no arguments"
        for a in args:
            assert isinstance(a, np.ndarray), f"{prog.name}: argument is {type(a).__name__}"
        # Fresh data: no argument is constant, and another seed gives other values.
        other = prog.args(seed=1)
        assert any(a.size > 1 and not np.all(a == a.reshape(-1)[0]) for a in args) or any(
            not np.array_equal(a, b) for a, b in zip(args, other)
        ), f"{prog.name}: arguments are constant"


def test_x64_programs_do_not_leak_64_bit_mode():
    x64 = [p for p in PROGRAMS.values() if p.x64]
    assert x64, "the table has no 64-bit program"
    for prog in x64:
        assert "f64" in hlo_texts(prog).lowered or "64[" in hlo_texts(prog).lowered
    assert jax_programs.jnp.asarray(1.0).dtype == np.float32


@pytest.mark.parametrize("name", NAMES)
def test_lowered_matches_jax(name):
    check_program(name, "lowered")


@pytest.mark.parametrize("name", NAMES)
def test_optimized_matches_jax(name):
    check_program(name, "optimized")


def test_every_exercised_opcode_has_an_interpreter_rule(capsys):
    cov = coverage_ops.collect(jax_programs, lambda name, form, text: parsed(name, form, text))
    with capsys.disabled():
        unexercised = ", ".join(op.text for op in cov.unexercised())
        print(
            f"\nopcodes exercised by the JAX programs: {len(cov.exercised())}; "
            f"with a rule: {len(EVAL_RULES)}; exercised by none: {unexercised}"
        )
    assert not cov.parse_failures, f"texts the parser rejected: {cov.parse_failures}"
    missing = [op.text for op in cov.without_rule()]
    assert not missing, (
        f"opcodes used by the JAX programs but without an interpreter rule: {missing}"
    )
