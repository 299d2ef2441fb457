"""Buffer assignment invariants: no two simultaneously live values overlap, aliased
parameters and outputs share an allocation, the figures add up."""

from __future__ import annotations

import numpy as np
import pytest
from jax_programs import PROGRAMS, hlo_texts
from test_arena_run import assert_bitwise_equal
from test_dataflow import CONTROL, TUPLES, WHILE

from xlapy.analysis.liveness import may_update_in_place
from xlapy.backends import get_backend
from xlapy.backends.interpreter import evaluate
from xlapy.backends.interpreter.arena import evaluate_in_arena
from xlapy.errors import XlapyError
from xlapy.ir.parser import parse_module
from xlapy.memory.buffer_assignment import (
    AssignmentOptions,
    assign_buffers,
    prepare_for_buffer_assignment,
)
from xlapy.memory.heap_simulator import MemoryPlanningError

DONATED = """
HloModule donated, input_output_alias={ {0}: (0, {}, may-alias) }
ENTRY e {
  p = f32[16] parameter(0)
  w = f32[16] parameter(1)
  c = f32[] constant(0.5)
  b = f32[16] broadcast(c), dimensions={}
  m = f32[16] multiply(w, b)
  u = f32[16] add(p, m)
  s = f32[16] sine(w)
  ROOT r = (f32[16], f32[16]) tuple(u, s)
}
"""


def _hands_over(a, x, y) -> bool:
    """One value is computed elementwise in the bytes of the other, which dies right there
    (the only overlap in time an assignment may have: same offset, touching ranges)."""
    first, second = sorted((x, y), key=lambda i: (i.start, i.end))
    return (
        first.end == second.start
        and first.start < second.start
        and first.slice.offset == second.slice.offset
        and may_update_in_place(second.value, first.value, a.dataflow)
    )


def check_invariants(a) -> None:
    """No overlap between values live at once in one allocation; figures consistent."""
    infos = a.value_infos()
    by_alloc = {}
    for info in infos:
        assert info.slice.offset + info.slice.size <= a.allocations[info.slice.allocation].size
        by_alloc.setdefault(info.slice.allocation, []).append(info)
    for members in by_alloc.values():
        for i, x in enumerate(members):
            for y in members[i + 1 :]:
                if a.aliases.buffer_of(x.value) is a.aliases.buffer_of(y.value):
                    continue
                if not x.size or not y.size:
                    continue
                time = x.start <= y.end and y.start <= x.end
                space = (
                    x.slice.offset < y.slice.offset + y.size
                    and y.slice.offset < x.slice.offset + x.size
                )
                if time and space and _hands_over(a, x, y):
                    continue
                assert not (time and space), f"{x.value} and {y.value} overlap"
    stats = a.memory_analysis()
    assert stats.peak_bytes == (
        stats.argument_bytes + stats.output_bytes - stats.alias_bytes + stats.temp_bytes
    )
    assert stats.temp_bytes >= stats.lower_bound_bytes
    assert stats.generated_code_bytes == 0


@pytest.mark.parametrize(
    "text", [TUPLES, WHILE, CONTROL, DONATED], ids=["tuples", "while", "control", "donated"]
)
def test_invariants(text):
    m = parse_module(text)
    prepare_for_buffer_assignment(m)
    a = assign_buffers(m)
    check_invariants(a)
    assert a.to_text().startswith("BufferAssignment")


