"""The arena run: every program of jax_programs.py evaluated with every value stored in its
assigned bytes and read back from them must give the plain interpreter's result bit for
bit. A deliberately corrupted assignment must not."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from jax_programs import PROGRAMS, hlo_texts

from xlapy.backends.interpreter import evaluate
from xlapy.backends.interpreter.arena import evaluate_in_arena
from xlapy.ir.parser import parse_module
from xlapy.memory.buffer_assignment import Slice, assign_buffers, prepare_for_buffer_assignment

NAMES = list(PROGRAMS)


def _leaves(value):
    if isinstance(value, tuple):
        return [leaf for v in value for leaf in _leaves(v)]
    return [value]


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def assert_bitwise_equal(got, want, what: str) -> None:
    got, want = _leaves(got), _leaves(want)
    assert len(got) == len(want), what
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.dtype == w.dtype and g.shape == w.shape, f"{what} leaf {i}"
        assert np.array_equal(_bits(g), _bits(w)), f"{what} leaf {i}: bytes differ"


@pytest.mark.parametrize("form", ["lowered", "optimized"])
@pytest.mark.parametrize("name", NAMES)
def test_arena_run_matches_interpreter(name, form):
    prog = PROGRAMS[name]
    text = getattr(hlo_texts(prog), form)
    args = prog.args()
    expected = evaluate(parse_module(text), args)
    module = parse_module(text)
    if form == "lowered":
        prepare_for_buffer_assignment(module)
    assignment = assign_buffers(module)
    run = evaluate_in_arena(assignment, args)
    assert_bitwise_equal(run.result, expected, f"{name} ({form})")
    # Donated parameters hold the aliased outputs in their own bytes.
    for alias in module.config.input_output_alias:
        param = module.entry.parameter(alias.param_number)
        out = assignment.slice_of(module.entry.root, alias.output_index)
        assert out == assignment.slice_of(param, alias.param_index)


SMALL = """
HloModule small
ENTRY e {
  p = f32[16] parameter(0)
  a = f32[16] exponential(p)
  b = f32[16] sine(p)
  c = f32[16] cosine(b)
  ROOT d = f32[16] add(a, c)
}
"""


def _corrupt(assignment):
    """Give some value the slice of another that is still live when it is written."""
    lv = assignment.liveness
    infos = [i for i in assignment.value_infos() if i.value.shape.is_array and i.size]
    for victim in infos:
        for writer in infos:
            if writer.value is victim.value or not writer.value.is_write:
                continue
            if not victim.start < writer.start < victim.end or writer.size > victim.size:
                continue
            if assignment.allocations[victim.slice.allocation].kind not in ("temp", "output"):
                continue
            if lv.live_range(writer.value)[1] >= lv.end_time:
                continue
            slices = dict(assignment.slices)
            slices[writer.value] = Slice(
                victim.slice.allocation, victim.slice.offset, writer.slice.size
            )
            return dataclasses.replace(assignment, slices=slices)
    raise AssertionError("no pair of live values to corrupt")


@pytest.mark.parametrize("source", ["small", "mlp_train_step"])
def test_corrupted_assignment_changes_the_result(source):
    if source == "small":
        module = parse_module(SMALL)
        args = [np.random.default_rng(1).standard_normal(16).astype(np.float32)]
    else:
        prog = PROGRAMS[source]
        module, args = parse_module(hlo_texts(prog).optimized), prog.args()
    assignment = assign_buffers(module)
    good = evaluate_in_arena(assignment, args).result
    assert_bitwise_equal(good, evaluate(module, args), source)
    bad = evaluate_in_arena(_corrupt(assignment), args).result
    with pytest.raises(AssertionError, match="bytes differ"):
        assert_bitwise_equal(bad, good, source)
