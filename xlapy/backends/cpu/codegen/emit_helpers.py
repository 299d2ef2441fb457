# IR of the native helpers the CPU runtime runs but does not compile itself: the native
# parallel-for (runtime/native_pool.py) and the MXCSR wrappers that flush subnormals around
# BLAS calls (runtime/dot_thunk.py). jit/native_helpers.py compiles them; the driver hands
# the runtime their entry points (runtime/native_code.py).
#
# The parallel-for: one job at a time is published in globals: the kernel's entry address,
# the address of its argument array, the argument count, the outer extent, and one 64-bit
# claim word packing (generation, block count, next block). A thread claims block i with a
# compare-and-swap of that word from (g, n, i) to (g, n, i + 1), only while i < n, so a
# thread that read the word of an earlier job can never claim a block of a later one, and
# the job's other globals cannot change under a claimed block: the caller publishes the
# next job only after every claimed block has counted itself done. Block i covers
# [extent * i / n, extent * (i + 1) / n).
#
# Workers (made by @xp_start with pthread_create) spin briefly on a wake-up counter, then
# sleep on it with futex(FUTEX_WAIT); the caller (@xp_run) bumps the counter and calls
# futex(FUTEX_WAKE) only when some worker sleeps (a sleeper count, sequentially consistent
# on both sides, so no wake-up is lost). The caller claims blocks like any worker, then
# waits for the done count with futex waits of 1 ms at most (the last block's thread wakes
# it), so it cannot hang while the blocks' threads run. A caller that finds the pool taken
# (a `busy` flag) runs its kernel whole on its own thread instead: nothing ever waits for
# the pool to become free.
#
# The MXCSR wrappers: `xlapy_mxcsr_flush() -> previous` sets FTZ/DAZ, `xlapy_mxcsr_set`
# restores the previous value; a flushing gemm has the signature of the cblas gemm it wraps,
# sets FTZ/DAZ, calls it on the same thread and restores the caller's MXCSR.
#
# The gemm list: a kernel in the parallel-for's calling convention that runs gemms lo..hi-1
# of a table (one row-major cblas gemm each: byte offsets of its three matrices from three
# base addresses, its rows and columns; the order, transposes, depth and leading dimensions
# shared), with OpenBLAS limited to the calling thread around them. One product cut into
# tiles, or a batch of products, is then one table and one parallel-for, with no Python per
# tile (runtime/dot_thunk.py).

from __future__ import annotations

import numpy as np
from llvmlite import ir

from xlapy.backends.cpu.codegen.emitter import MXCSR_FLUSH

_WAIT, _WAKE = 128, 129  # FUTEX_WAIT_PRIVATE, FUTEX_WAKE_PRIVATE
_I32, _I8P = ir.IntType(32), ir.IntType(8).as_pointer()


def _call_ir(max_args: int) -> str:
    """@call(fn, args, nargs, lo, hi): the kernel at `fn` on `nargs` addresses read from the
    array at `args`, over [lo, hi)."""
    cases = " ".join(f"i64 {n}, label %c{n}" for n in range(1, max_args + 1))
    lines = [
        "define private void @call(i64 %f, i64 %a, i64 %n, i64 %lo, i64 %hi) {",
        "entry:",
        "  %ap = inttoptr i64 %a to i64*",
        f"  switch i64 %n, label %out [ {cases} ]",
    ]
    for n in range(1, max_args + 1):
        ty = ", ".join(["i64"] * n + ["i64", "i64"])
        lines.append(f"c{n}:")
        names = []
        for i in range(n):
            lines.append(f"  %g{n}_{i} = getelementptr i64, i64* %ap, i64 {i}")
            lines.append(f"  %v{n}_{i} = load i64, i64* %g{n}_{i}")
            names.append(f"i64 %v{n}_{i}")
        lines.append(f"  %f{n} = inttoptr i64 %f to void ({ty})*")
        lines.append(f"  call void %f{n}({', '.join(names)}, i64 %lo, i64 %hi)")
        lines.append("  br label %out")
    lines += ["out:", "  ret void", "}"]
    return "\n".join(lines)


