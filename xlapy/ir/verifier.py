"""The HLO verifier: checks that a module is a well-formed program before anything runs it.

It walks the module once and collects every problem it finds, then raises one
VerifierError listing them all, each line naming `computation/instruction`. Checks:

  module        an entry computation that belongs to the module; unique computation names;
                unique instruction names across the module; no recursion through calls;
                every called computation belongs to the module
  computation   a root that belongs to it; parameter numbers 0..n-1, each once; operands and
                control predecessors from the same computation; no cycles
  instruction   shardings against the shape's rank and leaf count (and the module's device
                count once it is partitioned); operand counts and the shape rules of
                xlapy.ir.shape_inference (which also check called computations' signatures:
                reducers, comparators, while bodies and conditions, branches, map/call/fusion
                parameters); the declared shape
                compatible with the inferred one (layouts ignored); valid layouts; constants'
                literal shapes
  config        input_output_alias and buffer_donor entries, entry_computation_layout
"""

from __future__ import annotations

from collections.abc import Iterator

from xlapy.errors import ShapeError, VerifierError
from xlapy.ir.computation import HloComputation
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.module import HloModule
from xlapy.ir.opcodes import Opcode
from xlapy.ir.shape_inference import compatible, infer_shape
from xlapy.ir.shapes import Shape, index_text
from xlapy.ir.sharding import HloSharding

_MAX_LISTED = 50


def verify(module: HloModule) -> None:
    """Raise VerifierError listing every problem of `module`; return None if there is none."""
    problems = list(check_module(module))
    if problems:
        _raise(f"module {module.name}", problems)


def verify_instruction(instr: HloInstruction) -> None:
    """Check one instruction alone (operands, shape, layout, literal); for passes that build or
    rewrite instructions. Raises VerifierError naming the instruction."""
    problems = [f"{_where(instr)}: {p}" for p in _check_instruction(instr)]
    if problems:
        _raise(f"instruction {_where(instr)}", problems)


def check_module(module: HloModule) -> Iterator[str]:
    """Yield a message for each problem of `module` (the verifier's checks, without raising)."""
    comps = module.computations
    comp_ids = {id(c) for c in comps}
    if module.entry is None:
        yield f"module {module.name}: has no entry computation"
    elif id(module.entry) not in comp_ids:
        yield f"module {module.name}: entry computation {module.entry.name} is not in the module"
    yield from _duplicates([c.name for c in comps], "computation name")
    yield from _duplicates(
        [i.name for c in comps for i in c.instructions], "instruction name (names are module-wide)"
    )
    for comp in comps:
        yield from _check_computation(comp, comp_ids)
        for instr in comp.instructions:
            yield from (f"{_where(instr, comp)}: {p}" for p in _check_instruction(instr))
    yield from _check_call_cycles(comps)
    yield from _check_async_computations(comps)
    yield from _check_total_bytes(module)
    entry = module.entry
    if entry is not None and entry.root is not None:
        yield from _check_aliases(module, entry, entry.root)
        yield from _check_entry_layout(module, entry, entry.root)


# -- reporting ------------------------------------------------------------------------------


def _raise(what: str, problems: list[str]) -> None:
    listed = problems[:_MAX_LISTED]
    more = len(problems) - len(listed)
    head = problems[0] if len(problems) == 1 else f"{len(problems)} problems in {what}:"
    lines = [head] if len(problems) == 1 else [head, *(f"  {p}" for p in listed)]
    if more > 0:
        lines.append(f"  ... and {more} more")
    raise VerifierError("\n".join(lines))


def _where(instr: HloInstruction, comp: HloComputation | None = None) -> str:
    comp = comp or instr.parent
    return f"{comp.name}/{instr.name}" if comp is not None else instr.name


def _t(shape: Shape) -> str:
    return shape.to_text(with_layout=False)


def _duplicates(names: list[str], what: str) -> Iterator[str]:
    seen: set[str] = set()
    reported: set[str] = set()
    for name in names:
        if name in seen and name not in reported:
            reported.add(name)
            yield f"duplicate {what} '{name}'"
        seen.add(name)


