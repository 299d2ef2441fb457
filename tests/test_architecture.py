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


def _layering_violations(imports_of, how: str, root: Path = ROOT) -> list[str]:
    """Imports (from `imports_of(path)`: (line, module) pairs, "?" for a computed name) of
    every layered package under `root` that point against the layering; `how` ends each
    message (`{there}` in it names the imported package)."""
    violations = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if len(rel.parts) < 2 or rel.parts[0] not in RANK:
            continue
        here = rel.parts[0]
        for lineno, module in imports_of(path):
            if module == "?":
                violations.append(f"xlapy/{rel}:{lineno} imports a module by a computed name")
                continue
            there = package_of(module)
            if there is None or there == here:
                continue
            if any(here == p and module.startswith(m) for p, m in ALLOWED_UPWARD):
                continue
            if RANK[there] >= RANK[here]:
                violations.append(
                    f"xlapy/{rel}:{lineno} ({here}) imports {module} {how.format(there=there)}"
                )
    return violations


def test_imports_point_one_way():
    violations = _layering_violations(imported_modules, "({there})")
    assert not violations, "imports against the layering:\n" + "\n".join(violations)


def test_constant_foldings_upward_import_loads_only_pure_rules():
    """The one allowed upward import (constant folding evaluating ops with the interpreter's
    rules) loads the rules of ops that compute on their operands, not the custom-call / FFI
    registries or the collectives between devices (issue 15: it loaded them all)."""
    import subprocess
    import sys

    code = (
        "import sys, xlapy.passes, xlapy.memory; "
        "print(sorted(m for m in sys.modules if m.startswith('xlapy.backends')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    loaded = set(ast.literal_eval(out))
    for machinery in ("custom_calls", "ffi", "xla_ffi", "collectives", "cpu", "lapack"):
        assert f"xlapy.backends.{machinery}" not in loaded, loaded
    assert "xlapy.backends.interpreter.rules.elementwise" in loaded
    assert "xlapy.backends.interpreter.rules.custom_call" not in loaded
    assert "xlapy.backends.interpreter.evaluator" not in loaded


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


def _opcode_sets(tree: ast.Module) -> list[tuple[int, frozenset[str]]]:
    """Every set / frozenset / tuple / list literal of two or more elements, anywhere in the
    module (module level, in functions, in `x in (...)` tests), whose elements are all
    opcodes: `Opcode.X` / `O.X` / `Op.X` attributes, or opcode text strings ("add"). Returns
    (line, member names)."""
    names = {op.name for op in Opcode}
    by_text = {op.text: op.name for op in Opcode}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Set | ast.Tuple | ast.List) or len(node.elts) < 2:
            continue
        elts = node.elts
        if all(isinstance(e, ast.Attribute) and e.attr in names for e in elts):
            members = frozenset(e.attr for e in elts)  # type: ignore[attr-defined]
        elif all(isinstance(e, ast.Constant) and e.value in by_text for e in elts):
            members = frozenset(by_text[e.value] for e in elts)  # type: ignore[attr-defined]
        else:
            continue
        found.append((node.lineno, members))
    return found


