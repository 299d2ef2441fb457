"""Transformations of HLO modules: named passes and pipelines (see pass_base).

Importing the package imports every pass module, so the registry (`PASSES`, `make_pass`)
knows every pass by name. The pass modules import `xlapy.passes.pass_base` directly, which
is already loaded by the time they run.
"""

import importlib

from xlapy.passes.pass_base import (
    PASSES,
    FixedPoint,
    HloPass,
    PassPipeline,
    make_pass,
    register_pass,
)

PASS_MODULES = (
    "constant_folding",
    "conv_to_dot",
    "copy_insertion",
    "cse",
    "dce",
    "donors",
    "dot_operands",
    "expanders",
    "flatten_call_graph",
    "fusion",
    "fusion_multi_output",
    "inline",
    "layout_normalize",
    "reshape_to_bitcast",
    "scan_rewriter",
    "simplify",
    "spmd.combine",
    "spmd.partitioner",
    "tuple_simplify",
    "while_licm",
    "while_simplify",
)
"""The modules under xlapy.passes that register passes (tests/test_pipeline.py checks that
every module with a @register_pass is listed)."""

for _name in PASS_MODULES:
    importlib.import_module(f"xlapy.passes.{_name}")

__all__ = [
    "PASSES",
    "PASS_MODULES",
    "FixedPoint",
    "HloPass",
    "PassPipeline",
    "make_pass",
    "register_pass",
]
