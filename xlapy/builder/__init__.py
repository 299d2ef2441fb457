"""The XlaBuilder-style API: build HLO modules op by op from Python."""

from xlapy.builder.builder import (
    ELEMENTWISE_METHODS,
    BuilderError,
    XlaBuilder,
    XlaOp,
    make_window,
    method_name,
    parse_dim_labels,
)
from xlapy.builder.computations import (
    gt_comparator,
    lt_comparator,
    scalar_add_computation,
    scalar_max_computation,
    scalar_min_computation,
    scalar_mul_computation,
)

__all__ = [
    "ELEMENTWISE_METHODS",
    "BuilderError",
    "XlaBuilder",
    "XlaOp",
    "gt_comparator",
    "lt_comparator",
    "make_window",
    "method_name",
    "parse_dim_labels",
    "scalar_add_computation",
    "scalar_max_computation",
    "scalar_min_computation",
    "scalar_mul_computation",
]
