# Convolutions: ConvolutionThunk runs a convolution as a library thunk, its fast path im2col
# through strided views, then BLAS (below), else the interpreter's rule.
#
# Every convolution is brought to one canonical form, whatever its dimension labels:
#
#   input  [G, Nb, S..., Cg]    G groups (feature groups split the input features, batch
#                               groups split the input batch; G = 1 without groups)
#   kernel [G, K..., Cg, Og]    window positions, input features, output features per group
#   output [Nb, O..., G * Og]   output features group-major, as XLA orders them
#
# The input is written once, in the work dtype (see dot_thunk.py: the accumulation dtype, or
# an exact float type for integers), into a zero buffer with
# base (lhs) dilation as a strided store and the padding around it; negative padding only
# crops what is stored. An `as_strided` view of that buffer then has, for each output
# position, its window of K... positions (window dilation and stride are just strides), and
# reshaping the view to [Nb * O..., K... * Cg] rows is the im2col copy. One batched matmul
# per group of rows against the [K... * Cg, Og] kernel matrix gives the output, written
# straight into the result when there is one group, the result is row-major in the canonical
# order and already has the work dtype (NHWC / HWIO / NHWC f32, the usual JAX form).
# Rows are processed in chunks of whole batch items so the im2col buffer stays near
# _CHUNK_BYTES. A 1x1 window with unit stride, no padding and row-major features needs no
# im2col copy at all: the input itself is the matrix.
#
# Band rows: when the last spatial dim's window row of a window position, K_last * Cg values,
# is long enough (and the other spatial dims have unit stride), a convolution is instead a sum
# of products, one per position of the other window dims: a copy of [Nb, P_outer...,
# O_last, K_last * Cg] band rows (a third of the im2col copy for a 3x3 window) holds every
# such product's left operand as a row-major matrix at some offset, and OpenBLAS's gemm
# (raw_gemm in dot_thunk.py) accumulates it into the output rows of one batch item and group
# (beta = 1 after the first product), straight in the result when it is row-major in the
# work dtype. The products of one batch item run back to back, its bands still in cache, in
# blocks of output rows (all window positions of a block, then the next block) so the rows
# they accumulate stay in cache too.
#
# Long contractions: a window far larger than the output (backward-filter convolutions, where
# JAX swaps batch and features: the window is the image, the output the kernel's size) is a
# reduction over input features and window positions. With two spatial dims and no groups,
# per input feature c the rows [P0, K1, O1, Nb] of the padded input (P0 the rows any output
# reads, O1 and Nb adjacent) are copied once; for an output row o0 the rows from o0 * stride
# on are then a [K0 * K1, O1 * Nb] matrix, and one transposed-A gemm with the kernel's
# [K0 * K1, Og] matrix for c (used in place when its strides allow: JAX's output-gradient
# layout does) accumulates the [O1 * Nb, Og] block of that output row. The padded input
# keeps the memory order of the operand, so making it is a plain copy. Blocks of input
# features run in parallel, each into its own partial sum; the partials are added at the end.
#
# Small float convolutions (index arrays under _GATHER_MAX elements: most of a small-batch
# training step's, forward and both gradients) take none of these paths: setting up their
# strided views costs 100-200 us of Python, far more than their arithmetic. Their im2col
# rows, kernel matrix and result order are worked out once, on an array of element numbers
# run through the same canonical views, as index arrays; a run is then a copy of the input
# (one zero appended, which padded positions index), three np.take gathers and one batched
# matmul, 20-40 us.
#
# Direct kernels: a float convolution with two spatial dims, one group and f32 work takes,
# after the gather path (whose few NumPy calls cost less than the set-up below) and before
# all the others, a native kernel the driver compiled for its geometry
# (codegen/emit_conv.py: output features in vector registers, tiles of output positions,
# the reduction over window and input features in registers; no im2col, no BLAS). A run
# writes the padded input (as above; none when the input is already row-major f32 without
# padding) and the kernel with its output features padded to whole vectors (kept buffers),
# then runs the kernel's tiles of output positions, every output row cut into tiles, over
# the native pool (runtime/native_pool.py): Nb x O0 x tiles units, so 16 threads get even
# work from one batch item on. Each output element is summed in one fixed order by one
# tile, so the result is the same bits at any thread count.
#
# Work buffers (the padded input, the im2col and band blocks) are kept between runs, one set
# per thread: the padding stays zero, and no run faults in fresh pages.
#
# Window reversal flips the kernel's spatial axes (a view). Depthwise convolutions (one
# input feature per group) skip im2col: a matmul with K... * 1 columns is mostly overhead, so
# they multiply-accumulate one shifted input view per window position into the output,
# features innermost. Summation order differs from the interpreter's einsum, so floats agree
# to rounding; integer results are the interpreter's exactly.

from __future__ import annotations

import ctypes
import itertools
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from xlapy.backends.cpu.runtime.dot_thunk import (
    blas_ready,
    from_work,
    raw_gemm,
    split_run,
    supported_types,
    work_dtype,
)
from xlapy.backends.cpu.runtime.loadable import loadable
from xlapy.backends.cpu.runtime.native_pool import native_pool
from xlapy.backends.cpu.runtime.pool import even_blocks, pool_size, run_blocks
from xlapy.backends.cpu.runtime.rule_thunk import RuleThunk
from xlapy.backends.cpu.runtime.thunk import (
    NS_PER_FLOP,
    BufferSlice,
    ExecutionContext,
    SplitChoice,
    Thunk,
    slice_lines,
)
from xlapy.backends.interpreter.rules.contraction import accumulation_dtype, window_output_size
from xlapy.ir.attributes import ConvDimLabels, Window
from xlapy.ir.instruction import HloInstruction

_CHUNK_BYTES = 1 << 20
_BAND_MIN_DEPTH = 32  # shorter band rows make BLAS slower than the full im2col copy costs
_BAND_MIN_ROWS = 64  # fewer output rows per product: too many small BLAS calls
_BAND_BLOCK_ROWS = 512  # output rows per product, at most
_KEEP_BYTES = 1 << 26  # larger work buffers are allocated per run, not kept
_REDUCE_MIN_WINDOW = 64  # window positions per output element that make a long contraction
_SHIFT_MAX_FEATURES = 8  # more input features per group: band rows or im2col copy well
_SHIFT_MAX_WASTE = 1.5  # padded positions per output position, at most
_SHIFT_BLOCK_BYTES = 1 << 18  # transposed im2col block of the shifted-slices path
_GATHER_MAX = 1 << 17  # index elements (8 bytes each) of the largest gather-path convolution


