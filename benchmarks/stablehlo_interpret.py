"""StableHLO's own interpreter tests (programs nobody on the xlapy team wrote) run through
xlapy's importer on the reference interpreter and the CPU backend.

    python benchmarks/stablehlo_interpret.py [--stablehlo DIR] [--backends interpreter,cpu]
                                             [--files add,dot_general] [--keep-constants] [-v]

The tests are the files `stablehlo/tests/interpret/*.mlir` of an openxla/stablehlo checkout
(--stablehlo, default $STABLEHLO_DIR; when neither is given the script clones the
repository, shallow, into /tmp/stablehlo). Each file holds programs separated by
`// -----`; each program computes on constants and checks its results with the `check`
dialect (`check.expect_eq`, `expect_almost_eq`, `expect_close`...), which xlapy imports as
side-effecting custom calls that fail the run naming the first differing element.

On the CPU backend every array constant of the entry computation becomes a parameter fed
with the constant's value (--keep-constants turns that off): otherwise constant folding
computes the whole program at compile time with the interpreter's rules and the native
kernels never run.

Each program ends as one of: pass; fail (a check failed: a wrong answer); error (compile or
run raised something other than a failed check); unsupported (the importer refuses the
program with a parse error: an op, type or dialect xlapy does not read; the message says
which); args (its entry takes arguments, which the file's RUN line passes: not run).

Known differences that are XLA's behaviour, not bugs (checked against XLA:CPU, jaxlib
0.10.2, 2026-11-27): the CPU backend flushes denormals as XLA:CPU does, so ceil/floor of the
smallest denormals give 0/-0 where StableHLO's reference says 1/-1 (ceil, floor: 3 each);
complex-to-pred convert tests the whole complex value against zero (XLA: 1j -> true,
StableHLO's test: false); reduce-precision of a NaN to zero mantissa bits stays NaN (XLA),
StableHLO's test expects inf.

Opt-in, not part of CI. Prints per file and in total, then every fail and error.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from xlapy.errors import HloParseError
from xlapy.ir.module import HloModule
from xlapy.ir.opcodes import Opcode
from xlapy.ir.parser import parse_module
from xlapy.runtime import Client
from xlapy.stablehlo import import_text

REPOSITORY = "https://github.com/openxla/stablehlo"
_SEPARATOR = re.compile(r"^// -----\s*$", re.M)


def tests_dir(given: str | None) -> Path:
    root = Path(given or os.environ.get("STABLEHLO_DIR") or "/tmp/stablehlo")
    if not (root / "stablehlo/tests/interpret").is_dir():
        if given or os.environ.get("STABLEHLO_DIR"):
            sys.exit(f"{root}: no stablehlo/tests/interpret here (an openxla/stablehlo checkout?)")
        print(f"cloning {REPOSITORY} into {root} ...", file=sys.stderr)
        subprocess.run(["git", "clone", "-q", "--depth", "1", REPOSITORY, str(root)], check=True)
    return root / "stablehlo/tests/interpret"


def constants_as_parameters(module: HloModule) -> tuple[str, list[np.ndarray]]:
    """The module's text with every array constant of the entry computation turned into a
    parameter (numbered after the existing ones), and those parameters' values."""
    entry = module.entry
    first = entry.num_parameters
    constants = [i for i in entry.instructions if i.opcode is Opcode.CONSTANT and i.shape.is_array]
    number = {c.name: first + k for k, c in enumerate(constants)}
    values = [np.asarray(c.literal.array) for c in constants]
    lines, in_entry = [], False
    for line in module.to_text().splitlines():
        if line.startswith("ENTRY "):
            in_entry = True
        elif line.startswith("}"):
            in_entry = False
        m = re.match(r"^(\s*)(ROOT )?([\w.\-]+) = (\S+) constant\(", line)
        if in_entry and m and m.group(3) in number:
            indent, root, name, shape = m.groups()
            line = f"{indent}{root or ''}{name} = {shape} parameter({number[name]})"
        lines.append(line)
    return "\n".join(lines) + "\n", values


def _functions(chunk: str) -> list[str]:
    """The programs of one `// -----` chunk: the chunk itself, or, where it holds several
    functions and none is `main` (a separator commented out), each function alone."""
    starts = [m.start() for m in re.finditer(r"^func\.func ", chunk, re.M)]
    if len(starts) < 2 or re.search(r"func\.func\s+(?:public\s+)?@main\b", chunk):
        return [chunk]
    return [chunk[a:b] for a, b in zip(starts, [*starts[1:], len(chunk)], strict=True)]


