"""Opcode coverage report: for every opcode of the opcode table, whether the reference
interpreter has an evaluation rule and which programs of `tests/jax_programs.py` contain it,
in JAX's lowered HLO and in XLA's optimized HLO.

    python -m xlapy.tools.coverage_ops [--programs PATH] [--missing-only]

It is a development tool: it loads the program table by path from the source tree, lowers
every program with JAX and parses both texts with xlapy's parser. A text the parser rejects
is reported and its opcodes are read off the text instead, so the report still says what the
program would need.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import xlapy.backends.interpreter.rules
from xlapy.backends.interpreter.registry import EVAL_RULES
from xlapy.errors import XlapyError
from xlapy.ir.module import HloModule
from xlapy.ir.opcodes import Opcode
from xlapy.ir.parser import parse_module

xlapy.backends.interpreter.rules.register_all()

DEFAULT_PROGRAMS = Path(__file__).resolve().parents[2] / "tests" / "jax_programs.py"
FORMS = ("lowered", "optimized")

# `name = shape opcode(`: the shape is an array shape or a parenthesized tuple shape.
_INSTR_RE = re.compile(
    r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(?:\(.*?\)|[\w\[\],{}:?<=\s]*?)\s*([a-z][a-z0-9\-]*)\(",
    re.MULTILINE,
)


def opcodes_of_module(module: HloModule) -> set[Opcode]:
    """Every opcode used by any computation of `module` (fused and called ones included)."""
    return {instr.opcode for comp in module.computations for instr in comp.instructions}


def opcodes_of_text(text: str) -> set[Opcode]:
    """Opcodes read off HLO text with a regular expression (for text the parser rejects)."""
    found = set()
    for name in _INSTR_RE.findall(text):
        try:
            found.add(Opcode.from_text(name))
        except KeyError:
            continue
    return found


def has_rule(op: Opcode) -> bool:
    return op in EVAL_RULES or op is Opcode.PARAMETER


@dataclass
class Coverage:
    """Which programs use each opcode, per form, and which texts failed to parse."""

    users: dict[Opcode, dict[str, list[str]]] = field(default_factory=dict)
    parse_failures: dict[str, str] = field(default_factory=dict)

    def add(self, program: str, form: str, opcodes: Iterable[Opcode]) -> None:
        for op in opcodes:
            self.users.setdefault(op, {f: [] for f in FORMS})[form].append(program)

    def exercised(self) -> set[Opcode]:
        return set(self.users)

    def without_rule(self) -> list[Opcode]:
        """Opcodes some program uses that the interpreter cannot evaluate (parameters are bound
        by the interpreter itself and need no rule)."""
        return sorted((op for op in self.users if not has_rule(op)), key=lambda o: o.text)

    def unexercised(self) -> list[Opcode]:
        return sorted((op for op in Opcode if op not in self.users), key=lambda o: o.text)


def load_programs(path: Path = DEFAULT_PROGRAMS) -> ModuleType:
    """Import the program table at `path` (a file outside the package) as a module."""
    if not path.is_file():
        raise FileNotFoundError(f"no program table at {path}")
    spec = importlib.util.spec_from_file_location("xlapy_jax_programs", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def collect(programs: ModuleType, parsed=None) -> Coverage:
    """Coverage of the table in `programs` (a module with PROGRAMS and hlo_texts).

    `parsed(name, form, text)` may supply the parsed module (to share a cache); by default
    each text is parsed here.
    """
    parsed = parsed or (lambda name, form, text: parse_module(text))
    cov = Coverage()
    for name, prog in programs.PROGRAMS.items():
        texts = programs.hlo_texts(prog)
        for form in FORMS:
            text = getattr(texts, form)
            try:
                ops = opcodes_of_module(parsed(name, form, text))
            except XlapyError as e:
                cov.parse_failures[f"{name} ({form})"] = str(e).splitlines()[0]
                ops = opcodes_of_text(text)
            cov.add(name, form, ops)
    return cov


def _names(programs: list[str], limit: int = 3) -> str:
    if not programs:
        return "-"
    more = f" +{len(programs) - limit}" if len(programs) > limit else ""
    return ", ".join(programs[:limit]) + more


def render(cov: Coverage, missing_only: bool = False) -> str:
    """The report as text: one row per opcode, then totals."""
    rows = [f"{'opcode':<28} {'rule':<5} {'#low':>4} {'#opt':>4}  programs (lowered / optimized)"]
    for op in sorted(Opcode, key=lambda o: (o.category.value, o.text)):
        rule = has_rule(op)
        users = cov.users.get(op, {f: [] for f in FORMS})
        if missing_only and rule and op in cov.users:
            continue
        rows.append(
            f"{op.text:<28} {'yes' if rule else 'NO':<5} {len(users['lowered']):>4} "
            f"{len(users['optimized']):>4}  {_names(users['lowered'])} / "
            f"{_names(users['optimized'])}"
        )
    total = len(Opcode)
    with_rule = sum(has_rule(op) for op in Opcode)
    rows += [
        "",
        f"opcodes in the table:            {total}",
        f"with an interpreter rule:        {with_rule}",
        f"exercised by some program:       {len(cov.exercised())}",
        f"exercised but without a rule:    {', '.join(o.text for o in cov.without_rule()) or '-'}",
        f"not exercised by any program:    {len(cov.unexercised())}",
    ]
    if cov.parse_failures:
        rows.append(f"texts the parser rejected:       {len(cov.parse_failures)}")
        rows += [f"  {k}: {v}" for k, v in sorted(cov.parse_failures.items())]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m xlapy.tools.coverage_ops", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--programs", type=Path, default=DEFAULT_PROGRAMS, help="program table file")
    ap.add_argument(
        "--missing-only",
        action="store_true",
        help="list only opcodes without a rule or without a program",
    )
    ns = ap.parse_args(argv)
    cov = collect(load_programs(ns.programs))
    print(render(cov, ns.missing_only))
    return 1 if cov.without_rule() else 0


if __name__ == "__main__":
    sys.exit(main())