def _split_axis(x: np.ndarray, axis: int, outer: int) -> np.ndarray:
    """A view of `x` with `axis` split into (outer, size // outer), outer major."""
    inner = x.shape[axis] // outer
    shape = (*x.shape[:axis], outer, inner, *x.shape[axis + 1 :])
    s = x.strides[axis]
    strides = (*x.strides[:axis], s * inner, s, *x.strides[axis + 1 :])
    return as_strided(x, shape, strides, writeable=x.flags.writeable)


def _stored_range(n: int, lo: int, bd: int, padded: int) -> tuple[int, int]:
    """Input elements [j0, j1) along a dim that land inside the padded, dilated buffer
    (element j lands at j * bd + lo)."""
    j0 = (-lo + bd - 1) // bd if lo < 0 else 0
    j1 = min(n, (padded - 1 - lo) // bd + 1) if padded - 1 - lo >= 0 else 0
    return j0, max(j0, j1)


class _Scratch:
    """Work buffers one convolution keeps between runs, a set per thread (blocks run on the
    pool's threads). Fresh large allocations come as fresh pages, and faulting them in can
    cost more than the copy that fills them."""

    def __init__(self):
        self._local = threading.local()

    def get(self, name: str, shape: tuple[int, ...], dtype: np.dtype, zero: bool = False):
        """A buffer of `shape` and `dtype`: the same one every run of this thread (up to
        _KEEP_BYTES), zeroed at creation only when `zero` (a caller that writes the same
        elements each run keeps the rest zero)."""
        make = np.zeros if zero else np.empty
        if math.prod(shape) * np.dtype(dtype).itemsize > _KEEP_BYTES:
            return make(shape, dtype)
        bufs = self._local.__dict__.setdefault("bufs", {})
        key = (name, shape, np.dtype(dtype))
        buf = bufs.get(key)
        if buf is None:
            buf = bufs[key] = make(shape, dtype)
        return buf


class _Geometry:
    """Everything about a convolution that the instruction fixes (see the file comment)."""

    def __init__(self, instr: HloInstruction, labels: ConvDimLabels, window: Window):
        x_dims, k_dims = instr.operands[0].shape.dims, instr.operands[1].shape.dims
        self.fgc = instr.feature_group_count
        self.bgc = instr.batch_group_count
        n, c = x_dims[labels.input_batch], x_dims[labels.input_feature]
        ci, o = k_dims[labels.kernel_input_feature], k_dims[labels.kernel_output_feature]
        fgc, bgc = self.fgc, self.bgc
        if fgc < 1 or bgc < 1 or (fgc > 1 and bgc > 1):
            raise ValueError("groups")
        if c != ci * fgc or o % fgc or o % bgc or n % bgc:
            raise ValueError("group sizes")
        self.g = fgc * bgc
        self.nb, self.cg, self.og = n // bgc, ci, o // self.g
        self.xperm = (labels.input_batch, *labels.input_spatial, labels.input_feature)
        self.kperm = (*labels.kernel_spatial, labels.kernel_input_feature,
                      labels.kernel_output_feature)  # fmt: skip
        self.operm = (labels.output_batch, *labels.output_spatial, labels.output_feature)
        self.ksizes = tuple(k_dims[d] for d in labels.kernel_spatial)
        self.flip = tuple(i for i, d in enumerate(window.dims) if d.reversal)
        self.dims = window.dims
        sizes = [x_dims[d] for d in labels.input_spatial]
        self.padded, self.outs, self.stored, self.plain = [], [], [], True
        for n_i, d, k in zip(sizes, window.dims, self.ksizes, strict=True):
            if d.size != k or d.size < 1 or d.stride < 1 or d.base_dilation < 1:
                raise ValueError("window")
            dilated = (n_i - 1) * d.base_dilation + 1
            padded = dilated + d.pad_low + d.pad_high
            if padded <= 0:
                raise ValueError("empty")
            self.padded.append(padded)
            self.outs.append(window_output_size(padded, d))
            self.stored.append(_stored_range(n_i, d.pad_low, d.base_dilation, padded))
            if d.pad_low or d.pad_high or d.base_dilation != 1:
                self.plain = False
        out_dims = instr.shape.dims
        if tuple(self.outs) != tuple(out_dims[d] for d in labels.output_spatial):
            raise ValueError("output size")
        if out_dims[labels.output_batch] != self.nb or out_dims[labels.output_feature] != o:
            raise ValueError("output features")
        self.pout = math.prod(self.outs)
        self.pwin = math.prod(self.ksizes)
        self.pointwise = self.plain and all(d.size == 1 and d.stride == 1 for d in window.dims)
        self.depthwise = self.cg == 1 and self.fgc > 1
        self.banded = (
            len(self.dims) >= 2
            and all(d.stride == 1 for d in self.dims[:-1])
            and self.ksizes[-1] * self.cg >= _BAND_MIN_DEPTH
            and self.outs[-2] * self.outs[-1] >= _BAND_MIN_ROWS
            and not self.depthwise
        )
        self.reducing = (
            len(self.dims) == 2
            and self.g == 1
            and self.dims[0].window_dilation == 1
            and self.pwin >= _REDUCE_MIN_WINDOW
            and not self.banded
        )
        self.shifted = (
            self.g == 1
            and self.cg <= _SHIFT_MAX_FEATURES
            and all(d.stride == 1 for d in self.dims)
            and math.prod(self.padded) <= _SHIFT_MAX_WASTE * self.pout
            and not (self.banded or self.reducing or self.pointwise)
        )

    # -- operands in the canonical form ------------------------------------------------------
    def grouped_input(self, x: np.ndarray) -> np.ndarray:
        """[G, Nb, S..., Cg] view of the input."""
        xc = x.transpose(self.xperm)
        if self.bgc > 1:
            return _split_axis(xc, 0, self.g)
        if self.fgc > 1:
            return np.moveaxis(_split_axis(xc, xc.ndim - 1, self.g), -2, 0)
        return xc[None]

    def padded_input(
        self, x5: np.ndarray, work: np.dtype, scratch: _Scratch, keep_order: bool = False
    ) -> np.ndarray:
        """The input dilated and padded along the spatial axes of `x5`, in `work`: a
        row-major buffer, or with `keep_order` a buffer whose axes lie in memory in the order
        of `x5`'s (a straight copy, for paths that read any strides)."""
        lead = x5.ndim - len(self.dims) - 1  # axes before the spatial ones
        if self.plain:
            if x5.dtype == work and (
                keep_order or x5.strides[-1] == x5.itemsize or x5.shape[-1] == 1
            ):
                return x5
            return _ordered(scratch, "input", x5.shape, work, x5.strides, keep_order, x5)
        shape = (*x5.shape[:lead], *self.padded, x5.shape[-1])
        # only stored elements change: the rest stays zero
        buf = _ordered(scratch, "padded", shape, work, x5.strides, keep_order)
        dst, src = self.stored_slices()
        if dst is not None:
            buf[(Ellipsis, *dst, slice(None))] = x5[(Ellipsis, *src, slice(None))]
        return buf

    def stored_slices(self):
        """(padded-buffer slices, input slices) along the spatial dims for the input elements
        that land in the padded buffer, or (None, None) when none does."""
        if not all(j1 > j0 for j0, j1 in self.stored):
            return None, None
        dst, src = [], []
        for d, (j0, j1) in zip(self.dims, self.stored, strict=True):
            start = d.pad_low + j0 * d.base_dilation
            dst.append(slice(start, start + (j1 - j0 - 1) * d.base_dilation + 1,
                             d.base_dilation))  # fmt: skip
            src.append(slice(j0, j1))
        return tuple(dst), tuple(src)

    def windows(self, p: np.ndarray, lead: int) -> np.ndarray:
        """[lead..., O..., K..., Cg] view of the windows of the padded input `p`."""
        st = p.strides
        spatial = st[lead : lead + len(self.dims)]
        shape = (*p.shape[:lead], *self.outs, *self.ksizes, p.shape[-1])
        strides = (
            *st[:lead],
            *(s * d.stride for s, d in zip(spatial, self.dims, strict=True)),
            *(s * d.window_dilation for s, d in zip(spatial, self.dims, strict=True)),
            st[-1],
        )
        return as_strided(p, shape, strides, writeable=False)

    def kernel(self, k: np.ndarray) -> np.ndarray:
        """[G, K..., Cg, Og] view of the kernel, reversed where the window says so."""
        kc = k.transpose(self.kperm)
        if self.flip:
            kc = np.flip(kc, self.flip)
        return np.moveaxis(_split_axis(kc, kc.ndim - 1, self.g), -2, 0)

    def output(self, out: np.ndarray) -> np.ndarray:
        """[Nb, O..., G * Og] view of the result."""
        return out.transpose(self.operm)


def _ordered(scratch, name, shape, work, strides, keep_order, src=None) -> np.ndarray:
    """A kept buffer of `shape` (zero at creation unless `src` fills it): row-major, or with
    `keep_order` laid out with its axes in the memory order that `strides` give."""
    order = list(range(len(shape)))
    if keep_order:
        order.sort(key=lambda i: -abs(strides[i]))
    buf = scratch.get(name, tuple(shape[i] for i in order), work, zero=src is None)
    buf = buf.transpose(np.argsort(order))
    if src is not None:
        np.copyto(buf, src, casting="unsafe")
    return buf


def _index_plan(
    geo: _Geometry, x_dims, k_dims, out_dims
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(input, kernel, output) index arrays of a small convolution's gather path: into the
    flat input with one zero appended, [G, rows, depth]; into the flat kernel, [G, depth,
    Og]; and for each element of the flat row-major result, its place in the flat
    [G, rows, Og] product, or None when that is the identity."""
    n = math.prod(x_dims)
    positions = np.arange(n, dtype=np.intp).reshape(x_dims)
    grouped = geo.grouped_input(positions)  # [G, Nb, S..., Cg]
    padded = np.full((*grouped.shape[:2], *geo.padded, grouped.shape[-1]), n, np.intp)
    dst, src = geo.stored_slices()
    if dst is not None:
        padded[(Ellipsis, *dst, slice(None))] = grouped[(Ellipsis, *src, slice(None))]
    depth = geo.pwin * geo.cg
    rows = geo.nb * geo.pout
    x_idx = np.ascontiguousarray(geo.windows(padded, 2)).reshape(geo.g, rows, depth)
    kernel = geo.kernel(np.arange(math.prod(k_dims), dtype=np.intp).reshape(k_dims))
    k_idx = np.ascontiguousarray(kernel).reshape(geo.g, depth, geo.og)
    # where each result element sits in the product [G, rows, Og]
    product = np.arange(geo.g * rows * geo.og, dtype=np.intp).reshape(geo.g, rows, geo.og)
    canon = np.moveaxis(product, 0, 1).reshape(geo.nb, *geo.outs, geo.g * geo.og)
    placed = np.empty(out_dims, np.intp)
    geo.output(placed)[...] = canon
    o_idx = placed.reshape(-1)
    if np.array_equal(o_idx, product.reshape(-1)):
        return x_idx, k_idx, None
    return x_idx, k_idx, o_idx


def _gathered(geo: _Geometry, instr: HloInstruction):
    """A small float convolution as three gathers and one batched matmul: the im2col rows
    and the kernel matrix are np.take of precomputed index arrays (padding, dilation,
    reversal and groups are all in the indices), so a run is a handful of NumPy calls instead
    of the strided-view set-up that costs more than a small convolution's arithmetic."""
    x_dims, k_dims = instr.operands[0].shape.dims, instr.operands[1].shape.dims
    out_dims = instr.shape.dims
    flops = convolution_flops(instr)
    # filled on the first run: a compile does not pay for the index arrays
    plan: list[tuple[np.ndarray, np.ndarray, np.ndarray | None]] = []

    def run(x: np.ndarray, k: np.ndarray, out: np.ndarray, work: np.dtype) -> None:
        if not plan:
            plan.append(_index_plan(geo, x_dims, k_dims, out_dims))
        x_idx, k_idx, o_idx = plan[0]
        flat = np.empty(x.size + 1, work)
        flat[-1] = 0
        np.copyto(flat[:-1].reshape(x.shape), x, casting="unsafe")
        kmat = np.take(np.asarray(k, dtype=work).reshape(-1), k_idx)
        y = np.empty((geo.g, x_idx.shape[1], geo.og), work)

        def rows(lo: int, hi: int) -> None:  # each block gathers its own im2col rows
            np.matmul(np.take(flat, x_idx[:, lo:hi]), kmat, out=y[:, lo:hi])

        split_run(x_idx.shape[1], flops, rows)  # BLAS on one thread, as every conv path
        if o_idx is not None:
            y = np.take(y.reshape(-1), o_idx)
        np.copyto(out, y.reshape(out.shape), casting="unsafe")

    return run


def _small_float(geo: _Geometry, instr: HloInstruction):
    """The gather path (`_gathered`) for a float or complex convolution small enough that its
    index arrays stay under _GATHER_MAX elements, or None."""
    operands = [np.empty(0, op.shape.dtype) for op in instr.operands]
    work = accumulation_dtype(instr.shape.element_type, *operands)
    if work.kind in "iu":
        return None
    depth = geo.pwin * geo.cg
    sizes = (geo.g * geo.nb * geo.pout * depth, geo.g * depth * geo.og, instr.shape.num_elements)
    if max(sizes) > _GATHER_MAX:
        return None
    body = _gathered(geo, instr)

    def run(values, out, ctx) -> bool:
        body(*values, out, work)
        return True

    return run


@dataclass(frozen=True, slots=True)
class DirectKernel:
    """A direct convolution kernel the driver compiled (codegen/emit_conv.py): `address()`
    answers its entry (waiting for the compile), `width` is the kernel buffer's padded
    output features, `extent` its outer range (tiles of output positions); `params`: the
    parameter block of the kernel library's convolution (codegen/emit_conv_library.py),
    which takes it as a fourth pointer, or None for a kernel compiled for its geometry."""

    address: Callable[[], int]
    width: int
    extent: int
    params: tuple[int, ...] | None = None


_DIRECT_MIN_FEATURES = 4  # fewer output features waste most of each vector register


def _direct_base(instr: HloInstruction) -> _Geometry | None:
    """The canonical geometry of `instr` where a direct kernel applies to it (two spatial
    dims, one group, f32 work, at least _DIRECT_MIN_FEATURES output features), else None."""
    if len(instr.operands) != 2 or not instr.shape.is_array or not supported_types(instr):
        return None
    labels, window = instr.dim_labels_or_none, instr.window_or_none
    if labels is None or window is None or len(window.dims) != 2 or len(labels.input_spatial) != 2:
        return None
    if any(0 in s for s in (instr.shape.dims, *(op.shape.dims for op in instr.operands))):
        return None
    operands = [np.empty(0, op.shape.dtype) for op in instr.operands]
    if accumulation_dtype(instr.shape.element_type, *operands) != np.float32:
        return None
    geo = _Geometry(instr, labels, window)
    if geo.g != 1 or geo.og < _DIRECT_MIN_FEATURES:
        return None
    return geo


def _row_major(dims) -> tuple[int, ...]:
    return tuple(math.prod(dims[i + 1 :]) for i in range(len(dims)))


def _common(geo: _Geometry) -> dict[str, Any]:
    return {
        "nb": geo.nb,
        "channels": geo.cg,
        "outs": tuple(geo.outs),
        "ksizes": tuple(geo.ksizes),
        "strides": tuple(d.stride for d in geo.dims),
        "dilations": tuple(d.window_dilation for d in geo.dims),
        "features": geo.og,
    }


def direct_geometry(instr: HloInstruction) -> dict[str, Any] | None:
    """The geometry of the direct kernel the library path runs for `instr` on the padded
    input it writes and a row-major result (emit_conv.DirectConv's fields but the target's
    vector shape), or None where the direct path does not apply (see the file comment)."""
    geo = _direct_base(instr)
    if geo is None:
        return None
    padded = tuple(geo.padded)
    return {
        **_common(geo),
        "sizes": padded,
        "pads": (0, 0),
        "base_dilations": (1, 1),
        "checked": (False, False),
        "x_strides": _row_major((geo.nb, *padded, geo.cg)),
        "out_strides": _row_major((geo.nb, *geo.outs, geo.og)),
    }


def _element_strides(shape) -> tuple[int, ...] | None:
    """The element stride of each logical dim of `shape` in its layout, or None for a
    tiled layout."""
    layout = shape.layout_or_default
    if layout.tiles:
        return None
    strides, step = [0] * shape.rank, 1
    for d in layout.minor_to_major:
        strides[d] = step
        step *= shape.dims[d]
    return tuple(strides)


def arena_geometry(instr: HloInstruction) -> dict[str, Any] | None:
    """The geometry of a direct kernel that reads `instr`'s input and writes its result
    where they lie (DirectConvThunk: f32 input and result in untiled layouts; padding and
    base dilation checked in the kernel), or None (see the file comment)."""
    geo = _direct_base(instr)
    if geo is None:
        return None
    x, out = instr.operands[0].shape, instr.shape
    if x.dtype != np.float32 or out.dtype != np.float32:
        return None
    xs, ys = _element_strides(x), _element_strides(out)
    if xs is None or ys is None or _element_strides(instr.operands[1].shape) is None:
        return None
    labels = instr.dim_labels_or_none
    assert labels is not None, "_direct_base checked the labels"
    sizes = tuple(x.dims[d] for d in labels.input_spatial)
    x_order = (labels.input_batch, *labels.input_spatial, labels.input_feature)
    y_order = (labels.output_batch, *labels.output_spatial, labels.output_feature)
    return {
        **_common(geo),
        "sizes": sizes,
        "pads": tuple(d.pad_low for d in geo.dims),
        "base_dilations": tuple(d.base_dilation for d in geo.dims),
        "checked": tuple(d.base_dilation > 1 or d.pad_low > 0 or d.pad_high > 0 for d in geo.dims),
        "x_strides": tuple(xs[d] for d in x_order),
        "out_strides": tuple(ys[d] for d in y_order),
    }


_PROTO = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * 3), ctypes.c_int64, ctypes.c_int64)
_LIBRARY_PROTO = ctypes.CFUNCTYPE(
    None, *([ctypes.c_void_p] * 4), ctypes.c_int64, ctypes.c_int64
)  # the library's kernel: a parameter block after the three arrays
_DIRECT_SPLIT_FLOPS = 1 << 20  # smaller convolutions run whole on the calling thread
_BLOCKS_PER_THREAD = 4  # native pool blocks per thread: threads that finish early take more


