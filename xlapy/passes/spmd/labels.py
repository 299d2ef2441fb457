"""Dimension labels: how each operation's operand and result dimensions line up.

An operation's rule names its iteration space by labels (small ints) and says, for each
operand dimension and each result dimension, which label it follows, or None: a dimension
the operation needs whole (a slice's cut dimension, a reduce-window's windowed dimension,
a gather's indexed dimension, a concatenation's dimension). A label that the operands
carry but the result does not is contracted: a dot's contracting dimensions, a reduce's
reduced ones; cutting it leaves every device a partial result, which an all-reduce with
`reducer` completes (the rule gives a reducer only when that is correct: a sum of
products, or a reduce whose init value is its reducer's identity).

Sharding propagation and partitioning read these rules alike: a label cut N ways in the
op's tiling cuts every dimension carrying it N ways, in the same device order, and the op
runs unchanged on the local pieces (xlapy.passes.spmd.partitioner). One rule per opcode,
side by side; an opcode without a rule is partitioned by replicating its operands.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from xlapy.errors import XlapyError
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.opcodes import Category, Opcode

Dims = tuple[int | None, ...]


@dataclass(frozen=True, slots=True)
class OpLabels:
    """Labels of one operation: per operand, per result (one entry per tuple element, or
    one for an array result) and the contracted labels with the reducer completing them."""

    operands: tuple[Dims, ...]
    results: tuple[Dims, ...]
    contracted: tuple[int, ...] = ()
    reducer: str | None = None  # "add", "max", ... for an all-reduce over contracted labels
    num_labels: int = 0
    sizes: dict[int, int] = field(default_factory=dict)
    halos: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Windowed labels whose windows overlap: label -> (left, right), the rows each device
    needs from its neighbours along the label (a halo exchange, see `_halo`)."""


def _finish(instr: HloInstruction, operands, results, reducer=None, halos=None) -> OpLabels:
    sizes: dict[int, int] = {}
    shapes = [op.shape for op in instr.operands]
    result_shapes = list(instr.shape.tuple_shapes) if instr.shape.is_tuple else [instr.shape]
    for dims, shape in [*zip(operands, shapes, strict=True), *zip(results, result_shapes)]:
        for label, size in zip(dims, shape.dims, strict=True):
            if label is not None:
                sizes.setdefault(label, size)
    used_out = {x for dims in results for x in dims if x is not None}
    contracted = tuple(sorted(x for x in sizes if x not in used_out))
    if contracted and reducer is None:
        return OpLabels(
            tuple(tuple(None if x in contracted else x for x in d) for d in operands),
            tuple(results),
            (),
            None,
            max(sizes, default=-1) + 1,
            {k: v for k, v in sizes.items() if k not in contracted},
            halos or {},
        )
    return OpLabels(
        tuple(operands),
        tuple(results),
        contracted,
        reducer,
        max(sizes, default=-1) + 1,
        sizes,
        halos or {},
    )


def _same(instr: HloInstruction) -> OpLabels:
    rank = instr.shape.rank
    out = tuple(range(rank))
    ops = tuple(out if op.shape.rank == rank else () for op in instr.operands)
    return _finish(instr, ops, (out,))


def _broadcast(instr: HloInstruction) -> OpLabels:
    out = tuple(range(instr.shape.rank))
    return _finish(instr, (tuple(out[d] for d in instr.dimensions),), (out,))


def _transpose(instr: HloInstruction) -> OpLabels:
    out = tuple(range(instr.shape.rank))
    perm = instr.dimensions
    operand: list[int | None] = [None] * len(perm)
    for i, p in enumerate(perm):
        operand[p] = out[i]
    return _finish(instr, (tuple(operand),), (out,))


def _reshape(instr: HloInstruction) -> OpLabels:
    """Groups of input and output dimensions with equal products; the major dimensions of
    a group share a label (a block of rows stays a block of rows), the rest stay whole."""
    a, b = instr.operand(0).shape.dims, instr.shape.dims
    ins: list[int | None] = [None] * len(a)
    outs: list[int | None] = [None] * len(b)
    i = j = 0
    label = 0
    while i < len(a) and j < len(b):
        if a[i] == 1:
            i += 1
            continue
        if b[j] == 1:
            j += 1
            continue
        ins[i] = outs[j] = label
        label += 1
        pa, pb = a[i], b[j]
        i += 1
        j += 1
        while pa != pb:
            if pa < pb:
                pa *= a[i]
                i += 1
            else:
                pb *= b[j]
                j += 1
    return _finish(instr, (tuple(ins),), (tuple(outs),))


