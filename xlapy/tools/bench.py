"""`xlapy bench MODULE.hlo`: compile and run a module, report compile and run times.

Compile time is measured twice, each time with a fresh runtime client and the process's
in-memory kernel cache emptied: cold, with a new empty kernel cache directory
($XLAPY_CACHE_DIR pointed at a temporary folder), and warm, with the directory the cold
compile filled. Run time covers `LoadedExecutable.execute` until every output buffer is
ready: the inputs are transferred to the device once, before the timed runs, so transfers
are not counted. `--warmup` untimed runs come first; the report gives the median, minimum,
mean and the 10th and 90th percentiles over `--runs` timed runs. A module with several
replicas or partitions runs on as many devices (every device given the same inputs); the
report adds, per device, the median time until its outputs were ready.

`--profile` then runs the warm program `--runs` more times with the profiler
(xlapy.runtime.profiler): time per thunk with its HLO, op_name and source line, most first,
the thunks of loop bodies, branches and called computations included (per iteration, summed);
`--trace FILE.json` writes those runs as a Chrome/Perfetto trace. `--verbose` echoes the
cold compile's progress (once it runs past a second), its time per pass, and (CPU backend)
where the cold compile went: thread CPU and wall time of each phase on the main thread
(parsing, printing, verification, HLO passes, memory-plan choice, buffer assignment,
lowering, LLVM IR emission, cache writes, the program image, Python's garbage collection)
and on the compile pool (LLVM's optimization and code generation),
backends/cpu/jit/compile_timing.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import click
import numpy as np


@dataclass(frozen=True, slots=True)
class BenchResult:
    """Times of one `xlapy bench` measurement (what `--json` prints)."""

    module: str
    backend: str
    compile_cold_ms: float
    compile_warm_ms: float
    run_median_us: float
    run_min_us: float
    run_mean_us: float
    run_p10_us: float
    run_p90_us: float
    runs: int
    warmup: int
    devices: int = 1
    device_median_us: tuple[float, ...] = ()
    """Multi-device programs: per device, the median time until its outputs were ready."""
    fallbacks: tuple[str, ...] = ()
    """The instructions the backend runs with the interpreter's rule: "name (opcode): why"."""

    def to_text(self) -> str:
        text = (
            f"{self.module} on {self.backend}\n"
            f"compile: cold {self.compile_cold_ms:.2f} ms, warm {self.compile_warm_ms:.2f} ms\n"
            f"run:     median {format_us(self.run_median_us)}, min {format_us(self.run_min_us)}, "
            f"p10 {format_us(self.run_p10_us)}, p90 {format_us(self.run_p90_us)} "
            f"({self.runs} runs after {self.warmup} warm-up)"
        )
        if self.devices > 1:
            per = ", ".join(f"{i}: {format_us(t)}" for i, t in enumerate(self.device_median_us))
            text += f"\n{self.devices} devices, median time until each device's outputs: {per}"
        text += f"\nfallbacks: {len(self.fallbacks) or 'none'}"
        return "\n  ".join([text, *self.fallbacks])


def format_us(us: float) -> str:
    """A duration given in microseconds, in the unit that keeps it readable (us, ms or s)."""
    if us >= 1e6:
        return f"{us / 1e6:.3f} s"
    if us >= 1e3:
        return f"{us / 1e3:.2f} ms"
    return f"{us:.1f} us"


@contextlib.contextmanager
def kernel_cache_dir(path: str) -> Iterator[None]:
    """Point the CPU kernel disk cache at `path` for the duration of the block."""
    old = os.environ.get("XLAPY_CACHE_DIR")
    os.environ["XLAPY_CACHE_DIR"] = path
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("XLAPY_CACHE_DIR", None)
        else:
            os.environ["XLAPY_CACHE_DIR"] = old


def clear_process_kernel_cache() -> None:
    """Forget the kernels the CPU compiler keeps in memory, so the next compile reads the
    disk cache (or compiles) again."""
    from xlapy.backends.cpu.jit.kernel import clear_kernel_cache

    clear_kernel_cache()


