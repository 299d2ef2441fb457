"""JAX's own test suite (tests nobody on the xlapy team wrote) run against the xlapy platform.

    python benchmarks/jax_suite.py [--files lax_test,random_test] [--max-tests 150]
                                   [--cases 1] [--timeout 900] [--tests-dir DIR]

Opt-in and not part of CI (it takes minutes per file). The JAX test files are not in this
repository (they are JAX's, under JAX's licence): the script looks for them in --tests-dir
(default $JAX_SUITE_DIR, else /tmp/jax-suite-<jax version>), and when they are missing it
exports them there from a JAX git checkout (--git-dir, or $JAX_GIT_DIR) at the tag of the
installed jax (`jax-v0.10.2`), or clones that tag from GitHub. absl-py, which the tests
import, is installed into <tests-dir>/_deps when it is missing. JAX's test-only modules that
the jax wheel leaves out (jax._src.hypothesis_test_util, for state_test) are exported from
--git-dir into <tests-dir>/_test_only and loaded under their jax._src names.

Each file runs in its own pytest process with JAX_PLATFORMS=xlapy (xlapy is the only
backend), JAX_TEST_DUT=cpu (JAX's test_util then treats the device as a CPU: xlapy gets
the CPU's lowerings, dtypes and tolerances, and tests marked for CPU only run while tests
marked "not on cpu" skip; --dut xlapy runs them as an unknown platform instead), and
JAX_NUM_GENERATED_CASES=--cases (JAX's own sampling of its parameterized cases).
--max-tests keeps an evenly spread, deterministic subset of each file's collected tests
(this module is also the pytest plugin that does it). XLAPY_DEVICE_COUNT is 8 for the
files that need several devices (pjit, shard_map, pmap, array, api).

Printed per file: passed / failed / errors / skipped, whether the file timed out, and the
failure classes (exception type and the start of its message) with counts. Full logs go
to --log-dir.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

FILES: dict[str, int] = {
    # file -> XLAPY_DEVICE_COUNT
    "lax_test": 1,
    "lax_numpy_test": 1,
    "lax_control_flow_test": 1,
    "random_test": 1,
    "linalg_test": 1,
    "api_test": 8,
    "array_test": 8,
    "pjit_test": 8,
    "shard_map_test": 8,
    "ffi_test": 1,
    "pmap_test": 8,
    # added in the fourth session (2026-11-27)
    "lax_autodiff_test": 1,
    "lax_vmap_test": 1,
    "lax_numpy_reducers_test": 1,
    "lax_numpy_indexing_test": 1,
    "batching_test": 1,
    "custom_linear_solve_test": 1,
    "checkify_test": 1,
    "debugging_primitives_test": 1,
    "x64_context_test": 1,
    # host callbacks (fifth session)
    "python_callback_test": 1,
    # sixth session
    "nn_test": 1,
    "random_lax_test": 1,
    "scipy_stats_test": 1,
    "stax_test": 1,
    "ode_test": 1,
    "svd_test": 1,
    "eigh_test": 1,
    "optimizers_test": 1,
    "state_test": 1,
    # seventh session
    "fft_test": 1,
    "jax_jit_test": 1,
    "ann_test": 1,
    "custom_api_test": 1,
    "custom_root_test": 1,
    # twelfth session: files that never ran before
    "multi_device_test": 8,
    "shard_alike_test": 8,
    "linalg_sharding_test": 8,
    "custom_partitioning_test": 8,
    "pickle_test": 8,
    "transfer_guard_test": 8,
    "aot_test": 8,
}

# Test names hold spaces ("in_axes=(0, None)"): the outcome is the word before "[ nn%]"
# (on a wide terminal a skip's reason follows it in parentheses).
OUTCOME = re.compile(
    r"^(\S+::.*) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)(?: \(.*\))?(?: +\[ *\d+%\])?$"
)
SUMMARY = re.compile(r"^(FAILED|ERROR) (\S+::.*?)(?: - (.*))?$")


# --- pytest plugin: an evenly spread subset of each file's tests ------------------------


@pytest.hookimpl(wrapper=True, trylast=True)  # inside pytest's capture wrapper
def pytest_make_collect_report(collector):  # pragma: no cover - runs inside pytest
    """Before the first test file is imported: JAX's test-only modules loaded and
    `jax_test_dut` set. Done here, while pytest captures the file's collection, as in a plain
    run: `jtu.capture_stdout` binds the sys.stdout of test_util's import, and imported
    before capture started (in pytest_configure / pytest_sessionstart) it captured nothing
    (24 failures of debugging_primitives_test, one of custom_linear_solve_test)."""
    if isinstance(collector, pytest.File):
        _load_test_only()
        _set_test_dut()
    return (yield)


def _set_test_dut() -> None:
    """JAX reads `jax_test_dut` from absl flags, not from the environment: set it from
    $JAX_TEST_DUT (without this, JAX's test_util saw the platform name "xlapy")."""
    dut = os.environ.get("JAX_TEST_DUT")
    if not dut:
        return
    import jax
    from jax._src import test_util  # defines jax_test_dut

    if test_util._TEST_DUT.value != dut:
        jax.config.update("jax_test_dut", dut)


def _load_test_only() -> None:
    """Modules the tests import from jax._src that the jax wheel does not ship (the
    test-only hypothesis_test_util: state_test), loaded from $JAX_SUITE_TEST_ONLY."""
    folder = os.environ.get("JAX_SUITE_TEST_ONLY")
    if not folder:
        return
    import importlib.util

    import jax._src

    for path in sorted(Path(folder).glob("*.py")):
        name = f"jax._src.{path.stem}"
        if name in sys.modules:
            continue
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        setattr(jax._src, path.stem, module)


@pytest.hookimpl(trylast=True)  # after `-k`/`-m` deselection: sample what they kept
def pytest_collection_modifyitems(config, items):  # pragma: no cover - runs inside pytest
    """Keep $JAX_SUITE_MAX_TESTS tests, evenly spread over the collected ones (or drawn at
    random with $JAX_SUITE_SAMPLE_SEED, for a sample other than the usual one)."""
    limit = int(os.environ.get("JAX_SUITE_MAX_TESTS", "0"))
    if limit <= 0 or len(items) <= limit:
        return
    seed = os.environ.get("JAX_SUITE_SAMPLE_SEED", "")
    if seed:
        keep = set(random.Random(int(seed)).sample(range(len(items)), limit))
    else:
        step = len(items) / limit
        keep = {int(i * step) for i in range(limit)}
    deselected = [item for i, item in enumerate(items) if i not in keep]
    items[:] = [item for i, item in enumerate(items) if i in keep]
    config.hook.pytest_deselected(items=deselected)


# --- locating the tests -----------------------------------------------------------------


def jax_version() -> str:
    import jax

    return jax.__version__


def locate_tests(tests_dir: Path, git_dir: str | None) -> Path:
    """tests_dir holding JAX's tests/ (exported at the installed jax's tag when missing)."""
    if (tests_dir / "tests" / "lax_test.py").exists():
        return tests_dir
    tag = f"jax-v{jax_version()}"
    tests_dir.mkdir(parents=True, exist_ok=True)
    wanted = ["tests", "conftest.py", "pyproject.toml"]
    if git_dir:
        archive = subprocess.run(
            ["git", f"--git-dir={git_dir}", "archive", tag, *wanted],
            check=True,
            capture_output=True,
        ).stdout
        subprocess.run(["tar", "x", "-C", str(tests_dir)], input=archive, check=True)
    else:
        with tempfile.TemporaryDirectory() as clone:
            subprocess.run(
                ["git", "clone", "--depth", "1", "--branch", tag,
                 "https://github.com/jax-ml/jax", clone],
                check=True,
            )  # fmt: skip
            for name in wanted:
                source = Path(clone) / name
                target = tests_dir / name
                if source.is_dir():
                    shutil.copytree(source, target)
                else:
                    shutil.copy(source, target)
    if not (tests_dir / "tests" / "lax_test.py").exists():
        raise SystemExit(f"no JAX tests under {tests_dir} after exporting {tag}")
    return tests_dir


TEST_ONLY = ["jax/_src/hypothesis_test_util.py"]
"""Files of JAX's source tree that its tests import but the jax wheel leaves out."""


def export_test_only(tests_dir: Path, git_dir: str | None) -> Path:
    """A folder holding TEST_ONLY's files at the installed jax's tag (exported from the JAX
    checkout when missing; without one, the tests that need them fail to import)."""
    folder = tests_dir / "_test_only"
    folder.mkdir(exist_ok=True)
    for source in TEST_ONLY:
        target = folder / Path(source).name
        if target.exists() or not git_dir:
            continue
        text = subprocess.run(
            ["git", f"--git-dir={git_dir}", "show", f"jax-v{jax_version()}:{source}"],
            check=True,
            capture_output=True,
        ).stdout
        target.write_bytes(text)
    return folder


def ensure_absl(tests_dir: Path) -> Path:
    """A folder to put on PYTHONPATH that provides absl-py (installed there if needed)."""
    deps = tests_dir / "_deps"
    if (deps / "absl").exists():
        return deps
    try:
        import absl  # noqa: F401
    except ImportError:
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--target", str(deps), "absl-py"],
            check=True,
        )
    return deps


