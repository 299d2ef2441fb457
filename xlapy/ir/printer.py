"""The HLO text printer: an HloModule (or one computation or instruction) as XLA's text.

Two presets cover the two dialects XLA itself prints: `PrintOptions.short()` is what JAX's
`as_text()` shows (bare names, no computation signatures) and `PrintOptions.long()` is what
XLA's optimized dumps show (`%` names, signatures, `/*index=5*/` markers in long operand
lists). Both parse back with xlapy.ir.parser, and print(parse(print(m))) == print(m).

Attribute values are printed by their kind in ATTRIBUTE_KINDS; an attribute a pass added
under a name the table does not know is printed by the Python type of its value. Floats are
printed with the shortest text that reads back to the same bits in their own type (bf16 and
the f8 family through float32), NaN payloads included.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from xlapy.ir import attributes as A
from xlapy.ir.attributes import ATTRIBUTE_KINDS, AttrKind
from xlapy.ir.computation import HloComputation
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.literal import Literal
from xlapy.ir.module import HloModule, ModuleConfig, StackFrameTables
from xlapy.ir.opcodes import Opcode, has_async_shorthand
from xlapy.ir.shapes import ProgramShape, Shape
from xlapy.ir.types import Kind, PrimitiveType


@dataclass(frozen=True, slots=True)
class PrintOptions:
    """How to print HLO text. Use `PrintOptions.short()` or `PrintOptions.long()` and
    `dataclasses.replace` (or keyword overrides to the print functions) for variants."""

    percent_names: bool = False  # `%add.1` instead of `add.1`
    signatures: bool = False  # `%comp (p: f32[2]) -> f32[2] {`
    operand_shapes: bool = False  # `add(f32[2] %a, f32[2] %b)`
    index_comments: bool = False  # `/*index=5*/` before every fifth operand
    metadata: bool = True
    backend_config: bool = True
    stack_frames: bool = True  # the FileNames/.../StackFrames tables of the module
    layouts: bool = True
    xla_floats: bool = False  # XLA's fixed `%.9g` style instead of the shortest text
    elide_constants_over: int | None = None  # print larger constants as `{...}`
    async_sugar: bool = True  # `custom-call-start(x), ...` for an async op wrapping one op
    names: Callable[[str], str] | None = None  # instruction and computation names, renamed

    @staticmethod
    def short() -> PrintOptions:
        """JAX's `as_text()` style."""
        return PrintOptions()

    @staticmethod
    def long() -> PrintOptions:
        """XLA's optimized-dump style."""
        return PrintOptions(percent_names=True, signatures=True, index_comments=True)

    @staticmethod
    def verbose() -> PrintOptions:
        """XLA's HloModule::ToString() with default HloPrintOptions: the long form with each
        operand's shape, `add(f32[2]{0} %a, f32[2]{0} %b)` (XLA's parser tests use it)."""
        return PrintOptions(
            percent_names=True, signatures=True, operand_shapes=True, index_comments=True
        )

    @staticmethod
    def fingerprint() -> PrintOptions:
        """Only what determines the computation: no metadata, no stack frames."""
        return PrintOptions(metadata=False, stack_frames=False)


def _options(options: PrintOptions | None, overrides: dict) -> PrintOptions:
    options = options or PrintOptions()
    return dataclasses.replace(options, **overrides) if overrides else options


# -- public entry points -------------------------------------------------------------------
def print_module(module: HloModule, options: PrintOptions | None = None, **overrides) -> str:
    """The whole module as HLO text: header, stack frame tables, computations."""
    opts = _options(options, overrides)
    parts = [_header(module, opts) + "\n"]
    if opts.stack_frames and not module.stack_frames.empty:
        parts.append(_stack_frames(module.stack_frames))
    wrapped = _sugared_computations(module) if opts.async_sugar else set()
    parts.extend(
        print_computation(c, opts) + "\n" for c in module.computations if id(c) not in wrapped
    )
    return "\n".join(parts) + "\n"