def test_no_module_outside_ir_restates_an_opcode_property():
    """Op knowledge lives in the opcode table: a set of opcodes, written anywhere outside
    `ir` (as Opcode members or as opcode names), that equals one of its properties or
    categories drifts from it; ask the opcode (`op.is_control_flow`, `op.category is
    Category.TUPLE`) instead."""
    from xlapy.ir.opcodes import CallContext, Category, Opcode

    props = {
        "side effects": {op.name for op in Opcode if op.has_side_effect},
        "elementwise": {op.name for op in Opcode if op.is_elementwise},
        "commutative": {op.name for op in Opcode if op.is_commutative},
        "transcendental": {op.name for op in Opcode if op.is_transcendental},
        "expensive": {op.name for op in Opcode if op.is_expensive},
        "forwarding": {op.name for op in Opcode if op.forwards_operand},
        "control flow": {op.name for op in Opcode if op.is_control_flow},
        "sequential callers": {
            op.name for op in Opcode if op.call_context is CallContext.SEQUENTIAL
        },
        "embedded callers": {op.name for op in Opcode if op.call_context is CallContext.EMBEDDED},
        "callers": {op.name for op in Opcode if op.call_context is not CallContext.NONE},
    }
    props.update(
        {f"category {c.name}": {op.name for op in Opcode if op.category is c} for c in Category}
    )
    assert _opcode_sets(ast.parse("x in (Opcode.TUPLE, Opcode.GET_TUPLE_ELEMENT)")) == [
        (1, frozenset({"TUPLE", "GET_TUPLE_ELEMENT"}))
    ]

    def restatements(tree: ast.Module) -> list[tuple[int, str]]:
        return [
            (line, prop)
            for line, members in _opcode_sets(tree)
            for prop, expected in props.items()
            if len(expected) >= 2
            and (members == expected or (prop == "forwarding" and members >= expected))
        ]

    # a planted set, as a pass might write it, is caught (by members and by opcode names)
    planted = ", ".join(f"Opcode.{n}" for n in sorted(props["control flow"]))
    assert (1, "control flow") in restatements(ast.parse(f"LOOPS = frozenset({{{planted}}})"))
    names = ", ".join(repr(Opcode[n].text) for n in sorted(props["side effects"]))
    assert (2, "side effects") in restatements(ast.parse(f"def f(op):\n    return op in ({names})"))
    restated = []
    for path in ROOT.rglob("*.py"):
        if path.parent.name == "ir":
            continue
        for line, prop in restatements(ast.parse(path.read_text())):
            restated.append(f"{path.relative_to(ROOT)}:{line} restates {prop}")
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
    assert Opcode.WHILE.is_control_flow and Opcode.CONDITIONAL.is_control_flow
    assert not Opcode.CALL.is_control_flow and not Opcode.FUSION.is_control_flow
    assert Opcode.OUTFEED.has_side_effect and not Opcode.ADD.has_side_effect
    # every expensive op is elementwise, every transcendental op expensive
    assert all(op.is_elementwise for op in Opcode if op.is_expensive)
    assert all(op.is_expensive for op in Opcode if op.is_transcendental)


# -- imports done by name, and cycles inside a package ----------------------------------------
_IMPORT_FUNCTIONS = {"import_module", "__import__"}


def _module_name(path: Path) -> str:
    """`xlapy.a.b` for .../xlapy/a/b.py (the last `xlapy` of the path is the package)."""
    parts = list(path.with_suffix("").parts)
    parts = parts[len(parts) - 1 - parts[::-1].index("xlapy") :]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _named_import(call: ast.Call, here: str) -> str | None:
    """The module (or, for an f-string, the package prefix) an importlib.import_module /
    __import__ call names; "?" when the name is not written in the call."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name not in _IMPORT_FUNCTIONS or not call.args:
        return None
    arg = call.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr) and arg.values:
        first = arg.values[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            return first.value.rstrip(".")
        if isinstance(first, ast.FormattedValue) and getattr(first.value, "id", "") == "__name__":
            return here
    return "?"


def named_imports(path: Path):
    """(line, module) for every import done by name in `path`."""
    here = _module_name(path)
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Call):
            module = _named_import(node, here)
            if module is not None:
                yield node.lineno, module


def test_imports_by_name_point_one_way():
    """importlib.import_module / __import__ follow the layering too, and name their module
    (or its package) in the call, so that this test can read it."""
    violations = _layering_violations(named_imports, "by name")
    assert not violations, "\n".join(violations)


def _import_time_nodes(tree: ast.Module):
    """The statements that run when the module is imported: module level, into if / try /
    with / for blocks, not into functions, classes' methods or `if TYPE_CHECKING:`."""
    pending = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            pending.extend(node.orelse)
            continue
        yield node
        pending.extend(ast.iter_child_nodes(node))


