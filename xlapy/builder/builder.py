"""XlaBuilder: build HLO programs op by op from Python, the way XLA's client API does.

A builder records instructions as they are made; every method returns an XlaOp, a handle to
one instruction with its `.shape`. All ops go through `XlaBuilder._add`, which asks
`xlapy.ir.shape_inference.infer_shape` for the result shape (so a bad op fails where it is
built, with the builder method's name in the message) and appends the instruction. The
elementwise methods (`add`, `exp`, `shift_left`, ...) are generated from the opcode table's
categories; ops with attributes have explicit methods.

Sub-computations (reducers, comparators, loop bodies, branches) come from
`b.create_sub_builder(name)`; their `build()` returns an HloComputation to pass as a
`computation=`/`comparator=`/`body=` argument. The top-level `build()` assembles an HloModule
(see xlapy.builder.assemble), sets the input/output aliases and buffer donors, and verifies it.
"""

from __future__ import annotations

import itertools
import keyword
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from xlapy.builder.arguments import (
    COMPARE_TYPES,
    DIRECTIONS,
    FFT_TYPES,
    RNG_ALGORITHMS,
    TRANSPOSE_A,
    BuilderError,
    ShapeLike,
    TypeLike,
    alias_kind,
    api_version_attr,
    as_element_type,
    as_list,
    as_shape,
    choice,
    default_element_type,
    index_text,
    ints,
    make_window,
    operand_aliasing_attr,
    parse_dim_labels,
    precision_attr,
    preferred_type_shape,
    schedule_attr,
    shape_index,
)
from xlapy.builder.assemble import alias_problem, assemble_module
from xlapy.errors import ShapeError
from xlapy.ir import attributes as A
from xlapy.ir.computation import HloComputation
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.literal import Literal
from xlapy.ir.module import AliasEntry, BufferDonor, HloModule
from xlapy.ir.opcodes import Category, Opcode
from xlapy.ir.shape_inference import infer_shape
from xlapy.ir.shapes import Shape

_IDS = itertools.count(1)
"""Instruction and computation ids, shared by every builder so that names rarely clash."""


@dataclass(frozen=True, slots=True, eq=False)
class XlaOp:
    """A handle to one instruction of a builder. `==` is identity; `+ - * / @` and unary `-`
    build the matching ops (Python numbers become constants of the other operand's type)."""

    instr: HloInstruction
    builder: XlaBuilder

    @property
    def shape(self) -> Shape:
        return self.instr.shape

    @property
    def name(self) -> str:
        return self.instr.name

    def __add__(self, other):
        return self.builder.add(self, other)

    def __radd__(self, other):
        return self.builder.add(other, self)

    def __sub__(self, other):
        return self.builder.subtract(self, other)

    def __rsub__(self, other):
        return self.builder.subtract(other, self)

    def __mul__(self, other):
        return self.builder.multiply(self, other)

    def __rmul__(self, other):
        return self.builder.multiply(other, self)

    def __truediv__(self, other):
        return self.builder.divide(self, other)

    def __rtruediv__(self, other):
        return self.builder.divide(other, self)

    def __pow__(self, other):
        return self.builder.power(self, other)

    def __matmul__(self, other):
        return self.builder.dot(self, other)

    def __neg__(self):
        return self.builder.negate(self)

    def __repr__(self) -> str:
        return f"XlaOp({self.instr.name}: {self.shape.to_text(with_layout=False)})"


_ELEMENTWISE = (Category.UNARY, Category.BINARY)
_IRREGULAR = {
    Opcode.CONVERT,
    Opcode.BITCAST_CONVERT,
    Opcode.REDUCE_PRECISION,
    Opcode.COMPARE,
    Opcode.STOCHASTIC_CONVERT,
}


def method_name(opcode: Opcode) -> str:
    """The builder method named after an opcode: `Opcode.SHIFT_LEFT` -> `shift_left`,
    `Opcode.AND` -> `and_` (a trailing underscore where the name is a Python keyword)."""
    name = opcode.name.lower()
    return name + "_" if keyword.iskeyword(name) else name


