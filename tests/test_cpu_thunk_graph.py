"""The CPU backend's concurrent thunk executor (xlapy/backends/cpu/thunk_graph.py): the
dependency analysis on access sets and on compiled modules, the graph executor (order,
errors, nesting inside the pool) and determinism: every JAX program gives the same bytes
run as graphs ("always") as run in order ("off")."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from jax_programs import PROGRAMS, hlo_texts
from test_jax_programs import leaves

from xlapy.backends.cpu.backend import CpuProgram
from xlapy.backends.cpu.runtime.control_flow_thunk import WhileThunk
from xlapy.backends.cpu.runtime.pool import even_blocks, run_blocks
from xlapy.backends.cpu.runtime.thunk import GraphChoice, ThunkSequence
from xlapy.backends.cpu.runtime.thunk_graph import (
    DEFAULT_MODE,
    Access,
    ancestor_masks,
    concurrency_mode,
    dependencies,
    plan_graph,
    run_graph,
)
from xlapy.errors import EvaluationError, XlapyError
from xlapy.ir.parser import parse_module

pytestmark = pytest.mark.usefixtures("kernel_cache")


def acc(reads=(), writes=(), ordered=False) -> Access:
    """Access of ranges given as (allocation, start, end)."""
    return Access.of(reads, writes, ordered)


# -- dependency analysis on access sets ----------------------------------------------------

DEPENDENCY_CASES = [
    # (name, accesses, expected direct predecessors)
    ("independent", [acc([(0, 0, 8)], [(1, 0, 8)]), acc([(0, 0, 8)], [(1, 8, 16)])], [(), ()]),
    ("read after write", [acc([], [(1, 0, 8)]), acc([(1, 4, 12)], [(1, 16, 20)])], [(), (0,)]),
    ("write after read", [acc([(1, 0, 8)], [(2, 0, 4)]), acc([], [(1, 4, 8)])], [(), (0,)]),
    ("write after write", [acc([], [(1, 0, 8)]), acc([], [(1, 0, 4)])], [(), (0,)]),
    ("reads never conflict", [acc([(1, 0, 8)], []), acc([(1, 0, 8)], [])], [(), ()]),
    ("other allocation", [acc([], [(1, 0, 8)]), acc([(2, 0, 8)], [])], [(), ()]),
    ("touching is no overlap", [acc([], [(1, 0, 8)]), acc([(1, 8, 16)], [])], [(), ()]),
    (
        "implied edge dropped",
        [acc([], [(1, 0, 8)]), acc([(1, 0, 8)], [(1, 8, 16)]), acc([(1, 0, 16)], [])],
        [(), (0,), (1,)],
    ),
    (
        "in place keeps readers first",  # 1 reads what 2 updates in place
        [acc([], [(1, 0, 8)]), acc([(1, 0, 8)], [(2, 0, 8)]), acc([(1, 0, 8)], [(1, 0, 8)])],
        [(), (0,), (1,)],
    ),
    (
        "side effects keep their order",
        [acc([], [(1, 0, 4)], True), acc([], [(1, 8, 12)]), acc([], [(1, 16, 20)], True)],
        [(), (), (0,)],
    ),
    (
        "barrier",
        [acc([], [(1, 0, 4)]), acc([], [(1, 8, 12)]), None, acc([], [(1, 16, 20)])],
        [(), (), (0, 1), (2,)],
    ),
    (
        "overwritten range forgets old readers safely",
        [
            acc([(1, 0, 8)], [(2, 0, 8)]),  # reads r
            acc([], [(1, 0, 8)]),  # overwrites r: after 0
            acc([], [(1, 0, 4)]),  # overwrites part: after 1 (and so after 0)
        ],
        [(), (0,), (1,)],
    ),
]


@pytest.mark.parametrize(
    "accesses,expected", [c[1:] for c in DEPENDENCY_CASES], ids=[c[0] for c in DEPENDENCY_CASES]
)
def test_dependencies(accesses, expected):
    assert dependencies(accesses) == expected


def test_access_ranges_are_merged():
    a = Access.of([(1, 8, 16), (1, 0, 8), (0, 4, 4), (1, 20, 24)], [])
    assert a.reads == ((1, 0, 16), (1, 20, 24))
    assert Access.union([a, None]) is None


def test_plan_decision():
    two = [acc([(0, 0, 8)], [(1, 0, 8)]), acc([(0, 0, 8)], [(1, 8, 16)])]
    chain = [acc([], [(1, 0, 8)]), acc([(1, 0, 8)], [(1, 8, 16)])]
    big, small = [1e6, 1e6], [10.0, 1e6]
    assert plan_graph(two, big, "auto") is not None
    assert plan_graph(two, small, "auto") is None  # one of the two is too cheap to overlap
    assert plan_graph(two, small, "always") is not None
    assert plan_graph(chain, big, "always") is None  # a chain keeps the plain loop
    assert plan_graph(two, big, "off") is None
    # a thunk that splits itself over the pool gains little from a neighbour
    assert plan_graph(two, big, "auto", alone=[True, False]) is None


def test_concurrency_mode(monkeypatch):
    monkeypatch.delenv("XLAPY_CPU_CONCURRENCY", raising=False)
    assert concurrency_mode({}) == DEFAULT_MODE
    monkeypatch.setenv("XLAPY_CPU_CONCURRENCY", "auto")
    assert concurrency_mode({}) == "auto"
    monkeypatch.setenv("XLAPY_CPU_CONCURRENCY", "off")
    assert concurrency_mode({}) == "off"
    assert concurrency_mode({"thunk_concurrency": "always"}) == "always"
    assert concurrency_mode({"thunk_concurrency": False}) == "off"
    with pytest.raises(XlapyError, match="thunk_concurrency"):
        concurrency_mode({"thunk_concurrency": "sometimes"})


# -- the analysis on compiled modules --------------------------------------------------------


def sequences(seq: ThunkSequence):
    yield seq
    for t in seq.thunks:
        for attr in ("condition", "body"):
            nested = getattr(t, attr, None)
            if isinstance(nested, ThunkSequence):
                yield from sequences(nested)
        for branch in getattr(t, "branches", ()):
            yield from sequences(branch)


def conflict(a: Access | None, b: Access | None) -> bool:
    if a is None or b is None or (a.ordered and b.ordered):
        return True

    def hit(xs, ys):
        return any(x[0] == y[0] and x[1] < y[2] and y[1] < x[2] for x in xs for y in ys)

    return hit(a.writes, b.reads) or hit(a.writes, b.writes) or hit(a.reads, b.writes)


def check_plan(seq: ThunkSequence) -> None:
    """Every pair of thunks that conflict is ordered by the plan's edges."""
    if seq.plan is None:
        return
    preds = [[] for _ in seq.thunks]
    for p, succs in enumerate(seq.plan.succs):
        for s in succs:
            preds[s].append(p)
    masks = ancestor_masks(preds)
    accesses = [t.access for t in seq.thunks]
    for j in range(len(accesses)):
        for i in range(j):
            if conflict(accesses[i], accesses[j]):
                assert (masks[j] >> i) & 1, f"{seq.name}: thunk {j} may overtake thunk {i}"