def _direct(geo: _Geometry, kernel: DirectKernel, flops: float):
    """The run of a direct kernel (see the file comment)."""
    fn: list = []  # the entry as a ctypes function, made on the first run
    choice = tiles_split(flops, kernel.extent)
    block = None if kernel.params is None else np.array(kernel.params, np.int64)
    proto = _PROTO if block is None else _LIBRARY_PROTO

    def body(x, k, out, acc, work, result, scratch: _Scratch) -> None:
        if not fn:
            fn.append(proto(kernel.address()))
        p = geo.padded_input(geo.grouped_input(x), work, scratch)[0]  # [Nb, P0, P1, Cg]
        if not p.flags.c_contiguous:
            p = _ordered(scratch, "direct_input", p.shape, work, (), False, p)
        # the kernel [K0, K1, Cg, width]: features past Og stay zero
        w = scratch.get("direct_kernel", (*geo.ksizes, geo.cg, kernel.width), work, zero=True)
        np.copyto(w[..., : geo.og], geo.kernel(k)[0], casting="unsafe")
        canon = geo.output(out)  # [Nb, O0, O1, Og]
        direct = canon.dtype == work and canon.flags.c_contiguous
        target = canon if direct else scratch.get("direct_out", canon.shape, work)
        ptrs = [target.ctypes.data, p.ctypes.data, w.ctypes.data]
        if block is not None:  # the library kernel's parameter block (kept by this closure)
            ptrs.append(block.ctypes.data)
        run_tiles(fn[0], ptrs, kernel.extent, choice)
        if not direct:
            _store(canon, target, acc, result)

    return body


