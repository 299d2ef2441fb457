"""The HLO opcode table: the one list of operations that every stage reads.

Each row gives the text name, the operand count (VARIADIC when it varies), a category, and
the op's properties (`Prop`): side effects (never removed, merged or reordered across other
side-effecting ops), commutative operands, transcendental or otherwise expensive arithmetic,
forwarding of operand 0's value, and the context its called computations run in (XLA's
CallContext: in sequence, in the caller's schedule, or embedded in the op, run per element).
The parser, printer, verifier, shape inference, builder, passes, analyses and backends look
these up here; none keeps a set of its own (tests/test_architecture.py checks).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

VARIADIC = -1


class Category(enum.Enum):
    UNARY = "elementwise unary"
    BINARY = "elementwise binary"
    TERNARY = "elementwise ternary"
    SHAPE = "shape and data movement"
    REDUCTION = "reduction"
    CONTRACTION = "dot and convolution"
    INDEXING = "gather, scatter and dynamic slicing"
    SORTING = "sorting"
    CONTROL = "control flow and calls"
    RNG = "random numbers"
    COLLECTIVE = "collectives"
    IO = "infeed, outfeed, send and recv"
    ASYNC = "async wrappers"
    LINALG = "linear algebra"
    CONSTANT = "constants and parameters"
    TUPLE = "tuples"
    OTHER = "other"


class Prop(enum.Flag):
    """Properties of an opcode, beyond its category."""

    NONE = 0
    SIDE_EFFECT = enum.auto()
    COMMUTATIVE = enum.auto()  # op(a, b) == op(b, a); compare is not (its direction)
    TRANSCENDENTAL = enum.auto()  # counted as transcendentals by cost analysis
    EXPENSIVE = enum.auto()  # not worth duplicating into several fusions
    FORWARDS = enum.auto()  # every position holds operand 0's value at that position
    SEQUENTIAL_CALLS = enum.auto()  # called computations run in sequence (while, call)
    EMBEDDED_CALLS = enum.auto()  # called computations are applied inside the op (reduce)
    CONTROL_FLOW = enum.auto()  # its result is what a loop or a branch left (a phi)


class CallContext(enum.Enum):
    """Where an opcode's called computations run (XLA's CallContext)."""

    NONE = "none"
    SEQUENTIAL = "sequential"  # as part of the program's schedule: while, conditional, call
    EMBEDDED = "embedded"  # inside the op, per element or per group: reduce, sort, fusion


@dataclass(frozen=True, slots=True)
class OpInfo:
    text: str
    arity: int
    category: Category
    props: Prop = Prop.NONE


def _op(text, arity, category, props=Prop.NONE) -> OpInfo:
    return OpInfo(text, arity, category, props)


U, B, T = Category.UNARY, Category.BINARY, Category.TERNARY
SH, RED, CON, IDX = Category.SHAPE, Category.REDUCTION, Category.CONTRACTION, Category.INDEXING
CTL, COL, IO = Category.CONTROL, Category.COLLECTIVE, Category.IO
ASY, LIN, CST, TUP, OTH = (
    Category.ASYNC,
    Category.LINALG,
    Category.CONSTANT,
    Category.TUPLE,
    Category.OTHER,
)
V = VARIADIC
SIDE, COMM, FWD = Prop.SIDE_EFFECT, Prop.COMMUTATIVE, Prop.FORWARDS
TRANS = Prop.TRANSCENDENTAL | Prop.EXPENSIVE
SEQ, EMB, FLOW = Prop.SEQUENTIAL_CALLS, Prop.EMBEDDED_CALLS, Prop.CONTROL_FLOW


class Opcode(enum.Enum):
    """Every HLO opcode. `Opcode.from_text("add")`; `op.arity`, `op.category`, `op.text`,
    `op.has_side_effect`, `op.is_elementwise`, `op.is_commutative`, `op.is_transcendental`,
    `op.is_expensive`, `op.forwards_operand`, `op.call_context`, `op.is_control_flow`."""

    # Plain per-member attributes copied from the row's OpInfo once, below the class: passes
    # read them in their inner loops, where an Enum property (a `value` lookup per call) cost
    # a measurable share of compile time. Members are singletons, so they hash by identity
    # (Enum's default hashes the name in Python).
    text: str
    arity: int
    category: Category
    has_side_effect: bool
    is_elementwise: bool
    is_commutative: bool
    is_transcendental: bool
    is_expensive: bool
    forwards_operand: bool
    call_context: CallContext
    is_control_flow: bool
    __hash__ = object.__hash__

    # elementwise unary
    ABS = _op("abs", 1, U)
    CBRT = _op("cbrt", 1, U, TRANS)
    CEIL = _op("ceil", 1, U)
    CLZ = _op("count-leading-zeros", 1, U)
    CONVERT = _op("convert", 1, U)
    BITCAST_CONVERT = _op("bitcast-convert", 1, U)
    COPY = _op("copy", 1, U)
    COS = _op("cosine", 1, U, TRANS)
    ERF = _op("erf", 1, U, TRANS)
    EXP = _op("exponential", 1, U, TRANS)
    EXPM1 = _op("exponential-minus-one", 1, U, TRANS)
    FLOOR = _op("floor", 1, U)
    IMAG = _op("imag", 1, U)
    IS_FINITE = _op("is-finite", 1, U)
    LOG = _op("log", 1, U, TRANS)
    LOG1P = _op("log-plus-one", 1, U, TRANS)
    LOGISTIC = _op("logistic", 1, U, TRANS)
    NEGATE = _op("negate", 1, U)
    NOT = _op("not", 1, U)
    POPCNT = _op("popcnt", 1, U)
    REAL = _op("real", 1, U)
    REDUCE_PRECISION = _op("reduce-precision", 1, U)
    ROUND_AFZ = _op("round-nearest-afz", 1, U)
    ROUND_EVEN = _op("round-nearest-even", 1, U)
    RSQRT = _op("rsqrt", 1, U, TRANS)
    SIGN = _op("sign", 1, U)
    SIN = _op("sine", 1, U, TRANS)
    SQRT = _op("sqrt", 1, U, TRANS)
    TAN = _op("tan", 1, U, TRANS)
    TANH = _op("tanh", 1, U, TRANS)
    # elementwise binary
    ADD = _op("add", 2, B, COMM)
    AND = _op("and", 2, B, COMM)
    ATAN2 = _op("atan2", 2, B, TRANS)
    COMPARE = _op("compare", 2, B)
    COMPLEX = _op("complex", 2, B)
    DIVIDE = _op("divide", 2, B, Prop.EXPENSIVE)
    MAXIMUM = _op("maximum", 2, B, COMM)
    MINIMUM = _op("minimum", 2, B, COMM)
    MULTIPLY = _op("multiply", 2, B, COMM)
    OR = _op("or", 2, B, COMM)
    POWER = _op("power", 2, B, TRANS)
    REMAINDER = _op("remainder", 2, B, Prop.EXPENSIVE)
    SHIFT_LEFT = _op("shift-left", 2, B)
    SHIFT_RIGHT_ARITHMETIC = _op("shift-right-arithmetic", 2, B)
    SHIFT_RIGHT_LOGICAL = _op("shift-right-logical", 2, B)
    STOCHASTIC_CONVERT = _op("stochastic-convert", 2, B)
    SUBTRACT = _op("subtract", 2, B)
    XOR = _op("xor", 2, B, COMM)
    # elementwise ternary
    CLAMP = _op("clamp", 3, T)
    SELECT = _op("select", 3, T)
    # shape and data movement
    BITCAST = _op("bitcast", 1, SH, FWD)
    BROADCAST = _op("broadcast", 1, SH)
    CONCATENATE = _op("concatenate", V, SH)
    DYNAMIC_RESHAPE = _op("dynamic-reshape", V, SH)
    GET_DIMENSION_SIZE = _op("get-dimension-size", 1, SH)
    IOTA = _op("iota", 0, SH)
    PAD = _op("pad", 2, SH)
    RESHAPE = _op("reshape", 1, SH)
    REVERSE = _op("reverse", 1, SH)
    SET_DIMENSION_SIZE = _op("set-dimension-size", 2, SH)
    SLICE = _op("slice", 1, SH)
    TRANSPOSE = _op("transpose", 1, SH)
    # reductions
    REDUCE = _op("reduce", V, RED, EMB)
    REDUCE_WINDOW = _op("reduce-window", V, RED, EMB)
    SELECT_AND_SCATTER = _op("select-and-scatter", 3, RED, EMB)
    # contractions
    CONVOLUTION = _op("convolution", 2, CON)
    DOT = _op("dot", 2, CON)
    RAGGED_DOT = _op("ragged-dot", 3, CON)
    SCALED_DOT = _op("scaled-dot", 4, CON)
    FFT = _op("fft", 1, CON)
    # indexing
    DYNAMIC_SLICE = _op("dynamic-slice", V, IDX)
    DYNAMIC_UPDATE_SLICE = _op("dynamic-update-slice", V, IDX)
    GATHER = _op("gather", 2, IDX)
    SCATTER = _op("scatter", V, IDX, EMB)
    # sorting
    SORT = _op("sort", V, Category.SORTING, EMB)
    TOPK = _op("topk", 1, Category.SORTING)
    # control flow and calls
    CALL = _op("call", V, CTL, SEQ)
    CONDITIONAL = _op("conditional", V, CTL, SEQ | FLOW)
    CUSTOM_CALL = _op("custom-call", V, CTL, EMB)
    FUSION = _op("fusion", V, CTL, EMB)
    MAP = _op("map", V, CTL, EMB)
    WHILE = _op("while", 1, CTL, SEQ | FLOW)
    SCAN = _op("scan", V, CTL, EMB)
    # random numbers
    RNG = _op("rng", V, Category.RNG, SIDE)
    RNG_BIT_GENERATOR = _op("rng-bit-generator", 1, Category.RNG)
    RNG_GET_AND_UPDATE_STATE = _op("rng-get-and-update-state", 0, Category.RNG, SIDE)
    # collectives
    ALL_GATHER = _op("all-gather", V, COL)
    ALL_GATHER_START = _op("all-gather-start", V, COL)
    ALL_GATHER_DONE = _op("all-gather-done", 1, COL)
    ALL_REDUCE = _op("all-reduce", V, COL, EMB)
    ALL_REDUCE_START = _op("all-reduce-start", V, COL, EMB)
    ALL_REDUCE_DONE = _op("all-reduce-done", 1, COL)
    ALL_TO_ALL = _op("all-to-all", V, COL)
    RAGGED_ALL_TO_ALL = _op("ragged-all-to-all", 6, COL)
    COLLECTIVE_BROADCAST = _op("collective-broadcast", V, COL)
    COLLECTIVE_PERMUTE = _op("collective-permute", V, COL)
    COLLECTIVE_PERMUTE_START = _op("collective-permute-start", V, COL)
    COLLECTIVE_PERMUTE_DONE = _op("collective-permute-done", 1, COL)
    PARTITION_ID = _op("partition-id", 0, COL)
    REDUCE_SCATTER = _op("reduce-scatter", V, COL, EMB)
    REPLICA_ID = _op("replica-id", 0, COL)
    # infeed, outfeed, send, recv
    INFEED = _op("infeed", 1, IO, SIDE)
    OUTFEED = _op("outfeed", 2, IO, SIDE)
    RECV = _op("recv", 1, IO, SIDE)
    RECV_DONE = _op("recv-done", 1, IO, SIDE)
    SEND = _op("send", 2, IO, SIDE)
    SEND_DONE = _op("send-done", 1, IO, SIDE)
    # async wrappers
    ASYNC_START = _op("async-start", V, ASY)
    ASYNC_UPDATE = _op("async-update", 1, ASY)
    ASYNC_DONE = _op("async-done", 1, ASY)
    COPY_START = _op("copy-start", 1, ASY)
    COPY_DONE = _op("copy-done", 1, ASY)
    # linear algebra
    CHOLESKY = _op("cholesky", 1, LIN)
    TRIANGULAR_SOLVE = _op("triangular-solve", 2, LIN)
    BATCH_NORM_GRAD = _op("batch-norm-grad", 5, LIN)
    BATCH_NORM_INFERENCE = _op("batch-norm-inference", 5, LIN)
    BATCH_NORM_TRAINING = _op("batch-norm-training", 3, LIN)
    # constants, parameters, tuples
    CONSTANT = _op("constant", 0, CST)
    PARAMETER = _op("parameter", 0, CST)
    TUPLE = _op("tuple", V, TUP)
    GET_TUPLE_ELEMENT = _op("get-tuple-element", 1, TUP, FWD)
    # other
    ADD_DEPENDENCY = _op("add-dependency", 2, OTH, FWD)
    AFTER_ALL = _op("after-all", V, OTH)
    DOMAIN = _op("domain", 1, OTH, FWD)
    OPTIMIZATION_BARRIER = _op("opt-barrier", 1, OTH, FWD)

    @staticmethod
    def from_text(text: str) -> Opcode:
        """The opcode spelled `text`; KeyError if there is none."""
        return _BY_TEXT[text]

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"Opcode.{self.name}"


_ELEMENTWISE = (Category.UNARY, Category.BINARY, Category.TERNARY)
for _member in Opcode:
    _info: OpInfo = _member.value
    _member.text = _info.text
    _member.arity = _info.arity
    _member.category = _info.category
    _member.has_side_effect = bool(_info.props & Prop.SIDE_EFFECT)
    _member.is_elementwise = _info.category in _ELEMENTWISE
    _member.is_commutative = bool(_info.props & Prop.COMMUTATIVE)
    _member.is_transcendental = bool(_info.props & Prop.TRANSCENDENTAL)
    _member.is_expensive = bool(_info.props & Prop.EXPENSIVE)
    _member.forwards_operand = bool(_info.props & Prop.FORWARDS)
    _member.is_control_flow = bool(_info.props & Prop.CONTROL_FLOW)
    _member.call_context = (
        CallContext.SEQUENTIAL
        if _info.props & Prop.SEQUENTIAL_CALLS
        else CallContext.EMBEDDED
        if _info.props & Prop.EMBEDDED_CALLS
        else CallContext.NONE
    )
del _member, _info

_BY_TEXT = {op.text: op for op in Opcode}


def has_async_shorthand(op: Opcode) -> bool:
    """Whether async-start/update/done wrapping `op` are written `<op>-start` and so on:
    any op but the async wrappers, ops with async opcodes of their own (all-reduce-start),
    parameters and constants."""
    return (
        op.category is not Category.ASYNC
        and op.text + "-start" not in _BY_TEXT
        and op not in (Opcode.PARAMETER, Opcode.CONSTANT)
    )


del U, B, T, SH, RED, CON, IDX, CTL, COL, IO, ASY, LIN, CST, TUP, OTH, V
del SIDE, COMM, FWD, TRANS, SEQ, EMB, FLOW
