"""The algebraic simplifier's rewrite rules, as data: one rule per line, identity in the text.

A rule is (identity, pattern, rewrite). A pattern is a small tree: `op(ADD, X, ZERO)` matches
an `add` whose second operand is a splat of zero (a constant, or a broadcast of one, whose
elements are all equal); `X` binds any instruction to the name "x", and a name bound twice
must bind the same instruction (`op(MAXIMUM, X, X)`). Patterns of commutative ops also match
with their operands swapped. A rewrite gets the Match and returns the instruction that
replaces the matched one (an existing one, or one it builds with `m.new`), or None to decline.
The simplifier (simplify.py) drops any replacement whose shape differs from the original, so
"reshape(x) -> x" needs no shape test of its own.

Floating point stays exact: no rule may change a result for NaN, infinities or -0.0. So
`x + 0 -> x` fires for floats only when the zero is -0.0 (x + -0.0 == x for every x, while
-0.0 + +0.0 == +0.0), `x - 0 -> x` only for +0.0, `x * 0 -> 0` and `x - x -> 0` only for
integers, and a multiplicative identity never fires for complex numbers (x * (1+0j) turns
inf into NaN). XLA's simplifier applies `x + 0.0 -> x` regardless of the sign of zero;
`SimplifierOptions(ieee_exact=False)` does the same here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from xlapy.ir.attributes import SliceSpec
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.literal import Literal
from xlapy.ir.opcodes import Opcode
from xlapy.ir.shapes import Layout, Shape
from xlapy.ir.types import PrimitiveType
from xlapy.passes.hlo_edit import Editor

Op = Opcode


@dataclass(frozen=True)
class SimplifierOptions:
    """`ieee_exact`: never change a float result, -0.0 included (see the module docstring).
    `xla_scatter_merge`: sum two scatter-adds onto zero in one buffer where XLA does, giving
    XLA:CPU's result bit for bit (`_merged_like_xla`), even when `ieee_exact`."""

    ieee_exact: bool = True
    xla_scatter_merge: bool = True


# -- the pattern language -------------------------------------------------------------------

ValuePred = Callable[[np.ndarray, PrimitiveType, SimplifierOptions], bool]


@dataclass(frozen=True)
class Pat:
    """Matches an instruction: its opcode (None: any), its operands (None: any), a predicate
    on the instruction or on its splat value; binds it to `name`."""

    opcode: Opcode | None = None
    operands: tuple[Pat, ...] | None = None
    name: str | None = None
    where: Callable[[HloInstruction], bool] | None = None
    value: ValuePred | None = None


def op(opcode: Opcode, *operands: Pat, name: str | None = None, where=None) -> Pat:
    return Pat(opcode, tuple(operands), name, where)


def var(name: str, where=None) -> Pat:
    return Pat(name=name, where=where)


def splat(value: ValuePred, name: str | None = None) -> Pat:
    """A constant, or a broadcast of one, whose elements are all one value satisfying `value`."""
    return Pat(name=name, value=value)


@dataclass
class Match:
    """The bindings of a matched pattern, plus what a rewrite needs to build instructions."""

    root: HloInstruction
    bindings: dict[str, HloInstruction]
    options: SimplifierOptions
    editor: Editor
    created: list[HloInstruction] = field(default_factory=list)

    def __getitem__(self, name: str) -> HloInstruction:
        return self.bindings[name]

    def new(self, opcode: Opcode, operands, attrs=None, shape: Shape | None = None, literal=None):
        """A new instruction just before the matched one (shape: the matched one's)."""
        instr = self.editor.add(
            opcode,
            shape or self.root.shape,
            operands,
            attrs,
            before=self.root,
            literal=literal,
            name=self.root.name,
        )
        self.created.append(instr)
        return instr

    def full(self, value, shape: Shape | None = None) -> HloInstruction:
        """`value` in every element: a scalar constant, broadcast when the shape is not 0-d."""
        shape = shape or self.root.shape
        scalar = Shape.scalar(shape.element_type)
        const = self.new(
            Op.CONSTANT, (), shape=scalar, literal=Literal.scalar(value, scalar.element_type)
        )
        if shape.rank == 0:
            return const
        return self.new(Op.BROADCAST, [const], {"dimensions": ()}, shape=shape)