def test_donated_parameter_is_the_output_allocation():
    m = parse_module(DONATED)
    a = assign_buffers(m)
    check_invariants(a)
    e = m.entry
    alloc = a.allocation_of(e.root, (0,))
    assert alloc is a.allocation_of(e.parameter(0))
    assert alloc.is_entry_parameter and alloc.is_aliased_output and alloc.maybe_live_out
    assert alloc.parameter_number == 0 and alloc.parameter_index == ()
    stats = a.memory_analysis()
    assert stats.argument_bytes == 128
    assert stats.alias_bytes == 64
    assert stats.output_bytes == 64 + 64 + 16  # aliased leaf, sine, tuple table
    assert a.allocation_of(e.get_instruction("c")).is_constant
    # m dies before the output s is written: it lives in s's bytes, the arena stays empty
    assert a.allocation_of(e.get_instruction("m")) is a.allocation_of(e.get_instruction("s"))
    assert stats.temp_bytes == 0
    off = assign_buffers(parse_module(DONATED), options=AssignmentOptions(reuse_outputs=False))
    check_invariants(off)
    assert off.allocation_of(off.module.entry.get_instruction("m")).is_temp


def test_scheduler_is_recorded_and_options():
    m = parse_module(TUPLES)
    a = assign_buffers(m, options=AssignmentOptions(scheduler="dfs", heap_algorithm="global-size"))
    assert a.scheduler == "dfs"
    assert a.heap_results[0].algorithm == "global-size"
    b = assign_buffers(parse_module(TUPLES))
    assert b.scheduler in ("post-order", "dfs", "list")


def test_in_place_update_reuses_a_dying_operand():
    text = """
HloModule ip
ENTRY e {
  x = f32[64] parameter(0)
  u = f32[4] parameter(1)
  i = s32[] parameter(2)
  y = f32[64] negate(x)
  d = f32[64] dynamic-update-slice(y, u, i)
  ROOT n = f32[64] exponential(d)
}
"""
    m = parse_module(text)
    a = assign_buffers(m)
    check_invariants(a)
    get = m.entry.get_instruction
    assert a.slice_of(get("d")) == a.slice_of(get("y"))
    assert a.in_place
    off = assign_buffers(parse_module(text), options=AssignmentOptions(in_place=False))
    assert not off.in_place


def test_interfering_loop_state_needs_copy_insertion():
    text = WHILE.replace(
        "ROOT out = (s32[], f32[4]) tuple(i1, x1)", "ROOT out = (s32[], f32[4]) tuple(i1, x1)"
    ).replace(
        "ROOT res = f32[4] get-tuple-element(w), index=1",
        "g = f32[4] get-tuple-element(w), index=1\n  ROOT res = f32[4] add(g, x0)",
    )
    m = parse_module(text)
    with pytest.raises(MemoryPlanningError, match="copy-insertion"):
        assign_buffers(m)
    prepare_for_buffer_assignment(m)
    check_invariants(assign_buffers(m))


def test_unflattened_module_is_a_clear_error():
    text = CONTROL.replace(
        "ROOT k = f32[8] conditional(i, c, c), branch_computations={br0, br1}",
        "ROOT k = f32[8] call(c), to_apply=callee",
    )
    with pytest.raises(XlapyError, match="flatten-call-graph"):
        assign_buffers(parse_module(text))


# g (1 KiB) dies before the output o is written: it lives in o's bytes. h is computed
# elementwise over the dying e and f over h: e, h and f share one offset of the arena.
REUSE = """
HloModule reuse
add {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT z = f32[] add(x, y)
}
ENTRY e {
  p = f32[256] parameter(0)
  q = f32[256] parameter(1)
  g = f32[256] multiply(p, q)
  s = f32[] constant(0)
  r = f32[] reduce(g, s), dimensions={0}, to_apply=add
  e = f32[256] exponential(p)
  h = f32[256] sine(e)
  f = f32[256] cosine(h)
  b = f32[256] broadcast(r), dimensions={}
  o = f32[256] add(b, q)
  ROOT t = (f32[256], f32[256]) tuple(o, f)
}
"""


def _run(text, a):
    rng = np.random.default_rng(3)
    params = a.module.entry.parameters
    args = [rng.standard_normal(p.shape.dims).astype(p.shape.dtype) for p in params]
    expected = evaluate(parse_module(text), args)
    assert_bitwise_equal(evaluate_in_arena(a, args).result, expected, "arena")


