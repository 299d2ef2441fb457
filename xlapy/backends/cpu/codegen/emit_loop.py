# A while loop as one native function: the condition's kernels, a test of its pred byte, and
# the body's kernels and copies, called in order with no Python between iterations.
#
#   i32 xla_loop(i64* bases, i64* table, i64 limit, i64 budget)
#
# `bases` holds an execution's allocation addresses (the runtime's ExecutionContext.bases);
# every step names its buffers as (allocation, byte offset) pairs, so the function serves any
# execution. `table` holds the entry points of the kernels the loop calls (and, for a nested
# native loop, its function and its own table), known only once the kernels are loaded; the
# function reads them from there, so its IR (and the cached object) does not depend on where
# this process loaded them. Kernels are called over their whole outer range, as the runtime
# does for a kernel that does not split: `f(pointers..., 0, extent)`; a kernel the runtime
# may split over the cores is handed to the native pool's parallel-for instead
# (runtime/native_pool.py's xp_run, its address from the table, the pointers in an array on
# the stack), cut into as many blocks as the runtime would cut it. A dot that the runtime
# runs as one cblas gemm on the arena is that call here too (OpenBLAS's entry point from
# the table, the same arguments DotThunk passes). A conditional becomes a switch over its
# branches' steps.
#
# The loop state needs no copies between iterations where buffer assignment aliased it (the
# body's root, the loop's result and the condition's and body's parameters share slices);
# where it did not, the runtime's copies become memmoves here. The function returns 0 when
# the condition fails; 1 once the body has run `limit` times (limit >= 0) and the condition
# still holds (the runtime's max_while_iterations), or what a nested loop returned; 2 after
# `budget` iterations (budget > 0) with the state in memory, so that calling it again goes
# on where it stopped (it starts at the condition): the runtime calls it in rounds and Python
# gets to handle signals (Ctrl-C) between them. A nested loop runs without a budget.
#
# A plan without a pred is a straight run of steps (a stretch of a sequence outside any
# loop, runtime/control_flow_thunk.py's NativeRun): the function runs them once and returns
# 0. A batched dot run as a gemm list (runtime/dot_thunk.py's GemmList) is a call of the
# gemm-list kernel on its table, whose address the table holds too.
#
# Kernels flush subnormals by setting the MXCSR around each call, which costs more than a
# small kernel's work (codegen/emitter.py, understands_flushed_end). A loop whose plan says
# `flush` sets the flush mode once around its whole run instead, and passes the kernels
# that understand it (`LoopCall.flushed`) the complement of their extent as `end`, so they
# leave the MXCSR alone; it restores the caller's MXCSR before it returns.
#
# A small kernel of a loop (one that does not split, with no parameter block) may also be
# compiled into the loop's own object instead of called through the table (`LoopCall.inline`,
# emit_linked_loop; off by default: it compiles the kernel a second time): its IR is linked
# into the loop's module under a name of its own with internal linkage, called directly,
# and LLVM inlines it, so an iteration of a small body is straight-line code with no call.

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llvmlite import ir

from xlapy.backends.cpu.codegen.common import I1, I8, I32, I64
from xlapy.backends.cpu.codegen.emitter import MXCSR_FLUSH
from xlapy.backends.cpu.codegen.ir_release import released_text

LOOP_SYMBOL = "xla_loop"

Slot = tuple[int, int]
"""(allocation, byte offset) of a buffer."""


@dataclass(frozen=True, slots=True)
class LoopCall:
    """Call the kernel at `table[entry]` on the addresses of `slots` over [0, extent); with
    `blocks` > 1, through the parallel-for at `table[pool]` in that many blocks. With `data`
    >= 0, `table[data]` (the address of the kernel's parameter block: a library kernel's)
    is one more pointer argument after the slots'. With `inline` >= 0 the kernel is the
    plan's `inlined[inline]`, compiled into the loop and called directly (`entry` unused).
    `flushed`: the kernel understands emitter.understands_flushed_end and is called with
    `~extent` in a loop that flushes (LoopPlan.flush)."""

    entry: int
    slots: tuple[Slot, ...]
    extent: int
    blocks: int = 1
    pool: int = -1
    data: int = -1
    inline: int = -1
    flushed: bool = False


@dataclass(frozen=True, slots=True)
class LoopCopy:
    """Move `size` bytes from `src` to `dst` (which may overlap)."""

    dst: Slot
    src: Slot
    size: int


@dataclass(frozen=True, slots=True)
class LoopNested:
    """Run the native loop at `table[entry]` with its table at `table[entry + 1]` (and this
    loop's limit); a nonzero result ends this loop with it."""

    entry: int