class XlaBuilder:
    """Builds one computation; the top-level builder's `build()` returns an HloModule.

    `XlaBuilder("f")`; `x = b.parameter(0, "f32[4]")`; `b.build()` (the last op is the root).
    Ops of different builders never mix; a sub-builder (`create_sub_builder`) builds a
    computation for the ops that call one.
    """

    def __init__(self, name: str, *, parent: XlaBuilder | None = None):
        if not name:
            raise BuilderError("a builder needs a non-empty name")
        self.name = name
        self.parent = parent
        self._instructions: list[HloInstruction] = []
        self._parameters: dict[int, HloInstruction] = {}
        self._aliases: list[AliasEntry] = []
        self._donors: list[BufferDonor] = []
        self._built: tuple[HloInstruction, int, HloComputation] | None = None

    def __repr__(self) -> str:
        return f"<XlaBuilder {self.name}: {len(self._instructions)} ops>"

    # -- the one way an op is added ----------------------------------------------------------
    def _add(
        self,
        opcode: Opcode,
        operands: Sequence[XlaOp] = (),
        attrs: dict[str, Any] | None = None,
        shape: Shape | None = None,
        *,
        method: str | None = None,
        literal: Literal | None = None,
        parameter_number: int | None = None,
        name: str | None = None,
    ) -> XlaOp:
        """Infer the shape of `opcode` on `operands`, append the instruction, return its op.

        `shape` is the declared result shape, given only where the op needs it (reshape's
        dims, convert's type, a custom call's result). Attributes that are None are left out.
        """
        method = method or method_name(opcode)
        instrs = [self._own(op, method, i).instr for i, op in enumerate(operands)]
        attrs = {k: v for k, v in (attrs or {}).items() if v is not None}
        try:
            inferred = infer_shape(opcode, [i.shape for i in instrs], attrs, shape)
        except ShapeError as e:
            raise ShapeError(f"{method}(): {e}") from None
        except (KeyError, IndexError, TypeError, AttributeError, ValueError) as e:
            raise BuilderError(
                f"{method}(): malformed arguments for {opcode.text} ({type(e).__name__}: {e})"
            ) from None
        result = inferred
        if shape is not None and shape.without_layout() == inferred.without_layout():
            result = shape
        instr = HloInstruction(
            name or f"{opcode.text}.{next(_IDS)}",
            opcode,
            result,
            instrs,
            attrs,
            literal=literal,
            parameter_number=parameter_number,
        )
        self._instructions.append(instr)
        return XlaOp(instr, self)

    def _own(self, op, method: str, i: int) -> XlaOp:
        if not isinstance(op, XlaOp):
            raise BuilderError(
                f"{method}(): operand {i} must be an XlaOp, got {type(op).__name__} {op!r}"
            )
        if op.builder is not self:
            raise BuilderError(
                f"{method}(): operand {i} ({op.name}) belongs to builder '{op.builder.name}', "
                f"not to '{self.name}'; ops of different builders cannot be mixed"
            )
        return op

    def _computation(self, comp, method: str, what: str) -> HloComputation:
        if isinstance(comp, XlaBuilder):
            comp = comp.build_computation()
        if not isinstance(comp, HloComputation):
            raise BuilderError(
                f"{method}(): {what} must be an HloComputation (a sub-builder's build()), "
                f"got {type(comp).__name__}"
            )
        if comp.root is None:
            raise BuilderError(f"{method}(): {what} {comp.name} has no root")
        return comp

    def _coerce(self, value, like: XlaOp | None, method: str) -> XlaOp:
        """An XlaOp as is; a Python or NumPy number as a constant of `like`'s element type."""
        if isinstance(value, XlaOp):
            return value
        if like is None or not isinstance(value, int | float | complex | bool | np.generic):
            raise BuilderError(
                f"{method}(): operands must be XlaOps (or a number next to one), got "
                f"{type(value).__name__}"
            )
        return self.constant(value, like.shape.element_type)

    # -- parameters and constants ------------------------------------------------------------
    def parameter(self, number: int, shape: ShapeLike, name: str | None = None) -> XlaOp:
        """Parameter `number` of this computation, of `shape` (a Shape or text like
        "f32[2,3]"). Each number may be given once."""
        if not isinstance(number, int) or number < 0:
            raise BuilderError(f"parameter(): number must be a non-negative int, got {number!r}")
        if number in self._parameters:
            raise BuilderError(
                f"parameter(): parameter number {number} is already taken by "
                f"{self._parameters[number].name} in builder '{self.name}'"
            )
        shape = as_shape(shape, "parameter")
        op = self._add(
            Opcode.PARAMETER,
            attrs={},
            shape=shape,
            parameter_number=number,
            name=name or f"parameter.{next(_IDS)}",
        )
        self._parameters[number] = op.instr
        return op

    def constant(self, value, dtype: TypeLike | None = None) -> XlaOp:
        """A constant array: a NumPy array or a Python number, converted to `dtype` when
        given. Without `dtype` an array keeps its dtype, and a Python float, int, bool or
        complex becomes f32, s32, pred or c64."""
        if dtype is None and not isinstance(value, np.ndarray | np.generic):
            dtype = default_element_type(value)
        etype = as_element_type(dtype, "constant") if dtype is not None else None
        try:
            literal = Literal.from_array(value, etype)
        except (KeyError, TypeError, ValueError) as e:
            raise BuilderError(f"constant(): cannot make a literal of {value!r}: {e}") from None
        return self.constant_literal(literal)

    def constant_literal(self, literal: Literal) -> XlaOp:
        """A constant holding `literal` (an array, tuple or token literal)."""
        if not isinstance(literal, Literal):
            raise BuilderError(f"constant_literal(): expected a Literal, got {literal!r}")
        return self._add(Opcode.CONSTANT, shape=literal.shape, literal=literal, method="constant")

    # -- elementwise ops with extras ---------------------------------------------------------
    def _binary(self, opcode, lhs, rhs, broadcast_dimensions, attrs=None, method=None):
        method = method or method_name(opcode)
        lhs = self._coerce(lhs, rhs if isinstance(rhs, XlaOp) else None, method)
        rhs = self._coerce(rhs, lhs, method)
        lhs, rhs = self._broadcast_pair(lhs, rhs, broadcast_dimensions, method)
        return self._add(opcode, [lhs, rhs], attrs, method=method)

    def _broadcast_pair(self, lhs: XlaOp, rhs: XlaOp, broadcast_dimensions, method: str):
        """XLA's builder-level broadcasting: a scalar, or the lower-rank operand with
        explicit `broadcast_dimensions`, is broadcast to the other operand's dims."""
        a, b = lhs.shape, rhs.shape
        if not (a.is_array and b.is_array) or a.dims == b.dims:
            return lhs, rhs
        if broadcast_dimensions is None:
            if a.is_scalar:
                return self.broadcast(lhs, b.dims, ()), rhs
            if b.is_scalar:
                return lhs, self.broadcast(rhs, a.dims, ())
            return lhs, rhs
        dims = tuple(broadcast_dimensions)
        if a.rank < b.rank:
            return self.broadcast(lhs, b.dims, dims), rhs
        if b.rank < a.rank:
            return lhs, self.broadcast(rhs, a.dims, dims)
        raise BuilderError(
            f"{method}(): broadcast_dimensions needs operands of different ranks, got "
            f"{a.to_text(False)} and {b.to_text(False)}"
        )

    def compare(
        self,
        lhs,
        rhs,
        direction: str,
        compare_type: str | None = None,
        broadcast_dimensions=None,
    ) -> XlaOp:
        """`lhs <direction> rhs` elementwise as pred; direction EQ NE LT LE GT GE, compare
        type FLOAT TOTALORDER SIGNED UNSIGNED (XLA picks one from the type when omitted)."""
        direction = choice(direction, DIRECTIONS, "compare", "direction", upper=True)
        attrs = {"direction": A.Enum(direction)}
        if compare_type is not None:
            ctype = choice(compare_type, COMPARE_TYPES, "compare", "compare_type", upper=True)
            attrs["type"] = A.Enum(ctype)
        return self._binary(Opcode.COMPARE, lhs, rhs, broadcast_dimensions, attrs, "compare")

    def eq(self, lhs, rhs) -> XlaOp:
        return self.compare(lhs, rhs, "EQ")

    def ne(self, lhs, rhs) -> XlaOp:
        return self.compare(lhs, rhs, "NE")

    def lt(self, lhs, rhs) -> XlaOp:
        return self.compare(lhs, rhs, "LT")

    def le(self, lhs, rhs) -> XlaOp:
        return self.compare(lhs, rhs, "LE")

    def gt(self, lhs, rhs) -> XlaOp:
        return self.compare(lhs, rhs, "GT")

    def ge(self, lhs, rhs) -> XlaOp:
        return self.compare(lhs, rhs, "GE")

    def convert(self, operand: XlaOp, new_element_type: TypeLike) -> XlaOp:
        """`operand` converted elementwise to `new_element_type`."""
        return self._retyped(Opcode.CONVERT, operand, new_element_type, "convert")

    def bitcast_convert(self, operand: XlaOp, new_element_type: TypeLike) -> XlaOp:
        """`operand`'s bits read as `new_element_type` (a narrower type adds a minor
        dimension, a wider one consumes it)."""
        return self._retyped(Opcode.BITCAST_CONVERT, operand, new_element_type, "bitcast_convert")

    def _retyped(self, opcode, operand, new_element_type, method) -> XlaOp:
        x = self._own(operand, method, 0)
        etype = as_element_type(new_element_type, method)
        declared = Shape.array(etype, x.shape.dims, dynamic=x.shape.dynamic)
        return self._add(opcode, [x], shape=declared, method=method)

    def reduce_precision(self, operand: XlaOp, exponent_bits: int, mantissa_bits: int) -> XlaOp:
        """`operand` rounded to a float format with the given exponent and mantissa bits."""
        attrs = {"exponent_bits": int(exponent_bits), "mantissa_bits": int(mantissa_bits)}
        return self._add(Opcode.REDUCE_PRECISION, [operand], attrs, method="reduce_precision")

    def stochastic_convert(
        self, operand: XlaOp, random: XlaOp, new_element_type: TypeLike
    ) -> XlaOp:
        """`operand` converted to `new_element_type`, rounding up or down at random by the
        unsigned integer `random` bits (as wide as the operand's type)."""
        x = self._own(operand, "stochastic_convert", 0)
        etype = as_element_type(new_element_type, "stochastic_convert")
        declared = Shape.array(etype, x.shape.dims, dynamic=x.shape.dynamic)
        return self._add(Opcode.STOCHASTIC_CONVERT, [x, random], shape=declared)

    def select(self, pred: XlaOp, on_true: XlaOp, on_false: XlaOp) -> XlaOp:
        """`on_true` where `pred` holds, else `on_false` (pred is pred[] or the same dims)."""
        return self._add(Opcode.SELECT, [pred, on_true, on_false])

    def clamp(self, min_value: XlaOp, operand: XlaOp, max_value: XlaOp) -> XlaOp:
        """`operand` clamped to [min_value, max_value] (bounds are scalars or the same dims)."""
        return self._add(Opcode.CLAMP, [min_value, operand, max_value])

    # -- shape and data movement -------------------------------------------------------------
    def broadcast(self, operand: XlaOp, out_dims, broadcast_dimensions=None) -> XlaOp:
        """BroadcastInDim: an array of `out_dims` where operand dimension i lands on result
        dimension `broadcast_dimensions[i]` (default: the last operand-rank dimensions)."""
        x = self._own(operand, "broadcast", 0)
        out_dims = tuple(int(d) for d in out_dims)
        if broadcast_dimensions is None:
            broadcast_dimensions = range(len(out_dims) - x.shape.rank, len(out_dims))
        attrs = {"dimensions": tuple(int(d) for d in broadcast_dimensions)}
        declared = Shape.array(x.shape.element_type, out_dims) if x.shape.is_array else None
        return self._add(Opcode.BROADCAST, [x], attrs, declared, method="broadcast")

    broadcast_in_dim = broadcast

    def reshape(self, operand: XlaOp, new_sizes) -> XlaOp:
        """`operand`'s elements in row-major order, as an array of `new_sizes`."""
        x = self._own(operand, "reshape", 0)
        if not x.shape.is_array:
            raise BuilderError(f"reshape(): operand must be an array, got {x.shape}")
        declared = Shape.array(x.shape.element_type, tuple(int(d) for d in new_sizes))
        return self._add(Opcode.RESHAPE, [x], shape=declared)

    def transpose(self, operand: XlaOp, permutation) -> XlaOp:
        """Result dimension i is operand dimension `permutation[i]`."""
        return self._add(Opcode.TRANSPOSE, [operand], {"dimensions": ints(permutation)})

    def slice(self, operand: XlaOp, start_indices, limit_indices, strides=None) -> XlaOp:
        """The static slice [start:limit:stride] in every dimension."""
        start, limit = ints(start_indices), ints(limit_indices)
        strides = ints(strides) if strides is not None else (1,) * len(start)
        if not len(start) == len(limit) == len(strides):
            raise BuilderError(
                f"slice(): start {list(start)}, limit {list(limit)} and strides "
                f"{list(strides)} must have one entry per dimension"
            )
        spec = A.SliceSpec(tuple(zip(start, limit, strides)))
        return self._add(Opcode.SLICE, [operand], {"slice": spec})

    def slice_in_dim(
        self, operand: XlaOp, start: int, limit: int, stride: int = 1, dimno: int = 0
    ) -> XlaOp:
        """A slice of one dimension, the others kept whole."""
        x = self._own(operand, "slice_in_dim", 0)
        starts, limits, strides = [0] * x.shape.rank, list(x.shape.dims), [1] * x.shape.rank
        if not 0 <= dimno < x.shape.rank:
            raise BuilderError(f"slice_in_dim(): dimno {dimno} is not a dimension of {x.shape}")
        starts[dimno], limits[dimno], strides[dimno] = start, limit, stride
        return self.slice(x, starts, limits, strides)

    def dynamic_slice(self, operand: XlaOp, start_indices: Sequence[XlaOp], slice_sizes) -> XlaOp:
        """A slice of `slice_sizes` starting at the run-time scalar `start_indices` (clamped
        so that the slice stays inside the operand)."""
        attrs = {"dynamic_slice_sizes": ints(slice_sizes)}
        return self._add(Opcode.DYNAMIC_SLICE, [operand, *start_indices], attrs)

    def dynamic_update_slice(
        self, operand: XlaOp, update: XlaOp, start_indices: Sequence[XlaOp]
    ) -> XlaOp:
        """`operand` with `update` written at the run-time `start_indices` (clamped)."""
        return self._add(Opcode.DYNAMIC_UPDATE_SLICE, [operand, update, *start_indices])

    def concatenate(self, operands: Sequence[XlaOp], dimension: int) -> XlaOp:
        """`operands` joined along `dimension`."""
        return self._add(Opcode.CONCATENATE, list(operands), {"dimensions": (int(dimension),)})

    concat_in_dim = concatenate

    def pad(self, operand: XlaOp, padding_value: XlaOp, padding_config) -> XlaOp:
        """`operand` padded with the scalar `padding_value`; `padding_config` holds one
        (low, high) or (low, high, interior) per dimension (negative low/high trims)."""
        dims = []
        for entry in padding_config:
            entry = tuple(int(v) for v in entry)
            if len(entry) not in (2, 3):
                raise BuilderError(
                    f"pad(): each padding entry is (low, high) or (low, high, interior), "
                    f"got {entry}"
                )
            dims.append(entry if len(entry) == 3 else (*entry, 0))
        return self._add(Opcode.PAD, [operand, padding_value], {"padding": A.Padding(tuple(dims))})

    def iota(self, shape: ShapeLike, iota_dimension: int = 0) -> XlaOp:
        """An array of `shape` counting 0, 1, 2, ... along `iota_dimension`."""
        shape = as_shape(shape, "iota")
        return self._add(Opcode.IOTA, [], {"iota_dimension": int(iota_dimension)}, shape)

    def reverse(self, operand: XlaOp, dimensions) -> XlaOp:
        """`operand` with the order of elements reversed along `dimensions`."""
        return self._add(Opcode.REVERSE, [operand], {"dimensions": ints(dimensions)})

    # -- dot and convolution -----------------------------------------------------------------
    def dot(self, lhs: XlaOp, rhs: XlaOp, precision=None, preferred_element_type=None) -> XlaOp:
        """Vector/matrix product: lhs's last dimension contracts with rhs's first."""
        a = self._own(lhs, "dot", 0).shape
        self._own(rhs, "dot", 1)
        if not a.is_array or a.rank == 0:
            raise BuilderError(f"dot(): lhs must be an array of rank 1 or 2, got {a}")
        return self.dot_general(
            lhs, rhs, (a.rank - 1,), (0,), (), (), precision, preferred_element_type, "dot"
        )

    def dot_general(
        self,
        lhs: XlaOp,
        rhs: XlaOp,
        lhs_contracting_dims,
        rhs_contracting_dims,
        lhs_batch_dims=(),
        rhs_batch_dims=(),
        precision=None,
        preferred_element_type=None,
        _method: str = "dot_general",
    ) -> XlaOp:
        """DotGeneral: batch dims first, then lhs's free dims, then rhs's free dims.

        `precision` is one value ("default", "high", "highest") or one per operand;
        `preferred_element_type` sets the result type (needed when operand types differ)."""
        attrs = {
            "lhs_batch_dims": ints(lhs_batch_dims) or None,
            "lhs_contracting_dims": ints(lhs_contracting_dims) or None,
            "rhs_batch_dims": ints(rhs_batch_dims) or None,
            "rhs_contracting_dims": ints(rhs_contracting_dims) or None,
            "operand_precision": precision_attr(precision, _method),
        }
        declared = preferred_type_shape(preferred_element_type, _method)
        return self._add(Opcode.DOT, [lhs, rhs], attrs, declared, method=_method)

    def convolution(
        self,
        lhs: XlaOp,
        rhs: XlaOp,
        window_strides=None,
        padding="VALID",
        lhs_dilation=None,
        rhs_dilation=None,
        dim_labels: str = "b01f_01io->b01f",
        feature_group_count: int = 1,
        batch_group_count: int = 1,
        precision=None,
        preferred_element_type=None,
    ) -> XlaOp:
        """ConvGeneralDilated. `padding` is "VALID", "SAME" or one (low, high) per spatial
        dimension; `dim_labels` names the input, kernel and output layouts (b01f_01io->b01f);
        `lhs_dilation` is the input (base) dilation, `rhs_dilation` the kernel's."""
        method = "convolution"
        x = self._own(lhs, method, 0).shape
        k = self._own(rhs, method, 1).shape
        labels = parse_dim_labels(dim_labels, method)
        n = len(labels.input_spatial)
        if x.rank != n + 2 or k.rank != n + 2:
            raise ShapeError(
                f"{method}(): dim_labels {dim_labels} have {n} spatial dimensions but lhs is "
                f"{x.to_text(False)} and rhs is {k.to_text(False)}"
            )
        window = make_window(
            [k.dims[d] for d in labels.kernel_spatial],
            window_strides,
            padding,
            lhs_dilation,
            rhs_dilation,
            input_sizes=[x.dims[d] for d in labels.input_spatial],
            method=method,
        )
        attrs = {
            "window": window,
            "dim_labels": labels,
            "feature_group_count": feature_group_count if feature_group_count != 1 else None,
            "batch_group_count": batch_group_count if batch_group_count != 1 else None,
            "operand_precision": precision_attr(precision, method),
        }
        declared = preferred_type_shape(preferred_element_type, method)
        return self._add(Opcode.CONVOLUTION, [lhs, rhs], attrs, declared, method=method)

    conv_general_dilated = convolution

    def fft(self, operand: XlaOp, fft_type: str, fft_length) -> XlaOp:
        """FFT, IFFT, RFFT or IRFFT over the last len(fft_length) dimensions."""
        kind = choice(fft_type, FFT_TYPES, "fft", "fft_type", upper=True)
        attrs = {"fft_type": A.Enum(kind), "fft_length": ints(fft_length)}
        return self._add(Opcode.FFT, [operand], attrs)

    # -- reductions --------------------------------------------------------------------------
    def reduce(self, operands, init_values, computation, dimensions) -> XlaOp:
        """Reduce `operands` (one op or several of equal dims) over `dimensions` with the
        scalar `computation` (N accumulators, then N elements -> N results). Several
        operands give a tuple-shaped op."""
        operands, inits = as_list(operands), as_list(init_values)
        attrs = {
            "dimensions": ints(dimensions),
            "to_apply": self._computation(computation, "reduce", "computation"),
        }
        return self._add(Opcode.REDUCE, [*operands, *inits], attrs)

    def reduce_window(
        self,
        operands,
        init_values,
        computation,
        window_dimensions,
        window_strides=None,
        padding="VALID",
        base_dilations=None,
        window_dilations=None,
    ) -> XlaOp:
        """Reduce every window of `window_dimensions` (stepping by `window_strides`) with
        `computation`; `padding` is "VALID", "SAME" or one (low, high) per dimension."""
        operands, inits = as_list(operands), as_list(init_values)
        first = self._own(operands[0], "reduce_window", 0).shape if operands else None
        window = make_window(
            window_dimensions,
            window_strides,
            padding,
            base_dilations,
            window_dilations,
            input_sizes=first.dims if first is not None and first.is_array else None,
            method="reduce_window",
        )
        attrs = {
            "window": window,
            "to_apply": self._computation(computation, "reduce_window", "computation"),
        }
        return self._add(Opcode.REDUCE_WINDOW, [*operands, *inits], attrs)

    def select_and_scatter(
        self,
        operand: XlaOp,
        select,
        window_dimensions,
        window_strides,
        padding,
        source: XlaOp,
        init_value: XlaOp,
        scatter,
    ) -> XlaOp:
        """For each window of `operand`, pick an element with `select` (a pred comparator)
        and combine the matching `source` element into it with `scatter`."""
        x = self._own(operand, "select_and_scatter", 0).shape
        window = make_window(
            window_dimensions,
            window_strides,
            padding,
            input_sizes=x.dims if x.is_array else None,
            method="select_and_scatter",
        )
        attrs = {
            "window": window,
            "select": self._computation(select, "select_and_scatter", "select"),
            "scatter": self._computation(scatter, "select_and_scatter", "scatter"),
        }
        return self._add(Opcode.SELECT_AND_SCATTER, [operand, source, init_value], attrs)

    # -- gather, scatter, sort ---------------------------------------------------------------
    def gather(
        self,
        operand: XlaOp,
        start_indices: XlaOp,
        *,
        offset_dims,
        collapsed_slice_dims,
        start_index_map,
        slice_sizes,
        index_vector_dim: int | None = None,
        operand_batching_dims=(),
        start_indices_batching_dims=(),
        indices_are_sorted: bool = False,
    ) -> XlaOp:
        """XLA's Gather with its dimension numbers as keyword arguments.
        `index_vector_dim` defaults to the rank of `start_indices` (scalar indices)."""
        idx = self._own(start_indices, "gather", 1).shape
        if index_vector_dim is None:
            index_vector_dim = idx.rank
        attrs = {
            "offset_dims": ints(offset_dims),
            "collapsed_slice_dims": ints(collapsed_slice_dims),
            "start_index_map": ints(start_index_map),
            "operand_batching_dims": ints(operand_batching_dims) or None,
            "start_indices_batching_dims": ints(start_indices_batching_dims) or None,
            "index_vector_dim": int(index_vector_dim),
            "slice_sizes": ints(slice_sizes),
            "indices_are_sorted": True if indices_are_sorted else None,
        }
        return self._add(Opcode.GATHER, [operand, start_indices], attrs)

    def scatter(
        self,
        operands,
        scatter_indices: XlaOp,
        updates,
        update_computation,
        *,
        update_window_dims,
        inserted_window_dims,
        scatter_dims_to_operand_dims,
        index_vector_dim: int | None = None,
        input_batching_dims=(),
        scatter_indices_batching_dims=(),
        indices_are_sorted: bool = False,
        unique_indices: bool = False,
    ) -> XlaOp:
        """XLA's Scatter: combine `updates` into `operands` at `scatter_indices` with
        `update_computation` (old, new -> combined). Several operands give a tuple."""
        operands, updates = as_list(operands), as_list(updates)
        idx = self._own(scatter_indices, "scatter", len(operands)).shape
        if index_vector_dim is None:
            index_vector_dim = idx.rank
        attrs = {
            "update_window_dims": ints(update_window_dims),
            "inserted_window_dims": ints(inserted_window_dims),
            "scatter_dims_to_operand_dims": ints(scatter_dims_to_operand_dims),
            "input_batching_dims": ints(input_batching_dims) or None,
            "scatter_indices_batching_dims": ints(scatter_indices_batching_dims) or None,
            "index_vector_dim": int(index_vector_dim),
            "indices_are_sorted": True if indices_are_sorted else None,
            "unique_indices": True if unique_indices else None,
            "to_apply": self._computation(update_computation, "scatter", "update_computation"),
        }
        return self._add(Opcode.SCATTER, [*operands, scatter_indices, *updates], attrs)

    def sort(self, operands, comparator=None, dimension: int = -1, is_stable: bool = False):
        """Sort `operands` (one op or several of equal dims) together along `dimension`
        with `comparator` (2N scalars -> pred; default: ascending by the first operand)."""
        operands = as_list(operands)
        for i, op in enumerate(operands):
            self._own(op, "sort", i)
        if comparator is None:
            from xlapy.builder.computations import lt_comparator

            comparator = lt_comparator([op.shape.element_type for op in operands])
        rank = operands[0].shape.rank if operands else 0
        attrs = {
            "dimensions": (dimension + rank if dimension < 0 else dimension,),
            "is_stable": True if is_stable else None,
            "to_apply": self._computation(comparator, "sort", "comparator"),
        }
        return self._add(Opcode.SORT, operands, attrs)

    def topk(self, operand: XlaOp, k: int, largest: bool = True) -> XlaOp:
        """(values, s32 indices) of the k largest (or smallest) along the last dimension."""
        return self._add(Opcode.TOPK, [operand], {"k": int(k), "largest": bool(largest)})

    # -- control flow and calls --------------------------------------------------------------
    def while_loop(self, condition, body, init: XlaOp) -> XlaOp:
        """Run `body` on the loop state, starting from `init`, while `condition` holds."""
        attrs = {
            "condition": self._computation(condition, "while_loop", "condition"),
            "body": self._computation(body, "while_loop", "body"),
        }
        return self._add(Opcode.WHILE, [init], attrs, method="while_loop")

    def conditional(self, selector: XlaOp, branch_computations, branch_operands) -> XlaOp:
        """Run branch `selector` (s32[]: branch index, out of range -> the last branch;
        pred[] with two branches: true, false) on its operand."""
        sel = self._own(selector, "conditional", 0).shape
        comps = [
            self._computation(c, "conditional", f"branch {i}")
            for i, c in enumerate(branch_computations)
        ]
        attrs: dict[str, Any]
        if sel.is_scalar and sel.element_type.is_pred and len(comps) == 2:
            attrs = {"true_computation": comps[0], "false_computation": comps[1]}
        else:
            attrs = {"branch_computations": tuple(comps)}
        return self._add(Opcode.CONDITIONAL, [selector, *branch_operands], attrs)

    def call(self, computation, operands: Sequence[XlaOp]) -> XlaOp:
        """`computation` applied to `operands`."""
        attrs = {"to_apply": self._computation(computation, "call", "computation")}
        return self._add(Opcode.CALL, list(operands), attrs)

    def map(self, operands, computation) -> XlaOp:
        """The scalar `computation` applied elementwise across `operands` of equal dims."""
        operands = as_list(operands)
        first = self._own(operands[0], "map", 0).shape if operands else None
        rank = first.rank if first is not None and first.is_array else 0
        attrs = {
            "dimensions": tuple(range(rank)),
            "to_apply": self._computation(computation, "map", "computation"),
        }
        return self._add(Opcode.MAP, operands, attrs)

    # -- tuples, tokens, barriers ------------------------------------------------------------
    def tuple(self, elements: Sequence[XlaOp]) -> XlaOp:
        """A tuple of `elements`."""
        return self._add(Opcode.TUPLE, list(elements))

    def get_tuple_element(self, tuple_op: XlaOp, index: int) -> XlaOp:
        """Element `index` of a tuple-shaped op."""
        return self._add(Opcode.GET_TUPLE_ELEMENT, [tuple_op], {"index": int(index)})

    def after_all(self, tokens: Sequence[XlaOp] = ()) -> XlaOp:
        """A token ordered after every one of `tokens` (a fresh token when empty)."""
        return self._add(Opcode.AFTER_ALL, list(tokens))

    create_token = after_all

    def opt_barrier(self, operand: XlaOp) -> XlaOp:
        """`operand` unchanged, but no optimization moves work across it."""
        return self._add(Opcode.OPTIMIZATION_BARRIER, [operand], method="opt_barrier")

    # -- random numbers and linear algebra ---------------------------------------------------
    def rng_uniform(self, a: XlaOp, b: XlaOp, shape: ShapeLike) -> XlaOp:
        """Random numbers of `shape` uniform in [a, b) (the stateful legacy `rng` op)."""
        return self._rng("rng_uniform", a, b, shape)

    def rng_normal(self, mu: XlaOp, sigma: XlaOp, shape: ShapeLike) -> XlaOp:
        """Normally distributed random numbers of `shape` (the stateful legacy `rng` op)."""
        return self._rng("rng_normal", mu, sigma, shape)

    def _rng(self, distribution: str, a, b, shape) -> XlaOp:
        attrs = {"distribution": A.Enum(distribution)}
        return self._add(
            Opcode.RNG, [a, b], attrs, as_shape(shape, distribution), method=distribution
        )

    def rng_bit_generator(self, algorithm: str, initial_state: XlaOp, shape: ShapeLike) -> XlaOp:
        """(new state, random bits of `shape`) from `initial_state` with `algorithm`
        ("rng_default", "rng_three_fry" or "rng_philox"; the "rng_" may be left out)."""
        state = self._own(initial_state, "rng_bit_generator", 0).shape
        name = algorithm if str(algorithm).startswith("rng_") else f"rng_{algorithm}"
        name = choice(name, RNG_ALGORITHMS, "rng_bit_generator", "algorithm")
        declared = Shape.tuple([state, as_shape(shape, "rng_bit_generator")])
        return self._add(
            Opcode.RNG_BIT_GENERATOR, [initial_state], {"algorithm": A.Enum(name)}, declared
        )

    def cholesky(self, a: XlaOp, lower: bool = True) -> XlaOp:
        """The Cholesky factor of the Hermitian positive-definite matrices `a` (batched),
        read from and written to the `lower` (or upper) triangle."""
        return self._add(Opcode.CHOLESKY, [a], {"lower": bool(lower)})

    def triangular_solve(
        self,
        a: XlaOp,
        b: XlaOp,
        left_side: bool = True,
        lower: bool = True,
        unit_diagonal: bool = False,
        transpose_a: str = "NO_TRANSPOSE",
    ) -> XlaOp:
        """x with op(a) x = b (left_side) or x op(a) = b, a triangular; op per transpose_a
        (NO_TRANSPOSE, TRANSPOSE, ADJOINT)."""
        transpose = choice(transpose_a, TRANSPOSE_A, "triangular_solve", "transpose_a", upper=True)
        attrs = {
            "left_side": True if left_side else None,
            "lower": True if lower else None,
            "unit_diagonal": True if unit_diagonal else None,
            "transpose_a": A.Enum(transpose),
        }
        return self._add(Opcode.TRIANGULAR_SOLVE, [a, b], attrs)

    # -- custom calls ------------------------------------------------------------------------
    def custom_call(
        self,
        target: str,
        operands: Sequence[XlaOp],
        shape: ShapeLike,
        opaque: str = "",
        api_version: str | int | None = None,
        output_to_operand_aliasing=None,
        has_side_effect: bool = False,
        operand_layouts: Sequence[ShapeLike] | None = None,
        schedule: str | None = None,
    ) -> XlaOp:
        """A call of the code registered as `target`, producing `shape`.

        `opaque` is passed to the target as is (the backend_config string);
        `output_to_operand_aliasing` maps output shape indices to (operand number, operand
        shape index), as a dict or (output_index, (operand, operand_index)) pairs;
        `operand_layouts` gives each operand's required shape with layout."""
        method = "custom_call"
        if not isinstance(target, str) or not target:
            raise BuilderError(f"{method}(): target must be a non-empty string, got {target!r}")
        layouts = None
        if operand_layouts is not None:
            layouts = tuple(as_shape(s, method) for s in operand_layouts)
        attrs = {
            "custom_call_target": target,
            "operand_layout_constraints": layouts,
            "custom_call_has_side_effect": True if has_side_effect else None,
            "output_to_operand_aliasing": operand_aliasing_attr(output_to_operand_aliasing),
            "schedule": schedule_attr(schedule),
            "api_version": api_version_attr(api_version),
            "backend_config": A.BackendConfig(opaque) if opaque else None,
        }
        return self._add(Opcode.CUSTOM_CALL, list(operands), attrs, as_shape(shape, method))

    # -- aliasing ----------------------------------------------------------------------------
    def set_up_alias(
        self, output_index, param_number: int, param_index=(), kind: str = "may-alias"
    ) -> None:
        """Let output `output_index` share its buffer with parameter `param_number` at
        `param_index` (XLA's SetUpAlias). `kind` is "may-alias" or "must-alias"."""
        self._top_level("set_up_alias")
        entry = AliasEntry(
            shape_index(output_index),
            int(param_number),
            shape_index(param_index),
            alias_kind(kind, "set_up_alias"),
        )
        for e in self._aliases:
            if e.output_index == entry.output_index:
                raise BuilderError(
                    f"set_up_alias(): output {index_text(e.output_index)} is already aliased "
                    f"to parameter {e.param_number}"
                )
        self._aliases.append(entry)

    def add_buffer_donor(self, param_number: int, param_index=()) -> None:
        """Let parameter `param_number` at `param_index` be reused for any output of the
        same size (XLA's AddBufferDonor)."""
        self._top_level("add_buffer_donor")
        donor = BufferDonor(int(param_number), shape_index(param_index))
        if donor in self._donors:
            raise BuilderError(
                f"add_buffer_donor(): parameter {donor.param_number} at "
                f"{index_text(donor.param_index)} is already a donor"
            )
        self._donors.append(donor)

    def _top_level(self, method: str) -> None:
        if self.parent is not None:
            raise BuilderError(
                f"{method}(): aliasing belongs to the entry computation; '{self.name}' is a "
                "sub-builder"
            )

    # -- building ----------------------------------------------------------------------------
    def create_sub_builder(self, name: str) -> XlaBuilder:
        """A builder for a computation this one calls (a reducer, comparator, loop body...);
        its `build()` returns the HloComputation."""
        return XlaBuilder(name, parent=self)

    def build(self, root: XlaOp | None = None) -> HloModule | HloComputation:
        """The top-level builder: an HloModule whose entry's root is `root` (default: the last
        op), with every called computation, the aliases and donors, verified. A sub-builder:
        its HloComputation (as `build_computation`)."""
        if self.parent is not None:
            return self.build_computation(root)
        entry = self.build_computation(root)
        problem = alias_problem(entry, self._aliases, self._donors)
        if problem:
            raise BuilderError(problem)
        return assemble_module(self, entry, self._aliases, self._donors)

    def build_computation(self, root: XlaOp | None = None) -> HloComputation:
        """This builder's ops as one HloComputation (the same object while nothing changes)."""
        if not self._instructions:
            raise BuilderError(f"build(): builder '{self.name}' has no ops")
        root_instr = self._own(root, "build", 0).instr if root is not None else None
        root_instr = root_instr or self._instructions[-1]
        numbers = sorted(self._parameters)
        if numbers != list(range(len(numbers))):
            raise BuilderError(
                f"build(): builder '{self.name}' has parameters {numbers}; numbers must be "
                f"0..{len(numbers) - 1} with none missing"
            )
        key = (root_instr, len(self._instructions))
        if self._built is not None and self._built[:2] == key:
            return self._built[2]
        comp = HloComputation(self.name, list(self._instructions), root_instr)
        self._built = (*key, comp)
        return comp

    @property
    def parameters(self) -> list[XlaOp]:
        """The parameters made so far, by number."""
        return [XlaOp(self._parameters[n], self) for n in sorted(self._parameters)]