def _slice(instr: HloInstruction) -> OpLabels:
    dims = instr.operand(0).shape.dims
    spec = instr.slice_spec.dims
    labels = tuple(
        i if (s == 0 and e == n and st == 1) else None
        for i, ((s, e, st), n) in enumerate(zip(spec, dims, strict=True))
    )
    return _finish(instr, (labels,), (labels,))


def _pad(instr: HloInstruction) -> OpLabels:
    labels = tuple(i if p == (0, 0, 0) else None for i, p in enumerate(instr.padding_config.dims))
    return _finish(instr, (labels, ()), (labels,))


def _concatenate(instr: HloInstruction) -> OpLabels:
    (dim,) = instr.dimensions
    labels = tuple(None if i == dim else i for i in range(instr.shape.rank))
    return _finish(instr, tuple(labels for _ in instr.operands), (labels,))


def _reverse(instr: HloInstruction) -> OpLabels:
    gone = set(instr.dimensions)
    labels = tuple(None if i in gone else i for i in range(instr.shape.rank))
    return _finish(instr, (labels,), (labels,))


_REDUCERS = {
    Opcode.ADD: ("add", 0),
    Opcode.MULTIPLY: ("multiply", 1),
    Opcode.MAXIMUM: ("maximum", "-inf"),
    Opcode.MINIMUM: ("minimum", "inf"),
    Opcode.OR: ("or", 0),
    Opcode.AND: ("and", 1),
}


def _reducer_of(instr: HloInstruction) -> str | None:
    """The reducer's name when `instr` (a reduce) may be completed by an all-reduce: one
    binary op of its two parameters, and an init value that is that op's identity."""
    if len(instr.operands) != 2:
        return None
    comp = instr.to_apply
    root = comp.root
    if root is None or root.opcode not in _REDUCERS:
        return None
    if sorted(op.opcode.text for op in root.operands) != ["parameter", "parameter"]:
        return None
    init = instr.operand(1)
    if init.opcode is not Opcode.CONSTANT or init.literal is None:
        return None
    name, identity = _REDUCERS[root.opcode]
    value = init.literal.array
    if value is None or value.shape != ():
        return None
    v = value.item()
    if isinstance(identity, str):
        ok = v == float(identity) or (
            value.dtype.kind in "iu" and v in _int_extremes(value.dtype, identity)
        )
    else:
        ok = v == identity
    return name if ok else None


def _int_extremes(dtype, which: str) -> tuple[int, ...]:
    info = np.iinfo(dtype)
    return (info.min,) if which == "-inf" else (info.max,)


GATHER_AND_REDUCE = "gather-and-reduce"
"""The reducer of a variadic reduce (argmax, argmin) over a cut dimension: each device
reduces its piece, the partial results are all-gathered along a new dimension and reduced
again with the same computation (XLA's way; an all-reduce carries one array only)."""


def _variadic_identity(instr: HloInstruction) -> bool:
    """Whether a variadic reduce may be completed by gathering and reducing its partial
    results: its init values are scalar constants that its reducer leaves every probe
    value unchanged with, on either side (reducing twice applies them twice). Probes:
    random values of each operand's type, zero, and the init values themselves."""
    from xlapy.passes.constant_folding import _FoldContext

    n = len(instr.operands) // 2
    inits = instr.operands[n:]
    literals = [i.literal for i in inits if i.opcode is Opcode.CONSTANT]
    if len(literals) != len(inits) or any(x is None for x in literals):
        return False
    init = [np.asarray(x.array) for x in literals if x is not None]
    if any(a.shape != () for a in init):
        return False
    rng = np.random.default_rng(0)
    probes = [[np.zeros((), a.dtype) for a in init], [a.copy() for a in init]]
    for _ in range(6):
        row = []
        for a in init:
            if a.dtype.kind in "iu":
                row.append(np.asarray(rng.integers(0, 100), a.dtype))
            elif a.dtype.kind == "b":
                row.append(np.asarray(rng.integers(0, 2) == 1))
            else:
                row.append(np.asarray(rng.normal() * 10).astype(a.dtype))
        probes.append(row)
    ctx = _FoldContext()
    comp = instr.to_apply
    try:
        for x in probes:
            for args in ([*init, *x], [*x, *init]):
                got = ctx.call(comp, args)
                got = got if isinstance(got, tuple | list) else (got,)
                if not all(np.array_equal(g, w, equal_nan=True) for g, w in zip(got, x)):
                    return False
    except (XlapyError, ArithmeticError, TypeError, ValueError):  # cannot tell: no
        return False
    return True


