"""Memory reports: what a buffer assignment means to the person whose program ran out of memory.

From one BufferAssignment this module derives
  - the allocation listing, the way XLA's buffer assignment dump reads: every allocation
    with its size and flags (entry parameter with its number and shape index, aliased or
    read-only; constant; maybe-live-out; thread-local; tuple; temp) and the values in it
    with offset, size and live range;
  - the stats of XLA's BufferAssignment (parameter, constant, maybe-live-out and temp
    bytes, the temp arena's fragmentation, the total) and the figures of
    memory_analysis() (argument + output - alias + temp = peak);
  - the memory timeline: at each step of the flattened schedule, the bytes held by the
    buffers live then. Entry parameters are held for the whole run (the caller owns them),
    outputs from their definition to the end, temps over their buffer's live range (the
    span the heap simulator packs); constants and thread-local scratch are left out, as
    memory_analysis() leaves them out of the peak;
  - the peak buffers: the largest buffers live at the timeline's peak, each with the value
    that holds it then, its shape, opcode and the op_name JAX put in its metadata;
  - one CSV row per value, a JSON object of the figures, and a PNG plot of the timeline
    stacked by the largest buffers with the peak marked (matplotlib, imported lazily).

The plan reported is always one a backend runs: `xlapy memory` compiles the module for
the CPU backend (the interpreter's with --no-opt) and reads the executable's plan
(Executable.memory_plan()); this module plans nothing of its own.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from xlapy.analysis.alias import HloBuffer
from xlapy.analysis.dataflow import HloValue
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.opcodes import Opcode
from xlapy.ir.shapes import index_text
from xlapy.memory.buffer_assignment import BufferAssignment

CSV_COLUMNS = (
    "value_id",
    "value",
    "computation",
    "opcode",
    "shape",
    "allocation",
    "allocation_kind",
    "offset",
    "size",
    "start",
    "end",
    "num_uses",
    "uses",
    "op_name",
)


# -- timeline and peak ------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TimelineBuffer:
    """Bytes held over steps [start, end] of the flattened schedule: one entry-parameter or
    output allocation, or one buffer of a temp arena."""

    label: str
    kind: str  # "parameter", "output" or "temp"
    size: int
    start: int
    end: int
    allocation: int
    buffer: HloBuffer | None

    def live_at(self, time: int) -> bool:
        return self.start <= time <= self.end


@dataclass(frozen=True, slots=True)
class Timeline:
    """Live bytes per schedule step (`live_bytes[t]`), the buffers behind them, the
    instruction that runs at each step, and the step with the most live bytes."""

    buffers: tuple[TimelineBuffer, ...]
    live_bytes: np.ndarray
    steps: tuple[str, ...]
    peak_time: int

    @property
    def peak_bytes(self) -> int:
        return int(self.live_bytes[self.peak_time]) if len(self.live_bytes) else 0


@dataclass(frozen=True, slots=True)
class PeakBuffer:
    """One buffer live at the peak and the value holding it then (`start`, `end`: that
    value's live range)."""

    rank: int
    size: int
    kind: str
    allocation: int
    value: HloValue
    start: int
    end: int

    @property
    def instruction(self) -> HloInstruction:
        return self.value.instruction

    @property
    def opcode(self) -> str:
        return opcode_text(self.value.instruction)

    @property
    def op_name(self) -> str:
        return self.value.instruction.op_name or ""


def opcode_text(instr: HloInstruction) -> str:
    """The opcode, with a fusion's kind and a custom call's target: `fusion(kLoop)`."""
    if instr.opcode is Opcode.FUSION and instr.fusion_kind is not None:
        return f"fusion({instr.fusion_kind})"
    if instr.opcode is Opcode.CUSTOM_CALL and instr.custom_call_target:
        return f"custom-call({instr.custom_call_target})"
    return instr.opcode.text


def _buffer_range(a: BufferAssignment, buffer: HloBuffer) -> tuple[int, int]:
    ranges = [a.liveness.live_range(v) for v in buffer.values]
    return min(s for s, _ in ranges), max(e for _, e in ranges)


def _label(buffer: HloBuffer) -> str:
    defining = [v for v in buffer.values if v.is_write] or list(buffer.values)
    return defining[0].name


def timeline(a: BufferAssignment) -> Timeline:
    """The memory timeline of `a` (see the module comment)."""
    end_time = a.liveness.end_time
    items: list[TimelineBuffer] = []
    for alloc in a.allocations:
        if alloc.is_entry_parameter:
            assert alloc.parameter_number is not None  # set on every parameter allocation
            param = a.entry.parameter(alloc.parameter_number)
            index = alloc.parameter_index or ()
            label = f"{param.name}{index_text(index)}" if index else param.name
            buffer = alloc.buffers[0][0] if alloc.buffers else None
            items.append(
                TimelineBuffer(label, "parameter", alloc.size, 0, end_time, alloc.index, buffer)
            )
        elif alloc.kind == "output":
            # the live-out buffer first; temporaries that reuse its bytes earlier follow it
            buffer = alloc.buffers[0][0]
            start = min(_buffer_range(a, b)[0] for b, _ in alloc.buffers)
            items.append(
                TimelineBuffer(
                    _label(buffer), "output", alloc.size, start, end_time, alloc.index, buffer
                )
            )
        elif alloc.is_temp:
            ending: dict[tuple[int, int], list[HloBuffer]] = {}
            for buffer, offset in alloc.buffers:
                ending.setdefault((offset, _buffer_range(a, buffer)[1]), []).append(buffer)
            for buffer, offset in alloc.buffers:
                start, end = _buffer_range(a, buffer)
                if any(b is not buffer for b in ending.get((offset, start), ())):
                    start += 1  # computed in the bytes of a buffer that dies at `start`
                items.append(
                    TimelineBuffer(
                        _label(buffer), "temp", buffer.size, start, end, alloc.index, buffer
                    )
                )
    live = np.zeros(end_time + 1, dtype=np.int64)
    for item in items:
        live[item.start : item.end + 1] += item.size
    steps = [""] * (end_time + 1)
    for time, instr, kind in a.liveness.order:
        steps[time] = instr.name if kind == "end" else f"{instr.name} (start)"
    peak = int(np.argmax(live)) if len(live) else 0
    return Timeline(tuple(items), live, tuple(steps), peak)


def _holder(a: BufferAssignment, buffer: HloBuffer, time: int) -> HloValue:
    live = [v for v in buffer.values if _covers(a.liveness.live_range(v), time)]
    candidates = live or list(buffer.values)
    writes = [v for v in candidates if v.is_write] or candidates
    return max(writes, key=lambda v: (v.shape.byte_size, -v.id))


def _covers(span: tuple[int, int], time: int) -> bool:
    return span[0] <= time <= span[1]


def peak_buffers(
    a: BufferAssignment, top: int = 10, tl: Timeline | None = None
) -> list[PeakBuffer]:
    """The `top` largest buffers live at the timeline's peak, largest first."""
    tl = tl or timeline(a)
    live = [b for b in tl.buffers if b.live_at(tl.peak_time) and b.buffer is not None]
    live.sort(key=lambda b: (-b.size, b.start, b.label))
    peaks = []
    for rank, b in enumerate(live[:top], 1):
        assert b.buffer is not None  # filtered above
        value = _holder(a, b.buffer, tl.peak_time)
        start, end = a.liveness.live_range(value)
        peaks.append(PeakBuffer(rank, b.size, b.kind, b.allocation, value, start, end))
    return peaks


# -- text -------------------------------------------------------------------------------------
def human_bytes(n: int) -> str:
    """`1536` -> `1.50KiB`; sizes under 1 KiB stay in bytes (`48B`)."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{n}B" if unit == "B" else f"{value:.2f}{unit}"
        value /= 1024
    raise AssertionError("unreachable")


def allocation_listing(a: BufferAssignment) -> str:
    """Every allocation with its flags and the values in it (offset, size, live range)."""
    lines = []
    for alloc in a.allocations:
        lines.append(f"allocation {alloc.index}: size {alloc.size}, {', '.join(alloc.flags())}:")
        entries = [(offset, v) for buffer, offset in alloc.buffers for v in buffer.values]
        entries.sort(key=lambda e: (e[0], a.liveness.live_range(e[1]), e[1].id))
        for offset, v in entries:
            start, end = a.liveness.live_range(v)
            lines.append(
                f"  value: <{v.id} {v.name}> (size={v.shape.byte_size},offset={offset}): "
                f"{v.shape}, live [{start}, {end}]"
            )
    return "\n".join(lines)


def _stats_rows(a: BufferAssignment) -> list[tuple[str, int, str]]:
    def total(pred) -> tuple[int, int]:
        chosen = [x for x in a.allocations if pred(x)]
        return sum(x.size for x in chosen), len(chosen)

    rows = []
    for name, pred in (
        ("parameter allocation", lambda x: x.is_entry_parameter),
        ("constant allocation", lambda x: x.is_constant),
        ("maybe-live-out allocation", lambda x: x.maybe_live_out),
        ("temp allocation", lambda x: x.is_temp),
        ("thread-local allocation", lambda x: x.is_thread_local),
    ):
        size, count = total(pred)
        rows.append((name, size, f"{count} allocation{'s' if count != 1 else ''}"))
    frag = a.temp_bytes - a.lower_bound_bytes
    share = f"{100 * frag / a.temp_bytes:.1f}% of temp" if a.temp_bytes else "no temps"
    algorithms = ", ".join(r.algorithm for _, r in sorted(a.heap_results.items())) or "-"
    rows.append(("temp fragmentation", frag, f"{share}; heap: {algorithms}"))
    size, count = total(lambda x: not x.is_thread_local)
    rows.append(("total allocation", size, f"{count} allocations, thread-local excluded"))
    return rows


def stats_text(a: BufferAssignment) -> str:
    """XLA's BufferAssignment stats, then the memory_analysis() figures."""
    lines = ["BufferAssignment stats:"]
    for name, size, note in _stats_rows(a):
        lines.append(f"  {name + ':':<28}{size:>14}  ({human_bytes(size)}; {note})")
    s = a.memory_analysis()
    lines.append("memory_analysis:")
    for name in ("argument", "output", "alias", "temp", "constant"):
        value = getattr(s, f"{name}_bytes")
        lines.append(f"  {name + ' bytes:':<28}{value:>14}  ({human_bytes(value)})")
    lines.append(
        f"  {'peak bytes:':<28}{s.peak_bytes:>14}  ({human_bytes(s.peak_bytes)} = argument "
        f"+ output - alias + temp)"
    )
    lines.append(
        f"  {'temp lower bound:':<28}{s.lower_bound_bytes:>14}  "
        f"({human_bytes(s.lower_bound_bytes)}; no fragmentation, same schedule)"
    )
    return "\n".join(lines)


def peak_text(a: BufferAssignment, top: int = 10, tl: Timeline | None = None) -> str:
    """The peak of the timeline and the largest buffers live there."""
    tl = tl or timeline(a)
    lines = [
        f"Peak buffers: {human_bytes(tl.peak_bytes)} ({tl.peak_bytes} bytes) live at step "
        f"{tl.peak_time} of {len(tl.live_bytes)} ({tl.steps[tl.peak_time] if tl.steps else '-'})"
    ]
    by_kind: dict[str, int] = {}
    for b in tl.buffers:
        if b.live_at(tl.peak_time):
            by_kind[b.kind] = by_kind.get(b.kind, 0) + b.size
    lines.append(
        "  " + ", ".join(f"{kind}: {human_bytes(n)}" for kind, n in sorted(by_kind.items()))
    )
    header = f"  {'#':>3} {'size':>10} {'kind':<9} {'opcode':<22} {'shape':<28} value / op_name"
    lines.append(header)
    for p in peak_buffers(a, top, tl):
        shape = p.value.shape.to_text(with_layout=False)
        lines.append(
            f"  {p.rank:>3} {human_bytes(p.size):>10} {p.kind:<9} {p.opcode:<22} {shape:<28} "
            f"{p.value.name} [{p.start}, {p.end}]"
            + (f"  op_name={p.op_name!r}" if p.op_name else "")
        )
    return "\n".join(lines)


def format_report(a: BufferAssignment, top: int = 10, scheduler: str | None = None) -> str:
    """The whole text report: header, allocation listing, stats, peak buffers."""
    tl = timeline(a)
    header = (
        f"Memory report for {a.module.name} (scheduler: {scheduler or a.scheduler}, "
        f"{len(a.allocations)} allocations, {len(a.dataflow.values)} values, "
        f"{len(tl.live_bytes)} steps)"
    )
    replicas, partitions = _device_counts(a)
    if replicas * partitions > 1:
        peak = a.memory_analysis().peak_bytes
        header += (
            f"\nRuns on {replicas * partitions} devices ({replicas} replicas x {partitions} "
            f"partitions), each holding its own copy of these buffers: the figures below are "
            f"per device; all devices together peak at {human_bytes(peak * replicas * partitions)}"
        )
    return "\n\n".join(
        [header, "Allocations:\n" + allocation_listing(a), stats_text(a), peak_text(a, top, tl)]
    )


# -- CSV and JSON -----------------------------------------------------------------------------
def value_rows(a: BufferAssignment) -> list[dict[str, object]]:
    """One row per value (CSV_COLUMNS): where it lives, for how long, who reads it."""
    rows = []
    for info in a.value_infos():
        v = info.value
        alloc = a.allocations[info.slice.allocation]
        uses = [u.instruction.name for u in info.uses]
        rows.append(
            {
                "value_id": v.id,
                "value": v.name,
                "computation": v.instruction.parent.name if v.instruction.parent else "",
                "opcode": opcode_text(v.instruction),
                "shape": v.shape.to_text(with_layout=False),
                "allocation": alloc.index,
                "allocation_kind": alloc.kind,
                "offset": info.slice.offset,
                "size": info.size,
                "start": info.start,
                "end": info.end,
                "num_uses": len(uses),
                "uses": ";".join(uses),
                "op_name": v.instruction.op_name or "",
            }
        )
    return rows


def write_csv(a: BufferAssignment, out: io.TextIOBase | None = None) -> str:
    """The value rows as CSV with a header line; written to `out` if given, and returned."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(value_rows(a))
    text = buffer.getvalue()
    if out is not None:
        out.write(text)
    return text


def _device_counts(a: BufferAssignment) -> tuple[int, int]:
    config = a.module.config
    return max(config.replica_count, 1), max(config.num_partitions, 1)


def memory_figures(a: BufferAssignment, scheduler: str | None = None) -> dict[str, object]:
    """The figures as one JSON-ready dict (memory_analysis() and a few more). Byte figures
    are per device; `devices` and `peak_bytes_all_devices` cover a multi-device program."""
    s = a.memory_analysis()
    tl = timeline(a)
    replicas, partitions = _device_counts(a)
    return {
        "devices": replicas * partitions,
        "peak_bytes_all_devices": s.peak_bytes * replicas * partitions,
        "module": a.module.name,
        "scheduler": scheduler or a.scheduler,
        "heap_algorithm": ",".join(r.algorithm for _, r in sorted(a.heap_results.items())),
        "argument_bytes": s.argument_bytes,
        "output_bytes": s.output_bytes,
        "alias_bytes": s.alias_bytes,
        "temp_bytes": s.temp_bytes,
        "constant_bytes": s.constant_bytes,
        "generated_code_bytes": s.generated_code_bytes,
        "peak_bytes": s.peak_bytes,
        "lower_bound_bytes": s.lower_bound_bytes,
        "fragmentation_bytes": s.temp_bytes - s.lower_bound_bytes,
        "timeline_peak_bytes": tl.peak_bytes,
        "timeline_peak_step": tl.peak_time,
        "steps": len(tl.live_bytes),
        "allocations": len(a.allocations),
        "values": len(a.dataflow.values),
        "in_place_updates": len(a.in_place),
    }


def figures_json(a: BufferAssignment, scheduler: str | None = None) -> str:
    return json.dumps(memory_figures(a, scheduler), sort_keys=False)


# -- plot -------------------------------------------------------------------------------------
def _layers(tl: Timeline, count: int) -> tuple[list[TimelineBuffer], list[TimelineBuffer]]:
    """The `count` largest buffers (those live at the peak first), and the rest."""
    ranked = sorted(
        tl.buffers, key=lambda b: (not b.live_at(tl.peak_time), -b.size, b.start, b.label)
    )
    shown = [b for b in ranked[:count] if b.size > 0]
    shown.sort(key=lambda b: (b.start, -b.size))
    rest = [b for b in tl.buffers if b not in shown]
    return shown, rest


def _series(buffers: Iterable[TimelineBuffer], steps: int) -> np.ndarray:
    out = np.zeros(steps, dtype=np.int64)
    for b in buffers:
        out[b.start : b.end + 1] += b.size
    return out


def plot_timeline(
    a: BufferAssignment, path: str | Path, layers: int = 8, title: str | None = None
) -> Path:
    """Draw live bytes over the schedule to `path` (PNG): the `layers` largest buffers
    stacked, the others summed on top, the peak marked, the assigned peak (fragmentation
    included) as a dotted line."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    tl = timeline(a)
    steps = len(tl.live_bytes)
    shown, rest = _layers(tl, layers)
    scale, unit = _unit(max(int(tl.live_bytes.max(initial=0)), a.peak_bytes))
    xs = np.arange(steps + 1)
    fig = Figure(figsize=(11, 5.5), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    palette = [f"C{i}" for i in (0, 1, 2, 3, 4, 5, 6, 8, 9)]  # C7 is the grey of "other"
    base = np.zeros(steps, dtype=np.int64)
    for i, b in enumerate(shown):
        top = base + _series([b], steps)
        label = f"{b.label} ({b.kind}, {human_bytes(b.size)})"
        ax.fill_between(
            xs, _edge(base) / scale, _edge(top) / scale, step="post",
            color=palette[i % len(palette)], alpha=0.85, label=label, linewidth=0,
        )  # fmt: skip
        base = top
    if rest:
        top = base + _series(rest, steps)
        ax.fill_between(
            xs, _edge(base) / scale, _edge(top) / scale, step="post",
            color="0.75", alpha=0.9, label=f"{len(rest)} other buffers", linewidth=0,
        )  # fmt: skip
    ax.step(xs, _edge(tl.live_bytes) / scale, where="post", color="black", linewidth=1)
    peak_x = tl.peak_time + 0.5
    top = max(a.peak_bytes, tl.peak_bytes, 1) / scale
    ax.set_xlim(0, steps)
    ax.set_ylim(0, top * 1.3)  # headroom above the curve holds the labels
    ax.axvline(peak_x, color="crimson", linestyle="--", linewidth=1)
    # The peak label sits in the headroom on the side of the peak line with more room, on a
    # white box, so it crosses neither the curve nor the assigned-peak line.
    left_half = peak_x < steps / 2
    ax.annotate(
        f"peak {human_bytes(tl.peak_bytes)}\nstep {tl.peak_time}: {tl.steps[tl.peak_time]}",
        xy=(peak_x, top * 1.27),
        xytext=(6 if left_half else -6, 0),
        textcoords="offset points",
        color="crimson",
        fontsize=9,
        va="top",
        ha="left" if left_half else "right",
        bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.9, "pad": 1.5},
    )
    ax.axhline(a.peak_bytes / scale, color="0.3", linestyle=":", linewidth=1)
    ax.text(
        steps if left_half else 0,
        a.peak_bytes / scale,
        f" assigned peak {human_bytes(a.peak_bytes)} (argument + output - alias + temp) ",
        va="bottom",
        ha="right" if left_half else "left",
        fontsize=8,
        color="0.3",
    )
    ax.set_xlabel("schedule step")
    ax.set_ylabel(f"live {unit}")
    ax.set_title(title or f"{a.module.name}: live memory over the schedule")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, format="png")
    return path


def _edge(series: np.ndarray) -> np.ndarray:
    """`series` with its last value repeated, for step="post" drawing over steps + 1 edges."""
    return np.append(series, series[-1:] if len(series) else [0])


def _unit(peak: int) -> tuple[float, str]:
    for scale, unit in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if peak >= 4 * scale:
            return float(scale), unit
    return 1.0, "bytes"