# --- running ----------------------------------------------------------------------------


def failure_class(message: str | None) -> str:
    """The exception type and the start of its message, numbers and names blurred."""
    if not message:
        return "(no message)"
    message = re.sub(r"0x[0-9a-f]+", "0x..", message)
    message = re.sub(r"\d+", "N", message)
    return message[:110]


def count(lines) -> tuple[collections.Counter[str], collections.Counter[str]]:
    """Outcomes and failure classes in pytest -v -rfE output."""
    counts: collections.Counter[str] = collections.Counter()
    classes: collections.Counter[str] = collections.Counter()
    for line in lines:
        if match := OUTCOME.match(line):
            counts[match.group(2)] += 1
        elif match := SUMMARY.match(line):
            classes[failure_class(match.group(3))] += 1
    return counts, classes


def run_file(name: str, args, tests_dir: Path, deps: Path, log_dir: Path) -> dict:
    env = dict(os.environ)
    env.update(
        JAX_SUITE_TEST_ONLY=str(tests_dir / "_test_only"),
        JAX_PLATFORMS="xlapy",
        JAX_TEST_DUT=args.dut,
        JAX_NUM_GENERATED_CASES=str(args.cases),
        JAX_SUITE_MAX_TESTS=str(args.max_tests),
        JAX_SUITE_SAMPLE_SEED="" if args.sample_seed is None else str(args.sample_seed),
        XLAPY_DEVICE_COUNT=str(FILES.get(name, 1)),
        PYTHONUNBUFFERED="1",
        COLUMNS="300",  # the short summary keeps more of each failure message
        PYTHONPATH=os.pathsep.join(
            [str(REPO), str(HERE), str(deps), env.get("PYTHONPATH", "")]
        ).rstrip(os.pathsep),
    )
    command = [
        sys.executable, "-m", "pytest", f"tests/{name}.py", "-v", "-rfE", "-n", "0",
        "-p", "no:cacheprovider", "-p", "jax_suite", "-o", "faulthandler_timeout=300",
        *args.pytest_args,
    ]  # fmt: skip
    log_path = log_dir / f"{name}.log"
    start = time.monotonic()
    with open(log_path, "w", buffering=1) as log:  # line by line: a slow file can be watched
        process = subprocess.Popen(
            command, cwd=tests_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, errors="replace", start_new_session=True,
        )  # fmt: skip
        # A hung test prints nothing: the watchdog kills the file's process group.
        watchdog = threading.Timer(args.timeout, os.killpg, (process.pid, signal.SIGKILL))
        watchdog.start()
        assert process.stdout is not None
        lines = []
        for line in process.stdout:
            log.write(line)
            lines.append(line.rstrip("\n"))
        rc = process.wait()
        timed_out = not watchdog.is_alive() and rc < 0
        watchdog.cancel()
    counts, classes = count(lines)
    return {
        "file": name,
        "passed": counts["PASSED"] + counts["XPASS"],
        "failed": counts["FAILED"],
        "errors": counts["ERROR"],
        "skipped": counts["SKIPPED"] + counts["XFAIL"],
        "seconds": time.monotonic() - start,
        "timed_out": timed_out,
        "rc": rc,
        "classes": classes,
        "log": str(log_path),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", default=",".join(FILES), help="comma-separated names")
    parser.add_argument("--tests-dir", default=os.environ.get("JAX_SUITE_DIR"))
    parser.add_argument("--git-dir", default=os.environ.get("JAX_GIT_DIR"))
    parser.add_argument("--log-dir", default=None)
    parser.add_argument("--cases", type=int, default=1, help="JAX_NUM_GENERATED_CASES")
    parser.add_argument("--max-tests", type=int, default=150, help="per file; 0: all")
    parser.add_argument(
        "--sample-seed", type=int, default=None,
        help="draw the --max-tests sample at random with this seed (default: evenly spread)",
    )  # fmt: skip
    parser.add_argument("--timeout", type=float, default=900, help="seconds per file")
    parser.add_argument("--dut", default="cpu", help="JAX_TEST_DUT (cpu or xlapy)")
    parser.add_argument("--recount", help="only count the outcomes in this log folder")
    parser.add_argument("pytest_args", nargs="*", help="passed to pytest (after --)")
    args = parser.parse_args(argv)
    if args.recount:
        for log in sorted(Path(args.recount).glob("*.log")):
            counts, classes = count(log.read_text(errors="replace").splitlines())
            print(log.stem, dict(counts), dict(classes.most_common(8)))
        return 0

    tests_dir = Path(args.tests_dir or f"/tmp/jax-suite-{jax_version()}")
    tests_dir = locate_tests(tests_dir, args.git_dir)
    deps = ensure_absl(tests_dir)
    export_test_only(tests_dir, args.git_dir)
    log_dir = Path(args.log_dir or tests_dir / "logs")
    log_dir.mkdir(parents=True, exist_ok=True)

    rows = []
    for name in args.files.split(","):
        row = run_file(name, args, tests_dir, deps, log_dir)
        rows.append(row)
        note = " TIMED OUT" if row["timed_out"] else ""
        print(
            f"{name:24s} passed {row['passed']:4d}  failed {row['failed']:4d}  errors "
            f"{row['errors']:3d}  skipped {row['skipped']:4d}  {row['seconds']:6.0f} s{note}",
            flush=True,
        )
        for text, times in row["classes"].most_common(8):
            print(f"    {times:4d} x {text}", flush=True)
    total = {k: sum(r[k] for r in rows) for k in ("passed", "failed", "errors", "skipped")}
    print("total", "  ".join(f"{k} {v}" for k, v in total.items()))
    print(f"logs in {log_dir}")
    return 0 if not (total["failed"] or total["errors"]) else 1


if __name__ == "__main__":
    sys.exit(main())
