"""The package layering of DESIGN.md, enforced: imports point one way."""

import ast
from pathlib import Path

from xlapy.ir.opcodes import Opcode

ROOT = Path(__file__).resolve().parent.parent / "xlapy"

# A package may import packages of a lower rank (and itself); builder, stablehlo (the
# frontends) and analysis are siblings that all stand directly on ir.
RANK = {
    "ir": 0,
    "builder": 1,
    "stablehlo": 1,
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


def _opcode_sets(tree: ast.Module) -> dict[str, frozenset[str]]:
    """Module-level names bound to a set/frozenset literal (or a tuple of categories) whose
    elements are all `Opcode.X` / `O.X` / `Op.X` attributes: name -> member names."""
    found = {}
    for node in tree.body:
        if not isinstance(node, ast.Assign | ast.AnnAssign):
            continue
        value = node.value
        if isinstance(value, ast.Call) and value.args:  # frozenset({...})
            value = value.args[0]
        if not isinstance(value, ast.Set | ast.Tuple) or not value.elts:
            continue
        names = [e.attr for e in value.elts if isinstance(e, ast.Attribute)]
        if len(names) != len(value.elts) or not all(n.isupper() for n in names):
            continue
        target = node.targets[0] if isinstance(node, ast.Assign) else node.target
        if isinstance(target, ast.Name):
            found[target.id] = frozenset(names)
    return found


def test_no_module_outside_ir_restates_an_opcode_property():
    """Op knowledge lives in the opcode table: a set that equals one of its properties (or
    one of its categories' unions) written out again elsewhere drifts from it."""
    from xlapy.ir.opcodes import CallContext, Category, Opcode

    props = {
        "side effects": {op.name for op in Opcode if op.has_side_effect},
        "elementwise": {op.name for op in Opcode if op.is_elementwise},
        "elementwise categories": {"UNARY", "BINARY", "TERNARY"},
        "commutative": {op.name for op in Opcode if op.is_commutative},
        "transcendental": {op.name for op in Opcode if op.is_transcendental},
        "expensive": {op.name for op in Opcode if op.is_expensive},
        "forwarding": {op.name for op in Opcode if op.forwards_operand},
        "sequential callers": {
            op.name for op in Opcode if op.call_context is CallContext.SEQUENTIAL
        },
        "embedded callers": {op.name for op in Opcode if op.call_context is CallContext.EMBEDDED},
    }
    assert {c.name for c in Category} >= props["elementwise categories"]
    restated = []
    for path in ROOT.rglob("*.py"):
        if path.parent.name == "ir":
            continue
        for name, members in _opcode_sets(ast.parse(path.read_text())).items():
            for prop, expected in props.items():
                if members == expected or (prop == "forwarding" and members >= expected):
                    restated.append(f"{path.relative_to(ROOT)}: {name} restates {prop}")
    assert not restated, "\n".join(restated)


def test_opcode_properties():
    from xlapy.ir.opcodes import CallContext

    assert Opcode.ADD.is_commutative and not Opcode.COMPARE.is_commutative
    assert Opcode.EXP.is_transcendental and Opcode.EXP.is_expensive
    assert Opcode.DIVIDE.is_expensive and not Opcode.DIVIDE.is_transcendental
    assert Opcode.GET_TUPLE_ELEMENT.forwards_operand and not Opcode.TUPLE.forwards_operand
    assert Opcode.WHILE.call_context is CallContext.SEQUENTIAL
    assert Opcode.REDUCE.call_context is CallContext.EMBEDDED
    assert Opcode.ADD.call_context is CallContext.NONE
    assert Opcode.OUTFEED.has_side_effect and not Opcode.ADD.has_side_effect
    # every expensive op is elementwise, every transcendental op expensive
    assert all(op.is_elementwise for op in Opcode if op.is_expensive)
    assert all(op.is_expensive for op in Opcode if op.is_transcendental)