def print_computation(
    computation: HloComputation, options: PrintOptions | None = None, **overrides
) -> str:
    """One computation: its first line, one instruction per line, and the closing brace."""
    opts = _options(options, overrides)
    head = "ENTRY " if computation.is_entry else ""
    head += _name(computation.name, opts)
    if opts.signatures and computation.root is not None:
        head += " " + _signature(computation, computation.root)
    if computation.execution_thread != "main":
        head += f", execution_thread={_quote(computation.execution_thread)}"
    lines = [head + " {"]
    lines.extend("  " + print_instruction(i, opts) for i in computation.instructions)
    lines.append("}")
    return "\n".join(lines)


def print_canonical(computation: HloComputation) -> str:
    """`computation` and every computation it calls (each once, in the order first called),
    without metadata, with computations renamed `c<k>` and instructions `c<k>.<position>`
    (XLA's canonical print): computations that differ only in names print the same text,
    and computations whose called computations differ do not (their bodies are printed, not
    only their names). When a name is used twice (an instruction named like a computation,
    or two instructions alike in different computations), the names are printed as they
    are, which keeps the text faithful."""
    comps = [computation]
    seen = {id(computation)}
    for comp in comps:  # grows while it is walked: breadth first over the call graph
        for instr in comp.instructions:
            for called in instr.called_computations():
                if id(called) not in seen:
                    seen.add(id(called))
                    comps.append(called)
    names: dict[str, str] = {}
    count = 0
    for k, comp in enumerate(comps):
        names[comp.name] = f"c{k}"
        for j, instr in enumerate(comp.instructions):
            names[instr.name] = f"c{k}.{j}"
        count += 1 + len(comp.instructions)
    rename = names.__getitem__ if len(names) == count else None
    opts = dataclasses.replace(PrintOptions.fingerprint(), names=rename)
    return "\n".join(print_computation(c, opts) for c in comps)


def print_instruction(
    instr: HloInstruction, options: PrintOptions | None = None, **overrides
) -> str:
    """One instruction line (without indentation): `[ROOT] name = shape opcode(...), attrs`."""
    opts = _options(options, overrides)
    root = "ROOT " if instr.is_root else ""
    text = f"{root}{_name(instr.name, opts)} = {shape_text(instr.shape, opts.layouts)} "
    wrapped = _sugar_root(instr) if opts.async_sugar else None
    if wrapped is None:
        text += f"{instr.opcode.text}({_operands(instr, opts)})"
        attrs = _attribute_texts(instr, opts)
    else:  # custom-call-start(x), custom_call_target="f": the op the async op wraps
        text += f"{wrapped.opcode.text}-{instr.opcode.text[6:]}({_operands(instr, opts)})"
        attrs = _attribute_texts(instr, opts, skip="calls")
        if instr.opcode is Opcode.ASYNC_START:
            attrs += _attribute_texts(wrapped, opts)
    return text + "".join(", " + a for a in attrs)


def _sugar_root(instr: HloInstruction) -> HloInstruction | None:
    """The instruction an async op wraps, when XLA prints the op as `<op>-start` and so on:
    the wrapped computation is that instruction applied to its parameters in order."""
    if instr.opcode not in _ASYNC_OPS:
        return None
    start = instr
    while start.opcode is not Opcode.ASYNC_START:  # done -> update ... -> start
        if not start.operands or start.operands[0].opcode not in _ASYNC_OPS[:2]:
            return None
        start = start.operands[0]
    calls = start.attrs.get("calls")
    if not isinstance(calls, HloComputation) or not _expands_to_one_op(calls):
        return None
    return calls.root


_ASYNC_OPS = (Opcode.ASYNC_START, Opcode.ASYNC_UPDATE, Opcode.ASYNC_DONE)


def _expands_to_one_op(comp: HloComputation) -> bool:
    root = comp.root
    if root is None or not has_async_shorthand(root.opcode) or root.control_predecessors:
        return False
    params = comp.parameters
    if len(comp.instructions) != len(params) + 1 or len(root.operands) != len(params):
        return False
    return all(op.parameter_number == i for i, op in enumerate(root.operands))