def parallel_for_ir(futex: int, relax: str, max_args: int, spin: int) -> str:
    """The pool's module (see the file comment): `futex` is the futex system call's number,
    `relax` the spin loops' pause instruction, `max_args` the most kernel arguments @call
    passes, `spin` the pause instructions a thread spins for before it sleeps."""
    return f"""
@fn = internal global i64 0
@args = internal global i64 0
@nargs = internal global i64 0
@extent = internal global i64 0
@claim = internal global i64 0
@done = internal global i32 0
@wake = internal global i32 0
@sleepers = internal global i32 0
@busy = internal global i32 0

declare i64 @syscall(i64, ...)
declare i32 @pthread_create(i64*, i8*, i8* (i8*)*, i8*)

{_call_ir(max_args)}

define private void @work() {{
entry:
  br label %loop
loop:
  %c = load atomic i64, i64* @claim acquire, align 8
  %idx = and i64 %c, 1048575
  %nbs = lshr i64 %c, 20
  %nb = and i64 %nbs, 1048575
  %more = icmp ult i64 %idx, %nb
  br i1 %more, label %try, label %exit
try:
  %c1 = add i64 %c, 1
  %r = cmpxchg i64* @claim, i64 %c, i64 %c1 acq_rel acquire
  %ok = extractvalue {{ i64, i1 }} %r, 1
  br i1 %ok, label %run, label %loop
run:
  %f = load i64, i64* @fn
  %a = load i64, i64* @args
  %n = load i64, i64* @nargs
  %ext = load i64, i64* @extent
  %m0 = mul i64 %ext, %idx
  %lo = udiv i64 %m0, %nb
  %idx1 = add i64 %idx, 1
  %m1 = mul i64 %ext, %idx1
  %hi = udiv i64 %m1, %nb
  call void @call(i64 %f, i64 %a, i64 %n, i64 %lo, i64 %hi)
  %d = atomicrmw add i32* @done, i32 1 acq_rel
  %d1 = add i32 %d, 1
  %nb32 = trunc i64 %nb to i32
  %last = icmp eq i32 %d1, %nb32
  br i1 %last, label %wakecaller, label %loop
wakecaller:
  %w = call i64 (i64, ...) @syscall(i64 {futex}, i32* @done, i64 {_WAKE}, i64 1)
  br label %loop
exit:
  ret void
}}

define private i8* @worker(i8* %unused) {{
entry:
  br label %top
top:
  %seen = load atomic i32, i32* @wake acquire, align 4
  call void @work()
  br label %spin
spin:
  %i = phi i64 [ 0, %top ], [ %i1, %relax ]
  %now = load atomic i32, i32* @wake acquire, align 4
  %changed = icmp ne i32 %now, %seen
  br i1 %changed, label %top, label %relax
relax:
  call void asm sideeffect "{relax}", ""()
  %i1 = add i64 %i, 1
  %go = icmp ult i64 %i1, {spin}
  br i1 %go, label %spin, label %sleep
sleep:
  %s0 = atomicrmw add i32* @sleepers, i32 1 seq_cst
  %seen64 = zext i32 %seen to i64
  %r = call i64 (i64, ...) @syscall(i64 {futex}, i32* @wake, i64 {_WAIT}, i64 %seen64, i8* null)
  %s1 = atomicrmw sub i32* @sleepers, i32 1 seq_cst
  br label %top
}}

define i32 @xp_start(i64 %threads) {{
entry:
  %tid = alloca i64
  br label %loop
loop:
  %i = phi i64 [ 0, %entry ], [ %i1, %next ]
  %more = icmp ult i64 %i, %threads
  br i1 %more, label %make, label %done
make:
  %r = call i32 @pthread_create(i64* %tid, i8* null, i8* (i8*)* @worker, i8* null)
  %bad = icmp ne i32 %r, 0
  br i1 %bad, label %fail, label %next
next:
  %i1 = add i64 %i, 1
  br label %loop
fail:
  %made = trunc i64 %i to i32
  ret i32 %made
done:
  %all = trunc i64 %threads to i32
  ret i32 %all
}}

define i32 @xp_run(i64 %f, i64 %a, i64 %n, i64 %extent, i64 %nb) {{
entry:
  %ts = alloca [2 x i64]
  %r = cmpxchg i32* @busy, i32 0, i32 1 acquire monotonic
  %ok = extractvalue {{ i32, i1 }} %r, 1
  br i1 %ok, label %publish, label %alone
alone:
  call void @call(i64 %f, i64 %a, i64 %n, i64 0, i64 %extent)
  ret i32 1
publish:
  store i64 %f, i64* @fn
  store i64 %a, i64* @args
  store i64 %n, i64* @nargs
  store i64 %extent, i64* @extent
  store atomic i32 0, i32* @done release, align 4
  %old = load i64, i64* @claim
  %gen = lshr i64 %old, 40
  %gen1 = add i64 %gen, 1
  %g = shl i64 %gen1, 40
  %nbs = shl i64 %nb, 20
  %c = or i64 %g, %nbs
  store atomic i64 %c, i64* @claim release, align 8
  %w0 = atomicrmw add i32* @wake, i32 1 seq_cst
  %sl = load atomic i32, i32* @sleepers seq_cst, align 4
  %any = icmp ne i32 %sl, 0
  br i1 %any, label %wakeall, label %own
wakeall:
  %w1 = call i64 (i64, ...) @syscall(i64 {futex}, i32* @wake, i64 {_WAKE}, i64 2147483647)
  br label %own
own:
  call void @work()
  %sec = getelementptr [2 x i64], [2 x i64]* %ts, i64 0, i64 0
  store i64 0, i64* %sec
  %nsec = getelementptr [2 x i64], [2 x i64]* %ts, i64 0, i64 1
  store i64 1000000, i64* %nsec
  %tsp = bitcast [2 x i64]* %ts to i8*
  %nb32 = trunc i64 %nb to i32
  br label %wait
wait:
  %i = phi i64 [ 0, %own ], [ %i1, %relax ], [ 0, %sleep ]
  %d = load atomic i32, i32* @done acquire, align 4
  %fin = icmp eq i32 %d, %nb32
  br i1 %fin, label %end, label %relax
relax:
  call void asm sideeffect "{relax}", ""()
  %i1 = add i64 %i, 1
  %go = icmp ult i64 %i1, {spin}
  br i1 %go, label %wait, label %sleep
sleep:
  %d64 = zext i32 %d to i64
  %s = call i64 (i64, ...) @syscall(i64 {futex}, i32* @done, i64 {_WAIT}, i64 %d64, i8* %tsp)
  br label %wait
end:
  store atomic i32 0, i32* @busy release, align 4
  ret i32 0
}}
"""


