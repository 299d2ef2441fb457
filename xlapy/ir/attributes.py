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

import numpy as np

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
    LITERAL = "literal"  # s32[2]{0} {1, 2}, or a tuple ( f32[] 1, pred[] true )
    RAW = "raw"  # any balanced text, kept verbatim (attributes xlapy does not interpret)


ATTRIBUTE_KINDS: dict[str, AttrKind] = {
    # shape ops and reductions
    "dimensions": AttrKind.INT_LIST,
    "iota_dimension": AttrKind.INT,
    "inferred_dimension": AttrKind.INT,  # reshape
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
    # compare's ordering as newer XLA prints it (jaxlib >= 0.11): order=TOTAL is the old
    # type=TOTALORDER, order=PARTIAL the IEEE comparison
    "order": AttrKind.ENUM,
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
    "has_dynamic_root": AttrKind.BOOL,
    "is_reverse": AttrKind.BOOL,  # scan
    "is_associative": AttrKind.BOOL,  # scan
    # custom calls
    "custom_call_target": AttrKind.STRING,
    "literal": AttrKind.LITERAL,
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

COMMON_ATTRIBUTES = frozenset(
    (
        "metadata",
        "sharding",
        "frontend_attributes",
        "backend_config",
        "control-predecessors",
        "statistics",
        "original_value",
        "origin",
    )
)
"""Attributes any instruction may carry."""

_DOT = (
    "lhs_batch_dims rhs_batch_dims lhs_contracting_dims rhs_contracting_dims operand_precision "
    "algorithm sparsity"
)
_CONV = "window dim_labels feature_group_count batch_group_count operand_precision algorithm"
_REPLICAS = "replica_groups channel_id use_global_device_ids constrain_layout"
_SEND_RECV = "channel_id is_host_transfer"
_GATHER = (
    "offset_dims collapsed_slice_dims start_index_map operand_batching_dims "
    "start_indices_batching_dims index_vector_dim slice_sizes indices_are_sorted"
)
_SCATTER = (
    "update_window_dims inserted_window_dims scatter_dims_to_operand_dims input_batching_dims "
    "scatter_indices_batching_dims index_vector_dim indices_are_sorted unique_indices to_apply"
)
_UNARY_MATH = "result_accuracy"  # the transcendental ops' accuracy request

OPCODE_ATTRIBUTES: dict[str, frozenset[str]] = {
    text: frozenset(names.split())
    for texts, names in (
        (
            "abs cbrt ceil count-leading-zeros convert bitcast-convert copy cosine erf "
            "exponential exponential-minus-one floor imag is-finite log log-plus-one logistic "
            "negate not popcnt real round-nearest-afz round-nearest-even rsqrt sign sine sqrt "
            "tan tanh",
            _UNARY_MATH,
        ),
        (
            "add and atan2 complex divide maximum minimum multiply or power remainder "
            "shift-left shift-right-arithmetic shift-right-logical stochastic-convert subtract "
            "xor clamp select tuple after-all add-dependency opt-barrier dynamic-update-slice "
            "dynamic-reshape partition-id replica-id all-reduce-done all-gather-done "
            "collective-permute-done copy-done",
            "",
        ),
        ("compare", "direction comparison_direction type order"),
        ("reduce-precision", "exponent_bits mantissa_bits"),
        ("constant", ""),
        ("parameter", "parameter_replication"),
        ("iota", "iota_dimension"),
        ("broadcast transpose reverse concatenate", "dimensions"),
        ("get-dimension-size set-dimension-size", "dimensions"),
        ("reshape", "inferred_dimension"),
        ("bitcast", ""),
        ("slice", "slice"),
        ("dynamic-slice", "dynamic_slice_sizes"),
        ("pad", "padding"),
        ("reduce", "dimensions to_apply"),
        ("reduce-window", "window to_apply"),
        ("select-and-scatter", "window select scatter"),
        ("dot scaled-dot", _DOT),
        ("ragged-dot", _DOT + " lhs_ragged_dims rhs_group_dims"),
        ("convolution", _CONV),
        ("fft", "fft_type fft_length"),
        ("gather", _GATHER),
        ("scatter", _SCATTER),
        ("sort", "dimensions is_stable to_apply"),
        ("topk", "k largest is_stable to_apply"),
        ("call", "to_apply is_composite has_dynamic_root"),
        ("conditional", "true_computation false_computation branch_computations"),
        ("while", "condition body"),
        ("scan", "dimensions to_apply is_reverse is_associative"),
        ("fusion", "kind calls output_to_operand_aliasing"),
        ("map", "dimensions to_apply"),
        (
            "custom-call",
            _CONV + " custom_call_target custom_call_has_side_effect custom_call_schedule schedule "
            "api_version operand_layout_constraints output_to_operand_aliasing literal "
            "called_computations to_apply padding_type",
        ),
        ("rng", "distribution"),
        ("rng-bit-generator", "algorithm"),
        ("rng-get-and-update-state", "delta"),
        ("all-gather all-gather-start", _REPLICAS + " dimensions"),
        ("all-reduce all-reduce-start", _REPLICAS + " to_apply"),
        ("reduce-scatter", _REPLICAS + " to_apply dimensions scatter_dimension"),
        ("all-to-all", _REPLICAS + " dimensions split_dimension"),
        ("ragged-all-to-all", _REPLICAS),
        ("collective-broadcast", _REPLICAS),
        (
            "collective-permute collective-permute-start",
            "channel_id source_target_pairs slice_sizes slice_sizes_list",
        ),
        ("copy-start", "cross_program_prefetch_index"),
        ("infeed", "infeed_config"),
        ("outfeed", "outfeed_config outfeed_shape"),
        ("send recv send-done recv-done", _SEND_RECV),
        ("async-start async-update async-done", "calls async_execution_thread"),
        ("cholesky", "lower"),
        ("triangular-solve", "left_side lower unit_diagonal transpose_a"),
        ("batch-norm-grad batch-norm-inference batch-norm-training", "epsilon feature_index"),
        ("get-tuple-element", "index"),
        ("domain", "domain"),
    )
    for text in texts.split()
}
"""The attributes each opcode takes besides COMMON_ATTRIBUTES (XLA refuses the others)."""

ENUM_VALUES: dict[str, frozenset[str]] = {
    key: frozenset(values.split())
    for key, values in (
        ("direction", "EQ NE LT LE GT GE"),
        ("comparison_direction", "EQ NE LT LE GT GE"),
        ("type", "FLOAT TOTALORDER SIGNED UNSIGNED PARTIALORDER"),
        ("order", "TOTAL PARTIAL"),
        ("fft_type", "FFT IFFT RFFT IRFFT"),
        ("distribution", "rng_uniform rng_normal"),
        ("transpose_a", "NO_TRANSPOSE TRANSPOSE ADJOINT"),
        ("kind", "kLoop kInput kOutput kCustom"),
        (
            "api_version",
            "API_VERSION_ORIGINAL API_VERSION_STATUS_RETURNING "
            "API_VERSION_STATUS_RETURNING_UNIFIED API_VERSION_TYPED_FFI",
        ),
        ("custom_call_schedule", "SCHEDULE_NONE SCHEDULE_LATEST SCHEDULE_EARLIEST"),
        ("schedule", "SCHEDULE_NONE SCHEDULE_LATEST SCHEDULE_EARLIEST"),
        ("padding_type", "PADDING_INVALID PADDING_VALID PADDING_SAME"),
    )
}
"""The values XLA reads for an enum attribute (others are errors). `algorithm` is absent: it
names rng-bit-generator's algorithm or a dot algorithm, a list that keeps growing."""

PRECISIONS = frozenset(("default", "high", "highest", "DEFAULT", "HIGH", "HIGHEST"))

COMPUTATION_ATTRIBUTES = tuple(
    name
    for name, kind in ATTRIBUTE_KINDS.items()
    if kind in (AttrKind.COMPUTATION, AttrKind.COMPUTATION_LIST)
)
"""Attribute names whose values are called computations, in the order they are printed."""


class FusionKind(enum.StrEnum):
    """A fusion's `kind=` (compares equal to its text)."""

    LOOP = "kLoop"
    INPUT = "kInput"
    OUTPUT = "kOutput"
    CUSTOM = "kCustom"


class FftType(enum.StrEnum):
    FFT = "FFT"
    IFFT = "IFFT"
    RFFT = "RFFT"
    IRFFT = "IRFFT"


class RngAlgorithm(enum.StrEnum):
    """rng-bit-generator's `algorithm=`."""

    DEFAULT = "rng_default"
    THREE_FRY = "rng_three_fry"
    PHILOX = "rng_philox"


class RngDistribution(enum.StrEnum):
    UNIFORM = "rng_uniform"
    NORMAL = "rng_normal"


class TriangularSolveTranspose(enum.StrEnum):
    """triangular-solve's `transpose_a=`."""

    NO_TRANSPOSE = "NO_TRANSPOSE"
    TRANSPOSE = "TRANSPOSE"
    ADJOINT = "ADJOINT"


class CustomCallApiVersion(enum.StrEnum):
    ORIGINAL = "API_VERSION_ORIGINAL"
    STATUS_RETURNING = "API_VERSION_STATUS_RETURNING"
    STATUS_RETURNING_UNIFIED = "API_VERSION_STATUS_RETURNING_UNIFIED"
    TYPED_FFI = "API_VERSION_TYPED_FFI"


class ComparisonDirection(enum.StrEnum):
    EQ = "EQ"
    NE = "NE"
    LT = "LT"
    LE = "LE"
    GT = "GT"
    GE = "GE"


class ComparisonType(enum.StrEnum):
    FLOAT = "FLOAT"
    TOTALORDER = "TOTALORDER"
    SIGNED = "SIGNED"
    UNSIGNED = "UNSIGNED"
    PARTIALORDER = "PARTIALORDER"


@dataclass(frozen=True, slots=True)
class DotDimensionNumbers:
    """A dot's batch and contracting dimensions (`lhs_batch_dims=` ... `rhs_contracting_dims=`;
    an absent list is empty)."""

    lhs_batch: tuple[int, ...] = ()
    rhs_batch: tuple[int, ...] = ()
    lhs_contracting: tuple[int, ...] = ()
    rhs_contracting: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class GatherDimensionNumbers:
    """A gather's dimension numbers and slice sizes. `index_vector_dim` defaults to the
    start indices' rank (the index vectors are their last, implicit, dimension of size 1)."""

    offset_dims: tuple[int, ...]
    collapsed_slice_dims: tuple[int, ...]
    start_index_map: tuple[int, ...]
    operand_batching_dims: tuple[int, ...]
    start_indices_batching_dims: tuple[int, ...]
    index_vector_dim: int
    slice_sizes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ScatterDimensionNumbers:
    """A scatter's dimension numbers; `index_vector_dim` defaults as a gather's does."""

    update_window_dims: tuple[int, ...]
    inserted_window_dims: tuple[int, ...]
    scatter_dims_to_operand_dims: tuple[int, ...]
    input_batching_dims: tuple[int, ...]
    scatter_indices_batching_dims: tuple[int, ...]
    index_vector_dim: int


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
    ranks: tuple[int, ...] = ()
    """(input, kernel, output) label lengths when some are `?` (unlabeled), else ()."""


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

    items: tuple[tuple[str, str | int | tuple[int, ...]], ...]

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
class MeshAxis:
    """One axis reference of a mesh replica-group list: a whole mesh axis (`'x'`), or the
    sub-axis `'x':(pre)size` (the `size` devices of axis x whose stride is `pre`)."""

    axis: int
    pre_size: int = 0  # 0: the whole axis
    size: int = 0


@dataclass(frozen=True, slots=True)
class Mesh:
    """A named device mesh, `mesh['x'=2,'y'=4]`, `mesh[...], device_ids=(3,1,2,0,...)`, or
    with device ids in XLA's iota form, `mesh[...], device_ids=([2,2]T(1,0))`."""

    names: tuple[str, ...]
    sizes: tuple[int, ...]
    device_ids: tuple[int, ...] | None = None  # None: 0, 1, 2, ... in row-major order
    device_ids_iota: str | None = None  # `[2,2]T(1,0)` as written; device_ids holds its ids


@dataclass(frozen=True, slots=True)
class ReplicaGroups:
    """The devices a collective runs over, in any of the three forms XLA prints:

      explicit  `{{0,1},{2,3}}` (or `{}`: all devices)    `groups`
      iota      `[2,2]<=[4]`, `[2,2]<=[2,2]T(1,0)`        `iota_text`, kept as written
      mesh      `mesh['x'=2,'y'=2] {'y'}`                  `mesh` and `mesh_axes`

    `expanded()` gives the explicit groups of every form; the parser has checked that it can.
    """

    groups: tuple[tuple[int, ...], ...] = ()
    iota_text: str | None = None
    mesh: Mesh | None = None
    mesh_axes: tuple[MeshAxis, ...] = ()

    def expanded(self) -> tuple[tuple[int, ...], ...]:
        """The explicit groups: `[2,2]<=[2,2]T(1,0)` is `((0,2),(1,3))`,
        `mesh['x'=2,'y'=2] {'x'}` is `((0,2),(1,3))`. ValueError for a malformed form."""
        if self.iota_text is not None:
            return iota_groups(self.iota_text)
        if self.mesh is not None:
            return mesh_groups(self.mesh, self.mesh_axes)
        return self.groups

    @property
    def group_size(self) -> int | None:
        """Devices per group; None for `{}` (every device, a number the module config holds)."""
        groups = self.expanded()
        return len(groups[0]) if groups else None


_IOTA_GROUPS = re.compile(r"\[([0-9,]*)\]<=\[([0-9,]*)\](?:T\(([0-9,]*)\))?")
_IOTA_IDS = re.compile(r"\[([0-9,]*)\](?:<=\[([0-9,]*)\])?(?:T\(([0-9,]*)\))?")


def iota_device_ids(text: str) -> tuple[int, ...]:
    """The ids of an iota device list as XLA prints a mesh's device_ids: `[dims]`,
    `[dims]T(perm)` or `[dims]<=[reshape dims]T(perm)`: the ids 0..n-1 laid out in the
    reshape dims (the dims when none are given), transposed, and read in row-major order."""
    m = _IOTA_IDS.fullmatch(text)
    if m is None:
        raise ValueError(f"'{text}' is not an iota device list like [2,2]T(1,0)")
    dims = _int_tuple(m.group(1))
    reshape = _int_tuple(m.group(2)) if m.group(2) is not None else dims
    perm = _int_tuple(m.group(3)) if m.group(3) is not None else tuple(range(len(reshape)))
    if not dims or math.prod(dims) != math.prod(reshape):
        raise ValueError(f"[{m.group(1)}] and [{m.group(2)}] hold different numbers of devices")
    if sorted(perm) != list(range(len(reshape))):
        raise ValueError(f"T({m.group(3)}) is not a permutation of {len(reshape)} dimensions")
    if math.prod(dims) > _MAX_DEVICES:
        raise ValueError(f"{math.prod(dims)} devices is more than {_MAX_DEVICES}")
    ids = np.arange(math.prod(dims)).reshape(reshape).transpose(perm).reshape(-1)
    return tuple(int(i) for i in ids)


def _int_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(",") if v)