def _sugared_computations(module: HloModule) -> set[int]:
    """ids of the computations printed inside their async ops' shorthand."""
    sugared: set[int] = set()
    other_callers: set[int] = set()
    for comp in module.computations:
        for instr in comp.instructions:
            if instr.opcode is Opcode.ASYNC_START and _sugar_root(instr) is not None:
                sugared.add(id(instr.attrs["calls"]))
            elif instr.opcode not in _ASYNC_OPS:
                other_callers.update(id(c) for c in instr.called_computations())
    return sugared - other_callers


def shape_text(shape: Shape, layouts: bool = True) -> str:
    """A shape as XLA prints it, with `/*index=5*/` markers inside long tuples."""
    if shape.is_tuple:
        return "(" + _indexed([shape_text(s, layouts) for s in shape.tuple_shapes]) + ")"
    if not shape.is_array:
        return f"{shape.element_type.text}[]"
    return shape.to_text(layouts)


def literal_text(literal: Literal, xla_floats: bool = False) -> str:
    """A literal's value without its shape, as XLA prints it on one line: `{1, 2}`,
    `{ { 1, 2 }, { 3, 4 } }`, `(1, 2)`, `nan`; pred arrays as 0 and 1, and a `/*i0=2*/`
    comment opening each block of a rank > 3 array."""
    shape = literal.shape
    if shape.is_tuple:
        return "( " + ", ".join(literal_text(e, xla_floats) for e in literal.elements) + " )"
    if not shape.is_array:
        return ""
    array = literal.array
    assert array is not None, "an array literal always holds data (Literal.__post_init__)"
    if shape.rank == 0:
        return _element_formatter(shape.element_type, xla_floats)(array[()])
    if shape.element_type.kind is Kind.PRED:
        flat = ["1" if v else "0" for v in array.reshape(-1)]
    else:
        fmt = _element_formatter(shape.element_type, xla_floats)
        flat = [fmt(v) for v in array.reshape(-1)]
    if shape.rank == 1:
        return "{" + ", ".join(flat) + "}"
    return _nest(flat, shape.dims, ())


def shaped_literal_text(literal: Literal, xla_floats: bool = False) -> str:
    """A literal with its shape, as XLA's Literal::ToString: `s32[2]{0} {1, 2}`,
    `( f32[] 1, pred[2]{0} {0, 1} )`."""
    if literal.shape.is_tuple:
        inner = ", ".join(shaped_literal_text(e, xla_floats) for e in literal.elements)
        return f"( {inner} )" if inner else "( )"
    return f"{shape_text(literal.shape)} {literal_text(literal, xla_floats)}"


# -- module pieces -------------------------------------------------------------------------
def _header(module: HloModule, opts: PrintOptions) -> str:
    config: ModuleConfig = module.config
    items = [f"HloModule {module.name}"]
    if config.is_scheduled:
        items.append("is_scheduled=true")
    if config.input_output_alias:
        entries = ", ".join(
            f"{_index(e.output_index)}: ({e.param_number}, {_index(e.param_index)}, {e.kind})"
            for e in config.input_output_alias
        )
        items.append(f"input_output_alias={{ {entries} }}")
    if config.buffer_donors:
        donors = ", ".join(
            f"({d.param_number}, {_index(d.param_index)})" for d in config.buffer_donors
        )
        items.append(f"buffer_donor={{ {donors} }}")
    layout = config.entry_computation_layout
    if layout is not None:
        items.append(f"entry_computation_layout={{{_program_shape(layout)}}}")
    if config.replica_count != 1:
        items.append(f"replica_count={config.replica_count}")
    if config.num_partitions != 1:
        items.append(f"num_partitions={config.num_partitions}")
    if config.frontend_attributes is not None:
        items.append("frontend_attributes=" + _frontend(config.frontend_attributes))
    items.extend(f"{k}={v}" for k, v in config.extra_attributes)
    return ", ".join(items)


def _program_shape(layout: ProgramShape) -> str:
    params = _indexed([shape_text(p) for p in layout.parameters])
    return f"({params})->{shape_text(layout.result)}"


