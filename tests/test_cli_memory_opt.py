"""`xlapy memory` and `xlapy opt`: reports, dumps, and errors that exit 1 with a message."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import pytest
from test_memory_report import JSON_KEYS, SIZES

import xlapy.passes
from xlapy.backends.options import MEMORY_SCHEDULERS
from xlapy.ir.parser import parse_module

PASSES_DIR = Path(xlapy.passes.__file__).parent

# Simplifiable: x*1 is x, and `dead` has no user.
SIMPLIFIABLE = """
HloModule simplify_me
ENTRY main {
  x = f32[8]{0} parameter(0)
  one = f32[] constant(1)
  ones = f32[8]{0} broadcast(one), dimensions={}
  y = f32[8]{0} multiply(x, ones)
  dead = f32[8]{0} sine(x)
  ROOT z = f32[8]{0} exponential(y)
}
"""


def test_memory_prints_listing_stats_and_peak(run_cli, write):
    code, out, err = run_cli("memory", write("m.hlo", SIZES), "--no-opt", "--top", "2")
    assert code == 0, err
    assert out.startswith("Memory report for sizes (scheduler: ")
    for section in ("Allocations:", "BufferAssignment stats:", "memory_analysis:", "Peak buffers:"):
        assert section in out
    assert "entry-parameter 0 at ShapeIndex {} (aliased)" in out
    peak_rows = out.split("Peak buffers:")[1].strip().splitlines()[3:]
    assert len(peak_rows) == 2


def test_memory_json(run_cli, write):
    code, out, _ = run_cli("memory", write("m.hlo", SIZES), "--json", "--no-opt")
    assert code == 0
    figures = json.loads(out)
    assert set(figures) >= JSON_KEYS
    assert (figures["argument_bytes"], figures["alias_bytes"], figures["temp_bytes"]) == (
        1280,
        1024,
        2048,
    )
    assert figures["peak_bytes"] == 1280 + 1296 - 1024 + 2048


@pytest.mark.parametrize("scheduler", MEMORY_SCHEDULERS)
def test_memory_scheduler_option(run_cli, write, scheduler):
    """--scheduler X reports the plan of the CPU program compiled with memory_scheduler=X."""
    from xlapy.runtime import CompileOptions, Compiler

    path = write("m.hlo", SIZES)
    code, out, _ = run_cli("memory", path, "--json", "--scheduler", scheduler)
    assert code == 0
    figures = json.loads(out)
    assert figures["scheduler"] == scheduler
    options = CompileOptions.make(backend_options={"memory_scheduler": scheduler})
    stats = Compiler("cpu").compile(SIZES, options).memory_stats()
    assert (figures["temp_bytes"], figures["peak_bytes"]) == (stats.temp_bytes, stats.peak_bytes)


def test_memory_csv_to_file_and_stdout(run_cli, write, tmp_path):
    path = write("m.hlo", SIZES)
    target = tmp_path / "values.csv"
    code, out, _ = run_cli("memory", path, "--no-opt", "--csv", str(target))
    assert code == 0 and "Peak buffers:" in out
    rows = list(csv.DictReader(target.open()))
    code, out, _ = run_cli("memory", path, "--no-opt", "--csv", "-")
    assert code == 0
    assert list(csv.DictReader(io.StringIO(out))) == rows
    values = len(parse_module(SIZES).entry.instructions)  # one value each (t's: its table)
    assert len(rows) == values
    assert {"offset", "size", "start", "end", "uses"} <= set(rows[0])


def test_memory_plot(run_cli, write, tmp_path):
    target = tmp_path / "mem.png"
    code, _, err = run_cli("memory", write("m.hlo", SIZES), "--plot", str(target))
    assert code == 0
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert str(target) in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["memory", "{bad}"], "error: expected"),
        (["memory", "{m}", "--scheduler", "fastest"], "Invalid value for '--scheduler'"),
        (["memory", "/nonexistent/m.hlo"], "No such file"),
        (["opt", "{m}", "--passes=dce,fold-everything"], "unknown pass 'fold-everything'"),
        (["opt", "{m}", "--passes=,"], "--passes names no pass"),
        (["opt", "{bad}"], "error: expected"),
    ],
)
def test_errors_exit_1_with_a_message(run_cli, write, argv, message):
    paths = {"{m}": write("m.hlo", SIMPLIFIABLE), "{bad}": write("bad.hlo", "HloModule x\nENTRY {")}
    code, _, err = run_cli(*[paths.get(a, a) for a in argv])
    assert code != 0
    assert message in err
    assert "Traceback" not in err


def test_unknown_pass_lists_the_known_ones(run_cli, write):
    code, _, err = run_cli("opt", write("m.hlo", SIMPLIFIABLE), "--passes=nope")
    assert code == 1
    known = err.split("known passes:")[1]
    for name in ("algsimp", "dce", "fusion", "copy-insertion", "multi-output-fusion"):
        assert name in known


def test_opt_passes_and_dump_dir(run_cli, write, tmp_path):
    dump = tmp_path / "dump"
    path = write("m.hlo", SIMPLIFIABLE)
    code, out, err = run_cli("opt", path, "--passes=algsimp,dce", "--dump-dir", str(dump))
    assert code == 0, err
    module = parse_module(out)
    opcodes = [i.opcode.text for i in module.entry.instructions]
    assert opcodes == ["parameter", "exponential"]
    files = sorted(p.name for p in dump.iterdir())
    assert files == ["00.input.hlo", "01.algsimp.hlo", "02.dce.hlo"]
    assert "sine" in (dump / "01.algsimp.hlo").read_text()
    assert "sine" not in (dump / "02.dce.hlo").read_text()
    assert "ran 2 passes" in err


def test_opt_default_pipeline_prints_the_optimized_module(run_cli, write, tmp_path):
    out_path = tmp_path / "opt.hlo"
    code, out, _ = run_cli("opt", write("m.hlo", SIMPLIFIABLE))
    assert code == 0
    module = parse_module(out)
    assert "sine" not in out and "multiply" not in out
    assert module.entry.root.shape.dims == (8,)
    code, _, _ = run_cli("opt", write("m.hlo", SIMPLIFIABLE), "-o", str(out_path))
    assert code == 0 and out_path.read_text().strip() == out.strip()


def test_every_pass_module_is_registered_on_import():
    registering = {
        p.stem
        for p in PASSES_DIR.glob("*.py")
        if re.search(r"^@register_pass", p.read_text(), re.M)
    }
    assert registering <= set(xlapy.passes.PASS_MODULES)
    assert len(xlapy.passes.PASSES) >= len(registering)


# A while loop whose body sorts (a library thunk: the loop stays with the Python driver)
# and one whose body is one kernel (a native loop).
LOOPS = """
HloModule loops
body_sort {
  s = (s32[], f32[64]{0}) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  v = f32[64]{0} get-tuple-element(s), index=1
  n = f32[64]{0} negate(v)
  sorted = f32[64]{0} sort(n), dimensions={0}, to_apply=less
  one = s32[] constant(1)
  j = s32[] add(i, one)
  ROOT r = (s32[], f32[64]{0}) tuple(j, sorted)
}
body_kernel {
  s2 = (s32[], f32[64]{0}) parameter(0)
  i2 = s32[] get-tuple-element(s2), index=0
  v2 = f32[64]{0} get-tuple-element(s2), index=1
  e = f32[64]{0} sine(v2)
  one2 = s32[] constant(1)
  j2 = s32[] add(i2, one2)
  ROOT r2 = (s32[], f32[64]{0}) tuple(j2, e)
}
less {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT lt = pred[] compare(a, b), direction=LT
}
cond {
  cs = (s32[], f32[64]{0}) parameter(0)
  ci = s32[] get-tuple-element(cs), index=0
  three = s32[] constant(3)
  ROOT clt = pred[] compare(ci, three), direction=LT
}
ENTRY main {
  x = f32[64]{0} parameter(0)
  zero = s32[] constant(0)
  init = (s32[], f32[64]{0}) tuple(zero, x)
  w1 = (s32[], f32[64]{0}) while(init), condition=cond, body=body_sort
  y = f32[64]{0} get-tuple-element(w1), index=1
  init2 = (s32[], f32[64]{0}) tuple(zero, y)
  w2 = (s32[], f32[64]{0}) while(init2), condition=cond, body=body_kernel
  ROOT z = f32[64]{0} get-tuple-element(w2), index=1
}
"""


def test_opt_backend_lists_the_loops_driven_from_python(run_cli, write):
    code, _, err = run_cli("opt", write("loops.hlo", LOOPS), "--backend", "cpu")
    assert code == 0, err
    assert "cpu while loops driven from Python: 1" in err
    (line,) = [x for x in err.splitlines() if x.startswith("  w1") or "(while):" in x]
    assert "w1" in line and "sorted is a library thunk (it runs from Python)" in line, err
    assert "w2" not in err
