"""Evaluation rules for contractions: dot, convolution, ragged-dot and scaled-dot.

Every contraction first converts both operands to an accumulation type chosen from the
result element type: integers accumulate in 64 bits and are wrapped to the result width at
the end (modular arithmetic makes that identical to accumulating in the result type);
floats accumulate in f32, or f64 when the result or an operand is f64; complex numbers in
c64 or c128 likewise. The final value is rounded once to the result element type.

dot moves the batch dimensions to the front, the free dimensions next and the contracting
dimensions last, flattens them to one batched matrix product (`np.matmul`), and reshapes
back to XLA's result order: batch dims, lhs free dims, rhs free dims.

convolution works on a canonical [batch, feature, spatial...] input and an
[out-feature, in-feature, spatial...] kernel: the input is dilated by base_dilation (zeros
between elements), padded (negative padding crops), and every output position's window is
taken with a strided view (window dilation skips elements; stride skips windows). Feature
groups split the input features and the output features into matching groups; batch groups
split the input batch and the output features. One einsum contracts features and window
positions; the result is transposed into the output's dimension labels.
"""

from __future__ import annotations

import math

import numpy as np

from xlapy.backends.interpreter.registry import evaluates
from xlapy.errors import EvaluationError
from xlapy.ir.attributes import ConvDimLabels, Window, WindowDim
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.opcodes import Opcode
from xlapy.ir.types import PrimitiveType


def accumulation_dtype(result: PrimitiveType, *operands: np.ndarray) -> np.dtype:
    """The NumPy dtype a contraction producing `result` accumulates in."""
    if result.is_pred or result.is_signed_integral:
        return np.dtype(np.int64)
    if result.is_unsigned_integral:
        return np.dtype(np.uint64)
    wide = result in (PrimitiveType.F64, PrimitiveType.C128) or any(
        op.dtype in (np.float64, np.complex128) for op in operands
    )
    if result.is_complex or any(np.iscomplexobj(op) for op in operands):
        return np.dtype(np.complex128 if wide else np.complex64)
    return np.dtype(np.float64 if wide else np.float32)


