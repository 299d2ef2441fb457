"""Expanders: rewrite ops the CPU backend does not implement into ops it does.

  batchnorm-expander  batch-norm-training / -inference / -grad into elementwise ops,
                      broadcasts and add-reductions over the non-feature dimensions
                      (variance as the mean of squared deviations, the stabler form)
  logistic-expander   logistic(x) -> 1 / (1 + exp(-x)), as XLA's CPU pipeline does
  dot-upcast          a dot of bf16/f16 operands or result -> converts around an f32 dot, as
                      XLA's CPU pipeline does (BLAS has no bf16 gemm; the converts fuse into
                      the operands' producers and the result's consumers). The same numbers:
                      a low-precision dot accumulates in f32 and rounds once at the end, and
                      widening bf16/f16 to f32 is exact

Everything else stays: cholesky and triangular-solve are library calls on the CPU, rng and
rng-bit-generator have interpreter and backend rules, and compares in total order are left
to the code generator. Each expander computes in the operand's element type, as XLA does.
"""

from __future__ import annotations

from xlapy.ir.computation import HloComputation
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.literal import Literal
from xlapy.ir.module import HloModule
from xlapy.ir.names import NameUniquer
from xlapy.ir.opcodes import Opcode
from xlapy.ir.shapes import Layout, Shape
from xlapy.ir.types import PrimitiveType
from xlapy.passes.hlo_edit import Editor, reachable_computations
from xlapy.passes.pass_base import HloPass, register_pass

Op = Opcode


class _Emitter:
    """Builds instructions just before `anchor`, with default layouts when the module uses
    layouts, and scalar add reducers shared per element type."""

    def __init__(self, module: HloModule, editor: Editor, anchor: HloInstruction, reducers):
        self.module, self.editor, self.anchor, self.reducers = module, editor, anchor, reducers
        self.layouts = anchor.shape.layout is not None or any(
            o.shape.layout is not None for o in anchor.operands
        )

    def shape(self, et: PrimitiveType, dims) -> Shape:
        layout = Layout.default(len(dims)) if self.layouts and dims else None
        return Shape.array(et, dims, layout)

    def emit(self, opcode, shape, operands=(), attrs=None, literal=None) -> HloInstruction:
        return self.editor.add(
            opcode,
            shape,
            operands,
            attrs,
            before=self.anchor,
            literal=literal,
            name=f"{self.anchor.name}.{opcode.text}",
        )

    def const(self, value, et: PrimitiveType) -> HloInstruction:
        return self.emit(Op.CONSTANT, Shape.scalar(et), literal=Literal.scalar(value, et))

    def binary(self, opcode, a, b) -> HloInstruction:
        return self.emit(opcode, self.shape(a.shape.element_type, a.shape.dims), [a, b])

    def unary(self, opcode, a) -> HloInstruction:
        return self.emit(opcode, self.shape(a.shape.element_type, a.shape.dims), [a])

    def broadcast(self, a, dims, dimensions) -> HloInstruction:
        shape = self.shape(a.shape.element_type, dims)
        return self.emit(Op.BROADCAST, shape, [a], {"dimensions": tuple(dimensions)})

    def full(self, value, like) -> HloInstruction:
        et = like.shape.element_type
        return self.broadcast(self.const(value, et), like.shape.dims, ())

    def sum(self, a, keep: int) -> HloInstruction:
        """Add-reduce `a` over every dimension but `keep`."""
        et = a.shape.element_type
        dims = tuple(d for d in range(a.shape.rank) if d != keep)
        shape = self.shape(et, (a.shape.dims[keep],))
        attrs = {"dimensions": dims, "to_apply": self.reducer(et)}
        return self.emit(Op.REDUCE, shape, [a, self.const(0, et)], attrs)

    def reducer(self, et: PrimitiveType) -> HloComputation:
        if et not in self.reducers:
            namer = self.editor.namer
            scalar = Shape.scalar(et)
            a = HloInstruction(namer.fresh("lhs"), Op.PARAMETER, scalar, parameter_number=0)
            b = HloInstruction(namer.fresh("rhs"), Op.PARAMETER, scalar, parameter_number=1)
            add = HloInstruction(namer.fresh("add"), Op.ADD, scalar, [a, b])
            comp = HloComputation(namer.fresh(f"add_{et.text}"), [a, b, add], add)
            comp.parent = self.module
            self.module.computations.insert(0, comp)
            self.reducers[et] = comp
        return self.reducers[et]


def _per_feature(e: _Emitter, v, x, f) -> HloInstruction:
    return e.broadcast(v, x.shape.dims, (f,))


def _normalize(e: _Emitter, x, mean_b, var_b, scale_b, offset_b, eps) -> HloInstruction:
    centered = e.binary(Op.SUBTRACT, x, mean_b)
    inv_std = e.unary(Op.RSQRT, e.binary(Op.ADD, var_b, eps))
    return e.binary(
        Op.ADD, e.binary(Op.MULTIPLY, e.binary(Op.MULTIPLY, centered, inv_std), scale_b), offset_b
    )


