"""Attribute values of HLO instructions, and the table of known attribute names.

An instruction keeps its attributes in `instr.attrs`, a dict from the attribute's text name
(as it appears in HLO text: `dimensions`, `window`, `to_apply`, ...) to an immutable value:

  int, bool, str, float, tuple[int, ...]      plain values
  HloComputation / tuple[HloComputation, ...]  called computations (to_apply, body, ...)
  Window, ConvDimLabels, Padding, SliceSpec,   structured values defined here
  Metadata, FrontendAttributes, ReplicaGroups, OutputOperandAliasing, Sharding, Enum

ATTRIBUTE_KINDS says which kind of value each name holds; the parser reads it to know how to
parse an attribute, the printer to print it, and nothing else needs its own list.
"""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass

from xlapy.ir.shapes import ShapeIndex
from xlapy.ir.sharding import HloSharding as Sharding  # noqa: F401  (re-exported)


class AttrKind(enum.Enum):
    INT = "int"  # 3
    FLOAT = "float"  # 0.001
    BOOL = "bool"  # true
    STRING = "string"  # "text" (quoted)
    ENUM = "enum"  # LT, kLoop, rng_uniform: a bare identifier, kept as Enum(text)
    INT_LIST = "int list"  # {1,0}
    COMPUTATION = "computation"  # %region_0
    COMPUTATION_LIST = "computation list"  # {%a, %b}
    INSTRUCTION_LIST = "instruction list"  # {%a, %b} (control-predecessors)
    WINDOW = "window"  # {size=3x3 stride=2x2 pad=0_1x0_1}
    DIM_LABELS = "dim labels"  # b01f_01io->b01f
    PADDING = "padding"  # 0_0x1_2_1
    SLICE = "slice"  # {[0:4:2], [1:3]}
    METADATA = "metadata"  # {op_name="..." source_line=3}
    FRONTEND_ATTRIBUTES = "frontend attributes"  # {key="value"}
    SHARDING = "sharding"  # {replicated}, {devices=[2,1]<=[2]}: an HloSharding
    BACKEND_CONFIG = "backend config"  # "opaque" or {json}
    REPLICA_GROUPS = "replica groups"  # {{0,1},{2,3}} or [2,2]<=[4]
    PAIRS = "pairs"  # {{0,1},{1,2}}
    PRECISION_LIST = "precision list"  # {default,highest}
    SHAPE_LIST = "shape list"  # {f32[2]{0}, s32[]}
    SHAPE = "shape"  # f32[2]{0}
    OUTPUT_OPERAND_ALIASING = "output to operand aliasing"  # {{0}: (1, {})}
    RAW = "raw"  # any balanced text, kept verbatim (attributes xlapy does not interpret)