def run_one(client: Client, module: HloModule, as_parameters: bool) -> tuple[str, str]:
    """('pass' | 'fail' | 'error', message) for one imported program on `client`."""
    try:
        if as_parameters:
            text, args = constants_as_parameters(module)
            program = parse_module(text)
        else:
            program, args = module, []
        executable = client.compile(program)
        buffers = [client.buffer_from_pyval(a) for a in args]
        for out in executable.execute([buffers])[0]:
            out.to_numpy()
    except Exception as e:  # classify: a failed check is a wrong answer, anything else an error
        message = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        return ("fail" if "check." in message and "failed" in message else "error"), message
    return "pass", ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stablehlo", help="an openxla/stablehlo checkout")
    parser.add_argument("--backends", default="interpreter,cpu")
    parser.add_argument("--files", help="comma-separated file stems (default: all)")
    parser.add_argument("--keep-constants", action="store_true")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every program")
    args = parser.parse_args()
    directory = tests_dir(args.stablehlo)
    files = sorted(directory.glob("*.mlir"))
    if args.files:
        wanted = set(args.files.split(","))
        files = [f for f in files if f.stem in wanted]
    backends = args.backends.split(",")
    clients = {b: Client(b) for b in backends}
    totals: dict[str, collections.Counter] = {b: collections.Counter() for b in backends}
    problems: list[str] = []
    unsupported: collections.Counter = collections.Counter()
    start = time.perf_counter()
    print(f"{'file':28s} {'programs':>8s}  " + "  ".join(f"{b:>24s}" for b in backends))
    for path in files:
        chunks = [c for c in _SEPARATOR.split(path.read_text()) if "func.func" in c]
        counts = {b: collections.Counter() for b in backends}
        for k, chunk in enumerate(chunks):
            name = f"{path.stem}#{k}"
            m = re.search(r"func\.func\s+(?:public\s+)?@([\w.$-]+)", chunk)
            if m:
                name += f" ({m.group(1)})"
            try:
                modules = [import_text(c, f"{path.name}#{k}") for c in _functions(chunk)]
            except HloParseError as e:
                reason = re.sub(r"^.*?error: ", "", str(e).splitlines()[0])
                unsupported[re.sub(r"'[^']*'", "'...'", reason)[:80]] += 1
                for b in backends:
                    counts[b]["unsupported"] += 1
                if args.verbose:
                    print(f"  {name}: unsupported: {reason}")
                continue
            if any(m.entry.num_parameters for m in modules):  # its inputs come from the RUN line
                for b in backends:
                    counts[b]["args"] += 1
                continue
            for b in backends:
                as_parameters = b != "interpreter" and not args.keep_constants
                for module in modules:
                    status, message = run_one(clients[b], module, as_parameters)
                    if status != "pass":
                        break
                counts[b][status] += 1
                if status != "pass":
                    problems.append(f"{b:12s} {status:6s} {name}: {message[:160]}")
                if args.verbose:
                    print(f"  {name} [{b}]: {status} {message[:120]}")
        for b in backends:
            totals[b].update(counts[b])
        print(
            f"{path.stem:28s} {len(chunks):8d}  "
            + "  ".join(_summary(counts[b]) for b in backends),
            flush=True,
        )
    print("-" * 80)
    n = sum(totals[backends[0]].values())
    print(f"{'total':28s} {n:8d}  " + "  ".join(_summary(totals[b]) for b in backends))
    print(f"{time.perf_counter() - start:.0f} s; checkout {directory.parent.parent}")
    if unsupported:
        print("\nunsupported (importer refusals), by reason:")
        for reason, count in unsupported.most_common():
            print(f"  {count:4d}  {reason}")
    if problems:
        print("\nfails and errors:")
        print("\n".join(f"  {p}" for p in problems))


def _summary(c: collections.Counter) -> str:
    text = f"{c['pass']:4d}p {c['fail']:3d}f {c['error']:3d}e {c['unsupported']:3d}u"
    return text + (f" {c['args']}a" if c["args"] else "   ")


if __name__ == "__main__":
    main()