@dataclass(frozen=True, slots=True)
class LoopGemm:
    """Call the cblas gemm at `table[entry]`: `c = a @ b` (alpha 1, beta 0) in `dtype`
    ("float" or "double"), sizes 64-bit or 32-bit as `index_bits` says; `order`, `trans_a`
    and `trans_b` are cblas's enum values."""

    entry: int
    dtype: str
    index_bits: int
    order: int
    trans_a: int
    trans_b: int
    m: int
    n: int
    k: int
    a: Slot
    lda: int
    b: Slot
    ldb: int
    c: Slot
    ldc: int


@dataclass(frozen=True, slots=True)
class LoopSwitch:
    """A conditional: run one of `branches` (each its steps, copies in and out included).
    A pred selector (`bits` 0) picks branch 0 when true, else 1; an integer selector of
    `bits` bits (`signed` or not) picks its branch, the last one when out of range (XLA's
    rule)."""

    selector: Slot
    bits: int
    signed: bool
    branches: tuple[tuple[LoopStep, ...], ...]


@dataclass(frozen=True, slots=True)
class LoopGemmList:
    """Call the gemm-list kernel at `table[entry]` (`void f(list, a, b, c, lo, hi)`, all
    64-bit) on the gemm list at `table[entry + 1]` and the matrices at `a`, `b`, `c`, for
    its gemms 0..count-1."""

    entry: int
    a: Slot
    b: Slot
    c: Slot
    count: int


LoopStep = LoopCall | LoopCopy | LoopNested | LoopGemm | LoopSwitch | LoopGemmList


@dataclass(frozen=True, slots=True)
class LoopPlan:
    """One iteration: `before` (condition copies and kernels), then a test of the pred byte
    at `pred`; while it is nonzero, `after` (body copies, kernels, copies back). Without a
    pred, `before` runs once (a straight run; `after` is empty). `inlined`: the object keys
    of the kernels compiled into the loop (which determine their IR), in the order
    LoopCall.inline counts them. `flush`: the function runs with the MXCSR flushing
    subnormals (x86), the caller's MXCSR restored when it returns."""

    before: tuple[LoopStep, ...]
    pred: Slot | None
    after: tuple[LoopStep, ...]
    inlined: tuple[str, ...] = ()
    flush: bool = False


def _kernel_type(arity: int) -> ir.FunctionType:
    return ir.FunctionType(ir.VoidType(), [I8.as_pointer()] * arity + [I64, I64])


LOOP_TYPE = ir.FunctionType(I32, [I64.as_pointer(), I64.as_pointer(), I64, I64])
POOL_TYPE = ir.FunctionType(I32, [I64] * 5)
"""The native pool's xp_run(kernel, args, nargs, extent, blocks)."""


def _gemm_call(b: ir.IRBuilder, step: LoopGemm, pointer, table) -> tuple[ir.Value, list]:
    """(callee, arguments) of `step`'s cblas gemm call."""
    index = ir.IntType(step.index_bits)
    scalar = ir.FloatType() if step.dtype == "float" else ir.DoubleType()
    ptr = I8.as_pointer()
    enums = [I32] * 3
    sizes = [index] * 3
    matrix = [ptr, index]
    gemm_type = ir.FunctionType(
        ir.VoidType(), [*enums, *sizes, scalar, *matrix, *matrix, scalar, *matrix]
    )
    args = [
        *(ir.Constant(I32, v) for v in (step.order, step.trans_a, step.trans_b)),
        *(ir.Constant(index, v) for v in (step.m, step.n, step.k)),
        ir.Constant(scalar, 1.0),
        pointer(b, step.a),
        ir.Constant(index, step.lda),
        pointer(b, step.b),
        ir.Constant(index, step.ldb),
        ir.Constant(scalar, 0.0),
        pointer(b, step.c),
        ir.Constant(index, step.ldc),
    ]
    return table(step.entry, gemm_type.as_pointer()), args


INLINE_PREFIX = "xlapy_inline_"
"""Kernel i compiled into a loop is the function INLINE_PREFIX + str(i) there."""

_MXCSR = ("llvm.x86.sse.stmxcsr", "llvm.x86.sse.ldmxcsr")


def emit_linked_loop(
    plan: LoopPlan, kernels: Sequence[tuple[str, str]]
) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """(the loop's module, the modules to link into it, the functions to make internal) of
    `plan`, whose `inlined` kernels are `kernels` (IR text, the symbol of its kernel
    function), each renamed to INLINE_PREFIX + its index."""
    linked = tuple(
        text.replace(f'@"{symbol}"', f'@"{INLINE_PREFIX}{i}"')
        for i, (text, symbol) in enumerate(kernels)
    )
    names = tuple(f"{INLINE_PREFIX}{i}" for i in range(len(kernels)))
    return emit_loop(plan), linked, names


