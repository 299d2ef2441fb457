# Collective thunks: all-reduce, all-gather, reduce-scatter, all-to-all, ragged-all-to-all,
# collective-broadcast, collective-permute (plain and in place) and the start ops of the
# async pairs, run over the devices' own memory.
#
# The thunk hands views of its operand and result slices to the execution's
# DeviceCollectives (xlapy.backends.collectives, in ctx.state["collectives"]), which meets
# the other participants and writes the results; operands are read where they lie, in every
# participant's arena, so nothing travels through Python lists. A start op's result tuple
# also holds its operand (the first operand of the in-place collective-permute form; copied
# when buffer assignment gave it other bytes) and, for collective-permute-start, context
# scalars (zeroed). The matching done ops only forward the result (rule thunks). An
# execution without a DeviceCollectives (one device run on its own) falls back to the
# interpreter's one-device rule.
#
# Collective thunks block until their peers arrive, so a sequence holding one (directly or
# in nested control flow) never runs as a graph: a thunk handed to the shared pool could
# wait on a peer device whose own thunk sits behind it in the same pool.

from __future__ import annotations

import numpy as np

from xlapy.backends.collectives import result_parts
from xlapy.backends.cpu.runtime.loadable import loadable
from xlapy.backends.cpu.runtime.rule_thunk import RuleThunk
from xlapy.backends.cpu.runtime.thunk import (
    BufferSlice,
    ExecutionContext,
    Thunk,
    ValueTree,
    logical_from_physical,
    physical_dims,
)
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.opcodes import Opcode


def _leaves(tree: ValueTree) -> list[BufferSlice]:
    if isinstance(tree, tuple):
        return [s for t in tree for s in _leaves(t)]
    return [] if tree is None else [tree]


def _at(tree: ValueTree, index: tuple[int, ...]) -> ValueTree:
    for i in index:
        tree = tree[i]
    return tree


class CollectiveThunk(Thunk):
    """One collective, performed with the execution's peers (see the file comment)."""

    kind = "collective"

    def __init__(self, instr: HloInstruction, operands: list[ValueTree], result: ValueTree):
        self.instr = instr
        self.inputs = [s for o in operands for s in _leaves(o)]
        parts = result_parts(instr)
        self.outputs = _leaves(_at(result, parts.results))
        self.copies: list[tuple[BufferSlice, BufferSlice]] = []
        if parts.operand is not None:
            dsts = _leaves(_at(result, parts.operand))
            self.copies = [
                (src, dst)
                for src, dst in zip(self.inputs[: len(dsts)], dsts, strict=True)
                if not src.same_bytes(dst)
            ]
        self.zeroed = [s for i in parts.extras for s in _leaves(_at(result, i))]
        self.fallback = RuleThunk(instr, operands, result, "")
        self._views = [_Viewer(s) for s in self.inputs], [_Viewer(s) for s in self.outputs]

    def run(self, ctx: ExecutionContext) -> None:
        comm = ctx.state.get("collectives")
        if comm is None:
            self.fallback.run(ctx)
            return
        for src, dst in self.copies:
            ctx.copy(src, dst)
        for s in self.zeroed:
            ctx.physical(s).fill(0)
        memory = ctx.memory
        ins, outs = self._views
        comm.perform(self.instr, [v(memory) for v in ins], [v(memory) for v in outs])

    def describe(self) -> list[str]:
        lines = [f"collective {self.instr.name} = {self.instr.opcode.text}"]
        lines += [f"in{i}: {s}" for i, s in enumerate(self.inputs)]
        return lines + [f"out{i}: {s}" for i, s in enumerate(self.outputs)]


class _Viewer:
    """ctx.view of one slice with its shape's work done once: the slice as a logically
    indexed array of the execution's memory."""

    __slots__ = ("allocation", "dims", "dtype", "shape", "start", "stop")

    def __init__(self, s: BufferSlice):
        self.allocation, self.start, self.stop = s.allocation, s.offset, s.offset + s.size
        self.dtype, self.dims, self.shape = np.dtype(s.shape.dtype), physical_dims(s.shape), s.shape

    def __call__(self, memory: list) -> np.ndarray:
        raw = memory[self.allocation][self.start : self.stop].view(self.dtype).reshape(self.dims)
        return logical_from_physical(raw, self.shape)


@loadable
def plan_device_id(instr: HloInstruction):
    """replica-id and partition-id: the execution's own id (ctx.state, as the interpreter's
    rule reads it: 0 for a program run on its own) written into the u32 result."""
    if instr.opcode not in (Opcode.REPLICA_ID, Opcode.PARTITION_ID) or instr.operands:
        return None
    key = "replica_id" if instr.opcode is Opcode.REPLICA_ID else "partition_id"

    def run(values, out, ctx: ExecutionContext) -> bool:
        out[...] = np.uint32(ctx.state.get(key, 0))
        return True

    return run
