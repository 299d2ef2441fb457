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
from xlapy.ir.opcodes import Opcode
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

    @staticmethod
    def short() -> PrintOptions:
        """JAX's `as_text()` style."""
        return PrintOptions()

    @staticmethod
    def long() -> PrintOptions:
        """XLA's optimized-dump style."""
        return PrintOptions(percent_names=True, signatures=True, index_comments=True)

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
    parts.extend(print_computation(c, opts) + "\n" for c in module.computations)
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


def print_instruction(
    instr: HloInstruction, options: PrintOptions | None = None, **overrides
) -> str:
    """One instruction line (without indentation): `[ROOT] name = shape opcode(...), attrs`."""
    opts = _options(options, overrides)
    root = "ROOT " if instr.is_root else ""
    text = f"{root}{_name(instr.name, opts)} = {shape_text(instr.shape, opts.layouts)} "
    text += f"{instr.opcode.text}({_operands(instr, opts)})"
    attrs = _attribute_texts(instr, opts)
    return text + "".join(", " + a for a in attrs)


def shape_text(shape: Shape, layouts: bool = True) -> str:
    """A shape as XLA prints it, with `/*index=5*/` markers inside long tuples."""
    if shape.is_tuple:
        return "(" + _indexed([shape_text(s, layouts) for s in shape.tuple_shapes]) + ")"
    if not shape.is_array:
        return f"{shape.element_type.text}[]"
    return shape.to_text(layouts)


def literal_text(literal: Literal, xla_floats: bool = False) -> str:
    """A literal's value without its shape: `{ {1, 2}, {3, 4} }`, `(1, 2)`, `nan`."""
    shape = literal.shape
    if shape.is_tuple:
        return "(" + ", ".join(literal_text(e, xla_floats) for e in literal.elements) + ")"
    if not shape.is_array:
        return ""
    array = literal.array
    assert array is not None, "an array literal always holds data (Literal.__post_init__)"
    fmt = _element_formatter(shape.element_type, xla_floats)
    if shape.rank == 0:
        return fmt(array[()])
    flat = [fmt(v) for v in array.reshape(-1)]
    return _nest(flat, shape.dims)


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
def _nest(flat: list[str], dims: tuple[int, ...]) -> str:
    if len(dims) == 1:
        return "{" + ", ".join(flat) + "}"
    step = len(flat) // dims[0] if dims[0] else 0
    inner = [_nest(flat[i * step : (i + 1) * step], dims[1:]) for i in range(dims[0])]
    return "{ " + ", ".join(inner) + " }" if inner else "{  }"


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


_NATIVE_FLOATS = {
    PrimitiveType.F16: np.float16,
    PrimitiveType.F32: np.float32,
    PrimitiveType.F64: np.float64,
}


def float_text(value, etype: PrimitiveType) -> str:
    """The shortest text that parses back to exactly `value` as an `etype` element."""
    value = np.asarray(value, dtype=etype.dtype)
    with np.errstate(all="ignore"):
        is_nan = np.isnan(value.astype(np.float64))
    if is_nan:
        return _nan_text(value, etype)
    native = _NATIVE_FLOATS.get(etype)
    if native is not None:
        text = str(native(value.astype(native)))
        return text[:-2] if text.endswith(".0") else text
    wide = float(value.astype(np.float64))
    if np.isinf(wide):
        return str(wide)
    for digits in range(1, 10):
        text = f"{wide:.{digits}g}"
        if np.array(float(text)).astype(etype.dtype).tobytes() == value.tobytes():
            return text
    return f"{wide:.9g}"


_XLA_DIGITS = {PrimitiveType.F64: 17, PrimitiveType.F16: 5, PrimitiveType.BF16: 4}


def _xla_float_text(value, etype: PrimitiveType) -> str:
    """XLA's own spelling: a fixed number of significant digits per type."""
    value = np.asarray(value, dtype=etype.dtype)
    with np.errstate(all="ignore"):
        is_nan = np.isnan(value.astype(np.float64))
    if is_nan:
        return _nan_text(value, etype)
    digits = _XLA_DIGITS.get(etype, 9)
    return f"{float(value.astype(np.float64)):.{digits}g}"


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


def _attribute_texts(instr: HloInstruction, opts: PrintOptions) -> list[str]:
    out = []
    predecessors = instr.control_predecessors
    for key, value in instr.attrs.items():
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
    def spell(pair, first, second, spatial):
        chars = [""] * (len(spatial) + 2)
        chars[first], chars[second] = pair
        for i, dim in enumerate(spatial):
            chars[dim] = str(i)
        return "".join(chars)

    lhs = spell("bf", labels.input_batch, labels.input_feature, labels.input_spatial)
    rhs = spell(
        "io", labels.kernel_input_feature, labels.kernel_output_feature, labels.kernel_spatial
    )
    out = spell("bf", labels.output_batch, labels.output_feature, labels.output_spatial)
    return f"{lhs}_{rhs}->{out}"


def _padding(padding: A.Padding, opts: PrintOptions) -> str:
    interior = any(d[2] for d in padding.dims)
    return "x".join(
        f"{lo}_{hi}_{inner}" if interior else f"{lo}_{hi}" for lo, hi, inner in padding.dims
    )


def _slice(spec: A.SliceSpec, opts: PrintOptions) -> str:
    ranges = [
        f"[{start}:{limit}:{stride}]" if stride != 1 else f"[{start}:{limit}]"
        for start, limit, stride in spec.dims
    ]
    return "{" + ", ".join(ranges) + "}"


def _metadata(meta: A.Metadata, opts: PrintOptions) -> str:
    items = [f"{k}={_quote(v) if isinstance(v, str) else v}" for k, v in meta.items]
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
    return "{" + ",".join(_ints(g) for g in groups.groups) + "}"


def _aliasing(entries, opts: PrintOptions) -> str:
    items = [
        f"{_index(e.output_index)}: ({e.operand_number}, {_index(e.operand_index)})"
        for e in entries
    ]
    return "{" + ", ".join(items) + "}"


_ESCAPE = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _quote(text: str) -> str:
    out = []
    for ch in text:
        if ch in _ESCAPE:
            out.append(_ESCAPE[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


_KIND_PRINTERS: dict[AttrKind, Callable[[Any, PrintOptions], str]] = {
    AttrKind.INT: lambda v, o: str(int(v)),
    AttrKind.FLOAT: _float_attr,
    AttrKind.BOOL: lambda v, o: "true" if v else "false",
    AttrKind.STRING: lambda v, o: _quote(str(v)),
    AttrKind.ENUM: lambda v, o: str(v),
    AttrKind.INT_LIST: lambda v, o: _ints(v),
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