def splat_value(instr: HloInstruction, memo: dict[int, np.ndarray | None] | None = None):
    """The one value every element of `instr` has (a 0-d array), if it is a constant or a
    broadcast of one and all its elements agree bit for bit; else None."""
    if memo is not None and id(instr) in memo:
        return memo[id(instr)]
    result = None
    if instr.opcode is Op.BROADCAST:
        result = splat_value(instr.operands[0], memo)
    elif instr.opcode is Op.CONSTANT and instr.literal is not None and instr.shape.is_array:
        array = instr.literal.array
        assert array is not None, "an array literal always holds data (Literal.__post_init__)"
        flat = array.reshape(-1)
        if flat.size and _all_same_bits(flat):
            result = flat[:1].reshape(())
    if memo is not None:
        memo[id(instr)] = result
    return result


def _all_same_bits(flat: np.ndarray) -> bool:
    if flat.size == 1:
        return True
    raw = np.frombuffer(flat.tobytes(), dtype=np.uint8).reshape(flat.size, -1)
    return bool((raw == raw[0]).all())


def match(pat: Pat, instr: HloInstruction, bindings: dict, options, memo) -> bool:
    """Match `pat` against `instr`, extending `bindings`; bindings are undone on failure."""
    if pat.opcode is not None and instr.opcode is not pat.opcode:
        return False
    if pat.where is not None and not pat.where(instr):
        return False
    if pat.value is not None:
        value = splat_value(instr, memo)
        if value is None or not pat.value(value, instr.shape.element_type, options):
            return False
    name = pat.name
    if name is not None:
        bound = bindings.get(name)
        if bound is not None and bound is not instr:
            return False
    pats = pat.operands
    if pats is None:
        if name is not None:
            bindings[name] = instr
        return True
    operands = instr.operands
    if len(pats) != len(operands):
        return False
    saved = dict(bindings)
    if name is not None:
        bindings[name] = instr
    if _match_all(pats, operands, bindings, options, memo):
        return True
    if instr.opcode.is_commutative and len(operands) == 2:  # and with the operands swapped
        bindings.clear()
        bindings.update(saved)
        if name is not None:
            bindings[name] = instr
        if _match_all(pats, operands[::-1], bindings, options, memo):
            return True
    bindings.clear()
    bindings.update(saved)
    return False


def _match_all(pats: tuple[Pat, ...], operands, bindings: dict, options, memo) -> bool:
    # a loop, not all(genexpr): the simplifier's hot path, where a generator costs more
    for p, o in zip(pats, operands):  # noqa: SIM110
        if not match(p, o, bindings, options, memo):
            return False
    return True


# -- value predicates -----------------------------------------------------------------------


def _float(v: np.ndarray) -> float:
    return float(np.asarray(v, dtype=np.float64))


def _is_zero(v, t, o) -> bool:
    if t.is_complex:
        return complex(v) == 0
    if t.is_float:
        return _float(v) == 0
    return not bool(v) if t.is_pred else int(v) == 0


def _neg_sign(x: float) -> bool:
    return math.copysign(1.0, x) < 0


def additive_identity(v, t, o) -> bool:
    """0 for integers; -0.0 for floats (either zero when not ieee_exact)."""
    if not _is_zero(v, t, o):
        return False
    if not o.ieee_exact or not t.is_floating_or_complex:
        return True
    c = complex(v)
    return _neg_sign(c.real) and (not t.is_complex or _neg_sign(c.imag))


def subtractive_identity(v, t, o) -> bool:
    """0 for integers; +0.0 for floats (x - +0.0 == x, -0.0 included)."""
    if not _is_zero(v, t, o):
        return False
    if not o.ieee_exact or not t.is_floating_or_complex:
        return True
    c = complex(v)
    return not _neg_sign(c.real) and (not t.is_complex or not _neg_sign(c.imag))


def is_zero(v, t, o) -> bool:
    return _is_zero(v, t, o)


def is_one(v, t, o) -> bool:
    """1, but never for complex numbers when exact (x * (1+0j) is not x for infinite x)."""
    if t.is_complex:
        return not o.ieee_exact and complex(v) == 1
    if t.is_pred:
        return bool(v)
    return _float(v) == 1


def all_bits_set(v, t, o) -> bool:
    """true for pred, -1 / max for integers: the identity of `and`."""
    if t.is_pred:
        return bool(v)
    if not t.is_integral:
        return False
    return int(v) == (-1 if t.is_signed_integral else (1 << t.bits) - 1)


def is_false(v, t, o) -> bool:
    return t.is_pred and not bool(v)


def is_true(v, t, o) -> bool:
    return t.is_pred and bool(v)