def _stack_frames(tables: StackFrameTables) -> str:
    out = []
    for title, rows, quoted in (
        ("FileNames", tables.file_names, True),
        ("FunctionNames", tables.function_names, True),
        ("FileLocations", tables.file_locations, False),
        ("StackFrames", tables.stack_frames, False),
    ):
        if not rows:
            continue
        body = "".join(f"{i} {_quote(text) if quoted else '{' + text + '}'}\n" for i, text in rows)
        out.append(f"{title}\n{body}")
    return "\n".join(out) + "\n"


def _signature(computation: HloComputation, root: HloInstruction) -> str:
    params = ", ".join(f"{p.name}: {shape_text(p.shape, False)}" for p in computation.parameters)
    return f"({params}) -> {shape_text(root.shape, False)}"


def _name(name: str, opts: PrintOptions) -> str:
    if opts.names is not None:
        name = opts.names(name)
    return f"%{name}" if opts.percent_names else name


def _indexed(items: list[str]) -> str:
    return ", ".join(
        f"/*index={i}*/{item}" if i and i % 5 == 0 else item for i, item in enumerate(items)
    )


# -- operands ------------------------------------------------------------------------------
def _operands(instr: HloInstruction, opts: PrintOptions) -> str:
    if instr.opcode is Opcode.PARAMETER:
        return str(instr.parameter_number)
    if instr.opcode is Opcode.CONSTANT:
        literal = instr.literal
        if literal is None:
            return "{...}"
        limit = opts.elide_constants_over
        if limit is not None and _element_count(literal) > limit:
            return "{...}"
        return literal_text(literal, opts.xla_floats)
    items = []
    for op in instr.operands:
        text = _name(op.name, opts)
        if opts.operand_shapes:
            text = f"{shape_text(op.shape, opts.layouts)} {text}"
        items.append(text)
    return _indexed(items) if opts.index_comments else ", ".join(items)


def _element_count(literal: Literal) -> int:
    if literal.shape.is_tuple:
        return sum(_element_count(e) for e in literal.elements)
    return literal.array.size if literal.array is not None else 0


# -- literals ------------------------------------------------------------------------------
def _nest(flat: list[str], dims: tuple[int, ...], index: tuple[int, ...]) -> str:
    """Block `index` of a rank >= 2 array: innermost rows `{ 1, 2 }` (`{1}` when one long),
    outer blocks `{ row, row }`, each outer block of a rank > 3 array tagged `/*iK=v*/`."""
    if len(dims) == 1:
        return "{ " + ", ".join(flat) + " }" if dims[0] > 1 else "{" + "".join(flat) + "}"
    rank = len(dims) + len(index)
    tag = f" /*i{len(index) - 1}={index[-1]}*/" if rank > 3 and index else ""
    step = len(flat) // dims[0] if dims[0] else 0
    inner = [_nest(flat[i * step : (i + 1) * step], dims[1:], (*index, i)) for i in range(dims[0])]
    return "{" + tag + " " + ", ".join(inner) + " }" if inner else "{" + tag + " }"


def _element_formatter(etype: PrimitiveType, xla_floats: bool):
    kind = etype.kind
    if kind is Kind.PRED:
        return lambda v: "true" if v else "false"
    if kind in (Kind.SIGNED, Kind.UNSIGNED):
        return lambda v: str(int(v))
    text = _xla_float_text if xla_floats else float_text
    if kind is Kind.FLOAT:
        return lambda v: text(v, etype)
    part = etype.complex_component_type
    return lambda v: f"({text(v.real, part)}, {text(v.imag, part)})"


