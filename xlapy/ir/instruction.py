"""HloInstruction: one operation in a computation.

An instruction has a name, an opcode (from the opcode table), a result shape, operand
instructions, and attributes keyed by their text names (see xlapy.ir.attributes). Constants
hold a Literal; parameters hold their number. Called computations (to_apply, body, ...)
are attribute values, so `called_computations()` finds them without a per-opcode list.
Code outside `ir` reads attributes through the typed accessors below (`window`,
`dot_dimension_numbers`, `channel_id`, ...), which check the value and raise
HloAttributeError naming the instruction; tests/test_architecture.py checks it.

Use-lists: an instruction that belongs to a computation is listed in `users` of each of its
operands (once, however often it reads it) and in `control_successors` of each of its control
predecessors. Every edit keeps them current: HloComputation.add_instruction /
remove_instruction attach and detach an instruction, and the edits below (set_operands,
replace_operand, add/remove_control_predecessor) update both ends. An instruction not in a
computation (being built, or removed) is in nobody's use-list. Code outside `ir` edits the
graph only through these methods (tests/test_architecture.py checks it).
"""

from __future__ import annotations

import enum
import functools
import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from xlapy.errors import HloAttributeError
from xlapy.ir import attributes as A
from xlapy.ir.attributes import COMPUTATION_ATTRIBUTES, Metadata
from xlapy.ir.literal import Literal
from xlapy.ir.opcodes import Opcode
from xlapy.ir.shapes import Shape

if TYPE_CHECKING:
    from xlapy.ir.computation import HloComputation
    from xlapy.ir.sharding import HloSharding

_T = TypeVar("_T")
_E = TypeVar("_E", bound=enum.Enum)

# computation attribute name -> its place in the attribute order
_CALL_ORDER = {name: i for i, name in enumerate(COMPUTATION_ATTRIBUTES)}
# the attribute names that hold called computations
CALL_ATTRIBUTES = frozenset(COMPUTATION_ATTRIBUTES)
_NO_CALLS: tuple[HloComputation, ...] = ()
_NO_FRONTEND_ATTRIBUTES = A.FrontendAttributes(())


@functools.cache
def _computation_class() -> type[HloComputation]:
    from xlapy.ir.computation import HloComputation  # it imports this module

    return HloComputation