def test_temporaries_reuse_output_allocations_and_dying_operands():
    m = parse_module(REUSE)
    prepare_for_buffer_assignment(m)
    a = assign_buffers(m, options=AssignmentOptions(scheduler="post-order"))
    check_invariants(a)
    get = m.entry.get_instruction
    out = a.allocation_of(get("o"))
    assert out.kind == "output" and out.buffers[0][0] is a.aliases.buffer_of(
        a.dataflow.value_at(get("o"))
    )
    assert a.allocation_of(get("g")) is out  # dead before o is written
    chain = [a.slice_of(get(n)) for n in ("e", "h")]
    assert chain[0] == chain[1]  # h computed in e's bytes
    assert a.temp_bytes < 2 * 1024
    _run(REUSE, a)
    off = assign_buffers(
        parse_module(m.to_text()),
        options=AssignmentOptions(reuse_outputs=False, use_module_schedule=True),
    )
    check_invariants(off)
    assert off.temp_bytes > a.temp_bytes


def test_temporary_live_across_the_output_stays_in_the_arena():
    text = REUSE.replace("o = f32[256] add(b, q)", "o = f32[256] add(b, g)")
    m = parse_module(text)
    prepare_for_buffer_assignment(m)
    a = assign_buffers(m)
    check_invariants(a)
    get = m.entry.get_instruction
    # g is read by o itself: o may be computed over it (elementwise), never before it dies
    g, o = a.slice_of(get("g")), a.slice_of(get("o"))
    assert g.allocation != o.allocation or may_update_in_place(
        a.dataflow.value_at(get("o")), a.dataflow.value_at(get("g")), a.dataflow
    )
    _run(text, a)


CPU_PIPELINE_PROGRAMS = [
    "scan_cumulative",
    "rnn_scan_grad",
    "while_newton_sqrt",
    "fori_loop_static_nested",
    "cond_inside_scan",
    "mlp_train_step",
    "attention_causal",
    "embedding_lookup_grad",
    "segment_sum_and_max",
    "donated_inplace_update",
    "logsumexp_softmax",
    "conv2d_grads",
]


@pytest.mark.parametrize("name", CPU_PIPELINE_PROGRAMS)
def test_arena_run_after_the_cpu_pipeline(name):
    """Fusion, copy insertion and buffer assignment as `xlapy memory` runs them: the arena
    run (every value stored in and read from its slice) matches the plain interpreter."""
    prog = PROGRAMS[name]
    args = prog.args()
    module = parse_module(hlo_texts(prog).lowered)
    a = get_backend("cpu").plan_memory(module)  # the plan the CPU program runs
    check_invariants(a)
    run = evaluate_in_arena(a, args)
    assert_bitwise_equal(run.result, evaluate(a.module, args), name)  # the planned module


FUSED_AND_REDUCED = """
HloModule m
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
body {
  x = f32[64,32] parameter(0)
  y = f32[64,32] exponential(x)
  ROOT z = f32[64,32] multiply(y, y)
}
ENTRY e {
  p = f32[64,32] parameter(0)
  f = f32[64,32] fusion(p), kind=kLoop, calls=body
  zero = f32[] constant(0)
  ROOT r = f32[64] reduce(f, zero), dimensions={1}, to_apply=add
}
"""


def test_thread_local_allocations_as_xla_makes_them():
    # XLA skips fusion computations (their values never reach memory) and gives every
    # value of the other thread-local computations (here the reducer) its own allocation
    a = assign_buffers(parse_module(FUSED_AND_REDUCED))
    check_invariants(a)
    local = [x for x in a.allocations if x.is_thread_local]
    assert sorted((x.computation.name, x.instruction.name, x.size) for x in local) == [
        ("add", "a", 4),
        ("add", "b", 4),
        ("add", "s", 4),
    ]
    assert all(x.describe().endswith(f"thread-local (add: {x.instruction.name})") for x in local)
    assert a.memory_analysis().temp_bytes == 64 * 32 * 4