# -- computations ---------------------------------------------------------------------------


def _check_computation(comp: HloComputation, comp_ids: set[int]) -> Iterator[str]:
    members = {id(i) for i in comp.instructions}
    if comp.root is None:
        yield f"{comp.name}: has no root instruction"
    elif id(comp.root) not in members:
        yield f"{comp.name}: root {comp.root.name} is not an instruction of the computation"
    numbers = []
    for instr in comp.instructions:
        if instr.opcode is Opcode.PARAMETER:
            if instr.parameter_number is None:
                yield f"{_where(instr, comp)}: parameter has no parameter number"
            else:
                numbers.append(instr.parameter_number)
        for i, op in enumerate(instr.operands):
            if id(op) not in members:
                yield (
                    f"{_where(instr, comp)}: operand {i} ({op.name}) is not in computation "
                    f"{comp.name}"
                )
        for pred in instr.control_predecessors:
            if id(pred) not in members:
                yield (
                    f"{_where(instr, comp)}: control predecessor {pred.name} is not in "
                    f"computation {comp.name}"
                )
        for called in instr.called_computations():
            if id(called) not in comp_ids:
                yield (
                    f"{_where(instr, comp)}: calls computation {called.name}, which is not "
                    "in the module"
                )
    for n in sorted({n for n in numbers if numbers.count(n) > 1}):
        yield f"{comp.name}: parameter number {n} is used more than once"
    if sorted(set(numbers)) != list(range(len(set(numbers)))):
        yield (
            f"{comp.name}: parameter numbers {sorted(set(numbers))} are not 0..{len(numbers) - 1}"
        )
    if all(id(op) in members for i in comp.instructions for op in i.operands):
        try:
            comp.post_order()
        except ValueError as e:
            yield f"{comp.name}: {e}"


def _check_async_computations(comps: list[HloComputation]) -> Iterator[str]:
    """Each async computation belongs to one async-start (XLA's async op chain owns it)."""
    starts: dict[int, HloInstruction] = {}
    for comp in comps:
        for instr in comp.instructions:
            called = instr.attrs.get("calls") if instr.opcode is Opcode.ASYNC_START else None
            if not isinstance(called, HloComputation):
                continue
            first = starts.setdefault(id(called), instr)
            if first is not instr:
                yield (
                    f"{_where(instr, comp)}: async computation {called.name} is already "
                    f"called by {_where(first)}"
                )


def _check_call_cycles(comps: list[HloComputation]) -> Iterator[str]:
    state: dict[int, int] = {}
    for start in comps:
        if state.get(id(start)):
            continue
        stack = [(start, iter(list(start.called_computations())))]
        state[id(start)] = 1
        path = [start.name]
        while stack:
            comp, callees = stack[-1]
            callee = next(callees, None)
            if callee is None:
                stack.pop()
                path.pop()
                state[id(comp)] = 2
                continue
            s = state.get(id(callee))
            if s == 1:
                yield f"{callee.name}: calls itself ({' -> '.join([*path, callee.name])})"
                return
            if s == 2:
                continue
            state[id(callee)] = 1
            path.append(callee.name)
            stack.append((callee, iter(list(callee.called_computations()))))


# -- instructions ---------------------------------------------------------------------------