def float_text(value, etype: PrimitiveType) -> str:
    """A float as XLA prints it, text that parses back to exactly `value` as an `etype`:
    f32 with `%.6g` (`%.9g` when 6 digits do not round-trip), f64 with `%.15g` (or `%.17g`),
    the narrower types with the `max_digits10` of their type (bf16 `%.4g`: 500 is `500`)."""
    value = np.asarray(value, dtype=etype.dtype)
    with np.errstate(all="ignore"):
        wide = float(value.astype(np.float64))
    if np.isnan(wide):
        return _nan_text(value, etype)
    if np.isinf(wide):
        return "-inf" if wide < 0 else "inf"
    if etype is PrimitiveType.F64:
        text = f"{wide:.15g}"
        return text if float(text) == wide else f"{wide:.17g}"
    if etype is PrimitiveType.F32:
        text = f"{wide:.6g}"
        return text if np.float32(float(text)) == value else f"{wide:.9g}"
    return f"{wide:.{_max_digits10(etype)}g}"


def _max_digits10(etype: PrimitiveType) -> int:
    """C++'s numeric_limits<T>::max_digits10 of a float type: 2 + digits * log10(2)."""
    digits = ml_dtypes.finfo(etype.dtype).nmant + 1
    return 2 + digits * 30103 // 100000


def _xla_float_text(value, etype: PrimitiveType) -> str:
    """The same as float_text (kept for PrintOptions.xla_floats, which it once changed)."""
    return float_text(value, etype)


def _nan_text(value: np.ndarray, etype: PrimitiveType) -> str:
    dtype = etype.dtype
    bits = dtype.itemsize * 8
    uint = np.dtype(f"u{dtype.itemsize}")
    raw = int(value.view(uint))
    sign_bit = 1 << (bits - 1)
    with np.errstate(all="ignore"):
        canonical = int(np.array(np.nan, dtype=dtype).view(uint)) & ~sign_bit
    sign = "-" if raw & sign_bit else ""
    if raw & ~sign_bit == canonical:
        return f"{sign}nan"
    payload = raw & ((1 << ml_dtypes.finfo(dtype).nmant) - 1)
    return f"{sign}nan(0x{payload:x})"


# -- attributes ----------------------------------------------------------------------------
_TRAILING = ("metadata", "frontend_attributes", "backend_config", "statistics", "original_value")


def _attribute_texts(instr: HloInstruction, opts: PrintOptions, skip: str = "") -> list[str]:
    out = []
    predecessors = instr.control_predecessors
    for key, value in instr.attrs.items():
        if key == skip:
            continue
        if predecessors and key in _TRAILING:
            out.append(_predecessors(predecessors, opts))
            predecessors = []
        if key == "metadata" and not opts.metadata:
            continue
        if key == "backend_config" and not opts.backend_config:
            continue
        if value is None:
            continue
        out.append(f"{key}={attribute_value_text(key, value, opts)}")
    if predecessors:
        out.append(_predecessors(predecessors, opts))
    return out


def _predecessors(preds: list[HloInstruction], opts: PrintOptions) -> str:
    return "control-predecessors={" + ", ".join(_name(p.name, opts) for p in preds) + "}"


def attribute_value_text(key: str, value, opts: PrintOptions | None = None) -> str:
    """The text of attribute `key`'s value, as it appears after `key=`."""
    opts = opts or PrintOptions()
    kind = ATTRIBUTE_KINDS.get(key)
    printer = _KIND_PRINTERS.get(kind) if kind is not None else None
    if printer is None:
        return _by_type(value, opts)
    return printer(value, opts)


def _by_type(value, opts: PrintOptions) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | A.Enum | A.Raw):
        return str(value) if not isinstance(value, A.Raw) else value.text
    if isinstance(value, float):
        return _float_attr(value, opts)
    if isinstance(value, str):
        return _quote(value)
    if isinstance(value, HloComputation):
        return _name(value.name, opts)
    if isinstance(value, Shape):
        return shape_text(value)
    for kind, cls in _VALUE_CLASSES:
        if isinstance(value, cls):
            return _KIND_PRINTERS[kind](value, opts)
    if isinstance(value, tuple | list):
        if value and all(isinstance(v, HloComputation) for v in value):
            return _computations(value, opts)
        return "{" + ",".join(_by_type(v, opts) for v in value) + "}"
    return _quote(str(value))


def _ints(values: Iterable[int]) -> str:
    return "{" + ",".join(str(int(v)) for v in values) + "}"


