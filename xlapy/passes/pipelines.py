"""The default compilation pipelines, as plain lists of pass names.

Reading order is running order. A FixedPoint group repeats until no pass in it changes the
module. Passes are built by name from the registry (pass_base.PASSES), so this file only
imports the modules that register them. The late stages (fusion, copy insertion) live in
modules written separately; they join the pipeline when their module exists.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

from xlapy.passes import (  # noqa: F401  (importing registers the passes)
    constant_folding,
    cse,
    dce,
    donors,
    expanders,
    inline,
    layout_normalize,
    reshape_to_bitcast,
    simplify,
    tuple_simplify,
)
from xlapy.passes.pass_base import PASSES, FixedPoint, HloPass, PassPipeline, make_pass

SIMPLIFY = ["algsimp", "constant-folding", "tuple-simplifier", "cse", "dce"]

CPU_PIPELINE: list[str | list[str]] = [
    "call-inliner",
    "normalize-layouts",  # intermediate layouts are free: transposes fold into dots
    "batchnorm-expander",
    "logistic-expander",
    SIMPLIFY,  # a list is a FixedPoint group
    "buffer-donor-to-alias",
    # -- late stages: fusion, then copy insertion (added when their modules exist) ----------
    "fusion",
    # "multi-output-fusion" is not in the pipeline: it saves softmax a re-read (~12%) but
    # makes outputs live together that were not (temp memory geomean 0.60 -> 1.25 of XLA's
    # over benchmarks/memory_vs_xla.py); it needs a live-range check first.
    "dce",
    "reshape-to-bitcast",  # layout-preserving reshapes/transposes cost no bytes
    "flatten-call-graph",  # copy insertion wants one call site per while body / branch
    "copy-insertion",
]

LATE_MODULES = (
    "xlapy.passes.fusion",
    "xlapy.passes.fusion_multi_output",
    "xlapy.passes.flatten_call_graph",
    "xlapy.passes.copy_insertion",
)
OPTIONAL_PASSES = frozenset(
    {"fusion", "multi-output-fusion", "flatten-call-graph", "copy-insertion"}
)


def _register_late_passes() -> None:
    for name in LATE_MODULES:
        if importlib.util.find_spec(name) is not None:
            importlib.import_module(name)


def build(
    name: str,
    plan: list[str | list[str]],
    dump_dir: str | Path | None = None,
    verify: bool = True,
) -> PassPipeline:
    """A PassPipeline from a list of pass names (a nested list is a FixedPoint group).
    Optional late passes that are not registered are left out."""
    _register_late_passes()
    items: list[HloPass | FixedPoint] = []
    for entry in plan:
        if isinstance(entry, list):
            items.append(FixedPoint([make_pass(n) for n in entry], name=f"{name}-simplify"))
        elif entry in PASSES or entry not in OPTIONAL_PASSES:
            items.append(make_pass(entry))
    return PassPipeline(name, items, verify_between=verify, dump_dir=dump_dir)


def default_cpu_pipeline(dump_dir: str | Path | None = None, verify: bool = True) -> PassPipeline:
    """The CPU compiler's pipeline (CPU_PIPELINE): inline, make intermediate layouts
    row-major, expand, simplify to a fixed point,
    turn donors into aliases, then fuse, turn reshapes that move no bytes into bitcasts
    and insert copies."""
    return build("cpu", CPU_PIPELINE, dump_dir, verify)