def plan_of(program: CpuProgram, name: str | None = None) -> ThunkSequence:
    for seq in sequences(program.compiled.entry):
        if name is None or seq.name == name:
            return seq
    raise AssertionError(name)


def names(seq: ThunkSequence) -> list[str]:
    return [t.instr.name for t in seq.thunks]


def independent(seq: ThunkSequence, a: str, b: str) -> bool:
    assert seq.plan is not None, "\n".join(seq.describe())
    preds = [[] for _ in seq.thunks]
    for p, succs in enumerate(seq.plan.succs):
        for s in succs:
            preds[s].append(p)
    masks = ancestor_masks(preds)
    i, j = sorted((names(seq).index(a), names(seq).index(b)))
    return not (masks[j] >> i) & 1


TWO_DOTS = """HloModule two_dots
ENTRY e {
  a = f32[128,128] parameter(0)
  b = f32[128,128] parameter(1)
  c = f32[128,128] parameter(2)
  d1 = f32[128,128] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  d2 = f32[128,128] dot(a, c), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT s = f32[128,128] add(d1, d2)
}"""


def compile_text(text: str, mode: str, **options) -> CpuProgram:
    return CpuProgram(parse_module(text), {"thunk_concurrency": mode, **options})


def test_independent_dots_overlap():
    """Two one-thread dots (below dot_thunk.PARALLEL_MIN_FLOPS) beside each other."""
    program = compile_text(TWO_DOTS, "auto")
    seq = program.compiled.entry
    assert independent(seq, "d1", "d2")
    assert not independent(seq, "d1", "s") and not independent(seq, "d2", "s")
    assert "runs as a graph" in program.compiled.thunk_listing()
    assert compile_text(TWO_DOTS, "off").compiled.entry.plan is None
    args = [np.random.default_rng(i).standard_normal((128, 128), np.float32) for i in range(3)]
    for _ in range(12):  # the first runs probe both ways
        got = program.run(args)
    expected = compile_text(TWO_DOTS, "off").run(args)
    assert got.tobytes() == expected.tobytes()


