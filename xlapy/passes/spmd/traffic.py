"""Bytes moved by collectives, per device, counted from a partitioned module's HLO text.

Read from text so that xlapy's partitioned modules and XLA's (`compile().as_text()`, whose
`replica_groups=mesh[...]` form the parser does not read yet) are counted by the same rule.
Per device, for an operation over groups of g devices, with the bandwidth-optimal
algorithms' figures (what each device must receive):

  all-reduce            2 (g-1)/g x the operand bytes   (reduce-scatter + all-gather)
  all-gather            (g-1)/g x the result bytes
  reduce-scatter        (g-1)/g x the operand bytes     (= (g-1) x the result bytes)
  all-to-all            (g-1)/g x the operand bytes
  collective-permute    the operand bytes
  collective-broadcast  the operand bytes

The *-start forms count like their synchronous forms; *-done forms count nothing.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

_BYTES = {
    "pred": 1,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
    "c64": 8,
    "c128": 16,
    "f8e4m3fn": 1,
    "f8e5m2": 1,
}
_OPS = (
    "all-reduce",
    "all-gather",
    "reduce-scatter",
    "all-to-all",
    "collective-permute",
    "collective-broadcast",
)
_LINE = re.compile(
    r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(?P<shape>.*?)\s+(?P<op>"
    + "|".join(re.escape(o) for o in _OPS)
    + r")(?P<start>-start)?\((?P<rest>.*)$"
)
_ARRAY = re.compile(r"\b(" + "|".join(_BYTES) + r")\[([\d,]*)\]")


@dataclass
class Traffic:
    """Per-device bytes received by collectives: the total, and by kind of collective."""

    total: float = 0.0
    by_op: dict[str, float] = field(default_factory=dict)
    count: dict[str, int] = field(default_factory=dict)

    def text(self) -> str:
        parts = [f"{op} x{self.count[op]}: {self.by_op[op]:.0f} B" for op in sorted(self.by_op)]
        return f"{self.total:.0f} B per device ({'; '.join(parts) or 'no collectives'})"


def _array_bytes(text: str) -> list[int]:
    out = []
    for dtype, dims in _ARRAY.findall(text):
        n = math.prod(int(d) for d in dims.split(",") if d) if dims else 1
        out.append(n * _BYTES[dtype])
    return out


def _group_size(rest: str, num_devices: int) -> int:
    m = re.search(r"replica_groups=\{(\{[\d,]*\})", rest)
    if m:
        return max(1, len([x for x in m.group(1).strip("{}").split(",") if x]))
    m = re.search(r"replica_groups=\[([\d,]+)\]<=", rest)
    if m:
        return int(m.group(1).split(",")[-1])
    m = re.search(r"replica_groups=mesh\[([^\]]*)\][^{]*\{([^}]*)\}", rest)
    if m:
        sizes = dict(
            (a.strip().strip("'"), int(s)) for a, s in (x.split("=") for x in m.group(1).split(","))
        )
        return math.prod(sizes[a.strip().strip("'")] for a in m.group(2).split(","))
    return num_devices


def collective_traffic(text: str, num_devices: int) -> Traffic:
    """Per-device bytes moved by the collectives of a module's text (see the rules above);
    `num_devices` is the group size of collectives with empty replica groups."""
    traffic = Traffic()
    for line in text.splitlines():
        m = _LINE.match(line)
        if m is None:
            continue
        op = m.group("op")
        g = _group_size(m.group("rest"), num_devices)
        sizes = _array_bytes(m.group("shape"))
        if m.group("start") and len(sizes) >= 2 and op != "all-reduce":
            sizes = sizes[len(sizes) // 2 :]  # (operands, results): count the results
        size = float(sum(sizes))
        if op == "all-reduce":
            moved = 2 * (g - 1) / g * size
        elif op == "all-gather":
            moved = (g - 1) / g * size
        elif op == "reduce-scatter":
            moved = (g - 1) * size
        elif op == "all-to-all":
            moved = (g - 1) / g * size
        else:
            moved = size
        traffic.total += moved
        traffic.by_op[op] = traffic.by_op.get(op, 0.0) + moved
        traffic.count[op] = traffic.count.get(op, 0) + 1
    return traffic