def _int_lists(lists) -> str:
    return "{" + ",".join(_ints(v) for v in lists) + "}"


def _index(index) -> str:
    return _ints(index)


def _computations(comps, opts: PrintOptions) -> str:
    return "{" + ", ".join(_name(c.name, opts) for c in comps) + "}"


def _float_attr(value: float, opts: PrintOptions) -> str:
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


def _window(window: A.Window, opts: PrintOptions) -> str:
    dims = window.dims
    if not dims:
        return "{}"
    fields = [("size", [str(d.size) for d in dims])]
    optional = (
        ("stride", [d.stride for d in dims], 1),
        ("pad", [f"{d.pad_low}_{d.pad_high}" for d in dims], "0_0"),
        ("lhs_dilate", [d.base_dilation for d in dims], 1),
        ("rhs_dilate", [d.window_dilation for d in dims], 1),
        ("rhs_reversal", [int(d.reversal) for d in dims], 0),
    )
    for name, values, default in optional:
        if any(v != default for v in values):
            fields.append((name, [str(v) for v in values]))
    return "{" + " ".join(f"{n}={'x'.join(v)}" for n, v in fields) + "}"


def _dim_labels(labels: A.ConvDimLabels, opts: PrintOptions) -> str:
    ranks = labels.ranks or (len(labels.input_spatial) + 2,) * 3

    def spell(pair, first, second, spatial, rank=0):
        chars = ["?"] * rank
        chars[first], chars[second] = pair
        for i, dim in enumerate(spatial):
            chars[dim] = str(i)
        return "".join(chars)

    lhs = spell("bf", labels.input_batch, labels.input_feature, labels.input_spatial, ranks[0])
    rhs = spell(
        "io",
        labels.kernel_input_feature,
        labels.kernel_output_feature,
        labels.kernel_spatial,
        ranks[1],
    )
    out = spell("bf", labels.output_batch, labels.output_feature, labels.output_spatial, ranks[2])
    return f"{lhs}_{rhs}->{out}"


def _padding(padding: A.Padding, opts: PrintOptions) -> str:
    if not padding.dims:
        return "{}"  # a scalar's (XLA prints nothing, which no parser reads back)
    interior = any(d[2] for d in padding.dims)
    return "x".join(
        f"{lo}_{hi}_{inner}" if interior else f"{lo}_{hi}" for lo, hi, inner in padding.dims
    )


def _slice(spec: A.SliceSpec, opts: PrintOptions) -> str:
    strided = any(stride != 1 for _, _, stride in spec.dims)  # then XLA prints every stride
    ranges = [
        f"[{start}:{limit}:{stride}]" if strided else f"[{start}:{limit}]"
        for start, limit, stride in spec.dims
    ]
    return "{" + ", ".join(ranges) + "}"


def _metadata(meta: A.Metadata, opts: PrintOptions) -> str:
    items = [
        f"{k}={_quote(v) if isinstance(v, str) else _ints(v) if isinstance(v, tuple) else v}"
        for k, v in meta.items
    ]
    return "{" + " ".join(items) + "}"


_BARE_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*(?:-(?!>)[A-Za-z0-9_.]*)*\Z")


def _frontend(attrs: A.FrontendAttributes, opts: PrintOptions | None = None) -> str:
    items = [
        f"{k if _BARE_KEY.match(k) else _quote(k)}={v.text if isinstance(v, A.Raw) else _quote(v)}"
        for k, v in attrs.items
    ]
    return "{" + ",".join(items) + "}"


def _backend_config(config: A.BackendConfig | str, opts: PrintOptions) -> str:
    if isinstance(config, str):
        return _quote(config)
    return config.text if config.braced else _quote(config.text)