WHILE_TWO_DOTS = """HloModule loop
body {
  p = (s32[], f32[64,64], f32[64,64]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  h = f32[64,64] get-tuple-element(p), index=1
  w = f32[64,64] get-tuple-element(p), index=2
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  d1 = f32[64,64] dot(h, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  d2 = f32[64,64] dot(w, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  t = f32[64,64] tanh(d1)
  h1 = f32[64,64] add(t, d2)
  ROOT r = (s32[], f32[64,64], f32[64,64]) tuple(i1, h1, w)
}
cond {
  p = (s32[], f32[64,64], f32[64,64]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(5)
  ROOT lt = pred[] compare(i, n), direction=LT
}
ENTRY e {
  h0 = f32[64,64] parameter(0)
  w0 = f32[64,64] parameter(1)
  x = f32[64,64] parameter(2)
  zero = s32[] constant(0)
  init = (s32[], f32[64,64], f32[64,64]) tuple(zero, h0, w0)
  loop = (s32[], f32[64,64], f32[64,64]) while(init), condition=cond, body=body
  out = f32[64,64] get-tuple-element(loop), index=1
  other = f32[64,64] dot(x, x), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT s = f32[64,64] add(out, other)
}"""


def covers(outer, inner) -> bool:
    """Every range of `inner` lies inside some range of `outer`."""
    return all(any(o[0] == a and o[1] <= s and e <= o[2] for o in outer) for a, s, e in inner)


def test_control_flow():
    program = compile_text(WHILE_TWO_DOTS, "always", optimize=False)
    entry = program.compiled.entry
    loop = next(t for t in entry.thunks if isinstance(t, WhileThunk))
    assert independent(loop.body, "d1", "d2")
    assert not independent(loop.body, "d1", "h1")
    # the loop's access covers its body's (the other dot reuses arena bytes of the body's
    # temporaries, so it waits for the loop too)
    for nested in (*loop.condition.thunks, *loop.body.thunks):
        assert covers(loop.access.reads, nested.access.reads)
        assert covers(loop.access.writes, nested.access.writes)
    assert not independent(entry, "loop", "s") and not independent(entry, "other", "s")
    for seq in sequences(entry):
        check_plan(seq)
    args = [np.random.default_rng(i).standard_normal((64, 64), np.float32) * 0.1 for i in range(3)]
    got = program.run(args)
    want = compile_text(WHILE_TWO_DOTS, "off", optimize=False).run(args)
    assert got.tobytes() == want.tobytes()


def test_error_inside_a_graph_reaches_the_caller():
    program = compile_text(WHILE_TWO_DOTS, "always", optimize=False, max_while_iterations=2)
    assert program.compiled.entry.plan is not None
    args = [np.random.default_rng(i).standard_normal((64, 64), np.float32) for i in range(3)]
    for _ in range(3):
        with pytest.raises(EvaluationError, match="ran past 2 iterations"):
            program.run(args)


IN_PLACE = """HloModule in_place
ENTRY e {
  big = f32[8,64] parameter(0)
  u = f32[1,64] parameter(1)
  i = s32[] parameter(2)
  zero = s32[] constant(0)
  nb = f32[8,64] negate(big)
  zero_f = f32[] constant(0)
  r = f32[8] reduce(nb, zero_f), dimensions={1}, to_apply=add
  upd = f32[8,64] dynamic-update-slice(nb, u, i, zero)
  ROOT t = (f32[8], f32[8,64]) tuple(r, upd)
}
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}"""


def test_in_place_update_waits_for_readers():
    program = compile_text(IN_PLACE, "always", optimize=False)
    seq = program.compiled.entry
    check_plan(seq)
    thunks = {t.instr.name: t for t in seq.thunks}
    upd, nb = thunks["upd"].access, thunks["nb"].access
    assert set(upd.reads) & set(upd.writes)  # in place: both
    if seq.plan is not None and set(upd.writes) & set(nb.writes):
        assert not independent(seq, "r", "upd")  # the reduce reads nb before the update
    rng = np.random.default_rng(0)
    args = [rng.standard_normal((8, 64), np.float32), rng.standard_normal((1, 64), np.float32)]
    args.append(np.int32(3))
    got, want = program.run(args), compile_text(IN_PLACE, "off", optimize=False).run(args)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(got, want, strict=True))


CUSTOM_CALLS = """HloModule customs
ENTRY e {
  x = f32[16] parameter(0)
  y = f32[16] parameter(1)
  a = f32[16] custom-call(x), custom_call_target="first"
  b = f32[16] custom-call(y), custom_call_target="second"
  c = f32[16] rng(x, y), distribution=rng_uniform
  ROOT t = (f32[16], f32[16], f32[16]) tuple(a, b, c)
}"""


def test_side_effects_keep_their_order():
    seq = compile_text(CUSTOM_CALLS, "always", optimize=False).compiled.entry
    assert [t.access.ordered for t in seq.thunks] == [True, True, True]
    assert seq.plan is None  # a chain: nothing may overlap