# -- the generated elementwise methods ------------------------------------------------------


def _unary_method(opcode: Opcode):
    name = method_name(opcode)

    def method(self: XlaBuilder, operand: XlaOp) -> XlaOp:
        return self._add(opcode, [operand], method=name)

    method.__doc__ = f"Elementwise {opcode.text}."
    return name, method


def _binary_method(opcode: Opcode):
    name = method_name(opcode)

    def method(self: XlaBuilder, lhs, rhs, broadcast_dimensions=None) -> XlaOp:
        return self._binary(opcode, lhs, rhs, broadcast_dimensions)

    method.__doc__ = (
        f"Elementwise {opcode.text}. A scalar (or a Python number) is broadcast to the other "
        "operand; `broadcast_dimensions` maps a lower-rank operand into the other's dims."
    )
    return name, method


ELEMENTWISE_METHODS: dict[Opcode, str] = {}
"""The generated elementwise methods: opcode -> builder method name."""

for _opcode in Opcode:
    if _opcode.category not in _ELEMENTWISE or _opcode in _IRREGULAR:
        continue
    make = _unary_method if _opcode.category is Category.UNARY else _binary_method
    _name, _method = make(_opcode)
    _method.__name__ = _name
    _method.__qualname__ = f"XlaBuilder.{_name}"
    setattr(XlaBuilder, _name, _method)
    ELEMENTWISE_METHODS[_opcode] = _name

for _name, _target in (("neg", "negate"), ("max", "maximum"), ("min", "minimum")):
    setattr(XlaBuilder, _name, getattr(XlaBuilder, _target))
del _opcode, _name, _method, _target, make