def _to_buffers(client, value, device=None):
    if isinstance(value, tuple):
        return tuple(_to_buffers(client, v, device) for v in value)
    if isinstance(value, np.ndarray):
        return client.buffer_from_pyval(value, device)
    return value


def load_compiler_ms(backend: str) -> float:
    """Milliseconds to import `backend`'s compiler (0 once imported, and for backends
    whose compiler is imported with them): what the process's first cold compile would
    otherwise pay (xlapy.backends.cpu.compiler.load_compiler)."""
    if backend != "cpu":
        return 0.0
    from xlapy.backends.cpu.compiler import load_compiler

    start = time.perf_counter()
    load_compiler()
    return 1e3 * (time.perf_counter() - start)


def time_compile(backend: str, text: str, replicas: int = 1, partitions: int = 1):
    """(milliseconds, loaded executable) of one compile by a fresh client (with a device
    per replica and partition). The CPU compiler's modules are imported before the timer
    starts (`load_compiler_ms`), as XLA's compiler is loaded with jaxlib before its own."""
    from xlapy.runtime import Client
    from xlapy.runtime.options import CompileOptions

    load_compiler_ms(backend)
    clear_process_kernel_cache()
    client = Client(backend, device_count=replicas * partitions)
    options = CompileOptions.make(num_replicas=replicas, num_partitions=partitions)
    start = time.perf_counter()
    executable = client.compile(text, options)
    return 1e3 * (time.perf_counter() - start), executable


def program_fallbacks(backend: str, module) -> tuple[str, ...]:
    """The instructions `backend` runs `module` with the interpreter's rule for, as
    "name (opcode): reason" (one compile, from the kernel cache a timed compile filled).
    A module that needs several devices is compiled as one device's program would be
    before partitioning; where that fails, the one line says why."""
    from xlapy.backends import get_backend
    from xlapy.errors import XlapyError

    try:
        program = get_backend(backend).compile(module)
    except XlapyError as e:
        return (f"(not listed: compiling for one device failed: {e})",)
    return tuple(str(f) for f in program.fallbacks)


def time_runs(executable, args, runs: int, warmup: int) -> tuple[np.ndarray, np.ndarray]:
    """Seconds of each of `runs` timed executions (after `warmup` untimed ones), and per
    run and device the seconds until that device's outputs were ready (every device gets
    the same arguments)."""
    devices = executable.addressable_devices
    buffers = [[_to_buffers(executable.client, a, d) for a in args] for d in devices]
    for b in (leaf for row in buffers for leaf in row):
        for leaf in b if isinstance(b, tuple) else (b,):
            if hasattr(leaf, "block_until_ready"):
                leaf.block_until_ready()
    times, per_device = [], []
    for i in range(warmup + runs):
        start = time.perf_counter()
        ready = []
        for outputs in executable.execute(buffers):
            for out in outputs:
                out.block_until_ready()
            ready.append(time.perf_counter() - start)
        elapsed = time.perf_counter() - start
        if i >= warmup:
            times.append(elapsed)
            per_device.append(ready)
    return np.asarray(times), np.asarray(per_device)


