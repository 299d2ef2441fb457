"""Buffer assignment invariants: no two simultaneously live values overlap, aliased
parameters and outputs share an allocation, the figures add up."""

from __future__ import annotations

import pytest
from test_dataflow import CONTROL, TUPLES, WHILE

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
    assert a.allocation_of(e.get_instruction("m")).is_temp


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
