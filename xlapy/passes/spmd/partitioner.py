"""The SPMD partitioner: one annotated global program -> the program each device runs.

GSPMD's design, kept small. The input is a module whose values may carry `sharding=`
annotations (JAX's in/out shardings, with_sharding_constraint, shard_map's manual regions);
the output is the per-device program of `num_partitions` devices: every array has its local
shape, and collectives move data where the global program needed it.

Sharding propagation and partitioning happen in one forward walk over the entry (calls are
inlined first). Every value's tiling (xlapy.passes.spmd.tiling) is known when its users are
reached: parameters take their annotation (none: replicated), constants and iotas are
replicated (any tiling of them is a free local slice). Before the walk, values made from
replicated ones alone (iotas, constants, and the elementwise ops, broadcasts and loops on
them: a random-bits counter) are wanted in the tiling of the sharded value they meet in an
elementwise op, so each device makes only its own piece (XLA's backward propagation).
An op with a dimension-label rule (xlapy.passes.spmd.labels) chooses a tiling of its
iteration space among candidates:

  * each operand's tiling, read through the operand's labels;
  * the tiling its result is wanted in (its own annotation, or that of the Sharding
    custom call / annotated root consuming it);
  * every pairwise merge of those (x sharded by rows on one mesh axis and w by columns
    on the other merge into a dot tiled both ways);
  * replicated.

Cost rule (the conflict rule): a candidate costs the bytes each device receives to bring
its operands into the candidate's tiling (all-gathers; slicing a held value is free), plus
the all-reduce of a partial result when it cuts contracted labels (2(g-1)/g of the local
result; half that when a reduce-scatter leaves it in its wanted tiling), plus the
all-gathers to bring the result into its wanted tiling, plus the work: the bytes of result
each device computes (so a dot of sharded operands is not replicated to save a small
all-reduce, which XLA's propagation would not do either). The cheapest wins; ties go to the
candidate that cuts the iteration space into more pieces (less work per device), then to
the earlier candidate (operand 0 first). A user annotation is a
constraint: the annotated value is resharded to it whatever it costs; a constraint's open
dimensions (`unspecified_dims`, Shardy's `{?}`) keep the value's own cuts.

Resharding a value from tiling A to B: all-gather every dimension A cuts differently from B,
then dynamic-slice what B cuts, at offsets read from a table by partition-id (XLA's way
from replicated to sharded). A dimension A cuts on dim i and B on dim j alone, the same
devices, becomes one all-to-all.

Control flow: a while loop's state keeps its initial tiling (body and condition are
partitioned with their parameter so tiled, the body's result resharded back to it); each
branch of a conditional is partitioned with its operand's tiling and its result resharded
to the first branch's.

Ops without a rule (custom calls, rng, fft, linear algebra, ...) fall back: their operands
are replicated (all-gathered) and the op runs whole on every device. That is always
correct; `PartitionReport.fallbacks` lists each one with the reason. Manual values (inside
shard_map: SPMDFullToShardShape / xla.sdy.GlobalToLocalShape to the matching
ShardToFull / LocalToGlobalShape) keep their ops as written; only the conversions at the
region's edges map shapes. A region over part of the mesh holds its piece along the manual
axes and is replicated over the others.

Partial sums (JAX's `P(unreduced={...})`, HLO's `last_tile_dims={unreduced}`): a value may
be held as pieces that add up to it across device groups (`Local.partial`), as a dot
whose contracted dimension is cut leaves it before its all-reduce. An unreduced
annotation keeps it so (the all-reduce is not emitted), linear ops (add, subtract,
negate, copy) of alike partial values stay partial, and any other use reduces it first:
an all-reduce over the groups, or a reduce-scatter where the use wants it tiled. A whole
value annotated unreduced becomes partial for free: each device keeps the part of its
piece it holds (zeros elsewhere), or one device per group keeps the value and the others
zeros.
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from xlapy.errors import XlapyError
from xlapy.ir import attributes as A
from xlapy.ir.computation import HloComputation
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.literal import Literal
from xlapy.ir.module import HloModule
from xlapy.ir.names import NameUniquer
from xlapy.ir.opcodes import Opcode
from xlapy.ir.shapes import ProgramShape, Shape
from xlapy.ir.sharding import HloSharding
from xlapy.ir.types import PRED
from xlapy.passes.hlo_edit import has_side_effect_deep, remove_unreachable_computations
from xlapy.passes.inline import CallInliner
from xlapy.passes.pass_base import HloPass, register_pass
from xlapy.passes.spmd.combine import combine_all_reduces
from xlapy.passes.spmd.labels import GATHER_AND_REDUCE, MASKED_GATHER, OpLabels, op_labels
from xlapy.passes.spmd.tiling import Tiling, merge


class PartitionError(XlapyError):
    """The module cannot be partitioned as annotated (the message says what to change)."""


@dataclass
class Fallback:
    name: str
    opcode: str
    reason: str


@dataclass
class PartitionReport:
    """What the partitioner did: ops partitioned natively (by opcode), the ops that fell
    back to running whole on every device, and the collectives it added."""

    num_partitions: int = 1
    native: dict[str, int] = field(default_factory=dict)
    fallbacks: list[Fallback] = field(default_factory=list)
    collectives: dict[str, int] = field(default_factory=dict)
    uneven: list[str] = field(default_factory=list)

    def text(self) -> str:
        lines = [f"spmd-partitioner: {self.num_partitions} partitions"]
        if self.native:
            lines.append(
                "  partitioned: " + ", ".join(f"{k} x{v}" for k, v in sorted(self.native.items()))
            )
        if self.collectives:
            lines.append(
                "  collectives added: "
                + ", ".join(f"{k} x{v}" for k, v in sorted(self.collectives.items()))
            )
        if not self.fallbacks:
            lines.append("  no op fell back to replication")
        for f in self.fallbacks:
            lines.append(f"  replicated: {f.name} ({f.opcode}): {f.reason}")
        for u in self.uneven:
            lines.append(f"  uneven annotation: {u}")
        return "\n".join(lines)


@dataclass
class Local:
    """A global value's per-device form: the instruction computing it, its tiling (a tuple
    of them for a tuple value; None for tokens), how deep it is in shard_map regions
    (`manual`: 0 outside, 1 in a region, 2 in a region nested in another), and whether it
    is a partial sum: `partial` holds the device groups whose pieces add up to
    the value (the devices of a group hold the same piece under `tiling`), None when each
    device holds its piece whole; a tuple of those for a tuple value."""

    instr: HloInstruction
    tiling: Any  # Tiling | tuple[<tiling>, ...] | None
    manual: int = 0
    partial: Any = None  # Groups | tuple[<partial>, ...] | None


Groups = tuple[tuple[int, ...], ...]

# Ops that keep partial sums partial: linear in each operand, operands summed alike.
_LINEAR = (Opcode.ADD, Opcode.SUBTRACT, Opcode.NEGATE, Opcode.COPY, Opcode.TRANSPOSE)
# Linear ops that keep them partial when each device holds the whole array's partial sum.
_LINEAR_WHOLE = (Opcode.RESHAPE, Opcode.BROADCAST, Opcode.SLICE)


_FREE_OPS = {
    Opcode.CONSTANT,
    Opcode.IOTA,
    Opcode.BROADCAST,
    Opcode.TUPLE,
    Opcode.GET_TUPLE_ELEMENT,
    Opcode.WHILE,
    Opcode.RESHAPE,
    Opcode.SLICE,
    *(op for op in Opcode if op.is_elementwise),
}
"""Ops whose results, from operands computed without any parameter, are free to make in
any tiling (see `_Partitioner._pull_to_free_values`)."""

_PASS_THROUGH_TARGETS = (
    "xla.sdy.FuncResultSharding",
    "xla.sdy.ShardingConstraint",
    "xla.sdy.ShardingGroup",
)
_GROUP_TARGET = "xla.sdy.ShardingGroup"
"""A value of a sharding group (jax.experimental.shard_alike, `xla.sdy.sharding_group_id`
frontend attribute): every member of a group gets the same tiling."""
_PER_PIECE_TARGETS = ("xlapy_partitioned_host_callback",)
"""Custom calls that run on each device's own pieces of their operands and return no
arrays (JAX's `jax.debug.callback(..., partitioned=True)`)."""


@register_pass
class SpmdPartitioner(HloPass):
    """Partition the entry for `num_partitions` devices (the module's num_partitions when
    None); sets num_partitions in the config. `report` holds the last run's report."""

    name = "spmd-partitioner"

    def __init__(self, num_partitions: int | None = None):
        self.num_partitions = num_partitions
        self.report = PartitionReport()

    def run(self, module: HloModule) -> bool:
        n = self.num_partitions or max(module.config.num_partitions, module.config.spmd_partitions)
        if n < 1:
            raise PartitionError(f"cannot partition for {n} devices")
        CallInliner().run(module)
        _read_shardy_annotations(module)
        self.report = PartitionReport(num_partitions=n)
        _Partitioner(module, n, self.report).run()
        remove_unreachable_computations(module)
        _strip_annotations(module)
        folded = combine_all_reduces(module.entry_computation(), NameUniquer(module))
        if folded:
            self.report.collectives["all-reduce combined"] = folded
        return True


def _read_shardy_annotations(module: HloModule) -> None:
    """Give every entry instruction that has only Shardy's `xla.sdy.sharding` frontend
    attribute the equivalent `sharding=` (JAX prints both today; this reads modules with
    Shardy's alone)."""
    meshes = _sdy_mesh(module)
    if not meshes or module.entry is None:
        return
    for instr in module.entry.instructions:
        if instr.sharding is not None:
            continue
        fa = instr.frontend_attributes
        text = fa.get("xla.sdy.sharding") if fa is not None else None
        if text is None:
            continue
        leaves = [x for _, x in instr.shape.leaves()]
        found = _sdy_shardings(str(text), meshes, [x.rank for x in leaves])
        if any(x is None for x in found):
            continue
        if instr.shape.is_tuple:
            instr.attrs["sharding"] = HloSharding("tuple", elements=tuple(found))
        else:
            instr.attrs["sharding"] = found[0]


def _strip_annotations(module: HloModule) -> None:
    """Drop the Sharding custom calls left in computations the partitioner keeps as they
    are (reducers, manual region bodies): annotations, not computation."""
    for comp in module.computations:
        for instr in list(comp.instructions):
            if (
                instr.opcode is Opcode.CUSTOM_CALL
                and instr.custom_call_target in ("Sharding", *_PASS_THROUGH_TARGETS)
                and len(instr.operands) == 1
                and instr.operands[0].shape == instr.shape
            ):
                comp.replace_all_uses(instr, instr.operands[0])
                comp.remove_instruction(instr)


_MANUAL_ENTRIES = ("SPMDFullToShardShape", "xla.sdy.GlobalToLocalShape")


def needs_partitioning(module: HloModule, num_partitions: int) -> bool:
    """Whether `module` is a global program to partition for `num_partitions` devices: it
    is not partitioned yet (its header has no num_partitions) and either says it is global
    (ModuleConfig.spmd_partitions: a sharded StableHLO program) or its entry shards some
    value or opens a shard_map region."""
    if num_partitions <= 1 or module.config.num_partitions > 1 or module.entry is None:
        return False
    if module.config.spmd_partitions > 1:
        return True
    for instr in module.entry.instructions:
        s = instr.sharding
        if isinstance(s, HloSharding) and any(
            e.kind == "tiled" and not e.is_replicated for e in (s.elements or (s,))
        ):
            return True
        if instr.custom_call_target in _MANUAL_ENTRIES:
            return True
        fa = instr.frontend_attributes
        sdy = fa.get("xla.sdy.sharding") if fa is not None else None
        if sdy is not None and re.search(r'\{[^}]*"\w+', str(sdy)):
            return True
    return False


def partition(module: HloModule, num_partitions: int | None = None) -> PartitionReport:
    """Partition `module` in place; returns the report."""
    p = SpmdPartitioner(num_partitions)
    p.run(module)
    return p.report


class _Partitioner:
    def __init__(
        self,
        module: HloModule,
        n: int,
        report: PartitionReport,
        comp: HloComputation | None = None,
        parent: _Partitioner | None = None,
        param_tilings: list | None = None,
        param_partials: list | None = None,
    ):
        self.module = module
        self.n = n
        self.report = report
        self.entry = comp or module.entry_computation()  # the computation partitioned
        self.param_tilings = param_tilings
        self.param_partials = param_partials
        if parent is None:
            self.namer = NameUniquer(module)
            first = 1 + max((i.channel_id or 0 for i in module.instructions()), default=0)
            self._channel = [first]
            self._adders: dict[str, HloComputation] = {}
            self.mesh_axes = _sdy_mesh(module)
        else:
            self.namer = parent.namer
            self._channel = parent._channel
            self._adders = parent._adders
            self.mesh_axes = parent.mesh_axes
        self.out: list[HloInstruction] = []
        self.params: list[HloInstruction] = []
        self.values: dict[int, Local] = {}
        self._pid: HloInstruction | None = None
        self._offsets: dict[tuple[int, ...], HloInstruction] = {}
        self._zero: HloInstruction | None = None
        self._resharded: dict[tuple[int, Tiling], HloInstruction] = {}
        self._sums: dict[tuple[int, Any], Local] = {}
        self.wanted_partial: dict[int, Groups] = {}
        self.wanted = self._wanted_tilings()
        self.group_tiling: dict[str, Tiling] = {}
        self._natural: Any = None  # the last `sub`'s result tiling before its reshard

    # -- driver ----------------------------------------------------------------------------
    def run(self) -> None:
        """Partition the entry: parameters as annotated, the result as annotated (else as
        chosen); the new entry replaces the old one."""
        entry = self.entry
        for instr in entry.post_order():
            self.values[id(instr)] = self.visit(instr)
        root = entry.root_instruction()
        result = self.finish_root(root)
        comp = self._computation(entry.name + "_spmd", result.instr)
        module = self.module
        module.computations = [c for c in module.computations if c is not entry]
        module.add_computation(comp, entry=True)
        cfg = module.config
        cfg.num_partitions = self.n
        if cfg.frontend_attributes is not None:  # partitioned now: no longer asks to be
            items = tuple(i for i in cfg.frontend_attributes.items if i[0] != "mhlo.num_partitions")
            cfg.frontend_attributes = A.FrontendAttributes(items) if items else None
        if cfg.entry_computation_layout is not None:
            cfg.entry_computation_layout = ProgramShape(
                tuple(p.shape for p in comp.parameters), comp.root_instruction().shape
            )
        cfg.input_output_alias = tuple(
            e
            for e in cfg.input_output_alias
            if comp.root_instruction().shape.subshape(e.output_index).dims
            == comp.parameter(e.param_number).shape.subshape(e.param_index).dims
        )

    def sub(
        self,
        comp: HloComputation,
        param_tilings: list,
        want_root=None,
        param_partials: list | None = None,
        want_partial=None,
    ):
        """Partition a called computation (a loop body, a branch) whose parameters have
        `param_tilings` (and partial-sum states `param_partials`); its result is resharded
        to `want_root` (in state `want_partial`) when given, else its partial sums are
        added up. Returns the new computation and its result's tiling."""
        child = _Partitioner(
            self.module, self.n, self.report, comp, self, param_tilings, param_partials
        )
        for instr in comp.post_order():
            child.values[id(instr)] = child.visit(instr)
        root = comp.root_instruction()
        value = child.values[id(root)]
        if value.manual:
            raise PartitionError(f"{root.name}: a manual value leaves {comp.name}")
        self._natural = value.tiling if value.partial is None else None
        if want_root is not None:
            value = child.to_state(value, want_root, want_partial, root.shape)
        elif value.partial is not None:
            value = child.reduced(value, root.shape)
        new = child._computation(comp.name + "_spmd", value.instr)
        self.module.add_computation(new)
        return new, value.tiling

    def _computation(self, name: str, root: HloInstruction) -> HloComputation:
        comp = HloComputation(self.namer.fresh(name))
        for instr in self.out:
            comp.add_instruction(instr)
        comp.root = root
        self._drop_dead(comp)
        return comp

    def _drop_dead(self, comp: HloComputation) -> None:
        live: set[int] = set()
        stack = [comp.root_instruction(), *comp.parameters]
        memo: dict[int, bool] = {}
        stack += [i for i in comp.instructions if has_side_effect_deep(i, memo)]
        while stack:
            i = stack.pop()
            if id(i) in live:
                continue
            live.add(id(i))
            stack.extend(i.operands)
            stack.extend(i.control_predecessors)
        for instr in reversed(list(comp.instructions)):  # users before what they read
            if id(instr) not in live:
                comp.remove_instruction(instr)

    # -- emitting --------------------------------------------------------------------------
    def emit(self, opcode, shape, operands=(), attrs=None, base=None, **kw) -> HloInstruction:
        instr = HloInstruction(
            self.namer.fresh(base or opcode.text), opcode, shape, operands, attrs, **kw
        )
        instr.parent = None
        self.out.append(instr)
        return instr

    def count(self, kind: str) -> None:
        self.report.collectives[kind] = self.report.collectives.get(kind, 0) + 1

    def next_channel(self) -> int:
        self._channel[0] += 1
        return self._channel[0] - 1

    def partition_id(self) -> HloInstruction:
        if self._pid is None:
            self._pid = self.emit(Opcode.PARTITION_ID, Shape.scalar("u32"))
        return self._pid

    def zero(self) -> HloInstruction:
        if self._zero is None:
            self._zero = self.constant(np.zeros((), np.int32))
        return self._zero

    def constant(self, array: np.ndarray) -> HloInstruction:
        lit = Literal.from_array(array)
        return self.emit(Opcode.CONSTANT, lit.shape, literal=lit)

    def offset(self, offsets: list[int]) -> HloInstruction:
        """This device's entry of `offsets` (one per partition), as an s32 scalar."""
        key = tuple(offsets)
        if len(set(key)) == 1:
            return self.zero() if key[0] == 0 else self.constant(np.array(key[0], np.int32))
        if key not in self._offsets:
            table = self.constant(np.array(key, np.int32))
            one = self.emit(
                Opcode.DYNAMIC_SLICE,
                Shape.array("s32", (1,)),
                [table, self.partition_id()],
                {"dynamic_slice_sizes": (1,)},
            )
            self._offsets[key] = self.emit(Opcode.RESHAPE, Shape.array("s32", ()), [one])
        return self._offsets[key]

    def adder(self, element_type) -> HloComputation:
        key = element_type.text if hasattr(element_type, "text") else str(element_type)
        if key not in self._adders:
            scalar = Shape.scalar(element_type)
            a = HloInstruction(self.namer.fresh("x"), Opcode.PARAMETER, scalar, parameter_number=0)
            b = HloInstruction(self.namer.fresh("y"), Opcode.PARAMETER, scalar, parameter_number=1)
            s = HloInstruction(self.namer.fresh("add"), Opcode.ADD, scalar, [a, b])
            comp = HloComputation(self.namer.fresh(f"spmd_add_{key}"), [a, b, s], s)
            self.module.add_computation(comp)
            self._adders[key] = comp
        return self._adders[key]

    # -- resharding ------------------------------------------------------------------------
    def reshard(self, value: HloInstruction, src: Tiling, dst: Tiling, dims) -> HloInstruction:
        """`value`, a local piece under `src` of an array of global `dims`, as its piece
        under `dst` (made once per value and tiling)."""
        if src == dst:
            return value
        key = (id(value), dst)
        if key not in self._resharded:
            self._resharded[key] = self._reshard(value, src, dst, dims)
        return self._resharded[key]

    def _reshard(self, value: HloInstruction, src: Tiling, dst: Tiling, dims) -> HloInstruction:
        gather = [i for i in range(src.rank) if src.tiles[i] > 1 and not src.same_axis(dst, i)]
        a2a = self._all_to_all_move(src, dst, gather)
        if a2a is not None:
            (i, j) = a2a
            return self.all_to_all(value, src, i, j)
        cur = src
        for i in gather:
            value = self.all_gather(value, cur, i, dims)
            cur = cur.with_axes_whole([i])
        cut = [i for i in range(dst.rank) if dst.tiles[i] > 1 and cur.tiles[i] == 1]
        if not cut:
            return value
        starts = [
            self.offset(dst.offsets(i, dims[i])) if i in cut else self.zero()
            for i in range(dst.rank)
        ]
        local = [dims[i] // dst.tiles[i] if i in cut else s for i, s in enumerate(value.shape.dims)]
        return self.emit(
            Opcode.DYNAMIC_SLICE,
            _resized(value.shape, tuple(local)),
            [value, *starts],
            {"dynamic_slice_sizes": tuple(local)},
        )

    def _all_to_all_move(self, src: Tiling, dst: Tiling, gather: list[int]):
        """(i, j) when going from src to dst moves one cut from dimension i to j alone,
        over the same device groups: one all-to-all does it."""
        if len(gather) != 1:
            return None
        i = gather[0]
        if dst.tiles[i] != 1:
            return None
        moved = [j for j in range(dst.rank) if j != i and dst.tiles[j] > 1 and src.tiles[j] == 1]
        if len(moved) != 1 or dst.tiles[moved[0]] != src.tiles[i]:
            return None
        j = moved[0]
        for k in range(dst.rank):
            if k not in (i, j) and not src.same_axis(dst, k):
                return None
        # the device holding piece c along i must hold piece c along j
        if any(a[i] != b[j] for a, b in zip(src.coords, dst.coords, strict=True)):
            return None
        return i, j

    def all_to_all(self, value, src: Tiling, i: int, j: int) -> HloInstruction:
        """Move the cut of dimension i to dimension j: XLA's array all-to-all splits and
        concatenates along one dimension, so j is reshaped into [g, j/g], exchanged along
        the new dimension, which then folds into i."""
        groups = src.groups([i])
        g = src.tiles[i]
        local = list(value.shape.dims)
        local[i] *= g
        local[j] //= g
        dims = list(value.shape.dims)
        split = [*dims[:j], g, dims[j] // g, *dims[j + 1 :]]
        v = self.emit(Opcode.RESHAPE, _resized(value.shape, tuple(split)).without_layout(), [value])
        v = self.emit(
            Opcode.ALL_TO_ALL,
            v.shape,
            [v],
            {
                "channel_id": self.next_channel(),
                "replica_groups": A.ReplicaGroups(groups=tuple(tuple(x) for x in groups)),
                "dimensions": (j,),
                # no use_global_device_ids: XLA's all-to-all has no such attribute (its
                # parser refuses it, and JAX then cannot read the compiled program); with a
                # channel_id its groups are partition ids, the same ids in one replica
            },
        )
        # now axis j of `split` indexes the source device: move it next to i and merge
        order = list(range(len(split)))
        order.remove(j)
        ii = i if i < j else i + 1  # position of dimension i in `split`
        pos = order.index(ii)
        order.insert(pos, j)
        t_dims = tuple(split[k] for k in order)
        v = self.emit(
            Opcode.TRANSPOSE,
            _resized(v.shape, t_dims).without_layout(),
            [v],
            {"dimensions": tuple(order)},
        )
        self.count("all-to-all")
        return self.emit(Opcode.RESHAPE, _resized(value.shape, tuple(local)), [v])

    def all_gather(self, value, cur: Tiling, i: int, dims) -> HloInstruction:
        groups = cur.groups([i])
        local = list(value.shape.dims)
        local[i] *= cur.tiles[i]
        self.count("all-gather")
        return self.emit(
            Opcode.ALL_GATHER,
            _resized(value.shape, tuple(local)),
            [value],
            {
                "channel_id": self.next_channel(),
                "replica_groups": A.ReplicaGroups(groups=tuple(tuple(x) for x in groups)),
                "dimensions": (i,),
                "use_global_device_ids": True,
            },
        )

    def all_reduce(self, value, groups, reducer: HloComputation) -> HloInstruction:
        self.count("all-reduce")
        return self.emit(
            Opcode.ALL_REDUCE,
            value.shape,
            [value],
            {
                "channel_id": self.next_channel(),
                "replica_groups": A.ReplicaGroups(groups=tuple(tuple(x) for x in groups)),
                "use_global_device_ids": True,
                "to_apply": reducer,
            },
        )

    def as_tiling(self, value: Local, dst, shape: Shape) -> HloInstruction:
        """`value` resharded to `dst` (a Tiling, or a tuple of them for a tuple), its
        partial sums added up."""
        if value.manual:
            raise PartitionError(f"{value.instr.name}: a manual value used outside its region")
        if value.partial is not None:
            value = self.reduced(value, shape, dst)
        if isinstance(dst, Tiling):
            return self.reshard(value.instr, value.tiling, dst, shape.dims)
        if dst is None or value.tiling == dst:
            return value.instr
        parts = []
        for k, (src_t, dst_t) in enumerate(zip(value.tiling, dst, strict=True)):
            sub = shape.tuple_shapes[k]
            elem = self.emit(
                Opcode.GET_TUPLE_ELEMENT,
                _local_shape(sub, src_t),
                [value.instr],
                {"index": k},
            )
            parts.append(self.as_tiling(Local(elem, src_t), dst_t, sub))
        return self.emit(Opcode.TUPLE, Shape.tuple([p.shape for p in parts]), parts)

    # -- partial sums ----------------------------------------------------------------------
    def reduced(self, value: Local, shape: Shape, dst=None) -> Local:
        """`value` with its partial sums added up (itself when it has none): an all-reduce
        over the groups, or a reduce-scatter when `dst`, the tiling the caller moves it to
        next, is then a free slice."""
        if value.partial is None:
            return value
        key = (id(value.instr), dst if isinstance(dst, Tiling) else None)
        if key in self._sums:
            return self._sums[key]
        if shape.is_tuple:
            parts, tilings = [], []
            for k, sub in enumerate(shape.tuple_shapes):
                t = value.tiling[k]
                elem = self.emit(
                    Opcode.GET_TUPLE_ELEMENT, _local_shape(sub, t), [value.instr], {"index": k}
                )
                r = self.reduced(Local(elem, t, partial=value.partial[k]), sub)
                parts.append(r.instr)
                tilings.append(r.tiling)
            new = self.emit(Opcode.TUPLE, Shape.tuple([p.shape for p in parts]), parts)
            result = Local(new, tuple(tilings))
        else:
            groups = [list(g) for g in value.partial]
            reducer = self.adder(shape.element_type)
            found = None
            if isinstance(dst, Tiling) and not dst.is_replicated:
                found = self._scatter_target(value.tiling, groups, dst, value.instr.shape)
            if found is not None:
                j, tiling = found
                result = Local(self.reduce_scatter(value.instr, groups, reducer, j), tiling)
            else:
                result = Local(self.all_reduce(value.instr, groups, reducer), value.tiling)
        self._sums[key] = result
        return result

    def to_partial(self, value: Local, dst: Tiling, groups: Groups, shape: Shape) -> Local:
        """`value` as partial sums over `groups`, each device's piece under `dst`. A value
        held whole becomes one for free: when the members of each group hold distinct
        parts of the group's piece (a value cut along the summed axes), each pads its part
        with zeros; otherwise the first member of each group keeps the piece and the
        others hold zeros."""
        if value.manual:
            raise PartitionError(f"{value.instr.name}: a manual value used outside its region")
        if value.partial is not None:
            if value.tiling == dst and _same_groups(value.partial, groups):
                return value
            value = self.reduced(value, shape)
        local = _local_shape(shape, dst)
        zero = self.emit(Opcode.CONVERT, Shape.scalar(shape.element_type), [self.zero()])
        zeros = self.emit(Opcode.BROADCAST, local, [zero], {"dimensions": ()})
        src = value.tiling
        if _splits_groups(src, dst, groups):
            starts = [
                self.offset(
                    [
                        o - p
                        for o, p in zip(
                            src.offsets(i, shape.dims[i]),
                            dst.offsets(i, shape.dims[i]),
                            strict=True,
                        )
                    ]
                )
                for i in range(shape.rank)
            ]
            new = self.emit(
                Opcode.DYNAMIC_UPDATE_SLICE, local, [zeros, value.instr, *starts], base="unreduce"
            )
            return Local(new, dst, partial=groups)
        piece = self.as_tiling(value, dst, shape)
        first = {g[0] for g in groups}
        flag = self.offset([int(d in first) for d in range(self.n)])
        one = self.constant(np.array(1, np.int32))
        keep = self.emit(Opcode.COMPARE, Shape.scalar(PRED), [flag, one], {"direction": "EQ"})
        keep = self.emit(
            Opcode.BROADCAST, local.with_element_type(PRED), [keep], {"dimensions": ()}
        )
        new = self.emit(Opcode.SELECT, local, [keep, piece, zeros], base="unreduce")
        return Local(new, dst, partial=groups)

    def to_state(self, value: Local, dst, partial, shape: Shape) -> Local:
        """`value` in the tiling `dst` and partial-sum state `partial` (per leaf for a
        tuple, as Local holds them)."""
        if not shape.is_tuple:
            if partial is not None:
                return self.to_partial(value, dst, partial, shape)
            if value.partial is None and value.tiling == dst:
                return value
            return Local(self.as_tiling(value, dst, shape), dst)
        if value.partial is None and partial is None:
            if value.tiling == dst:
                return value
            return Local(self.as_tiling(value, dst, shape), dst)
        have = value.partial or (None,) * len(shape.tuple_shapes)
        want = partial or (None,) * len(shape.tuple_shapes)
        parts = []
        for k, sub in enumerate(shape.tuple_shapes):
            t = value.tiling[k]
            elem = self.emit(
                Opcode.GET_TUPLE_ELEMENT, _local_shape(sub, t), [value.instr], {"index": k}
            )
            parts.append(self.to_state(Local(elem, t, partial=have[k]), dst[k], want[k], sub))
        new = self.emit(
            Opcode.TUPLE, Shape.tuple([p.instr.shape for p in parts]), [p.instr for p in parts]
        )
        states = tuple(p.partial for p in parts)
        return Local(
            new,
            tuple(p.tiling for p in parts),
            partial=states if any(x is not None for x in states) else None,
        )

    def partial_of(self, sharding: HloSharding, shape: Shape):
        """The partial-sum state an annotation asks for (per leaf for a tuple), or None."""
        if shape.is_tuple:
            elems = (
                sharding.elements if sharding.is_tuple else (sharding,) * len(shape.tuple_shapes)
            )
            states = tuple(
                self.partial_of(e, s) for e, s in zip(elems, shape.tuple_shapes, strict=True)
            )
            return states if any(x is not None for x in states) else None
        if not sharding.is_unreduced or not shape.is_array:
            return None
        groups = sharding.unreduced_groups()
        if sorted(d for g in groups for d in g) != list(range(self.n)):
            raise PartitionError(f"sharding {sharding.text()} does not cover {self.n} devices")
        return tuple(tuple(g) for g in groups)

    def linear(self, instr: HloInstruction, operands: list[Local]) -> Local | None:
        """An add, subtract, negate or copy of partial sums alike (same groups and
        tiling): done on each device's piece, the result is the same kind of partial sum."""
        first = operands[0]
        if not isinstance(first.tiling, Tiling) or first.partial is None:
            return None
        for v in operands[1:]:
            if v.tiling != first.tiling or v.partial is None:
                return None
            if not _same_groups(v.partial, first.partial):
                return None
        tiling = first.tiling
        if instr.opcode is Opcode.TRANSPOSE:
            tiling = tiling.project(instr.dimensions)
        elif instr.opcode in _LINEAR_WHOLE:
            if not tiling.is_replicated:
                return None
            tiling = Tiling.replicated(instr.shape.rank, self.n)
        shape = _local_shape(instr.shape, tiling, instr.name)
        new = self.clone(instr, [v.instr for v in operands], shape)
        return Local(new, tiling, partial=first.partial)

    def replicated_of(self, shape: Shape):
        if shape.is_tuple:
            return tuple(self.replicated_of(s) for s in shape.tuple_shapes)
        if shape.is_array:
            return Tiling.replicated(shape.rank, self.n)
        return None

    # -- annotations -----------------------------------------------------------------------
    def tiling_of(self, sharding: HloSharding, shape: Shape):
        if shape.is_tuple:
            elems = (
                sharding.elements if sharding.is_tuple else (sharding,) * len(shape.tuple_shapes)
            )
            return tuple(
                self.tiling_of(e, s) for e, s in zip(elems, shape.tuple_shapes, strict=True)
            )
        if not shape.is_array:
            return None
        try:
            t = Tiling.from_sharding(sharding, shape.rank, self.n)
        except ValueError as e:
            raise PartitionError(str(e)) from None
        return t

    def _wanted_tilings(self) -> dict[int, Tiling]:
        """Where a value's result is wanted: its own annotation, or that of a Sharding
        custom call or annotated root using it."""
        wanted: dict[int, Tiling] = {}
        for instr in self.entry.instructions:
            s = instr.sharding
            if not isinstance(s, HloSharding) or s.is_manual or not instr.shape.is_array:
                continue
            if s.kind == "tuple" or _unspecified_dims(instr):
                continue
            try:
                t = Tiling.from_sharding(s, instr.shape.rank, self.n)
            except ValueError:
                continue
            if not t.divides(instr.shape.dims):
                continue
            wanted[id(instr)] = t
            groups = s.unreduced_groups()
            if groups:
                self.wanted_partial[id(instr)] = tuple(tuple(g) for g in groups)
            target = instr
            while (
                target.opcode in (Opcode.CUSTOM_CALL, Opcode.GET_TUPLE_ELEMENT)
                or target.opcode is Opcode.TUPLE
            ) and target.operands:
                src = target.operands[0]
                if len(src.users) != 1 or src.opcode is Opcode.PARAMETER:
                    break
                wanted.setdefault(id(src), t)
                if groups:
                    self.wanted_partial.setdefault(id(src), tuple(tuple(g) for g in groups))
                if src.opcode is not Opcode.CUSTOM_CALL:
                    break
                target = src
        for edge in self.entry.instructions:  # a shard_map region's operands: in-shardings
            kind = edge.custom_call_target
            shapes = [o.shape for o in edge.operands]
            if kind == "xla.sdy.GlobalToLocalShape":
                found = self._manual_shardings(edge, "xla.sdy.in_shardings", shapes) or []
            elif kind == "SPMDFullToShardShape" and edge.operands:
                # GSPMD's form: the operand is a Sharding custom call saying how
                cc = edge.operands[0]
                if cc.custom_call_target != "Sharding" or len(cc.users) != 1:
                    continue
                edge, found = cc, [cc.sharding]
            else:
                continue
            for o, s in zip(edge.operands, found, strict=False):
                if o.opcode is Opcode.PARAMETER or not isinstance(s, HloSharding):
                    continue
                if s.is_manual or s.is_unreduced or s.subgroups or not o.shape.is_array:
                    continue
                try:
                    t = self.tiling_of(s, o.shape)
                except PartitionError:
                    continue
                if isinstance(t, Tiling) and t.divides(o.shape.dims):
                    wanted.setdefault(id(o), t)
        self._pull_to_free_values(wanted)
        return wanted

    def _pull_to_free_values(self, wanted: dict[int, Tiling]) -> None:
        """Values computed from replicated ones alone (iotas, constants, replicated
        parameters, and what elementwise ops, broadcasts and loops make of them: JAX's
        random bits) are wanted in the tiling of the sharded values they meet in an
        elementwise op: each device then computes only its own piece, a pure map (XLA's
        propagation runs backwards through them the same way), instead of computing the
        whole array and slicing it."""
        order = self.entry.post_order()
        free: set[int] = set()
        held: dict[int, Any] = {}  # the tilings known before the walk, not replicated
        for instr in order:
            key, op = id(instr), instr.opcode
            if op is Opcode.PARAMETER:
                t = self._param_guess(instr)
                if t is None:
                    continue
                if isinstance(t, Tiling) and t.is_replicated:
                    free.add(key)
                else:
                    held[key] = t
            elif op is Opcode.GET_TUPLE_ELEMENT and isinstance(
                held.get(id(instr.operands[0])), tuple
            ):
                t = held[id(instr.operands[0])][instr.tuple_index]
                if isinstance(t, Tiling):
                    if t.is_replicated:
                        free.add(key)
                    else:
                        held[key] = t
            elif op in _FREE_OPS and all(id(o) in free for o in instr.operands):
                if not has_side_effect_deep(instr):
                    free.add(key)
            elif op.is_elementwise and instr.shape.is_array:
                for o in instr.operands:
                    if isinstance(held.get(id(o)), Tiling) and o.shape.dims == instr.shape.dims:
                        held[key] = held[id(o)]
                        break
        for instr in order:  # the meeting points
            t = held.get(id(instr))
            if not isinstance(t, Tiling) or not instr.opcode.is_elementwise:
                continue
            for o in instr.operands:
                if id(o) in free and o.shape.dims == instr.shape.dims:
                    wanted.setdefault(id(o), t)
        tuples: dict[int, dict[int, Tiling]] = {}
        for instr in order:  # the meeting points
            t = held.get(id(instr))
            if t is None or id(instr) in free:
                continue
            for o in instr.operands:
                if id(o) in free and o.shape.dims == instr.shape.dims:
                    wanted.setdefault(id(o), t)
        for instr in reversed(order):  # users before producers
            key = id(instr)
            if key not in free:
                continue
            if key in tuples and instr.opcode in (Opcode.TUPLE, Opcode.WHILE):
                parts = tuples[key]
                if instr.opcode is Opcode.TUPLE:
                    for k, t in parts.items():
                        wanted.setdefault(id(instr.operands[k]), t)
                else:
                    tuples.setdefault(id(instr.operands[0]), {}).update(parts)
                continue
            t = wanted.get(key)
            if t is None or not instr.shape.is_array:
                continue
            if instr.opcode is Opcode.GET_TUPLE_ELEMENT:
                src = instr.operands[0]
                tuples.setdefault(id(src), {}).setdefault(instr.tuple_index, t)
            elif instr.opcode is Opcode.BROADCAST:
                (o,) = instr.operands
                if o.shape.rank:
                    wanted.setdefault(id(o), t.project(list(instr.dimensions)))
            elif instr.opcode.is_elementwise:
                for o in instr.operands:
                    if o.shape.dims == instr.shape.dims:
                        wanted.setdefault(id(o), t)

    # -- visiting --------------------------------------------------------------------------
    def visit(self, instr: HloInstruction) -> Local:
        op = instr.opcode
        if op is Opcode.PARAMETER:
            return self.parameter(instr)
        operands = [self.values[id(o)] for o in instr.operands]
        if op is Opcode.CUSTOM_CALL:
            special = self.custom_call(instr, operands)
            if special is not None:
                return self.constrain(instr, special)
        if op is Opcode.TUPLE and not any(v.manual for v in operands):
            new = self.emit(
                Opcode.TUPLE,
                Shape.tuple([v.instr.shape for v in operands]),
                [v.instr for v in operands],
            )
            states = tuple(v.partial for v in operands)
            partial = states if any(x is not None for x in states) else None
            return Local(new, tuple(v.tiling for v in operands), partial=partial)
        if op is Opcode.GET_TUPLE_ELEMENT and not operands[0].manual:
            src = operands[0]
            k = instr.tuple_index
            new = self.emit(
                op, src.instr.shape.tuple_shapes[k], [src.instr], dict(instr.attrs), base=instr.name
            )
            part = src.partial[k] if src.partial is not None else None
            return self.constrain(instr, Local(new, src.tiling[k], partial=part))
        if op is Opcode.WHILE and not operands[0].manual:
            return self.constrain(instr, self.while_loop(instr, operands))
        if any(v.partial is not None for v in operands):
            if op in (*_LINEAR, *_LINEAR_WHOLE) and not any(v.manual for v in operands):
                kept = self.linear(instr, operands)
                if kept is not None:
                    return self.constrain(instr, kept)
            operands = [
                self.reduced(v, o.shape) if not v.manual else v
                for v, o in zip(operands, instr.operands, strict=True)
            ]
        if any(v.manual for v in operands):
            return self.manual_op(instr, operands)
        if op is Opcode.WHILE:
            return self.constrain(instr, self.while_loop(instr, operands))
        if op is Opcode.CONDITIONAL:
            return self.constrain(instr, self.conditional(instr, operands))
        held = self.wanted.get(id(instr))
        if op is Opcode.IOTA and held is not None and held.divides(instr.shape.dims):
            return self.constrain(instr, self.local_iota(instr, held))
        if op in (Opcode.CONSTANT, Opcode.IOTA, Opcode.PARTITION_ID, Opcode.REPLICA_ID):
            new = self.clone(instr, [], instr.shape)
            return self.constrain(instr, Local(new, self.replicated_of(instr.shape)))
        labels = op_labels(instr)
        multi = (Opcode.SORT, Opcode.TOPK, Opcode.REDUCE, Opcode.REDUCE_WINDOW, Opcode.CUSTOM_CALL)
        if labels is not None and (instr.shape.is_array or op in multi):
            return self.constrain(instr, self.labelled(instr, operands, labels))
        return self.constrain(instr, self.fallback(instr, operands, self._why(instr)))

    def _param_guess(self, instr: HloInstruction):
        """A parameter's tiling as the walk will hold it (a tuple of them for a tuple),
        None when it is manual or a partial sum."""
        assert instr.parameter_number is not None
        if self.param_tilings is not None:
            partials = self.param_partials
            if partials and partials[instr.parameter_number] is not None:
                return None
            return self.param_tilings[instr.parameter_number]
        s = instr.sharding
        if not isinstance(s, HloSharding):
            return self.replicated_of(instr.shape)
        if s.is_manual or s.is_unreduced:
            return None
        return self.tiling_of(s, instr.shape)

    def local_iota(self, instr: HloInstruction, tiling: Tiling) -> Local:
        """An iota made in `tiling`: each device counts its own piece (a local iota plus
        the piece's start along the iota dimension), nothing made whole."""
        shape = _local_shape(instr.shape, tiling, instr.name)
        local = self.clone(instr, [], shape)
        d = instr.iota_dimension
        if tiling.tiles[d] == 1:
            return Local(local, tiling)
        start = self.offset(tiling.offsets(d, instr.shape.dims[d]))
        scalar = Shape.array(instr.shape.element_type, ())
        start = self.emit(Opcode.CONVERT, scalar, [start])
        starts = self.emit(Opcode.BROADCAST, shape, [start], {"dimensions": ()})
        return Local(self.emit(Opcode.ADD, shape, [local, starts]), tiling)

    def while_loop(self, instr: HloInstruction, operands: list[Local]) -> Local:
        """The loop state keeps its initial tiling and partial sums: the body is
        partitioned with its parameter so held and its result resharded back to it; the
        condition likewise (a gradient accumulated unreduced over a scan is summed once,
        after the loop)."""
        (state,) = operands
        tiling, partial = state.tiling, state.partial
        if self._free_state_tilings(instr, state, state.tiling) is not None:
            # a probe: the body partitioned with no tiling wanted of its result, to see
            # how it makes the loop state's free elements (its computation is dropped)
            saved = copy.deepcopy(self.report)
            self.sub(instr.while_body, [tiling], None, [partial], None)
            self.report.native, self.report.fallbacks = saved.native, saved.fallbacks
            self.report.collectives, self.report.uneven = saved.collectives, saved.uneven
            better = self._free_state_tilings(instr, state, self._natural)
            if better is not None:
                state = Local(self.as_tiling(state, better, instr.operand(0).shape), better)
                tiling = better
        body, _ = self.sub(instr.while_body, [tiling], tiling, [partial], partial)
        cond, _ = self.sub(instr.while_condition, [tiling], None, [partial])
        attrs = dict(instr.attrs, body=body, condition=cond)
        new = self.clone(instr, [state.instr], state.instr.shape, attrs)
        self.report.native["while"] = self.report.native.get("while", 0) + 1
        return Local(new, tiling, partial=partial)

    def _free_state_tilings(self, instr: HloInstruction, state: Local, natural) -> tuple | None:
        """The loop state's tilings with each replicated element whose initial value is
        free to make in any tiling (an iota, a constant: computed from no parameter) and
        that the body returns cut (its natural tiling, before the reshard back) taken as
        the body makes it: LU's permutation, an iota updated from the batch-cut pivots,
        then stays cut by batch instead of being all-gathered every iteration. None when
        no element changes. (`natural` the state's own tiling: whether any element is a
        candidate at all.)"""
        init = instr.operand(0)
        if (
            state.partial is not None
            or not isinstance(state.tiling, tuple)
            or not isinstance(natural, tuple)
            or init.opcode is not Opcode.TUPLE
        ):
            return None
        tilings = list(state.tiling)
        changed = False
        for k, (held, made) in enumerate(zip(state.tiling, natural, strict=True)):
            shape = init.shape.tuple_shapes[k]
            if (
                isinstance(held, Tiling)
                and held.is_replicated
                and isinstance(made, Tiling)
                and (made is held or not made.is_replicated)
                and shape.is_array
                and made.divides(shape.dims)
                and _computed_from_no_parameter(init.operand(k))
            ):
                tilings[k] = made
                changed = True  # (made is held: a candidate, when asked with the state's own)
        return tuple(tilings) if changed else None

    def conditional(self, instr: HloInstruction, operands: list[Local]) -> Local:
        """Each branch is partitioned with its operand's tiling; every branch's result is
        resharded to the first branch's."""
        pred = self.as_tiling(
            operands[0], self.replicated_of(instr.operand(0).shape), instr.operand(0).shape
        )
        branches = list(instr.branches)
        new_branches = []
        result = None
        for comp, value in zip(branches, operands[1:], strict=True):
            new, tiling = self.sub(comp, [value.tiling], want_root=result)
            result = tiling if result is None else result
            new_branches.append(new)
        attrs = dict(instr.attrs)
        if "branch_computations" in attrs:
            attrs["branch_computations"] = tuple(new_branches)
        else:
            attrs["true_computation"], attrs["false_computation"] = new_branches
        shape = _local_shape(instr.shape, result, instr.name)
        new = self.clone(instr, [pred, *(v.instr for v in operands[1:])], shape, attrs)
        self.report.native["conditional"] = self.report.native.get("conditional", 0) + 1
        return Local(new, result)

    def _why(self, instr: HloInstruction) -> str:
        if instr.opcode is Opcode.CUSTOM_CALL:
            return f"custom call {instr.custom_call_target!r} has no partitioning rule"
        if instr.opcode.is_control_flow:
            return "control flow runs whole on every device"
        return "no partitioning rule for this opcode"

    def constrain(self, instr: HloInstruction, value: Local) -> Local:
        """A user annotation is a constraint: reshard the value to it."""
        s = instr.sharding
        if not isinstance(s, HloSharding) or value.manual or instr.opcode is Opcode.PARAMETER:
            return value
        if s.is_manual or not instr.shape.is_array or s.is_tuple:
            return value
        dst = self.even(self.tiling_of(s, instr.shape), instr.shape, instr.name)
        free = _unspecified_dims(instr)
        if free and value.partial is None and isinstance(value.tiling, Tiling):
            dst = _open_constraint(dst, value.tiling, free)
        return self.to_state(value, dst, self.partial_of(s, instr.shape), instr.shape)

    def even(self, tiling, shape: Shape, name: str):
        """`tiling` with every dimension it cannot cut evenly left whole (an annotation
        asking for uneven pieces is followed where it can be), noted in the report."""
        if isinstance(tiling, tuple):
            return tuple(
                self.even(t, s, name) for t, s in zip(tiling, shape.tuple_shapes, strict=True)
            )
        if not isinstance(tiling, Tiling) or tiling.divides(shape.dims):
            return tiling
        bad = [i for i, (d, t) in enumerate(zip(shape.dims, tiling.tiles)) if d % t]
        self.report.uneven.append(f"{name}: {shape} kept whole along dimensions {bad}")
        return tiling.with_axes_whole(bad)

    def clone(self, instr: HloInstruction, operands, shape: Shape, attrs=None) -> HloInstruction:
        return self.emit(
            instr.opcode,
            shape,
            operands,
            {
                k: v
                for k, v in (attrs if attrs is not None else instr.attrs).items()
                if k != "sharding"
            },
            base=instr.name,
            literal=instr.literal,
        )

    def parameter(self, instr: HloInstruction) -> Local:
        if self.param_tilings is not None:
            assert instr.parameter_number is not None
            tiling = self.param_tilings[instr.parameter_number]
            new = self.emit(
                Opcode.PARAMETER,
                _local_shape(instr.shape, tiling, instr.name),
                attrs={k: v for k, v in instr.attrs.items() if k != "sharding"},
                base=instr.name,
                parameter_number=instr.parameter_number,
            )
            partials = self.param_partials
            return Local(
                new, tiling, partial=partials[instr.parameter_number] if partials else None
            )
        s = instr.sharding
        tiling = (
            self.tiling_of(s, instr.shape)
            if isinstance(s, HloSharding)
            else self.replicated_of(instr.shape)
        )
        partial = None
        if isinstance(s, HloSharding) and s.is_manual:
            tiling = self.replicated_of(instr.shape)
        elif isinstance(s, HloSharding):
            partial = self.partial_of(s, instr.shape)
        shape = _local_shape(instr.shape, tiling, instr.name)
        new = self.emit(
            Opcode.PARAMETER,
            shape,
            attrs=dict(instr.attrs),
            base=instr.name,
            parameter_number=instr.parameter_number,
        )
        new.name = instr.name
        self.params.append(new)
        return Local(new, tiling, partial=partial)

    def fallback(self, instr: HloInstruction, operands: list[Local], reason: str) -> Local:
        self.report.fallbacks.append(Fallback(instr.name, instr.opcode.text, reason))
        ops = [
            self.as_tiling(v, self.replicated_of(o.shape), o.shape)
            for v, o in zip(operands, instr.operands, strict=True)
        ]
        new = self.clone(instr, ops, instr.shape)
        return Local(new, self.replicated_of(instr.shape))

    def manual_op(self, instr: HloInstruction, operands: list[Local]) -> Local:
        ops = [
            v.instr if v.manual else self.as_tiling(v, self.replicated_of(o.shape), o.shape)
            for v, o in zip(operands, instr.operands, strict=True)
        ]
        depth = max(v.manual for v in operands)
        return Local(self.clone(instr, ops, instr.shape), None, manual=depth)

    # -- custom calls: annotations and manual regions --------------------------------------
    def custom_call(self, instr: HloInstruction, operands: list[Local]) -> Local | None:
        target = instr.custom_call_target
        s = instr.sharding
        if target == "Sharding" and len(operands) == 1:
            v = operands[0]
            if v.manual or (isinstance(s, HloSharding) and s.is_manual):
                return v
            return v  # `constrain` reshards to the annotation
        if target == _GROUP_TARGET and len(operands) == 1:
            return self.group_member(instr, operands[0])
        if target in _PASS_THROUGH_TARGETS and len(operands) == 1:
            return operands[0]
        if target in ("SPMDFullToShardShape", "xla.sdy.GlobalToLocalShape"):
            return self.to_manual(instr, operands)
        if target in ("SPMDShardToFullShape", "xla.sdy.LocalToGlobalShape"):
            return self.from_manual(instr, operands)
        if target in _PER_PIECE_TARGETS and not any(v.manual for v in operands):
            ops = [
                (self.reduced(v, o.shape) if v.partial is not None else v).instr
                for v, o in zip(operands, instr.operands, strict=True)
            ]
            if any(leaf.is_array for _, leaf in instr.shape.leaves()):
                raise PartitionError(f"{instr.name}: a per-piece custom call returns arrays")
            return Local(self.clone(instr, ops, instr.shape), self.replicated_of(instr.shape))
        if isinstance(s, HloSharding) and s.kind == "maximal" and self.n > 1:
            return self.on_one_device(instr, operands, s.device)
        return None

    def group_member(self, instr: HloInstruction, value: Local) -> Local:
        """A member of a sharding group in the group's tiling. The group's tiling is fixed
        when its first member is reached: the tiling that cuts into the most pieces among
        the members already computed (the first of them on a tie), so a free value (an
        iota) grouped with a sharded one follows the sharded one."""
        group = _group_id(instr)
        if value.manual or not isinstance(value.tiling, Tiling) or group is None:
            return value
        if value.partial is not None:
            value = self.reduced(value, instr.shape)
        tiling = self.group_tiling.get(group)
        if tiling is None:
            held = [
                v.tiling
                for member in self.entry.instructions
                if _group_id(member) == group
                and member.operands[0].shape.dims == instr.shape.dims
                and (v := self.values.get(id(member.operands[0]))) is not None
                and isinstance(v.tiling, Tiling)
                and not v.manual
            ]
            tiling = max(held, key=lambda t: math.prod(t.tiles), default=value.tiling)
            self.group_tiling[group] = tiling
        if tiling == value.tiling:
            return value
        return Local(self.as_tiling(value, tiling, instr.shape), tiling)

    def on_one_device(self, instr: HloInstruction, operands: list[Local], device: int) -> Local:
        """A custom call annotated `{maximal device=d}` (a host callback, which JAX pins to
        one device in a program with automatic sharding) runs on device d alone: inside a
        conditional on partition-id == d, the other devices producing zeros (tokens:
        after-all); an all-reduce then gives every device d's arrays (bitwise: the bits
        OR'ed with zeros), as XLA broadcasts a maximal value to its users."""
        ops = [
            self.as_tiling(v, self.replicated_of(o.shape), o.shape)
            for v, o in zip(operands, instr.operands, strict=True)
        ]
        args = Shape.tuple([o.shape for o in ops])
        packed = self.emit(Opcode.TUPLE, args, ops)
        namer = self.namer

        def branch(name: str, run: bool) -> HloComputation:
            param = HloInstruction(namer.fresh("args"), Opcode.PARAMETER, args, parameter_number=0)
            body = [param]
            if run:
                reads = [
                    HloInstruction(
                        namer.fresh("arg"), Opcode.GET_TUPLE_ELEMENT, o.shape, [param], {"index": i}
                    )
                    for i, o in enumerate(ops)
                ]
                attrs = {k: v for k, v in instr.attrs.items() if k != "sharding"}
                body += [
                    *reads,
                    HloInstruction(
                        namer.fresh(instr.name), instr.opcode, instr.shape, reads, attrs
                    ),
                ]
            else:
                _zeros_like(instr.shape, namer, body)
            comp = HloComputation(namer.fresh(name), body, body[-1])
            self.module.add_computation(comp)
            return comp

        pid = self.partition_id()
        here = self.emit(
            Opcode.COMPARE,
            Shape.scalar(PRED),
            [pid, self.constant(np.array(device, np.uint32))],
            {"direction": "EQ"},
        )
        cond = self.emit(
            Opcode.CONDITIONAL,
            instr.shape,
            [here, packed, packed],
            {
                "true_computation": branch(f"{instr.name}_on_device_{device}", True),
                "false_computation": branch(f"{instr.name}_elsewhere", False),
            },
            base=instr.name,
        )
        everyone = [list(range(self.n))]

        def broadcast(value: HloInstruction) -> HloInstruction:
            shape = value.shape
            if shape.is_tuple:
                parts = [
                    broadcast(self.emit(Opcode.GET_TUPLE_ELEMENT, s, [value], {"index": i}))
                    for i, s in enumerate(shape.tuple_shapes)
                ]
                return self.emit(Opcode.TUPLE, shape, parts)
            if not shape.is_array:
                return value
            element = shape.element_type
            if element.is_pred:
                return self.all_reduce(value, everyone, self.reducer(Opcode.OR, PRED))
            kind = _BITS.get(element.bits)
            if element.is_complex or kind is None:  # adding zeros: exact but for -0.0
                return self.all_reduce(value, everyone, self.adder(element))
            bits = Shape.array(kind, shape.dims)
            as_bits = self.emit(Opcode.BITCAST_CONVERT, bits, [value])
            ored = self.all_reduce(as_bits, everyone, self.reducer(Opcode.OR, bits.element_type))
            return self.emit(Opcode.BITCAST_CONVERT, shape, [ored])

        self.report.native["maximal"] = self.report.native.get("maximal", 0) + 1
        return Local(broadcast(cond), self.replicated_of(instr.shape))

    def reducer(self, opcode: Opcode, element_type) -> HloComputation:
        """A two-parameter scalar computation applying `opcode` (made once per type)."""
        key = f"{opcode.text}_{element_type.text}"
        if key not in self._adders:
            scalar = Shape.scalar(element_type)
            a = HloInstruction(self.namer.fresh("x"), Opcode.PARAMETER, scalar, parameter_number=0)
            b = HloInstruction(self.namer.fresh("y"), Opcode.PARAMETER, scalar, parameter_number=1)
            r = HloInstruction(self.namer.fresh(opcode.text), opcode, scalar, [a, b])
            comp = HloComputation(self.namer.fresh(f"spmd_{key}"), [a, b, r], r)
            self.module.add_computation(comp)
            self._adders[key] = comp
        return self._adders[key]

    def _manual_shardings(self, instr: HloInstruction, key: str, shapes: list[Shape]):
        """The per-value shardings of a Shardy region edge, restricted to its manual axes
        (the region's data is replicated over the others), or None for the GSPMD form."""
        if not (instr.custom_call_target or "").startswith("xla.sdy."):
            return None
        fa = instr.frontend_attributes
        text = fa.get(key) if fa is not None else None
        manual = fa.get("xla.sdy.manual_axes") if fa is not None else None
        if text is None:
            return None
        keep = set(re.findall(r'\\?"(\w+)\\?"', str(manual))) if manual is not None else None
        return _sdy_shardings(str(text), self.mesh_axes, [s.rank for s in shapes], keep)

    def to_manual(self, instr: HloInstruction, operands: list[Local]) -> Local:
        """Enter a shard_map region: each operand resharded to its in-sharding; the
        region works on the local pieces as they are. A region nested in another (over
        other mesh axes) enters from the outer region's data, which each device holds
        whole along the inner axes: it takes its piece, a free slice."""
        shapes = [o.shape for o in instr.operands]
        shardings = self._manual_shardings(instr, "xla.sdy.in_shardings", shapes)
        if shardings is None:  # GSPMD: the operand is a Sharding custom call saying how
            shardings = [o.sharding for o in instr.operands]
        locals_ = []
        depth = 1 + max((v.manual for v in operands), default=0)
        for v, o, s in zip(operands, instr.operands, shardings, strict=True):
            if isinstance(s, HloSharding) and (s.is_manual or (s.subgroups and not s.is_unreduced)):
                raise PartitionError(f"{instr.name}: cannot read the region's in-sharding {s}")
            if v.manual:
                if isinstance(s, HloSharding) and s.is_unreduced:
                    raise PartitionError(
                        f"{instr.name}: a nested region cannot enter with partial sums ({s})"
                    )
                whole = Local(v.instr, self.replicated_of(o.shape))
                dst = self.tiling_of(s, o.shape) if isinstance(s, HloSharding) else whole.tiling
                locals_.append(self.as_tiling(whole, dst, o.shape))
            elif isinstance(s, HloSharding):
                dst = self.tiling_of(s, o.shape)
                # an unreduced in-sharding: each device enters with its partial sum
                locals_.append(self.to_state(v, dst, self.partial_of(s, o.shape), o.shape).instr)
            else:
                locals_.append(self.as_tiling(v, self.replicated_of(o.shape), o.shape))
        want = list(instr.shape.tuple_shapes) if instr.shape.is_tuple else [instr.shape]
        for local, w in zip(locals_, want, strict=True):
            if local.shape.dims != w.dims:
                raise PartitionError(
                    f"{instr.name}: the manual shape {w} is not the local shape {local.shape} "
                    "of its operand's sharding"
                )
        self.report.native["shard_map region"] = self.report.native.get("shard_map region", 0) + 1
        if instr.shape.is_tuple:
            shape = Shape.tuple([x.shape for x in locals_])
            return Local(self.emit(Opcode.TUPLE, shape, locals_), None, manual=depth)
        return Local(locals_[0], None, manual=depth)

    def from_manual(self, instr: HloInstruction, operands: list[Local]) -> Local:
        """Leave a shard_map region: each device's local piece is its piece of the global
        result under the out-sharding. Leaving a nested region returns to the outer one,
        whose data each device holds whole along the inner axes: the pieces are gathered
        (and partial sums added up) among the devices of the same outer piece."""
        (v,) = operands
        shapes = list(instr.shape.tuple_shapes) if instr.shape.is_tuple else [instr.shape]
        shardings = self._manual_shardings(instr, "xla.sdy.out_shardings", shapes)
        if shardings is None:
            s = instr.sharding
            shardings = list(s.elements) if isinstance(s, HloSharding) and s.is_tuple else [s]
        tilings = [
            self.tiling_of(s, shape) if isinstance(s, HloSharding) else self.replicated_of(shape)
            for s, shape in zip(shardings, shapes, strict=True)
        ]
        tiling = tuple(tilings) if instr.shape.is_tuple else tilings[0]
        local = _local_shape(instr.shape, tiling, instr.name)
        if [x.dims for _, x in local.leaves()] != [x.dims for _, x in v.instr.shape.leaves()]:
            raise PartitionError(
                f"{instr.name}: the manual result {v.instr.shape} is not the local shape "
                f"of {instr.shape} under its sharding"
            )
        # an unreduced out-sharding: each device's result is its partial sum
        states = tuple(
            self.partial_of(s, shape) if isinstance(s, HloSharding) else None
            for s, shape in zip(shardings, shapes, strict=True)
        )
        if instr.shape.is_tuple:
            partial = states if any(x is not None for x in states) else None
        else:
            partial = states[0]
        if v.manual > 1:
            held = Local(v.instr, tiling, partial=partial)
            whole = self.as_tiling(held, self.replicated_of(instr.shape), instr.shape)
            return Local(whole, None, manual=v.manual - 1)
        return Local(v.instr, tiling, partial=partial)

    # -- ops with dimension labels ---------------------------------------------------------
    def labelled(self, instr: HloInstruction, operands: list[Local], L: OpLabels) -> Local:
        n_labels = L.num_labels
        cands: list[Tiling] = []
        for v, dims in zip(operands, L.operands, strict=True):
            if isinstance(v.tiling, Tiling) and not v.tiling.is_replicated:
                cands.append(_label_tiling(v.tiling, dims, n_labels))
        wanted = self.wanted.get(id(instr))
        if wanted is not None and len(L.results) == 1:
            cands.append(_label_tiling(wanted, L.results[0], n_labels))
        for t in list(cands):  # each also without its halo cuts (it may merge better)
            halos = [x for x in L.halos if t.tiles[x] > 1]
            if halos:
                cands.append(t.with_axes_whole(halos))
        base = list(cands)
        for a in range(len(base)):
            for b in range(len(base)):
                if a != b:
                    m = merge(base[a], base[b])
                    if m is not None:
                        cands.append(m)
                        for c in range(len(base)):
                            if c not in (a, b):
                                m2 = merge(m, base[c])
                                if m2 is not None:
                                    cands.append(m2)
        cands.append(Tiling.replicated(n_labels, self.n))
        cands = [self._halo_reach(L, c) for c in cands]
        best: tuple | None = None
        for order, cand in enumerate(cands):
            if not self._fits(instr, L, cand):
                continue
            cost = self._cost(instr, operands, L, cand, wanted)
            key = (cost, -math.prod(cand.tiles), order)
            if best is None or key < best[0]:
                best = (key, cand)
        assert best is not None
        chosen: Tiling = best[1]
        return self._emit_labelled(instr, operands, L, chosen)

    def _fits(self, instr: HloInstruction, L: OpLabels, cand: Tiling) -> bool:
        shapes = [o.shape for o in instr.operands]
        results = list(instr.shape.tuple_shapes) if instr.shape.is_tuple else [instr.shape]
        for dims, shape in [*zip(L.operands, shapes, strict=True), *zip(L.results, results)]:
            for label, size in zip(dims, shape.dims, strict=True):
                if label is not None and size % cand.tiles[label]:
                    return False
        for label in range(cand.rank):
            if cand.tiles[label] > 1 and label not in L.sizes:
                return False
        return True

    @staticmethod
    def _halo_reach(L: OpLabels, cand: Tiling) -> Tiling:
        """`cand` with the windowed labels whose halo would reach past the nearest
        neighbour's block (a window wider than a device's block: a cumulative sum) whole."""
        far = [
            x
            for x, (left, right) in L.halos.items()
            if cand.tiles[x] > 1 and max(left, right) > L.sizes[x] // cand.tiles[x]
        ]
        return cand.with_axes_whole(far) if far else cand

    def _cost(self, instr, operands, L: OpLabels, cand: Tiling, wanted) -> float:
        cost = 0.0
        for label, (left, right) in L.halos.items():  # the rows each device receives
            if cand.tiles[label] > 1:
                for dims, o in zip(L.operands, instr.operands, strict=True):
                    if label in dims:
                        local = o.shape.byte_size / math.prod(cand.project(dims).tiles)
                        cost += local * (left + right) / (L.sizes[label] // cand.tiles[label])
        for v, dims, o in zip(operands, L.operands, instr.operands, strict=True):
            if isinstance(v.tiling, Tiling):
                cost += _gather_bytes(v.tiling, cand.project(dims), o.shape)
        cut = [x for x in L.contracted if cand.tiles[x] > 1]
        out_shape = instr.shape.tuple_shapes[0] if instr.shape.is_tuple else instr.shape
        out_t = cand.project(L.results[0])
        if cut and L.reducer == GATHER_AND_REDUCE:  # (g-1) partials of each result
            g = math.prod(cand.tiles[x] for x in cut)
            for s in instr.shape.tuple_shapes:
                cost += (g - 1) * s.byte_size / math.prod(out_t.tiles)
        elif cut:
            g = math.prod(cand.tiles[x] for x in cut)
            local = out_shape.byte_size / math.prod(out_t.tiles)
            cost += 2 * (g - 1) / g * local
            if wanted is not None and not wanted.is_replicated:
                cost -= (g - 1) / g * local * _scatter_share(out_t, wanted)
        if wanted is not None:
            cost += _gather_bytes(out_t, wanted, out_shape)
        # the work: the bytes of result each device computes (a candidate that leaves
        # devices idle pays for it: replicating a dot of sharded operands is not free)
        results = instr.shape.tuple_shapes if instr.shape.is_tuple else (instr.shape,)
        for r, dims in zip(results, L.results, strict=False):
            cost += r.byte_size / math.prod(cand.project(dims).tiles)
        return cost

    def _emit_labelled(self, instr, operands: list[Local], L: OpLabels, cand: Tiling) -> Local:
        new_ops = []
        for v, dims, o in zip(operands, L.operands, instr.operands, strict=True):
            new_ops.append(self.as_tiling(v, cand.project(dims), o.shape))
        attrs_window = None
        cut_halos = {x: h for x, h in L.halos.items() if cand.tiles[x] > 1}
        if cut_halos:
            new_ops, attrs_window = self.exchange_halos(instr, new_ops, L, cand, cut_halos)
        results = list(instr.shape.tuple_shapes) if instr.shape.is_tuple else [instr.shape]
        out_tilings = [cand.project(d) for d in L.results]
        local_results = [
            _resized(s, t.local_dims(s.dims)) for s, t in zip(results, out_tilings, strict=True)
        ]
        shape = Shape.tuple(local_results) if instr.shape.is_tuple else local_results[0]
        attrs = _local_attrs(instr, new_ops, shape)
        if attrs_window is not None:
            attrs["window"] = attrs_window
        cut = [x for x in L.contracted if cand.tiles[x] > 1]
        if cut and L.reducer == MASKED_GATHER:
            new = self.masked_gather(instr, new_ops, L, cand, shape, attrs)
        else:
            new = self.clone(instr, new_ops, shape, attrs)
        key = instr.opcode.text
        self.report.native[key] = self.report.native.get(key, 0) + 1
        cut = [x for x in L.contracted if cand.tiles[x] > 1]
        if cut and L.reducer == GATHER_AND_REDUCE:
            groups = cand.groups(cut)
            cand_out = cand.with_axes_whole(cut)
            new = self.gather_and_reduce(instr, new, groups)
            out_tilings = [cand_out.project(d) for d in L.results]
        elif cut:
            reducer = (
                instr.to_apply if instr.opcode is Opcode.REDUCE else self.adder(shape.element_type)
            )
            groups = cand.groups(cut)
            cand_out = cand.with_axes_whole(cut)
            out_tilings = [cand_out.project(d) for d in L.results]
            scattered = None
            wanted = self.wanted.get(id(instr))
            keep = self.wanted_partial.get(id(instr))
            if (
                keep is not None
                and (instr.opcode is not Opcode.REDUCE or _is_sum(instr))
                and wanted == out_tilings[0]
                and _same_groups(keep, tuple(tuple(g) for g in groups))
            ):
                # wanted unreduced over the cut: leave the partial sums as they are
                return Local(new, out_tilings[0], partial=tuple(tuple(g) for g in groups))
            if wanted is not None and not instr.shape.is_tuple:
                scattered = self._scatter_target(out_tilings[0], groups, wanted, shape)
            if scattered is not None:
                j, tiling = scattered
                new = self.reduce_scatter(new, groups, reducer, j)
                out_tilings = [tiling]
            else:
                new = self.all_reduce(new, groups, reducer)
        if instr.shape.is_tuple:
            return Local(new, tuple(out_tilings))
        return Local(new, out_tilings[0])

    def exchange_halos(self, instr, new_ops, L: OpLabels, cand: Tiling, halos):
        """Windowed op with overlapping windows along cut labels (labels._halo): each data
        operand's local block gets the `left` last rows of its left neighbour's block and
        the `right` first rows of its right neighbour's (collective-permutes along the
        label's device groups); at the ends of the global array, where the neighbour is
        missing, the rows are the op's padding value (zero for a convolution, the init
        value for a reduce-window). The window's padding along those dimensions becomes
        0: the halo holds it. Returns the new operands and window."""
        window = list(instr.window.dims)
        conv = instr.opcode is Opcode.CONVOLUTION
        n_data = 1 if conv else len(instr.operands) // 2
        ops = list(new_ops)
        for x, (left, right) in halos.items():
            groups = cand.groups([x])
            coord = [c[x] for c in cand.coords]
            last = cand.tiles[x] - 1
            for i in range(n_data):
                dim = L.operands[i].index(x)
                pad = None if conv else new_ops[n_data + i]
                value = ops[i]
                n = value.shape.dims[dim]
                parts = []
                if left:
                    rows = self._rows(value, dim, n - left, n)
                    pairs = [(g[j], g[j + 1]) for g in groups for j in range(len(g) - 1)]
                    got = self._permute(rows, pairs)
                    parts.append(self._edge(got, pad, [c == 0 for c in coord]))
                parts.append(value)
                if right:
                    rows = self._rows(value, dim, 0, right)
                    pairs = [(g[j + 1], g[j]) for g in groups for j in range(len(g) - 1)]
                    got = self._permute(rows, pairs)
                    parts.append(self._edge(got, pad, [c == last for c in coord]))
                dims = list(value.shape.dims)
                dims[dim] = n + left + right
                ops[i] = self.emit(
                    Opcode.CONCATENATE,
                    _resized(value.shape, tuple(dims)),
                    parts,
                    {"dimensions": (dim,)},
                )
            w = L.operands[0].index(x)
            s = instr.dim_labels.input_spatial.index(w) if conv else w
            window[s] = A.WindowDim(**{**_fields(window[s]), "pad_low": 0, "pad_high": 0})
        return ops, A.Window(tuple(window))

    def _rows(self, value, dim: int, start: int, stop: int) -> HloInstruction:
        spec = [(0, n, 1) for n in value.shape.dims]
        spec[dim] = (start, stop, 1)
        dims = tuple(e - b for b, e, _ in spec)
        return self.emit(
            Opcode.SLICE, _resized(value.shape, dims), [value], {"slice": A.SliceSpec(tuple(spec))}
        )

    def _permute(self, value, pairs) -> HloInstruction:
        self.count("collective-permute")
        return self.emit(
            Opcode.COLLECTIVE_PERMUTE,
            value.shape,
            [value],
            {"channel_id": self.next_channel(), "source_target_pairs": tuple(pairs)},
        )

    def _edge(self, rows, pad, at_edge: list[bool]) -> HloInstruction:
        """`rows` received from a neighbour, with the padding value `pad` (a scalar
        instruction; None: zero, what a device nobody sends to receives) on the devices
        at the edge."""
        if pad is None or not any(at_edge):
            return rows
        flag = self.offset([int(e) for e in at_edge])
        one = self.constant(np.array(1, np.int32))
        edge = self.emit(Opcode.COMPARE, Shape.scalar(PRED), [flag, one], {"direction": "EQ"})
        edge = self.emit(
            Opcode.BROADCAST, rows.shape.with_element_type(PRED), [edge], {"dimensions": ()}
        )
        fill = self.emit(Opcode.BROADCAST, rows.shape, [pad], {"dimensions": ()})
        return self.emit(Opcode.SELECT, rows.shape, [edge, fill, rows])

    def masked_gather(self, instr, new_ops, L: OpLabels, cand: Tiling, shape, attrs):
        """This device's share of a gather from an operand cut along indexed dimensions
        (labels.MASKED_GATHER): each cut component of the indices is clamped to the
        global range (as the global gather clamps), moved to this device's offset, the
        gather runs on the local rows, and the rows whose index this device does not
        hold are zeroed. An all-reduce (add) over the cut devices completes it."""
        operand, indices = new_ops
        numbers = instr.gather_dimension_numbers
        ivd = numbers.index_vector_dim
        start_map = list(numbers.start_index_map)
        dims = indices.shape.dims
        itype = indices.shape.element_type
        glob = instr.operand(0).shape.dims
        if ivd == len(dims):
            pieces = [indices]  # one component: the indices themselves
        else:
            pieces = []
            for k in range(dims[ivd]):
                spec = [(0, n, 1) for n in dims]
                spec[ivd] = (k, k + 1, 1)
                part = _resized(
                    indices.shape, tuple(1 if i == ivd else n for i, n in enumerate(dims))
                )
                pieces.append(
                    self.emit(Opcode.SLICE, part, [indices], {"slice": A.SliceSpec(tuple(spec))})
                )
        part_shape = pieces[0].shape
        preds = part_shape.with_element_type(PRED)

        def splat(value, like: Shape) -> HloInstruction:
            c = self.constant(np.array(value, like.element_type.dtype))
            return self.emit(Opcode.BROADCAST, like, [c], {"dimensions": ()})

        mask = None
        for x in [x for x in L.contracted if cand.tiles[x] > 1]:
            d = L.operands[0].index(x)
            k = start_map.index(d)
            lo, hi = splat(0, part_shape), splat(glob[d] - 1, part_shape)
            clamped = self.emit(Opcode.CLAMP, part_shape, [lo, pieces[k], hi])
            off = self.emit(
                Opcode.CONVERT, Shape.scalar(itype), [self.offset(cand.offsets(x, glob[d]))]
            )
            off = self.emit(Opcode.BROADCAST, part_shape, [off], {"dimensions": ()})
            pieces[k] = self.emit(Opcode.SUBTRACT, part_shape, [clamped, off])
            ge = self.emit(Opcode.COMPARE, preds, [pieces[k], lo], {"direction": "GE"})
            n = splat(operand.shape.dims[d], part_shape)
            lt = self.emit(Opcode.COMPARE, preds, [pieces[k], n], {"direction": "LT"})
            held = self.emit(Opcode.AND, preds, [ge, lt])
            mask = held if mask is None else self.emit(Opcode.AND, preds, [mask, held])
        assert mask is not None
        if ivd == len(dims):
            moved = pieces[0]
        else:
            moved = self.emit(Opcode.CONCATENATE, indices.shape, pieces, {"dimensions": (ivd,)})
        gathered = self.clone(instr, [operand, moved], shape, attrs)
        batch = tuple(n for i, n in enumerate(part_shape.dims) if i != ivd)
        mask = self.emit(Opcode.RESHAPE, _resized(preds, batch), [mask])
        batch_out = tuple(o for o in range(shape.rank) if o not in numbers.offset_dims)
        mask = self.emit(
            Opcode.BROADCAST, shape.with_element_type(PRED), [mask], {"dimensions": batch_out}
        )
        return self.emit(Opcode.SELECT, shape, [mask, gathered, splat(0, shape)])

    def gather_and_reduce(self, instr: HloInstruction, partial, groups) -> HloInstruction:
        """Complete a variadic reduce whose reduced dimensions are cut: every partial
        result gains a trailing dimension, is all-gathered along it over `groups`, and
        the gathered partials are reduced over it again with the same computation and
        init values (`_variadic_identity` made sure applying them twice is harmless)."""
        g = len(groups[0])
        n = len(instr.operands) // 2
        parts = (
            [partial]
            if not partial.shape.is_tuple
            else [
                self.emit(Opcode.GET_TUPLE_ELEMENT, s, [partial], {"index": k})
                for k, s in enumerate(partial.shape.tuple_shapes)
            ]
        )
        gathered = []
        for part in parts:
            rank = part.shape.rank
            column = self.emit(Opcode.RESHAPE, _resized(part.shape, (*part.shape.dims, 1)), [part])
            self.count("all-gather")
            gathered.append(
                self.emit(
                    Opcode.ALL_GATHER,
                    _resized(part.shape, (*part.shape.dims, g)),
                    [column],
                    {
                        "channel_id": self.next_channel(),
                        "replica_groups": A.ReplicaGroups(groups=tuple(tuple(x) for x in groups)),
                        "dimensions": (rank,),
                        "use_global_device_ids": True,
                    },
                )
            )
        inits = [self.values[id(o)].instr for o in instr.operands[n:]]
        return self.emit(
            Opcode.REDUCE,
            partial.shape,
            [*gathered, *inits],
            {"dimensions": (parts[0].shape.rank,), "to_apply": instr.to_apply},
        )

    def _scatter_target(self, out: Tiling, groups, wanted: Tiling, local: Shape):
        """(j, tiling) when reduce-scattering the partial result along dimension j over
        `groups` gives a tiling from which `wanted` is a free slice: each device keeps the
        piece of j numbered by its rank in its group."""
        g = len(groups[0])
        rank = {d: r for group in groups for r, d in enumerate(group)}
        for j in range(out.rank):
            if out.tiles[j] != 1 or wanted.tiles[j] % g or local.dims[j] % g:
                continue
            tiles = tuple(g if k == j else t for k, t in enumerate(out.tiles))
            coords = tuple(
                tuple(rank[d] if k == j else x for k, x in enumerate(c))
                for d, c in enumerate(out.coords)
            )
            tiling = Tiling(tiles, coords)
            dims = tuple(x * t for x, t in zip(local.dims, out.tiles, strict=True))
            if _gather_bytes(tiling, wanted, local.with_dims(dims)) == 0:
                return j, tiling
        return None

    def reduce_scatter(self, value, groups, reducer: HloComputation, j: int) -> HloInstruction:
        self.count("reduce-scatter")
        dims = list(value.shape.dims)
        dims[j] //= len(groups[0])
        return self.emit(
            Opcode.REDUCE_SCATTER,
            _resized(value.shape, dims),
            [value],
            {
                "channel_id": self.next_channel(),
                "replica_groups": A.ReplicaGroups(groups=tuple(tuple(x) for x in groups)),
                "dimensions": (j,),
                "use_global_device_ids": True,
                "to_apply": reducer,
            },
        )

    # -- the result ------------------------------------------------------------------------
    def finish_root(self, root: HloInstruction) -> Local:
        value = self.values[id(root)]
        if value.manual:
            raise PartitionError(f"{root.name}: the program returns a manual value")
        s = root.sharding
        if isinstance(s, HloSharding) and root.shape.is_tuple and s.is_tuple:
            dst = self.even(self.tiling_of(s, root.shape), root.shape, root.name)
            value = self.to_state(value, dst, self.partial_of(s, root.shape), root.shape)
        elif value.partial is not None and not isinstance(s, HloSharding):
            value = self.reduced(value, root.shape)
        sharding = _sharding_attr(value.tiling, root.shape, value.partial)
        if value.instr.opcode is Opcode.PARAMETER and value.instr.sharding != sharding:
            # a parameter returned as it is, read differently (a replicated value returned
            # as a partial sum): the parameter keeps its own sharding
            value = Local(
                self.emit(Opcode.COPY, value.instr.shape, [value.instr]),
                value.tiling,
                partial=value.partial,
            )
        value.instr.attrs["sharding"] = sharding
        return value


# -- helpers ---------------------------------------------------------------------------------


def _computed_from_no_parameter(instr: HloInstruction) -> bool:
    """Whether `instr` is made by _FREE_OPS alone from no parameter (free in any tiling)."""
    seen: set[int] = set()
    stack = [instr]
    while stack:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if x.opcode not in _FREE_OPS or has_side_effect_deep(x):
            return False
        stack.extend(x.operands)
    return True


def _group_id(instr: HloInstruction) -> str | None:
    if instr.opcode is not Opcode.CUSTOM_CALL or instr.custom_call_target != _GROUP_TARGET:
        return None
    group = instr.frontend_attributes.get("xla.sdy.sharding_group_id")
    return group if isinstance(group, str) else None


def _unspecified_dims(instr: HloInstruction) -> tuple[int, ...]:
    """The dimensions a Sharding custom call leaves open (GSPMD's
    `backend_config="unspecified_dims=[...]"`, Shardy's `{?}`): the constraint fixes the
    others; propagation decides these."""
    if instr.opcode is not Opcode.CUSTOM_CALL or instr.custom_call_target != "Sharding":
        return ()
    config = instr.backend_config
    m = re.fullmatch(r"\s*unspecified_dims=\[([0-9,\s]*)\]\s*", config.text) if config else None
    if m is None:
        return ()
    return tuple(int(d) for d in m.group(1).split(",") if d.strip())


def _open_constraint(annotated: Tiling, held: Tiling, free: tuple[int, ...]) -> Tiling:
    """The tiling a constraint with open dimensions `free` asks of a value held as `held`:
    the annotation on its fixed dimensions, the value's own cuts on the open ones where
    both fit one uniform tiling (else the annotation alone, the open dimensions whole)."""
    fixed = [i for i in range(held.rank) if i not in free]
    kept = held.with_axes_whole(fixed)
    if kept.is_replicated:
        return annotated
    if annotated.is_replicated:
        return kept
    return merge(annotated, kept) or annotated


_BITS = {8: "u8", 16: "u16", 32: "u32", 64: "u64"}


def _zeros_like(shape: Shape, namer: NameUniquer, body: list[HloInstruction]) -> HloInstruction:
    """Instructions (appended to `body`) making a value of `shape`: zeros, tokens from
    after-all; returns the last one."""
    if shape.is_tuple:
        parts = [_zeros_like(s, namer, body) for s in shape.tuple_shapes]
        made = HloInstruction(namer.fresh("tuple"), Opcode.TUPLE, shape, parts)
    elif not shape.is_array:
        made = HloInstruction(namer.fresh("after-all"), Opcode.AFTER_ALL, shape)
    else:
        lit = Literal.from_array(np.zeros((), shape.element_type.dtype))
        zero = HloInstruction(namer.fresh("constant"), Opcode.CONSTANT, lit.shape, literal=lit)
        body.append(zero)
        made = HloInstruction(
            namer.fresh("broadcast"), Opcode.BROADCAST, shape, [zero], {"dimensions": ()}
        )
    body.append(made)
    return made


def _is_sum(instr: HloInstruction) -> bool:
    """Whether a reduce adds its values up (one operand, `to_apply` an add)."""
    comp = instr.to_apply_or_none
    if len(instr.operands) != 2 or not isinstance(comp, HloComputation):
        return False
    root = comp.root_instruction()
    return root.opcode is Opcode.ADD and all(o.opcode is Opcode.PARAMETER for o in root.operands)


def _same_groups(a: Groups, b: Groups) -> bool:
    return {frozenset(g) for g in a} == {frozenset(g) for g in b}


def _splits_groups(src, dst: Tiling, groups: Groups) -> bool:
    """Whether the members of each group hold distinct parts, under `src`, that together
    make the group's piece under `dst` (so each can pad its part with zeros)."""
    if not isinstance(src, Tiling) or src.rank != dst.rank:
        return False
    if any(s % d for s, d in zip(src.tiles, dst.tiles, strict=True)):
        return False
    ratio = [s // d for s, d in zip(src.tiles, dst.tiles, strict=True)]
    for dev in range(src.num_devices):
        inside = [c // r for c, r in zip(src.coords[dev], ratio, strict=True)]
        if tuple(inside) != dst.coords[dev]:
            return False
    for g in groups:
        parts = {src.coords[d] for d in g}
        if len(parts) != len(g) or len(g) != math.prod(ratio):
            return False
    return True


def _label_tiling(t: Tiling, dims, n_labels: int) -> Tiling:
    """The label-space tiling a value's tiling implies through its dimension labels."""
    where: dict[int, int] = {}
    for d, label in enumerate(dims):
        if label is not None and label not in where and t.tiles[d] > 1:
            where[label] = d
    return t.project([where.get(label) for label in range(n_labels)])


def _gather_bytes(src: Tiling, dst: Tiling, shape: Shape) -> float:
    """Bytes each device receives to go from src to dst (all-gathers; slicing is free)."""
    gather = [i for i in range(src.rank) if src.tiles[i] > 1 and not src.same_axis(dst, i)]
    if not gather:
        return 0.0
    before = shape.byte_size / math.prod(src.tiles)
    after = before * math.prod(src.tiles[i] for i in gather)
    return after - before


def _scatter_share(out_t: Tiling, wanted: Tiling) -> float:
    """1 when the wanted result cuts a dimension the partial result holds whole (an
    all-reduce followed by a slice there is a reduce-scatter's worth of traffic)."""
    return 1.0 if any(w > 1 and o == 1 for w, o in zip(wanted.tiles, out_t.tiles)) else 0.0


def _local_shape(shape: Shape, tiling, name: str = "") -> Shape:
    if shape.is_tuple:
        return Shape.tuple(
            [_local_shape(s, t, name) for s, t in zip(shape.tuple_shapes, tiling, strict=True)]
        )
    if not isinstance(tiling, Tiling):
        return shape
    if not tiling.divides(shape.dims):
        raise PartitionError(
            f"{name}: {shape} does not split evenly into {list(tiling.tiles)} tiles "
            "(uneven shardings are not supported yet)"
        )
    return _resized(shape, tiling.local_dims(shape.dims))


def _resized(shape: Shape, dims) -> Shape:
    """`shape` with new dimension sizes, keeping its layout when the rank is unchanged."""
    out = shape.with_dims(tuple(dims))
    if shape.layout is not None and len(dims) == shape.rank:
        out = out.with_layout(shape.layout)
    return out


def _fields(w: A.WindowDim) -> dict:
    return {f: getattr(w, f) for f in w.__dataclass_fields__}


def _local_attrs(instr: HloInstruction, new_ops, shape: Shape) -> dict:
    """Attributes that spell out sizes, adjusted to the local shapes."""
    attrs = dict(instr.attrs)
    op = instr.opcode
    if op is Opcode.SLICE:
        attrs["slice"] = A.SliceSpec(
            tuple(
                (s, e, st) if (s, e, st) != (0, g, 1) else (0, loc, 1)
                for (s, e, st), g, loc in zip(
                    instr.slice_spec.dims,
                    instr.operand(0).shape.dims,
                    new_ops[0].shape.dims,
                    strict=True,
                )
            )
        )
    elif op is Opcode.DYNAMIC_SLICE:
        attrs["dynamic_slice_sizes"] = shape.dims
    elif op is Opcode.GATHER:
        sizes = list(instr.gather_dimension_numbers.slice_sizes)
        for d, (g, loc) in enumerate(
            zip(instr.operand(0).shape.dims, new_ops[0].shape.dims, strict=True)
        ):
            if sizes[d] == g and g != loc:
                sizes[d] = loc
        attrs["slice_sizes"] = tuple(sizes)
    elif op is Opcode.CUSTOM_CALL and instr.operand_layout_constraints:
        attrs["operand_layout_constraints"] = tuple(
            _resized(c, o.shape.dims)
            for c, o in zip(instr.operand_layout_constraints, new_ops, strict=True)
        )
    return attrs


def _sharding_attr(tiling, shape: Shape, partial=None) -> HloSharding:
    if isinstance(tiling, tuple):
        states = partial or (None,) * len(tiling)
        return HloSharding(
            "tuple",
            elements=tuple(
                _sharding_attr(t, s, p)
                for t, s, p in zip(tiling, shape.tuple_shapes, states, strict=True)
            ),
        )
    if isinstance(tiling, Tiling) and partial is not None:
        return _unreduced_sharding(tiling, partial)
    if isinstance(tiling, Tiling):
        return tiling.to_sharding()
    return HloSharding.replicated()


def _unreduced_sharding(tiling: Tiling, groups: Groups) -> HloSharding:
    """The HloSharding of partial sums over `groups` of pieces under `tiling`: the tile
    dimensions, then the unreduced subgroup (a group's members), then replication."""
    by_tile: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
    for g in sorted(groups):
        by_tile.setdefault(tiling.coords[g[0]], []).append(g)
    devices: list[int] = []
    for c in sorted(by_tile):
        tile_groups = by_tile[c]
        for u in range(len(tile_groups[0])):
            devices += [g[u] for g in tile_groups]
    size = len(groups[0])
    replicas = len(by_tile[next(iter(by_tile))])
    dims = [*tiling.tiles, size] + ([replicas] if replicas > 1 else [])
    kinds = ("unreduced", "replicated") if replicas > 1 else ("unreduced",)
    iota = devices == list(range(len(devices)))
    return HloSharding(
        "tiled",
        tuple(dims),
        iota_reshape=(len(devices),) if iota else (),
        explicit_devices=None if iota else tuple(devices),
        subgroups=kinds,
    )


# -- Shardy's spelling -----------------------------------------------------------------------

_MESH = re.compile(r"(\w+)\s*=\s*#sdy\.mesh<\[([^\]]*)\](?:,\s*device_ids=\[([\d,\s]*)\])?>")


def _sdy_mesh(module: HloModule) -> dict[str, tuple[list[tuple[str, int]], list[int] | None]]:
    """Meshes named in the module's `xla.sdy.meshes` frontend attribute: name -> (axes,
    device ids or None for iota)."""
    fa = module.config.frontend_attributes
    raw = fa.get("xla.sdy.meshes") if fa is not None else None
    if raw is None:
        return {}
    text = raw.text if isinstance(raw, A.Raw) else str(raw)
    text = text.replace('\\"', '"')
    meshes = {}
    for m in _MESH.finditer(text):
        axes = [(a, int(s)) for a, s in re.findall(r'"(\w+)"\s*=\s*(\d+)', m.group(2))]
        ids = [int(x) for x in m.group(3).split(",")] if m.group(3) else None
        meshes[m.group(1)] = (axes, ids)
    return meshes


def _sdy_shardings(text: str, meshes, ranks: list[int], keep: set[str] | None = None):
    """The GSPMD shardings of the values of a `#sdy.sharding_per_value<[<@mesh, [{"x"},
    {}]>, ...]>` text (None for a value it cannot read); axes outside `keep` (when given)
    are left out: the value is replicated over them."""
    values = re.findall(r"<@(\w+),\s*\[(.*?)\]>", text.replace('\\"', '"'))
    if len(values) != len(ranks):
        return [None] * len(ranks)
    return [
        _sdy_one(meshes.get(mesh), dims, rank, keep)
        for (mesh, dims), rank in zip(values, ranks, strict=True)
    ]


def _sdy_one(mesh, dims_text: str, rank: int, keep) -> HloSharding | None:
    if mesh is None or ":(" in dims_text:  # sub-axes ("x":(1)2) are not read yet
        return None
    axes, ids = mesh
    sizes = dict(axes)
    names = [a for a, _ in axes]
    per_dim = [
        [x for x in re.findall(r'"(\w+)"', d) if keep is None or x in keep]
        for d in re.findall(r"\{([^}]*)\}", dims_text)
    ]
    if len(per_dim) != rank:
        return None
    used = [a for d in per_dim for a in d]
    rest = [a for a in names if a not in used]
    n = math.prod(sizes.values())
    devs = np.arange(n) if ids is None else np.array(ids)
    devs = devs.reshape([sizes[a] for a in names])
    devs = devs.transpose([names.index(a) for a in used + rest])
    tiles = [math.prod(sizes[a] for a in d) for d in per_dim]
    r = math.prod(sizes[a] for a in rest)
    if math.prod(tiles) == 1:
        return HloSharding.replicated()
    return HloSharding.tile([*tiles, r] if r > 1 else tiles, devs.reshape(-1).tolist(), r > 1)
