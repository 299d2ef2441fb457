"""Memory reports: the text report, CSV rows, JSON figures, the timeline and its plot, on
hand-written modules whose sizes are known."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest
from test_dataflow import CONTROL, TUPLES, WHILE

from xlapy.backends import get_backend
from xlapy.backends.options import MEMORY_SCHEDULERS, BackendOptionError
from xlapy.ir.parser import parse_module
from xlapy.memory import report
from xlapy.memory.buffer_assignment import PLAN_ORDERS, BufferAssignment, plan_as_given
from xlapy.memory.heap_simulator import MemoryPlanningError

# p0 (1 KiB) is donated to output {0}; p1 (256 B) is read-only. b, m and e are 1 KiB
# temporaries, b live until u: two live at once (m and e share bytes), the arena is 2 KiB.
SIZES = """
HloModule sizes, input_output_alias={ {0}: (0, {}, may-alias) }

ENTRY main {
  p0 = f32[256]{0} parameter(0)
  p1 = f32[64]{0} parameter(1)
  c = f32[] constant(2)
  b = f32[256]{0} broadcast(c), dimensions={}
  m = f32[256]{0} multiply(p0, b), metadata={op_name="jit(f)/jit(main)/mul" source_line=3}
  e = f32[256]{0} exponential(m), metadata={op_name="jit(f)/jit(main)/exp"}
  u = f32[256]{0} add(e, b)
  s = f32[64]{0} sine(p1)
  ROOT t = (f32[256]{0}, f32[64]{0}) tuple(u, s)
}
"""

JSON_KEYS = {
    "argument_bytes",
    "output_bytes",
    "alias_bytes",
    "temp_bytes",
    "peak_bytes",
    "lower_bound_bytes",
    "scheduler",
}


def plan(text: str = SIZES, scheduler: str = "plan", optimize: bool = False) -> BufferAssignment:
    """The plan a backend runs for `text` (the interpreter's, the module as given, unless
    `optimize`: then the CPU backend's) under the option memory_scheduler=`scheduler`."""
    backend = get_backend("cpu" if optimize else "interpreter")
    return backend.plan_memory(parse_module(text), {"memory_scheduler": scheduler})


def test_text_report_sections_and_numbers():
    text = report.format_report(plan(), top=3, scheduler="plan")
    for section in ("Memory report for sizes", "Allocations:", "BufferAssignment stats:"):
        assert section in text
    assert "allocation 0: size 1024, entry-parameter 0 at ShapeIndex {} (aliased), " in text
    assert "allocation 1: size 256, entry-parameter 1 at ShapeIndex {} (read-only):" in text
    assert "size 4, constant:" in text
    assert "size 16, maybe-live-out, tuple:" in text
    assert "size 2048, temp:" in text
    assert "value: <0 p0> (size=1024,offset=0): f32[256]{0}, live [0, " in text
    rows = {
        "parameter allocation:": 1280,
        "constant allocation:": 4,
        "maybe-live-out allocation:": 1296,
        "temp allocation:": 2048,
        "temp fragmentation:": 0,
        "argument bytes:": 1280,
        "output bytes:": 1296,
        "alias bytes:": 1024,
        "peak bytes:": 1280 + 1296 - 1024 + 2048,
        "temp lower bound:": 2048,
    }
    lines = text.splitlines()
    for label, number in rows.items():
        line = next(x for x in lines if x.strip().startswith(label))
        assert int(line.split(":", 1)[1].split()[0]) == number, line


def test_peak_buffers_name_the_largest_values_and_their_op_names():
    a = plan()
    tl = report.timeline(a)
    peaks = report.peak_buffers(a, top=10, tl=tl)
    assert [x.rank for x in peaks] == list(range(1, len(peaks) + 1))
    assert [x.size for x in peaks] == sorted((x.size for x in peaks), reverse=True)
    assert sum(x.size for x in peaks) == tl.peak_bytes  # all fit in the top 10
    # the peak holds p0, p1 and the two temporaries of the arena
    assert tl.peak_bytes == 1280 + 2048
    temps = {x.value.name: x for x in peaks if x.kind == "temp"}
    assert len(temps) == 2 and all(x.size == 1024 for x in temps.values())
    named = [x for x in peaks if x.op_name]
    assert named and all(x.op_name.startswith("jit(f)/jit(main)/") for x in named)
    text = report.peak_text(a, top=2, tl=tl)
    assert text.startswith("Peak buffers: 3.25KiB (3328 bytes) live at step")
    assert len(text.splitlines()) == 3 + 2  # title, by kind, header, two rows


def test_timeline_is_the_sum_of_its_buffers():
    a = plan()
    tl = report.timeline(a)
    assert len(tl.live_bytes) == a.liveness.end_time + 1 == len(tl.steps)
    for t in range(len(tl.live_bytes)):
        assert tl.live_bytes[t] == sum(b.size for b in tl.buffers if b.live_at(t))
    assert tl.peak_bytes == tl.live_bytes.max()
    assert tl.peak_bytes <= a.peak_bytes
    assert {b.kind for b in tl.buffers} == {"parameter", "output", "temp"}


def test_csv_has_one_row_per_value():
    a = plan()
    rows = list(csv.DictReader(io.StringIO(report.write_csv(a))))
    assert len(rows) == len(a.dataflow.values)
    assert tuple(rows[0]) == report.CSV_COLUMNS
    by_name = {r["value"]: r for r in rows}
    m = by_name["m"]
    assert (m["opcode"], m["shape"], m["size"], m["allocation_kind"]) == (
        "multiply",
        "f32[256]",
        "1024",
        "temp",
    )
    assert m["uses"] == "e" and m["num_uses"] == "1" and m["op_name"] == "jit(f)/jit(main)/mul"
    assert by_name["b"]["uses"].split(";") == ["m", "u"]
    for r in rows:
        value = next(v for v in a.dataflow.values if v.id == int(r["value_id"]))
        s = a.slices[value]
        assert (int(r["allocation"]), int(r["offset"]), int(r["size"])) == (
            s.allocation,
            s.offset,
            s.size,
        )
        assert int(r["start"]) <= int(r["end"])


@pytest.mark.parametrize("scheduler", MEMORY_SCHEDULERS)
@pytest.mark.parametrize(
    "text", [SIZES, TUPLES, WHILE, CONTROL], ids=["sizes", "tuples", "while", "control"]
)
def test_figures_are_consistent(text, scheduler):
    a = plan(text, scheduler=scheduler)
    figures = json.loads(report.figures_json(a, scheduler))
    assert set(figures) >= JSON_KEYS
    assert figures["peak_bytes"] == (
        figures["argument_bytes"]
        + figures["output_bytes"]
        - figures["alias_bytes"]
        + figures["temp_bytes"]
    )
    assert figures["lower_bound_bytes"] <= figures["temp_bytes"]
    assert figures["fragmentation_bytes"] == figures["temp_bytes"] - figures["lower_bound_bytes"]
    assert figures["timeline_peak_bytes"] <= figures["peak_bytes"]
    assert figures["scheduler"] == scheduler


def test_the_option_names_the_planner_orders():
    """The option table restates PLAN_ORDERS (reading it loads no planner): they agree."""
    assert MEMORY_SCHEDULERS == PLAN_ORDERS


@pytest.mark.parametrize("scheduler", ["list", "module"])
def test_the_cpu_program_runs_the_plan_its_option_names(scheduler):
    """memory_scheduler is a compile option, not a report's what-if: the CPU program
    compiled with it executes the plan the CPU backend reports for it."""
    from xlapy.runtime import Client, CompileOptions

    options = {"memory_scheduler": scheduler}
    client = Client("cpu")
    exe = client.compile(WHILE, CompileOptions.make(backend_options=options))
    ran = exe.backend_program().compiled.assignment
    planned = get_backend("cpu").plan_memory(parse_module(WHILE), options)
    assert planned.to_text() == ran.to_text()
    assert exe.memory_stats().temp_bytes == planned.temp_bytes
    client.close()


def test_the_cpu_plan_runs_the_default_pipeline_first():
    a = plan(SIZES, optimize=True)
    figures = report.memory_figures(a, "plan")
    assert figures["argument_bytes"] == 1280 and figures["alias_bytes"] == 1024
    # fused, the three temporaries become one kernel: nothing is left in the arena
    assert figures["temp_bytes"] < 2048


def test_plot_is_a_png(tmp_path):
    from matplotlib.image import imread

    path = report.plot_timeline(plan(WHILE), tmp_path / "mem.png")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    image = imread(path)
    assert image.shape[0] > 300 and image.shape[1] > 600
    assert np.ptp(image[..., :3]) > 0.5  # not a blank canvas


def test_plot_peak_label_overlaps_neither_legend_nor_curve(tmp_path, monkeypatch):
    """Issue 15's small defect: the peak label overlapped the legend and the curve. It sits
    inside the axes, above the highest live bytes and clear of the assigned-peak line, and
    the legend is outside the axes."""
    from matplotlib.figure import Figure

    figures = []
    save = Figure.savefig

    def keep(self, *args, **kwargs):
        figures.append(self)
        return save(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    assignment = plan(WHILE)
    report.plot_timeline(assignment, tmp_path / "mem.png")
    [fig] = figures
    ax = fig.axes[0]
    renderer = fig.canvas.get_renderer()
    label = next(t for t in ax.texts if t.get_text().startswith("peak "))
    box = label.get_window_extent(renderer)
    assert not box.overlaps(ax.get_legend().get_window_extent(renderer))
    axes_box = ax.get_window_extent(renderer)
    assert axes_box.x0 <= box.x0 and box.x1 <= axes_box.x1 and box.y1 <= axes_box.y1
    to_data = ax.transData.inverted()
    curve = max(ax.lines[0].get_ydata())  # the live-bytes step line
    assert to_data.transform((box.x0, box.y0))[1] > curve
    dotted = next(line for line in ax.lines if line.get_linestyle() == ":")
    assigned_y = ax.transData.transform((0, dotted.get_ydata()[0]))[1]
    assert not box.y0 <= assigned_y <= box.y1


@pytest.mark.parametrize(
    "n, text", [(0, "0B"), (1023, "1023B"), (1536, "1.50KiB"), (3 << 20, "3.00MiB")]
)
def test_human_bytes(n, text):
    assert report.human_bytes(n) == text


def test_unknown_scheduler_is_an_error():
    with pytest.raises(BackendOptionError, match=r"memory_scheduler='fastest'.*post-order"):
        plan(scheduler="fastest")
    with pytest.raises(MemoryPlanningError, match=r"unknown scheduler 'fastest'.*post-order"):
        plan_as_given(parse_module(SIZES), "fastest")


def test_readme_says_how_to_get_op_names_in_the_memory_report():
    """Issue 15's small defect: the README did not say that JAX writes op names only with
    `debug_info=True`; a JAX program exported that way does carry them into the report."""
    import jax
    import jax.numpy as jnp

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    assert 'as_text(dialect="hlo", debug_info=True)' in readme
    spec = jax.ShapeDtypeStruct((64,), jnp.float32)
    lowered = jax.jit(lambda x: jnp.sin(x) * 2).lower(spec)
    plain = lowered.as_text(dialect="hlo")
    named = lowered.as_text(dialect="hlo", debug_info=True)
    assert "jit(<lambda>)/sin" not in plain and "jit(<lambda>)/sin" in named
    module = parse_module(named)
    assert any(i.op_name == "jit(<lambda>)/sin" for i in module.entry.instructions)