def _flushing_wrapper(module: ir.Module, inner: ir.Function) -> None:
    """LOOP_SYMBOL calling `inner` with the MXCSR's FTZ/DAZ bits set, the caller's MXCSR
    restored after."""
    fn = ir.Function(module, LOOP_TYPE, LOOP_SYMBOL)
    fn.attributes.add("nounwind")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    st, ld = (ir.Function(module, ir.FunctionType(ir.VoidType(), [I8.as_pointer()]), name)
              for name in _MXCSR)  # fmt: skip
    saved, flushing = b.alloca(I32), b.alloca(I32)
    b.call(st, [b.bitcast(saved, I8.as_pointer())])
    b.store(b.or_(b.load(saved), ir.Constant(I32, MXCSR_FLUSH)), flushing)
    b.call(ld, [b.bitcast(flushing, I8.as_pointer())])
    rc = b.call(inner, list(fn.args))
    b.call(ld, [b.bitcast(saved, I8.as_pointer())])
    b.ret(rc)


def emit_loop(plan: LoopPlan) -> str:
    """The LLVM IR of `plan` as the function LOOP_SYMBOL."""
    module = ir.Module(name="xla_loop")
    fn = ir.Function(module, LOOP_TYPE, "xla_loop_flushed" if plan.flush else LOOP_SYMBOL)
    if plan.flush:
        fn.linkage = "internal"
        _flushing_wrapper(module, fn)
    fn.attributes.add("nounwind")
    bases_arg, table_arg, limit, budget = fn.args
    entry = ir.IRBuilder(fn.append_basic_block("entry"))
    memmove = module.declare_intrinsic("llvm.memmove", [I8.as_pointer(), I8.as_pointer(), I64])

    # loop invariants, loaded once: allocation bases and table entries
    bases: dict[int, ir.Value] = {}
    entries: dict[int, ir.Value] = {}

    def base(allocation: int) -> ir.Value:
        if allocation not in bases:
            at = entry.gep(bases_arg, [ir.Constant(I64, allocation)])
            bases[allocation] = entry.inttoptr(entry.load(at), I8.as_pointer())
        return bases[allocation]

    def table(index: int, ty: ir.Type) -> ir.Value:
        if index not in entries:
            at = entry.gep(table_arg, [ir.Constant(I64, index)])
            entries[index] = entry.inttoptr(entry.load(at), ty)
        return entries[index]

    def word(index: int) -> ir.Value:
        """table[index] as an i64 (loaded once, in the entry block)."""
        at = entry.gep(table_arg, [ir.Constant(I64, index)])
        return entry.load(at)

    def split_call(b: ir.IRBuilder, step: LoopCall) -> None:
        words = [b.ptrtoint(pointer(b, slot), I64) for slot in step.slots]
        if step.data >= 0:
            words.append(kernel_words.setdefault(step.data, word(step.data)))
        n = len(words)
        array = entry.alloca(ir.ArrayType(I64, n))  # in the entry block: one stack slot
        for i, value in enumerate(words):
            at = b.gep(array, [ir.Constant(I64, 0), ir.Constant(I64, i)])
            b.store(value, at)
        run = table(step.pool, POOL_TYPE.as_pointer())
        args = [
            kernel_words.setdefault(step.entry, word(step.entry)),
            b.ptrtoint(array, I64),
            ir.Constant(I64, n),
            ir.Constant(I64, step.extent),
            ir.Constant(I64, step.blocks),
        ]
        b.call(run, args)  # 1: the pool was taken and this thread ran it whole

    kernel_words: dict[int, ir.Value] = {}

    def inlined(index: int, arity: int) -> ir.Function:
        name = f"{INLINE_PREFIX}{index}"
        if name in module.globals:
            return module.globals[name]
        return ir.Function(module, _kernel_type(arity), name)

    def pointer(b: ir.IRBuilder, slot: Slot) -> ir.Value:
        allocation, offset = slot
        return b.gep(base(allocation), [ir.Constant(I64, offset)])

    def emit_steps(b: ir.IRBuilder, steps: tuple[LoopStep, ...]) -> ir.IRBuilder:
        """Emit `steps` from `b`; the builder where they end (a conditional adds blocks)."""
        for step in steps:
            if isinstance(step, LoopCopy):
                size = ir.Constant(I64, step.size)
                args = [pointer(b, step.dst), pointer(b, step.src), size, ir.Constant(I1, 0)]
                b.call(memmove, args)
            elif isinstance(step, LoopGemm):
                b.call(*_gemm_call(b, step, pointer, table))
            elif isinstance(step, LoopGemmList):
                callee = table(step.entry, ir.FunctionType(ir.VoidType(), [I64] * 6).as_pointer())
                matrices = [b.ptrtoint(pointer(b, s), I64) for s in (step.a, step.b, step.c)]
                listed = kernel_words.setdefault(step.entry + 1, word(step.entry + 1))
                bounds = [ir.Constant(I64, 0), ir.Constant(I64, step.count)]
                b.call(callee, [listed, *matrices, *bounds])
            elif isinstance(step, LoopSwitch):
                b = emit_switch(b, step)
            elif isinstance(step, LoopCall) and step.blocks > 1:
                split_call(b, step)
            elif isinstance(step, LoopCall):
                args = [pointer(b, s) for s in step.slots]
                if step.data >= 0:
                    args.append(table(step.data, I8.as_pointer()))
                if step.inline >= 0:
                    callee = inlined(step.inline, len(args))
                else:
                    callee = table(step.entry, _kernel_type(len(args)).as_pointer())
                end = ~step.extent if step.flushed else step.extent
                b.call(callee, [*args, ir.Constant(I64, 0), ir.Constant(I64, end)])
            else:
                callee = table(step.entry, LOOP_TYPE.as_pointer())
                inner = table(step.entry + 1, I64.as_pointer())
                rc = b.call(callee, [bases_arg, inner, limit, ir.Constant(I64, -1)])
                failed = b.icmp_signed("!=", rc, ir.Constant(I32, 0))
                with b.if_then(failed, likely=False):
                    b.ret(rc)
        return b

    def emit_switch(b: ir.IRBuilder, step: LoopSwitch) -> ir.IRBuilder:
        last = len(step.branches) - 1
        if step.bits == 0:
            pred = b.load(pointer(b, step.selector))
            index = b.select(
                b.icmp_unsigned("!=", pred, ir.Constant(I8, 0)),
                ir.Constant(I64, 0),
                ir.Constant(I64, 1),
            )
        else:
            at = b.bitcast(pointer(b, step.selector), ir.IntType(step.bits).as_pointer())
            raw = b.load(at)
            if step.bits == 64:
                wide = raw
            else:
                wide = b.sext(raw, I64) if step.signed else b.zext(raw, I64)
            inside = b.icmp_unsigned("<", wide, ir.Constant(I64, last))  # also not negative
            index = b.select(inside, wide, ir.Constant(I64, last))
        merge = fn.append_basic_block("merge")
        blocks = [fn.append_basic_block(f"branch{i}") for i in range(last + 1)]
        switch = b.switch(index, blocks[last])
        for i, block in enumerate(blocks[:last]):
            switch.add_case(ir.Constant(I64, i), block)
        for block, steps in zip(blocks, step.branches, strict=True):
            end = emit_steps(ir.IRBuilder(block), steps)
            end.branch(merge)
        return ir.IRBuilder(merge)

    header = fn.append_basic_block("header")
    b = ir.IRBuilder(header)
    if plan.pred is None:  # a straight run
        b = emit_steps(b, plan.before)
        b.ret(ir.Constant(I32, 0))
        entry.branch(header)
        return released_text(module)
    count = b.phi(I64, "iterations")
    count.add_incoming(ir.Constant(I64, 0), entry.block)
    b = emit_steps(b, plan.before)
    pred = b.load(pointer(b, plan.pred))
    done = fn.append_basic_block("done")
    check = fn.append_basic_block("check")
    b.cbranch(b.icmp_unsigned("==", pred, ir.Constant(I8, 0)), done, check)
    ir.IRBuilder(done).ret(ir.Constant(I32, 0))

    b = ir.IRBuilder(check)
    over = b.and_(
        b.icmp_signed(">=", limit, ir.Constant(I64, 0)), b.icmp_signed(">=", count, limit)
    )
    with b.if_then(over, likely=False):
        b.ret(ir.Constant(I32, 1))
    b = emit_steps(b, plan.after)
    following = b.add(count, ir.Constant(I64, 1))
    spent = b.and_(
        b.icmp_signed(">", budget, ir.Constant(I64, 0)), b.icmp_signed(">=", following, budget)
    )
    with b.if_then(spent, likely=False):
        b.ret(ir.Constant(I32, 2))
    count.add_incoming(following, b.block)
    b.branch(header)
    entry.branch(header)
    return released_text(module)
