"""A seeded mutation fuzzer for the HLO text parser, printer and verifier.

Mutants are made from a corpus of valid modules (every HLO module text in the test suite,
found by reading the test files' string constants) by small text edits: deleting, doubling
or swapping spans, inserting tokens of the grammar, replacing numbers by edge values,
splicing lines of another module. Each mutant is parsed; an accepted one is verified and
printed, and the printed text must parse and print back identically (short and long form).
The only exceptions allowed are xlapy's own errors (XlapyError), and no mutant may take
longer than a fixed time.
"""

from __future__ import annotations

import ast
import random
import re
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from xlapy.errors import XlapyError
from xlapy.ir.attributes import ATTRIBUTE_KINDS
from xlapy.ir.opcodes import Opcode
from xlapy.ir.parser import parse_module
from xlapy.ir.printer import PrintOptions, print_module
from xlapy.ir.types import PrimitiveType
from xlapy.ir.verifier import verify

TESTS = Path(__file__).parent

_TOKENS = [
    "{", "}", "(", ")", "[", "]", ",", "=", ":", "->", "<=", "?", "%", "/*", "*/", "//",
    "\n", " ", '"', "'", "\\", "x", "_", "T(0,0)", "S(-1)", ":T(2)", "{1,0}", "{0,1}",
    "{:S(2)}", "ROOT ", "ENTRY ", "HloModule m", "#0", "0", "1", "-1", "2", "7",
    "18446744073709551615", "9223372036854775808", "1e308", "1.8e308", "-0", "nan", "inf",
    "-inf", "nan(0x1)", "true", "false", "f32[]", "f32[2]", "s32[]", "pred[]", "token[]",
    "(f32[], s32[])", "()", "bf16[2]", "u64[]", "f8e4m3fn[]", "s4[2]", "c64[]", "f32[<=4]",
    "f32[?]", "{{0,1},{2,3}}", "{{}}", "[2,2]<=[4]", "[2,2]<=[2,2]T(1,0)", "[0]<=[0]",
    "mesh['a'=2] {'a'}", "{...}", "b01f_01io->b01f", "0_0x1_1", "size=2x2 stride=1x1",
    "{[0:2:1]}", "metadata={op_name=\"a\"}", "sharding={replicated}", "devices=[9,9]0,1",
    "backend_config=\"\"", "frontend_attributes={a=\"b\"}",
]  # fmt: skip
_TOKENS += [op.text for op in Opcode] + [f", {k}=" for k in ATTRIBUTE_KINDS]
_NUMBER = re.compile(r"-?\b[0-9]+\b")
_TYPE_NAMES = [t.text for t in PrimitiveType if t is not PrimitiveType.TUPLE]
_ELEMENT_TYPE = re.compile(r"\b(?:" + "|".join(_TYPE_NAMES) + r")(?=\[)")
_OPCODE_NAMES = [op.text for op in Opcode]
_WORD = re.compile(r"(?<![\w.%-])[a-z][\w-]*(?=\()")
_EDGE_NUMBERS = ["0", "-1", "1", "2", "3", "64", "65", "2147483648", "-9223372036854775809"]


def _module_texts(path: Path) -> list[str]:
    try:
        tree = ast.parse(path.read_text())
    except (SyntaxError, UnicodeDecodeError):
        return []
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value.lstrip().startswith("HloModule")
        and "{" in node.value
    ]


def corpus(extra: list[str] | tuple[str, ...] = ()) -> list[str]:
    """Valid module texts: every test file's HLO constants that parse and verify."""
    texts = [*extra]
    for path in sorted(TESTS.glob("test_*.py")):
        texts.extend(_module_texts(path))
    valid = []
    seen = set()
    for text in texts:
        if text in seen:
            continue
        seen.add(text)
        try:
            verify(parse_module(text))
        except XlapyError:
            continue
        valid.append(text)
    return valid


def _swap_word(text: str, rng: random.Random, pattern: re.Pattern, pool: list[str]) -> str:
    found = list(pattern.finditer(text))
    if not found:
        return text
    m = rng.choice(found)
    return text[: m.start()] + rng.choice(pool) + text[m.end() :]


