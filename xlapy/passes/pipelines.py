"""The default compilation pipelines, as plain lists of pass names.

Reading order is running order. A FixedPoint group repeats until no pass in it changes the
module. Passes are built by name from the one registry (pass_base.PASSES, filled by
importing the package `xlapy.passes`, whose PASS_MODULES is the one list of pass modules);
a pipeline may also hold pass objects built by the caller.
"""

from __future__ import annotations

from pathlib import Path

import xlapy.passes  # noqa: F401  (importing the package registers every pass)
from xlapy.passes.pass_base import FixedPoint, HloPass, PassPipeline, make_pass

PlanEntry = str | HloPass | list[str | HloPass]

SIMPLIFY: list[str | HloPass] = [
    "algsimp",
    "constant-folding",
    "while-loop-invariant-code-motion",  # before the state clean-up, as XLA orders them
    "tuple-simplifier",
    "while-loop-constant-sinking",
    "while-loop-simplifier",
    "cse",
    "dce",
]

CPU_PIPELINE: list[PlanEntry] = [
    "call-inliner",
    "defuser",  # XLA's fusions around a dot, reduce-window, scatter...: fused again below
    "while-layout-agreement",  # a loop's state is one set of buffers: one layout each
    "alias-layout-agreement",  # so are a tuple's elements, branch and call parameters
    "normalize-layouts",  # intermediate layouts are free: transposes fold into dots
    "batchnorm-expander",
    "logistic-expander",
    "dot-upcast",  # bf16/f16 dots as f32 dots (BLAS) between converts that fusion places
    "conv-to-dot",  # 1x1 convolutions that move nothing as dots (BLAS), as XLA's algsimp
    # "reduce-window-rewriter" (prefix scans as reduce-window -> blocked O(n) scans) is not in
    # the pipeline yet: the CPU backend runs its slice/concatenate chains slower than its
    # NumPy accumulate path on forward scans (see benchmarks/RESULTS.md, "scans").
    SIMPLIFY,  # a list is a FixedPoint group
    "buffer-donor-to-alias",
    "dot-matrix-operands",  # after the simplifier folds transposes into dots: BLAS-readable
    # -- late stages: fusion, then copy insertion ---------------------------------------------
    "fusion",
    # "multi-output-fusion" is not in the pipeline: it saves softmax a re-read (~12%) but
    # makes outputs live together that were not (temp memory geomean 0.60 -> 1.25 of XLA's
    # over benchmarks/memory_vs_xla.py); it needs a live-range check first.
    "dce",
    "reshape-to-bitcast",  # layout-preserving reshapes/transposes cost no bytes
    "flatten-call-graph",  # copy insertion wants one call site per while body / branch
    "copy-insertion",
]


def _pass(entry: str | HloPass) -> HloPass:
    return entry if isinstance(entry, HloPass) else make_pass(entry)


def build(
    name: str,
    plan: list[PlanEntry],
    dump_dir: str | Path | None = None,
    verify: bool = True,
) -> PassPipeline:
    """A PassPipeline from a list of pass names or pass objects (a nested list is a
    FixedPoint group). An unknown name is an error naming the registered passes."""
    items: list[HloPass | FixedPoint] = []
    for entry in plan:
        if isinstance(entry, list):
            items.append(FixedPoint([_pass(e) for e in entry], name=f"{name}-simplify"))
        else:
            items.append(_pass(entry))
    return PassPipeline(name, items, verify_between=verify, dump_dir=dump_dir)


def default_cpu_pipeline(dump_dir: str | Path | None = None, verify: bool = True) -> PassPipeline:
    """The CPU compiler's pipeline (CPU_PIPELINE): inline calls and foreign fusions, make
    intermediate layouts row-major, expand, simplify to a fixed point, turn donors into
    aliases, then fuse, turn reshapes that move no bytes into bitcasts and insert copies."""
    return build("cpu", CPU_PIPELINE, dump_dir, verify)
