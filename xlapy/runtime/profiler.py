"""A profiler: where a compiled program spends its run time, step by step.

`profile_program(program, args, runs)` runs a backend program (a CompiledProgram) `runs`
times on the calling thread with a Profile installed (xlapy.backends.base.PROFILE). The CPU
backend then runs every thunk sequence one thunk after another (no concurrent graph), and
the Profile times each thunk: a fused kernel, a BLAS call, a library step, a control-flow
op (a while loop, a conditional, a call: its whole run). The thunks of the computations a
control-flow op runs (a loop's condition and body, a branch, a called computation) are
timed too, every time they run: a loop body's thunk has one call per iteration, its time
summed over them, and its row names the op it runs in (a loop compiled to one native
function runs thunk by thunk from Python while profiled, so that each step can be timed).
Each row of the report is one thunk: its instruction with its HLO text, the op_name and
source line JAX put in its metadata, the control-flow op it runs in, its calls, total and
mean time and share of the run, sorted by total time. `chrome_trace()` gives the same runs
as a Chrome / Perfetto trace (JSON "X" events, one per thunk run, sorted by start; a nested
thunk's event lies inside its loop's on the same thread, so the viewer draws it below it;
open it in ui.perfetto.dev or chrome://tracing).

The interpreter backend runs no thunks: profiling it is a ProfilerError.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xlapy.backends.base import PROFILE, CompiledProgram
from xlapy.errors import XlapyError


class ProfilerError(XlapyError):
    """A program that cannot be profiled."""


@dataclass
class StepStats:
    """The runs of one step (thunk) of a program."""

    sequence: str
    kind: str
    name: str
    opcode: str
    hlo: str
    op_name: str
    source: str
    parent: str = ""
    """The control-flow instruction whose computation runs this step ("" in the entry)."""
    depth: int = 0
    """How many control-flow ops this step runs inside (0 in the entry)."""
    calls: int = 0
    total_ns: int = 0

    @property
    def mean_us(self) -> float:
        return self.total_ns / max(self.calls, 1) / 1e3


@dataclass
class Profile:
    """Per-step times of the runs made while it is installed (see the module comment)."""

    program: str
    entry: str = ""
    """The name of the entry computation's sequence (the first sequence run)."""
    steps: dict[int, StepStats] = field(default_factory=dict)
    events: list[tuple[int, int, int, int]] = field(default_factory=list)
    """(step id, start ns, duration ns, thread id) of every step run, for the trace (a
    nested step's event is recorded before its loop's, which ends after it)."""
    runs: list[int] = field(default_factory=list)
    """Wall nanoseconds of each whole run."""
    origin: int = field(default_factory=time.perf_counter_ns)
    _running: list[Any] = field(default_factory=list, repr=False)
    """The steps running now, outermost first (a loop's step while its body runs)."""

    def run_sequence(self, name: str, steps: Sequence[Any], run: Callable[[Any], None]) -> None:
        """Run `steps` in order with `run(step)`, timing each (the backend's hook)."""
        clock = time.perf_counter_ns
        tid = threading.get_ident()
        if not self.entry:
            self.entry = name
        running = self._running
        for step in steps:
            running.append(step)
            start = clock()
            try:
                run(step)
            finally:
                elapsed = clock() - start
                running.pop()
            stats = self.steps.get(id(step))
            if stats is None:
                stats = self.steps[id(step)] = _describe(name, step)
                if running:
                    stats.parent = _describe(name, running[-1]).name
                    stats.depth = len(running)
            stats.calls += 1
            stats.total_ns += elapsed
            self.events.append((id(step), start - self.origin, elapsed, tid))

    @property
    def total_ns(self) -> int:
        return sum(self.runs)

    def rows(self) -> list[StepStats]:
        """The steps, most time first."""
        return sorted(self.steps.values(), key=lambda s: -s.total_ns)

    def to_text(self, top: int = 25) -> str:
        """The report: one line per step, most time first, then the HLO of the top ones."""
        runs = max(len(self.runs), 1)
        per_run = self.total_ns / runs
        in_steps = sum(s.total_ns for s in self.steps.values() if s.sequence == self.entry)
        lines = [
            f"Profile of {self.program}: {len(self.runs)} runs, {_us(per_run)} per run "
            f"(thunks run one by one), of which the entry's steps {_us(in_steps / runs)}",
            f"  {'#':>3} {'time/run':>10} {'%':>6} {'calls':>6} {'kind':<8} "
            f"{'instruction':<28} {'opcode':<16} op_name / source",
        ]
        rows = self.rows()
        for n, s in enumerate(rows[:top], 1):
            share = 100.0 * s.total_ns / max(self.total_ns, 1)
            inside = f"(in {s.parent}: {s.sequence})" if s.parent else ""
            where = " ".join(x for x in (s.op_name, s.source, inside) if x)
            lines.append(
                f"  {n:>3} {_us(s.total_ns / runs):>10} {share:>5.1f}% {s.calls // runs:>6} "
                f"{s.kind:<8} {s.name:<28} {s.opcode:<16} {where}"
            )
        if len(rows) > top:
            rest = sum(s.total_ns for s in rows[top:]) / runs
            lines.append(f"      {_us(rest):>10}         ({len(rows) - top} more steps)")
        lines.append("")
        lines.append("HLO of the top steps:")
        for n, s in enumerate(rows[: min(top, 5)], 1):
            lines.append(f"  {n:>3} {s.hlo}")
        return "\n".join(lines) + "\n"

    def to_json(self) -> dict[str, Any]:
        runs = max(len(self.runs), 1)
        return {
            "program": self.program,
            "runs": len(self.runs),
            "run_us": [round(r / 1e3, 3) for r in self.runs],
            "steps": [
                {
                    "sequence": s.sequence,
                    "parent": s.parent,
                    "depth": s.depth,
                    "kind": s.kind,
                    "instruction": s.name,
                    "opcode": s.opcode,
                    "op_name": s.op_name,
                    "source": s.source,
                    "calls_per_run": s.calls / runs,
                    "us_per_run": round(s.total_ns / runs / 1e3, 3),
                    "mean_us": round(s.mean_us, 3),
                    "hlo": s.hlo,
                }
                for s in self.rows()
            ],
        }

    def chrome_trace(self) -> dict[str, Any]:
        """The runs as Chrome trace events (microsecond timestamps)."""
        threads: dict[int, int] = {}
        events: list[dict[str, Any]] = [
            {"name": "process_name", "ph": "M", "pid": 0, "args": {"name": self.program}}
        ]
        for step_id, start, duration, tid in sorted(self.events, key=lambda e: (e[1], -e[2])):
            s = self.steps[step_id]
            events.append(
                {
                    "name": s.name,
                    "cat": s.kind,
                    "ph": "X",
                    "ts": start / 1e3,
                    "dur": duration / 1e3,
                    "pid": 0,
                    "tid": threads.setdefault(tid, len(threads)),
                    "args": {
                        "opcode": s.opcode,
                        "op_name": s.op_name,
                        "source": s.source,
                        "computation": s.sequence,
                        "in": s.parent,
                        "hlo": s.hlo,
                    },
                }
            )
        return {"traceEvents": events, "displayTimeUnit": "ms"}

    def write_trace(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.chrome_trace()))
        return path