def _mxcsr_calls(module: ir.Module) -> tuple[ir.Function, ir.Function]:
    sig = ir.FunctionType(ir.VoidType(), [_I8P])
    return ir.Function(module, sig, "llvm.x86.sse.stmxcsr"), ir.Function(
        module, sig, "llvm.x86.sse.ldmxcsr"
    )


MXCSR_FLUSH_SYMBOL, MXCSR_SET_SYMBOL = "xlapy_mxcsr_flush", "xlapy_mxcsr_set"
"""The symbols of mxcsr_flush_ir's and mxcsr_set_ir's functions."""


def mxcsr_flush_ir() -> str:
    """A module with `int32 xlapy_mxcsr_flush()`: sets the MXCSR's FTZ/DAZ bits and
    answers the MXCSR before (x86 only)."""
    module = ir.Module(name="xlapy_mxcsr_flush")
    st, ld = _mxcsr_calls(module)
    fn = ir.Function(module, ir.FunctionType(_I32, []), MXCSR_FLUSH_SYMBOL)
    fn.attributes.add("nounwind")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    saved, new = b.alloca(_I32), b.alloca(_I32)
    b.call(st, [b.bitcast(saved, _I8P)])
    old = b.load(saved)
    b.store(b.or_(old, ir.Constant(_I32, MXCSR_FLUSH)), new)
    b.call(ld, [b.bitcast(new, _I8P)])
    b.ret(old)
    return str(module)