ATTRIBUTE_KINDS: dict[str, AttrKind] = {
    # shape ops and reductions
    "dimensions": AttrKind.INT_LIST,
    "iota_dimension": AttrKind.INT,
    "index": AttrKind.INT,
    "slice": AttrKind.SLICE,
    "padding": AttrKind.PADDING,
    "dynamic_slice_sizes": AttrKind.INT_LIST,
    "window": AttrKind.WINDOW,
    # dot and convolution
    "lhs_batch_dims": AttrKind.INT_LIST,
    "rhs_batch_dims": AttrKind.INT_LIST,
    "lhs_contracting_dims": AttrKind.INT_LIST,
    "rhs_contracting_dims": AttrKind.INT_LIST,
    "lhs_ragged_dims": AttrKind.INT_LIST,
    "rhs_group_dims": AttrKind.INT_LIST,
    "operand_precision": AttrKind.PRECISION_LIST,
    "algorithm": AttrKind.ENUM,  # dot algorithm, or rng-bit-generator's rng_default/philox
    "sparsity": AttrKind.RAW,
    "dim_labels": AttrKind.DIM_LABELS,
    "feature_group_count": AttrKind.INT,
    "batch_group_count": AttrKind.INT,
    # gather and scatter
    "offset_dims": AttrKind.INT_LIST,
    "collapsed_slice_dims": AttrKind.INT_LIST,
    "start_index_map": AttrKind.INT_LIST,
    "operand_batching_dims": AttrKind.INT_LIST,
    "start_indices_batching_dims": AttrKind.INT_LIST,
    "index_vector_dim": AttrKind.INT,
    "slice_sizes": AttrKind.INT_LIST,
    "indices_are_sorted": AttrKind.BOOL,
    "update_window_dims": AttrKind.INT_LIST,
    "inserted_window_dims": AttrKind.INT_LIST,
    "scatter_dims_to_operand_dims": AttrKind.INT_LIST,
    "input_batching_dims": AttrKind.INT_LIST,
    "scatter_indices_batching_dims": AttrKind.INT_LIST,
    "unique_indices": AttrKind.BOOL,
    # elementwise options
    "comparison_direction": AttrKind.ENUM,  # EQ NE LT LE GT GE
    "direction": AttrKind.ENUM,  # compare's direction as XLA prints it: direction=LT
    "type": AttrKind.ENUM,  # compare type: FLOAT TOTALORDER SIGNED UNSIGNED
    "exponent_bits": AttrKind.INT,
    "mantissa_bits": AttrKind.INT,
    "result_accuracy": AttrKind.RAW,
    # sorting
    "is_stable": AttrKind.BOOL,
    "k": AttrKind.INT,
    "largest": AttrKind.BOOL,
    # fft, rng
    "fft_type": AttrKind.ENUM,  # FFT IFFT RFFT IRFFT
    "fft_length": AttrKind.INT_LIST,
    "distribution": AttrKind.ENUM,  # rng_uniform rng_normal
    "delta": AttrKind.INT,
    # linear algebra
    "lower": AttrKind.BOOL,
    "left_side": AttrKind.BOOL,
    "unit_diagonal": AttrKind.BOOL,
    "transpose_a": AttrKind.ENUM,  # NO_TRANSPOSE TRANSPOSE ADJOINT
    "epsilon": AttrKind.FLOAT,
    "feature_index": AttrKind.INT,
    # called computations
    "to_apply": AttrKind.COMPUTATION,
    "calls": AttrKind.COMPUTATION,
    "condition": AttrKind.COMPUTATION,
    "body": AttrKind.COMPUTATION,
    "select": AttrKind.COMPUTATION,
    "scatter": AttrKind.COMPUTATION,
    "true_computation": AttrKind.COMPUTATION,
    "false_computation": AttrKind.COMPUTATION,
    "branch_computations": AttrKind.COMPUTATION_LIST,
    "called_computations": AttrKind.COMPUTATION_LIST,
    "kind": AttrKind.ENUM,  # fusion kind: kLoop kInput kOutput kCustom
    "is_composite": AttrKind.BOOL,
    # custom calls
    "custom_call_target": AttrKind.STRING,
    "api_version": AttrKind.ENUM,  # API_VERSION_ORIGINAL ... API_VERSION_TYPED_FFI
    "custom_call_has_side_effect": AttrKind.BOOL,
    "custom_call_schedule": AttrKind.ENUM,
    "schedule": AttrKind.ENUM,  # custom-call schedule as XLA prints it
    "operand_layout_constraints": AttrKind.SHAPE_LIST,
    "output_to_operand_aliasing": AttrKind.OUTPUT_OPERAND_ALIASING,
    "padding_type": AttrKind.ENUM,
    # collectives and communication
    "replica_groups": AttrKind.REPLICA_GROUPS,
    "channel_id": AttrKind.INT,
    "use_global_device_ids": AttrKind.BOOL,
    "constrain_layout": AttrKind.BOOL,
    "split_dimension": AttrKind.INT,
    "scatter_dimension": AttrKind.INT,
    "source_target_pairs": AttrKind.PAIRS,
    "slice_sizes_list": AttrKind.RAW,
    "is_host_transfer": AttrKind.BOOL,
    "infeed_config": AttrKind.STRING,
    "outfeed_config": AttrKind.STRING,
    "outfeed_shape": AttrKind.SHAPE,
    "async_execution_thread": AttrKind.STRING,
    "cross_program_prefetch_index": AttrKind.INT,
    # every instruction
    "metadata": AttrKind.METADATA,
    "sharding": AttrKind.SHARDING,
    "frontend_attributes": AttrKind.FRONTEND_ATTRIBUTES,
    "backend_config": AttrKind.BACKEND_CONFIG,
    "control-predecessors": AttrKind.INSTRUCTION_LIST,
    "statistics": AttrKind.RAW,
    "original_value": AttrKind.RAW,
    "origin": AttrKind.RAW,
    "domain": AttrKind.RAW,
    "parameter_replication": AttrKind.RAW,
}

COMPUTATION_ATTRIBUTES = tuple(
    name
    for name, kind in ATTRIBUTE_KINDS.items()
    if kind in (AttrKind.COMPUTATION, AttrKind.COMPUTATION_LIST)
)
"""Attribute names whose values are called computations, in the order they are printed."""


