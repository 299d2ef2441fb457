"""Evaluation rules for linear algebra: cholesky, triangular-solve and the batch-norm ops.

All of them compute in double precision (f64 or c128) and round once to the result type.
Leading dimensions are batch dimensions.

cholesky reads only the triangle named by `lower`, factors the Hermitian matrix that
triangle defines, and returns the factor with zeros in the other triangle (XLA leaves that
triangle unspecified). A matrix that is not positive definite gives an all-NaN factor.

triangular-solve reads only a's `lower` (or upper) triangle, with ones on the diagonal when
`unit_diagonal`, applies transpose_a (NO_TRANSPOSE, TRANSPOSE, ADJOINT) and solves
op(a) x = b (left_side) or x op(a) = b, one batch entry at a time with SciPy.

The batch-norm ops normalize over every dimension but `feature_index`, with the biased
variance mean((x - mean)^2); batch-norm-grad uses the standard gradient of training-mode
batch normalization (the formulas of XLA's operation semantics).
"""

from __future__ import annotations

import numpy as np

from xlapy.backends.interpreter.registry import evaluates
from xlapy.errors import EvaluationError
from xlapy.ir.opcodes import Opcode


def _wide(x: np.ndarray) -> np.ndarray:
    return x.astype(np.complex128 if np.iscomplexobj(x) else np.float64)


def _square_batch(instr, a: np.ndarray, what: str) -> None:
    if a.ndim < 2 or a.shape[-1] != a.shape[-2]:
        raise EvaluationError(
            f"{instr.name}: {what} must be a batch of square matrices, got dims {list(a.shape)}"
        )


def _hermitian_from_triangle(a: np.ndarray, lower: bool) -> np.ndarray:
    tri = np.tril(a) if lower else np.triu(a)
    strict = np.tril(a, -1) if lower else np.triu(a, 1)
    return tri + np.conj(np.swapaxes(strict, -1, -2))


@evaluates(Opcode.CHOLESKY)
def _cholesky(instr, operands, ctx):
    (a,) = operands
    _square_batch(instr, a, "cholesky's operand")
    lower = instr.lower
    h = _hermitian_from_triangle(_wide(a), lower)
    flat = h.reshape(-1, *h.shape[-2:])
    factors = np.empty_like(flat)
    for i, m in enumerate(flat):
        try:
            factors[i] = np.linalg.cholesky(m)
        except np.linalg.LinAlgError:
            factors[i] = np.nan
    factors = factors.reshape(h.shape)
    if not lower:
        factors = np.conj(np.swapaxes(factors, -1, -2))
    return factors.astype(instr.shape.dtype)


_TRANSPOSE_KINDS = ("NO_TRANSPOSE", "TRANSPOSE", "ADJOINT")


@evaluates(Opcode.TRIANGULAR_SOLVE)
def _triangular_solve(instr, operands, ctx):
    a, b = operands
    _square_batch(instr, a, "triangular-solve's a")
    left = instr.left_side
    lower = instr.lower
    unit = instr.unit_diagonal
    kind = instr.transpose_a
    if kind not in _TRANSPOSE_KINDS:
        raise EvaluationError(f"{instr.name}: transpose_a must be one of {_TRANSPOSE_KINDS}")
    m = a.shape[-1]
    solve_dim = -2 if left else -1
    if b.ndim != a.ndim or b.shape[:-2] != a.shape[:-2] or b.shape[solve_dim] != m:
        raise EvaluationError(
            f"{instr.name}: b dims {list(b.shape)} do not fit a dims {list(a.shape)} "
            f"(left_side={left})"
        )
    tri = np.tril(_wide(a)) if lower else np.triu(_wide(a))
    if unit:
        tri[..., np.arange(m), np.arange(m)] = 1
    op_lower = lower
    if kind != "NO_TRANSPOSE":
        tri = np.swapaxes(tri, -1, -2)
        op_lower = not lower
        if kind == "ADJOINT":
            tri = np.conj(tri)
    rhs = _wide(b)
    flat_a = tri.reshape(-1, m, m)
    flat_b = rhs.reshape(-1, *rhs.shape[-2:])
    out = np.empty(flat_b.shape, np.result_type(flat_a, flat_b))
    import scipy.linalg  # (loaded on first use: importing the rules stays light)

    for i, (ai, bi) in enumerate(zip(flat_a, flat_b, strict=True)):
        if left:
            out[i] = scipy.linalg.solve_triangular(ai, bi, lower=op_lower, check_finite=False)
        else:
            out[i] = scipy.linalg.solve_triangular(
                ai.T, bi.T, lower=not op_lower, check_finite=False
            ).T
    return out.reshape(b.shape).astype(instr.shape.dtype)