def tiles_split(flops: float, extent: int) -> SplitChoice | None:
    """The split choice of a direct kernel of `flops` over `extent` tiles, or None when it
    always runs whole (small, one tile, or one thread)."""
    if flops < _DIRECT_SPLIT_FLOPS or pool_size() < 2 or extent < 2:
        return None
    return SplitChoice()


def run_tiles(fn, ptrs: list[int], extent: int, choice: SplitChoice | None) -> None:
    """A direct kernel `fn` over its tiles [0, extent): whole without a split choice
    (tiles_split), else whole or in blocks over the native pool (the Python pool without
    one), whichever `choice` finds faster on this machine's load."""
    if choice is None:
        fn(*ptrs, 0, extent)
        return
    split = choice.next_split()
    start = time.perf_counter()
    if split:
        _split_tiles(fn, ptrs, extent)
    else:
        fn(*ptrs, 0, extent)
    choice.record(split, time.perf_counter() - start)


def _split_tiles(fn, ptrs: list[int], extent: int) -> None:
    threads = pool_size()
    blocks = min(extent, threads * _BLOCKS_PER_THREAD)
    native = native_pool()
    address = ctypes.cast(fn, ctypes.c_void_p).value
    if native is not None and address:
        native.run(address, ptrs, extent, blocks)
        return
    run_blocks(lambda lo, hi: fn(*ptrs, lo, hi), even_blocks(extent, blocks))