def iota_groups(text: str) -> tuple[tuple[int, ...], ...]:
    """The groups of the iota form `[groups,size]<=[reshape dims]T(permutation)`: the ids
    0..n-1 laid out in the reshape dims, transposed, and read row by row in `size` chunks."""
    m = _IOTA_GROUPS.fullmatch(text)
    if m is None:
        raise ValueError(f"'{text}' is not an iota device list like [2,2]<=[4]")
    head, dims = _int_tuple(m.group(1)), _int_tuple(m.group(2))
    perm = _int_tuple(m.group(3)) if m.group(3) is not None else tuple(range(len(dims)))
    if len(head) != 2:
        raise ValueError(f"iota replica groups need [groups,size], got [{m.group(1)}]")
    if not dims or math.prod(head) != math.prod(dims):
        raise ValueError(f"[{m.group(1)}] and [{m.group(2)}] hold different numbers of devices")
    if sorted(perm) != list(range(len(dims))):
        raise ValueError(f"T({m.group(3)}) is not a permutation of {len(dims)} dimensions")
    if math.prod(dims) > _MAX_DEVICES:
        raise ValueError(f"{math.prod(dims)} devices is more than {_MAX_DEVICES}")
    ids = np.arange(math.prod(dims)).reshape(dims).transpose(perm).reshape(-1)
    return _chunks(ids, head[1]) if head[1] else ((),) * head[0]