def mxcsr_set_ir() -> str:
    """A module with `void xlapy_mxcsr_set(int32 value)`: the MXCSR becomes `value` (x86
    only; restores what xlapy_mxcsr_flush answered)."""
    module = ir.Module(name="xlapy_mxcsr_set")
    _, ld = _mxcsr_calls(module)
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [_I32]), MXCSR_SET_SYMBOL)
    fn.attributes.add("nounwind")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    value = b.alloca(_I32)
    b.store(fn.args[0], value)
    b.call(ld, [b.bitcast(value, _I8P)])
    b.ret_void()
    return str(module)


def flushing_gemm_symbol(dtype: np.dtype) -> str:
    """The symbol of flushing_gemm_ir(dtype, ...)'s function."""
    return f"xlapy_flushing_{np.dtype(dtype).char}gemm"


def gemm_target_symbol(dtype: np.dtype, wide: bool, role: str) -> str:
    """The external symbol a helper calls a cblas-like gemm through (`role` names which
    gemm: "blas", or "flushing"); the JIT binds it to the address of this process's gemm
    before it loads the helper, so the helper's object holds no address and is cached on
    disk like a kernel's."""
    return f"xlapy_{role}_{np.dtype(dtype).char}gemm{64 if wide else 32}"


BLAS_SETTER_SYMBOL = "xlapy_openblas_set_num_threads_local"
"""The external symbol gemm_list_ir calls OpenBLAS's `openblas_set_num_threads_local`
through (bound like gemm_target_symbol's)."""


def _gemm_signature(dtype: np.dtype, wide: bool) -> tuple[ir.FunctionType, ir.Type]:
    if dtype not in (np.float32, np.float64):
        raise ValueError(f"no cblas gemm for {dtype}")
    scalar = ir.FloatType() if dtype == np.float32 else ir.DoubleType()
    index = ir.IntType(64 if wide else 32)
    matrix = [_I8P, index]
    params = [_I32, _I32, _I32, index, index, index, scalar, *matrix, *matrix, scalar, *matrix]
    return ir.FunctionType(ir.VoidType(), params), scalar


def flushing_gemm_ir(dtype: np.dtype, wide: bool) -> str:
    """A module with a function of the signature of the cblas gemm for float32 / float64
    (`wide`: its sizes are 64-bit) that calls the gemm bound to gemm_target_symbol(dtype,
    wide, "blas") with the MXCSR's FTZ/DAZ bits set and restores the caller's MXCSR (x86
    only)."""
    dtype = np.dtype(dtype)
    sig, _ = _gemm_signature(dtype, wide)
    module = ir.Module(name="xlapy_flushing_gemm")
    fn = ir.Function(module, sig, flushing_gemm_symbol(dtype))
    gemm = ir.Function(module, sig, gemm_target_symbol(dtype, wide, "blas"))
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    st, ld = _mxcsr_calls(module)
    saved, new = b.alloca(_I32), b.alloca(_I32)
    b.call(st, [b.bitcast(saved, _I8P)])
    b.store(b.or_(b.load(saved), ir.Constant(_I32, MXCSR_FLUSH)), new)
    b.call(ld, [b.bitcast(new, _I8P)])
    b.call(gemm, list(fn.args))
    b.call(ld, [b.bitcast(saved, _I8P)])
    b.ret_void()
    return str(module)