def int_zero(v, t, o) -> bool:
    return (t.is_integral or t.is_pred) and _is_zero(v, t, o)


# -- instruction predicates -----------------------------------------------------------------


def integral(instr: HloInstruction) -> bool:
    """Integers and pred: every value equals itself and x - x is 0."""
    t = instr.shape.element_type
    return t.is_integral or t.is_pred


def scalar(instr: HloInstruction) -> bool:
    return instr.shape.is_array and instr.shape.rank == 0


# -- rewrites -------------------------------------------------------------------------------


def keep(name: str):
    """Replace the matched instruction with the one bound to `name`."""
    return lambda m: m[name]


def _operand(i: int):
    """Replace the matched instruction with its operand `i`."""
    return lambda m: m.root.operands[i]


def _zeros(m: Match):
    return m.full(0)


def _same_compare(m: Match):
    direction = m.root.comparison_direction
    if direction is None:
        return None
    return m.full(direction in ("EQ", "LE", "GE"))


def _full_precision(m: Match):
    t = m.root.shape.element_type
    finfo = _float_info(t)
    if finfo is None:
        return None
    exponent, mantissa = finfo
    if m.root.exponent_bits == exponent and m.root.mantissa_bits == mantissa:
        return m["x"]
    return None


def _float_info(t: PrimitiveType):
    try:
        info = np.finfo(t.dtype)
    except (TypeError, ValueError):
        return None
    return int(info.nexp), int(info.nmant)


def _merge_reshapes(m: Match):
    return m.new(Op.RESHAPE, [m["x"]])


def _reshape_of_scalar_broadcast(m: Match):
    return m.new(Op.BROADCAST, [m["x"]], {"dimensions": ()})


def _identity_broadcast(m: Match):
    dims = m.root.dimensions
    return m["x"] if dims == tuple(range(m.root.shape.rank)) else None


def _merge_broadcasts(m: Match):
    inner = m["inner"]
    inner_dims = inner.dimensions
    outer_dims = m.root.dimensions
    return m.new(Op.BROADCAST, [m["x"]], {"dimensions": tuple(outer_dims[d] for d in inner_dims)})


def _identity_transpose(m: Match):
    perm = m.root.dimensions
    return m["x"] if perm == tuple(range(len(perm))) else None


def _merge_transposes(m: Match):
    inner = m["inner"].dimensions
    outer = m.root.dimensions
    return m.new(Op.TRANSPOSE, [m["x"]], {"dimensions": tuple(inner[j] for j in outer)})


def _single_use(instr: HloInstruction, m: Match) -> bool:
    """`instr` feeds only the matched instruction (rewriting it duplicates no work)."""
    return (
        len(instr.users) == 1 and not instr.control_successors and instr is not m.editor.comp.root
    )


def _row_major_like(shape: Shape, dims) -> Shape:
    """`shape` with `dims`, row-major where `shape` carries a layout."""
    new = shape.with_dims(dims)
    return new if shape.layout is None else new.with_layout(Layout.default(len(dims)))


def _reshape_of_transpose(m: Match):
    """reshape(transpose(x)) -> transpose(reshape(x)) when the reshape only adds or drops
    dims of size 1: x's other dims keep their order and its unit dims go last, then the
    permutation places them. Moves the transpose down, where it meets the transpose that
    undoes it (a pooling's NCHW -> NHWC -> NCHW) or a reduce-window it can pass."""
    t = m["t"]
    if not _single_use(t, m):
        return None
    x, perm, out = m["x"], t.dimensions, m.root.shape.dims
    big_t = [d for d in t.shape.dims if d != 1]
    if big_t != [d for d in out if d != 1] or len(out) == t.shape.rank:
        return None
    x_big = [j for j in range(x.shape.rank) if x.shape.dims[j] != 1]
    from_t = iter(perm[i] for i in range(t.shape.rank) if t.shape.dims[i] != 1)
    units = iter(range(len(x_big), len(x_big) + out.count(1)))
    new_perm = tuple(next(units) if d == 1 else x_big.index(next(from_t)) for d in out)
    dims = [x.shape.dims[j] for j in x_big] + [1] * out.count(1)
    inner = m.new(Op.RESHAPE, [x], shape=_row_major_like(m.root.shape, dims))
    return m.new(Op.TRANSPOSE, [inner], {"dimensions": new_perm})


