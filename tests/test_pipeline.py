"""Pipelines: the verifier runs between passes and names the pass that broke a module, the
dump directory gets one file per changed pass, and the default CPU pipeline (without the
stages not written yet) keeps every JAX program's results (interpreter before vs after)."""

from __future__ import annotations

import functools
import gc
import warnings
from pathlib import Path

import numpy as np
import pytest
from jax_programs import PROGRAMS
from test_jax_programs import assert_leaf_matches, leaves

import xlapy.passes
from xlapy.backends.interpreter import evaluate
from xlapy.errors import VerifierError, XlapyError
from xlapy.ir.opcodes import Opcode
from xlapy.ir.parser import parse_module
from xlapy.ir.shapes import Shape
from xlapy.passes import PASS_MODULES
from xlapy.passes.pass_base import PASSES, FixedPoint, HloPass, PassPipeline, make_pass
from xlapy.passes.pipelines import CPU_PIPELINE, build, default_cpu_pipeline

TEXT = """HloModule m
ENTRY e {
  x = f32[4] parameter(0)
  z = f32[] constant(-0)
  zb = f32[4] broadcast(z), dimensions={}
  a = f32[4] add(x, zb)
  dead = f32[4] exponential(x)
  ROOT n = f32[4] negate(a)
}
"""


class BreakShapes(HloPass):
    """Deliberately wrong: gives the root a shape its operands cannot produce."""

    name = "break-shapes"

    def run(self, module):
        module.entry.root.shape = Shape.array("f32", (5,))
        return True


class DoNothing(HloPass):
    name = "do-nothing"

    def run(self, module):
        return False


def test_verifier_names_the_pass_that_broke_the_module():
    pipeline = PassPipeline("p", [make_pass("algsimp"), BreakShapes(), make_pass("dce")])
    with pytest.raises(VerifierError, match="after pass break-shapes in pipeline p"):
        pipeline.run(parse_module(TEXT))
    assert pipeline.log == [("algsimp", True), ("break-shapes", True)]


def test_broken_pass_goes_unnoticed_without_verification():
    pipeline = PassPipeline("p", [BreakShapes()], verify_between=False)
    assert pipeline.run(parse_module(TEXT))


def test_dump_dir_has_input_and_one_file_per_changed_pass(tmp_path):
    pipeline = PassPipeline(
        "p", [make_pass("algsimp"), DoNothing(), make_pass("dce")], dump_dir=tmp_path
    )
    assert pipeline.run(parse_module(TEXT))
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["00.input.hlo", "01.algsimp.hlo", "02.dce.hlo"]
    assert "exponential" in (tmp_path / "01.algsimp.hlo").read_text()
    assert "exponential" not in (tmp_path / "02.dce.hlo").read_text()
    parse_module((tmp_path / "02.dce.hlo").read_text())


def test_fixed_point_group_repeats_until_quiet():
    group = FixedPoint([make_pass("algsimp"), make_pass("dce")])
    pipeline = PassPipeline("p", [group])
    module = parse_module(TEXT)
    assert pipeline.run(module)
    assert pipeline.log[-2:] == [("algsimp", False), ("dce", False)]
    assert [i.opcode for i in module.entry.instructions] == [Opcode.PARAMETER, Opcode.NEGATE]


class ChangesOnce(HloPass):
    """Reports a change on its first run only; `settled` as given."""

    name = "changes-once"

    def __init__(self, settled: bool):
        self.settled = settled
        self.runs = 0

    def run(self, module):
        self.runs += 1
        return self.runs == 1


@pytest.mark.parametrize("settled", [False, True])
def test_fixed_point_skips_the_confirming_run_of_a_settled_pass(settled):
    once = ChangesOnce(settled)
    pipeline = PassPipeline("p", [FixedPoint([once, DoNothing()])])
    assert pipeline.run(parse_module(TEXT))
    confirm = [] if settled else [("changes-once", False)]
    assert pipeline.log == [("changes-once", True), ("do-nothing", False), *confirm]


@pytest.mark.parametrize("name", ["algsimp", "cse"])
def test_a_settled_pass_changes_nothing_when_run_again(name):
    module = parse_module(TEXT)
    p = make_pass(name)
    p.run(module)
    text = module.to_text()
    assert p.settled and not p.run(module) and module.to_text() == text


class SeesCollector(HloPass):
    """Records whether the cyclic garbage collector was enabled while it ran."""

    name = "sees-collector"

    def __init__(self):
        self.seen: list[bool] = []

    def run(self, module):
        self.seen.append(gc.isenabled())
        return False