@loadable
def plan_convolution(instr: HloInstruction, direct: DirectKernel | None = None):
    """A fast convolution (see the file comment), or None when the rule should run.
    `direct`: the direct kernel the driver compiled for `instr` (direct_geometry), if any."""
    if len(instr.operands) != 2 or not instr.shape.is_array or not supported_types(instr):
        return None
    labels, window = instr.dim_labels_or_none, instr.window_or_none
    if labels is None or window is None or len(window.dims) != len(labels.input_spatial):
        return None
    if not window.dims:  # no spatial dims: a dot, rare; the rule handles it
        return None
    if any(0 in s for s in (instr.shape.dims, *(op.shape.dims for op in instr.operands))):
        return None
    geo = _Geometry(instr, labels, window)
    result = instr.shape.element_type
    gathered = _small_float(geo, instr)
    if gathered is not None:
        return gathered
    if direct is not None:
        return _planned(geo, result, _direct(geo, direct, convolution_flops(instr)))
    return _planned(geo, result, None)


def _planned(geo: _Geometry, result, only):
    """The run of a convolution: `only` (a path's body) when given, else the path the
    geometry picks (banded, reducing, shifted, depthwise, im2col)."""
    body = _depthwise if geo.depthwise else _im2col
    scratch = _Scratch()

    def run(values, out, ctx) -> bool:
        x, k = values
        if np.may_share_memory(out, x) or np.may_share_memory(out, k):
            return False
        acc = accumulation_dtype(result, x, k)
        work = work_dtype(acc, x, k, geo.pwin * geo.cg)
        if only is not None:
            only(x, k, out, acc, work, result, scratch)
        elif geo.banded and raw_gemm(work) is not None:
            _banded(geo, x, k, out, acc, work, result, scratch)
        elif geo.reducing and raw_gemm(work) is not None:
            _reducing(geo, x, k, out, acc, work, result, scratch)
        elif geo.shifted and raw_gemm(work) is not None:
            _shifted(geo, x, k, out, acc, work, result, scratch)
        else:
            body(geo, x, k, out, acc, work, result, scratch)
        return True

    return run


def _store(dst: np.ndarray, y: np.ndarray, acc, result) -> None:
    if y.dtype != dst.dtype:
        y = from_work(y, acc, result)
    np.copyto(dst, y)


def _segments(lo: int, hi: int, o1: int):
    """Index pairs over the [Nb, O1] unit grid covering units [lo, hi) (unit = n * O1 + i):
    a partial batch item, whole items, a partial item."""
    while lo < hi:
        n, i = divmod(lo, o1)
        if i == 0 and hi - lo >= o1:
            whole = (hi - lo) // o1
            yield lo, slice(n, n + whole), slice(None)
            lo += whole * o1
            continue
        end = min(hi, (n + 1) * o1)
        yield lo, slice(n, n + 1), slice(i, end - n * o1)
        lo = end