GEMM_LIST_HEAD = 7
"""i64 words at the start of a gemm list's table: order, trans_a, trans_b, k, lda, ldb, ldc."""
GEMM_LIST_ENTRY = 5
"""i64 words per gemm of a gemm list's table: a, b, c byte offsets, rows, columns."""


def gemm_list_symbol(dtype: np.dtype) -> str:
    """The symbol of gemm_list_ir(dtype, ...)'s function."""
    return f"xlapy_gemm_list_{np.dtype(dtype).char}"


def gemm_list_ir(dtype: np.dtype, wide: bool, role: str, setter: bool) -> str:
    """A module with `void f(i64 table, i64 a, i64 b, i64 c, i64 lo, i64 hi)` (the
    parallel-for's kernel convention): for each gemm e in [lo, hi) of the table at `table`
    (see the file comment; GEMM_LIST_HEAD words, then GEMM_LIST_ENTRY per gemm), calls the
    cblas gemm bound to gemm_target_symbol(dtype, wide, role) (float32 / float64; `wide`:
    64-bit sizes) as `C = A @ B` (alpha 1, beta 0) on `a + a_off`, `b + b_off`,
    `c + c_off`. With `setter` (OpenBLAS's `int openblas_set_num_threads_local(int)`,
    bound to BLAS_SETTER_SYMBOL), OpenBLAS runs on one thread during the calls and its
    previous count is restored after them. The object holds no address."""
    dtype = np.dtype(dtype)
    i64 = ir.IntType(64)
    gemm_sig, scalar = _gemm_signature(dtype, wide)
    index = ir.IntType(64 if wide else 32)
    module = ir.Module(name="xlapy_gemm_list")
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [i64] * 6), gemm_list_symbol(dtype))
    fn.attributes.add("nounwind")
    target = ir.Function(module, gemm_sig, gemm_target_symbol(dtype, wide, role))
    set_sig = ir.FunctionType(_I32, [_I32])
    set_fn = ir.Function(module, set_sig, BLAS_SETTER_SYMBOL) if setter else None
    table, a, b, c, lo, hi = fn.args
    entry = fn.append_basic_block("entry")
    loop = fn.append_basic_block("loop")
    body = fn.append_basic_block("body")
    done = fn.append_basic_block("done")
    bld = ir.IRBuilder(entry)
    words = bld.inttoptr(table, i64.as_pointer())

    def word(at):
        return bld.load(bld.gep(words, [at]))

    def size(value):
        return value if wide else bld.trunc(value, index)

    order, ta, tb = (bld.trunc(word(ir.Constant(i64, w)), _I32) for w in range(3))
    k, lda, ldb, ldc = (size(word(ir.Constant(i64, w))) for w in range(3, GEMM_LIST_HEAD))
    previous = bld.call(set_fn, [ir.Constant(_I32, 1)]) if set_fn is not None else None
    bld.branch(loop)

    bld.position_at_end(loop)
    e = bld.phi(i64)
    e.add_incoming(lo, entry)
    bld.cbranch(bld.icmp_signed("<", e, hi), body, done)

    bld.position_at_end(body)
    first = bld.add(ir.Constant(i64, GEMM_LIST_HEAD), bld.mul(e, ir.Constant(i64, GEMM_LIST_ENTRY)))

    def field(n):
        return word(bld.add(first, ir.Constant(i64, n)))

    pa, pb, pc = (bld.inttoptr(bld.add(base, field(n)), _I8P) for n, base in enumerate((a, b, c)))
    m, n = size(field(3)), size(field(4))
    one, zero = ir.Constant(scalar, 1.0), ir.Constant(scalar, 0.0)
    bld.call(target, [order, ta, tb, m, n, k, one, pa, lda, pb, ldb, zero, pc, ldc])
    e.add_incoming(bld.add(e, ir.Constant(i64, 1)), body)
    bld.branch(loop)

    bld.position_at_end(done)
    if set_fn is not None:
        bld.call(set_fn, [previous])
    bld.ret_void()
    return str(module)