def _reduce(instr: HloInstruction) -> OpLabels:
    n = len(instr.operands) // 2
    rank = instr.operand(0).shape.rank
    reduced = set(instr.dimensions)
    reducer = _reducer_of(instr)
    if reducer is None and n > 1 and _variadic_identity(instr):
        reducer = GATHER_AND_REDUCE
    labels = tuple(i if (i not in reduced or reducer) else None for i in range(rank))
    out = tuple(labels[i] for i in range(rank) if i not in reduced)
    return _finish(instr, (labels,) * n + ((),) * n, (out,) * n, reducer)


def _trivial(window_dim) -> bool:
    """A window dimension whose windows do not overlap and need no padding (size 1, or
    size = stride, as in pooling and patch embeddings): a block of whole windows per
    device partitions it with no data from a neighbour (the label's divisibility check
    on the result's size keeps each device's block a whole number of windows)."""
    w = window_dim
    return (
        w.size == w.stride
        and w.pad_low == 0
        and w.pad_high == 0
        and w.window_dilation == 1
        and w.base_dilation == 1
        and not w.reversal
    )


def _tiles_exactly(window_dim, size: int) -> bool:
    return _trivial(window_dim) and size % window_dim.stride == 0


def _halo(window_dim, size: int, out: int) -> tuple[int, int] | None:
    """(left, right) for a window dimension whose windows overlap or are padded but whose
    outputs still come in blocks aligned with the input's (size = stride x outputs, as in
    SAME convolutions and pooling): cut both into g blocks, device i's outputs read its
    own input block, the last `left` rows of its left neighbour's and the first `right`
    of its right neighbour's (the global padding at the two ends). None otherwise."""
    w = window_dim
    if w.window_dilation != 1 or w.base_dilation != 1 or w.reversal or size != w.stride * out:
        return None
    left, right = w.pad_low, w.size - w.stride - w.pad_low
    if left < 0 or right < 0:
        return None
    return left, right


def _reduce_window(instr: HloInstruction) -> OpLabels:
    n = len(instr.operands) // 2
    window = instr.window.dims
    dims = instr.operand(0).shape.dims
    out_dims = (instr.shape.tuple_shapes[0] if instr.shape.is_tuple else instr.shape).dims
    labels: list[int | None] = []
    halos = {}
    for i, (w, d, o) in enumerate(zip(window, dims, out_dims, strict=True)):
        halo = None if _tiles_exactly(w, d) else _halo(w, d, o)
        labels.append(i if _tiles_exactly(w, d) or halo is not None else None)
        if halo is not None and halo != (0, 0):
            halos[i] = halo
    t = tuple(labels)
    return _finish(instr, (t,) * n + ((),) * n, (t,) * n, None, halos)


def _select_and_scatter(instr: HloInstruction) -> OpLabels:
    window = instr.window.dims
    dims = instr.operand(0).shape.dims
    labels = tuple(
        i if _tiles_exactly(w, d) else None for i, (w, d) in enumerate(zip(window, dims))
    )
    return _finish(instr, (labels, labels, ()), (labels,))