def _units(geo: _Geometry, lo: int, hi: int, unit_bytes: int):
    """_segments over [lo, hi) in blocks of about _CHUNK_BYTES."""
    step = max(1, _CHUNK_BYTES // max(unit_bytes, 1))
    for a in range(lo, hi, step):
        yield from _segments(a, min(hi, a + step), geo.outs[0])


def _matrix_view(part: np.ndarray, shape: tuple[int, ...]) -> np.ndarray | None:
    """`part` as BLAS-ready matrices of `shape` without a copy (a 1x1 window's input), or
    None."""
    try:
        view = np.reshape(part, shape, copy=False)
    except ValueError:
        return None
    return view if blas_ready(view) is view else None


def _im2col(geo: _Geometry, x, k, out, acc, work, result, scratch: _Scratch) -> None:
    nsp = len(geo.dims)
    p = geo.padded_input(geo.grouped_input(x), work, scratch)  # [G, Nb, P..., Cg]
    w = geo.windows(p, 2)  # [G, Nb, O..., K..., Cg]
    kmat = np.ascontiguousarray(geo.kernel(k), dtype=work).reshape(geo.g, geo.pwin * geo.cg, geo.og)
    canon = geo.output(out)  # [Nb, O..., G * Og]
    direct = geo.g == 1 and canon.dtype == work and canon.flags.c_contiguous
    flat = canon.reshape(-1, geo.og) if direct else None
    rest = geo.pout // geo.outs[0]  # rows per unit
    depth = geo.pwin * geo.cg

    unit_bytes = geo.g * rest * depth * work.itemsize

    def block(lo: int, hi: int) -> None:
        step = max(1, _CHUNK_BYTES // max(unit_bytes, 1))
        whole = scratch.get("cols", (geo.g, min(hi - lo, step) * rest, depth), work)
        for start, sn, so in _units(geo, lo, hi, unit_bytes):
            part = w[:, sn, so]
            rows = part.shape[1] * part.shape[2] * rest
            cols = _matrix_view(part, (geo.g, rows, depth))
            if cols is None:
                cols = whole[:, :rows]
                np.copyto(np.reshape(cols, part.shape, copy=False), part)
            if flat is not None:
                np.matmul(cols[0], kmat[0], out=flat[start * rest : start * rest + rows])
                continue
            y = np.matmul(cols, kmat).reshape(geo.g, *part.shape[1 : 2 + nsp], geo.og)
            dst = _split_axis(canon[sn, so], nsp + 1, geo.g)  # [n, O..., G, Og]
            _store(np.moveaxis(dst, -2, 0), y, acc, result)

    units = geo.nb * geo.outs[0]
    split_run(units, 2.0 * geo.g * geo.nb * geo.pout * depth * geo.og, block)


def _contiguous_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    return tuple(itemsize * math.prod(shape[i + 1 :]) for i in range(len(shape)))


def _banded(geo: _Geometry, x, k, out, acc, work, result, scratch: _Scratch) -> None:
    """Convolution as a sum of products with band rows (see the file comment)."""
    gemm = raw_gemm(work)
    it = work.itemsize
    p = geo.padded_input(geo.grouped_input(x), work, scratch)  # [G, Nb, P..., Cg]
    last = geo.dims[-1]
    depth = geo.ksizes[-1] * geo.cg
    st = p.strides
    bands = as_strided(
        p,
        (*p.shape[:-2], geo.outs[-1], geo.ksizes[-1], p.shape[-1]),
        (*st[:-2], st[-2] * last.stride, st[-2] * last.window_dilation, st[-1]),
        writeable=False,
    )  # [G, Nb, P_outer..., O_last, K_last, Cg]
    kmat = np.ascontiguousarray(geo.kernel(k), dtype=work)
    kmat = kmat.reshape(geo.g, -1, depth, geo.og)  # [G, K_outer, K_last * Cg, Og]
    canon = geo.output(out)  # [Nb, O..., G * Og]
    direct = canon.dtype == work and canon.flags.c_contiguous
    ldc = geo.g * geo.og
    rows = geo.outs[-2] * geo.outs[-1]  # one product per output [O_outer_last, O_last] plane
    shape = (geo.g, *p.shape[2:-2], geo.outs[-1], depth)  # one batch item of the bands
    n_bytes = math.prod(shape) * it
    # byte offsets of each product's operands: in a batch item's bands, in the kernel, in a
    # batch item of the result (shaped [O..., G * Og])
    band_st = _contiguous_strides(shape, it)
    out_st = _contiguous_strides((*geo.outs, ldc), it)
    k_base = kmat.ctypes.data
    # the rows of a plane in blocks of about _BAND_BLOCK_ROWS, each block's products back to
    # back, so the block of the result they accumulate stays in cache
    per_block = max(1, min(rows, _BAND_BLOCK_ROWS))
    products = []
    for g, plane in itertools.product(range(geo.g), np.ndindex(*geo.outs[:-2])):
        c_off = g * geo.og * it + sum(i * s for i, s in zip(plane, out_st, strict=False))
        for r0 in range(0, rows, per_block):
            m = min(per_block, rows - r0)
            for ko, kidx in enumerate(np.ndindex(*geo.ksizes[:-1])):
                at = [i + j * d.window_dilation for i, j, d in zip((*plane, 0), kidx, geo.dims)]
                a_off = g * band_st[0] + sum(i * s for i, s in zip(at, band_st[1:], strict=False))
                b_at = k_base + g * kmat.strides[0] + ko * kmat.strides[1]
                products.append(
                    (m, a_off + r0 * depth * it, b_at, float(ko > 0), c_off + r0 * ldc * it)
                )

    def block(lo: int, hi: int) -> None:
        step = min(hi - lo, max(1, _CHUNK_BYTES // max(n_bytes, 1)))
        whole = scratch.get("bands", (step, *bands.shape[:1], *bands.shape[2:]), work)
        staged = None if direct else scratch.get("out", (step, *geo.outs, ldc), work)
        for a in range(lo, hi, step):
            b = min(hi, a + step)
            band = whole[: b - a]  # [n, G, P_outer..., O_last, K_last, Cg]
            np.copyto(band, bands[:, a:b].swapaxes(0, 1))
            target = canon[a:b] if staged is None else staged[: b - a]
            band_at, target_at = band.ctypes.data, target.ctypes.data
            for n in range(b - a):
                a_n, c_n = band_at + n * n_bytes, target_at + n * out_st[0] * geo.outs[0]
                for m, a_off, b_at, beta, c_off in products:
                    gemm(m, geo.og, depth, a_n + a_off, depth, b_at, geo.og, beta, c_n + c_off,
                         ldc)  # fmt: skip
            if not direct:
                _store(canon[a:b], target, acc, result)

    flops = 2.0 * geo.g * geo.nb * geo.pout * geo.pwin * geo.cg * geo.og
    per_group = math.prod(geo.ksizes[:-1])  # products accumulating into one block of rows
    grouped = [products[i : i + per_group] for i in range(0, len(products), per_group)]
    groups = len(grouped)
    if not direct or groups < 2 or geo.nb >= pool_size():
        split_run(geo.nb, flops, block)
        return

    # fewer batch items than threads: the units are (batch item, block of output rows), each
    # block copying its item's bands again (a few per cent of the products' time)
    def item_rows(lo: int, hi: int) -> None:
        band = scratch.get("bands", (1, *bands.shape[:1], *bands.shape[2:]), work)[0]
        band_at, item = band.ctypes.data, -1
        for unit in range(lo, hi):
            n, group = divmod(unit, groups)
            if n != item:
                np.copyto(band, bands[:, n])
                item = n
            c_n = canon[n].ctypes.data
            for m, a_off, b_at, beta, c_off in grouped[group]:
                gemm(m, geo.og, depth, band_at + a_off, depth, b_at, geo.og, beta, c_n + c_off,
                     ldc)  # fmt: skip

    split_run(geo.nb * groups, flops, item_rows)


def _reducing(geo: _Geometry, x, k, out, acc, work, result, scratch: _Scratch) -> None:
    """A large window over a small output as products with a long contraction (see the file
    comment)."""
    gemm = raw_gemm(work)
    it = work.itemsize
    p = geo.padded_input(geo.grouped_input(x)[0], work, scratch, keep_order=True)
    d0, d1 = geo.dims
    (k0, k1), (o0, o1) = geo.ksizes, geo.outs
    nb, og = geo.nb, geo.og
    span = (o0 - 1) * d0.stride + k0  # padded rows a product reads
    st = p.strides  # [Nb, P0, P1, Cg]
    bands = as_strided(
        p,
        (geo.cg, span, k1, o1, nb),
        (st[3], st[1], st[2] * d1.window_dilation, st[2] * d1.stride, st[0]),
        writeable=False,
    )  # [Cg, P0, K1, O1, Nb]
    kc = geo.kernel(k)[0].transpose(2, 0, 1, 3)  # [Cg, K0, K1, Og]
    ks = kc.strides
    if not (kc.dtype == work and ks[3] == it and ks[1] == k1 * ks[2] and ks[2] % it == 0
            and ks[2] >= og * it):  # fmt: skip
        kc = _ordered(scratch, "kernel", kc.shape, work, (), False, kc)
    ldb, k_at = kc.strides[2] // it, kc.ctypes.data
    m = o1 * nb  # output rows of one product: [O1, Nb] for one O0 position
    step_a = d0.stride * k1 * m * it
    # Partial sums by their block's first feature, added in that order: in the order the
    # blocks finish, 3 or more of them would round differently from run to run.
    partials: dict[int, np.ndarray] = {}

    def block(lo: int, hi: int) -> None:
        band = scratch.get("reduce", bands.shape[1:], work)
        part = scratch.get(f"partial{lo}", (o0, m, og), work)
        a_at, c_at = band.ctypes.data, part.ctypes.data
        for c in range(lo, hi):
            np.copyto(band, bands[c])
            beta, b_at = float(c > lo), k_at + c * kc.strides[0]
            for i in range(o0):
                gemm(m, og, k0 * k1, a_at + i * step_a, m, b_at, ldb, beta,
                     c_at + i * m * og * it, og, trans_a=True)  # fmt: skip
        partials[lo] = part

    split_run(geo.cg, 2.0 * nb * geo.pout * geo.pwin * geo.cg * og, block)
    first, *rest = sorted(partials)
    total = partials[first]
    for lo in rest:
        total += partials[lo]
    y = total.reshape(o0, o1, nb, og).transpose(2, 0, 1, 3)  # [Nb, O0, O1, Og]
    _store(geo.output(out), y, acc, result)


def _depthwise(geo: _Geometry, x, k, out, acc, work, result, scratch: _Scratch) -> None:
    xc = x.transpose(geo.xperm)  # [Nb, S..., G]: one feature per group
    w = geo.windows(geo.padded_input(xc, work, scratch), 1)  # [Nb, O..., K..., G]
    kw = np.ascontiguousarray(geo.kernel(k), dtype=work)  # [G, K..., 1, Og]
    kw = np.ascontiguousarray(np.moveaxis(kw.reshape(geo.g, geo.pwin, geo.og), 0, 1))
    canon = geo.output(out)  # [Nb, O..., G * Og]
    offsets = list(np.ndindex(*geo.ksizes))
    rest = geo.pout // geo.outs[0]
    unit_bytes = rest * geo.g * geo.og * work.itemsize

    def block(lo: int, hi: int) -> None:
        for _, sn, so in _units(geo, lo, hi, unit_bytes):
            part = w[sn, so]
            y = np.zeros((*part.shape[: 1 + len(geo.dims)], geo.g, geo.og), work)
            tmp = np.empty_like(y)
            for i, offset in enumerate(offsets):
                xs = part[(Ellipsis, *offset, slice(None))]
                np.multiply(xs[..., None], kw[i], out=tmp)
                y += tmp
            _store(canon[sn, so], y.reshape(*y.shape[:-2], -1), acc, result)

    flops = 2.0 * geo.nb * geo.pout * geo.pwin * geo.g * geo.og
    split_run(geo.nb * geo.outs[0], flops, block)


def _shifted(geo: _Geometry, x, k, out, acc, work, result, scratch: _Scratch) -> None:
    """A unit-stride convolution with few input features as one long product per block of
    padded positions, its transposed im2col made of shifted slices (see the file comment)."""
    gemm = raw_gemm(work)
    it = work.itemsize
    plane = math.prod(geo.padded)
    pst = _contiguous_strides(tuple(geo.padded), 1)  # element strides of a padded plane
    steps = [s * d.window_dilation for s, d in zip(pst, geo.dims, strict=True)]
    slack = sum((n - 1) * s for n, s in zip(geo.ksizes, steps, strict=True))
    total = geo.nb * plane
    # feature-major padded input [Cg, Nb, P...], then `slack` zeros that the last padded
    # positions (whose outputs are dropped) read
    buf = scratch.get("shifted", (geo.cg, total + slack), work, zero=True)
    dst, src = geo.stored_slices()
    if dst is not None:
        grid = buf[:, :total].reshape(geo.cg, geo.nb, *geo.padded)
        xc = np.moveaxis(geo.grouped_input(x)[0], -1, 0)  # [Cg, Nb, S...]
        np.copyto(grid[(slice(None), slice(None), *dst)], xc[(slice(None), slice(None), *src)])
    depth = geo.pwin * geo.cg
    cols = as_strided(
        buf,
        (*geo.ksizes, geo.cg, total),
        (*(s * it for s in steps), buf.strides[0], it),
        writeable=False,
    )  # [K..., Cg, position]: each row a shifted slice of one feature's padded input
    kmat = np.ascontiguousarray(geo.kernel(k)[0], dtype=work).reshape(depth, geo.og)
    canon = geo.output(out)  # [Nb, O..., Og]
    og = geo.og
    step = max(64, _SHIFT_BLOCK_BYTES // (depth * it))  # positions per product
    valid = (slice(None), *(slice(0, o) for o in geo.outs))
    per = max(1, _CHUNK_BYTES // (plane * og * it))  # batch items per staged block

    def block(lo: int, hi: int) -> None:
        t_cols = scratch.get("shifted_cols", (depth, step), work)
        staged = scratch.get("shifted_out", (min(per, hi - lo) * plane, og), work)
        c_at, a_at = staged.ctypes.data, t_cols.ctypes.data
        for a in range(lo, hi, per):
            b = min(hi, a + per)
            for t0 in range(a * plane, b * plane, step):
                m = min(step, b * plane - t0)
                np.copyto(t_cols[:, :m].reshape(*geo.ksizes, geo.cg, m), cols[..., t0 : t0 + m])
                gemm(m, og, depth, a_at, step, kmat.ctypes.data, og, 0.0,
                     c_at + (t0 - a * plane) * og * it, og, trans_a=True)  # fmt: skip
            y = staged[: (b - a) * plane].reshape(b - a, *geo.padded, og)[valid]
            _store(canon[a:b], y, acc, result)

    flops = 2.0 * total * depth * og
    split_run(geo.nb, flops, block)


class ConvolutionThunk(RuleThunk):
    """A convolution: `plan_convolution`'s fast path where it has one, else the rule. Its
    cost is its flops at BLAS speed, and it splits itself over the pool."""

    def cost(self) -> float:
        return 5_000 + convolution_flops(self.instr) * NS_PER_FLOP * 2

    def runs_alone(self) -> bool:
        return False


class DirectConvThunk(Thunk):
    """A convolution as a direct kernel on the arena (arena_geometry; compiled for its
    geometry, or the kernel library's with its parameter block): a run packs the
    kernel operand into a kept buffer (one NumPy copy through a view worked out on the first
    run) and runs the kernel's tiles on the input and result where they lie, whole or over
    the native pool (run_tiles): no padded input, no staged result, no fallback path."""

    kind = "kernel"

    def __init__(
        self,
        instr: HloInstruction,
        kernel: DirectKernel,
        out: BufferSlice,
        x: BufferSlice,
        w: BufferSlice,
    ):
        labels, window = instr.dim_labels_or_none, instr.window_or_none
        assert labels is not None and window is not None, "arena_geometry checked them"
        self.instr, self.kernel = instr, kernel
        self.out, self.x, self.w = out, x, w
        self.geo = _Geometry(instr, labels, window)
        self.flops = convolution_flops(instr)
        self._reset()

    def _reset(self) -> None:
        self._fn: Any = None  # the entry as a ctypes function, made on the first run
        params = self.kernel.params  # the library kernel's parameter block, made once
        block = None if params is None else np.array(params, np.int64)
        # with its address: `.ctypes.data` costs a microsecond or so a call
        self._block = None if block is None else (block, block.ctypes.data)
        self._pack: tuple | None = None  # (shape, strides, byte offset) of the kernel's view
        self._src: tuple | None = None  # (arena memory, the kernel's view in it)
        self._local = threading.local()  # per thread: (packed[..., :Og], its address, packed)
        self._choice = tiles_split(self.flops, self.kernel.extent)  # whole or split: measured

    def __getstate__(self) -> dict:
        """The thunk without what a run makes (remade on the first run after unpickling)."""
        state = dict(self.__dict__)
        for name in ("_fn", "_block", "_pack", "_src", "_local", "_choice"):
            state.pop(name)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._reset()

    def _source(self, ctx: ExecutionContext) -> np.ndarray:
        """The kernel operand as [K0, K1, Cg, Og] (reversed where the window says) in this
        execution's memory."""
        w, mem = self.w, ctx.memory[self.w.allocation]
        src = self._src
        if src is not None and src[0] is mem:
            return src[1]
        pack = self._pack
        if pack is None:
            view = self.geo.kernel(ctx.view(w))[0]
            pack = self._pack = (view.shape, view.strides, view.ctypes.data - ctx.ptr(w))
        shape, strides, offset = pack
        view = np.ndarray(shape, w.shape.dtype, mem, w.offset + offset, strides)
        self._src = (mem, view)
        return view

    def run(self, ctx: ExecutionContext) -> None:
        fn, block = self._fn, self._block
        if fn is None:
            proto = _PROTO if block is None else _LIBRARY_PROTO
            fn = self._fn = proto(self.kernel.address())
        src = self._source(ctx)
        kept = getattr(self._local, "packed", None)
        if kept is None:
            packed = np.zeros((*src.shape[:3], self.kernel.width), np.float32)
            kept = self._local.packed = (packed[..., : src.shape[3]], packed.ctypes.data, packed)
        np.copyto(kept[0], src, casting="unsafe")
        bases = ctx.bases
        ptrs = [bases[self.out.allocation] + self.out.offset,
                bases[self.x.allocation] + self.x.offset, kept[1]]  # fmt: skip
        if block is not None:
            ptrs.append(block[1])
        run_tiles(fn, ptrs, self.kernel.extent, self._choice)

    def describe(self) -> list[str]:
        kind = "direct" if self.kernel.params is None else "library"
        head = f"kernel {self.instr.name} = convolution -> {kind} convolution on the arena"
        return [head, *slice_lines("out", [self.out]), *slice_lines("in", [self.x, self.w])]

    def cost(self) -> float:
        return 2_000 + self.flops * NS_PER_FLOP * 2

    def runs_alone(self) -> bool:
        return False


def convolution_flops(instr: HloInstruction) -> float:
    """The multiply-adds of a convolution, times two."""
    labels = instr.dim_labels_or_none
    kernel = instr.operands[1].shape
    if labels is None or not instr.shape.is_array:
        return 0.0
    per_output = kernel.num_elements / max(kernel.dims[labels.kernel_output_feature], 1)
    return 2.0 * instr.shape.num_elements * per_output
