"""The CPU plan keeps the order whose whole plan is smallest, and two zero-based scatter-adds
that are added share one buffer.

tests/memory/*.hlo are programs of benchmarks/memory_vs_xla.py lowered small
(`memory_vs_xla.py --write-test-programs tests/memory`); the memory figures of each are also
checked against every other report by test_memory_one_plan.py, which reads every .hlo file
under tests/.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from xlapy.backends import get_backend
from xlapy.ir.opcodes import Opcode
from xlapy.ir.parser import parse_module
from xlapy.memory.buffer_assignment import (
    PLAN_CANDIDATES,
    _assign,
    assign_buffers,
    prepare_for_buffer_assignment,
    prepare_with_plan,
)
from xlapy.memory.report import format_report
from xlapy.passes.dce import DeadCodeElimination
from xlapy.passes.pipelines import default_cpu_pipeline
from xlapy.passes.rules import SimplifierOptions
from xlapy.passes.simplify import AlgebraicSimplifier
from xlapy.tools import npz_io

PROGRAMS = sorted((Path(__file__).parent / "memory").glob("*.hlo"))


def _optimized(text: str):
    module = parse_module(text)
    default_cpu_pipeline(verify=False).run(module)
    return module


def _temp_under(text: str, scheduler: str) -> int:
    module = parse_module(text)
    prepare_for_buffer_assignment(module, scheduler)
    return assign_buffers(module).temp_bytes


def _close(got, want, rtol=2e-5, atol=2e-5):
    if isinstance(want, (tuple, list)):
        assert isinstance(got, (tuple, list)) and len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            _close(g, w, rtol, atol)
        return
    want = np.asarray(want)
    # sums of many products (convolutions, dots) cancel: errors scale with the largest value
    scale = float(np.max(np.abs(want))) if want.size and want.dtype.kind == "f" else 0.0
    np.testing.assert_allclose(np.asarray(got), want, rtol=rtol, atol=max(atol, 1e-5 * scale))


@pytest.mark.parametrize("path", PROGRAMS, ids=[p.stem for p in PROGRAMS])
def test_the_plan_is_the_smallest_candidate_and_runs_like_the_interpreter(path):
    text = path.read_text()
    optimized = _optimized(text).to_text()
    candidates = {name: _temp_under(optimized, name) for name in PLAN_CANDIDATES}
    chosen = parse_module(optimized)
    name = prepare_for_buffer_assignment(chosen)
    assert name in PLAN_CANDIDATES
    assert chosen.config.is_scheduled  # copy insertion's order is the plan's
    plan = assign_buffers(chosen)
    assert plan.temp_bytes == candidates[name] == min(candidates.values()), candidates

    program = get_backend("cpu").compile(parse_module(text))
    assert program.buffer_assignment.temp_bytes == plan.temp_bytes
    module = parse_module(text)
    args = npz_io.random_inputs([p.shape for p in module.entry.parameters], 2026112704)
    want = get_backend("interpreter").compile(module).run(args)
    _close(program.run(args), want, rtol=1e-4, atol=1e-4)  # f32, tanh through 12 steps


@pytest.mark.parametrize("path", PROGRAMS, ids=[p.stem for p in PROGRAMS])
def test_the_chosen_plan_is_copy_insertion_under_that_order_alone(path):
    """The copies are added once and each candidate's order computed once (only distinct
    orders tried): the module kept is what preparing under the chosen order alone gives."""
    optimized = _optimized(path.read_text()).to_text()
    chosen = parse_module(optimized)
    name = prepare_for_buffer_assignment(chosen)
    alone = parse_module(optimized)
    prepare_for_buffer_assignment(alone, name)
    assert chosen.to_text() == alone.to_text()


@pytest.mark.parametrize("path", PROGRAMS, ids=[p.stem for p in PROGRAMS])
def test_the_winning_trial_is_kept_as_the_in_place_plan_would_be(path):
    """prepare_with_plan returns the winning trial's module and assignment instead of
    preparing the module again and assigning anew: the same module text, the same plan and
    the same report as preparing in place and assigning (a module on which every candidate
    agrees is prepared in place and comes back without an assignment)."""
    optimized = _optimized(path.read_text()).to_text()
    in_place = parse_module(optimized)
    prepare_for_buffer_assignment(in_place)
    want = assign_buffers(in_place)
    module, got = prepare_with_plan(parse_module(optimized))
    if got is None:
        got = assign_buffers(module)
    assert got.module is module
    assert all(c.parent is module for c in module.computations)  # (trials shared some)
    assert module.to_text() == in_place.to_text()
    assert (got.temp_bytes, got.peak_bytes) == (want.temp_bytes, want.peak_bytes)
    assert format_report(got) == format_report(want)


@pytest.mark.parametrize("path", PROGRAMS[:1], ids=[p.stem for p in PROGRAMS[:1]])
def test_a_trial_that_cannot_beat_the_best_temp_skips_its_heap(path):
    """A trial's temps are at least their no-fragmentation lower bound: given a smaller
    temp to beat, the assignment gives up (None) before placing them."""
    module = _optimized(path.read_text())
    prepare_for_buffer_assignment(module)
    plan = assign_buffers(module)
    assert plan.lower_bound_bytes > 0
    assert _assign(module, None, None, plan.lower_bound_bytes - 1) is None
    kept = _assign(module, None, None, plan.lower_bound_bytes)
    assert kept is not None and kept.temp_bytes == plan.temp_bytes


def test_a_program_whose_orders_all_agree_is_not_tried(monkeypatch):
    """One instruction per step: every candidate gives the same sequence, so no candidate
    is tried on a parse of the module (a trivial program's plan costs one copy insertion)."""
    import xlapy.memory.buffer_assignment as ba

    def no_trials(text):
        raise AssertionError("a candidate was tried")

    monkeypatch.setattr(ba, "parse_module", no_trials)
    module = parse_module(
        "HloModule m\nENTRY e {\n  a = f32[8] parameter(0)\n  b = f32[8] parameter(1)\n"
        "  ROOT s = f32[8] add(a, b)\n}\n"
    )
    assert prepare_for_buffer_assignment(module) == PLAN_CANDIDATES[0]
    assert module.config.is_scheduled
    assert assign_buffers(module).temp_bytes == 0


def test_an_mlp_step_takes_the_list_order_where_the_size_model_picks_another():
    """The scheduler size model (copies still in place, no in-place updates, no output
    reuse) prefers post order for this SGD step; its plan holds 3,328 temp bytes where the
    list order's holds 2,304 (memory_vs_xla.py's mlp_sgd at full size: 1,541 -> 1,035 KiB)."""
    optimized = _optimized((Path(__file__).parent / "memory" / "mlp_sgd.hlo").read_text())
    text = optimized.to_text()
    assert _temp_under(text, "best") == 3328
    assert _temp_under(text, "list") == 2304
    module = parse_module(text)
    assert prepare_for_buffer_assignment(module) == "list"
    assert assign_buffers(module).temp_bytes == 2304


def test_an_unknown_scheduler_is_a_clear_error():
    module = parse_module((Path(__file__).parent / "memory" / "mlp_sgd.hlo").read_text())
    with pytest.raises(Exception, match="unknown scheduler 'fastest'; expected one of plan"):
        prepare_for_buffer_assignment(module, "fastest")


# -- two scatter-adds onto zeros, added: one buffer ------------------------------------------
SCATTER_ROWS = (
    "update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, "
    "index_vector_dim=1"
)


def _grad_of_two_lookups(base0="0", base1="0", combiner="add", t="f32", unique=False) -> str:
    """The table gradient of two embedding lookups (JAX's transpose of two gathers): two
    scatter-adds onto zeros, added, then a step on the table."""
    second = SCATTER_ROWS + (", unique_indices=true" if unique else "")
    return f"""HloModule two_lookups
add {{
  a = {t}[] parameter(0)
  b = {t}[] parameter(1)
  ROOT s = {t}[] {combiner}(a, b)
}}
ENTRY main {{
  table = {t}[500,16] parameter(0)
  i = s32[40,1] parameter(1)
  u = {t}[40,16] parameter(2)
  j = s32[30,1] parameter(3)
  w = {t}[30,16] parameter(4)
  c0 = {t}[] constant({base0})
  z0 = {t}[500,16] broadcast(c0), dimensions={{}}
  c1 = {t}[] constant({base1})
  z1 = {t}[500,16] broadcast(c1), dimensions={{}}
  s = {t}[500,16] scatter(z0, i, u), {SCATTER_ROWS}, to_apply=add
  r = {t}[500,16] scatter(z1, j, w), {second}, to_apply=add
  ROOT new = {t}[500,16] add(s, r)
}}
"""


def _lookup_args(seed: int, dtype=np.float32, unique=False):
    rng = np.random.default_rng(seed)
    values = (
        (lambda *d: rng.standard_normal(d).astype(dtype))
        if dtype == np.float32
        else (lambda *d: rng.integers(-1000, 1000, d).astype(dtype))
    )
    j = rng.permutation(500)[:30] if unique else rng.integers(-3, 503, 30)  # some skipped
    return [
        values(500, 16),
        rng.integers(0, 500, (40, 1)).astype(np.int32),  # repeats: several updates per row
        values(40, 16),
        j.reshape(30, 1).astype(np.int32),
        values(30, 16),
    ]


def _simplified(text: str, options=None):
    module = parse_module(text)
    changed = AlgebraicSimplifier(options).run(module)
    DeadCodeElimination().run(module)
    return module, changed


def _chained(module) -> bool:
    scatters = [i for i in module.entry.instructions if i.opcode is Opcode.SCATTER]
    adds = [i for i in module.entry.instructions if i.opcode is Opcode.ADD]
    return len(scatters) == 2 and not adds and module.entry.root.operands[0] in scatters


@pytest.mark.parametrize(
    "t,dtype,unique",
    [("s32", np.int32, False), ("f32", np.float32, True)],
    ids=["s32 repeated indices", "f32 unique indices"],
)
def test_added_scatter_adds_onto_zero_chain_into_one_buffer(t, dtype, unique):
    """Exact where the sum order cannot matter (integers; floats whose second scatter
    reaches each element once): the results are the same bits."""
    text = _grad_of_two_lookups(t=t, unique=unique)
    module, changed = _simplified(text)
    assert changed and _chained(module)
    program = get_backend("cpu").compile(parse_module(text))
    table_bytes = 500 * 16 * 4
    assert not any(  # no table-sized temporary: both scatters run in the output's bytes
        a.size >= table_bytes for a in program.buffer_assignment.allocations if a.is_temp
    )
    for seed in (1, 2):
        args = _lookup_args(seed, dtype, unique)
        want = get_backend("interpreter").compile(parse_module(text)).run(args)
        np.testing.assert_array_equal(program.run(args), want)
        np.testing.assert_array_equal(get_backend("interpreter").compile(module).run(args), want)


def test_float_scatters_with_repeated_indices_chain_only_where_xla_merges_them():
    """XLA's simplifier merges this pair (same dimension numbers, operand larger than both
    updates): the default chains it, lhs first; with xla_scatter_merge off and ieee_exact on,
    nothing is reordered; ieee_exact=False chains it too."""
    text = _grad_of_two_lookups()
    module, changed = _simplified(text)
    assert changed and _chained(module)
    inner = module.entry.root.operands[0]
    assert inner.operands[1].name == "i"  # the add's lhs is summed first
    module, _ = _simplified(text, SimplifierOptions(xla_scatter_merge=False))
    assert not _chained(module)  # (s + w1) + w2 is not s + (w1 + w2) bit for bit
    module, changed = _simplified(text, SimplifierOptions(ieee_exact=False))
    assert changed and _chained(module)
    args = _lookup_args(3)
    want = get_backend("interpreter").compile(parse_module(text)).run(args)
    got = get_backend("interpreter").compile(module).run(args)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _adversarial(rng, *shape) -> np.ndarray:
    """Half huge, half unit values: a sum of them depends on its order."""
    big = rng.random(shape) < 0.5
    return np.where(big, rng.standard_normal(shape) * 1e8, rng.standard_normal(shape)).astype(
        np.float32
    )


@pytest.mark.parametrize("rows", [500, 60], ids=["XLA merges", "XLA keeps two scatters"])
def test_two_lookups_gradient_is_xla_cpus_bit_for_bit(rows):
    """The table gradient of two embedding lookups with repeated indices, through JAX: the CPU
    backend's result equals XLA:CPU's bit for bit, whether XLA merges the two scatter-adds
    (500 rows: more than the 480 update elements) or keeps them (60 rows). XLA:CPU sums a
    scatter-add's updates in index order; the values are chosen so that another order
    gives other bits (checked)."""
    import jax
    import jax.numpy as jnp

    def loss(table, words, context, g):
        a = jnp.sum(table[words], axis=1)
        b = jnp.sum(table[context], axis=1)
        return jnp.sum(jnp.concatenate([a, b], -1) * g)

    grad = jax.jit(jax.grad(loss))
    cpu = jax.devices("cpu")[0]
    rng = np.random.default_rng(15)
    table = rng.standard_normal((rows, 4)).astype(np.float32)
    args = [table, *(rng.integers(0, 8, (6, 10)).astype(np.int32) for _ in range(2))]
    text = grad.lower(*args, np.zeros((6, 8), np.float32)).as_text(dialect="hlo")
    program = get_backend("cpu").compile(parse_module(text))
    reference = get_backend("interpreter").compile(parse_module(text))
    reordered = 0
    for _ in range(5):
        run_args = [*args, _adversarial(rng, 6, 8)]
        want = np.asarray(grad(*jax.device_put(run_args, cpu)))
        used = run_args[1:]  # the table's values do not reach its gradient
        np.testing.assert_array_equal(program.run(used), want)
        reordered += not np.array_equal(reference.run(used), want)
    assert reordered == (5 if rows == 500 else 0)  # the interpreter runs the HLO as written


@pytest.mark.parametrize(
    "why,bases,combiner",
    [
        ("both bases -0.0: an untouched -0.0 + -0.0 element would stay -0.0", ("-0", "-0"), "add"),
        ("the bases are not zero", ("1", "0.5"), "add"),
        ("the combiner is not add", ("0", "0"), "maximum"),
    ],
)
def test_scatter_chaining_declines(why, bases, combiner):
    text = _grad_of_two_lookups(*bases, combiner=combiner, unique=True)
    module, _ = _simplified(text, SimplifierOptions(ieee_exact=False))
    assert not _chained(module), why