def test_pipeline_pauses_the_collector_and_resumes_it_after_success_or_error():
    probe = SeesCollector()
    assert gc.isenabled()
    PassPipeline("p", [probe]).run(parse_module(TEXT))
    assert probe.seen == [False] and gc.isenabled()
    with pytest.raises(VerifierError):
        PassPipeline("p", [probe, BreakShapes()]).run(parse_module(TEXT))
    assert probe.seen == [False, False] and gc.isenabled()
    outer = PassPipeline("inner", [probe])

    class RunsAPipeline(HloPass):  # nested pipelines resume it once, at the outermost end
        name = "runs-a-pipeline"

        def run(self, module):
            outer.run(module)
            probe.seen.append(gc.isenabled())
            return False

    PassPipeline("p", [RunsAPipeline()]).run(parse_module(TEXT))
    assert probe.seen == [False, False, False, False] and gc.isenabled()
    gc.disable()  # a caller that keeps the collector off keeps it off
    try:
        PassPipeline("p", [probe]).run(parse_module(TEXT))
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_every_listed_pass_is_registered():
    names = [n for e in CPU_PIPELINE for n in (e if isinstance(e, list) else [e])]
    for name in names:
        assert name in PASSES, name
    with pytest.raises(XlapyError, match="unknown pass 'nope'"):
        make_pass("nope")


def test_every_module_that_registers_a_pass_is_listed(run_cli, write):
    """PASS_MODULES is the one list: a module with a @register_pass missing from it would
    leave its passes unknown to the command line (the SPMD partitioner and all-reduce
    combiner were) until something else imported it."""
    root = Path(xlapy.passes.__file__).parent
    registering = {
        path.relative_to(root).with_suffix("").as_posix().replace("/", ".")
        for path in root.rglob("*.py")
        if "\n@register_pass" in path.read_text()
    }
    assert registering == set(PASS_MODULES)
    path = write("m.hlo", "HloModule m\nENTRY e {\n  ROOT p = f32[4] parameter(0)\n}\n")
    for name in ("all-reduce-combiner", "spmd-partitioner"):
        code, _, err = run_cli("opt", path, "--passes", name)
        assert code == 0, err


def test_a_plan_mixes_names_and_pass_objects():
    dce = make_pass("dce")
    pipeline = build("mixed", ["algsimp", [make_pass("cse"), "dce"], dce])
    assert [type(p).__name__ for p in pipeline.passes][-1] == type(dce).__name__
    assert pipeline.passes[-1] is dce
    with pytest.raises(XlapyError, match="unknown pass 'nope'"):
        build("bad", ["algsimp", "nope"])


def test_default_pipeline_builds_and_runs_on_a_small_module(tmp_path):
    pipeline = default_cpu_pipeline(dump_dir=tmp_path)
    module = parse_module(TEXT)
    x = np.random.default_rng(0).standard_normal(4).astype(np.float32)
    want = evaluate(parse_module(TEXT), [x])
    pipeline.run(module)
    np.testing.assert_array_equal(evaluate(module, [x]), want)
    assert (tmp_path / "00.input.hlo").exists()


@functools.cache
def lowered_text(name: str) -> str:
    """The program as JAX lowers it (lowering only: XLA's compile is not needed here)."""
    prog = PROGRAMS[name]
    with prog.context(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return prog.jitted().lower(*prog.args()).as_text(dialect="hlo")


# The stages before fusion: what the simplification passes may not get wrong.
EARLY = CPU_PIPELINE[: CPU_PIPELINE.index("fusion")]


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_pipeline_keeps_program_results(name):
    prog = PROGRAMS[name]
    text = lowered_text(name)
    original, optimized = parse_module(text), parse_module(text)
    build("cpu-early", EARLY).run(optimized)
    args = prog.args()
    want = leaves(evaluate(original, args))
    got = leaves(evaluate(optimized, args))
    assert len(got) == len(want)
    for i, (a, e) in enumerate(zip(got, want, strict=True)):
        assert_leaf_matches(a, e, prog, f"{name} optimized vs original, leaf {i}")


def test_pipeline_shrinks_the_programs():
    before = after = 0
    for prog in list(PROGRAMS.values())[:10]:
        module = parse_module(lowered_text(prog.name))
        before += sum(1 for _ in module.instructions())
        build("cpu-early", EARLY).run(module)
        after += sum(1 for _ in module.instructions())
    assert after < 0.85 * before, (before, after)