@dataclass(frozen=True, slots=True)
class Enum:
    """A bare identifier attribute value such as `LT`, `kLoop` or `rng_uniform`."""

    text: str

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True, slots=True)
class WindowDim:
    """One dimension of a window (reduce-window, select-and-scatter, convolution)."""

    size: int
    stride: int = 1
    pad_low: int = 0
    pad_high: int = 0
    window_dilation: int = 1  # rhs_dilate
    base_dilation: int = 1  # lhs_dilate
    reversal: bool = False


@dataclass(frozen=True, slots=True)
class Window:
    dims: tuple[WindowDim, ...]


@dataclass(frozen=True, slots=True)
class ConvDimLabels:
    """Convolution dimension numbers, as in `b01f_01io->b01f`.

    Each field is a dimension number of the input (lhs), kernel (rhs) or output; spatial
    tuples are ordered by spatial index (the digits of the label).
    """

    input_batch: int
    input_feature: int
    input_spatial: tuple[int, ...]
    kernel_input_feature: int
    kernel_output_feature: int
    kernel_spatial: tuple[int, ...]
    output_batch: int
    output_feature: int
    output_spatial: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Padding:
    """Pad amounts per dimension: (low, high, interior); low/high may be negative."""

    dims: tuple[tuple[int, int, int], ...]


@dataclass(frozen=True, slots=True)
class SliceSpec:
    """Per dimension (start, limit, stride), as in `slice={[0:4:2], [1:3]}`."""

    dims: tuple[tuple[int, int, int], ...]


@dataclass(frozen=True, slots=True)
class Metadata:
    """Op metadata, `{op_type="..." op_name="..." source_file="..." source_line=3 ...}`.

    Kept as ordered (key, value) pairs so that it prints back as it was read; string values
    are unescaped Python strings, numbers are ints.
    """

    items: tuple[tuple[str, str | int], ...]

    def get(self, key: str, default=None):
        for k, v in self.items:
            if k == key:
                return v
        return default

    @property
    def op_name(self) -> str | None:
        return self.get("op_name")


@dataclass(frozen=True, slots=True)
class FrontendAttributes:
    """Key/value pairs; a value is a string, or Raw text for an unquoted `{...}` value."""

    items: tuple[tuple[str, str | Raw], ...]

    def get(self, key: str, default=None):
        for k, v in self.items:
            if k == key:
                return v
        return default


@dataclass(frozen=True, slots=True)
class BackendConfig:
    """The opaque string of backend_config. `braced` when it was written `{...}` (JSON)."""

    text: str
    braced: bool = False


@dataclass(frozen=True, slots=True)
class ReplicaGroups:
    """Explicit groups `{{0,1},{2,3}}`, or the iota form `[2,2]<=[4]` kept as text."""

    groups: tuple[tuple[int, ...], ...] = ()
    iota_text: str | None = None

    def expanded(self) -> tuple[tuple[int, ...], ...]:
        """The groups as explicit id lists: an iota form `[a,b]<=[n]` (optionally with a
        reshape and transpose, `[2,2]<=[2,2]T(1,0)`) becomes a groups of b ids each."""
        if self.iota_text is None:
            return self.groups
        m = re.fullmatch(r"\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", self.iota_text)
        if m is None:
            raise ValueError(f"cannot read replica groups '{self.iota_text}'")
        shape = [int(v) for v in m.group(1).split(",")]
        reshape = [int(v) for v in m.group(2).split(",")]
        total = math.prod(reshape)
        if math.prod(shape) != total:
            raise ValueError(f"replica groups '{self.iota_text}': {shape} holds a different count")
        ids = list(range(total))
        if m.group(3):
            perm = [int(v) for v in m.group(3).split(",")]
            strides = [math.prod(reshape[i + 1 :]) for i in range(len(reshape))]
            dims = [reshape[p] for p in perm]
            ids = []
            for flat in range(total):
                rest, offset = flat, 0
                for axis in reversed(range(len(dims))):
                    rest, i = divmod(rest, dims[axis])
                    offset += i * strides[perm[axis]]
                ids.append(offset)
        width = shape[-1] if len(shape) > 1 else total
        return tuple(tuple(ids[i : i + width]) for i in range(0, total, width))


@dataclass(frozen=True, slots=True)
class OutputOperandAlias:
    output_index: ShapeIndex
    operand_number: int
    operand_index: ShapeIndex


@dataclass(frozen=True, slots=True)
class Raw:
    """An attribute xlapy keeps but does not interpret, printed back verbatim."""

    text: str