class HloInstruction:
    """A node of the HLO graph. Shapes, literals and attribute values are immutable; the
    graph itself (operands, attrs) may be edited by passes."""

    __slots__ = (
        "__weakref__",  # per-instruction runtime state (an FFI handler's) is keyed weakly
        "attrs",
        "control_predecessors",
        "control_successors",
        "literal",
        "name",
        "opcode",
        "operands",
        "parameter_number",
        "parent",
        "shape",
        "users",
    )

    def __init__(
        self,
        name: str,
        opcode: Opcode,
        shape: Shape,
        operands=(),
        attrs: dict[str, Any] | None = None,
        *,
        literal: Literal | None = None,
        parameter_number: int | None = None,
        control_predecessors=(),
    ):
        self.name = name
        self.opcode = opcode
        self.shape = shape
        self.operands: list[HloInstruction] = list(operands)
        self.attrs: dict[str, Any] = dict(attrs or {})
        self.literal = literal
        self.parameter_number = parameter_number
        self.control_predecessors: list[HloInstruction] = list(control_predecessors)
        self.parent: HloComputation | None = None
        self.users: list[HloInstruction] = []  # see the module comment
        self.control_successors: list[HloInstruction] = []

    # -- queries ---------------------------------------------------------------------------
    def operand(self, i: int) -> HloInstruction:
        return self.operands[i]

    def called_computations(self) -> Iterator[HloComputation]:
        """Every computation this instruction calls, in attribute order."""
        if CALL_ATTRIBUTES.isdisjoint(self.attrs):  # most instructions call nothing
            return iter(_NO_CALLS)
        keys = [key for key in self.attrs if key in _CALL_ORDER]
        if len(keys) > 1:
            keys.sort(key=_CALL_ORDER.__getitem__)
        called: list[HloComputation] = []
        for key in keys:
            value = self.attrs[key]
            if value is None:
                continue
            if isinstance(value, tuple):
                called.extend(value)
            else:
                called.append(value)
        return iter(called)

    @property
    def metadata(self) -> Metadata | None:
        return self.attrs.get("metadata")

    @property
    def op_name(self) -> str | None:
        """The op_name of the instruction's metadata (what JAX users recognise), if any."""
        meta = self.metadata
        return meta.op_name if meta is not None else None

    # -- typed accessors for the attributes passes read ------------------------------------
    @property
    def comparison_direction(self) -> A.ComparisonDirection | None:
        """EQ NE LT LE GT GE of a compare (XLA prints `direction=`; `comparison_direction=`
        is accepted too), None when absent."""
        name = "direction" if self.attrs.get("direction") is not None else "comparison_direction"
        return self._enum(name, A.ComparisonDirection, None)

    @property
    def comparison_type(self) -> A.ComparisonType | None:
        """A compare's `type=` (FLOAT, TOTALORDER, SIGNED, UNSIGNED), None when absent.
        Newer XLA prints the ordering instead (`order=TOTAL` / `order=PARTIAL`): TOTAL reads
        as TOTALORDER and PARTIAL as the default comparison of the operands' type (None)."""
        if self.attrs.get("type") is None:
            order = self.attrs.get("order")
            total = order is not None and str(order) == "TOTAL"
            return A.ComparisonType.TOTALORDER if total else None
        return self._enum("type", A.ComparisonType)

    @property
    def dimensions(self) -> tuple[int, ...]:
        """The `dimensions={...}` attribute (reduce, transpose, broadcast, reverse, ...)."""
        return tuple(self.attrs.get("dimensions", ()))

    @property
    def tuple_index(self) -> int:
        """The element a get-tuple-element reads."""
        value = self.attrs.get("index")
        return value if type(value) is int else self._int("index")

    @property
    def to_apply(self) -> HloComputation:
        """The computation a call, reduce, map, sort, scatter, ... applies (`to_apply=`)."""
        return self._computation("to_apply")

    @property
    def to_apply_or_none(self) -> HloComputation | None:
        """`to_apply=`, None when absent (a custom call may have one or not)."""
        return self._computation("to_apply", None)

    @property
    def while_body(self) -> HloComputation:
        return self._computation("body")

    @property
    def while_condition(self) -> HloComputation:
        return self._computation("condition")

    @property
    def branches(self) -> tuple[HloComputation, ...]:
        """A conditional's branch computations, in branch order (the predicated form's
        true and false computations too)."""
        if self.attrs.get("branch_computations") is not None:
            return self._computations("branch_computations")
        return (self._computation("true_computation"), self._computation("false_computation"))

    @property
    def conditional_is_predicated(self) -> bool:
        """Whether a conditional is the predicated form (`true_computation=` and
        `false_computation=`, a pred selector) rather than the indexed one."""
        return self.attrs.get("branch_computations") is None

    @property
    def known_trip_count(self) -> int | None:
        """A while loop's trip count when its backend_config says it
        (`{"known_trip_count":{"n":"8"}}`, as XLA writes it), else None."""
        config = self.attrs.get("backend_config")
        text = getattr(config, "text", None)
        if not text or "known_trip_count" not in text:
            return None
        try:
            parsed = json.loads(text)
            n = parsed["known_trip_count"]["n"]
            return int(n)
        except (ValueError, TypeError, KeyError):
            return None

    # Each accessor reads one attribute the parser (or a builder) stored, checks that it holds
    # the kind of value its name promises, and raises HloAttributeError naming the instruction
    # when it does not (or when a required one is absent). Absent optional attributes give
    # XLA's default.
    _REQUIRED: Any = object()

    def _missing(self, name: str) -> HloAttributeError:
        return HloAttributeError(f"{self.name}: {self.opcode.text} needs the attribute {name}=")

    def _malformed(self, name: str, value, expected: str) -> HloAttributeError:
        return HloAttributeError(f"{self.name}: {name}={value!r} is not {expected}")

    def _typed(self, name: str, kind: type[_T], default: Any = _REQUIRED) -> _T:
        value = self.attrs.get(name)
        if value is None:
            if default is HloInstruction._REQUIRED:
                raise self._missing(name)
            return default
        if not isinstance(value, kind):
            raise self._malformed(name, value, f"a {kind.__name__}")
        return value

    def _int(self, name: str, default: Any = _REQUIRED) -> int:
        value = self.attrs.get(name)
        if value is None:
            if default is HloInstruction._REQUIRED:
                raise self._missing(name)
            return default
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise self._malformed(name, value, "an integer")
        return int(value)

    def _bool(self, name: str, default: bool) -> bool:
        value = self.attrs.get(name)
        if value is None:
            return default
        if not isinstance(value, bool | np.bool_):
            raise self._malformed(name, value, "true or false")
        return bool(value)

    def _ints(self, name: str, default: Any = ()) -> tuple[int, ...]:
        value = self.attrs.get(name)
        if value is None:
            if default is HloInstruction._REQUIRED:
                raise self._missing(name)
            return default
        if not isinstance(value, tuple | list) or not all(
            isinstance(v, int | np.integer) and not isinstance(v, bool) for v in value
        ):
            raise self._malformed(name, value, "a list of integers")
        return tuple(int(v) for v in value)

    def _enum(self, name: str, kind: type[_E], default: Any = _REQUIRED) -> _E:
        value = self.attrs.get(name)
        if value is None:
            if default is HloInstruction._REQUIRED:
                raise self._missing(name)
            return default
        try:
            return kind(str(value))
        except ValueError:
            allowed = ", ".join(str(v.value) for v in kind)
            raise self._malformed(name, str(value), f"one of {allowed}") from None

    def _computation(self, name: str, default: Any = _REQUIRED) -> HloComputation:
        value = self.attrs.get(name)
        if value is None:
            if default is HloInstruction._REQUIRED:
                raise self._missing(name)
            return default
        if not isinstance(value, _computation_class()):
            raise self._malformed(name, value, "a computation")
        return value

    def _computations(self, name: str) -> tuple[HloComputation, ...]:
        value = self.attrs.get(name)
        if value is None:
            return ()
        comp = _computation_class()
        if not isinstance(value, tuple | list) or not all(isinstance(c, comp) for c in value):
            raise self._malformed(name, value, "a list of computations")
        return tuple(value)

    @property
    def calls(self) -> HloComputation:
        """The computation a fusion (or an async start) runs (`calls=`)."""
        return self._computation("calls")

    @property
    def calls_or_none(self) -> HloComputation | None:
        value = self.attrs.get("calls")  # fusion asks this most: the usual case first
        if value is None or value.__class__ is _computation_class():
            return value
        return self._computation("calls", None)  # the error naming the malformed value

    @property
    def custom_call_computations(self) -> tuple[HloComputation, ...]:
        """A custom call's `called_computations={...}`, () when absent."""
        return self._computations("called_computations")

    @property
    def select_computation(self) -> HloComputation:
        """select-and-scatter's `select=`."""
        return self._computation("select")

    @property
    def scatter_computation(self) -> HloComputation:
        """select-and-scatter's `scatter=`."""
        return self._computation("scatter")

    @property
    def window(self) -> A.Window:
        """A reduce-window's, select-and-scatter's or convolution's `window={...}`."""
        return self._typed("window", A.Window, self._scalar_window())

    @property
    def window_or_none(self) -> A.Window | None:
        """`window=`, None when absent (a convolution without spatial dimensions)."""
        return self._typed("window", A.Window, self._scalar_window(None))

    def _scalar_window(self, default: Any = _REQUIRED) -> Any:
        """The empty window of a reduce-window or select-and-scatter over a scalar, whose
        `window=` XLA leaves out of the text; `default` for any other instruction."""
        if self.opcode not in (Opcode.REDUCE_WINDOW, Opcode.SELECT_AND_SCATTER):
            return default
        first = self.operands[0].shape if self.operands else None
        return A.Window(()) if first is not None and first.is_array and not first.dims else default

    @property
    def dim_labels(self) -> A.ConvDimLabels:
        """A convolution's dimension numbers (`dim_labels=b01f_01io->b01f`)."""
        return self._typed("dim_labels", A.ConvDimLabels)

    @property
    def dim_labels_or_none(self) -> A.ConvDimLabels | None:
        return self._typed("dim_labels", A.ConvDimLabels, None)

    @property
    def feature_group_count(self) -> int:
        return self._int("feature_group_count", 1)

    @property
    def batch_group_count(self) -> int:
        return self._int("batch_group_count", 1)

    @property
    def dot_dimension_numbers(self) -> A.DotDimensionNumbers:
        """A dot's batch and contracting dimensions (absent lists are empty)."""
        return A.DotDimensionNumbers(
            self._ints("lhs_batch_dims"),
            self._ints("rhs_batch_dims"),
            self._ints("lhs_contracting_dims"),
            self._ints("rhs_contracting_dims"),
        )

    @property
    def lhs_ragged_dims(self) -> tuple[int, ...]:
        """A ragged-dot's ragged dimension of the lhs."""
        return self._ints("lhs_ragged_dims")

    @property
    def rhs_group_dims(self) -> tuple[int, ...]:
        """A ragged-dot's group dimension of the rhs."""
        return self._ints("rhs_group_dims")

    @property
    def operand_precision(self) -> tuple[str, ...]:
        """A dot's or convolution's `operand_precision={...}`, () when absent."""
        return tuple(str(p) for p in self.attrs.get("operand_precision") or ())

    def _index_vector_dim(self, indices: int) -> int:
        if len(self.operands) <= indices:
            return self._int("index_vector_dim")
        return self._int("index_vector_dim", self.operands[indices].shape.rank)

    @property
    def gather_dimension_numbers(self) -> A.GatherDimensionNumbers:
        """A gather's dimension numbers (absent lists are empty)."""
        return A.GatherDimensionNumbers(
            self._ints("offset_dims"),
            self._ints("collapsed_slice_dims"),
            self._ints("start_index_map"),
            self._ints("operand_batching_dims"),
            self._ints("start_indices_batching_dims"),
            self._index_vector_dim(1),
            self._ints("slice_sizes"),
        )

    @property
    def scatter_dimension_numbers(self) -> A.ScatterDimensionNumbers:
        """A scatter's dimension numbers (absent lists are empty)."""
        return A.ScatterDimensionNumbers(
            self._ints("update_window_dims"),
            self._ints("inserted_window_dims"),
            self._ints("scatter_dims_to_operand_dims"),
            self._ints("input_batching_dims"),
            self._ints("scatter_indices_batching_dims"),
            self._index_vector_dim(len(self.operands) // 2),
        )

    @property
    def indices_are_sorted(self) -> bool:
        return self._bool("indices_are_sorted", False)

    @property
    def unique_indices(self) -> bool:
        return self._bool("unique_indices", False)

    @property
    def padding_config(self) -> A.Padding:
        """A pad's `padding=` (low_high_interior per dimension)."""
        return self._typed("padding", A.Padding)

    @property
    def slice_spec(self) -> A.SliceSpec:
        """A slice's `slice={[start:limit:stride], ...}`."""
        return self._typed("slice", A.SliceSpec)

    @property
    def dynamic_slice_sizes(self) -> tuple[int, ...]:
        return self._ints("dynamic_slice_sizes", HloInstruction._REQUIRED)

    @property
    def iota_dimension(self) -> int:
        return self._int("iota_dimension")

    @property
    def exponent_bits(self) -> int:
        """reduce-precision's `exponent_bits=`."""
        return self._int("exponent_bits")

    @property
    def mantissa_bits(self) -> int:
        """reduce-precision's `mantissa_bits=`."""
        return self._int("mantissa_bits")

    @property
    def fft_type(self) -> A.FftType:
        return self._enum("fft_type", A.FftType, A.FftType.FFT)

    @property
    def fft_length(self) -> tuple[int, ...]:
        return self._ints("fft_length")

    @property
    def rng_algorithm(self) -> A.RngAlgorithm:
        """rng-bit-generator's `algorithm=` (rng_default when absent)."""
        return self._enum("algorithm", A.RngAlgorithm, A.RngAlgorithm.DEFAULT)

    @property
    def rng_distribution(self) -> A.RngDistribution:
        return self._enum("distribution", A.RngDistribution)

    @property
    def rng_delta(self) -> int:
        """rng-get-and-update-state's `delta=`."""
        return self._int("delta", 0)

    @property
    def topk_k(self) -> int:
        return self._int("k")

    @property
    def topk_largest(self) -> bool:
        return self._bool("largest", True)

    @property
    def lower(self) -> bool:
        """cholesky's / triangular-solve's `lower=`."""
        return self._bool("lower", False)

    @property
    def left_side(self) -> bool:
        return self._bool("left_side", False)

    @property
    def unit_diagonal(self) -> bool:
        return self._bool("unit_diagonal", False)

    @property
    def transpose_a(self) -> A.TriangularSolveTranspose:
        return self._enum(
            "transpose_a", A.TriangularSolveTranspose, A.TriangularSolveTranspose.NO_TRANSPOSE
        )

    @property
    def epsilon(self) -> float:
        """A batch-norm's `epsilon=` (0 when absent)."""
        value = self.attrs.get("epsilon")
        if value is None:
            return 0.0
        if isinstance(value, bool) or not isinstance(value, int | float | np.number):
            raise self._malformed("epsilon", value, "a number")
        return float(value)

    @property
    def feature_index(self) -> int:
        """A batch-norm's `feature_index=`."""
        return self._int("feature_index")

    @property
    def fusion_kind(self) -> A.FusionKind | None:
        """A fusion's `kind=`, None when absent."""
        return self._enum("kind", A.FusionKind, None)

    @property
    def custom_call_target(self) -> str | None:
        """A custom call's target name, None for other instructions."""
        return self._typed("custom_call_target", str, None)

    @property
    def custom_call_api_version(self) -> A.CustomCallApiVersion | None:
        """A custom call's `api_version=`, None when absent (XLA then reads
        API_VERSION_ORIGINAL)."""
        return self._enum("api_version", A.CustomCallApiVersion, None)

    @property
    def backend_config(self) -> A.BackendConfig | None:
        """The opaque `backend_config=` (a custom call's `opaque`), None when absent."""
        value = self.attrs.get("backend_config")
        if value is None or isinstance(value, A.BackendConfig):
            return value
        if isinstance(value, str):  # a builder may pass the text itself
            return A.BackendConfig(value)
        raise self._malformed("backend_config", value, "a string")

    @property
    def output_to_operand_aliasing(self) -> tuple[A.OutputOperandAlias, ...]:
        value = self.attrs.get("output_to_operand_aliasing") or ()
        if not all(isinstance(a, A.OutputOperandAlias) for a in value):
            raise self._malformed("output_to_operand_aliasing", value, "a list of aliases")
        return tuple(value)

    @property
    def operand_layout_constraints(self) -> tuple[Shape, ...]:
        value = self.attrs.get("operand_layout_constraints") or ()
        if not all(isinstance(s, Shape) for s in value):
            raise self._malformed("operand_layout_constraints", value, "a list of shapes")
        return tuple(value)

    @property
    def sharding(self) -> HloSharding | None:
        """The `sharding={...}` the instruction was given, None when absent."""
        return self._typed("sharding", A.Sharding, None)

    @property
    def frontend_attributes(self) -> A.FrontendAttributes:
        """The `frontend_attributes={...}` (empty when absent)."""
        return self._typed("frontend_attributes", A.FrontendAttributes, _NO_FRONTEND_ATTRIBUTES)

    @property
    def channel_id(self) -> int | None:
        """A collective's or send/recv's `channel_id=`, None when absent."""
        return self._int("channel_id", None)

    @property
    def replica_groups(self) -> A.ReplicaGroups | None:
        """A collective's `replica_groups=`, None when absent (every device, one group)."""
        return self._typed("replica_groups", A.ReplicaGroups, None)

    @property
    def use_global_device_ids(self) -> bool:
        return self._bool("use_global_device_ids", False)

    @property
    def source_target_pairs(self) -> tuple[tuple[int, int], ...]:
        """A collective-permute's `source_target_pairs={{0,1},...}`, () when absent."""
        pairs = self.attrs.get("source_target_pairs") or ()
        if not all(isinstance(p, tuple | list) and len(p) == 2 for p in pairs):
            raise self._malformed("source_target_pairs", pairs, "a list of {source,target} pairs")
        return tuple((int(a), int(b)) for a, b in pairs)

    @property
    def permute_slice_sizes(self) -> tuple[tuple[int, ...], ...]:
        """An in-place collective-permute's `slice_sizes={{...},...}`, () when absent."""
        value = self.attrs.get("slice_sizes") or ()
        if not all(isinstance(v, tuple | list) for v in value):
            raise self._malformed("slice_sizes", value, "a list of size lists")
        return tuple(tuple(int(n) for n in v) for v in value)

    @property
    def is_root(self) -> bool:
        return self.parent is not None and self.parent.root is self

    @property
    def has_side_effect(self) -> bool:
        if self.opcode.has_side_effect:
            return True
        if self.opcode is Opcode.CUSTOM_CALL:
            return bool(self.attrs.get("custom_call_has_side_effect", False))
        return False

    @property
    def is_elided_constant(self) -> bool:
        """A constant printed as `constant({...})`: its value was not in the text."""
        return self.opcode is Opcode.CONSTANT and self.literal is None

    @property
    def user_count(self) -> int:
        return len(self.users)

    # -- edits (each keeps the use-lists current) -----------------------------------------
    def set_operands(self, operands) -> None:
        """Make `operands` this instruction's operands."""
        operands = list(operands)
        if self.parent is not None:
            # membership in dicts (identity hashes), not lists: a fusion gains its operands
            # one at a time, and list scans made that quadratic in its operand count
            old, new = dict.fromkeys(self.operands), dict.fromkeys(operands)
            for dep in old:
                if dep not in new:
                    dep.users.remove(self)
            for dep in new:
                if dep not in old:
                    dep.users.append(self)
        self.operands = operands

    def replace_operand(self, old: HloInstruction, new: HloInstruction) -> None:
        """Every read of `old` by this instruction reads `new` instead."""
        if old is new or old not in self.operands:
            return
        self.operands = [new if op is old else op for op in self.operands]
        if self.parent is not None:
            old.users.remove(self)
            if self not in new.users:
                new.users.append(self)

    def replace_operand_at(self, number: int, new: HloInstruction) -> None:
        """Operand `number` becomes `new`."""
        operands = list(self.operands)
        operands[number] = new
        self.set_operands(operands)

    def replace_all_uses_with(self, new: HloInstruction, keep=()) -> None:
        """Every user of this instruction except `new` and those in `keep` reads `new`
        instead, and every instruction ordered after this one is ordered after `new` (the
        root is the computation's business: HloComputation.replace_all_uses)."""
        if new is self:
            return
        moved = [u for u in self.users if u is not new and u not in keep]
        if moved:
            stay = [u for u in self.users if u is new or u in keep]
            self.users = stay
            targets = new.users
            known = set(map(id, targets))
            for user in moved:
                user.operands = [new if op is self else op for op in user.operands]
                if id(user) not in known:
                    targets.append(user)
        for succ in [s for s in self.control_successors if s is not new]:
            succ.remove_control_predecessor(self)
            succ.add_control_predecessor(new)

    def add_control_predecessor(self, pred: HloInstruction) -> None:
        """`pred` must run before this instruction."""
        if pred in self.control_predecessors:
            return
        self.control_predecessors.append(pred)
        if self.parent is not None:
            pred.control_successors.append(self)

    def remove_control_predecessor(self, pred: HloInstruction) -> None:
        self.control_predecessors.remove(pred)
        if self.parent is not None:
            pred.control_successors.remove(self)

    def set_control_predecessors(self, preds) -> None:
        for pred in list(self.control_predecessors):
            self.remove_control_predecessor(pred)
        for pred in preds:
            self.add_control_predecessor(pred)

    def _attach(self) -> None:
        """List this instruction in its operands' and control predecessors' use-lists (it has
        just joined a computation)."""
        for dep in self.operands:
            users = dep.users
            if not users or users[-1] is not self:  # an operand read twice is listed once
                users.append(self)
        if self.control_predecessors:
            for pred in self.control_predecessors:
                pred.control_successors.append(self)

    def _detach(self) -> None:
        """The reverse of _attach (it is leaving its computation)."""
        for dep in dict.fromkeys(self.operands):
            dep.users.remove(self)
        for pred in self.control_predecessors:
            pred.control_successors.remove(self)

    def to_text(self, **options) -> str:
        """This instruction as one line of HLO text (see xlapy.ir.printer)."""
        from xlapy.ir.printer import print_instruction

        return print_instruction(self, **options)

    def __repr__(self) -> str:
        return f"<HloInstruction {self.name} = {self.shape} {self.opcode.text}>"
