"""Corner-case fuzzing (corner_fuzz.py): one small program per seed over the edge values of
its types (NaN, +-0, +-inf, subnormals, INT_MIN, -1, shift counts past the bit width,
out-of-range indices), layouts, tuples and size-0 dims; the CPU backend must match the
interpreter and, for a few, XLA:CPU. A fixed slice of seeds runs by default; set
XLAPY_CORNER_PROGRAMS (and XLAPY_CORNER_SEED) for more, or run benchmarks/fuzz_corners.py."""

from __future__ import annotations

import os

import numpy as np
import pytest
from corner_fuzz import (
    FAMILIES,
    check_case,
    check_mutant,
    generate,
    mutate,
    same,
    stablehlo_corpus,
)
from program_fuzz import xla_run

pytestmark = pytest.mark.usefixtures("kernel_cache")

PROGRAMS = int(os.environ.get("XLAPY_CORNER_PROGRAMS", "16"))
FIRST = int(os.environ.get("XLAPY_CORNER_SEED", "20261128"))


def test_every_family_draws_a_valid_program():
    from xlapy.backends.interpreter import evaluate
    from xlapy.ir.parser import parse_module
    from xlapy.ir.verifier import verify

    for k, family in enumerate(sorted(FAMILIES)):
        for seed in range(2):
            case = generate(1000 * k + seed, [family])
            assert case.family == family
            module = parse_module(case.text)
            verify(module)
            evaluate(module, case.args)


def test_seeded_slice_matches_the_interpreter():
    failing = {}
    for seed in range(FIRST, FIRST + PROGRAMS):
        case = generate(seed)
        if found := check_case(case):
            failing[seed] = (found, case.text)
    assert not failing, failing


def test_a_few_against_xla():
    failing = {}
    for seed in range(FIRST, FIRST + 6):
        case = generate(seed, ["identity", "divide-shift", "compare", "convert"])
        if found := check_case(case, xla_run):
            failing[seed] = (found, case.text)
    assert not failing, failing


def test_stablehlo_mutants_import_or_fail_with_a_positioned_error():
    corpus = stablehlo_corpus()
    assert all(check_mutant(text) is None for text in corpus)
    rng = np.random.default_rng(FIRST)
    failing = []
    for _ in range(int(os.environ.get("XLAPY_CORNER_MUTANTS", "300"))):
        text = mutate(corpus[int(rng.integers(len(corpus)))], rng)
        if problem := check_mutant(text):
            failing.append((problem, text))
    assert not failing, failing[:2]


def test_same_treats_nan_and_flushed_subnormals_as_equal_and_signed_zeros_not():
    f = np.float32
    assert same(np.array([np.nan], f), np.array([-np.nan], f)) is None
    assert same(np.array([0.0], f), np.array([1e-40], f)) is None
    assert same(np.array([0.0], f), np.array([-0.0], f)) is not None
    assert same(np.array([1.0], f), np.array([1.0000001], f)) is not None
    assert same(np.array([1.0], f), np.array([1.0000001], f), rtol=1e-6) is None
    assert same(np.array([-1], np.int8), np.array([255], np.uint8)) is not None
