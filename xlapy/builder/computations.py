"""Ready-made scalar computations: the reducers and comparators most programs need.

Each call builds a fresh computation (named after what it does and its type, e.g.
`add_f32`); module assembly copies it into every module that uses it.
"""

from __future__ import annotations

from xlapy.builder.builder import BuilderError, TypeLike, XlaBuilder, as_element_type
from xlapy.ir.computation import HloComputation
from xlapy.ir.shapes import Shape

TypeLikes = list[TypeLike] | tuple[TypeLike, ...] | TypeLike
"""One element type, or a list or tuple of them."""


def _scalar_binary(kind: str, dtype: TypeLike) -> HloComputation:
    etype = as_element_type(dtype, f"scalar_{kind}_computation")
    b = XlaBuilder(f"{kind}_{etype.text}")
    x = b.parameter(0, Shape.scalar(etype), "x")
    y = b.parameter(1, Shape.scalar(etype), "y")
    getattr(b, {"add": "add", "mul": "multiply", "max": "maximum", "min": "minimum"}[kind])(x, y)
    return b.build_computation()


def scalar_add_computation(dtype: TypeLike) -> HloComputation:
    """(x, y) -> x + y on scalars of `dtype`: the reducer of a sum."""
    return _scalar_binary("add", dtype)


def scalar_mul_computation(dtype: TypeLike) -> HloComputation:
    """(x, y) -> x * y on scalars of `dtype`: the reducer of a product."""
    return _scalar_binary("mul", dtype)


def scalar_max_computation(dtype: TypeLike) -> HloComputation:
    """(x, y) -> max(x, y) on scalars of `dtype`."""
    return _scalar_binary("max", dtype)


def scalar_min_computation(dtype: TypeLike) -> HloComputation:
    """(x, y) -> min(x, y) on scalars of `dtype`."""
    return _scalar_binary("min", dtype)


def _comparator(direction: str, dtypes: TypeLikes) -> HloComputation:
    listed = list(dtypes) if isinstance(dtypes, list | tuple) else [dtypes]
    types = [as_element_type(t, f"{direction.lower()}_comparator") for t in listed]
    if not types:
        raise BuilderError(f"{direction.lower()}_comparator(): needs at least one operand type")
    b = XlaBuilder(f"{direction.lower()}_" + "_".join(t.text for t in types))
    params = []
    for i, t in enumerate(types):
        params.append(b.parameter(2 * i, Shape.scalar(t), f"lhs_{i}"))
        params.append(b.parameter(2 * i + 1, Shape.scalar(t), f"rhs_{i}"))
    compare_type = "TOTALORDER" if types[0].is_floating_or_complex else None
    b.compare(params[0], params[1], direction, compare_type)
    return b.build_computation()


def lt_comparator(dtypes: TypeLikes) -> HloComputation:
    """A sort comparator for operands of `dtypes`: ascending by the first operand (floats in
    total order, so NaNs sort last). The other operands ride along."""
    return _comparator("LT", dtypes)


def gt_comparator(dtypes: TypeLikes) -> HloComputation:
    """A sort comparator for operands of `dtypes`: descending by the first operand."""
    return _comparator("GT", dtypes)