def bench_module(
    module, args, backend: str, runs: int, warmup: int, verbose=None, profile=None
) -> BenchResult:
    """Measure compile (cold and warm kernel cache) and run times of `module` on `args`.
    `verbose(line)`: echo the cold compile's progress and per-pass times through it.
    `profile(executable)`: called with the warm executable after the timed runs."""
    text = module.to_text()
    counts = (max(module.config.replica_count, 1), max(module.config.num_partitions, 1))
    with tempfile.TemporaryDirectory(prefix="xlapy-bench-") as tmp, kernel_cache_dir(tmp):
        if verbose is None:
            cold_ms, _ = time_compile(backend, text, *counts)
        else:
            from xlapy.backends.cpu.jit.compile_timing import recording
            from xlapy.tools.progress import compile_progress

            imports_ms = load_compiler_ms(backend)
            if imports_ms >= 1:
                verbose(f"compiler loaded first: {imports_ms:.0f} ms (once a process)")
            cpu = time.process_time()
            with compile_progress(verbose) as progress, recording() as phases:
                cold_ms, _ = time_compile(backend, text, *counts)
            cpu = time.process_time() - cpu
            verbose(progress.summary())
            if phases.phases:  # (the CPU backend's phases; other backends record none)
                verbose(phases.summary(cold_ms / 1e3, cpu))
        warm_ms, executable = time_compile(backend, text, *counts)
        times, per_device = time_runs(executable, args, runs, warmup)
        times *= 1e6
        fallbacks = program_fallbacks(backend, module)
        if profile is not None:
            profile(executable)
    return BenchResult(
        module=module.name,
        backend=backend,
        compile_cold_ms=round(cold_ms, 3),
        compile_warm_ms=round(warm_ms, 3),
        run_median_us=round(float(np.median(times)), 3),
        run_min_us=round(float(times.min()), 3),
        run_mean_us=round(float(times.mean()), 3),
        run_p10_us=round(float(np.percentile(times, 10)), 3),
        run_p90_us=round(float(np.percentile(times, 90)), 3),
        runs=runs,
        warmup=warmup,
        devices=counts[0] * counts[1],
        device_median_us=tuple(round(float(t) * 1e6, 3) for t in np.median(per_device, axis=0))
        if counts[0] * counts[1] > 1
        else (),
        fallbacks=fallbacks,
    )


@click.command("bench")
@click.argument("module_path", metavar="MODULE.hlo", type=click.Path(dir_okay=False))
@click.option("--inputs", type=click.Path(dir_okay=False), help="param_0, param_1, ... arrays")
@click.option("--random-inputs", is_flag=True, help="run on fresh random inputs")
@click.option("--seed", type=int, default=0, show_default=True, help="seed of --random-inputs")
@click.option("--backend", default="cpu", show_default=True, help="runtime platform")
@click.option("--runs", type=click.IntRange(min=1), default=20, show_default=True)
@click.option("--warmup", type=click.IntRange(min=0), default=3, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
@click.option(
    "--profile", is_flag=True, help="time every thunk (fusion, library call) of the program"
)
@click.option(
    "--trace",
    "trace_path",
    metavar="FILE.json",
    type=click.Path(dir_okay=False),
    help="write the profiled runs as a Chrome/Perfetto trace (implies --profile)",
)
@click.option("--top", type=click.IntRange(min=1), default=25, show_default=True)
@click.option("--verbose", "-v", is_flag=True, help="compile progress and time per pass")
def bench(
    module_path,
    inputs,
    random_inputs,
    seed,
    backend,
    runs,
    warmup,
    as_json,
    profile,
    trace_path,
    top,
    verbose,
):
    """Compile MODULE.hlo (cold and warm kernel cache) and time repeated runs; with
    --profile, where each run spends its time, thunk by thunk, most first."""
    from xlapy.tools.cli import load_module, select_inputs

    module = load_module(module_path)
    args = select_inputs(module, inputs, random_inputs, seed)
    profiled = []

    def take_profile(executable) -> None:
        from xlapy.runtime.profiler import ProfilerError, profile_program

        if len(executable.addressable_devices) > 1:
            raise ProfilerError("--profile runs programs of one device (one replica, partition)")
        profiled.append(profile_program(executable.backend_program(), args, runs))

    echo = (lambda line: click.echo(line, err=True)) if verbose else None
    result = bench_module(
        module, args, backend, runs, warmup, echo, take_profile if profile or trace_path else None
    )
    report = profiled[0] if profiled else None
    if trace_path and report is not None:
        report.write_trace(trace_path)
        click.echo(f"wrote the trace of {runs} profiled runs to {trace_path}", err=True)
    if as_json:
        data: dict = asdict(result)
        if report is not None:
            data["profile"] = report.to_json()
        click.echo(json.dumps(data))
    else:
        click.echo(result.to_text())
        if report is not None:
            click.echo(report.to_text(top), nl=False)