def _check_instruction(instr: HloInstruction) -> Iterator[str]:
    yield from _check_layouts(instr.shape, "shape")
    yield from _check_byte_sizes(instr.shape)
    literal = instr.literal if instr.opcode is Opcode.CONSTANT else None
    if literal is not None and not compatible(literal.shape, instr.shape):
        yield (
            f"literal has shape {_t(literal.shape)} but the constant is declared {_t(instr.shape)}"
        )
    # raw reads here and below: the verifier reports a malformed attribute as one problem
    # among others, where a typed accessor would stop at the first one
    sharding = instr.attrs.get("sharding")
    if isinstance(sharding, HloSharding):
        yield from _check_sharding(instr, sharding)
    if instr.opcode is Opcode.PARAMETER and instr.operands:
        yield f"parameter takes no operands, has {len(instr.operands)}"
    if instr.opcode is not Opcode.PARAMETER and instr.parameter_number is not None:
        yield f"{instr.opcode.text} has a parameter number"
    if instr.opcode is Opcode.COMPARE and "type" in instr.attrs and "order" in instr.attrs:
        total_type = str(instr.attrs["type"]) == "TOTALORDER"
        if total_type != (str(instr.attrs["order"]) == "TOTAL"):
            yield (
                f"compare says type={instr.attrs['type']} and order={instr.attrs['order']}, "
                "which disagree (order=TOTAL is type=TOTALORDER)"
            )
    try:
        inferred = infer_shape(
            instr.opcode, [op.shape for op in instr.operands], instr.attrs, instr.shape
        )
    except ShapeError as e:
        yield str(e)
        return
    except (KeyError, IndexError, TypeError, AttributeError, ValueError) as e:
        yield f"{instr.opcode.text}: malformed attributes or operands ({type(e).__name__}: {e})"
        return
    if not compatible(inferred, instr.shape):
        yield (
            f"declared shape {_t(instr.shape)} does not match the shape {instr.opcode.text} "
            f"produces, {_t(inferred)}"
        )


MAX_BYTES = (1 << 63) - 1
"""The most bytes one buffer, or all the buffers of a program together, may take: memory
planning counts bytes in int64."""


def _check_byte_sizes(shape: Shape) -> Iterator[str]:
    for _, sub in shape.leaves():
        if sub.is_array and _static(sub) and sub.byte_size > MAX_BYTES:
            yield (
                f"shape {_t(sub)} takes {sub.byte_size} bytes, more than the {MAX_BYTES} "
                "an int64 byte count holds"
            )


def _check_total_bytes(module: HloModule) -> Iterator[str]:
    total = sum(
        sub.byte_size
        for comp in module.computations
        for instr in comp.instructions
        for _, sub in instr.shape.leaves()
        if sub.is_array and _static(sub)
    )
    if total > MAX_BYTES:
        yield (
            f"module {module.name}: its buffers take {total} bytes together, more than the "
            f"{MAX_BYTES} an int64 byte count holds"
        )


def _check_sharding(instr: HloInstruction, sharding: HloSharding) -> Iterator[str]:
    """A tiled sharding has one tile dimension per array dimension (plus its subgroup
    dimensions); a tuple sharding one element per leaf; ids below the module's device count
    when the module says it is partitioned (num_partitions > 1; a replicated module's
    shardings name devices of its device assignment)."""
    module = instr.parent.parent if instr.parent is not None else None
    devices = None
    if module is not None and module.config.num_partitions > 1:  # ids are partition ids
        devices = module.config.num_partitions
    leaves = [leaf for _, leaf in instr.shape.leaves()]
    if sharding.is_tuple:
        if len(sharding.elements) != len(leaves):
            yield (
                f"tuple sharding has {len(sharding.elements)} elements; the shape "
                f"{_t(instr.shape)} has {len(leaves)} leaves"
            )
            return
        pairs = list(zip(sharding.elements, leaves, strict=True))
    elif instr.shape.is_tuple:
        if sharding.kind == "tiled":
            yield f"a tiled sharding on the tuple shape {_t(instr.shape)} (expected a tuple)"
        return
    else:
        pairs = [(sharding, instr.shape)]
    for element, shape in pairs:
        rank = shape.rank if shape.is_array else None
        yield from element.check(rank, None)
        if devices is not None and element.kind == "tiled" and max(element.devices()) >= devices:
            yield f"sharding {element.text()} names devices beyond the {devices} partitions"