def test_graph_choice_keeps_the_faster_way():
    choice = GraphChoice()
    for _ in range(2 * GraphChoice.PROBES + 1):
        graph = choice.next_split()
        choice.record(graph, 2e-4 if graph else 1e-4)
    assert choice.split is False
    choice = GraphChoice()
    for _ in range(2 * GraphChoice.PROBES + 1):
        graph = choice.next_split()
        choice.record(graph, 0.7e-4 if graph else 1e-4)
    assert choice.split is True


# -- the executor ----------------------------------------------------------------------------


class Recorder:
    """A fake thunk: sleeps (GIL released), records its start and end order."""

    def __init__(self, log, name, seconds=0.0, error=None, body=None):
        self.log, self.name, self.seconds, self.error, self.body = log, name, seconds, error, body

    def run(self, ctx):
        self.log.append(("start", self.name))
        if self.seconds:
            time.sleep(self.seconds)
        if self.body is not None:
            self.body()
        self.log.append(("end", self.name))
        if self.error is not None:
            raise self.error


def fan(n: int, join: bool = True):
    """Accesses of n independent thunks, then (join) one reading all their results."""
    accesses = [acc([(0, 0, 8)], [(1, 8 * i, 8 * i + 8)]) for i in range(n)]
    if join:
        accesses.append(acc([(1, 0, 8 * n)], [(2, 0, 8)]))
    return accesses


def test_executor_respects_edges_and_overlaps():
    """The three independent thunks run at the same time: each waits (up to a minute) until
    a second one has started, instead of sleeping a fixed 20 ms and hoping that a helper
    thread got a core meanwhile (it did not, now and then, on a loaded 2-core machine)."""
    log = []
    started = [0]
    two_started = threading.Event()
    lock = threading.Lock()

    def meet():
        with lock:
            started[0] += 1
            if started[0] >= 2:
                two_started.set()
        two_started.wait(60)

    plan = plan_graph(fan(3), [1e6] * 4, "always")
    thunks = [Recorder(log, i, body=meet) for i in range(3)] + [Recorder(log, "join")]
    run_graph(thunks, plan, None)
    order = [e for e in log]
    assert order[-2:] == [("start", "join"), ("end", "join")]
    ends = [order.index(("end", i)) for i in range(3)]
    starts = [order.index(("start", i)) for i in range(3)]
    assert min(ends) > min(starts) + 1  # some two independent thunks ran at the same time


def test_errors_propagate_after_running_thunks_finish():
    log = []
    plan = plan_graph(fan(3), [1e6] * 4, "always")
    thunks = [
        Recorder(log, 0, 0.02),
        Recorder(log, 1, 0.0, EvaluationError("first failure")),
        Recorder(log, 2, 0.01, ValueError("later failure")),
        Recorder(log, "join"),
    ]
    with pytest.raises(EvaluationError, match="first failure"):
        run_graph(thunks, plan, None)
    assert ("start", "join") not in log  # nothing after a failure starts
    starts = sum(1 for e in log if e[0] == "start")
    assert starts == sum(1 for e in log if e[0] == "end")  # none left running


def test_nested_graphs_and_pool_splits_inside_workers():
    """Thunks that run graphs or split over the pool themselves, on pool workers, many at
    once: no deadlock, everything runs once."""
    counts = [0] * 64
    lock = threading.Lock()

    def count(lo, hi):
        with lock:
            for k in range(lo, hi):
                counts[k] += 1

    inner_plan = plan_graph(fan(4, join=False), [1e6] * 4, "always")

    def inner():
        log = []
        run_graph([Recorder(log, i, 0.001) for i in range(4)], inner_plan, None)
        run_blocks(count, even_blocks(64, 4))

    outer_plan = plan_graph(fan(6), [1e6] * 7, "always")
    for _ in range(20):
        log = []
        run_graph([Recorder(log, i, body=inner) for i in range(7)], outer_plan, None)
        assert len(log) == 14
    assert counts == [20 * 7] * 64


# -- determinism on the JAX programs ---------------------------------------------------------


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_graph_runs_match_ordered_runs_bit_for_bit(name):
    prog = PROGRAMS[name]
    text = hlo_texts(prog).lowered
    args = prog.args()
    ordered = compile_text(text, "off")
    graph = compile_text(text, "always")
    for seq in sequences(graph.compiled.entry):
        check_plan(seq)
    want = leaves(ordered.run(args))
    for _ in range(2):
        got = leaves(graph.run(args))
        assert len(got) == len(want)
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            g, w = np.asarray(g), np.asarray(w)
            assert g.dtype == w.dtype and g.shape == w.shape, f"{name} leaf {i}"
            assert g.tobytes() == w.tobytes(), f"{name} leaf {i} differs"
