"""The CPU backend against the interpreter (the oracle) on every program of jax_programs.py,
as lowered by JAX and as optimized by XLA: floats within the JAX test's per-dtype
tolerances, integers, booleans and `exact` programs (random bits) bit for bit."""

from __future__ import annotations

import pytest
from jax_programs import PROGRAMS, hlo_texts
from test_jax_programs import assert_leaf_matches, leaves

from xlapy.backends.cpu.backend import CpuProgram
from xlapy.backends.cpu.jit import program_image
from xlapy.backends.interpreter import evaluate
from xlapy.ir.parser import parse_module

NAMES = list(PROGRAMS)


pytestmark = pytest.mark.usefixtures("kernel_cache")


@pytest.mark.parametrize("form", ["lowered", "optimized"])
@pytest.mark.parametrize("name", NAMES)
def test_cpu_matches_interpreter(name, form):
    prog = PROGRAMS[name]
    text = getattr(hlo_texts(prog), form)
    args = prog.args()
    expected = leaves(evaluate(parse_module(text), args))
    program = CpuProgram(parse_module(text))
    got = leaves(program.run(args))
    assert len(got) == len(expected)
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert_leaf_matches(g, e, prog, f"{name} ({form}) output leaf {i}")
    # Every program can be kept as a program image (a refused pickle would leave its warm
    # compile silently slow: a new thunk's function not marked loadable, say).
    assert program_image.refusal(program.compiled) is None, name
    # The arguments are never written when nothing is donated.
    for a, b in zip(args, prog.args(), strict=True):
        assert a.tobytes() == b.tobytes(), f"{name}: an argument was modified"


def test_most_work_is_native():
    """The MLP step runs as kernels and BLAS dots, not interpreter rules."""
    text = hlo_texts(PROGRAMS["mlp_train_step"]).lowered
    listing = CpuProgram(parse_module(text)).thunk_listing()
    thunks = [line.split() for line in listing.splitlines() if line.startswith("  ")]
    thunks = [t for t in thunks if len(t) > 3 and t[2] == "="]
    kinds = [t[0] for t in thunks]
    assert kinds.count("kernel") >= 5, listing
    # its dots (batch 8) are native small-gemm kernels or BLAS gemms, never rules
    dots = [t[0] for t in thunks if t[3] == "dot"]
    assert len(dots) >= 3 and set(dots) <= {"kernel", "blas"}, listing
    assert "rule" not in kinds, listing