def _import_time_edges(path: Path, modules: set[str]) -> set[str]:
    """The modules of `modules` that importing `path` imports."""
    here = _module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found: set[str] = set()

    def add(name: str) -> None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name and name != here:
            found.add(name)

    tree = ast.parse(path.read_text(), filename=str(path))
    for node in _import_time_nodes(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                add(full if full in modules else base)
        elif isinstance(node, ast.Call):
            module = _named_import(node, here)
            if module is None or module == "?":
                continue
            if module.startswith(f"{here}.") or module == here:  # a loop over submodules
                listed = _listed_submodules(tree, module)
                found.update(
                    m
                    for m in modules
                    if m.startswith(f"{module}.") and m != here and (listed is None or m in listed)
                )
            else:
                add(module)
    return found


def _listed_submodules(tree: ast.Module, package: str) -> set[str] | None:
    """`package.NAME` for each NAME of a module-level tuple or list of strings that a
    module-level for loop walks (`for _name in PASS_MODULES: import_module(...)`); None
    when there is no such loop."""
    constants = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Tuple | ast.List):
            values = [e.value for e in node.value.elts if isinstance(e, ast.Constant)]
            for target in node.targets:
                if isinstance(target, ast.Name) and all(isinstance(v, str) for v in values):
                    constants[target.id] = values
    for node in tree.body:
        if isinstance(node, ast.For) and isinstance(node.iter, ast.Name):
            names = constants.get(node.iter.id)
            if names is not None:
                return {f"{package}.{n}" for n in names}
    return None


def _cycles(graph: dict[str, set[str]]) -> list[str]:
    """One path for each back edge a depth-first walk of `graph` finds."""
    cycles: list[str] = []
    state: dict[str, int] = {}  # 1 on the walk's path, 2 done
    for start in sorted(graph):
        if start in state:
            continue
        state[start] = 1
        trail = [start]
        stack = [iter(sorted(graph[start]))]
        while stack:
            dep = next(stack[-1], None)
            if dep is None:
                stack.pop()
                state[trail.pop()] = 2
            elif state.get(dep) == 1:
                cycles.append(" -> ".join([*trail[trail.index(dep) :], dep]))
            elif dep not in state:
                state[dep] = 1
                trail.append(dep)
                stack.append(iter(sorted(graph[dep])))
    return cycles


def _package_cycles(root: Path) -> list[str]:
    paths = {_module_name(p): p for p in root.rglob("*.py")}
    modules = set(paths)
    cycles = []
    for package in RANK:
        prefix = f"xlapy.{package}"
        members = {m for m in modules if m == prefix or m.startswith(f"{prefix}.")}
        graph = {m: _import_time_edges(paths[m], modules) & members for m in members}
        cycles.extend(_cycles(graph))
    return cycles


def test_no_import_cycles_inside_a_package():
    """Within each package, the modules imported at import time form no cycle (a cycle works
    or fails by import order; break it by moving the shared piece down)."""
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == ["a -> b -> a"]
    cycles = _package_cycles(ROOT)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_import_checks_catch_planted_violations(tmp_path):
    """A planted package tree: a cycle through a relative and an absolute import, one
    through a by-name import, an upward import by name and one by a computed name."""
    passes = tmp_path / "xlapy" / "passes"
    passes.mkdir(parents=True)
    (passes / "__init__.py").write_text("")
    (passes / "a.py").write_text("from . import b\n")
    (passes / "b.py").write_text("from xlapy.passes.a import x\n")
    (passes / "c.py").write_text("import importlib\nimportlib.import_module('xlapy.passes.d')\n")
    (passes / "d.py").write_text("import xlapy.passes.c\n")
    (passes / "e.py").write_text(
        "import importlib\n"
        "def f(name):\n"
        "    importlib.import_module('xlapy.runtime.client')\n"
        "    return __import__(name)\n"
    )
    assert sorted(_package_cycles(tmp_path / "xlapy")) == [
        "xlapy.passes.a -> xlapy.passes.b -> xlapy.passes.a",
        "xlapy.passes.c -> xlapy.passes.d -> xlapy.passes.c",
    ]
    assert sorted(_layering_violations(named_imports, "by name", tmp_path / "xlapy")) == [
        "xlapy/passes/e.py:3 (passes) imports xlapy.runtime.client by name",
        "xlapy/passes/e.py:4 imports a module by a computed name",
    ]


# -- the graph is edited through the IR's edits, which keep the use-lists current ----------------
_GRAPH_FIELDS = {"operands", "control_predecessors", "users", "control_successors", "instructions"}
_LIST_EDITS = {"append", "insert", "extend", "remove", "pop", "clear", "sort", "reverse"}


