"""Transformations of HLO modules: named passes and pipelines (see pass_base)."""

from xlapy.passes.pass_base import (
    PASSES,
    FixedPoint,
    HloPass,
    PassPipeline,
    make_pass,
    register_pass,
)

__all__ = ["PASSES", "FixedPoint", "HloPass", "PassPipeline", "make_pass", "register_pass"]