def _dot(instr: HloInstruction) -> OpLabels:
    numbers = instr.dot_dimension_numbers
    lhs_rank, rhs_rank = instr.operand(0).shape.rank, instr.operand(1).shape.rank
    lb, rb = numbers.lhs_batch, numbers.rhs_batch
    lc, rc = numbers.lhs_contracting, numbers.rhs_contracting
    lhs: list[int | None] = [None] * lhs_rank
    rhs: list[int | None] = [None] * rhs_rank
    out: list[int | None] = []
    label = 0
    for x, y in zip(lb, rb, strict=True):
        lhs[x] = rhs[y] = label
        out.append(label)
        label += 1
    for x in range(lhs_rank):
        if x not in lb and x not in lc:
            lhs[x] = label
            out.append(label)
            label += 1
    for y in range(rhs_rank):
        if y not in rb and y not in rc:
            rhs[y] = label
            out.append(label)
            label += 1
    for x, y in zip(lc, rc, strict=True):
        lhs[x] = rhs[y] = label
        label += 1
    return _finish(instr, (tuple(lhs), tuple(rhs)), (tuple(out),), "add")


def _convolution(instr: HloInstruction) -> OpLabels:
    """Batch and output features partition locally, input features by an all-reduce; a
    spatial dimension when its windows do not overlap, or with a halo exchange when they
    do but its output blocks align with its input blocks (`_halo`)."""
    dl = instr.dim_labels
    window = instr.window_or_none
    groups = instr.feature_group_count
    batch_groups = instr.batch_group_count
    lhs: list[int | None] = [None] * instr.operand(0).shape.rank
    rhs: list[int | None] = [None] * instr.operand(1).shape.rank
    out: list[int | None] = [None] * instr.shape.rank
    if batch_groups == 1:
        lhs[dl.input_batch] = out[dl.output_batch] = 0
    if groups == 1 and batch_groups == 1:
        rhs[dl.kernel_output_feature] = out[dl.output_feature] = 1
        lhs[dl.input_feature] = rhs[dl.kernel_input_feature] = 2
    halos = {}
    for s, (li, ki, oi) in enumerate(
        zip(dl.input_spatial, dl.kernel_spatial, dl.output_spatial, strict=True)
    ):
        w = window.dims[s] if window is not None else None
        if w is None or instr.operand(1).shape.dims[ki] != w.size:
            continue
        size = instr.operand(0).shape.dims[li]
        if _tiles_exactly(w, size):
            lhs[li] = out[oi] = 3 + s
            continue
        halo = _halo(w, size, instr.shape.dims[oi])
        if halo is not None:
            lhs[li] = out[oi] = 3 + s
            if halo != (0, 0):
                halos[3 + s] = halo
    return _finish(instr, (tuple(lhs), tuple(rhs)), (tuple(out),), "add", halos)


def _gather(instr: HloInstruction) -> OpLabels:
    """Index batch dimensions and the operand's whole-slice (passthrough) dimensions
    partition locally; the indexed dimensions stay whole."""
    a = instr.gather_dimension_numbers
    operand, indices = instr.operand(0).shape, instr.operand(1).shape
    offset_dims = a.offset_dims
    collapsed = set(a.collapsed_slice_dims)
    op_batch = list(a.operand_batching_dims)
    idx_batch = list(a.start_indices_batching_dims)
    ivd = a.index_vector_dim
    sizes = a.slice_sizes
    start_map = set(a.start_index_map)
    out: list[int | None] = [None] * instr.shape.rank
    ops: list[int | None] = [None] * operand.rank
    idx: list[int | None] = [None] * indices.rank
    batch_out = [d for d in range(instr.shape.rank) if d not in offset_dims]
    idx_dims = [d for d in range(indices.rank) if d != ivd]
    label = 0
    for o, i in zip(batch_out, idx_dims, strict=True):
        idx[i] = out[o] = label
        if i in idx_batch:
            ops[op_batch[idx_batch.index(i)]] = label
        label += 1
    window = [d for d in range(operand.rank) if d not in collapsed and d not in op_batch]
    for o, d in zip(offset_dims, window, strict=True):
        if d not in start_map and sizes[d] == operand.dims[d]:
            ops[d] = out[o] = label
            label += 1
    masked = None
    if instr.shape.element_type.name != "pred":
        for d in sorted(start_map):
            if sizes[d] == 1 and d not in op_batch:
                ops[d] = label  # contracted: see MASKED_GATHER
                label += 1
                masked = MASKED_GATHER
    return _finish(instr, (tuple(ops), tuple(idx)), (tuple(out),), masked)


