"""Fallback census: which instructions the CPU backend still runs with the interpreter's
NumPy rule, over every program the test suite's JAX table holds (tests/jax_programs.py,
each in two forms: JAX's lowered HLO and XLA's optimized HLO), plus any .hlo files given.

Each module is compiled by the CPU backend (no run); its fallbacks (CpuProgram.fallbacks:
instruction, opcode, reason) are counted by opcode, by element type and by reason. The
reason of a fusion names the fused instruction the emitter declined, so "fusion: ...'dot'"
is a fusion holding a dot.

  PYTHONPATH=. .venv/bin/python benchmarks/fallbacks.py                 # the JAX table
  PYTHONPATH=. .venv/bin/python benchmarks/fallbacks.py --dump /tmp/c   # also save the .hlo
  PYTHONPATH=. .venv/bin/python benchmarks/fallbacks.py --corpus /tmp/c # saved .hlo files
  PYTHONPATH=. .venv/bin/python benchmarks/fallbacks.py -v              # every fallback
"""

from __future__ import annotations

import argparse
import re
import sys
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from xlapy.backends.cpu.backend import CpuProgram
from xlapy.errors import XlapyError
from xlapy.ir.parser import parse_module

_TYPE = re.compile(r"\b(pred|[suf]\d+|bf16|c64|c128|f8e\w+|f4e\w+|token)\[")


def jax_table_modules(names: list[str] | None) -> Iterator[tuple[str, str]]:
    """(name, HLO text) of every program of tests/jax_programs.py, lowered and optimized."""
    from jax_programs import PROGRAMS, hlo_texts

    for name, prog in PROGRAMS.items():
        if names and name not in names:
            continue
        try:
            texts = hlo_texts(prog)
        except Exception as e:  # a program JAX cannot lower here is reported, not counted
            print(f"skipped {name}: {type(e).__name__}: {e}", file=sys.stderr)
            continue
        yield f"{name}.lowered", texts.lowered
        yield f"{name}.optimized", texts.optimized


def corpus_modules(folder: Path) -> Iterator[tuple[str, str]]:
    for path in sorted(folder.glob("*.hlo")):
        yield path.stem, path.read_text()


def _element_type(module_text: str, name: str) -> str:
    """The element type of instruction `name` as the module's text declares it."""
    match = re.search(rf"(?m)^\s*(?:ROOT )?{re.escape(name)} = \(?([^ ]+)", module_text)
    if match is None:
        return "?"
    found = _TYPE.search(match.group(1) + "[")
    return found.group(1) if found else "?"


def _short_reason(reason: str) -> str:
    """The reason without the fused instruction's name ("add.3: the CPU ..." -> "the CPU ...")."""
    head, sep, tail = reason.partition(": ")
    if sep and re.fullmatch(r"[\w.\-]+", head) and not head.startswith("kernel"):
        return tail
    return reason


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, help="a folder of .hlo files instead")
    parser.add_argument("--dump", type=Path, help="write each module's text here")
    parser.add_argument("--programs", nargs="*", help="only these programs of the table")
    parser.add_argument("-v", action="store_true", help="list every fallback")
    args = parser.parse_args()

    modules = corpus_modules(args.corpus) if args.corpus else jax_table_modules(args.programs)
    by_op: Counter[str] = Counter()
    by_type: Counter[str] = Counter()
    by_reason: Counter[tuple[str, str]] = Counter()
    count = with_fallbacks = total = 0
    for name, text in modules:
        count += 1
        if args.dump:
            args.dump.mkdir(parents=True, exist_ok=True)
            (args.dump / f"{name}.hlo").write_text(text)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                program = CpuProgram(parse_module(text))
        except XlapyError as e:
            print(f"{name}: does not compile: {e}", file=sys.stderr)
            continue
        fallbacks = program.fallbacks
        with_fallbacks += bool(fallbacks)
        optimized = program.compiled.module.to_text()
        for fb in fallbacks:
            total += 1
            dtype = _element_type(optimized, fb.name)
            by_op[fb.opcode] += 1
            by_type[dtype] += 1
            by_reason[(fb.opcode, _short_reason(fb.reason)[:100])] += 1
            if args.v:
                print(f"  {name}: {fb} [{dtype}]")

    print(f"{count} modules; {with_fallbacks} with fallbacks; {total} instructions")
    print("\nby opcode:")
    for op, n in by_op.most_common():
        print(f"  {n:4d}  {op}")
    print("\nby element type (of the instruction's result):")
    for t, n in by_type.most_common():
        print(f"  {n:4d}  {t}")
    print("\nby reason:")
    for (op, reason), n in by_reason.most_common():
        print(f"  {n:4d}  {op}: {reason}")


if __name__ == "__main__":
    main()
