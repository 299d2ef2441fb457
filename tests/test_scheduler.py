"""Sequential schedulers: valid orders, side-effect order, peaks, and choosing the best."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xlapy.errors import VerifierError
from xlapy.ir import HloComputation, HloInstruction, HloModule, Opcode, Shape
from xlapy.ir.parser import parse_module
from xlapy.memory.heap_simulator import MemoryPlanningError, simulate_heap
from xlapy.memory.scheduler import (
    SCHEDULERS,
    default_size,
    heap_buffers,
    live_intervals,
    peak_memory,
    pick_best_schedule,
    schedule_computation,
    schedule_module,
    validate_sequence,
)

# The root adds a small early value `m` to the result of a big temporary reduced to a
# scalar. Post order computes `m` first and keeps it live across `big`; DFS runs the heavy
# operand first.
FAN = """
HloModule fan

add_f32 {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY e {
  p = f32[] parameter(0)
  m = f32[1000] broadcast(p), dimensions={}
  big = f32[100000] broadcast(p), dimensions={}
  c0 = f32[] constant(0)
  r = f32[] reduce(big, c0), dimensions={0}, to_apply=add_f32
  br = f32[1000] broadcast(r), dimensions={}
  ROOT out = f32[1000] add(m, br)
}
"""

# A while loop whose body and condition are scheduled on their own; a fusion computation
# that is not.
LOOP = """
HloModule loop

fused {
  x = f32[8] parameter(0)
  ROOT y = f32[8] negate(x)
}

cond {
  s = (s32[], f32[8]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  n = s32[] constant(10)
  ROOT lt = pred[] compare(i, n), direction=LT
}

body {
  s = (s32[], f32[8]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  v = f32[8] get-tuple-element(s), index=1
  one = s32[] constant(1)
  j = s32[] add(i, one)
  w = f32[8] fusion(v), kind=kLoop, calls=fused
  ROOT t = (s32[], f32[8]) tuple(j, w)
}

ENTRY main {
  v0 = f32[8] parameter(0)
  z = s32[] constant(0)
  init = (s32[], f32[8]) tuple(z, v0)
  ROOT loop = (s32[], f32[8]) while(init), condition=cond, body=body
}
"""


def names(sequence):
    return [i.name for i in sequence]


@pytest.fixture
def fan():
    return parse_module(FAN).entry


# -- hand computations ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "scheduler, order, peak",
    [
        # p m big c0 r br out: at r, m + big + c0 + r are live.
        ("post-order", ["p", "m", "big", "c0", "r", "br", "out"], 4000 + 400000 + 4 + 4),
        # p big c0 r br m out: at r, only big + c0 + r.
        ("dfs", ["p", "big", "c0", "r", "br", "m", "out"], 400000 + 4 + 4),
        # greedy takes the cheap c0 and m before big.
        ("list", ["p", "c0", "m", "big", "r", "br", "out"], 4 + 4000 + 400000 + 4),
    ],
)
def test_fan_orders_and_peaks(fan, scheduler, order, peak):
    sequence = SCHEDULERS[scheduler](fan, default_size)
    assert names(sequence) == order
    assert peak_memory(fan, sequence) == peak


def test_pick_best_beats_the_worst(fan):
    best = pick_best_schedule(fan)
    peaks = dict(best.candidates)
    assert peaks == {"post-order": 404008, "dfs": 400008, "list": 404008}
    assert best.algorithm == "dfs"
    assert best.peak_bytes == 400008 < max(peaks.values())
    assert names(best.sequence) == ["p", "big", "c0", "r", "br", "m", "out"]


def wide_fan(branches):
    """`branches` independent branches, each an early 4000-byte value plus a 400000-byte
    temporary reduced to a scalar, gathered by a root tuple."""
    lines = ["  p = f32[] parameter(0)", "  c0 = f32[] constant(0)"]
    for k in range(branches):
        lines += [
            f"  m{k} = f32[1000] broadcast(p), dimensions={{}}",
            f"  big{k} = f32[100000] broadcast(p), dimensions={{}}",
            f"  r{k} = f32[] reduce(big{k}, c0), dimensions={{0}}, to_apply=add_f32",
            f"  br{k} = f32[1000] broadcast(r{k}), dimensions={{}}",
            f"  out{k} = f32[1000] add(m{k}, br{k})",
        ]
    outs = ", ".join(f"out{k}" for k in range(branches))
    shape = ", ".join(["f32[1000]"] * branches)
    lines.append(f"  ROOT t = ({shape}) tuple({outs})")
    text = FAN.split("ENTRY")[0] + "ENTRY e {\n" + "\n".join(lines) + "\n}\n"
    return parse_module(text).entry


@pytest.mark.parametrize("branches", [2, 4, 8])
def test_wide_fan_best_is_strictly_lower_than_worst(branches):
    comp = wide_fan(branches)
    best = pick_best_schedule(comp)
    peaks = dict(best.candidates)
    # At the last branch's reduce: the finished outs, the big temporary, c0 and r; post
    # order also holds that branch's m.
    done = (branches - 1) * 4000
    assert peaks["post-order"] == done + 4000 + 400000 + 4 + 4
    assert peaks["dfs"] == done + 400000 + 4 + 4
    assert best.peak_bytes == min(peaks.values()) < max(peaks.values())
    validate_sequence(comp, best.sequence)


def test_heap_buffers_feed_the_heap_simulator(fan):
    for scheduler in SCHEDULERS.values():
        sequence = scheduler(fan, default_size)
        buffers = heap_buffers(fan, sequence, alignment=4)
        result = simulate_heap(buffers)
        assert result.lower_bound == peak_memory(fan, sequence)
        assert result.heap_size >= result.lower_bound


def test_live_intervals_by_hand(fan):
    sequence = SCHEDULERS["post-order"](fan, default_size)
    spans = {i.name: v for i, v in live_intervals(fan, sequence).items()}
    assert spans == {
        "m": (1, 6, 4000),
        "big": (2, 4, 400000),
        "c0": (3, 4, 4),
        "r": (4, 5, 4),
        "br": (5, 6, 4000),
        "out": (6, 6, 4000),
    }


def test_forwarding_keeps_buffers_live_and_root_tuple_pins_to_the_end():
    module = parse_module(
        """
HloModule fwd
ENTRY e {
  p = f32[4] parameter(0)
  a = f32[16] broadcast(p), dimensions={0}
  b = f32[4,4] bitcast(a)
  t = (f32[4,4], f32[4]) tuple(b, p)
  g = f32[4,4] get-tuple-element(t), index=0
  n = f32[4,4] negate(g)
  c = f32[4] negate(p)
  ROOT out = (f32[4,4], f32[4]) tuple(n, c)
}
"""
    )
    comp = module.entry
    sequence = comp.instructions
    spans = {i.name: v for i, v in live_intervals(comp, sequence).items()}
    # `a` is read through b, t and g by n at step 5; n and c sit behind the root tuple.
    assert spans == {"a": (1, 5, 64), "n": (5, 7, 64), "c": (6, 7, 16)}
    assert peak_memory(comp, sequence) == 64 + 64
    # Parameters count for the whole computation when a size function gives them bytes.
    sized = lambda i: 16 if i.opcode is Opcode.PARAMETER else default_size(i)  # noqa: E731
    assert live_intervals(comp, sequence, sized)[comp.parameter(0)] == (0, 7, 16)
    assert peak_memory(comp, sequence, sized) == 64 + 64 + 16


def test_module_schedule_covers_called_computations_not_fusions():
    module = parse_module(LOOP)
    schedule = schedule_module(module)
    assert {e.computation.name for e in schedule.computations} == {"cond", "body", "main"}
    assert "fused" not in schedule
    for entry in schedule.computations:
        validate_sequence(entry.computation, entry.sequence)
        assert entry.peak_bytes == min(p for _, p in entry.candidates)
    assert names(schedule.sequence("main"))[-1] == "loop"
    with pytest.raises(MemoryPlanningError, match="no sequence for computation fused"):
        schedule["fused"]


# -- side effects and control edges ----------------------------------------------------------
def side_effect_computation():
    f32 = Shape.array("f32", [4])
    p = HloInstruction("p", Opcode.PARAMETER, f32, parameter_number=0)
    calls = []
    for k in range(4):
        calls.append(
            HloInstruction(
                f"effect{k}",
                Opcode.CUSTOM_CALL,
                f32,
                [p],
                {"custom_call_target": "log", "custom_call_has_side_effect": True},
            )
        )
    big = HloInstruction("big", Opcode.BROADCAST, Shape.array("f32", [4, 1024]), [p])
    late = HloInstruction("late", Opcode.NEGATE, f32, [p], control_predecessors=[calls[3]])
    # The root reads the effects in reverse order; the text order must still win.
    root = HloInstruction(
        "root",
        Opcode.TUPLE,
        Shape.tuple([f32] * 5 + [big.shape]),
        [calls[3], calls[2], calls[1], calls[0], late, big],
    )
    return HloComputation("effects", [p, *calls, big, late, root])


@pytest.mark.parametrize("scheduler", list(SCHEDULERS))
def test_side_effects_keep_text_order_and_control_edges_hold(scheduler):
    comp = side_effect_computation()
    sequence = SCHEDULERS[scheduler](comp, default_size)
    validate_sequence(comp, sequence)
    effects = [n for n in names(sequence) if n.startswith("effect")]
    assert effects == ["effect0", "effect1", "effect2", "effect3"]
    assert names(sequence).index("late") > names(sequence).index("effect3")


def test_validate_sequence_reports_bad_orders(fan):
    good = SCHEDULERS["post-order"](fan, default_size)
    with pytest.raises(VerifierError, match="r comes before big"):
        validate_sequence(fan, [good[0], good[1], good[3], good[4], good[2], *good[5:]])
    with pytest.raises(VerifierError, match="missing out"):
        validate_sequence(fan, good[:-1])
    with pytest.raises(VerifierError, match="m appears twice"):
        validate_sequence(fan, [good[0], good[1], good[1], *good[2:]])


def test_cycles_are_reported():
    f32 = Shape.array("f32", [2])
    a = HloInstruction("a", Opcode.NEGATE, f32)
    b = HloInstruction("b", Opcode.NEGATE, f32, [a])
    a.operands = [b]
    comp = HloComputation("loopy", [a, b])
    for scheduler in SCHEDULERS.values():
        with pytest.raises(VerifierError, match="depends on itself"):
            scheduler(comp, default_size)


def test_unknown_scheduler(fan):
    with pytest.raises(MemoryPlanningError, match="unknown scheduler 'bfs'"):
        schedule_computation(fan, "bfs")


# -- random DAGs ------------------------------------------------------------------------------
@st.composite
def random_dags(draw):
    n = draw(st.integers(1, 30))
    instrs: list[HloInstruction] = []
    n_params = draw(st.integers(0, 3))
    for k in range(n_params):
        shape = Shape.array("f32", [draw(st.integers(1, 64))])
        instrs.append(HloInstruction(f"p{k}", Opcode.PARAMETER, shape, parameter_number=k))
    for k in range(n):
        operands = []
        if instrs:
            operands = draw(st.lists(st.sampled_from(instrs), max_size=3))
        kind = draw(st.sampled_from(["compute", "compute", "effect", "tuple", "gte"]))
        shape = Shape.array("f32", [draw(st.integers(1, 256))])
        controls = []
        if instrs and draw(st.booleans()):
            controls = [draw(st.sampled_from(instrs))]
        if kind == "tuple" and operands:
            instr = HloInstruction(
                f"t{k}", Opcode.TUPLE, Shape.tuple([o.shape for o in operands]), operands
            )
        elif kind == "gte" and any(o.shape.is_tuple for o in operands):
            source = next(o for o in operands if o.shape.is_tuple)
            instr = HloInstruction(
                f"g{k}",
                Opcode.GET_TUPLE_ELEMENT,
                source.shape.tuple_shapes[0],
                [source],
                {"index": 0},
            )
        elif kind == "effect":
            instr = HloInstruction(
                f"e{k}",
                Opcode.CUSTOM_CALL,
                shape,
                operands,
                {"custom_call_target": "fx", "custom_call_has_side_effect": True},
                control_predecessors=controls,
            )
        else:
            instr = HloInstruction(
                f"c{k}", Opcode.CUSTOM_CALL, shape, operands, control_predecessors=controls
            )
        instrs.append(instr)
    root = instrs[draw(st.integers(0, len(instrs) - 1))]
    return HloComputation("random", instrs, root=root)


@settings(max_examples=80, deadline=None)
@given(comp=random_dags())
def test_random_dags_get_valid_orders(comp):
    effects_in_text = [i for i in comp.instructions if i.has_side_effect]
    for name, scheduler in SCHEDULERS.items():
        sequence = scheduler(comp, default_size)
        assert len(sequence) == len(comp.instructions), name
        assert set(sequence) == set(comp.instructions), name
        position = {instr: k for k, instr in enumerate(sequence)}
        for instr in sequence:
            for dep in [*instr.operands, *instr.control_predecessors]:
                assert position[dep] < position[instr], (name, dep.name, instr.name)
        assert [i for i in sequence if i.has_side_effect] == effects_in_text, name
        validate_sequence(comp, sequence)
    best = pick_best_schedule(comp)
    assert best.peak_bytes == min(p for _, p in best.candidates)
    assert best.peak_bytes == peak_memory(comp, best.sequence)
    # The peak is at least what any single instruction needs for its inputs and output.
    live = live_intervals(comp, best.sequence)
    assert best.peak_bytes >= max((v[2] for v in live.values()), default=0)


def test_empty_module_schedule():
    module = HloModule("m")
    assert schedule_module(module).computations == ()
