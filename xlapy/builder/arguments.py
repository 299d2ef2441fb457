"""Argument handling for XlaBuilder methods: turning the Python values users pass (shape
text, NumPy dtypes, padding modes, dim-label strings, alias maps) into IR attribute values,
with a BuilderError naming the method when a value is malformed."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from xlapy.errors import XlapyError
from xlapy.ir import attributes as A
from xlapy.ir.module import AliasKind
from xlapy.ir.parser import parse_shape
from xlapy.ir.shapes import Shape
from xlapy.ir.types import PrimitiveType

ShapeLike = Shape | str
TypeLike = PrimitiveType | str | np.dtype | type


class BuilderError(XlapyError):
    """The builder API was misused: an op from another builder, a parameter number given
    twice, an alias naming an output that does not exist, a malformed argument."""


API_VERSIONS = (
    "API_VERSION_ORIGINAL",
    "API_VERSION_STATUS_RETURNING",
    "API_VERSION_STATUS_RETURNING_UNIFIED",
    "API_VERSION_TYPED_FFI",
)
SCHEDULES = ("SCHEDULE_NONE", "SCHEDULE_LATEST", "SCHEDULE_EARLIEST")
RNG_ALGORITHMS = ("rng_default", "rng_three_fry", "rng_philox")
FFT_TYPES = ("FFT", "IFFT", "RFFT", "IRFFT")
TRANSPOSE_A = ("NO_TRANSPOSE", "TRANSPOSE", "ADJOINT")
DIRECTIONS = ("EQ", "NE", "LT", "LE", "GT", "GE")
COMPARE_TYPES = ("FLOAT", "TOTALORDER", "SIGNED", "UNSIGNED")
ALIAS_KINDS = ("may-alias", "must-alias")


def as_shape(shape: ShapeLike, method: str) -> Shape:
    """A Shape from a Shape or its text ("f32[2,3]", "(s32[], f32[4])")."""
    if isinstance(shape, Shape):
        return shape
    if isinstance(shape, str):
        return parse_shape(shape)
    raise BuilderError(f"{method}(): expected a Shape or shape text, got {shape!r}")


def as_element_type(dtype: TypeLike, method: str) -> PrimitiveType:
    """A PrimitiveType from itself, its text ("bf16") or a NumPy dtype."""
    if isinstance(dtype, PrimitiveType):
        return dtype
    try:
        if isinstance(dtype, str):
            return PrimitiveType.from_text(dtype)
        return PrimitiveType.from_dtype(dtype)
    except (KeyError, TypeError):
        raise BuilderError(f"{method}(): unknown element type {dtype!r}") from None


def default_element_type(value) -> PrimitiveType:
    array = np.asarray(value)
    if array.dtype == np.bool_:
        return PrimitiveType.PRED
    if np.issubdtype(array.dtype, np.integer):
        return PrimitiveType.S32
    if np.issubdtype(array.dtype, np.complexfloating):
        return PrimitiveType.C64
    if np.issubdtype(array.dtype, np.floating):
        return PrimitiveType.F32
    raise BuilderError(f"constant(): cannot make a constant of {value!r}; pass a dtype")


def ints(values) -> tuple[int, ...]:
    if values is None:
        return ()
    if isinstance(values, int):
        return (values,)
    return tuple(int(v) for v in values)


def shape_index(index) -> tuple[int, ...]:
    return ints(index)


def index_text(index) -> str:
    return "{" + ",".join(str(i) for i in index) + "}"


def as_list(ops) -> list:
    """A list of ops from one op or a sequence of them."""
    return list(ops) if isinstance(ops, list | tuple) else [ops]


def alias_kind(value, method: str) -> AliasKind:
    """`value` checked to be one of ALIAS_KINDS."""
    text = choice(value, ALIAS_KINDS, method, "kind")
    return "must-alias" if text == "must-alias" else "may-alias"


def choice(value, allowed: Sequence[str], method: str, what: str, upper: bool = False) -> str:
    text = str(value).upper() if upper else str(value)
    if text not in allowed:
        raise BuilderError(f"{method}(): {what} must be one of {', '.join(allowed)}, got {value!r}")
    return text


def precision_attr(precision, method: str):
    if precision is None:
        return None
    values = [precision, precision] if isinstance(precision, str) else list(precision)
    if len(values) != 2:
        raise BuilderError(f"{method}(): precision needs one value or two, got {precision!r}")
    allowed = ("default", "high", "highest")
    return tuple(A.Enum(choice(str(p).lower(), allowed, method, "precision")) for p in values)


def preferred_type_shape(preferred_element_type, method: str) -> Shape | None:
    """A scalar carrying the preferred result type (dot and convolution read only the type)."""
    if preferred_element_type is None:
        return None
    return Shape.scalar(as_element_type(preferred_element_type, method))


def operand_aliasing_attr(aliasing) -> tuple[A.OutputOperandAlias, ...] | None:
    if not aliasing:
        return None
    pairs = aliasing.items() if isinstance(aliasing, dict) else aliasing
    out = []
    for entry in pairs:
        try:
            output_index, (operand, operand_index) = entry
        except (TypeError, ValueError):
            raise BuilderError(
                "custom_call(): output_to_operand_aliasing entries are "
                f"(output_index, (operand_number, operand_index)), got {entry!r}"
            ) from None
        out.append(
            A.OutputOperandAlias(
                shape_index(output_index), int(operand), shape_index(operand_index)
            )
        )
    return tuple(out)


def api_version_attr(version) -> A.Enum | None:
    if version is None:
        return None
    if isinstance(version, int) and not isinstance(version, bool):
        if not 1 <= version <= len(API_VERSIONS):
            raise BuilderError(f"custom_call(): api_version {version} is not 1..4")
        return A.Enum(API_VERSIONS[version - 1])
    text = str(version).upper()
    text = text if text.startswith("API_VERSION_") else f"API_VERSION_{text}"
    return A.Enum(choice(text, API_VERSIONS, "custom_call", "api_version"))


def schedule_attr(schedule) -> A.Enum | None:
    if schedule is None:
        return None
    text = str(schedule).upper()
    text = text if text.startswith("SCHEDULE_") else f"SCHEDULE_{text}"
    return A.Enum(choice(text, SCHEDULES, "custom_call", "schedule"))


def parse_dim_labels(text: str, method: str = "convolution") -> A.ConvDimLabels:
    """ConvDimLabels from the text XLA prints, e.g. "b01f_01io->b01f"."""
    try:
        lhs_rhs, out = text.split("->")
        lhs, rhs = lhs_rhs.split("_")
        b, f, ls = _labels(lhs, "bf")
        i, o, ks = _labels(rhs, "io")
        ob, of, os_ = _labels(out, "bf")
    except ValueError:
        raise BuilderError(
            f"{method}(): dim_labels {text!r} must look like b01f_01io->b01f"
        ) from None
    if not len(ls) == len(ks) == len(os_):
        raise BuilderError(f"{method}(): dim_labels {text!r} disagree on the spatial rank")
    return A.ConvDimLabels(b, f, ls, i, o, ks, ob, of, os_)


def _labels(text: str, pair: str) -> tuple[int, int, tuple[int, ...]]:
    digits = sorted(c for c in text if c.isdigit())
    if (
        len(text) != len(digits) + 2
        or text.count(pair[0]) != 1
        or text.count(pair[1]) != 1
        or digits != [str(k) for k in range(len(digits))]
    ):
        raise ValueError(text)
    spatial = tuple(text.index(str(k)) for k in range(len(digits)))
    return text.index(pair[0]), text.index(pair[1]), spatial


def make_window(
    sizes,
    strides=None,
    padding="VALID",
    base_dilations=None,
    window_dilations=None,
    *,
    input_sizes=None,
    method: str = "window",
) -> A.Window:
    """A Window from per-dimension sizes, strides, dilations and padding, where padding is
    "VALID", "SAME" (output size ceil(input / stride), as XLA's MakePadding) or one
    (low, high) pair per dimension."""
    sizes = ints(sizes)
    n = len(sizes)
    strides = ints(strides) if strides is not None else (1,) * n
    base = ints(base_dilations) if base_dilations is not None else (1,) * n
    rhs = ints(window_dilations) if window_dilations is not None else (1,) * n
    for what, values in (("strides", strides), ("base dilations", base), ("dilations", rhs)):
        if len(values) != n:
            raise BuilderError(
                f"{method}(): {what} {list(values)} must have one entry per window dimension ({n})"
            )
    pads = padding_pairs(padding, sizes, strides, base, rhs, input_sizes, method)
    return A.Window(
        tuple(
            A.WindowDim(size, stride, lo, hi, dil, bd)
            for size, stride, (lo, hi), dil, bd in zip(sizes, strides, pads, rhs, base)
        )
    )


def padding_pairs(padding, sizes, strides, base, rhs, input_sizes, method):
    n = len(sizes)
    if isinstance(padding, str):
        mode = padding.upper()
        if mode == "VALID":
            return [(0, 0)] * n
        if mode != "SAME":
            raise BuilderError(f"{method}(): padding must be VALID, SAME or (low, high) pairs")
        if input_sizes is None or len(input_sizes) != n:
            raise BuilderError(f"{method}(): SAME padding needs an array input of rank {n}")
        pairs = []
        for size, stride, bd, dil, k in zip(input_sizes, strides, base, rhs, sizes):
            dilated = (size - 1) * bd + 1 if size else 0
            span = (k - 1) * dil + 1
            out = -(-dilated // stride)
            total = max((out - 1) * stride + span - dilated, 0)
            pairs.append((total // 2, total - total // 2))
        return pairs
    pairs = [tuple(int(v) for v in p) for p in padding]
    if len(pairs) != n or any(len(p) != 2 for p in pairs):
        raise BuilderError(
            f"{method}(): padding needs one (low, high) pair per window dimension ({n}), "
            f"got {padding!r}"
        )
    return pairs