# Modules whose `operands` are not HLO instructions' (the MLIR syntax tree of the StableHLO
# reader holds operand names and positions).
_OTHER_GRAPHS = {Path("stablehlo/mlir.py")}


def test_graph_edits_go_through_the_ir():
    """Outside `ir`, nothing assigns or mutates an instruction's operands, control edges or
    use-lists or a computation's instruction list directly (set_operands, replace_operand,
    add_instruction, reorder, ... keep the use-lists current)."""
    found = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if rel.parts[0] == "ir" or rel in _OTHER_GRAPHS:
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            targets = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in _LIST_EDITS
            ):
                targets = [node.func.value]
            for target in targets:
                if isinstance(target, ast.Subscript):
                    target = target.value
                if not isinstance(target, ast.Attribute) or target.attr not in _GRAPH_FIELDS:
                    continue
                if isinstance(target.value, ast.Name) and target.value.id == "self":
                    continue  # another class's own field of that name
                found.append(f"xlapy/{rel}:{node.lineno}: {ast.unparse(node)[:80]}")
    assert not found, "direct graph edits:\n" + "\n".join(found)


# -- the CPU backend's own layers (DESIGN.md: backends/cpu) ------------------------------------
CPU = ROOT / "backends" / "cpu"
# sub-layer -> the sub-layers it may import. codegen (HLO -> LLVM IR) and runtime (thunks,
# the pool, the executor) stand on nothing else of the backend; jit compiles and loads what
# codegen emits (sizing its compile pool by runtime.pool); the driver modules at the top
# (lowering, compiler, backend, the package) use them all and nothing below imports them.
CPU_LAYERS = {
    "codegen": {"codegen"},
    "runtime": {"runtime"},
    "jit": {"jit", "codegen", "runtime"},
}


def _cpu_layer(module: str) -> str | None:
    """The sub-layer of a module of xlapy.backends.cpu ("driver" for the modules at its top
    and the package itself), None for modules outside the CPU backend."""
    parts = module.split(".")
    if parts[:3] != ["xlapy", "backends", "cpu"]:
        return None
    if len(parts) > 3 and parts[3] in CPU_LAYERS:
        return parts[3]
    return "driver"


def _runtime_imports(path: Path):
    """(line, module) of every import in `path` outside `if TYPE_CHECKING:` blocks, at
    module level or inside functions (a lazy import is still a dependency)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            pending.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            full = [f"{node.module}.{alias.name}" for alias in node.names]
            yield from ((node.lineno, m) for m in [node.module, *full])
        pending.extend(ast.iter_child_nodes(node))


RUNTIME_JIT_DEBT: set[tuple[str, str]] = set()
"""Known layer debt (runtime modules that import codegen or jit), listed so that nothing
else slips in: none. The runtime's native helpers are compiled by jit/native_helpers.py and
handed over through runtime/native_code.py."""


def test_cpu_backend_sub_layers():
    """codegen never imports runtime or jit, runtime never imports codegen or jit, and no
    sub-layer imports the driver (lowering, compiler, backend): checked for every import,
    type-only ones included."""
    assert set(CPU_LAYERS) <= {p.name for p in CPU.iterdir() if p.is_dir()}
    violations = []
    for path in CPU.rglob("*.py"):
        here = _cpu_layer(_module_name(path))
        if here == "driver":
            continue
        for lineno, module in imported_modules(path):
            there = _cpu_layer(module)
            if there is not None and there not in CPU_LAYERS[here]:
                rel = path.relative_to(ROOT)
                if (str(rel), module) in RUNTIME_JIT_DEBT:
                    continue
                violations.append(f"xlapy/{rel}:{lineno} ({here}) imports {module} ({there})")
    assert not violations, "imports against the CPU backend's layers:\n" + "\n".join(violations)


def test_no_cycles_inside_the_cpu_backend_even_lazily():
    """The CPU backend's modules form no import cycle even counting imports done inside
    functions (a lazy import only hides a cycle: break it by moving the shared piece down,
    as codegen/common.py does for the emitter and its elemental rules)."""
    paths = {_module_name(p): p for p in CPU.rglob("*.py")}
    graph = {}
    for module, path in paths.items():
        deps = set()
        for _, name in _runtime_imports(path):
            while name and name not in paths:
                name = name.rpartition(".")[0]
            if name and name != module:
                deps.add(name)
        graph[module] = deps
    cycles = _cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


# -- the runtime's objects talk through their public interfaces --------------------------------
def _own_private_names(tree: ast.Module) -> set[str]:
    """The `_names` a module defines for its own classes: methods and `self._x` fields."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name.startswith("_"):
            names.add(node.name)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
            and node.attr.startswith("_")
        ):
            names.add(node.attr)
    return names