def _reduce_window_of_transpose(m: Match):
    """reduce-window(transpose(x), v) -> transpose(reduce-window(x, v)), the window's dims
    permuted back: the pooling runs in x's order and only its (smaller) result moves."""
    t = m["t"]
    window = m.root.window_or_none
    if window is None or not _single_use(t, m) or m.root.shape.is_tuple:
        return None
    perm = t.dimensions
    dims: list = [None] * len(perm)
    out: list = [0] * len(perm)
    for i, d in enumerate(perm):
        dims[d], out[d] = window.dims[i], m.root.shape.dims[i]
    attrs = dict(m.root.attrs)
    attrs["window"] = type(window)(tuple(dims))
    pooled = m.new(
        Op.REDUCE_WINDOW, [m["x"], m["v"]], attrs, shape=_row_major_like(m.root.shape, out)
    )
    return m.new(Op.TRANSPOSE, [pooled], {"dimensions": perm})


def _no_padding(m: Match):
    if any(d != (0, 0, 0) for d in m.root.padding_config.dims):
        return None
    return m["x"]


def _reverse_of_unit_dims(m: Match):
    dims = m.root.dimensions
    return m["x"] if all(m["x"].shape.dims[d] == 1 for d in dims) else None


def _reverse_of_reverse(m: Match):
    same = sorted(m.root.dimensions) == sorted(m["inner"].dimensions)
    return m["x"] if same else None


def _copy_of_copy(m: Match):
    return m["inner"]


def _constant_dynamic_slice(m: Match):
    x, starts = m.root.operands[0], m.root.operands[1:]
    sizes = m.root.dynamic_slice_sizes
    if len(starts) != x.shape.rank:
        return None
    values = [splat_value(s) for s in starts]
    if any(v is None for v in values):
        return None
    spec = []
    for v, size, dim in zip(values, sizes, x.shape.dims, strict=True):
        start = min(max(int(v), 0), dim - size)
        spec.append((start, start + size, 1))
    return m.new(Op.SLICE, [x], {"slice": SliceSpec(tuple(spec))})


def _is_lowest(v, t, o) -> bool:
    if t.is_pred:
        return not bool(v)
    if t.is_integral:
        return int(v) == int(np.iinfo(t.dtype).min)
    return t.is_float and _float(v) == -math.inf


def _is_highest(v, t, o) -> bool:
    if t.is_pred:
        return bool(v)
    if t.is_integral:
        return int(v) == int(np.iinfo(t.dtype).max)
    return t.is_float and _float(v) == math.inf


_REDUCER_IDENTITY: dict[Opcode, ValuePred] = {
    Op.ADD: additive_identity,
    Op.MULTIPLY: is_one,
    Op.AND: all_bits_set,
    Op.OR: int_zero,
    Op.MAXIMUM: _is_lowest,
    Op.MINIMUM: _is_highest,
}


def reducer_opcode(comp) -> Opcode | None:
    """`add` if `comp` is (a, b) -> add(a, b) (or b, a); likewise for the other binary ops."""
    if comp is None or comp.num_parameters != 2 or comp.root is None:
        return None
    root = comp.root
    if root.opcode not in _REDUCER_IDENTITY or len(root.operands) != 2:
        return None
    if {id(o) for o in root.operands} != {id(p) for p in comp.parameters}:
        return None
    return root.opcode


def _trivial_reduce(m: Match):
    """reduce over dimensions of size 1 with the reducer's identity as init is a reshape."""
    x, init = m.root.operands
    dims = m.root.dimensions
    if any(x.shape.dims[d] != 1 for d in dims):
        return None
    kind = reducer_opcode(m.root.to_apply_or_none)
    value = splat_value(init)
    if kind is None or value is None:
        return None
    if not _REDUCER_IDENTITY[kind](value, init.shape.element_type, m.options):
        return None
    if x.shape.dims == m.root.shape.dims:
        return x
    return m.new(Op.RESHAPE, [x])


def _scatter_add_onto_zero(instr: HloInstruction) -> bool:
    """`instr` is a one-operand scatter whose combiner adds, onto a splat of zero."""
    if instr.opcode is not Op.SCATTER or len(instr.operands) != 3 or not instr.shape.is_array:
        return False
    if instr.shape.element_type is PrimitiveType.PRED:
        return False
    value = splat_value(instr.operands[0])
    return (
        value is not None
        and reducer_opcode(instr.to_apply_or_none) is Op.ADD
        and _float(value) == 0
    )


