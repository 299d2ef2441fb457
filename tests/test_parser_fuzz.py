"""Fuzzing the parser, verifier and printer with mutants of the test suite's modules.

Every mutant either fails with one of xlapy's errors or is accepted, and an accepted one
prints text that parses and prints back identically; none hangs. CI runs a few thousand
mutants; set XLAPY_FUZZ_MUTANTS (and XLAPY_FUZZ_SEED) for a longer run, e.g.
`XLAPY_FUZZ_MUTANTS=300000 pytest tests/test_parser_fuzz.py`.
"""

import os

import pytest
from hlo_fuzz import check_one, corpus, fuzz
from test_hlo_grammar import LONG, READS, SHORT

MUTANTS = int(os.environ.get("XLAPY_FUZZ_MUTANTS", "4000"))
SEED = int(os.environ.get("XLAPY_FUZZ_SEED", "20261126"))


@pytest.fixture(scope="module")
def modules():
    tables = [*LONG.values(), *SHORT.values(), *(text for text, _ in READS.values())]
    return corpus(tables)


def test_corpus_holds_the_suites_modules_and_each_round_trips(modules):
    assert len(modules) >= 200
    problems = [(p, t) for t in modules if (p := check_one(t)) is not None]
    assert not problems, problems[:3]


def test_mutants_end_in_xlapy_errors_or_round_trip(modules):
    report = fuzz(SEED, MUTANTS, modules)
    assert report.mutants == MUTANTS
    shown = "\n\n".join(f"{problem}\n--- mutant:\n{text}" for problem, text in report.failures[:3])
    assert not report.failures, f"{len(report.failures)} of {MUTANTS} mutants failed:\n{shown}"
