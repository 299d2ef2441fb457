"""The profiler (time per thunk with its HLO and source line, a Chrome trace), `xlapy bench
--profile/--trace/--verbose`, and per-pass timing of pipelines."""

from __future__ import annotations

import json

import numpy as np
import pytest

from xlapy.backends import get_backend
from xlapy.ir.parser import parse_module
from xlapy.passes.pipelines import default_cpu_pipeline
from xlapy.runtime.profiler import ProfilerError, profile_program
from xlapy.tools.progress import compile_progress

DOT_META = 'metadata={op_name="jit(f)/dot_general" source_file="model.py" source_line=12}'
PROGRAM = f"""HloModule profiled
ENTRY main {{
  x = f32[64,64] parameter(0)
  w = f32[64,64] parameter(1)
  d = f32[64,64] dot(x, w), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}, {DOT_META}
  t = f32[64,64] tanh(d), metadata={{op_name="jit(f)/tanh" source_file="model.py" source_line=13}}
  e = f32[64,64] exponential(t)
  ROOT s = f32[64,64] sort(e), dimensions={{1}}, to_apply=lt
}}

lt {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = pred[] compare(a, b), direction=LT
}}
"""


def _args():
    rng = np.random.default_rng(21)
    return [rng.standard_normal((64, 64)).astype(np.float32) for _ in range(2)]


def test_profile_times_every_thunk_with_its_hlo_and_source():
    program = get_backend("cpu").compile(parse_module(PROGRAM))
    args = _args()
    profile = profile_program(program, args, runs=4)
    rows = profile.rows()
    assert [r.total_ns for r in rows] == sorted((r.total_ns for r in rows), reverse=True)
    entry_thunks = program.compiled.entry.thunks
    assert {r.name for r in rows} == {t.instr.name for t in entry_thunks}
    assert all(r.calls == 4 and r.total_ns > 0 for r in rows)
    dot = next(r for r in rows if r.opcode == "dot")
    assert (dot.op_name, dot.source) == ("jit(f)/dot_general", "model.py:12")
    assert "dot(" in dot.hlo and dot.kind == "blas"
    text = profile.to_text()
    assert "Profile of profiled: 4 runs" in text and "model.py:12" in text
    # the profiled runs computed the right values
    x, w = args
    want = np.sort(np.exp(np.tanh(x @ w)), axis=1)
    np.testing.assert_allclose(program.run(args), want, rtol=1e-4, atol=1e-5)


def test_chrome_trace_has_one_complete_event_per_thunk_run(tmp_path):
    program = get_backend("cpu").compile(parse_module(PROGRAM))
    profile = profile_program(program, _args(), runs=3)
    path = profile.write_trace(tmp_path / "trace.json")
    trace = json.loads(path.read_text())
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(events) == 3 * len(program.compiled.entry.thunks)
    assert all(e["dur"] >= 0 and "hlo" in e["args"] for e in events)
    starts = [e["ts"] for e in events]
    assert starts == sorted(starts)
    data = profile.to_json()
    assert data["runs"] == 3 and data["steps"][0]["us_per_run"] >= data["steps"][-1]["us_per_run"]


def test_profiling_the_interpreter_is_a_clear_error():
    program = get_backend("interpreter").compile(parse_module(PROGRAM))
    with pytest.raises(ProfilerError, match="profile on the cpu backend"):
        profile_program(program, _args(), runs=1)
    with pytest.raises(ProfilerError, match="runs must be >= 1"):
        profile_program(program, _args(), runs=0)


def test_bench_profile_trace_and_verbose(run_cli, write, tmp_path):
    path = write("m.hlo", PROGRAM)
    trace = tmp_path / "t.json"
    code, out, err = run_cli(
        "bench", path, "--random-inputs", "--runs", "2", "--warmup", "1", "--profile",
        "--trace", str(trace), "--verbose",
    )  # fmt: skip
    assert code == 0, err
    assert "Profile of profiled: 2 runs" in out and "HLO of the top steps:" in out
    assert json.loads(trace.read_text())["traceEvents"]
    assert "compile " in err and "fusion" in err and "outside the passes" in err
    code, out, err = run_cli("bench", path, "--random-inputs", "--runs", "2", "--json", "--profile")
    assert code == 0, err
    assert json.loads(out)["profile"]["steps"]