def _feature_axes(instr, x: np.ndarray, *per_feature: np.ndarray) -> tuple[int, tuple]:
    f = instr.feature_index
    if not 0 <= f < x.ndim:
        raise EvaluationError(f"{instr.name}: feature_index {f} invalid for rank {x.ndim}")
    for v in per_feature:
        if v.shape != (x.shape[f],):
            raise EvaluationError(
                f"{instr.name}: per-feature operands must have dims [{x.shape[f]}], got "
                f"{list(v.shape)}"
            )
    return f, tuple(d for d in range(x.ndim) if d != f)


def _along(v: np.ndarray, f: int, rank: int) -> np.ndarray:
    shape = [1] * rank
    shape[f] = v.shape[0]
    return v.reshape(shape)


@evaluates(Opcode.BATCH_NORM_TRAINING)
def _batch_norm_training(instr, operands, ctx):
    x, scale, offset = operands
    f, axes = _feature_axes(instr, x, scale, offset)
    eps = instr.epsilon
    xw = _wide(x)
    mean = xw.mean(axis=axes)
    centered = xw - _along(mean, f, x.ndim)
    var = np.mean(centered * centered, axis=axes)
    norm = centered / np.sqrt(_along(var, f, x.ndim) + eps)
    y = norm * _along(_wide(scale), f, x.ndim) + _along(_wide(offset), f, x.ndim)
    return (y.astype(x.dtype), mean.astype(x.dtype), var.astype(x.dtype))


@evaluates(Opcode.BATCH_NORM_INFERENCE)
def _batch_norm_inference(instr, operands, ctx):
    x, scale, offset, mean, var = operands
    f, _ = _feature_axes(instr, x, scale, offset, mean, var)
    eps = instr.epsilon
    r = x.ndim
    norm = (_wide(x) - _along(_wide(mean), f, r)) / np.sqrt(_along(_wide(var), f, r) + eps)
    y = norm * _along(_wide(scale), f, r) + _along(_wide(offset), f, r)
    return y.astype(instr.shape.dtype)


@evaluates(Opcode.BATCH_NORM_GRAD)
def _batch_norm_grad(instr, operands, ctx):
    x, scale, mean, var, grad = operands
    f, axes = _feature_axes(instr, x, scale, mean, var)
    if grad.shape != x.shape:
        raise EvaluationError(f"{instr.name}: grad_output dims must equal the operand's")
    eps = instr.epsilon
    r = x.ndim
    g = _wide(grad)
    centered = _wide(x) - _along(_wide(mean), f, r)
    inv_std = 1.0 / np.sqrt(_wide(var) + eps)
    grad_offset = g.sum(axis=axes)
    grad_scale = (g * centered).sum(axis=axes) * inv_std
    mean_g = g.mean(axis=axes)
    mean_gc = (g * centered).mean(axis=axes)
    grad_x = _along(_wide(scale) * inv_std, f, r) * (
        g - _along(mean_g, f, r) - centered * _along(mean_gc * inv_std**2, f, r)
    )
    return (grad_x.astype(x.dtype), grad_scale.astype(x.dtype), grad_offset.astype(x.dtype))