def _replica_groups(groups: A.ReplicaGroups, opts: PrintOptions) -> str:
    if groups.iota_text is not None:
        return groups.iota_text
    mesh = groups.mesh
    if mesh is not None:
        axes = ",".join(f"'{n}'={s}" for n, s in zip(mesh.names, mesh.sizes))
        ids = ""
        if mesh.device_ids_iota is not None:
            ids = f", device_ids=({mesh.device_ids_iota})"
        elif mesh.device_ids is not None:
            ids = f", device_ids=({','.join(map(str, mesh.device_ids))})"
        refs = ",".join(
            f"'{mesh.names[a.axis]}'" + (f":({a.pre_size}){a.size}" if a.pre_size else "")
            for a in groups.mesh_axes
        )
        return f"mesh[{axes}]{ids} {{{refs}}}"
    return "{" + ",".join(_ints(g) for g in groups.groups) + "}"


def _aliasing(entries, opts: PrintOptions) -> str:
    items = [
        f"{_index(e.output_index)}: ({e.operand_number}, {_index(e.operand_index)})"
        for e in entries
    ]
    return "{" + ", ".join(items) + "}"


_ESCAPE = {
    '"': '\\"',
    "'": "\\'",
    "\\": "\\\\",
    "\n": "\\n",
    "\t": "\\t",
    "\r": "\\r",
}
_PLAIN = re.compile(r"[^\"'\\\x00-\x1f\x7f]*\Z")


def _quote(text: str) -> str:
    """`text` quoted as XLA's CEscape writes it: `\\"`, `\\'`, `\\n`, other controls octal."""
    if _PLAIN.match(text):
        return '"' + text + '"'
    out = []
    for ch in text:
        if ch in _ESCAPE:
            out.append(_ESCAPE[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\{ord(ch):03o}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


_KIND_PRINTERS: dict[AttrKind, Callable[[Any, PrintOptions], str]] = {
    AttrKind.INT: lambda v, o: str(int(v)),
    AttrKind.FLOAT: _float_attr,
    AttrKind.BOOL: lambda v, o: "true" if v else "false",
    AttrKind.STRING: lambda v, o: _quote(str(v)),
    AttrKind.ENUM: lambda v, o: str(v),
    AttrKind.INT_LIST: lambda v, o: _int_lists(v) if v and isinstance(v[0], tuple) else _ints(v),
    AttrKind.COMPUTATION: lambda v, o: _name(v.name, o),
    AttrKind.COMPUTATION_LIST: _computations,
    AttrKind.INSTRUCTION_LIST: _computations,
    AttrKind.WINDOW: _window,
    AttrKind.DIM_LABELS: _dim_labels,
    AttrKind.PADDING: _padding,
    AttrKind.SLICE: _slice,
    AttrKind.METADATA: _metadata,
    AttrKind.FRONTEND_ATTRIBUTES: _frontend,
    AttrKind.SHARDING: lambda v, o: v.text() if isinstance(v, A.Sharding) else "{" + v + "}",
    AttrKind.BACKEND_CONFIG: _backend_config,
    AttrKind.REPLICA_GROUPS: _replica_groups,
    AttrKind.PAIRS: lambda v, o: "{" + ",".join(_ints(p) for p in v) + "}",
    AttrKind.PRECISION_LIST: lambda v, o: "{" + ",".join(str(p) for p in v) + "}",
    AttrKind.SHAPE_LIST: lambda v, o: "{" + ", ".join(shape_text(s) for s in v) + "}",
    AttrKind.SHAPE: lambda v, o: shape_text(v),
    AttrKind.OUTPUT_OPERAND_ALIASING: _aliasing,
    AttrKind.LITERAL: lambda v, o: shaped_literal_text(v, o.xla_floats),
    AttrKind.RAW: lambda v, o: v.text if isinstance(v, A.Raw) else str(v),
}

_VALUE_CLASSES = (
    (AttrKind.WINDOW, A.Window),
    (AttrKind.DIM_LABELS, A.ConvDimLabels),
    (AttrKind.PADDING, A.Padding),
    (AttrKind.SLICE, A.SliceSpec),
    (AttrKind.METADATA, A.Metadata),
    (AttrKind.FRONTEND_ATTRIBUTES, A.FrontendAttributes),
    (AttrKind.SHARDING, A.Sharding),
    (AttrKind.BACKEND_CONFIG, A.BackendConfig),
    (AttrKind.REPLICA_GROUPS, A.ReplicaGroups),
)
