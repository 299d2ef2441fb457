"""Shape inference: the result shape of every HLO opcode from its operands and attributes.

One rule per opcode (or family of opcodes) is registered in SHAPE_RULES with `@infers`. A rule
is `rule(operands, attrs, declared) -> Shape`: `operands` are the operand shapes, `attrs` the
instruction's attributes (as in `instr.attrs`), and `declared` the instruction's stated shape
or None. Rules follow XLA's operation semantics. Where the result follows from operands and
attributes alone the rule ignores `declared` (the verifier then compares the two); where it
does not (reshape's dims, convert's element type, a custom call's result) the rule takes what
it must from `declared`, checks what it can against the operands, and raises "needs a result
shape" when `declared` is None. Inferred shapes carry no layout: layouts are the declared
shape's business.

Rules raise ShapeError with a message that says which operand or attribute is wrong, what was
expected and what was found; `infer_shape` prefixes the opcode's name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

from xlapy.errors import ShapeError
from xlapy.ir.attributes import Window
from xlapy.ir.opcodes import VARIADIC, Opcode
from xlapy.ir.shapes import UNBOUNDED, Shape
from xlapy.ir.types import PrimitiveType

Rule = Callable[[Sequence[Shape], Mapping[str, Any], "Shape | None"], Shape]

SHAPE_RULES: dict[Opcode, Rule] = {}

PRED, S32, U32, U64 = PrimitiveType.PRED, PrimitiveType.S32, PrimitiveType.U32, PrimitiveType.U64
_MISSING = object()


def infers(*opcodes: Opcode):
    """Register the decorated function as the shape rule of `opcodes`."""

    def register(fn: Rule) -> Rule:
        for op in opcodes:
            if op in SHAPE_RULES:
                raise RuntimeError(f"two shape rules for {op.text}")
            SHAPE_RULES[op] = fn
        return fn

    return register


def infer_shape(
    opcode: Opcode,
    operand_shapes: Sequence[Shape],
    attrs: Mapping[str, Any] | None = None,
    declared: Shape | None = None,
) -> Shape:
    """The result shape of `opcode` applied to `operand_shapes` with `attrs`.

    `declared` is the instruction's stated shape, needed by ops whose result it alone fixes.
    Raises ShapeError (message prefixed with the opcode's name) when the operands or
    attributes do not fit together.
    """
    attrs = attrs or {}
    operand_shapes = list(operand_shapes)
    try:
        if opcode.arity != VARIADIC and len(operand_shapes) != opcode.arity:
            _fail(f"expects {_count(opcode.arity)}, got {len(operand_shapes)}")
        return SHAPE_RULES[opcode](operand_shapes, attrs, declared)
    except ShapeError as e:
        raise ShapeError(f"{opcode.text}: {e}") from None


# -- helpers ---------------------------------------------------------------------------------


def _fail(message: str) -> NoReturn:
    raise ShapeError(message)


def _count(n: int, noun: str = "operand") -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _t(shape: Shape) -> str:
    return shape.to_text(with_layout=False)


def _attr(attrs: Mapping[str, Any], name: str, default=_MISSING):
    """Attribute `name` read by name: shape inference runs on the attribute dict of an
    instruction not made yet (the parser and the builder infer its shape first), so it has
    no instruction to ask through HloInstruction's typed accessors."""
    value = attrs.get(name, default)
    if value is _MISSING:
        _fail(f"missing attribute '{name}'")
    return value


def _needs(declared: Shape | None, why: str = "") -> Shape:
    if declared is None:
        _fail("needs a result shape" + (f" ({why})" if why else ""))
    return declared


def _array(shape: Shape, what: str) -> Shape:
    if not shape.is_array:
        _fail(f"{what} must be an array, got {_t(shape)}")
    return shape


def _scalar(shape: Shape, what: str, types=None) -> Shape:
    if not shape.is_scalar:
        _fail(f"{what} must be a scalar, got {_t(shape)}")
    if types is not None and not types(shape.element_type):
        _fail(f"{what} has the wrong element type: {_t(shape)}")
    return shape


def _dims_match(a: Shape, b: Shape) -> bool:
    """Equal dims; an unbounded `?` dimension matches any size."""
    if a.rank != b.rank:
        return False
    return all(x == y or UNBOUNDED in (x, y) for x, y in zip(a.dims, b.dims))


def _merged(element_type: PrimitiveType, *shapes: Shape) -> Shape:
    """An array of `element_type` with the dims of `shapes` (dynamic where any is dynamic)."""
    first = shapes[0]
    dims = list(first.dims)
    dynamic = list(first.dynamic)
    for s in shapes[1:]:
        for i, (size, dyn) in enumerate(zip(s.dims, s.dynamic)):
            if dims[i] == UNBOUNDED:
                dims[i] = size
            dynamic[i] = dynamic[i] or dyn
    return Shape.array(element_type, dims, dynamic=dynamic)


def _check_dims(dims: Sequence[int], rank: int, what: str, unique: bool = True) -> None:
    for d in dims:
        if not 0 <= d < rank:
            _fail(f"{what} {d} is out of range for rank {rank}")
    if unique and len(set(dims)) != len(dims):
        _fail(f"{what} {tuple(dims)} has repeated dimensions")


def _program_shape(attrs: Mapping[str, Any], name: str):
    comp = _attr(attrs, name)
    if comp.root is None:
        _fail(f"called computation {comp.name} has no root")
    return comp, comp.program_shape


def _without_layouts(shape: Shape) -> Shape:
    return shape.without_layout()


def compatible(a: Shape, b: Shape) -> bool:
    """Equal ignoring layouts and dynamic-dimension flags; `?` matches any size."""
    if a.is_tuple or b.is_tuple:
        return (
            a.is_tuple
            and b.is_tuple
            and len(a.tuple_shapes) == len(b.tuple_shapes)
            and all(compatible(x, y) for x, y in zip(a.tuple_shapes, b.tuple_shapes))
        )
    if a.element_type is not b.element_type:
        return False
    return not a.is_array or _dims_match(a, b)


def _elementwise_operands(operands: Sequence[Shape], same_type: bool = True) -> None:
    first = _array(operands[0], "operand 0")
    for i, s in enumerate(operands[1:], 1):
        _array(s, f"operand {i}")
        if same_type and s.element_type is not first.element_type:
            _fail(
                f"operand {i} has element type {s.element_type} but operand 0 has "
                f"{first.element_type}: {_t(s)} vs {_t(first)}"
            )
        if not _dims_match(s, first):
            _fail(
                f"operand {i} has shape {_t(s)} but must have the dims of operand 0 "
                f"({_t(first)}); HLO does not broadcast implicitly"
            )


def _tuple_or_single(shapes: Sequence[Shape]) -> Shape:
    return shapes[0] if len(shapes) == 1 else Shape.tuple(shapes)


# -- elementwise ----------------------------------------------------------------------------


def _is_float(t):
    return t.is_float


def _is_float_or_complex(t):
    return t.is_floating_or_complex


def _is_int(t):
    return t.is_integral


def _is_pred_or_int(t):
    return t.is_pred or t.is_integral


def _not_pred(t):
    return not t.is_pred


def _is_any(t):
    return True


_UNARY_TYPES = {
    Opcode.ABS: (_not_pred, "a signed, float or complex type"),
    Opcode.CBRT: (_is_float, "a float type"),  # XLA rejects complex cbrt (StableHLO does not)
    Opcode.CEIL: (_is_float, "a float type"),
    Opcode.CLZ: (_is_int, "an integer type"),
    Opcode.COPY: (_is_any, ""),
    Opcode.COS: (_is_float_or_complex, "a float or complex type"),
    Opcode.ERF: (_is_float, "a float type"),
    Opcode.EXP: (_is_float_or_complex, "a float or complex type"),
    Opcode.EXPM1: (_is_float_or_complex, "a float or complex type"),
    Opcode.FLOOR: (_is_float, "a float type"),
    Opcode.LOG: (_is_float_or_complex, "a float or complex type"),
    Opcode.LOG1P: (_is_float_or_complex, "a float or complex type"),
    Opcode.LOGISTIC: (_is_float_or_complex, "a float or complex type"),
    Opcode.NEGATE: (_not_pred, "a numeric type"),
    Opcode.NOT: (_is_pred_or_int, "pred or an integer type"),
    Opcode.POPCNT: (_is_int, "an integer type"),
    Opcode.ROUND_AFZ: (_is_float, "a float type"),
    Opcode.ROUND_EVEN: (_is_float, "a float type"),
    Opcode.RSQRT: (_is_float_or_complex, "a float or complex type"),
    Opcode.SIGN: (_not_pred, "a signed, float or complex type"),
    Opcode.SIN: (_is_float_or_complex, "a float or complex type"),
    Opcode.SQRT: (_is_float_or_complex, "a float or complex type"),
    Opcode.TAN: (_is_float_or_complex, "a float or complex type"),
    Opcode.TANH: (_is_float_or_complex, "a float or complex type"),
}


def _unary_rule(opcode: Opcode):
    check, wanted = _UNARY_TYPES[opcode]

    def rule(operands, attrs, declared):
        x = operands[0]
        if opcode is Opcode.COPY:
            return _without_layouts(x)
        _array(x, "operand 0")
        if not check(x.element_type):
            _fail(f"operand 0 must have {wanted}, got {_t(x)}")
        if opcode is Opcode.ABS and x.element_type.is_complex:
            return _merged(x.element_type.complex_component_type, x)
        return _merged(x.element_type, x)

    return rule


for _op in _UNARY_TYPES:
    infers(_op)(_unary_rule(_op))


@infers(Opcode.IS_FINITE)
def _is_finite(operands, attrs, declared):
    x = _array(operands[0], "operand 0")
    if not x.element_type.is_float:
        _fail(f"operand 0 must have a float type, got {_t(x)}")
    return _merged(PRED, x)


@infers(Opcode.REAL, Opcode.IMAG)
def _real_imag(operands, attrs, declared):
    x = _array(operands[0], "operand 0")
    if x.element_type.is_complex:
        return _merged(x.element_type.complex_component_type, x)
    if x.element_type.is_float:
        return _merged(x.element_type, x)
    _fail(f"operand 0 must be complex or float, got {_t(x)}")


@infers(Opcode.REDUCE_PRECISION)
def _reduce_precision(operands, attrs, declared):
    x = _array(operands[0], "operand 0")
    if not x.element_type.is_float:
        _fail(f"operand 0 must have a float type, got {_t(x)}")
    if _attr(attrs, "exponent_bits") < 1:
        _fail(f"exponent_bits must be at least 1, got {attrs['exponent_bits']}")
    if _attr(attrs, "mantissa_bits") < 0:
        _fail(f"mantissa_bits must be non-negative, got {attrs['mantissa_bits']}")
    return _merged(x.element_type, x)


@infers(Opcode.CONVERT)
def _convert(operands, attrs, declared):
    x = _array(operands[0], "operand 0")
    target = _needs(declared, "the target element type")
    if not target.is_array:
        _fail(f"result must be an array, got {_t(target)}")
    if not _dims_match(x, target):
        _fail(f"result {_t(target)} must keep the dims of operand 0 ({_t(x)})")
    return _merged(target.element_type, x)


@infers(Opcode.BITCAST_CONVERT)
def _bitcast_convert(operands, attrs, declared):
    x = _array(operands[0], "operand 0")
    target = _needs(declared, "the target element type")
    if not target.is_array:
        _fail(f"result must be an array, got {_t(target)}")
    if x.element_type.is_complex != target.element_type.is_complex:
        # as XLA's shape inference (and StableHLO's verifier) refuse it
        _fail(f"cannot bitcast between real and complex types ({x.element_type} to "
              f"{target.element_type})")  # fmt: skip
    src_bits, dst_bits = x.element_type.bits, target.element_type.bits
    if x.element_type.is_pred or target.element_type.is_pred:
        src_bits = dst_bits = 8 if src_bits == dst_bits else src_bits
    if src_bits == dst_bits:
        dims = x.dims
    elif src_bits > dst_bits:
        if src_bits % dst_bits:
            _fail(f"cannot bitcast {x.element_type} to {target.element_type}: widths")
        dims = (*x.dims, src_bits // dst_bits)
    else:
        ratio = dst_bits // src_bits
        if dst_bits % src_bits or not x.dims or x.dims[-1] != ratio:
            _fail(
                f"bitcast from {_t(x)} to {target.element_type} needs a last dimension of "
                f"size {dst_bits}/{src_bits}={ratio}"
            )
        dims = x.dims[:-1]
    return Shape.array(target.element_type, dims)


def _binary_rule(check, wanted: str):
    def rule(operands, attrs, declared):
        _elementwise_operands(operands)
        t = operands[0].element_type
        if not check(t):
            _fail(f"operands must have {wanted}, got {_t(operands[0])}")
        return _merged(t, *operands)

    return rule


for _op in (
    Opcode.ADD,
    Opcode.DIVIDE,
    Opcode.MAXIMUM,
    Opcode.MINIMUM,
    Opcode.MULTIPLY,
    Opcode.POWER,
    Opcode.REMAINDER,
    Opcode.SUBTRACT,
):
    infers(_op)(_binary_rule(_is_any, ""))
for _op in (Opcode.AND, Opcode.OR, Opcode.XOR):
    infers(_op)(_binary_rule(_is_pred_or_int, "pred or an integer type"))
for _op in (Opcode.SHIFT_LEFT, Opcode.SHIFT_RIGHT_ARITHMETIC, Opcode.SHIFT_RIGHT_LOGICAL):
    infers(_op)(_binary_rule(_is_int, "an integer type"))
infers(Opcode.ATAN2)(_binary_rule(_is_float_or_complex, "a float or complex type"))

_DIRECTIONS = {"EQ", "NE", "LT", "LE", "GT", "GE"}


@infers(Opcode.COMPARE)
def _compare(operands, attrs, declared):
    _elementwise_operands(operands)
    direction = attrs.get("direction", attrs.get("comparison_direction"))
    if direction is None:
        _fail("missing attribute 'direction'")
    direction = str(direction)
    if direction not in _DIRECTIONS:
        _fail(f"comparison_direction must be one of EQ NE LT LE GT GE, got {direction}")
    return _merged(PRED, *operands)


@infers(Opcode.COMPLEX)
def _complex(operands, attrs, declared):
    _elementwise_operands(operands)
    t = operands[0].element_type
    if t is PrimitiveType.F32:
        return _merged(PrimitiveType.C64, *operands)
    if t is PrimitiveType.F64:
        return _merged(PrimitiveType.C128, *operands)
    _fail(f"operands must be f32 or f64, got {_t(operands[0])}")


@infers(Opcode.STOCHASTIC_CONVERT)
def _stochastic_convert(operands, attrs, declared):
    _elementwise_operands(operands, same_type=False)
    x, bits = operands
    if not x.element_type.is_float:
        _fail(f"operand 0 must have a float type, got {_t(x)}")
    if not bits.element_type.is_unsigned_integral or bits.element_type.bits != x.element_type.bits:
        _fail(f"operand 1 must be an unsigned integer as wide as operand 0, got {_t(bits)}")
    target = _needs(declared, "the target element type")
    return _merged(target.element_type, x)


@infers(Opcode.CLAMP)
def _clamp(operands, attrs, declared):
    lo, x, hi = operands
    _array(x, "operand 1")
    for i, bound in ((0, lo), (2, hi)):
        _array(bound, f"operand {i}")
        if bound.element_type is not x.element_type:
            _fail(f"operand {i} has element type {bound.element_type}, expected {x.element_type}")
        if not bound.is_scalar and not _dims_match(bound, x):
            _fail(f"operand {i} has shape {_t(bound)}; it must be a scalar or match {_t(x)}")
    return _merged(x.element_type, x)


@infers(Opcode.SELECT)
def _select(operands, attrs, declared):
    pred, on_true, on_false = operands
    _array(pred, "operand 0")
    if not pred.element_type.is_pred:
        _fail(f"operand 0 must have element type pred, got {_t(pred)}")
    _elementwise_operands([on_true, on_false])
    if not pred.is_scalar and not _dims_match(pred, on_true):
        _fail(f"operand 0 has shape {_t(pred)}; it must be pred[] or match {_t(on_true)}")
    return _merged(on_true.element_type, on_true, on_false)


# -- shape and data movement ----------------------------------------------------------------


@infers(Opcode.BITCAST)
def _bitcast(operands, attrs, declared):
    target = _needs(declared, "bitcast's result dims")
    x = operands[0]
    static = x.is_array and target.is_array and not x.is_dynamic and not target.is_dynamic
    if (
        static
        and x.num_elements * x.element_type.bits != target.num_elements * target.element_type.bits
    ):
        _fail(f"result {_t(target)} must have as many bits as operand 0 ({_t(x)})")
    return _without_layouts(target)


@infers(Opcode.BROADCAST)
def _broadcast(operands, attrs, declared):
    x = _array(operands[0], "operand 0")
    dims = tuple(_attr(attrs, "dimensions", ()))
    if len(dims) != x.rank:
        _fail(
            f"dimensions={list(dims)} must name one result dimension per operand dimension "
            f"(operand is {_t(x)})"
        )
    target = _array(_needs(declared, "broadcast's result dims"), "result")
    _check_dims(dims, target.rank, "broadcast dimension")
    if list(dims) != sorted(dims):
        _fail(f"dimensions={list(dims)} must be increasing")
    for i, d in enumerate(dims):
        if x.dims[i] != target.dims[d] and UNBOUNDED not in (x.dims[i], target.dims[d]):
            _fail(
                f"operand dimension {i} has size {x.dims[i]} but result dimension {d} "
                f"has size {target.dims[d]}"
            )
    return Shape.array(x.element_type, target.dims, dynamic=target.dynamic)


@infers(Opcode.RESHAPE)
def _reshape(operands, attrs, declared):
    x = _array(operands[0], "operand 0")
    target = _array(_needs(declared, "reshape's result dims"), "result")
    if target.element_type is not x.element_type:
        _fail(f"result {_t(target)} must keep the element type of operand 0 ({_t(x)})")
    bounded = not x.is_unbounded_dynamic and not target.is_unbounded_dynamic
    if bounded and x.num_elements != target.num_elements:
        _fail(
            f"cannot reshape {_t(x)} ({x.num_elements} elements) to {_t(target)} "
            f"({target.num_elements} elements)"
        )
    return _without_layouts(target)


@infers(Opcode.DYNAMIC_RESHAPE)
def _dynamic_reshape(operands, attrs, declared):
    if not operands:
        _fail("needs an operand")
    x = _array(operands[0], "operand 0")
    target = _array(_needs(declared, "dynamic-reshape's result dims"), "result")
    if len(operands) - 1 != target.rank:
        _fail(
            f"needs one size operand per result dimension ({target.rank}), got {len(operands) - 1}"
        )
    for i, s in enumerate(operands[1:], 1):
        _scalar(s, f"operand {i}", _is_int)
    if target.element_type is not x.element_type:
        _fail(f"result {_t(target)} must keep the element type of operand 0 ({_t(x)})")
    return _without_layouts(target)


@infers(Opcode.CONCATENATE)
def _concatenate(operands, attrs, declared):
    if not operands:
        _fail("needs at least 1 operand")
    dims = tuple(_attr(attrs, "dimensions"))
    if len(dims) != 1:
        _fail(f"dimensions must hold one dimension, got {list(dims)}")
    d = dims[0]
    first = _array(operands[0], "operand 0")
    _check_dims(dims, first.rank, "concatenate dimension")
    total = 0
    dynamic = False
    for i, s in enumerate(operands):
        _array(s, f"operand {i}")
        if s.element_type is not first.element_type:
            _fail(f"operand {i} has element type {s.element_type}, expected {first.element_type}")
        if s.rank != first.rank or any(
            a != b for k, (a, b) in enumerate(zip(s.dims, first.dims)) if k != d
        ):
            _fail(
                f"operand {i} has shape {_t(s)} but must match operand 0 ({_t(first)}) in "
                f"every dimension but {d}"
            )
        total += s.dims[d]
        dynamic = dynamic or s.dynamic[d]
    out_dims = list(first.dims)
    out_dims[d] = total
    dyn = [any(s.dynamic[k] for s in operands) for k in range(first.rank)]
    dyn[d] = dynamic
    return Shape.array(first.element_type, out_dims, dynamic=dyn)


@infers(Opcode.GET_DIMENSION_SIZE)
def _get_dimension_size(operands, attrs, declared):
    x = _array(operands[0], "operand 0")
    dims = tuple(_attr(attrs, "dimensions"))
    if len(dims) != 1:
        _fail(f"dimensions must hold one dimension, got {list(dims)}")
    _check_dims(dims, x.rank, "dimension")
    return Shape.scalar(S32)


@infers(Opcode.SET_DIMENSION_SIZE)
def _set_dimension_size(operands, attrs, declared):
    x = _array(operands[0], "operand 0")
    _scalar(operands[1], "operand 1", lambda t: t is S32)
    dims = tuple(_attr(attrs, "dimensions"))
    if len(dims) != 1:
        _fail(f"dimensions must hold one dimension, got {list(dims)}")
    _check_dims(dims, x.rank, "dimension")
    dynamic = list(x.dynamic)
    dynamic[dims[0]] = True
    return Shape.array(x.element_type, x.dims, dynamic=dynamic)


@infers(Opcode.IOTA)
def _iota(operands, attrs, declared):
    target = _array(_needs(declared, "iota's result dims"), "result")
    if target.rank == 0:
        _fail(f"result must have rank >= 1, got {_t(target)}")
    d = _attr(attrs, "iota_dimension")
    _check_dims((d,), target.rank, "iota_dimension")
    if target.element_type.is_pred:
        _fail("result cannot have element type pred")
    return _without_layouts(target)


@infers(Opcode.PAD)
def _pad(operands, attrs, declared):
    x = _array(operands[0], "operand 0")
    value = _scalar(operands[1], "operand 1 (padding value)")
    if value.element_type is not x.element_type:
        _fail(f"padding value {_t(value)} must have the element type of operand 0 ({_t(x)})")
    padding = _attr(attrs, "padding")
    if len(padding.dims) != x.rank:
        _fail(f"padding has {len(padding.dims)} dimensions but operand 0 is {_t(x)}")
    out = []
    for i, (size, (lo, hi, interior)) in enumerate(zip(x.dims, padding.dims)):
        if interior < 0:
            _fail(f"interior padding of dimension {i} must be non-negative, got {interior}")
        n = lo + hi + size + max(size - 1, 0) * interior
        if n < 0:
            _fail(f"padding {lo}_{hi}_{interior} makes dimension {i} (size {size}) negative")
        out.append(n)
    return Shape.array(x.element_type, out, dynamic=x.dynamic)


@infers(Opcode.REVERSE)
def _reverse(operands, attrs, declared):
    x = _array(operands[0], "operand 0")
    _check_dims(tuple(_attr(attrs, "dimensions")), x.rank, "reverse dimension")
    return _merged(x.element_type, x)


@infers(Opcode.SLICE)
def _slice(operands, attrs, declared):
    x = _array(operands[0], "operand 0")
    spec = _attr(attrs, "slice")
    if len(spec.dims) != x.rank:
        _fail(f"slice has {len(spec.dims)} dimensions but operand 0 is {_t(x)}")
    out = []
    for i, (size, (start, limit, stride)) in enumerate(zip(x.dims, spec.dims)):
        if stride <= 0:
            _fail(f"stride of dimension {i} must be positive, got {stride}")
        if not 0 <= start <= limit or (size != UNBOUNDED and limit > size):
            _fail(
                f"slice [{start}:{limit}] of dimension {i} does not fit size {size} "
                f"(operand 0 is {_t(x)})"
            )
        out.append((limit - start + stride - 1) // stride)
    return Shape.array(x.element_type, out)


@infers(Opcode.TRANSPOSE)
def _transpose(operands, attrs, declared):
    x = _array(operands[0], "operand 0")
    perm = tuple(_attr(attrs, "dimensions"))
    if sorted(perm) != list(range(x.rank)):
        _fail(
            f"dimensions={list(perm)} is not a permutation of 0..{x.rank - 1} "
            f"(operand 0 is {_t(x)})"
        )
    return Shape.array(
        x.element_type, [x.dims[p] for p in perm], dynamic=[x.dynamic[p] for p in perm]
    )


# -- reductions -----------------------------------------------------------------------------


def _check_reducer(comp_name: str, program, init_types, input_types) -> tuple:
    """A reducer takes N accumulators then N elements (scalars) and returns N scalars."""
    n = len(init_types)
    if len(program.parameters) != 2 * n:
        _fail(f"reducer {comp_name} must take {2 * n} parameters, takes {len(program.parameters)}")
    result = program.result
    results = result.tuple_shapes if n > 1 else (result,)
    if (n > 1 and not result.is_tuple) or len(results) != n:
        _fail(f"reducer {comp_name} must return {n} scalar(s), returns {_t(result)}")
    for i, r in enumerate(results):
        if not r.is_scalar:
            _fail(f"reducer {comp_name} must return scalars, result {i} is {_t(r)}")
        if r.element_type is not init_types[i]:
            _fail(
                f"reducer {comp_name} result {i} is {_t(r)} but init value {i} has "
                f"element type {init_types[i]}"
            )
    for i, p in enumerate(program.parameters):
        want = results[i % n].element_type
        if not p.is_scalar or p.element_type is not want:
            _fail(f"reducer {comp_name} parameter {i} is {_t(p)}, expected {want}[]")
    for i, t in enumerate(input_types):
        acc = init_types[i]
        if t is not acc and not (t.is_float and acc.is_float):
            _fail(f"input {i} has element type {t} but its accumulator is {acc}")
    return tuple(r.element_type for r in results)


def _split_inputs_inits(operands, what: str):
    if not operands or len(operands) % 2:
        _fail(f"needs N inputs and N init values, got {_count(len(operands))}")
    n = len(operands) // 2
    inputs, inits = operands[:n], operands[n:]
    for i, s in enumerate(inputs):
        _array(s, f"input {i}")
        if not _dims_match(s, inputs[0]):
            _fail(
                f"input {i} has shape {_t(s)} but input 0 is {_t(inputs[0])}; all "
                f"{what} inputs need the same dims"
            )
    for i, s in enumerate(inits):
        _scalar(s, f"init value {i} (operand {n + i})")
    return inputs, inits


@infers(Opcode.REDUCE)
def _reduce(operands, attrs, declared):
    inputs, inits = _split_inputs_inits(operands, "reduce")
    dims = tuple(_attr(attrs, "dimensions"))
    _check_dims(dims, inputs[0].rank, "reduce dimension")
    comp, program = _program_shape(attrs, "to_apply")
    types = _check_reducer(
        comp.name, program, [s.element_type for s in inits], [s.element_type for s in inputs]
    )
    keep = [k for k in range(inputs[0].rank) if k not in dims]
    x = inputs[0]
    results = [
        Shape.array(t, [x.dims[k] for k in keep], dynamic=[x.dynamic[k] for k in keep])
        for t in types
    ]
    return _tuple_or_single(results)


def _window_of(attrs, rank: int):
    """The window attribute; a scalar's may be left out (XLA prints none for it)."""
    if rank == 0 and "window" not in attrs:
        return Window(())
    return _attr(attrs, "window")


def _window_output(sizes: Sequence[int], window, what: str) -> list[int]:
    if len(window.dims) != len(sizes):
        _fail(f"window has {len(window.dims)} dimensions but {what} has rank {len(sizes)}")
    out = []
    for i, (size, w) in enumerate(zip(sizes, window.dims)):
        if w.size <= 0 or w.stride <= 0 or w.window_dilation <= 0 or w.base_dilation <= 0:
            _fail(f"window dimension {i} has a non-positive size, stride or dilation")
        dilated = 0 if size == 0 else (size - 1) * w.base_dilation + 1
        padded = dilated + w.pad_low + w.pad_high
        span = (w.size - 1) * w.window_dilation + 1
        out.append(0 if padded < span else (padded - span) // w.stride + 1)
    return out


@infers(Opcode.REDUCE_WINDOW)
def _reduce_window(operands, attrs, declared):
    inputs, inits = _split_inputs_inits(operands, "reduce-window")
    comp, program = _program_shape(attrs, "to_apply")
    types = _check_reducer(
        comp.name, program, [s.element_type for s in inits], [s.element_type for s in inputs]
    )
    dims = _window_output(inputs[0].dims, _window_of(attrs, inputs[0].rank), "input 0")
    return _tuple_or_single([Shape.array(t, dims) for t in types])


@infers(Opcode.SELECT_AND_SCATTER)
def _select_and_scatter(operands, attrs, declared):
    x, source, init = operands
    _array(x, "operand 0")
    _array(source, "operand 1 (source)")
    _scalar(init, "operand 2 (init value)")
    if init.element_type is not x.element_type or source.element_type is not x.element_type:
        _fail(
            f"operand, source and init value need one element type, got {_t(x)}, "
            f"{_t(source)}, {_t(init)}"
        )
    expected = _window_output(x.dims, _window_of(attrs, x.rank), "operand 0")
    if list(source.dims) != expected:
        _fail(f"source has shape {_t(source)} but the window over operand 0 gives {list(expected)}")
    scalar = Shape.scalar(x.element_type)
    sel, sel_prog = _program_shape(attrs, "select")
    if len(sel_prog.parameters) != 2 or not all(compatible(p, scalar) for p in sel_prog.parameters):
        _fail(
            f"select computation {sel.name} must take two {_t(scalar)}, takes "
            f"{sel_prog.to_text(False)}"
        )
    if not compatible(sel_prog.result, Shape.scalar(PRED)):
        _fail(f"select computation {sel.name} must return pred[], returns {_t(sel_prog.result)}")
    sc, sc_prog = _program_shape(attrs, "scatter")
    _check_reducer(sc.name, sc_prog, [x.element_type], [x.element_type])
    return _merged(x.element_type, x)


# -- contractions ---------------------------------------------------------------------------


def _result_type(lhs: Shape, rhs: Shape, declared: Shape | None) -> PrimitiveType:
    if declared is not None and declared.is_array:
        return declared.element_type
    if lhs.element_type is rhs.element_type:
        return lhs.element_type
    a, b = lhs.element_type, rhs.element_type
    if a.kind is b.kind:
        return a if a.bits >= b.bits else b
    _fail(f"operands have element types {a} and {b}; a result shape must say which to use")


def _dot_dims(lhs: Shape, rhs: Shape, attrs, rhs_group=()) -> list[int]:
    lb = tuple(attrs.get("lhs_batch_dims", ()))
    rb = tuple(attrs.get("rhs_batch_dims", ()))
    lc = tuple(attrs.get("lhs_contracting_dims", ()))
    rc = tuple(attrs.get("rhs_contracting_dims", ()))
    _check_dims(lb + lc, lhs.rank, "lhs dimension")
    _check_dims(rb + rc + tuple(rhs_group), rhs.rank, "rhs dimension")
    if len(lb) != len(rb):
        _fail(f"lhs_batch_dims {list(lb)} and rhs_batch_dims {list(rb)} differ in length")
    if len(lc) != len(rc):
        _fail(
            f"lhs_contracting_dims {list(lc)} and rhs_contracting_dims {list(rc)} differ in length"
        )
    for kind, ls, rs in (("batch", lb, rb), ("contracting", lc, rc)):
        for a, b in zip(ls, rs):
            if lhs.dims[a] != rhs.dims[b] and UNBOUNDED not in (lhs.dims[a], rhs.dims[b]):
                _fail(
                    f"{kind} dimension lhs {a} (size {lhs.dims[a]}) does not match rhs {b} "
                    f"(size {rhs.dims[b]}): {_t(lhs)} vs {_t(rhs)}"
                )
    lfree = [k for k in range(lhs.rank) if k not in lb and k not in lc]
    rfree = [k for k in range(rhs.rank) if k not in rb and k not in rc and k not in rhs_group]
    return [lhs.dims[k] for k in lb] + [lhs.dims[k] for k in lfree] + [rhs.dims[k] for k in rfree]


@infers(Opcode.DOT)
def _dot(operands, attrs, declared):
    lhs = _array(operands[0], "operand 0 (lhs)")
    rhs = _array(operands[1], "operand 1 (rhs)")
    dims = _dot_dims(lhs, rhs, attrs)
    return Shape.array(_result_type(lhs, rhs, declared), dims)


@infers(Opcode.SCALED_DOT)
def _scaled_dot(operands, attrs, declared):
    lhs = _array(operands[0], "operand 0 (lhs)")
    rhs = _array(operands[1], "operand 1 (rhs)")
    for i in (2, 3):
        _array(operands[i], f"operand {i} (scale)")
        if operands[i].rank != operands[i - 2].rank:
            _fail(f"scale operand {i} must have the rank of operand {i - 2}")
    dims = _dot_dims(lhs, rhs, attrs)
    return Shape.array(_result_type(lhs, rhs, declared), dims)


@infers(Opcode.RAGGED_DOT)
def _ragged_dot(operands, attrs, declared):
    lhs = _array(operands[0], "operand 0 (lhs)")
    rhs = _array(operands[1], "operand 1 (rhs)")
    groups = _array(operands[2], "operand 2 (group sizes)")
    if not groups.element_type.is_integral or groups.rank < 1:
        _fail(f"group sizes must be an integer array, got {_t(groups)}")
    g = groups.dims[-1]
    if "lhs_ragged_dims" not in attrs:
        if lhs.rank != 2 or rhs.rank != 3:
            _fail(f"expects lhs [m,k] and rhs [g,k,n], got {_t(lhs)} and {_t(rhs)}")
        attrs = {
            **attrs,
            "lhs_contracting_dims": (1,),
            "rhs_contracting_dims": (1,),
            "lhs_ragged_dims": (0,),
            "rhs_group_dims": (0,),
        }
    ragged = tuple(attrs["lhs_ragged_dims"])
    rgroup = tuple(attrs.get("rhs_group_dims", ()))
    if len(ragged) != 1:
        _fail(f"lhs_ragged_dims must hold one dimension, got {list(ragged)}")
    for d in rgroup:
        if rhs.dims[d] != g:
            _fail(f"rhs group dimension {d} has size {rhs.dims[d]} but there are {g} groups")
    dims = _dot_dims(lhs, rhs, attrs, rgroup)
    if ragged[0] in tuple(attrs.get("lhs_contracting_dims", ())):
        dims = [g, *dims]
    return Shape.array(_result_type(lhs, rhs, declared), dims)


@infers(Opcode.CONVOLUTION)
def _convolution(operands, attrs, declared):
    lhs = _array(operands[0], "operand 0 (input)")
    rhs = _array(operands[1], "operand 1 (kernel)")
    labels = _attr(attrs, "dim_labels")
    fgc = attrs.get("feature_group_count", 1)
    bgc = attrs.get("batch_group_count", 1)
    n = len(labels.input_spatial)
    if labels.ranks:
        _fail(f"dim_labels leave dimensions unlabeled ('?'): {labels.ranks} labels, {n} spatial")
    if lhs.rank != n + 2 or rhs.rank != n + 2:
        _fail(
            f"dim_labels have {n} spatial dimensions but input is {_t(lhs)} and kernel is {_t(rhs)}"
        )
    if fgc < 1 or bgc < 1:
        _fail("feature_group_count and batch_group_count must be positive")
    batch = lhs.dims[labels.input_batch]
    in_f = lhs.dims[labels.input_feature]
    k_in = rhs.dims[labels.kernel_input_feature]
    k_out = rhs.dims[labels.kernel_output_feature]
    if in_f != k_in * fgc:
        _fail(
            f"input feature size {in_f} must equal kernel input feature size {k_in} x "
            f"feature_group_count {fgc}"
        )
    if k_out % fgc:
        _fail(f"kernel output feature size {k_out} is not divisible by feature_group_count {fgc}")
    if batch % bgc:
        _fail(f"input batch size {batch} is not divisible by batch_group_count {bgc}")
    if k_out % bgc:
        _fail(f"kernel output feature size {k_out} is not divisible by batch_group_count {bgc}")
    window = attrs.get("window")
    if window is None:
        from xlapy.ir.attributes import Window, WindowDim

        window = Window(tuple(WindowDim(rhs.dims[d]) for d in labels.kernel_spatial))
    for i, (w, d) in enumerate(zip(window.dims, labels.kernel_spatial)):
        if w.size != rhs.dims[d]:
            _fail(
                f"window size {w.size} of spatial dimension {i} does not match the "
                f"kernel's size {rhs.dims[d]}"
            )
    spatial = _window_output([lhs.dims[d] for d in labels.input_spatial], window, "input")
    out = [0] * (n + 2)
    out[labels.output_batch] = batch // bgc
    out[labels.output_feature] = k_out
    for d, size in zip(labels.output_spatial, spatial):
        out[d] = size
    return Shape.array(_result_type(lhs, rhs, declared), out)


@infers(Opcode.FFT)
def _fft(operands, attrs, declared):
    x = _array(operands[0], "operand 0")
    kind = str(_attr(attrs, "fft_type"))
    length = tuple(_attr(attrs, "fft_length"))
    if not 1 <= len(length) <= 3:
        _fail(f"fft_length must have 1 to 3 entries, got {list(length)}")
    if x.rank < len(length):
        _fail(f"operand 0 ({_t(x)}) has fewer dimensions than fft_length {list(length)}")
    tail = list(x.dims[x.rank - len(length) :])
    if kind in ("FFT", "IFFT"):
        if not x.element_type.is_complex:
            _fail(f"{kind} needs a complex operand, got {_t(x)}")
        if tail != list(length):
            _fail(f"the last dims of operand 0 ({_t(x)}) must equal fft_length {list(length)}")
        return _merged(x.element_type, x)
    if kind == "RFFT":
        if x.element_type not in (PrimitiveType.F32, PrimitiveType.F64):
            _fail(f"RFFT needs an f32 or f64 operand, got {_t(x)}")
        if tail != list(length):
            _fail(f"the last dims of operand 0 ({_t(x)}) must equal fft_length {list(length)}")
        t = PrimitiveType.C64 if x.element_type is PrimitiveType.F32 else PrimitiveType.C128
        return Shape.array(t, (*x.dims[:-1], length[-1] // 2 + 1))
    if kind == "IRFFT":
        if not x.element_type.is_complex:
            _fail(f"IRFFT needs a complex operand, got {_t(x)}")
        want = [*length[:-1], length[-1] // 2 + 1]
        if tail != want:
            _fail(
                f"the last dims of operand 0 ({_t(x)}) must be {want} for fft_length {list(length)}"
            )
        return Shape.array(
            x.element_type.complex_component_type, (*x.dims[: x.rank - len(length)], *length)
        )
    _fail(f"fft_type must be FFT, IFFT, RFFT or IRFFT, got {kind}")


# -- indexing -------------------------------------------------------------------------------


def _start_indices(operands, first: int, rank: int, what: str) -> None:
    starts = operands[first:]
    if len(starts) == 1 and starts[0].is_array and starts[0].rank == 1:
        if starts[0].dims[0] != rank:
            _fail(f"start index vector {_t(starts[0])} must have {rank} entries")
        return
    if len(starts) != rank:
        _fail(f"{what} needs {rank} start indices (one per dimension), got {len(starts)}")
    for i, s in enumerate(starts):
        _scalar(s, f"start index operand {first + i}", _is_int)
        if s.element_type is not starts[0].element_type:
            _fail(f"start indices must share one element type, operand {first + i} is {_t(s)}")


@infers(Opcode.DYNAMIC_SLICE)
def _dynamic_slice(operands, attrs, declared):
    if not operands:
        _fail("needs an operand")
    x = _array(operands[0], "operand 0")
    _start_indices(operands, 1, x.rank, "dynamic-slice")
    sizes = tuple(_attr(attrs, "dynamic_slice_sizes"))
    if len(sizes) != x.rank:
        _fail(f"dynamic_slice_sizes {list(sizes)} must have one size per dimension of {_t(x)}")
    for i, (s, n) in enumerate(zip(sizes, x.dims)):
        if s < 0 or (n != UNBOUNDED and s > n):
            _fail(f"slice size {s} of dimension {i} does not fit operand 0 ({_t(x)})")
    return Shape.array(x.element_type, sizes)


@infers(Opcode.DYNAMIC_UPDATE_SLICE)
def _dynamic_update_slice(operands, attrs, declared):
    if len(operands) < 2:
        _fail(f"needs an operand, an update and start indices, got {_count(len(operands))}")
    x = _array(operands[0], "operand 0")
    update = _array(operands[1], "operand 1 (update)")
    if update.element_type is not x.element_type:
        _fail(f"update {_t(update)} must have the element type of operand 0 ({_t(x)})")
    if update.rank != x.rank:
        _fail(f"update {_t(update)} must have the rank of operand 0 ({_t(x)})")
    for i, (u, n) in enumerate(zip(update.dims, x.dims)):
        if n != UNBOUNDED and u > n:
            _fail(f"update dimension {i} (size {u}) is larger than operand 0's ({_t(x)})")
    _start_indices(operands, 2, x.rank, "dynamic-update-slice")
    return _merged(x.element_type, x)


def _batch_dims_of_indices(indices: Shape, index_vector_dim: int) -> tuple[list[int], int]:
    if not 0 <= index_vector_dim <= indices.rank:
        _fail(f"index_vector_dim {index_vector_dim} is out of range for indices {_t(indices)}")
    if index_vector_dim == indices.rank:
        return list(indices.dims), 1
    dims = [d for k, d in enumerate(indices.dims) if k != index_vector_dim]
    return dims, indices.dims[index_vector_dim]


@infers(Opcode.GATHER)
def _gather(operands, attrs, declared):
    x = _array(operands[0], "operand 0")
    indices = _array(operands[1], "operand 1 (start indices)")
    if not indices.element_type.is_integral:
        _fail(f"start indices must be integers, got {_t(indices)}")
    offset_dims = tuple(_attr(attrs, "offset_dims", ()))
    collapsed = tuple(attrs.get("collapsed_slice_dims", ()))
    start_map = tuple(_attr(attrs, "start_index_map"))
    obatch = tuple(attrs.get("operand_batching_dims", ()))
    ibatch = tuple(attrs.get("start_indices_batching_dims", ()))
    ivd = attrs.get("index_vector_dim", indices.rank)
    sizes = tuple(_attr(attrs, "slice_sizes"))
    batch, vec = _batch_dims_of_indices(indices, ivd)
    if len(sizes) != x.rank:
        _fail(f"slice_sizes {list(sizes)} must have one size per dimension of {_t(x)}")
    for i, (s, n) in enumerate(zip(sizes, x.dims)):
        if s < 0 or (n != UNBOUNDED and s > n):
            _fail(f"slice size {s} of dimension {i} does not fit operand 0 ({_t(x)})")
    if len(start_map) != vec:
        _fail(
            f"start_index_map {list(start_map)} must have one entry per index vector "
            f"element ({vec})"
        )
    _check_dims(start_map, x.rank, "start_index_map entry")
    _check_dims(collapsed + obatch, x.rank, "collapsed or batching dimension")
    for d in collapsed + obatch:
        if sizes[d] > 1:
            _fail(f"collapsed/batching dimension {d} must have slice size <= 1, got {sizes[d]}")
    if len(obatch) != len(ibatch):
        _fail("operand_batching_dims and start_indices_batching_dims differ in length")
    for o, i in zip(obatch, ibatch):
        if i == ivd or not 0 <= i < indices.rank:
            _fail(f"start_indices_batching_dims entry {i} is not a batch dimension of indices")
        if x.dims[o] != indices.dims[i]:
            _fail(
                f"operand batching dimension {o} (size {x.dims[o]}) does not match indices "
                f"dimension {i} (size {indices.dims[i]})"
            )
    offsets = [s for k, s in enumerate(sizes) if k not in collapsed and k not in obatch]
    if len(offset_dims) != len(offsets):
        _fail(
            f"offset_dims {list(offset_dims)} must have {len(offsets)} entries (operand rank "
            "minus collapsed and batching dimensions)"
        )
    rank = len(offsets) + len(batch)
    _check_dims(offset_dims, rank, "offset dimension")
    if list(offset_dims) != sorted(offset_dims):
        _fail(f"offset_dims {list(offset_dims)} must be sorted")
    out = []
    off_iter, batch_iter = iter(offsets), iter(batch)
    for k in range(rank):
        out.append(next(off_iter) if k in offset_dims else next(batch_iter))
    return Shape.array(x.element_type, out)


@infers(Opcode.SCATTER)
def _scatter(operands, attrs, declared):
    if len(operands) < 3 or len(operands) % 2 == 0:
        _fail(f"needs N operands, indices and N updates, got {_count(len(operands))}")
    n = (len(operands) - 1) // 2
    inputs, indices, updates = operands[:n], operands[n], operands[n + 1 :]
    for i, s in enumerate(inputs):
        _array(s, f"operand {i}")
        if not _dims_match(s, inputs[0]):
            _fail(f"operand {i} has shape {_t(s)} but operand 0 is {_t(inputs[0])}")
    _array(indices, f"operand {n} (scatter indices)")
    if not indices.element_type.is_integral:
        _fail(f"scatter indices must be integers, got {_t(indices)}")
    x = inputs[0]
    window_dims = tuple(_attr(attrs, "update_window_dims", ()))
    inserted = tuple(attrs.get("inserted_window_dims", ()))
    to_operand = tuple(_attr(attrs, "scatter_dims_to_operand_dims"))
    ibatch = tuple(attrs.get("input_batching_dims", ()))
    sbatch = tuple(attrs.get("scatter_indices_batching_dims", ()))
    ivd = attrs.get("index_vector_dim", indices.rank)
    batch, vec = _batch_dims_of_indices(indices, ivd)
    if len(to_operand) != vec:
        _fail(
            f"scatter_dims_to_operand_dims {list(to_operand)} must have one entry per index "
            f"vector element ({vec})"
        )
    _check_dims(to_operand, x.rank, "scatter_dims_to_operand_dims entry")
    _check_dims(inserted + ibatch, x.rank, "inserted or batching dimension")
    if len(ibatch) != len(sbatch):
        _fail("input_batching_dims and scatter_indices_batching_dims differ in length")
    window_operand_dims = [k for k in range(x.rank) if k not in inserted and k not in ibatch]
    if len(window_dims) != len(window_operand_dims):
        _fail(
            f"update_window_dims {list(window_dims)} must have {len(window_operand_dims)} "
            "entries (operand rank minus inserted and batching dimensions)"
        )
    comp, program = _program_shape(attrs, "to_apply")
    types = [s.element_type for s in inputs]
    for j, u in enumerate(updates):
        _array(u, f"update {j} (operand {n + 1 + j})")
        if u.element_type is not types[j]:
            _fail(f"update {j} has element type {u.element_type}, expected {types[j]}")
        if u.rank != len(window_dims) + len(batch):
            _fail(
                f"update {j} ({_t(u)}) must have rank {len(window_dims) + len(batch)} "
                f"({len(window_dims)} window + {len(batch)} scatter dimensions)"
            )
        _check_dims(window_dims, u.rank, "update window dimension")
        scatter_dims = [k for k in range(u.rank) if k not in window_dims]
        for k, od in zip(window_dims, window_operand_dims):
            if u.dims[k] > x.dims[od] and x.dims[od] != UNBOUNDED:
                _fail(
                    f"update {j} window dimension {k} (size {u.dims[k]}) exceeds operand "
                    f"dimension {od} (size {x.dims[od]})"
                )
        for k, b in zip(scatter_dims, batch):
            if u.dims[k] != b:
                _fail(
                    f"update {j} scatter dimension {k} (size {u.dims[k]}) does not match the "
                    f"indices' batch size {b} ({_t(indices)})"
                )
    _check_reducer(comp.name, program, types, types)
    return _tuple_or_single([_merged(t, s) for t, s in zip(types, inputs)])


# -- sorting --------------------------------------------------------------------------------


@infers(Opcode.SORT)
def _sort(operands, attrs, declared):
    if not operands:
        _fail("needs at least 1 operand")
    for i, s in enumerate(operands):
        _array(s, f"operand {i}")
        if not _dims_match(s, operands[0]):
            _fail(
                f"operand {i} has shape {_t(s)} but operand 0 is {_t(operands[0])}; sort "
                "needs equal dims"
            )
    dims = tuple(_attr(attrs, "dimensions"))
    if len(dims) != 1:
        _fail(f"dimensions must hold one dimension, got {list(dims)}")
    _check_dims(dims, operands[0].rank, "sort dimension")
    comp, program = _program_shape(attrs, "to_apply")
    if len(program.parameters) != 2 * len(operands):
        _fail(
            f"comparator {comp.name} must take {2 * len(operands)} parameters, takes "
            f"{len(program.parameters)}"
        )
    for k, p in enumerate(program.parameters):
        want = operands[k // 2].element_type
        if not p.is_scalar or p.element_type is not want:
            _fail(f"comparator {comp.name} parameter {k} is {_t(p)}, expected {want}[]")
    if not compatible(program.result, Shape.scalar(PRED)):
        _fail(f"comparator {comp.name} must return pred[], returns {_t(program.result)}")
    return _tuple_or_single([_merged(s.element_type, s) for s in operands])


@infers(Opcode.TOPK)
def _topk(operands, attrs, declared):
    x = _array(operands[0], "operand 0")
    k = _attr(attrs, "k")
    if x.rank < 1:
        _fail(f"operand 0 must have rank >= 1, got {_t(x)}")
    if not 0 <= k <= x.dims[-1]:
        _fail(f"k={k} must be between 0 and the last dimension of {_t(x)}")
    dims = (*x.dims[:-1], k)
    return Shape.tuple([Shape.array(x.element_type, dims), Shape.array(S32, dims)])


# -- control flow and calls -----------------------------------------------------------------


def _check_arguments(comp, program, operands, what: str) -> None:
    if len(program.parameters) != len(operands):
        _fail(
            f"{what} {comp.name} takes {_count(len(program.parameters), 'parameter')} but is "
            f"given {_count(len(operands))}"
        )
    for i, (p, s) in enumerate(zip(program.parameters, operands)):
        if not compatible(p, s):
            _fail(
                f"operand {i} has shape {_t(s)} but parameter {i} of {what} {comp.name} is {_t(p)}"
            )


@infers(Opcode.CALL)
def _call(operands, attrs, declared):
    comp, program = _program_shape(attrs, "to_apply")
    _check_arguments(comp, program, operands, "computation")
    return _without_layouts(program.result)


@infers(Opcode.FUSION)
def _fusion(operands, attrs, declared):
    comp, program = _program_shape(attrs, "calls")
    _check_arguments(comp, program, operands, "fused computation")
    return _without_layouts(program.result)


@infers(Opcode.MAP)
def _map(operands, attrs, declared):
    if not operands:
        _fail("needs at least 1 operand")
    _elementwise_operands(operands, same_type=False)
    comp, program = _program_shape(attrs, "to_apply")
    scalars = [Shape.scalar(s.element_type) for s in operands]
    _check_arguments(comp, program, scalars, "mapped computation")
    if not program.result.is_scalar:
        _fail(f"mapped computation {comp.name} must return a scalar, returns {_t(program.result)}")
    dims = attrs.get("dimensions")
    if dims is not None and tuple(dims) != tuple(range(operands[0].rank)):
        _fail(f"dimensions={list(dims)} must be 0..{operands[0].rank - 1}")
    return _merged(program.result.element_type, *operands)


@infers(Opcode.WHILE)
def _while(operands, attrs, declared):
    state = operands[0]
    cond, cprog = _program_shape(attrs, "condition")
    body, bprog = _program_shape(attrs, "body")
    _check_arguments(cond, cprog, [state], "condition")
    _check_arguments(body, bprog, [state], "body")
    if not compatible(cprog.result, Shape.scalar(PRED)):
        _fail(f"condition {cond.name} must return pred[], returns {_t(cprog.result)}")
    if not compatible(bprog.result, state):
        _fail(f"body {body.name} returns {_t(bprog.result)} but the loop state is {_t(state)}")
    return _without_layouts(state)


@infers(Opcode.CONDITIONAL)
def _conditional(operands, attrs, declared):
    if not operands:
        _fail("needs a branch index or predicate operand")
    index = _scalar(operands[0], "operand 0 (branch selector)")
    if "branch_computations" in attrs:
        branches = tuple(attrs["branch_computations"])
        if index.element_type is not S32 and not (
            index.element_type.is_pred and len(branches) == 2
        ):
            _fail(f"operand 0 must be s32[] (or pred[] with two branches), got {_t(index)}")
    else:
        if not index.element_type.is_pred:
            _fail(f"operand 0 must be pred[] with true/false computations, got {_t(index)}")
        branches = (_attr(attrs, "true_computation"), _attr(attrs, "false_computation"))
    if not branches:
        _fail("needs at least one branch computation")
    args = operands[1:]
    if len(args) != len(branches):
        _fail(f"has {len(branches)} branches but {len(args)} branch operands")
    result = None
    for b, (comp, arg) in enumerate(zip(branches, args)):
        if comp.root is None:
            _fail(f"branch computation {comp.name} has no root")
        program = comp.program_shape
        _check_arguments(comp, program, [arg], f"branch {b}")
        if result is None:
            result = program.result
        elif not compatible(program.result, result):
            _fail(
                f"branch {b} ({comp.name}) returns {_t(program.result)} but branch 0 "
                f"returns {_t(result)}"
            )
    return _without_layouts(result)


@infers(Opcode.CUSTOM_CALL)
def _custom_call(operands, attrs, declared):
    target = _needs(declared, "a custom call's result is what its target says")
    constraints = attrs.get("operand_layout_constraints")
    if constraints is not None:
        if len(constraints) != len(operands):
            _fail(
                f"operand_layout_constraints has {len(constraints)} shapes for "
                f"{_count(len(operands))}"
            )
        for i, (c, s) in enumerate(zip(constraints, operands)):
            if not compatible(c, s):
                _fail(f"operand {i} is {_t(s)} but operand_layout_constraints says {_t(c)}")
    for alias in attrs.get("output_to_operand_aliasing", ()):
        if not 0 <= alias.operand_number < len(operands):
            _fail(
                f"output_to_operand_aliasing names operand {alias.operand_number}, which "
                "does not exist"
            )
        if not target.has_index(alias.output_index) or not operands[alias.operand_number].has_index(
            alias.operand_index
        ):
            _fail("output_to_operand_aliasing names a shape index that does not exist")
        out = target.subshape(alias.output_index)
        src = operands[alias.operand_number].subshape(alias.operand_index)
        if not compatible(out, src):
            _fail(f"output_to_operand_aliasing pairs output {_t(out)} with operand {_t(src)}")
    return _without_layouts(target)


# -- random numbers -------------------------------------------------------------------------


@infers(Opcode.RNG)
def _rng(operands, attrs, declared):
    if len(operands) != 2:
        _fail(f"expects 2 operands (the distribution's parameters), got {len(operands)}")
    a, b = operands
    _scalar(a, "operand 0")
    _scalar(b, "operand 1")
    if a.element_type is not b.element_type:
        _fail(f"operands must share one element type, got {_t(a)} and {_t(b)}")
    dist = str(_attr(attrs, "distribution"))
    if dist == "rng_normal" and not a.element_type.is_float:
        _fail(f"rng_normal needs float parameters, got {_t(a)}")
    if dist not in ("rng_uniform", "rng_normal"):
        _fail(f"distribution must be rng_uniform or rng_normal, got {dist}")
    target = _array(_needs(declared, "the dims of the random array"), "result")
    if target.element_type is not a.element_type:
        _fail(f"result {_t(target)} must have the element type of the parameters ({_t(a)})")
    return _without_layouts(target)


@infers(Opcode.RNG_BIT_GENERATOR)
def _rng_bit_generator(operands, attrs, declared):
    state = _array(operands[0], "operand 0 (state)")
    if state.rank != 1 or not state.element_type.is_unsigned_integral:
        _fail(f"state must be a 1-D unsigned integer array, got {_t(state)}")
    target = _needs(declared, "the dims of the random bits")
    if not target.is_tuple or len(target.tuple_shapes) != 2:
        _fail(f"result must be a (state, bits) tuple, got {_t(target)}")
    new_state, bits = target.tuple_shapes
    if not compatible(new_state, state):
        _fail(f"result state {_t(new_state)} must match operand 0 ({_t(state)})")
    if not bits.is_array or not bits.element_type.is_integral:
        _fail(f"random bits must be an integer array, got {_t(bits)}")
    return Shape.tuple([_without_layouts(state), _without_layouts(bits)])


@infers(Opcode.RNG_GET_AND_UPDATE_STATE)
def _rng_state(operands, attrs, declared):
    return Shape.array(U64, (2,))


# -- collectives ----------------------------------------------------------------------------


def _group_size(attrs) -> int | None:
    """Devices per replica group; None when the groups are `{}` (all devices) or absent."""
    groups = attrs.get("replica_groups")
    if groups is None:
        return None
    try:
        expanded = groups.expanded()
    except ValueError as e:
        _fail(f"bad replica_groups: {e}")
    if expanded and any(len(g) != len(expanded[0]) for g in expanded):
        _fail("replica groups must all have the same size")
    if expanded and not expanded[0]:
        _fail("replica groups must not be empty")
    return len(expanded[0]) if expanded else None


def _gather_like(operands, attrs, declared, scatter: bool) -> Shape:
    if not operands:
        _fail("needs at least 1 operand")
    dims = tuple(_attr(attrs, "dimensions"))
    if len(dims) != 1:
        _fail(f"dimensions must hold one dimension, got {list(dims)}")
    d = dims[0]
    for i, s in enumerate(operands):
        _array(s, f"operand {i}")
        _check_dims(dims, s.rank, "dimension")
    n = _group_size(attrs)
    if n is None:
        if declared is None:
            _fail("needs a result shape or explicit replica_groups (the group size)")
        results = declared.tuple_shapes if len(operands) > 1 else (declared,)
        if len(results) != len(operands):
            _fail(f"result {_t(declared)} must hold one array per operand")
        for i, (s, r) in enumerate(zip(operands, results)):
            if (
                not r.is_array
                or r.rank != s.rank
                or r.element_type is not s.element_type
                or any(a != b for k, (a, b) in enumerate(zip(s.dims, r.dims)) if k != d)
            ):
                _fail(
                    f"result {i} ({_t(r)}) must match operand {i} ({_t(s)}) except in dimension {d}"
                )
            size, out = s.dims[d], r.dims[d]
            small, big = (out, size) if scatter else (size, out)
            ok = big % small == 0 if small else big == 0
            if not ok:
                _fail(
                    f"result {i} dimension {d} (size {out}) is not a whole multiple/fraction "
                    f"of operand {i}'s (size {size})"
                )
        return _without_layouts(declared)
    results = []
    for i, s in enumerate(operands):
        dims_out = list(s.dims)
        if scatter:
            if s.dims[d] % n:
                _fail(
                    f"operand {i} dimension {d} (size {s.dims[d]}) is not divisible by the "
                    f"group size {n}"
                )
            dims_out[d] = s.dims[d] // n
        else:
            dims_out[d] = s.dims[d] * n
        results.append(Shape.array(s.element_type, dims_out))
    return _tuple_or_single(results)


@infers(Opcode.ALL_GATHER)
def _all_gather(operands, attrs, declared):
    return _gather_like(operands, attrs, declared, scatter=False)


@infers(Opcode.REDUCE_SCATTER)
def _reduce_scatter(operands, attrs, declared):
    _check_all_reduce_computation(operands, attrs)
    return _gather_like(operands, attrs, declared, scatter=True)


@infers(Opcode.ALL_GATHER_START)
def _all_gather_start(operands, attrs, declared):
    inner = declared.tuple_shapes[1] if declared is not None and declared.is_tuple else None
    out = _gather_like(operands, attrs, inner, scatter=False)
    return Shape.tuple([_tuple_or_single([_without_layouts(s) for s in operands]), out])


def _check_all_reduce_computation(operands, attrs) -> None:
    if "to_apply" not in attrs:
        return
    comp, program = _program_shape(attrs, "to_apply")
    types = [s.element_type for s in operands]
    if len(program.parameters) != 2 or not program.result.is_scalar:
        _fail(
            f"reduction computation {comp.name} must be a binary scalar function, is "
            f"{program.to_text(False)}"
        )
    if len(set(types)) == 1 and types[0] is not program.result.element_type:
        _fail(
            f"reduction computation {comp.name} returns {_t(program.result)} but operands "
            f"have element type {types[0]}"
        )


@infers(Opcode.ALL_REDUCE, Opcode.ALL_REDUCE_START)
def _all_reduce(operands, attrs, declared):
    if not operands:
        _fail("needs at least 1 operand")
    for i, s in enumerate(operands):
        _array(s, f"operand {i}")
    _check_all_reduce_computation(operands, attrs)
    return _tuple_or_single([_without_layouts(s) for s in operands])


@infers(Opcode.ALL_TO_ALL)
def _all_to_all(operands, attrs, declared):
    if not operands:
        _fail("needs at least 1 operand")
    split = attrs.get("split_dimension")
    dims = attrs.get("dimensions")
    if dims is not None:  # XLA's array all-to-all: dimensions={split dimension}
        if len(dims) != 1:
            _fail(f"dimensions must hold one dimension, got {list(dims)}")
        split = dims[0]
    if split is not None:
        if len(operands) != 1:
            _fail(f"with split_dimension takes 1 operand, got {len(operands)}")
        x = _array(operands[0], "operand 0")
        _check_dims((split,), x.rank, "split_dimension")
        n = _group_size(attrs)
        if n and x.dims[split] % n:
            _fail(
                f"split dimension {split} (size {x.dims[split]}) is not divisible by the group "
                f"size {n}"
            )
        return _without_layouts(x)
    for i, s in enumerate(operands):
        _array(s, f"operand {i}")
    return _tuple_or_single([_without_layouts(s) for s in operands])


@infers(Opcode.RAGGED_ALL_TO_ALL)
def _ragged_all_to_all(operands, attrs, declared):
    x = _array(operands[0], "operand 0 (input)")
    out = _array(operands[1], "operand 1 (output)")
    if x.element_type is not out.element_type or x.rank != out.rank:
        _fail(f"input {_t(x)} and output {_t(out)} must share element type and rank")
    if x.rank < 1 or x.dims[1:] != out.dims[1:]:
        _fail(f"input {_t(x)} and output {_t(out)} must be ragged along dimension 0 only")
    lengths = set()
    for i in range(2, 6):
        s = _array(operands[i], f"operand {i}")
        if not s.element_type.is_integral or s.rank != 1:
            _fail(f"operand {i} must be a 1-D integer array, got {_t(s)}")
        lengths.add(s.dims[0])
    if len(lengths) != 1:
        _fail("input_offsets, send_sizes, output_offsets and recv_sizes must have one length")
    return _without_layouts(out)


@infers(Opcode.COLLECTIVE_BROADCAST)
def _collective_broadcast(operands, attrs, declared):
    if not operands:
        _fail("needs at least 1 operand")
    return _tuple_or_single([_without_layouts(s) for s in operands])


def _in_place_permute(operands, attrs) -> bool:
    """The in-place form `collective-permute(input, output, input_starts, output_starts)`:
    slice_sizes given, or four operands whose last two are start indices."""
    if "slice_sizes" in attrs:
        return True
    if len(operands) != 4:
        return False
    return all(
        all(leaf.is_array and leaf.element_type.is_integral for _, leaf in s.leaves())
        for s in operands[2:]
    )


@infers(Opcode.COLLECTIVE_PERMUTE)
def _collective_permute(operands, attrs, declared):
    if not operands:
        _fail("needs at least 1 operand")
    if _in_place_permute(operands, attrs):
        if len(operands) != 4:
            _fail(f"in-place form takes 4 operands, got {len(operands)}")
        return _without_layouts(operands[1])
    for i, s in enumerate(operands):
        _array(s, f"operand {i}")
    return _tuple_or_single([_without_layouts(s) for s in operands])


@infers(Opcode.SCAN)
def _scan(operands, attrs, declared):
    target = _needs(declared, "the scan's outputs and final carries")
    if "to_apply" in attrs:
        _program_shape(attrs, "to_apply")
    return _without_layouts(target)


@infers(Opcode.COLLECTIVE_PERMUTE_START)
def _collective_permute_start(operands, attrs, declared):
    if not operands:
        _fail("needs at least 1 operand")
    if _in_place_permute(operands, attrs):
        if len(operands) != 4:
            _fail(f"in-place form takes 4 operands, got {len(operands)}")
        x, out = _without_layouts(operands[0]), _without_layouts(operands[1])
    else:
        x = out = _tuple_or_single([_without_layouts(s) for s in operands])
    if declared is not None and declared.is_tuple and len(declared.tuple_shapes) > 2:
        extra = [_without_layouts(s) for s in declared.tuple_shapes[2:]]
        return Shape.tuple([x, out, *extra])
    return Shape.tuple([x, out])


def _done_of(index: int):
    def rule(operands, attrs, declared):
        t = operands[0]
        if not t.is_tuple or len(t.tuple_shapes) <= index:
            _fail(f"operand 0 must be the tuple its start op produces, got {_t(t)}")
        return _without_layouts(t.tuple_shapes[index])

    return rule


infers(Opcode.ALL_GATHER_DONE, Opcode.COLLECTIVE_PERMUTE_DONE, Opcode.ASYNC_DONE)(_done_of(1))
infers(Opcode.COPY_DONE)(_done_of(0))


@infers(Opcode.ALL_REDUCE_DONE, Opcode.ASYNC_UPDATE)
def _same_as_operand(operands, attrs, declared):
    return _without_layouts(operands[0])


@infers(Opcode.PARTITION_ID, Opcode.REPLICA_ID)
def _id(operands, attrs, declared):
    return Shape.scalar(U32)


# -- infeed, outfeed, send, recv ------------------------------------------------------------


def _token(shape: Shape, what: str) -> None:
    if not shape.is_token:
        _fail(f"{what} must be a token, got {_t(shape)}")


@infers(Opcode.INFEED)
def _infeed(operands, attrs, declared):
    _token(operands[0], "operand 0")
    target = _needs(declared, "the shape of the data read")
    if not target.is_tuple or len(target.tuple_shapes) != 2 or not target.tuple_shapes[1].is_token:
        _fail(f"result must be a (data, token) tuple, got {_t(target)}")
    return _without_layouts(target)


@infers(Opcode.OUTFEED)
def _outfeed(operands, attrs, declared):
    _token(operands[1], "operand 1")
    shape = attrs.get("outfeed_shape")
    if shape is not None and not compatible(shape, operands[0]):
        _fail(f"outfeed_shape {_t(shape)} does not match operand 0 ({_t(operands[0])})")
    return Shape.token()


@infers(Opcode.SEND)
def _send(operands, attrs, declared):
    _token(operands[1], "operand 1")
    return Shape.tuple([_without_layouts(operands[0]), Shape.scalar(U32), Shape.token()])


@infers(Opcode.SEND_DONE)
def _send_done(operands, attrs, declared):
    t = operands[0]
    if not t.is_tuple or len(t.tuple_shapes) != 3:
        _fail(f"operand 0 must be a send's (data, u32[], token) tuple, got {_t(t)}")
    return Shape.token()


@infers(Opcode.RECV)
def _recv(operands, attrs, declared):
    _token(operands[0], "operand 0")
    target = _needs(declared, "the shape of the data received")
    if not target.is_tuple or len(target.tuple_shapes) != 3 or not target.tuple_shapes[2].is_token:
        _fail(f"result must be a (data, u32[], token) tuple, got {_t(target)}")
    return Shape.tuple([_without_layouts(target.tuple_shapes[0]), Shape.scalar(U32), Shape.token()])


@infers(Opcode.RECV_DONE)
def _recv_done(operands, attrs, declared):
    t = operands[0]
    if not t.is_tuple or len(t.tuple_shapes) != 3:
        _fail(f"operand 0 must be a recv's (data, u32[], token) tuple, got {_t(t)}")
    return Shape.tuple([_without_layouts(t.tuple_shapes[0]), Shape.token()])


# -- async wrappers -------------------------------------------------------------------------


@infers(Opcode.ASYNC_START)
def _async_start(operands, attrs, declared):
    comp, program = _program_shape(attrs, "calls")
    _check_arguments(comp, program, operands, "async computation")
    head = [Shape.tuple([_without_layouts(s) for s in operands]), _without_layouts(program.result)]
    if declared is not None and declared.is_tuple and len(declared.tuple_shapes) >= 2:
        return Shape.tuple([*head, *(_without_layouts(s) for s in declared.tuple_shapes[2:])])
    return Shape.tuple([*head, Shape.scalar(S32)])


@infers(Opcode.COPY_START)
def _copy_start(operands, attrs, declared):
    x = _without_layouts(operands[0])
    return Shape.tuple([x, x, Shape.scalar(U32)])


# -- linear algebra -------------------------------------------------------------------------


@infers(Opcode.CHOLESKY)
def _cholesky(operands, attrs, declared):
    a = _array(operands[0], "operand 0")
    if not a.element_type.is_floating_or_complex:
        _fail(f"operand 0 must be float or complex, got {_t(a)}")
    if a.rank < 2 or a.dims[-1] != a.dims[-2]:
        _fail(f"operand 0 must be a batch of square matrices, got {_t(a)}")
    return _merged(a.element_type, a)


@infers(Opcode.TRIANGULAR_SOLVE)
def _triangular_solve(operands, attrs, declared):
    a = _array(operands[0], "operand 0 (a)")
    b = _array(operands[1], "operand 1 (b)")
    if a.element_type is not b.element_type or not a.element_type.is_floating_or_complex:
        _fail(f"a and b must share one float or complex type, got {_t(a)} and {_t(b)}")
    if a.rank < 2 or a.dims[-1] != a.dims[-2]:
        _fail(f"a must be a batch of square matrices, got {_t(a)}")
    if b.rank != a.rank or a.dims[:-2] != b.dims[:-2]:
        _fail(f"a ({_t(a)}) and b ({_t(b)}) must have the same batch dimensions")
    m = b.dims[-2] if attrs.get("left_side", False) else b.dims[-1]
    if m != a.dims[-1]:
        side = "rows" if attrs.get("left_side", False) else "columns"
        _fail(f"b ({_t(b)}) must have {a.dims[-1]} {side} to match a ({_t(a)})")
    return _merged(b.element_type, b)


def _batch_norm_features(operands, attrs, names) -> tuple[Shape, Shape]:
    x = _array(operands[0], "operand 0")
    if not x.element_type.is_float:
        _fail(f"operand 0 must be float, got {_t(x)}")
    f = _attr(attrs, "feature_index")
    _check_dims((f,), x.rank, "feature_index")
    vec = Shape.array(x.element_type, (x.dims[f],))
    for i, name in names:
        if not compatible(operands[i], vec):
            _fail(f"{name} (operand {i}) must be {_t(vec)}, got {_t(operands[i])}")
    return x, vec


@infers(Opcode.BATCH_NORM_TRAINING)
def _batch_norm_training(operands, attrs, declared):
    x, vec = _batch_norm_features(operands, attrs, ((1, "scale"), (2, "offset")))
    return Shape.tuple([_merged(x.element_type, x), vec, vec])


@infers(Opcode.BATCH_NORM_INFERENCE)
def _batch_norm_inference(operands, attrs, declared):
    x, _ = _batch_norm_features(
        operands, attrs, ((1, "scale"), (2, "offset"), (3, "mean"), (4, "variance"))
    )
    return _merged(x.element_type, x)


@infers(Opcode.BATCH_NORM_GRAD)
def _batch_norm_grad(operands, attrs, declared):
    x, vec = _batch_norm_features(operands, attrs, ((1, "scale"), (2, "mean"), (3, "variance")))
    if not compatible(operands[4], x):
        _fail(f"grad_output (operand 4) must be {_t(x)}, got {_t(operands[4])}")
    return Shape.tuple([_merged(x.element_type, x), vec, vec])


# -- constants, parameters, tuples, other ---------------------------------------------------


@infers(Opcode.CONSTANT, Opcode.PARAMETER)
def _declared_only(operands, attrs, declared):
    return _without_layouts(_needs(declared))


@infers(Opcode.TUPLE)
def _tuple(operands, attrs, declared):
    return Shape.tuple([_without_layouts(s) for s in operands])


@infers(Opcode.GET_TUPLE_ELEMENT)
def _get_tuple_element(operands, attrs, declared):
    t = operands[0]
    index = _attr(attrs, "index")
    if not t.is_tuple:
        _fail(f"operand 0 must be a tuple, got {_t(t)}")
    if not 0 <= index < len(t.tuple_shapes):
        _fail(f"index {index} is out of range for {_t(t)} ({len(t.tuple_shapes)} elements)")
    return _without_layouts(t.tuple_shapes[index])


@infers(Opcode.ADD_DEPENDENCY)
def _add_dependency(operands, attrs, declared):
    _token(operands[1], "operand 1")
    return _without_layouts(operands[0])


@infers(Opcode.AFTER_ALL)
def _after_all(operands, attrs, declared):
    for i, s in enumerate(operands):
        _token(s, f"operand {i}")
    return Shape.token()


@infers(Opcode.DOMAIN, Opcode.OPTIMIZATION_BARRIER)
def _identity(operands, attrs, declared):
    return _without_layouts(operands[0])


def missing_rules() -> list[Opcode]:
    """Opcodes without a shape rule (empty when the table is complete)."""
    return [op for op in Opcode if op not in SHAPE_RULES]