def test_runtime_modules_use_each_others_public_interfaces():
    """In xlapy/runtime, a module reads another module's objects (a Buffer, a Future, a
    Client, a Device) through their public methods and properties only: the execution
    engine asks a Buffer for its storage, readiness and donation, it does not reach into
    `_storage` / `_ready` / `_state` (issue 15 counted 17 such reads)."""
    found = []
    for path in (ROOT / "runtime").rglob("*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        own = _own_private_names(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
                continue
            if node.attr.startswith("__") or node.attr in own:
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            found.append(f"xlapy/runtime/{path.name}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "private fields of another module's objects:\n" + "\n".join(found)


_MUTATORS = {"append", "add", "pop", "update", "remove", "discard", "clear", "setdefault"}


def test_nobody_writes_another_objects_private_fields():
    """Analyses are results nobody writes (issue 15: copy insertion wrote the dataflow
    result's private tables): in analysis, passes, memory and backends, no code assigns or
    mutates a `_field` of an object other than `self` / `cls`."""
    found = []
    for package in ("analysis", "passes", "memory", "backends"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                targets = []
                if isinstance(node, ast.Assign):
                    targets = node.targets
                elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                    targets = [node.target]
                elif (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr in _MUTATORS
                ):
                    targets = [node.func.value]
                for target in targets:
                    while isinstance(target, ast.Subscript):
                        target = target.value
                    if not isinstance(target, ast.Attribute) or not target.attr.startswith("_"):
                        continue
                    if target.attr.startswith("__") or (
                        isinstance(target.value, ast.Name) and target.value.id in ("self", "cls")
                    ):
                        continue
                    rel = path.relative_to(ROOT)
                    found.append(f"xlapy/{rel}:{node.lineno}: {ast.unparse(node)[:80]}")
    assert not found, "writes into another object's private fields:\n" + "\n".join(found)


# -- attributes are read through HloInstruction's typed accessors -------------------------------
ACCESSOR_OF = {
    "to_apply": "to_apply / to_apply_or_none",
    "calls": "calls / calls_or_none",
    "called_computations": "custom_call_computations",
    "condition": "while_condition",
    "body": "while_body",
    "branch_computations": "branches",
    "true_computation": "branches",
    "false_computation": "branches",
    "select": "select_computation",
    "scatter": "scatter_computation",
    "index": "tuple_index",
    "dimensions": "dimensions",
    "direction": "comparison_direction",
    "comparison_direction": "comparison_direction",
    "type": "comparison_type",
    "window": "window / window_or_none",
    "dim_labels": "dim_labels / dim_labels_or_none",
    "padding": "padding_config",
    "slice": "slice_spec",
    "kind": "fusion_kind",
    "algorithm": "rng_algorithm",
    "distribution": "rng_distribution",
    "delta": "rng_delta",
    "k": "topk_k",
    "largest": "topk_largest",
    "api_version": "custom_call_api_version",
    "slice_sizes": "gather_dimension_numbers.slice_sizes / permute_slice_sizes",
    **{
        name: "dot_dimension_numbers"
        for name in (
            "lhs_batch_dims",
            "rhs_batch_dims",
            "lhs_contracting_dims",
            "rhs_contracting_dims",
        )
    },
    **{
        name: "gather_dimension_numbers / scatter_dimension_numbers"
        for name in [
            "offset_dims",
            "collapsed_slice_dims",
            "start_index_map",
            "operand_batching_dims",
            "start_indices_batching_dims",
            "index_vector_dim",
            "update_window_dims",
            "inserted_window_dims",
            "scatter_dims_to_operand_dims",
            "input_batching_dims",
            "scatter_indices_batching_dims",
        ]
    },
}
"""Attribute name -> the accessor that reads it, where the two names differ (otherwise the
accessor has the attribute's name: `instr.epsilon`, `instr.channel_id`, ...)."""

RAW_ATTRIBUTE_FILES = {
    # rewires every called-computation attribute (COMPUTATION_ATTRIBUTES) by its name
    Path("passes/flatten_call_graph.py"),
}
"""Files outside ir and stablehlo (the parser, printer, verifier and importer, which handle
every attribute by name) that may read `instr.attrs` by name: each handles attributes
generically, and says so in a comment where it does."""


def _raw_attribute_reads(tree: ast.AST):
    """(line, attribute name or None) for each read of an instruction's attributes by name:
    `x.attrs[...]` (not as an assignment target), `x.attrs.get(...)`, `x.attr(...)`,
    `"name" in x.attrs`, and `a = x.attrs` (an alias read later by name). Copies of the
    whole dict (`dict(x.attrs)`, `x.attrs.items()`: clones) are generic and not reported."""

    def is_attrs(node) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "attrs"

    def key(node) -> str | None:
        return node.value if isinstance(node, ast.Constant) else None

    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and is_attrs(node.value):
            if isinstance(node.ctx, ast.Load):
                yield node.lineno, key(node.slice)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            func = node.func
            if (func.attr == "get" and is_attrs(func.value)) or func.attr == "attr":
                yield node.lineno, key(node.args[0]) if node.args else None
        elif isinstance(node, ast.Compare) and any(
            is_attrs(c) and isinstance(op, ast.In | ast.NotIn)
            for op, c in zip(node.ops, node.comparators, strict=True)
        ):
            yield node.lineno, key(node.left)
        elif isinstance(node, ast.Assign) and is_attrs(node.value):
            yield node.lineno, None


def _raw_attribute_violations(root: Path, allowed: set[Path]) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] in ("ir", "stablehlo") or rel in allowed:
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for line, name in sorted(_raw_attribute_reads(tree), key=lambda r: r[0]):
            if name is None:
                use = "the typed accessor of the attribute (no alias of instr.attrs)"
            else:
                use = f"instr.{ACCESSOR_OF.get(name, name)}"
            found.append(f"xlapy/{rel}:{line} reads attribute {name or '?'} raw: use {use}")
    return found


def test_attributes_are_read_through_typed_accessors(tmp_path):
    """Outside ir and stablehlo, instructions' attributes are read through HloInstruction's
    typed accessors (which check the value and name the instruction when it is malformed),
    not as `instr.attrs["window"]` / `.get("channel_id")` (issue 15 counted 194 such reads).
    Writes (building or editing an instruction's attributes) are not reads."""
    from xlapy.ir.instruction import HloInstruction

    for name, accessor in ACCESSOR_OF.items():
        for option in accessor.split(" / "):
            assert hasattr(HloInstruction, option.split(".")[0]), (name, option)
    planted = tmp_path / "passes"
    planted.mkdir()
    (planted / "bad.py").write_text(
        "def f(instr):\n"
        "    w = instr.attrs['window']\n"
        "    c = instr.attrs.get('channel_id')\n"
        "    instr.attrs['index'] = 2\n"
        "    a = instr.attrs\n"
        "    return 'sharding' in instr.attrs\n"
    )
    assert _raw_attribute_violations(tmp_path, set()) == [
        "xlapy/passes/bad.py:2 reads attribute window raw: use instr.window / window_or_none",
        "xlapy/passes/bad.py:3 reads attribute channel_id raw: use instr.channel_id",
        "xlapy/passes/bad.py:5 reads attribute ? raw: use the typed accessor of the attribute "
        "(no alias of instr.attrs)",
        "xlapy/passes/bad.py:6 reads attribute sharding raw: use instr.sharding",
    ]
    found = _raw_attribute_violations(ROOT, RAW_ATTRIBUTE_FILES)
    assert not found, f"{len(found)} raw attribute reads:\n" + "\n".join(found)