def profile_program(program: CompiledProgram, args: Sequence[Any], runs: int = 10) -> Profile:
    """Run `program` on `args` `runs` times (after one untimed run) with a Profile
    installed on this thread; returns it."""
    if runs < 1:
        raise ProfilerError(f"runs must be >= 1, got {runs}")
    program.run(args)  # warm-up: first-run costs (loading kernels) are not the program's
    profile = Profile(program.module.name)
    token = PROFILE.set(profile)
    try:
        for _ in range(runs):
            start = time.perf_counter_ns()
            program.run(args)
            profile.runs.append(time.perf_counter_ns() - start)
            if not profile.steps:
                raise ProfilerError(
                    f"{program.module.name}: its backend runs no steps to time (the "
                    "interpreter evaluates the module as a whole); profile on the cpu backend"
                )
    finally:
        PROFILE.reset(token)
    return profile


def _describe(sequence: str, step: Any) -> StepStats:
    instr = getattr(step, "instr", None)
    if instr is None:
        name = type(step).__name__
        return StepStats(sequence, getattr(step, "kind", "step"), name, "", "", "", "")
    meta = instr.metadata
    source = ""
    if meta is not None and meta.get("source_file"):
        source = f"{meta.get('source_file')}:{meta.get('source_line', '?')}"
    hlo = " ".join(instr.to_text().split())
    if len(hlo) > 300:
        hlo = hlo[:297] + "..."
    return StepStats(
        sequence,
        getattr(step, "kind", "thunk"),
        instr.name,
        instr.opcode.text,
        hlo,
        instr.op_name or "",
        source,
    )


def _us(ns: float) -> str:
    us = ns / 1e3
    if us >= 1e6:
        return f"{us / 1e6:.3f} s"
    if us >= 1e3:
        return f"{us / 1e3:.2f} ms"
    return f"{us:.1f} us"