MASKED_GATHER = "masked-gather"
"""The reducer of a gather whose operand is cut along an indexed dimension it takes one
row of (an embedding table cut by vocabulary, take_along_axis over cut classes): each
device gathers from its rows with the indices moved to its offset, zeroes the rows it
does not hold, and an all-reduce (add) completes the result (XLA's way)."""


def _scatter(instr: HloInstruction) -> OpLabels:
    """The operand's passthrough dimensions (whole-window ones) partition locally, with the
    updates' matching window dimensions; so do the batching dimensions (the operand's
    input_batching_dims, the indices' scatter_indices_batching_dims and the updates'
    scatter dimensions that follow them: batch b's indices write batch b's rows alone);
    the other index and scatter dimensions stay whole."""
    a = instr.scatter_dimension_numbers
    n = (len(instr.operands) - 1) // 2
    operand, updates = instr.operand(0).shape, instr.operand(n + 1).shape
    window_dims = a.update_window_dims
    inserted = set(a.inserted_window_dims)
    batching = set(a.input_batching_dims)
    targets = set(a.scatter_dims_to_operand_dims)
    window = [d for d in range(operand.rank) if d not in inserted and d not in batching]
    ops: list[int | None] = [None] * operand.rank
    upd: list[int | None] = [None] * updates.rank
    for u, d in zip(window_dims, window, strict=True):
        if d not in targets and updates.dims[u] == operand.dims[d]:
            ops[d] = upd[u] = d
    rank = instr.operand(n).shape.rank
    idx: list[int | None] = [None] * rank
    idx_dims = [d for d in range(rank) if d != a.index_vector_dim]
    upd_scatter = [u for u in range(updates.rank) if u not in window_dims]
    for ob, ib in zip(a.input_batching_dims, a.scatter_indices_batching_dims, strict=True):
        ops[ob] = idx[ib] = upd[upd_scatter[idx_dims.index(ib)]] = ob
    ops_t, upd_t = tuple(ops), tuple(upd)
    return _finish(instr, (ops_t,) * n + (tuple(idx),) + (upd_t,) * n, (ops_t,) * n)


def _dynamic_slice(instr: HloInstruction) -> OpLabels:
    dims = instr.operand(0).shape.dims
    labels = tuple(
        i if s == n else None
        for i, (s, n) in enumerate(zip(instr.dynamic_slice_sizes, dims, strict=True))
    )
    return _finish(instr, (labels,) + ((),) * (len(instr.operands) - 1), (labels,))


def _dynamic_update_slice(instr: HloInstruction) -> OpLabels:
    dims, upd = instr.operand(0).shape.dims, instr.operand(1).shape.dims
    labels = tuple(i if u == n else None for i, (u, n) in enumerate(zip(upd, dims, strict=True)))
    return _finish(instr, (labels, labels) + ((),) * (len(instr.operands) - 2), (labels,))


def _sort(instr: HloInstruction) -> OpLabels:
    (dim,) = instr.dimensions
    rank = instr.operand(0).shape.rank
    labels = tuple(None if i == dim else i for i in range(rank))
    results = (labels,) * len(instr.operands) if instr.shape.is_tuple else (labels,)
    return _finish(instr, (labels,) * len(instr.operands), results)


def _topk(instr: HloInstruction) -> OpLabels:
    rank = instr.operand(0).shape.rank
    labels = tuple(None if i == rank - 1 else i for i in range(rank))
    return _finish(instr, (labels,), (labels, labels))


def _batched_matrices(instr: HloInstruction) -> OpLabels:
    """Cholesky and triangular-solve: the leading (batch) dimensions of every operand and
    the result line up; the two matrix dimensions are needed whole."""
    rank = instr.shape.rank
    labels = tuple(i if i < rank - 2 else None for i in range(rank))
    return _finish(instr, (labels,) * len(instr.operands), (labels,))