def _expand_training(e: _Emitter, instr: HloInstruction) -> HloInstruction:
    x, scale, offset = instr.operands
    f = instr.feature_index
    et = x.shape.element_type
    count = e.const(x.shape.num_elements // x.shape.dims[f], et)
    n_f = e.broadcast(count, scale.shape.dims, ())
    mean = e.binary(Op.DIVIDE, e.sum(x, f), n_f)
    mean_b = _per_feature(e, mean, x, f)
    centered = e.binary(Op.SUBTRACT, x, mean_b)
    var = e.binary(Op.DIVIDE, e.sum(e.binary(Op.MULTIPLY, centered, centered), f), n_f)
    eps = e.full(instr.epsilon, x)
    y = _normalize(
        e,
        x,
        mean_b,
        _per_feature(e, var, x, f),
        _per_feature(e, scale, x, f),
        _per_feature(e, offset, x, f),
        eps,
    )
    return e.emit(Op.TUPLE, instr.shape, [y, mean, var])


def _expand_inference(e: _Emitter, instr: HloInstruction) -> HloInstruction:
    x, scale, offset, mean, var = instr.operands
    f = instr.feature_index
    eps = e.full(instr.epsilon, x)
    mean_b, var_b, scale_b, offset_b = (
        _per_feature(e, v, x, f) for v in (mean, var, scale, offset)
    )
    return _normalize(e, x, mean_b, var_b, scale_b, offset_b, eps)


def _expand_grad(e: _Emitter, instr: HloInstruction) -> HloInstruction:
    x, scale, mean, var, grad = instr.operands
    f = instr.feature_index
    et = x.shape.element_type
    n_f = e.broadcast(e.const(x.shape.num_elements // x.shape.dims[f], et), scale.shape.dims, ())
    eps_f = e.full(instr.epsilon, var)
    inv_std = e.unary(Op.RSQRT, e.binary(Op.ADD, var, eps_f))
    centered = e.binary(Op.SUBTRACT, x, _per_feature(e, mean, x, f))
    grad_offset = e.sum(grad, f)
    sum_gc = e.sum(e.binary(Op.MULTIPLY, grad, centered), f)
    grad_scale = e.binary(Op.MULTIPLY, sum_gc, inv_std)
    mean_g = e.binary(Op.DIVIDE, grad_offset, n_f)
    mean_gc = e.binary(Op.DIVIDE, sum_gc, n_f)
    coef = e.binary(Op.MULTIPLY, mean_gc, e.binary(Op.MULTIPLY, inv_std, inv_std))
    inner = e.binary(
        Op.SUBTRACT,
        e.binary(Op.SUBTRACT, grad, _per_feature(e, mean_g, x, f)),
        e.binary(Op.MULTIPLY, centered, _per_feature(e, coef, x, f)),
    )
    grad_x = e.binary(
        Op.MULTIPLY, _per_feature(e, e.binary(Op.MULTIPLY, scale, inv_std), x, f), inner
    )
    return e.emit(Op.TUPLE, instr.shape, [grad_x, grad_scale, grad_offset])


def _expand_logistic(e: _Emitter, instr: HloInstruction) -> HloInstruction:
    x = instr.operands[0]
    one = e.full(1, x)
    denominator = e.binary(Op.ADD, one, e.unary(Op.EXP, e.unary(Op.NEGATE, x)))
    return e.binary(Op.DIVIDE, one, denominator)


_NARROW_FLOATS = frozenset({PrimitiveType.BF16, PrimitiveType.F16})
_UPCASTABLE = _NARROW_FLOATS | {PrimitiveType.F32}


def _expand_narrow_dot(e: _Emitter, instr: HloInstruction) -> HloInstruction | None:
    types = [instr.shape.element_type, *(o.shape.element_type for o in instr.operands)]
    if not all(t in _UPCASTABLE for t in types) or not any(t in _NARROW_FLOATS for t in types):
        return None
    f32 = PrimitiveType.F32

    def wide(x: HloInstruction) -> HloInstruction:
        if x.shape.element_type is f32:
            return x
        return e.emit(Op.CONVERT, x.shape.with_element_type(f32), [x])

    operands = [wide(o) for o in instr.operands]
    dot = e.emit(Op.DOT, instr.shape.with_element_type(f32), operands, dict(instr.attrs))
    if instr.shape.element_type is f32:
        return dot
    return e.emit(Op.CONVERT, instr.shape, [dot])


class _Expander(HloPass):
    """Replaces each instruction of `opcodes` by what its expansion builds (an expansion
    that answers None leaves the instruction as it is)."""

    expansions: dict = {}

    def run(self, module: HloModule) -> bool:
        namer = NameUniquer(module)
        reducers: dict = {}
        changed = False
        for comp in reachable_computations(module):
            editor = Editor(comp, namer)
            for instr in list(comp.instructions):
                expand = self.expansions.get(instr.opcode)
                if expand is None or not all(o.shape.is_array for o in instr.operands):
                    continue
                if any(o.shape.is_dynamic for o in instr.operands):
                    continue
                new = expand(_Emitter(module, editor, instr, reducers), instr)
                if new is None:
                    continue
                editor.replace(instr, new)
                editor.remove(instr)
                changed = True
        return changed


@register_pass
class BatchNormExpander(_Expander):
    """batch-norm-training, -inference and -grad into elementwise ops and reductions."""

    name = "batchnorm-expander"
    expansions = {
        Op.BATCH_NORM_TRAINING: _expand_training,
        Op.BATCH_NORM_INFERENCE: _expand_inference,
        Op.BATCH_NORM_GRAD: _expand_grad,
    }


@register_pass
class LogisticExpander(_Expander):
    """logistic(x) -> 1 / (1 + exp(-x))."""

    name = "logistic-expander"
    expansions = {Op.LOGISTIC: _expand_logistic}


@register_pass
class DotUpcast(_Expander):
    """dot of bf16/f16 operands or result -> convert(dot(convert(a), convert(b))) in f32."""

    name = "dot-upcast"
    expansions = {Op.DOT: _expand_narrow_dot}