def _merged_like_xla(lhs: HloInstruction, rhs: HloInstruction) -> bool:
    """XLA's simplifier rewrites `scatter-add(0, i, u) + scatter-add(0, j, w)` into one
    `scatter-add(0, concatenate(i, j), concatenate(u, w))` when the two scatters have the
    same dimension numbers and the operand has more elements than both updates together
    (measured on XLA:CPU, jax 0.10.2: a 480-element update pair merges onto 484 elements,
    not onto 480). XLA:CPU scatters in index order, so its result is the lhs's updates summed
    in order onto zero, then the rhs's: scatter-add(scatter-add(0, i, u), j, w) bit for bit."""
    same_dims = lhs.scatter_dimension_numbers == rhs.scatter_dimension_numbers
    updates = lhs.operands[2].shape.num_elements + rhs.operands[2].shape.num_elements
    return same_dims and lhs.shape.num_elements > updates


def _chain_scatter_adds(m: Match):
    """scatter-add(0, i, u) + scatter-add(0, j, w) -> scatter-add(scatter-add(0, i, u), j, w):
    one zero-filled buffer takes both sets of updates in turn (an embedding table's gradient
    from two lookups holds one table-sized buffer, not two). The base scattered onto first
    must be +0.0: no sum that starts there is -0.0, so an element neither scatter touches
    is the same either way. An element that several of w's updates reach is summed in
    another order ((s + w1) + w2 against s + (w1 + w2)). Integer sums are exact in any
    order; for floats the rule fires when j's indices are unique, when the simplifier may
    reassociate (ieee_exact=False), or where XLA itself merges the pair (`xla_scatter_merge`,
    on by default: see `_merged_like_xla`), in XLA's order, so the result is XLA:CPU's."""
    exact_type = m.root.shape.element_type.is_integral
    lhs, rhs = m.root.operands
    for first, second in ((m["a"], m["b"]), (m["b"], m["a"])):
        if not _single_use(second, m) or first is second:
            continue
        unique = second.unique_indices
        as_xla = m.options.xla_scatter_merge and (first, second) == (lhs, rhs)
        exact = exact_type or unique or not m.options.ieee_exact
        if not exact and not (as_xla and _merged_like_xla(first, second)):
            continue
        if np.signbit(splat_value(first.operands[0])):
            continue
        if first.shape != m.root.shape or second.shape != m.root.shape:
            continue
        _, indices, updates = second.operands
        return m.new(Op.SCATTER, [first, indices, updates], dict(second.attrs))
    return None


# -- dots -----------------------------------------------------------------------------------
# A dot's result dimensions are its batch dimensions, then the lhs's free (neither batch nor
# contracting) dimensions, then the rhs's, each group in operand order.

DOT_DIM_ATTRS = ("lhs_batch_dims", "rhs_batch_dims", "lhs_contracting_dims", "rhs_contracting_dims")


def _dot_dims(dot: HloInstruction):
    d = dot.dot_dimension_numbers
    return d.lhs_batch, d.rhs_batch, d.lhs_contracting, d.rhs_contracting


def _with_dot_dims(attrs: dict, dims) -> dict:
    """`attrs` with the four dimension lists replaced by `dims` (empty ones left out, as
    XLA prints them)."""
    out = {k: v for k, v in attrs.items() if k not in DOT_DIM_ATTRS}
    out.update((k, tuple(v)) for k, v in zip(DOT_DIM_ATTRS, dims, strict=True) if v)
    return out


def _free_dims(rank: int, batch, contracting) -> list[int]:
    return [d for d in range(rank) if d not in batch and d not in contracting]


def _transpose_of_dot(m: Match):
    """transpose(dot(a, b)) -> dot(b, a) when the permutation swaps the lhs-free and
    rhs-free groups and keeps the batch dimensions first. Only for a dot with no other user:
    otherwise both products would be computed."""
    dot = m["d"]
    if len(dot.users) != 1 or dot.control_successors or dot is m.editor.comp.root:
        return None
    lb, rb, lc, rc = _dot_dims(dot)
    a, b = dot.operands
    nb = len(lb)
    nl = len(_free_dims(a.shape.rank, lb, lc))
    nr = len(_free_dims(b.shape.rank, rb, rc))
    swapped = (*range(nb), *range(nb + nl, nb + nl + nr), *range(nb, nb + nl))
    if m.root.dimensions != swapped:
        return None
    attrs = _with_dot_dims(dot.attrs, (rb, lb, rc, lc))
    if "operand_precision" in attrs:
        attrs["operand_precision"] = tuple(reversed(attrs["operand_precision"]))
    return m.new(Op.DOT, [b, a], attrs)


