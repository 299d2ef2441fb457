"""Kernels whose outer range merges several outer dims (emitter.py, `_merged_dims`): a
[4, ...] batch dim no longer caps a kernel's split at 4 blocks. Shapes with small and odd
outer dims, row reductions (softmax's), a transposed layout, a root concatenate, extent-0
and extent-1 dims, against the interpreter; every block count, on the Python pool and on
the native pool, gives the same bits as the whole run (reductions keep their per-row
order)."""

from __future__ import annotations

import numpy as np
import pytest

from xlapy.backends.cpu import compile_computation, run_parallel
from xlapy.backends.cpu.codegen.emitter import MERGE_EXTENT
from xlapy.backends.cpu.runtime.native_pool import native_pool
from xlapy.backends.interpreter.evaluator import Interpreter
from xlapy.ir.parser import parse_module


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("XLAPY_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "kernels"))


RNG = np.random.default_rng(20261127)

ADD = "add {\n a = f32[] parameter(0)\n b = f32[] parameter(1)\n ROOT s = f32[] add(a, b)\n}\n"
MAX = "max {\n a = f32[] parameter(0)\n b = f32[] parameter(1)\n ROOT m = f32[] maximum(a, b)\n}\n"

# name: (module text, the outer extent the kernel splits on)
CASES = {
    # a bias add: broadcast of a row keeps the nest; 3 x 5 merged (the minor dim stays a loop)
    "bias_3x5x7": (
        "ENTRY e {\n x = f32[3,5,7] parameter(0)\n v = f32[7] parameter(1)\n"
        " b = f32[3,5,7] broadcast(v), dimensions={2}\n ROOT r = f32[3,5,7] add(x, b)\n}",
        15,
    ),
    # softmax's exp(x - max) over [2, 3, 5, 9]: 2 x 3 x 5 merged
    "exp_minus_max": (
        "ENTRY e {\n x = f32[2,3,5,9] parameter(0)\n m = f32[2,3,5] parameter(1)\n"
        " b = f32[2,3,5,9] broadcast(m), dimensions={0,1,2}\n"
        " d = f32[2,3,5,9] subtract(x, b)\n ROOT r = f32[2,3,5,9] exponential(d)\n}",
        30,
    ),
    # a row sum of exp (softmax's denominator): every output element is merged
    "row_sum_exp": (
        ADD + "ENTRY e {\n x = f32[3,1,7,33] parameter(0)\n z = f32[] constant(0)\n"
        " x2 = f32[3,1,7,33] exponential(x)\n"
        " ROOT r = f32[3,1,7] reduce(x2, z), dimensions={3}, to_apply=add\n}",
        21,
    ),
    # a row max and an output over the reduction's input (multi-output, as fusion makes)
    "row_max_and_input": (
        MAX + "ENTRY e {\n x = f32[5,3,17] parameter(0)\n z = f32[] constant(-inf)\n"
        " n = f32[5,3,17] negate(x)\n"
        " m = f32[5,3] reduce(n, z), dimensions={2}, to_apply=max\n"
        " ROOT t = (f32[5,3], f32[5,3,17]) tuple(m, n)\n}",
        15,
    ),
    # a reduction over the two minor dims
    "sum_minor_two": (
        ADD + "ENTRY e {\n x = f32[2,3,4,5] parameter(0)\n z = f32[] constant(0)\n"
        " ROOT r = f32[2,3] reduce(x, z), dimensions={2,3}, to_apply=add\n}",
        6,
    ),
    # a transposed layout: the nest runs dim 2 outermost, then 1
    "transposed_layout": (
        "ENTRY e {\n x = f32[6,3,2]{0,1,2} parameter(0)\n v = f32[6] parameter(1)\n"
        " b = f32[6,3,2]{0,1,2} broadcast(v), dimensions={0}\n"
        " ROOT r = f32[6,3,2]{0,1,2} multiply(x, b)\n}",
        6,
    ),
    # a transpose: reads across, writes in order
    "transpose_fusion": (
        "ENTRY e {\n x = f32[7,3,5] parameter(0)\n"
        " t = f32[3,7,5] transpose(x), dimensions={1,0,2}\n ROOT r = f32[3,7,5] tanh(t)\n}",
        21,
    ),
    # a root concatenate along dim 1: dim 0 alone (the concatenated dim is not merged)
    "concat_dim1": (
        "ENTRY e {\n x = f32[3,2,5] parameter(0)\n y = f32[3,4,5] parameter(1)\n"
        " ROOT r = f32[3,6,5] concatenate(x, y), dimensions={1}\n}",
        3,
    ),
    # a root concatenate along the minor dim: dims 0 and 1 merged
    "concat_minor": (
        "ENTRY e {\n x = f32[3,2,5] parameter(0)\n y = f32[3,2,4] parameter(1)\n"
        " ROOT r = f32[3,2,9] concatenate(x, y), dimensions={2}\n}",
        6,
    ),
    # an extent-0 dim: nothing to run
    "empty_middle": (
        "ENTRY e {\n x = f32[3,0,5] parameter(0)\n v = f32[5] parameter(1)\n"
        " b = f32[3,0,5] broadcast(v), dimensions={2}\n ROOT r = f32[3,0,5] add(x, b)\n}",
        0,
    ),
    # a large outer dim is left alone
    "wide_outer": (
        f"ENTRY e {{\n x = f32[{MERGE_EXTENT},2,3] parameter(0)\n v = f32[3] parameter(1)\n"
        f" b = f32[{MERGE_EXTENT},2,3] broadcast(v), dimensions={{2}}\n"
        f" ROOT r = f32[{MERGE_EXTENT},2,3] add(x, b)\n}}",
        MERGE_EXTENT,
    ),
    # merging stops once the product reaches MERGE_EXTENT: 20 x 20, not 20 x 20 x 3
    "stops_at_merge_extent": (
        "ENTRY e {\n x = f32[20,20,3,4] parameter(0)\n v = f32[4] parameter(1)\n"
        " b = f32[20,20,3,4] broadcast(v), dimensions={3}\n ROOT r = f32[20,20,3,4] add(x, b)\n}",
        400,
    ),
}


def _inputs(module):
    return [RNG.standard_normal(p.shape.dims).astype(np.float32) for p in module.entry.parameters]


def _leaves(value):
    return value if isinstance(value, tuple) else (value,)


def _block_counts(extent: int) -> list[int]:
    return sorted({1, 2, 3, 4, 7, 16, max(1, extent - 1), max(1, extent), extent + 1})


@pytest.mark.parametrize("name", list(CASES))
def test_merged_outer_range_matches_interpreter_at_every_split(name):
    text, extent = CASES[name]
    module = parse_module("HloModule m\n" + text)
    kernel = compile_computation(module.entry, name)
    assert kernel.outer_extent == extent
    args = _inputs(module)
    whole = _leaves(kernel(*args))
    want = _leaves(Interpreter().run(module, list(args)))
    for g, w in zip(whole, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=2e-6, atol=2e-6)
    for blocks in _block_counts(extent):
        split = _leaves(run_parallel(kernel, args, chunks=blocks))
        for s, g in zip(split, whole, strict=True):
            np.testing.assert_array_equal(s, g, err_msg=f"{blocks} blocks")


@pytest.mark.parametrize("name", ["exp_minus_max", "row_sum_exp", "row_max_and_input"])
def test_merged_outer_range_on_the_native_pool(name):
    """The native pool's blocks (claimed by its workers and the caller) write the same
    bits as the whole run, whatever their count."""
    pool = native_pool()
    if pool is None:
        pytest.skip("no native pool with one thread")
    text, extent = CASES[name]
    module = parse_module("HloModule m\n" + text)
    kernel = compile_computation(module.entry, name)
    args = _inputs(module)
    whole = _leaves(kernel(*args))
    for blocks in _block_counts(extent):
        outputs, inputs = kernel.prepare(args)
        pool.run(kernel.address, kernel.pointers(outputs, inputs), extent, blocks)
        for s, g in zip(_leaves(kernel.finish(outputs)), whole, strict=True):
            np.testing.assert_array_equal(s, g, err_msg=f"{blocks} blocks")


def test_transformer_softmax_splits_past_its_batch_dim():
    """A [4, 4, 128, 128] attention softmax's kernels split over 2048 rows, not 4."""
    text = (
        MAX + ADD + "ENTRY e {\n x = f32[4,4,128,128] parameter(0)\n"
        " z = f32[] constant(-inf)\n m = f32[4,4,128] reduce(x, z), dimensions={3}, "
        "to_apply=max\n b = f32[4,4,128,128] broadcast(m), dimensions={0,1,2}\n"
        " d = f32[4,4,128,128] subtract(x, b)\n ROOT e = f32[4,4,128,128] exponential(d)\n}"
    )
    module = parse_module("HloModule m\n" + text)
    kernel = compile_computation(module.entry, "softmax_exp")
    assert kernel.outer_extent == 4 * 4 * 128