def test_pipelines_time_each_pass_and_report_progress():
    module = parse_module(PROGRAM)
    lines: list[str] = []
    with compile_progress(lines.append) as progress:
        pipeline = default_cpu_pipeline(verify=False)
        pipeline.run(module)
    assert len(pipeline.seconds) == len(pipeline.log) > 0
    assert [p[1] for p in progress.passes] == [name for name, _ in pipeline.log]
    summary = progress.summary()
    assert "fusion" in summary and "outside the passes" in summary


def test_run_verbose_reports_time_per_pass(run_cli, write, tmp_path, monkeypatch):
    monkeypatch.setenv("XLAPY_CACHE_DIR", str(tmp_path / "cache"))  # the passes do run
    code, out, err = run_cli("run", write("m.hlo", PROGRAM), "--random-inputs", "--verbose")
    assert code == 0, err
    assert "output_0: f32[64,64]" in out
    assert "passes" in err and "algsimp" in err and "outside the passes" in err


LOOP_META = 'metadata={op_name="jit(f)/while/body/tanh" source_file="loop.py" source_line=7}'
LOOP_PROGRAM = f"""HloModule looped
body {{
  p = (s32[], f32[32,32], f32[32,32]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  x = f32[32,32] get-tuple-element(p), index=1
  w = f32[32,32] get-tuple-element(p), index=2
  d = f32[32,32] dot(x, w), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  t = f32[32,32] tanh(d), {LOOP_META}
  one = s32[] constant(1)
  j = s32[] add(i, one)
  ROOT r = (s32[], f32[32,32], f32[32,32]) tuple(j, t, w)
}}

cond {{
  cp = (s32[], f32[32,32], f32[32,32]) parameter(0)
  ci = s32[] get-tuple-element(cp), index=0
  n = s32[] constant(5)
  ROOT lt = pred[] compare(ci, n), direction=LT
}}

ENTRY main {{
  x0 = f32[32,32] parameter(0)
  w0 = f32[32,32] parameter(1)
  zero = s32[] constant(0)
  init = (s32[], f32[32,32], f32[32,32]) tuple(zero, x0, w0)
  loop = (s32[], f32[32,32], f32[32,32]) while(init), condition=cond, body=body
  y = f32[32,32] get-tuple-element(loop), index=1
  ROOT e = f32[32,32] exponential(y)
}}
"""


def test_profile_times_the_thunks_inside_a_loop_body_every_iteration(tmp_path):
    program = get_backend("cpu").compile(parse_module(LOOP_PROGRAM))
    described = "\n".join(program.compiled.entry.describe())
    assert "(native loop)" in described  # profiled all the same, thunk by thunk
    rng = np.random.default_rng(7)
    args = [rng.standard_normal((32, 32)).astype(np.float32) * 0.3 for _ in range(2)]
    profile = profile_program(program, args, runs=3)
    rows = {r.name: r for r in profile.rows()}
    loop = next(r for r in rows.values() if r.opcode == "while")
    inside = [r for r in rows.values() if r.parent == loop.name]
    assert inside, profile.to_text()
    dot = next(r for r in inside if r.opcode == "dot")
    assert dot.calls == 3 * 5 and dot.depth == 1 and dot.sequence != profile.entry
    tanh = next(r for r in inside if r.source == "loop.py:7")
    assert tanh.calls == 3 * 5 and tanh.op_name == "jit(f)/while/body/tanh"
    # the body's steps ran inside the loop's: their time is part of it
    assert sum(r.total_ns for r in inside) <= loop.total_ns
    assert f"(in {loop.name}: " in profile.to_text()
    assert any(s["parent"] == loop.name for s in profile.to_json()["steps"])
    # in the trace each body event lies inside one of the loop's events, on its thread
    trace = json.loads(profile.write_trace(tmp_path / "t.json").read_text())
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert [e["ts"] for e in events] == sorted(e["ts"] for e in events)
    loops = [e for e in events if e["name"] == loop.name]
    nested = [e for e in events if e["args"]["in"] == loop.name]
    assert len(loops) == 3 and len(nested) >= 2 * 15
    for e in nested:
        assert any(
            o["tid"] == e["tid"]
            and o["ts"] <= e["ts"]
            and e["ts"] + e["dur"] <= o["ts"] + o["dur"] + 1e-3
            for o in loops
        )
    # the profiled runs (loop run from Python) give the values the interpreter gives
    x, w = args
    want = get_backend("interpreter").compile(parse_module(LOOP_PROGRAM)).run(args)
    got = program.run(args)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for _ in range(5):
        x = np.tanh(x @ w)
    np.testing.assert_allclose(got, np.exp(x), rtol=1e-4, atol=1e-5)