def _dims_through_transpose(dot: HloInstruction, side: int, perm: tuple[int, ...]):
    """`dot`'s dimension numbers with operand `side` read before a transpose `perm` (its
    batch and contracting dims renumbered), or None when the permutation reorders the
    operand's free dims (they give the result's order)."""
    dims = list(_dot_dims(dot))
    batch, contracting = dims[side], dims[2 + side]
    free = [perm[d] for d in _free_dims(len(perm), batch, contracting)]
    if free != sorted(free):
        return None
    dims[side] = tuple(perm[d] for d in batch)
    dims[2 + side] = tuple(perm[d] for d in contracting)
    return dims


def _fold_transpose_into_dot(side: int):
    """dot(transpose(a), b) -> dot(a, b) (side 0; side 1 for the rhs) with the batch and
    contracting dimensions renumbered through the permutation. Exact when the permutation
    keeps the operand's free dimensions in order, since they give the result's order."""

    def rewrite(m: Match):
        t = m.root.operands[side]
        dims = _dims_through_transpose(m.root, side, t.dimensions)
        if dims is None:
            return None
        operands = list(m.root.operands)
        operands[side] = t.operands[0]
        return m.new(Op.DOT, operands, _with_dot_dims(m.root.attrs, dims))

    return rewrite


def _fold_converted_transpose_into_dot(side: int):
    """dot(convert(transpose(a)), b) -> dot(convert(a), b) (side 0; side 1 for the rhs),
    dims renumbered as above: a convert is elementwise, so it commutes with the transpose.
    JAX transposes bf16 weights before their dots and dot-upcast puts the widening convert
    between: kept, every run converts the weight through a transposing kernel where BLAS
    reads the plainly converted one with a transpose flag. Only for a convert that the dot
    alone reads (else both converts would run)."""

    def rewrite(m: Match):
        c = m.root.operands[side]
        if len(c.users) != 1 or c.control_successors:
            return None
        t = c.operands[0]
        dims = _dims_through_transpose(m.root, side, t.dimensions)
        if dims is None:
            return None
        a = t.operands[0]
        operands = list(m.root.operands)
        operands[side] = m.new(
            Op.CONVERT, [a], shape=a.shape.with_element_type(c.shape.element_type)
        )
        return m.new(Op.DOT, operands, _with_dot_dims(m.root.attrs, dims))

    return rewrite


def _dot_without_contraction(m: Match):
    """dot(a, b) with no contracting dims -> multiply(broadcast(a'), broadcast(b')), a' and
    b' a and b transposed (where needed) into the result's dimension order: each element is
    one product, so the numbers are the same (XLA's simplifier does this too); the multiply
    fuses with its neighbours, where the dot would be a gemm with k = 1. Only where operands
    and result share one float or complex type (a mixed-type dot would need converts)."""
    dot = m.root
    lb, rb, lc, rc = _dot_dims(dot)
    a, b = dot.operands
    et = dot.shape.element_type
    if lc or rc or not et.is_floating_or_complex:
        return None
    if a.shape.element_type is not et or b.shape.element_type is not et:
        return None
    nb = len(lb)
    la, ra = _free_dims(a.shape.rank, lb, lc), _free_dims(b.shape.rank, rb, rc)
    pos_a = {d: lb.index(d) if d in lb else nb + la.index(d) for d in range(a.shape.rank)}
    pos_b = {d: rb.index(d) if d in rb else nb + len(la) + ra.index(d) for d in range(b.shape.rank)}

    def spread(x: HloInstruction, pos: dict[int, int]) -> HloInstruction:
        order = sorted(range(x.shape.rank), key=pos.__getitem__)
        layout = dot.shape.layout is not None
        if order != sorted(order):
            dims = tuple(x.shape.dims[d] for d in order)
            shape = Shape.array(et, dims, Layout.default(len(dims)) if layout else None)
            x = m.new(Op.TRANSPOSE, [x], {"dimensions": tuple(order)}, shape=shape)
        return m.new(Op.BROADCAST, [x], {"dimensions": tuple(sorted(pos.values()))})

    return m.new(Op.MULTIPLY, [spread(a, pos_a), spread(b, pos_b)])


# -- the rules ------------------------------------------------------------------------------