def _check_layouts(shape: Shape, what: str) -> Iterator[str]:
    for index, sub in shape.subshapes():
        if sub.layout is None or not sub.is_array:
            continue
        m2m = sub.layout.minor_to_major
        if sorted(m2m) != list(range(sub.rank)):
            at = f" at {index_text(index)}" if index else ""
            yield (
                f"layout {{{','.join(map(str, m2m))}}} of {what}{at} ({_t(sub)}) is not a "
                f"permutation of 0..{sub.rank - 1}"
            )


# -- module config --------------------------------------------------------------------------


def _check_aliases(module: HloModule, entry: HloComputation, root: HloInstruction) -> Iterator[str]:
    params = {p.parameter_number: p.shape for p in entry.parameters}
    result = root.shape
    where = f"module {module.name}: input_output_alias"
    outputs_seen: set = set()
    params_seen: set = set()
    for e in module.config.input_output_alias:
        desc = f"{index_text(e.output_index)}: ({e.param_number}, {index_text(e.param_index)})"
        if not result.has_index(e.output_index):
            yield f"{where} {desc}: output index is not in the result shape {_t(result)}"
            continue
        if e.param_number not in params:
            yield f"{where} {desc}: the entry has no parameter {e.param_number}"
            continue
        pshape = params[e.param_number]
        if not pshape.has_index(e.param_index):
            yield f"{where} {desc}: parameter index is not in {_t(pshape)}"
            continue
        out, src = result.subshape(e.output_index), pshape.subshape(e.param_index)
        if out.is_tuple != src.is_tuple or out.is_array != src.is_array:
            yield f"{where} {desc}: output {_t(out)} and parameter {_t(src)} are not alike"
        elif _static(out) and _static(src) and out.byte_size != src.byte_size:
            yield (
                f"{where} {desc}: output {_t(out)} has {out.byte_size} bytes but parameter "
                f"{_t(src)} has {src.byte_size}"
            )
        if e.output_index in outputs_seen:
            yield f"{where} {desc}: output {index_text(e.output_index)} is aliased twice"
        key = (e.param_number, e.param_index)
        if key in params_seen:
            yield (
                f"{where} {desc}: parameter {e.param_number} at {index_text(e.param_index)} "
                "is aliased twice"
            )
        outputs_seen.add(e.output_index)
        params_seen.add(key)
    donors_seen: set = set()
    for d in module.config.buffer_donors:
        desc = f"buffer_donor ({d.param_number}, {index_text(d.param_index)})"
        if d.param_number not in params:
            yield f"module {module.name}: {desc}: the entry has no parameter {d.param_number}"
            continue
        if not params[d.param_number].has_index(d.param_index):
            yield (
                f"module {module.name}: {desc}: index is not in parameter shape "
                f"{_t(params[d.param_number])}"
            )
            continue
        key = (d.param_number, d.param_index)
        if key in params_seen:
            yield f"module {module.name}: {desc} is also in input_output_alias"
        if key in donors_seen:
            yield f"module {module.name}: {desc} is listed twice"
        donors_seen.add(key)


def _static(shape: Shape) -> bool:
    return not shape.is_unbounded_dynamic


def _check_entry_layout(
    module: HloModule, entry: HloComputation, root: HloInstruction
) -> Iterator[str]:
    layout = module.config.entry_computation_layout
    if layout is None:
        return
    where = f"module {module.name}: entry_computation_layout"
    params = entry.parameters
    if len(layout.parameters) != len(params):
        yield (
            f"{where} has {len(layout.parameters)} parameters but {entry.name} takes {len(params)}"
        )
    for i, (declared, p) in enumerate(zip(layout.parameters, params)):
        yield from _check_layouts(declared, f"{where} parameter {i}")
        if not compatible(declared, p.shape):
            yield f"{where} parameter {i} is {_t(declared)} but {p.name} is {_t(p.shape)}"
    yield from _check_layouts(layout.result, f"{where} result")
    if not compatible(layout.result, root.shape):
        yield (f"{where} result is {_t(layout.result)} but {entry.name} returns {_t(root.shape)}")