_MAX_DEVICES = 1 << 20


def _chunks(ids, size: int) -> tuple[tuple[int, ...], ...]:
    flat = [int(v) for v in ids]
    return tuple(tuple(flat[i : i + size]) for i in range(0, len(flat), size))


def mesh_groups(mesh: Mesh, axes: tuple[MeshAxis, ...]) -> tuple[tuple[int, ...], ...]:
    """The groups of a mesh replica-group list: the devices that differ only along `axes`.

    Each mesh axis that sub-axes refer to is split into (stride, size, rest) pieces; the
    device array, reshaped to all pieces, is transposed so the grouped pieces come last and
    read in chunks of the group size."""
    rank = len(mesh.sizes)
    if rank == 0 or len(mesh.names) != rank or len(set(mesh.names)) != rank:
        raise ValueError("a mesh needs one distinct name per axis")
    if any(s < 1 for s in mesh.sizes):
        raise ValueError("mesh axis sizes must be positive")
    total = math.prod(mesh.sizes)
    if total > _MAX_DEVICES:
        raise ValueError(f"{total} devices is more than {_MAX_DEVICES}")
    if mesh.device_ids is None:
        ids = np.arange(total)
    elif sorted(mesh.device_ids) != list(range(total)):
        raise ValueError(f"device_ids must be a permutation of 0..{total - 1}")
    else:
        ids = np.array(mesh.device_ids)
    if not axes:
        raise ValueError("a mesh replica-group list names at least one axis")
    dims: list[int] = []
    grouped: list[int] = []
    for i, full in enumerate(mesh.sizes):
        refs = [a for a in axes if a.axis == i]
        offset = len(dims)
        if not refs:
            dims.append(full)
            continue
        if len(refs) == 1 and not refs[0].pre_size:
            dims.append(full)
            grouped.append(offset)
            continue
        if any(not r.pre_size for r in refs):
            raise ValueError(f"axis '{mesh.names[i]}' is named whole and as a sub-axis")
        order = sorted(range(len(refs)), key=lambda k: refs[k].pre_size)
        position = [0] * len(refs)
        prefix = 1
        for k in order:
            ref = refs[k]
            if ref.size < 2 or ref.pre_size % prefix or full % (ref.pre_size * ref.size):
                raise ValueError(f"sub-axis ({ref.pre_size}){ref.size} does not fit axis {full}")
            if ref.pre_size != prefix:
                dims.append(ref.pre_size // prefix)
                prefix = ref.pre_size
            position[k] = len(dims)
            dims.append(ref.size)
            prefix *= ref.size
        if prefix != full:
            dims.append(full // prefix)
        grouped.extend(position)
    if any(a.axis < 0 or a.axis >= rank for a in axes) or len(set(grouped)) != len(grouped):
        raise ValueError("mesh axes repeat or are out of range")
    size = math.prod(dims[g] for g in grouped)
    rest = [d for d in range(len(dims)) if d not in grouped]
    ids = ids.reshape(dims).transpose(rest + grouped).reshape(-1)
    return _chunks(ids, size)

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
