"""SPMD partitioning: shardings as tilings, per-op dimension labels, and the partitioner
that turns an annotated global program into the program each device runs."""

from xlapy.passes.spmd.partitioner import (
    PartitionError,
    PartitionReport,
    SpmdPartitioner,
    needs_partitioning,
    partition,
)

__all__ = [
    "PartitionError",
    "PartitionReport",
    "SpmdPartitioner",
    "needs_partitioning",
    "partition",
]