def mutate(text: str, rng: random.Random, corpus_texts: list[str]) -> str:
    """One to three random edits of `text`: half of them keep the text well formed (a number,
    element type, opcode or name replaced by another of its kind), half need not."""
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        n = len(text)
        i = rng.randrange(n + 1)
        j = min(n, i + rng.choice((1, 1, 2, 3, 5, 8, 20)))
        choice = rng.randrange(12)
        if choice in (8, 9):
            text = _swap_word(text, rng, _NUMBER, [*_EDGE_NUMBERS, "4", "5", "8", "16"])
        elif choice == 10:
            text = _swap_word(text, rng, _ELEMENT_TYPE, _TYPE_NAMES)
        elif choice == 11:
            pool = _OPCODE_NAMES if rng.random() < 0.5 else re.findall(r"%?[a-z][\w.-]*", text)
            text = _swap_word(text, rng, _WORD, pool or ["x"])
        elif choice == 0:
            text = text[:i] + text[j:]
        elif choice == 1:
            text = text[:i] + text[i:j] + text[i:]
        elif choice == 2:
            text = text[:i] + rng.choice(_TOKENS) + text[i:]
        elif choice == 3:
            numbers = list(_NUMBER.finditer(text))
            if numbers:
                m = rng.choice(numbers)
                text = text[: m.start()] + rng.choice(_EDGE_NUMBERS) + text[m.end() :]
        elif choice == 4:
            k = rng.randrange(n + 1)
            a, b = sorted((i, k))
            w = j - i
            c = min(n, b + w)
            if a + w <= b:
                text = text[:a] + text[b:c] + text[a + w : b] + text[a : a + w] + text[c:]
        elif choice == 5:
            lines = text.split("\n")
            donor = rng.choice(corpus_texts).split("\n")
            lines.insert(rng.randrange(len(lines) + 1), rng.choice(donor))
            text = "\n".join(lines)
        elif choice == 6:
            lines = text.split("\n")
            if len(lines) > 2:
                del lines[rng.randrange(len(lines))]
            text = "\n".join(lines)
        else:
            text = text[:i] + rng.choice(_TOKENS) + text[j:]
    return text


@dataclass
class FuzzReport:
    mutants: int = 0
    accepted: int = 0
    verified: int = 0
    slowest_s: float = 0.0
    failures: list[tuple[str, str]] = field(default_factory=list)


def check_one(text: str) -> str | None:
    """None if `text` is handled correctly, else a description of what went wrong."""
    try:
        module = parse_module(text)
    except XlapyError:
        return None
    except Exception as e:  # what must not escape
        return f"parse raised {type(e).__name__}: {e}"
    try:
        verify(module)
    except XlapyError:
        pass
    except Exception as e:
        return f"verify raised {type(e).__name__}: {e}"
    for options in (PrintOptions.short(), PrintOptions.long()):
        try:
            printed = print_module(module, options)
        except Exception as e:
            return f"print raised {type(e).__name__}: {e}"
        try:
            again = print_module(parse_module(printed), options)
        except Exception as e:
            return f"printed text does not parse back ({type(e).__name__}: {e})"
        if again != printed:
            return "printed text does not print back identically"
    return None


class _Hang(Exception):
    pass


def _on_alarm(signum, frame):
    raise _Hang


def fuzz(seed: int, count: int, corpus_texts: list[str], max_seconds: float = 5.0) -> FuzzReport:
    """Run `count` mutants from `seed`; collect failures, a mutant that runs longer than
    `max_seconds` among them (interrupted by SIGALRM where the platform has it)."""
    rng = random.Random(seed)
    report = FuzzReport()
    alarm = hasattr(signal, "setitimer")
    previous = signal.signal(signal.SIGALRM, _on_alarm) if alarm else None
    try:
        for _ in range(count):
            text = mutate(rng.choice(corpus_texts), rng, corpus_texts)
            _check_timed(text, report, max_seconds, alarm)
    finally:
        if alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    return report


def _check_timed(text: str, report: FuzzReport, max_seconds: float, alarm: bool) -> None:
    start = time.perf_counter()
    try:
        if alarm:
            signal.setitimer(signal.ITIMER_REAL, max_seconds * 2)
        problem = check_one(text)
    except _Hang:
        problem = f"still running after {max_seconds * 2:.0f} s (a hang)"
    finally:
        if alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
    elapsed = time.perf_counter() - start
    report.mutants += 1
    report.slowest_s = max(report.slowest_s, elapsed)
    if problem is None and elapsed > max_seconds:
        problem = f"took {elapsed:.1f} s"
    if problem is not None:
        report.failures.append((problem, text))
