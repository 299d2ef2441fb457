"""`xlapy bench`: compile and run times as text and JSON, inputs from .npz or random, and
errors as a message with exit status 1 (on the interpreter and on the CPU backend)."""

import json

import numpy as np
import pytest

from xlapy.tools import cli
from xlapy.tools.bench import bench

MODULE = """HloModule bench_me

ENTRY main {
  a = f32[16,8] parameter(0)
  b = f32[16,8] parameter(1)
  e = f32[16,8] exponential(a)
  ROOT s = f32[16,8] add(e, b)
}
"""

TUPLE_PARAM = """HloModule tuple_param

ENTRY main {
  p = (f32[5], s32[3]) parameter(0)
  a = f32[5] get-tuple-element(p), index=0
  ROOT n = f32[5] negate(a)
}
"""

KEYS = {"compile_cold_ms", "compile_warm_ms", "run_median_us", "run_min_us", "runs"}


@pytest.fixture(autouse=True)
def _kernel_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("XLAPY_CACHE_DIR", str(tmp_path / "kernels"))


def test_bench_is_a_command_of_the_cli():
    assert cli.cli.commands["bench"] is bench


@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
def test_json_report(run_cli, write, tmp_path, backend):
    rng = np.random.default_rng(7)
    inputs = tmp_path / "in.npz"
    np.savez(
        inputs,
        param_0=rng.standard_normal((16, 8)).astype(np.float32),
        param_1=rng.standard_normal((16, 8)).astype(np.float32),
    )
    args = ["bench", write("m.hlo", MODULE), "--inputs", str(inputs), "--backend", backend]
    code, out, err = run_cli(*args, "--json", "--runs", "7", "--warmup", "2")
    assert code == 0, err
    report = json.loads(out)
    assert set(report) >= KEYS
    assert report["runs"] == 7 and report["warmup"] == 2
    assert report["module"] == "bench_me" and report["backend"] == backend
    assert report["compile_cold_ms"] > 0 and report["compile_warm_ms"] > 0
    assert 0 < report["run_min_us"] <= report["run_p10_us"] <= report["run_median_us"]
    assert report["run_median_us"] <= report["run_p90_us"]


@pytest.mark.parametrize("module", [MODULE, TUPLE_PARAM])
def test_text_report_random_inputs(run_cli, write, module):
    code, out, err = run_cli("bench", write("m.hlo", module), "--random-inputs", "--runs", "3")
    assert code == 0, err
    assert "compile: cold" in out and "warm" in out
    assert "median" in out and "(3 runs after 3 warm-up)" in out


def test_verbose_report_breaks_the_cold_compile_down(run_cli, write):
    code, out, err = run_cli("bench", write("m.hlo", MODULE), "--random-inputs", "-v")
    assert "compile: cold" in out
    assert code == 0, err
    assert "cold compile:" in err and "process CPU" in err
    main = err[err.index("  main thread:") : err.index("  compile pool (LLVM):")]
    for name in ("HLO passes", "memory-plan choice", "LLVM IR emission (Python)"):
        assert name in main
    # (buffer assignment is a phase of its own unless the plan choice's winning trial made it)
    pool = err[err.index("  compile pool (LLVM):") :]
    assert "LLVM optimization" in pool and "LLVM code generation" in pool


def test_phases_nest_and_count_on_their_own_thread():
    import threading
    import time

    from xlapy.backends.cpu.jit.compile_timing import phase, recording

    def spin(seconds: float) -> None:
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass

    with phase("not recorded"):
        spin(0.001)
    with recording() as times:
        with phase("outer"):
            spin(0.02)
            with phase("inner"):
                spin(0.03)

        def pooled() -> None:
            with phase("pooled"):
                spin(0.01)

        worker = threading.Thread(target=pooled)
        worker.start()
        worker.join(timeout=60)
        assert not worker.is_alive(), "the pooled phase's thread hung"
    outer, inner = times.phases["main", "outer"], times.phases["main", "inner"]
    assert 0.02 <= outer.cpu < 0.03 + 0.02 and outer.count == 1  # the inner phase's 0.03 s not
    assert inner.cpu >= 0.03 and inner.count == 1
    assert ("main", "not recorded") not in times.phases
    assert times.phases["pool", "pooled"].cpu >= 0.01 and ("main", "pooled") not in times.phases
    text = times.summary(1.0, 2.0)
    assert text.index("outer") > text.index("inner")  # most CPU first


def test_garbage_collection_is_a_phase_of_its_own():
    import gc

    from xlapy.backends.cpu.jit.compile_timing import GARBAGE_COLLECTION, phase, recording

    junk = []
    for _ in range(200_000):  # cycles for the collection to walk
        node: list = []
        node.append(node)
        junk.append(node)
    with recording() as times, phase("compiling"):
        gc.collect()
    collection = times.phases["main", GARBAGE_COLLECTION]
    assert collection.count >= 1 and collection.cpu > 0
    assert times.phases["main", "compiling"].cpu < collection.cpu  # not counted twice
    assert _collection_hook_count() == 0, "the recording leaves no gc callback behind"


def _collection_hook_count() -> int:
    import gc

    from xlapy.backends.cpu.jit import compile_timing

    return sum(1 for c in gc.callbacks if c is compile_timing._collection)


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--backend", "tpu", "--random-inputs"], "unknown platform 'tpu'"),
        ([], "give --inputs FILE.npz or --random-inputs"),
        (["--inputs", "{missing}"], "cannot read inputs"),
        (["--inputs", "{bad}"], "param_1: expected f32[16,8]"),
        (["--random-inputs", "--runs", "0"], "--runs"),
    ],
)
def test_errors_exit_1_with_a_message(run_cli, write, tmp_path, argv, fragment):
    bad = tmp_path / "bad.npz"
    np.savez(bad, param_0=np.ones((16, 8), np.float32), param_1=np.ones((3,), np.float32))
    paths = {"missing": str(tmp_path / "nope.npz"), "bad": str(bad)}
    argv = [a.format(**paths) for a in argv]
    code, _, err = run_cli("bench", write("m.hlo", MODULE), *argv)
    assert code != 0
    assert fragment in err
    assert "Traceback" not in err


def test_parse_error_exit_1(run_cli, write):
    code, _, err = run_cli("bench", write("bad.hlo", "HloModule m\nENTRY e {"), "--json")
    assert code == 1
    assert "bad.hlo" in err and "error" in err


@pytest.mark.parametrize(
    "us,text",
    [(12.34, "12.3 us"), (4567.8, "4.57 ms"), (335511.3, "335.51 ms"), (2.5e6, "2.500 s")],
)
def test_times_are_printed_in_a_readable_unit(us, text):
    from xlapy.tools.bench import format_us

    assert format_us(us) == text


def test_per_device_times_are_scaled_like_the_run_times():
    from xlapy.tools.bench import BenchResult

    result = BenchResult(
        "m", "cpu", 1.0, 1.0, 2500.0, 2000.0, 2600.0, 2100.0, 3000.0, 5, 1,
        devices=2, device_median_us=(2400.0, 1_500_000.0),
    )  # fmt: skip
    assert "0: 2.40 ms, 1: 1.500 s" in result.to_text()