def to_accumulation(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """`x` converted to the accumulation dtype (integers wrap modulo 2**64)."""
    if x.dtype == dtype:
        return x
    if dtype.kind in "iu" and x.dtype.kind not in "iub":
        x = x.astype(np.int64) if dtype.kind == "i" else x.astype(np.uint64)
    return x.astype(dtype)


def to_result(acc: np.ndarray, result: PrimitiveType) -> np.ndarray:
    """The accumulator rounded (floats) or wrapped (integers) to the result element type."""
    if result.is_pred:
        return np.asarray(acc != 0)
    if result.is_integral and result.bits < 8:
        bits = result.bits
        wrapped = acc.astype(np.uint64) & np.uint64((1 << bits) - 1)
        if result.is_signed_integral:
            wrapped = wrapped.astype(np.int64)
            wrapped = np.where(wrapped >= (1 << (bits - 1)), wrapped - (1 << bits), wrapped)
        return np.asarray(wrapped.astype(result.dtype))
    return np.asarray(acc.astype(result.dtype))


def dot_general(
    lhs: np.ndarray,
    rhs: np.ndarray,
    lhs_batch: tuple[int, ...],
    rhs_batch: tuple[int, ...],
    lhs_contract: tuple[int, ...],
    rhs_contract: tuple[int, ...],
) -> np.ndarray:
    """XLA's DotGeneral on arrays already in the accumulation dtype: the result has the batch
    dims, then lhs free dims, then rhs free dims."""
    lhs_free = [d for d in range(lhs.ndim) if d not in lhs_batch and d not in lhs_contract]
    rhs_free = [d for d in range(rhs.ndim) if d not in rhs_batch and d not in rhs_contract]
    batch_shape = [lhs.shape[d] for d in lhs_batch]
    lhs_free_shape = [lhs.shape[d] for d in lhs_free]
    rhs_free_shape = [rhs.shape[d] for d in rhs_free]
    b = math.prod(batch_shape)
    k = math.prod(lhs.shape[d] for d in lhs_contract)
    a = lhs.transpose([*lhs_batch, *lhs_free, *lhs_contract]).reshape(
        b, math.prod(lhs_free_shape), k
    )
    c = rhs.transpose([*rhs_batch, *rhs_contract, *rhs_free]).reshape(
        b, k, math.prod(rhs_free_shape)
    )
    return np.matmul(a, c).reshape((*batch_shape, *lhs_free_shape, *rhs_free_shape))


def _check_dot_dims(instr: HloInstruction, lhs: np.ndarray, rhs: np.ndarray) -> tuple:
    numbers = instr.dot_dimension_numbers
    lb, rb = numbers.lhs_batch, numbers.rhs_batch
    lc, rc = numbers.lhs_contracting, numbers.rhs_contracting
    if len(lb) != len(rb) or len(lc) != len(rc):
        raise EvaluationError(
            f"{instr.name}: lhs and rhs need as many batch dims ({lb} vs {rb}) and "
            f"contracting dims ({lc} vs {rc})"
        )
    for ls, rs, what in ((lb, rb, "batch"), (lc, rc, "contracting")):
        for dl, dr in zip(ls, rs, strict=True):
            if not (0 <= dl < lhs.ndim and 0 <= dr < rhs.ndim):
                raise EvaluationError(
                    f"{instr.name}: {what} dims {ls}/{rs} out of range for operands of rank "
                    f"{lhs.ndim}/{rhs.ndim}"
                )
            if lhs.shape[dl] != rhs.shape[dr]:
                raise EvaluationError(
                    f"{instr.name}: {what} dimension sizes differ: lhs dim {dl} is "
                    f"{lhs.shape[dl]}, rhs dim {dr} is {rhs.shape[dr]}"
                )
    return lb, rb, lc, rc


@evaluates(Opcode.DOT)
def _dot(instr, operands, ctx):
    lhs, rhs = operands
    lb, rb, lc, rc = _check_dot_dims(instr, lhs, rhs)
    result = instr.shape.element_type
    acc = accumulation_dtype(result, lhs, rhs)
    out = dot_general(to_accumulation(lhs, acc), to_accumulation(rhs, acc), lb, rb, lc, rc)
    return _shaped(instr, to_result(out, result))


def _shaped(instr: HloInstruction, value: np.ndarray) -> np.ndarray:
    if value.shape != instr.shape.dims:
        raise EvaluationError(
            f"{instr.name}: computed a result of dims {list(value.shape)} but the instruction "
            f"shape is {instr.shape.to_text(with_layout=False)}"
        )
    return value


# -- ragged dot ----------------------------------------------------------------------------


def _group_ids(
    shape: tuple[int, ...], prefix: list[int], ragged: int, group_sizes: np.ndarray
) -> np.ndarray:
    """For each position of an lhs of `shape`, the group its ragged index falls in (g when
    it is past the last group), as an array broadcastable against the lhs. `group_sizes` is
    [g] or [*prefix dims, g]."""
    g = group_sizes.shape[-1]
    sizes = group_sizes.astype(np.int64)
    if sizes.ndim == 1:
        prefix = []
    ends = np.cumsum(sizes, axis=-1)
    pos = np.arange(shape[ragged])
    ids = np.sum(pos[:, None] >= ends[..., None, :], axis=-1)  # [*prefix, R]
    ids = np.minimum(ids, g)
    target = [*prefix, ragged]
    full = ids.reshape(ids.shape + (1,) * (len(shape) - len(target)))
    return np.moveaxis(full, list(range(len(target))), target)


@evaluates(Opcode.RAGGED_DOT)
def _ragged_dot(instr, operands, ctx):
    lhs, rhs, group_sizes = operands
    numbers = instr.dot_dimension_numbers
    lb, rb = numbers.lhs_batch, numbers.rhs_batch
    lc, rc = numbers.lhs_contracting, numbers.rhs_contracting
    ragged_dims, group_dims = instr.lhs_ragged_dims, instr.rhs_group_dims
    if len(ragged_dims) != 1 or len(group_dims) > 1:
        raise EvaluationError(
            f"{instr.name}: ragged-dot needs one lhs ragged dim and at most one rhs group dim, "
            f"got lhs_ragged_dims={ragged_dims} rhs_group_dims={group_dims}"
        )
    ragged = ragged_dims[0]
    g = group_sizes.shape[-1] if group_sizes.ndim else 0
    result = instr.shape.element_type
    acc = accumulation_dtype(result, lhs, rhs)
    a, b = to_accumulation(lhs, acc), to_accumulation(rhs, acc)
    zero = np.zeros((), acc)

    if ragged in lb:  # mode 3: ragged batch dim; rows past the groups are zero
        prefix = [d for d in lb if d < ragged]
        ids = _group_ids(lhs.shape, prefix, ragged, group_sizes)
        out = dot_general(np.where(ids < g, a, zero), b, lb, rb, lc, rc)
    elif ragged in lc:  # mode 2: ragged contracting dim; one result per group, leading
        prefix = [*lb, *(d for d in lc if d < ragged)]
        ids = _group_ids(lhs.shape, prefix, ragged, group_sizes)
        out = np.stack(
            [dot_general(np.where(ids == i, a, zero), b, lb, rb, lc, rc) for i in range(g)]
        )
    else:  # mode 1: ragged free dim of lhs; rhs has a group dim selecting the weights
        if len(group_dims) != 1:
            raise EvaluationError(
                f"{instr.name}: a ragged non-contracting lhs dim needs one rhs group dim"
            )
        gd = group_dims[0]
        if rhs.shape[gd] != g:
            raise EvaluationError(
                f"{instr.name}: rhs group dim {gd} has size {rhs.shape[gd]}, group_sizes "
                f"has {g} groups"
            )
        free = [d for d in range(lhs.ndim) if d not in lb and d not in lc]
        prefix = [*lb, *(d for d in free if d < ragged)]
        ids = _group_ids(lhs.shape, prefix, ragged, group_sizes)

        def drop(dims):
            return tuple(d - (d > gd) for d in dims)

        rb2, rc2 = drop(rb), drop(rc)
        out = None
        for i in range(g):
            part = dot_general(
                np.where(ids == i, a, zero), np.take(b, i, axis=gd), lb, rb2, lc, rc2
            )
            out = part if out is None else out + part
        if out is None:
            out = np.zeros(instr.shape.dims, acc)
    return _shaped(instr, to_result(out, result))


# -- scaled dot ----------------------------------------------------------------------------


def _expand_scale(x: np.ndarray, scale: np.ndarray, instr, which: str) -> np.ndarray:
    """`x` times `scale` repeated block-wise to x's shape (a scale dim divides x's dim)."""
    if scale.ndim != x.ndim:
        raise EvaluationError(
            f"{instr.name}: {which} scale has rank {scale.ndim}, operand has rank {x.ndim}"
        )
    s = scale
    for d, (n, m) in enumerate(zip(x.shape, scale.shape, strict=True)):
        if m == 0 or n % m:
            raise EvaluationError(
                f"{instr.name}: {which} scale dim {d} of size {m} does not divide the "
                f"operand's size {n}"
            )
        s = np.repeat(s, n // m, axis=d)
    return x * s


@evaluates(Opcode.SCALED_DOT)
def _scaled_dot(instr, operands, ctx):
    lhs, rhs, lhs_scale, rhs_scale = operands
    lb, rb, lc, rc = _check_dot_dims(instr, lhs, rhs)
    result = instr.shape.element_type
    acc = accumulation_dtype(result, lhs, rhs)
    a = _expand_scale(to_accumulation(lhs, acc), to_accumulation(lhs_scale, acc), instr, "lhs")
    b = _expand_scale(to_accumulation(rhs, acc), to_accumulation(rhs_scale, acc), instr, "rhs")
    return _shaped(instr, to_result(dot_general(a, b, lb, rb, lc, rc), result))


# -- convolution ---------------------------------------------------------------------------


def dilate_and_pad(x: np.ndarray, axis: int, dim: WindowDim, fill) -> np.ndarray:
    """`x` along `axis` with base_dilation-1 `fill`s between elements and pad_low/pad_high
    `fill`s at the ends (negative padding removes elements)."""
    n = x.shape[axis]
    bd = dim.base_dilation
    dilated = (n - 1) * bd + 1 if n else 0
    lo, hi = dim.pad_low, dim.pad_high
    total = dilated + lo + hi
    if total <= 0:
        shape = list(x.shape)
        shape[axis] = 0
        return np.empty(shape, x.dtype)
    shape = list(x.shape)
    shape[axis] = dilated + max(lo, 0) + max(hi, 0)
    out = np.full(shape, fill, x.dtype)
    index = [slice(None)] * x.ndim
    index[axis] = slice(max(lo, 0), max(lo, 0) + dilated, bd)
    out[tuple(index)] = x
    index[axis] = slice(-min(lo, 0), shape[axis] + min(hi, 0))
    return out[tuple(index)]


def window_output_size(padded: int, dim: WindowDim) -> int:
    """Number of window positions along a dimension of padded (dilated) size `padded`."""
    span = (dim.size - 1) * dim.window_dilation + 1
    if padded < span or dim.size == 0:
        return 0
    return (padded - span) // dim.stride + 1


def windows(x: np.ndarray, axes: list[int], dims: tuple[WindowDim, ...]) -> np.ndarray:
    """A view of the windows of an already dilated and padded `x`: axes `axes` become the
    output positions, and one window axis per entry of `dims` is appended at the end."""
    outs = [window_output_size(x.shape[a], d) for a, d in zip(axes, dims, strict=True)]
    spans = [(d.size - 1) * d.window_dilation + 1 for d in dims]
    if 0 in outs or any(x.shape[a] == 0 for a in axes):
        shape = list(x.shape)
        for a, o in zip(axes, outs, strict=True):
            shape[a] = o
        return np.zeros([*shape, *(d.size for d in dims)], x.dtype)
    view = np.lib.stride_tricks.sliding_window_view(x, spans, axis=tuple(axes))
    index = [slice(None)] * x.ndim
    for a, d, o in zip(axes, dims, outs, strict=True):
        index[a] = slice(0, (o - 1) * d.stride + 1, d.stride)
    index += [slice(None, None, d.window_dilation) for d in dims]
    return view[tuple(index)]


@evaluates(Opcode.CONVOLUTION)
def _convolution(instr, operands, ctx):
    lhs, rhs = operands
    labels: ConvDimLabels | None = instr.dim_labels_or_none
    if labels is None:
        raise EvaluationError(f"{instr.name}: convolution needs dim_labels")
    nsp = len(labels.input_spatial)
    window: Window = instr.window_or_none or Window(
        tuple(WindowDim(size=rhs.shape[d]) for d in labels.kernel_spatial)
    )
    if len(window.dims) != nsp:
        raise EvaluationError(
            f"{instr.name}: window has {len(window.dims)} dims, the convolution {nsp} spatial dims"
        )
    fgc = instr.feature_group_count
    bgc = instr.batch_group_count
    result = instr.shape.element_type
    acc = accumulation_dtype(result, lhs, rhs)

    x = to_accumulation(lhs, acc).transpose(
        [labels.input_batch, labels.input_feature, *labels.input_spatial]
    )
    k = to_accumulation(rhs, acc).transpose(
        [labels.kernel_output_feature, labels.kernel_input_feature, *labels.kernel_spatial]
    )
    for i, d in enumerate(window.dims):
        if k.shape[2 + i] != d.size:
            raise EvaluationError(
                f"{instr.name}: kernel spatial dim {i} has size {k.shape[2 + i]}, window size "
                f"is {d.size}"
            )
        if d.reversal:
            k = np.flip(k, axis=2 + i)
        x = dilate_and_pad(x, 2 + i, d, 0)

    n, c = x.shape[:2]
    o, ci = k.shape[:2]
    if (
        fgc < 1
        or bgc < 1
        or (fgc > 1 and bgc > 1)
        or c % fgc
        or o % fgc
        or o % bgc
        or n % bgc
        or c != ci * fgc
    ):
        raise EvaluationError(
            f"{instr.name}: feature_group_count={fgc}, batch_group_count={bgc} do not fit "
            f"input batch {n}, input features {c}, kernel in/out features {ci}/{o}"
        )
    w = windows(x, list(range(2, 2 + nsp)), window.dims)  # [N, C, out..., win...]
    letters = "abcdefghijklmnopqrstuvwxyz"
    sp = letters[:nsp]
    win = letters[nsp : 2 * nsp]
    out_sp = w.shape[2 : 2 + nsp]
    if bgc > 1:
        wg = w.reshape(bgc, n // bgc, c, *w.shape[2:])
        kg = k.reshape(bgc, o // bgc, ci, *k.shape[2:])
        y = np.einsum(f"GNC{sp}{win},GOC{win}->NGO{sp}", wg, kg, optimize=True)
        y = y.reshape(n // bgc, o, *out_sp)
    else:
        wg = w.reshape(n, fgc, c // fgc, *w.shape[2:])
        kg = k.reshape(fgc, o // fgc, ci, *k.shape[2:])
        y = np.einsum(f"NGC{sp}{win},GOC{win}->NGO{sp}", wg, kg, optimize=True)
        y = y.reshape(n, o, *out_sp)
    perm = [0] * (2 + nsp)
    perm[labels.output_batch] = 0
    perm[labels.output_feature] = 1
    for i, d in enumerate(labels.output_spatial):
        perm[d] = 2 + i
    return _shaped(instr, to_result(np.transpose(y, perm), result))
