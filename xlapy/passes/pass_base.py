"""Passes and pipelines.

A pass is a named unit with one entry point, `run(module) -> bool`, that reports whether it
changed anything. A pipeline is a plain list of passes run in order; in debug mode it runs
the verifier after every pass that changed the module, it can dump the module after each
pass, and it can repeat a sub-list to a fixed point. `PASSES` maps names to pass factories
for the command line (`xlapy opt --passes=a,b`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path

from xlapy.errors import VerifierError, XlapyError
from xlapy.gc_pause import collector_paused
from xlapy.ir.module import HloModule
from xlapy.ir.verifier import verify


class HloPass:
    """Base of every pass. Subclasses set `name` and implement `run`."""

    name: str = "unnamed-pass"
    # True when the last run left the module where running the pass again at once would
    # change nothing (a pass that runs to its own fixed point); FixedPoint then skips the
    # run that would only confirm it. A pass sets it per run; False promises nothing.
    settled: bool = False

    def run(self, module: HloModule) -> bool:
        """Transform `module` in place; return True if anything changed."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<pass {self.name}>"


PASSES: dict[str, Callable[[], HloPass]] = {}


def register_pass(cls):
    """Class decorator: make the pass available by its `name` (for `xlapy opt --passes`)."""
    if cls.name in PASSES:
        raise RuntimeError(f"two passes named {cls.name}")
    PASSES[cls.name] = cls
    return cls


def make_pass(name: str) -> HloPass:
    """A new instance of the registered pass `name`; XlapyError listing the known names."""
    try:
        return PASSES[name]()
    except KeyError:
        known = ", ".join(sorted(PASSES))
        raise XlapyError(f"unknown pass '{name}'; known passes: {known}") from None


@dataclass
class FixedPoint:
    """Run `passes` in order again and again until none changes the module."""

    passes: Sequence[HloPass]
    max_iterations: int = 25
    name: str = "fixed-point"


PASS_OBSERVER: ContextVar[Callable[[str, str, float, bool], None] | None] = ContextVar(
    "xlapy_pass_observer", default=None
)
"""Called as observer(pipeline, pass, seconds, changed) after every pass any pipeline runs on
this thread (the command line's `--verbose` progress and per-pass timing)."""


@dataclass
class PassPipeline:
    """A named list of passes (and FixedPoint groups) run in order.

    `verify_between`: run the verifier after every pass that changed the module and name the
    pass that broke it. `dump_dir`: write the module as text after every pass, as
    `NN.<pass>.hlo`, plus `00.input.hlo`.

    The cyclic garbage collector is paused while a pipeline runs (see `collector_paused`).
    """

    name: str
    passes: list[HloPass | FixedPoint] = field(default_factory=list)
    verify_between: bool = True
    dump_dir: str | Path | None = None
    log: list[tuple[str, bool]] = field(default_factory=list)  # (pass, changed) as run
    seconds: list[float] = field(default_factory=list)  # each run of `log`, its time

    def run(self, module: HloModule) -> bool:
        with collector_paused():
            return self._run(module)

    def _run(self, module: HloModule) -> bool:
        self.log.clear()
        self.seconds.clear()
        self._step = 0
        self._dump(module, "input")
        changed = False
        for item in self.passes:
            if isinstance(item, FixedPoint):
                changed |= self._run_fixed_point(module, item)
            else:
                changed |= self._run_one(module, item)
        return changed

    def _run_fixed_point(self, module: HloModule, group: FixedPoint) -> bool:
        """Run the passes round and round until each has run once on the module as it now
        is without changing it. A pass that ran without a change since the last change
        would find nothing again: the round that only confirms the fixed point stops at the
        pass that changed the module last (the same module as running every pass again),
        or just before it when that pass's run left it `settled`."""
        changed_any = False
        passes = list(group.passes)
        quiet = 0  # passes run in a row that changed nothing
        needed = len(passes)  # quiet runs that prove the fixed point
        for _ in range(group.max_iterations):
            for p in passes:
                if self._run_one(module, p):
                    changed_any = True
                    quiet = 0
                    needed = len(passes) - 1 if p.settled else len(passes)
                else:
                    quiet += 1
                if quiet >= needed:
                    return changed_any
        return changed_any

    def _run_one(self, module: HloModule, p: HloPass) -> bool:
        start = time.perf_counter()
        changed = bool(p.run(module))
        elapsed = time.perf_counter() - start
        self.log.append((p.name, changed))
        self.seconds.append(elapsed)
        observer = PASS_OBSERVER.get()
        if observer is not None:
            observer(self.name, p.name, elapsed, changed)
        if changed and self.verify_between:
            try:
                verify(module)
                for comp in module.computations:
                    problems = comp.use_list_problems()
                    if problems:
                        raise VerifierError("stale use-lists: " + "; ".join(problems[:5]))
            except VerifierError as e:
                raise VerifierError(f"after pass {p.name} in pipeline {self.name}: {e}") from e
        if changed:
            self._dump(module, p.name)
        return changed

    def _dump(self, module: HloModule, label: str) -> None:
        if self.dump_dir is None:
            return
        directory = Path(self.dump_dir)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"{self._step:02d}.{label}.hlo").write_text(module.to_text())
        self._step += 1
