"""`--verbose` compiles: progress while a compile runs past a second, per-pass timing after.

`compile_progress(echo)` watches every pass the pipelines run on this thread (through
xlapy.passes.pass_base.PASS_OBSERVER). Once a second has gone by since the compile started,
each pass is echoed as it ends (`[1.42 s] fusion: 0.310 s, changed`), so a long compile shows
where it is. When the block ends, `summary()` gives the time per pass (summed over the
fixed-point iterations), most first, and the time spent outside the passes (buffer
assignment, lowering, code generation; the whole compile when the optimized module came
from the module cache and no pass ran).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from xlapy.passes.pass_base import PASS_OBSERVER

PROGRESS_AFTER_SECONDS = 1.0
"""A compile echoes its passes as they end once it has run this long."""


@dataclass
class CompileProgress:
    """What one compile's passes took (see the module comment)."""

    echo: Callable[[str], None]
    start: float = field(default_factory=time.perf_counter)
    end: float | None = None
    passes: list[tuple[str, str, float, bool]] = field(default_factory=list)

    def observe(self, pipeline: str, name: str, seconds: float, changed: bool) -> None:
        self.passes.append((pipeline, name, seconds, changed))
        elapsed = time.perf_counter() - self.start
        if elapsed >= PROGRESS_AFTER_SECONDS:
            self.echo(
                f"[{elapsed:.2f} s] {pipeline}/{name}: {seconds:.3f} s"
                + (", changed" if changed else "")
            )

    def summary(self) -> str:
        total = (self.end or time.perf_counter()) - self.start
        by_pass: dict[str, list[float]] = {}
        for _, name, seconds, _ in self.passes:
            by_pass.setdefault(name, []).append(seconds)
        in_passes = sum(sum(v) for v in by_pass.values())
        lines = [f"compile {total:.3f} s: passes {in_passes:.3f} s"]
        if not self.passes:
            lines[0] += " (no pass ran: the optimized module came from the module cache)"
        for name, times in sorted(by_pass.items(), key=lambda kv: -sum(kv[1])):
            runs = f" ({len(times)} runs)" if len(times) > 1 else ""
            lines.append(f"  {sum(times):8.3f} s  {name}{runs}")
        lines.append(
            f"  {max(total - in_passes, 0.0):8.3f} s  outside the passes (parsing, buffer "
            "assignment, lowering, code generation)"
        )
        return "\n".join(lines)


@contextlib.contextmanager
def compile_progress(echo: Callable[[str], None]) -> Iterator[CompileProgress]:
    """Watch the passes run inside the block (see the module comment)."""
    progress = CompileProgress(echo)
    token = PASS_OBSERVER.set(progress.observe)
    try:
        yield progress
    finally:
        PASS_OBSERVER.reset(token)
        progress.end = time.perf_counter()