_SDY_RULE = re.compile(r"#sdy\.op_sharding_rule<\s*\((.*?)\)\s*->\s*\((.*?)\)\s*\{([^}]*)\}(.*)>$")
_SDY_GROUP = re.compile(r"\[([^\]]*)\]")
_SDY_SPECIAL = re.compile(r"\w+\s*=\s*\{([^}]*)\}")


def _custom_call(instr: HloInstruction) -> OpLabels | None:
    """A custom call with Shardy's sharding rule (`xla.sdy.sharding_rule`, which JAX puts
    on its LAPACK calls): a factor that an operand and a result both carry is a label (a
    batch dimension: the call runs on the local pieces); every other factor (one side's
    alone, one listed as reduction / need_replication / permutation / blocked, or a
    dimension made of several factors) is needed whole. No rule: None (replicated)."""
    if instr.has_side_effect:
        return None
    text = instr.frontend_attributes.get("xla.sdy.sharding_rule")
    if not isinstance(text, str):
        return None
    m = _SDY_RULE.match(text.strip())
    if m is None:
        return None
    sides = [[g.split(",") for g in _SDY_GROUP.findall(part)] for part in m.groups()[:2]]
    sizes = {}
    for item in m.group(3).split(","):
        name, _, size = item.partition("=")
        if size.strip().isdigit():
            sizes[name.strip()] = int(size)
    special = {f.strip() for group in _SDY_SPECIAL.findall(m.group(4)) for f in group.split(",")}
    results = instr.shape.tuple_shapes if instr.shape.is_tuple else (instr.shape,)
    if [len(s) for s in sides] != [len(instr.operands), len(results)]:
        return None
    tokens = [[[t.strip() for t in dims if t.strip()] for dims in side] for side in sides]
    shapes = [o.shape for o in instr.operands], list(results)
    for side, side_shapes in zip(tokens, shapes, strict=True):
        if [len(d) for d in side] != [s.rank for s in side_shapes]:
            return None
    both = {t for d in tokens[0] for t in d} & {t for d in tokens[1] for t in d}
    names = sorted(f for f in both if f in sizes and f not in special)
    label = {f: i for i, f in enumerate(names)}
    ops, outs = ([tuple(label.get(t) for t in d) for d in side] for side in tokens)
    return _finish(instr, tuple(ops), tuple(outs))


RULES: dict[Opcode, Callable[[HloInstruction], OpLabels | None]] = {
    Opcode.CUSTOM_CALL: _custom_call,
    Opcode.CHOLESKY: _batched_matrices,
    Opcode.TRIANGULAR_SOLVE: _batched_matrices,
    Opcode.BROADCAST: _broadcast,
    Opcode.TRANSPOSE: _transpose,
    Opcode.RESHAPE: _reshape,
    Opcode.SLICE: _slice,
    Opcode.PAD: _pad,
    Opcode.CONCATENATE: _concatenate,
    Opcode.REVERSE: _reverse,
    Opcode.REDUCE: _reduce,
    Opcode.REDUCE_WINDOW: _reduce_window,
    Opcode.SELECT_AND_SCATTER: _select_and_scatter,
    Opcode.DOT: _dot,
    Opcode.CONVOLUTION: _convolution,
    Opcode.GATHER: _gather,
    Opcode.SCATTER: _scatter,
    Opcode.DYNAMIC_SLICE: _dynamic_slice,
    Opcode.DYNAMIC_UPDATE_SLICE: _dynamic_update_slice,
    Opcode.SORT: _sort,
    Opcode.TOPK: _topk,
    Opcode.MAP: _same,
}
_NOT_ELEMENTWISE_HERE = {Opcode.BITCAST_CONVERT, Opcode.RNG, Opcode.STOCHASTIC_CONVERT}


def op_labels(instr: HloInstruction) -> OpLabels | None:
    """The labels of `instr`, or None when it has no rule (it is then replicated)."""
    if instr.opcode.category in (Category.UNARY, Category.BINARY, Category.TERNARY):
        if instr.opcode in _NOT_ELEMENTWISE_HERE or instr.shape.is_tuple:
            return None
        return _same(instr)
    rule = RULES.get(instr.opcode)
    if rule is None:
        return None
    if any(not op.shape.is_array for op in instr.operands):
        return None
    return rule(instr)