X, Y, C = var("x"), var("y"), var("c")
XI = var("x", integral)

Rule = tuple[str, Pat, Callable[[Match], HloInstruction | None]]

RULES: list[Rule] = [
    # arithmetic
    ("x + 0 -> x", op(Op.ADD, X, splat(additive_identity)), keep("x")),
    ("x - 0 -> x", op(Op.SUBTRACT, X, splat(subtractive_identity)), keep("x")),
    ("x * 1 -> x", op(Op.MULTIPLY, X, splat(is_one)), keep("x")),
    ("x / 1 -> x", op(Op.DIVIDE, X, splat(is_one)), keep("x")),
    ("x ** 1 -> x", op(Op.POWER, X, splat(is_one)), keep("x")),
    ("x * 0 -> 0   (integers only)", op(Op.MULTIPLY, XI, splat(is_zero, "z")), keep("z")),
    ("x - x -> 0   (integers only)", op(Op.SUBTRACT, XI, XI), _zeros),
    ("-(-x) -> x", op(Op.NEGATE, op(Op.NEGATE, X)), keep("x")),
    ("abs(abs(x)) -> abs(x)", op(Op.ABS, op(Op.ABS, X, name="inner")), keep("inner")),
    ("max(x, x) -> x", op(Op.MAXIMUM, X, X), keep("x")),
    ("min(x, x) -> x", op(Op.MINIMUM, X, X), keep("x")),
    # logic and bits
    ("not(not(x)) -> x", op(Op.NOT, op(Op.NOT, X)), keep("x")),
    ("x & x -> x", op(Op.AND, X, X), keep("x")),
    ("x | x -> x", op(Op.OR, X, X), keep("x")),
    ("x & ~0 -> x", op(Op.AND, X, splat(all_bits_set)), keep("x")),
    ("x & 0 -> 0", op(Op.AND, X, splat(int_zero, "z")), keep("z")),
    ("x | 0 -> x", op(Op.OR, X, splat(int_zero)), keep("x")),
    ("x | ~0 -> ~0", op(Op.OR, X, splat(all_bits_set, "z")), keep("z")),
    ("x ^ 0 -> x", op(Op.XOR, X, splat(int_zero)), keep("x")),
    ("x << 0 -> x", op(Op.SHIFT_LEFT, X, splat(int_zero)), keep("x")),
    ("x >> 0 -> x   (arithmetic)", op(Op.SHIFT_RIGHT_ARITHMETIC, X, splat(int_zero)), keep("x")),
    ("x >> 0 -> x   (logical)", op(Op.SHIFT_RIGHT_LOGICAL, X, splat(int_zero)), keep("x")),
    ("x cmp x -> const   (integers only)", op(Op.COMPARE, XI, XI), _same_compare),
    # select
    ("select(c, x, x) -> x", op(Op.SELECT, C, X, X), keep("x")),
    ("select(true, x, y) -> x", op(Op.SELECT, splat(is_true), X, Y), keep("x")),
    ("select(false, x, y) -> y", op(Op.SELECT, splat(is_false), X, Y), keep("y")),
    # conversions (the shape check keeps only those that change nothing)
    ("convert(x) -> x   (same type)", op(Op.CONVERT, X), keep("x")),
    ("bitcast-convert(x) -> x   (same type)", op(Op.BITCAST_CONVERT, X), keep("x")),
    ("real(x) -> x   (real x)", op(Op.REAL, X), keep("x")),
    (
        "reduce-precision(x) -> x   (all bits kept)",
        op(Op.REDUCE_PRECISION, X),
        _full_precision,
    ),
    ("copy(copy(x)) -> copy(x)", op(Op.COPY, op(Op.COPY, X, name="inner")), _copy_of_copy),
    ("copy(x) -> x   (same layout)", op(Op.COPY, X), keep("x")),
    # shapes
    ("reshape(x) -> x   (same shape)", op(Op.RESHAPE, X), keep("x")),
    ("reshape(reshape(x)) -> reshape(x)", op(Op.RESHAPE, op(Op.RESHAPE, X)), _merge_reshapes),
    (
        "reshape(broadcast(s)) -> broadcast(s)   (scalar s)",
        op(Op.RESHAPE, op(Op.BROADCAST, var("x", scalar))),
        _reshape_of_scalar_broadcast,
    ),
    ("broadcast(x) -> x   (identity)", op(Op.BROADCAST, X), _identity_broadcast),
    (
        "broadcast(broadcast(x)) -> broadcast(x)",
        op(Op.BROADCAST, op(Op.BROADCAST, X, name="inner")),
        _merge_broadcasts,
    ),
    ("transpose(x) -> x   (identity)", op(Op.TRANSPOSE, X), _identity_transpose),
    (
        "transpose(transpose(x)) -> transpose(x)",
        op(Op.TRANSPOSE, op(Op.TRANSPOSE, X, name="inner")),
        _merge_transposes,
    ),
    (
        "reshape(transpose(x)) -> transpose(reshape(x))   (only unit dims added or dropped)",
        op(Op.RESHAPE, op(Op.TRANSPOSE, X, name="t")),
        _reshape_of_transpose,
    ),
    (
        "reduce-window(transpose(x), v) -> transpose(reduce-window(x, v))   (window permuted)",
        op(Op.REDUCE_WINDOW, op(Op.TRANSPOSE, X, name="t"), var("v")),
        _reduce_window_of_transpose,
    ),
    ("slice(x) -> x   (full range)", op(Op.SLICE, X), keep("x")),
    ("concatenate(x) -> x", op(Op.CONCATENATE, X), keep("x")),
    ("pad(x, v) -> x   (no padding)", op(Op.PAD, X, Y), _no_padding),
    ("reverse(x) -> x   (dims of size 1)", op(Op.REVERSE, X), _reverse_of_unit_dims),
    (
        "reverse(reverse(x)) -> x   (same dims)",
        op(Op.REVERSE, op(Op.REVERSE, X, name="inner")),
        _reverse_of_reverse,
    ),
    # indexing
    (
        "dynamic-slice(x, i...) -> x   (slice is all of x)",
        Pat(Op.DYNAMIC_SLICE, name="r"),
        lambda m: m["r"].operands[0],
    ),
    ("dynamic-slice(x, consts) -> slice(x)", Pat(Op.DYNAMIC_SLICE), _constant_dynamic_slice),
    (
        "dynamic-update-slice(x, u, i...) -> u   (u covers x)",
        Pat(Op.DYNAMIC_UPDATE_SLICE),
        _operand(1),
    ),
    (
        "scatter-add(0, i, u) + scatter-add(0, j, w) -> scatter-add(scatter-add(0, i, u), j, w)",
        op(Op.ADD, var("a", _scatter_add_onto_zero), var("b", _scatter_add_onto_zero)),
        _chain_scatter_adds,
    ),
    # dots
    (
        "transpose(dot(a, b)) -> dot(b, a)   (free groups swapped)",
        op(Op.TRANSPOSE, op(Op.DOT, X, Y, name="d")),
        _transpose_of_dot,
    ),
    (
        "dot(transpose(a), b) -> dot(a, b)   (dims renumbered)",
        op(Op.DOT, op(Op.TRANSPOSE, X), Y),
        _fold_transpose_into_dot(0),
    ),
    (
        "dot(a, transpose(b)) -> dot(a, b)   (dims renumbered)",
        op(Op.DOT, X, op(Op.TRANSPOSE, Y)),
        _fold_transpose_into_dot(1),
    ),
    (
        "dot(convert(transpose(a)), b) -> dot(convert(a), b)   (dims renumbered)",
        op(Op.DOT, op(Op.CONVERT, op(Op.TRANSPOSE, X)), Y),
        _fold_converted_transpose_into_dot(0),
    ),
    (
        "dot(a, convert(transpose(b))) -> dot(a, convert(b))   (dims renumbered)",
        op(Op.DOT, X, op(Op.CONVERT, op(Op.TRANSPOSE, Y))),
        _fold_converted_transpose_into_dot(1),
    ),
    (
        "dot(a, b) -> broadcast(a') * broadcast(b')   (no contracting dims)",
        Pat(Op.DOT),
        _dot_without_contraction,
    ),
    # reductions
    ("reduce(x, id) -> reshape(x)   (dims of size 1)", op(Op.REDUCE, X, Y), _trivial_reduce),
]


def rules_by_opcode(rules: list[Rule] = RULES) -> dict[Opcode, list[Rule]]:
    """The rules keyed by the opcode of their pattern's root, in table order."""
    table: dict[Opcode, list[Rule]] = {}
    for rule in rules:
        opcode = rule[1].opcode
        if opcode is None:
            raise ValueError(f"rule '{rule[0]}' matches any opcode; its root must name one")
        table.setdefault(opcode, []).append(rule)
    return table
