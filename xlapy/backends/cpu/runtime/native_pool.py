# A parallel-for in native code, for kernels split over the cores: no Python between the
# caller's call and the last block's end.
#
# The pool is a few dozen lines of LLVM IR (below), compiled once per process through
# llvmlite and run by pool_size() - 1 threads made with pthread_create; the calling thread
# is the last worker. One job at a time is published in globals: the kernel's entry address,
# the address of its argument array, the argument count, the outer extent, and one 64-bit
# claim word packing (generation, block count, next block). A thread claims block i with a
# compare-and-swap of that word from (g, n, i) to (g, n, i + 1), only while i < n, so a
# thread that read the word of an earlier job can never claim a block of a later one, and
# the job's other globals cannot change under a claimed block: the caller publishes the
# next job only after every claimed block has counted itself done. Block i covers
# [extent * i / n, extent * (i + 1) / n).
#
# Workers spin briefly on a wake-up counter, then sleep on it with futex(FUTEX_WAIT); the
# caller bumps the counter and calls futex(FUTEX_WAKE) only when some worker sleeps (a
# sleeper count, sequentially consistent on both sides, so no wake-up is lost). The caller
# claims blocks like any worker, then waits for the done count with futex waits of 1 ms at
# most (the last block's thread wakes it), so it cannot hang while the blocks' threads run.
# A caller that finds the pool taken (another Python thread's kernel, or a kernel running
# on a worker of the Python pool that splits too) runs its kernel whole on its own thread
# instead: nothing ever waits for the pool to become free.
#
# The workers never touch Python objects, so they need no GIL and the caller releases it
# for the whole job (a ctypes call). At process exit they are asleep in futex or running a
# block; the code they run is never freed (the engine is kept alive on purpose), so an
# interpreter shutdown cannot pull it from under them. A forked child has no workers: its
# caller claims every block itself.

from __future__ import annotations

import ctypes
import os
import platform
import threading
from collections.abc import Sequence

import llvmlite.binding as llvm

from xlapy.backends.cpu.runtime.pool import pool_size

MAX_ARGS = 24
"""Kernels with more buffer arguments than this run on the Python pool instead."""
SPIN = 4000
"""Pause instructions a worker spins for before it sleeps (a few microseconds)."""
NATIVE_POOL_ENV = "XLAPY_NATIVE_POOL"
"""Environment variable: 0 runs split kernels on the Python pool (run_blocks) instead."""

_FUTEX = {"x86_64": (202, "pause"), "aarch64": (98, "yield")}
_WAIT, _WAKE = 128, 129  # FUTEX_WAIT_PRIVATE, FUTEX_WAKE_PRIVATE


def _call_ir() -> str:
    """@call(fn, args, nargs, lo, hi): the kernel at `fn` on `nargs` addresses read from the
    array at `args`, over [lo, hi)."""
    cases = " ".join(f"i64 {n}, label %c{n}" for n in range(1, MAX_ARGS + 1))
    lines = [
        "define private void @call(i64 %f, i64 %a, i64 %n, i64 %lo, i64 %hi) {",
        "entry:",
        "  %ap = inttoptr i64 %a to i64*",
        f"  switch i64 %n, label %out [ {cases} ]",
    ]
    for n in range(1, MAX_ARGS + 1):
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


def _pool_ir(futex: int, relax: str) -> str:
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

{_call_ir()}

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
  %go = icmp ult i64 %i1, {SPIN}
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
  %go = icmp ult i64 %i1, {SPIN}
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


class NativePool:
    """The compiled pool and its started workers (see the file comment)."""

    def __init__(self, workers: int, futex: int, relax: str):
        from xlapy.backends.cpu.jit.engine import host_target, new_target_machine

        target = host_target()
        llvm.initialize_native_asmparser()  # for the spin loops' pause / yield
        libc = ctypes.CDLL(None)
        for name in ("syscall", "pthread_create"):
            llvm.add_symbol(name, ctypes.cast(getattr(libc, name), ctypes.c_void_p).value)
        module = llvm.parse_assembly(_pool_ir(futex, relax))
        module.triple = target.triple
        module.verify()
        engine = llvm.create_mcjit_compiler(module, new_target_machine())
        engine.finalize_object()
        # never freed: worker threads run this code until the process ends
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(engine))
        self._engine = engine
        start = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_int64)(
            engine.get_function_address("xp_start")
        )
        self._run = ctypes.CFUNCTYPE(
            ctypes.c_int32, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
            ctypes.c_int64,
        )(engine.get_function_address("xp_run"))  # fmt: skip
        self.run_address: int = engine.get_function_address("xp_run")
        """For native callers (a native while loop): `i32 xp_run(i64 kernel, i64 args,
        i64 nargs, i64 extent, i64 blocks)`, what `run` calls (args: the address of an
        array of `nargs` pointers)."""
        self.workers = start(workers)

    def run(self, function: int, pointers: Sequence[int], extent: int, blocks: int) -> bool:
        """The kernel at address `function` on `pointers` over [0, extent), cut into
        `blocks` blocks over the workers and the calling thread; False when the pool was
        taken and the calling thread ran it whole."""
        if not 0 < len(pointers) <= MAX_ARGS or not 0 < blocks < 1 << 20 or extent < 0:
            raise ValueError(
                f"native pool: {len(pointers)} arguments, {blocks} blocks, extent {extent}"
            )
        blocks = max(1, min(blocks, extent))
        args = (ctypes.c_int64 * len(pointers))(*pointers)
        return self._run(function, ctypes.addressof(args), len(pointers), extent, blocks) == 0


_lock = threading.Lock()
_made: list[NativePool | None] = []  # the process's pool once made (None: it has none)


def native_pool() -> NativePool | None:
    """The process's native pool, started on first use (once, whichever threads ask at the
    same time); None with one thread, on machines it has no futex numbers for, or when
    $XLAPY_NATIVE_POOL is 0."""
    if _made:
        return _made[0]
    with _lock:
        if not _made:
            _made.append(_make())
        return _made[0]


def _make() -> NativePool | None:
    if os.environ.get(NATIVE_POOL_ENV, "1").strip() == "0" or pool_size() < 2:
        return None
    found = _FUTEX.get(platform.machine())
    if found is None or platform.system() != "Linux":
        return None
    return NativePool(pool_size() - 1, *found)
