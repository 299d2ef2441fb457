"""The package layering of DESIGN.md, enforced: imports point one way."""

import ast
from pathlib import Path

from xlapy.ir.opcodes import Opcode

ROOT = Path(__file__).resolve().parent.parent / "xlapy"

# A package may import packages of a lower rank (and itself); builder and analysis are
# siblings that both stand directly on ir.
RANK = {
    "ir": 0,
    "builder": 1,
    "analysis": 1,
    "passes": 2,
    "memory": 3,
    "backends": 4,
    "runtime": 5,
    "frontend": 6,
    "pjrt": 6,
    "tools": 7,
}
# Constant folding may evaluate ops with the interpreter's per-opcode rules.
ALLOWED_UPWARD = {
    ("passes", "xlapy.backends.interpreter.registry"),
    ("passes", "xlapy.backends.interpreter.rules"),
}


def imported_modules(path: Path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module


def package_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "xlapy" or len(parts) < 2:
        return None
    return parts[1] if parts[1] in RANK else None


def test_imports_point_one_way():
    violations = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if len(rel.parts) < 2 or rel.parts[0] not in RANK:
            continue
        here = rel.parts[0]
        for lineno, module in imported_modules(path):
            there = package_of(module)
            if there is None or there == here:
                continue
            if any(here == p and module.startswith(m) for p, m in ALLOWED_UPWARD):
                continue
            if RANK[there] >= RANK[here]:
                violations.append(f"xlapy/{rel}:{lineno} ({here}) imports {module} ({there})")
    assert not violations, "imports against the layering:\n" + "\n".join(violations)


def test_nothing_imports_tools():
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if rel.parts[0] == "tools" or rel == Path("__main__.py"):
            continue
        for lineno, module in imported_modules(path):
            assert package_of(module) != "tools", f"xlapy/{rel}:{lineno} imports {module}"


def test_opcode_names_are_unique_and_round_trip():
    texts = [op.text for op in Opcode]
    assert len(texts) == len(set(texts))
    assert all(Opcode.from_text(t).text == t for t in texts)
