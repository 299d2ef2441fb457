"""Cost analysis: estimated floating-point operations, transcendental evaluations and bytes
accessed of one run of a module (XLA's HloCostAnalysis, simplified).

Each opcode's cost is a rule in COST_RULES (instruction -> Cost of the instruction itself);
opcodes without a rule cost nothing beyond their bytes. Bytes accessed are the operand and
result array bytes of every instruction that touches memory (not parameters, constants,
tuples, get-tuple-element or bitcasts). Called computations are added in: a reduce's
reducer once per reduced element, a map's computation once per output element, a fusion,
call or custom-call's body once, a while loop's condition and body once (the trip count is
unknown), a conditional's most expensive branch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from xlapy.errors import VerifierError
from xlapy.ir.computation import HloComputation
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.module import HloModule
from xlapy.ir.opcodes import Category, Opcode
from xlapy.ir.shapes import Shape


@dataclass(frozen=True, slots=True)
class Cost:
    """Estimated work: floating-point ops, transcendental evaluations, bytes accessed."""

    flops: float = 0.0
    transcendentals: float = 0.0
    bytes_accessed: float = 0.0

    def __add__(self, other: Cost) -> Cost:
        return Cost(
            self.flops + other.flops,
            self.transcendentals + other.transcendentals,
            self.bytes_accessed + other.bytes_accessed,
        )

    def scaled(self, factor: float) -> Cost:
        return Cost(
            self.flops * factor, self.transcendentals * factor, self.bytes_accessed * factor
        )

    def as_dict(self) -> dict[str, float]:
        """XLA's key names: "flops", "transcendentals", "bytes accessed"."""
        return {
            "flops": self.flops,
            "transcendentals": self.transcendentals,
            "bytes accessed": self.bytes_accessed,
        }


def _elements(shape: Shape) -> int:
    return sum(
        s.num_elements for _, s in shape.leaves() if s.is_array and not s.is_unbounded_dynamic
    )


def _bytes(shape: Shape) -> int:
    return sum(s.byte_size for _, s in shape.leaves() if s.is_array and not s.is_unbounded_dynamic)


NO_MEMORY = {
    Opcode.PARAMETER, Opcode.CONSTANT, Opcode.TUPLE, Opcode.GET_TUPLE_ELEMENT, Opcode.BITCAST,
    Opcode.AFTER_ALL, Opcode.ADD_DEPENDENCY, Opcode.OPTIMIZATION_BARRIER,
}  # fmt: skip

CostRule = Callable[[HloInstruction], Cost]
COST_RULES: dict[Opcode, CostRule] = {}


def _elementwise(instr: HloInstruction) -> Cost:
    n = _elements(instr.shape)
    if instr.opcode.is_transcendental:
        return Cost(transcendentals=n)
    return Cost(flops=n)


def _dot(instr: HloInstruction) -> Cost:
    lhs = instr.operands[0].shape
    contracted = math.prod(lhs.dims[d] for d in instr.dot_dimension_numbers.lhs_contracting)
    return Cost(flops=2 * _elements(instr.shape) * contracted)


def _convolution(instr: HloInstruction) -> Cost:
    kernel = instr.operands[1].shape
    labels = instr.dim_labels_or_none
    if labels is None:
        return Cost(flops=2 * _elements(instr.shape))
    window = math.prod(kernel.dims[d] for d in labels.kernel_spatial)
    in_features = kernel.dims[labels.kernel_input_feature]
    return Cost(flops=2 * _elements(instr.shape) * window * in_features)


def _fft(instr: HloInstruction) -> Cost:
    lengths = instr.fft_length
    n = max(1, math.prod(lengths))
    batch = max(1, _elements(instr.operands[0].shape) // n)
    return Cost(flops=5 * batch * n * max(1.0, math.log2(n)))


def _cholesky(instr: HloInstruction) -> Cost:
    n = instr.shape.dims[-1] if instr.shape.dims else 1
    return Cost(flops=_elements(instr.shape) // max(1, n * n) * n**3 / 3)


def _triangular_solve(instr: HloInstruction) -> Cost:
    a = instr.operands[0].shape
    n = a.dims[-1] if a.dims else 1
    return Cost(flops=_elements(instr.shape) * n)


def _sort(instr: HloInstruction) -> Cost:
    n = _elements(instr.operands[0].shape)
    return Cost(flops=n * max(1.0, math.log2(max(n, 2))))


for _op in Opcode:
    if _op.category in (Category.UNARY, Category.BINARY, Category.TERNARY):
        COST_RULES[_op] = _elementwise
COST_RULES.update(
    {
        Opcode.DOT: _dot,
        Opcode.CONVOLUTION: _convolution,
        Opcode.FFT: _fft,
        Opcode.CHOLESKY: _cholesky,
        Opcode.TRIANGULAR_SOLVE: _triangular_solve,
        Opcode.SORT: _sort,
    }
)


def instruction_cost(instr: HloInstruction) -> Cost:
    """The cost of `instr` including the computations it calls."""
    rule = COST_RULES.get(instr.opcode)
    cost = rule(instr) if rule is not None else Cost()
    if instr.opcode not in NO_MEMORY:
        moved = _bytes(instr.shape) + sum(_bytes(op.shape) for op in instr.operands)
        cost = cost + Cost(bytes_accessed=moved)
    return cost + _called_cost(instr)


def _called_cost(instr: HloInstruction) -> Cost:
    called = list(instr.called_computations())
    if not called:
        return Cost()
    op = instr.opcode
    if op in (Opcode.REDUCE, Opcode.REDUCE_WINDOW, Opcode.SELECT_AND_SCATTER, Opcode.SCATTER):
        per_call = _compute_only(called[0])
        applications = sum(
            _elements(o.shape) for o in instr.operands[: max(1, len(instr.operands) // 2)]
        )
        return per_call.scaled(applications)
    if op is Opcode.MAP:
        return _compute_only(called[0]).scaled(_elements(instr.shape))
    if op is Opcode.SORT:
        return Cost()
    if op is Opcode.CONDITIONAL:
        costs = [computation_cost(c) for c in called]
        return max(costs, key=lambda c: c.flops + c.transcendentals)
    if op is Opcode.FUSION:
        return _compute_only(called[0])
    total = Cost()
    for comp in called:
        total = total + computation_cost(comp)
    return total


def _compute_only(comp: HloComputation) -> Cost:
    cost = computation_cost(comp)
    return Cost(cost.flops, cost.transcendentals, 0.0)


def computation_cost(comp: HloComputation) -> Cost:
    """The summed cost of every instruction of `comp`."""
    total = Cost()
    for instr in comp.instructions:
        total = total + instruction_cost(instr)
    return total


def analyze_cost(module: HloModule) -> Cost:
    """The cost of one run of `module` (its entry computation)."""
    if module.entry is None:
        raise VerifierError(f"module {module.name}: has no entry computation")
    return computation_cost(module.entry)
