"""Parallel kernels under load: per-run wall times (min, median, p90) of xlapy's split
kernels and a few whole programs, next to XLA:CPU in the same process, optionally with
busy-loop processes competing for the cores (a shared machine's load, made on purpose).

  PYTHONPATH=. .venv/bin/python benchmarks/parload.py --runs 200 --busy 3
  PYTHONPATH=. .venv/bin/python benchmarks/parload.py --splits 1,2,4,8,16

Kernels (one instruction each, the way the runtime splits them):
  stem_conv      ResNet's 7x7 stride-2 stem over 3 input features (direct conv kernel)
  tanh_4m        elementwise tanh of 4 Mi float32 (a fused kernel over its outer range)
  softmax_rows   softmax over the rows of [2048, 1024] (reductions, then a division)
  matmul_512     one 512 x 512 x 512 product (gemm tiles over the pool)
  maxpool_3x3    a 3x3 stride-2 max pool (reduce-window, a native window kernel)
Programs: any name of benchmarks/cpu_vs_xla.py (-p), e.g. convnet_small_resnet_forward.

--busy N starts N processes that spin (`while True: pass`, nice 0) for the measurement and
stops them after it. Runs alternate in blocks of 5 so both sides see the same load:
  (default)  xlapy against XLA:CPU
  --ab       this tree's split policy against the one before this branch, emulated on a
             second executable of the same program in the same process
  --handoff  runs forced inline on the calling thread against runs handed to the device's
             worker thread (runtime/execution.py's way for programs over 5 ms), which the
             caller's wait takes back when the worker has not started them
             (runtime/device.py's take_back), and handed-off runs never taken back
  --merge    kernels whose outer range merges outer dims (this tree, codegen/emitter.py's
             MERGE_EXTENT) against kernels over their outermost dim only, two executables
             compiled in the same process (program images off, kernel caches forgotten)
--splits T,... prints, for each thread count, how each thunk of the programs is cut
(XLAPY_NUM_THREADS=T in a child process; the machine's timing is not used).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

os.environ.setdefault("JAX_PLATFORMS", "cpu")


def _kernels():
    import jax
    import jax.numpy as jnp
    from jax import lax

    def stem(x, w):
        dims = ("NHWC", "HWIO", "NHWC")
        return lax.conv_general_dilated(x, w, (2, 2), ((3, 3), (3, 3)), dimension_numbers=dims)

    def maxpool(x):
        return lax.reduce_window(x, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "SAME")

    def n(rng, *shape, scale=1.0):
        return (scale * rng.standard_normal(shape)).astype(np.float32)

    return {
        "stem_conv": (stem, lambda r: (n(r, 4, 64, 64, 3), n(r, 7, 7, 3, 64, scale=0.1))),
        "tanh_4m": (jnp.tanh, lambda r: (n(r, 2048, 2048),)),
        "softmax_rows": (jax.nn.softmax, lambda r: (n(r, 2048, 1024),)),
        "matmul_512": (jnp.matmul, lambda r: (n(r, 512, 512), n(r, 512, 512))),
        "maxpool_3x3": (maxpool, lambda r: (n(r, 8, 64, 64, 32),)),
    }


def _programs(names: list[str]):
    """name -> (function, arguments) for the kernels above and cpu_vs_xla programs."""
    kernels = _kernels()
    out = {}
    rng = np.random.default_rng(0)
    for name in names:
        if name in kernels:
            fn, make = kernels[name]
            out[name] = (fn, make(rng))
            continue
        import cpu_vs_xla

        prog = cpu_vs_xla.PROGRAMS[name]
        out[name] = (prog.fn, prog.make_args(rng, cpu_vs_xla.BIG))
    return out


def _hlo(fn, args) -> str:
    import jax

    return jax.jit(fn, keep_unused=True).lower(*args).as_text(dialect="hlo")


def _stats(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)
    return {
        "min": 1e6 * s[0],
        "median": 1e6 * statistics.median(s),
        "p90": 1e6 * s[int(0.9 * (len(s) - 1))],
    }


def measure(names: list[str], runs: int, block: int = 5) -> dict[str, dict]:
    """Per program: xlapy's and XLA's per-run wall microseconds (min, median, p90)."""
    import jax

    from xlapy.tools.bench import time_compile

    results = {}
    for name, (fn, args) in _programs(names).items():
        leaves = jax.tree_util.tree_leaves(args)
        compiled = jax.jit(fn, keep_unused=True).lower(*args).compile()
        device_args = jax.device_put(args)
        _, executable = time_compile("cpu", _hlo(fn, args))
        buffers = [executable.client.buffer_from_pyval(np.asarray(a)) for a in leaves]

        def run_xlapy(executable=executable, buffers=buffers):
            for out in executable.execute([buffers])[0]:
                out.block_until_ready()

        def run_xla(compiled=compiled, device_args=device_args):
            jax.block_until_ready(compiled(*device_args))

        times: dict[str, list[float]] = {"xlapy": [], "xla": []}
        for f in (run_xlapy, run_xla):
            for _ in range(3):
                f()
        while len(times["xlapy"]) < runs:
            for side, f in (("xlapy", run_xlapy), ("xla", run_xla)):
                f()
                for _ in range(block):
                    t = time.perf_counter()
                    f()
                    times[side].append(time.perf_counter() - t)
        results[name] = {side: _stats(s) for side, s in times.items()}
    return results


def _old_run_blocks(body, blocks) -> None:
    """run_blocks as it was before this branch (one pool task per block, the caller runs
    the first and takes back the ones no worker started), for --ab."""
    from xlapy.backends.cpu.runtime import pool

    if not blocks:
        return
    futures = [pool.default_pool().submit(body, lo, hi) for lo, hi in blocks[1:]]
    try:
        body(*blocks[0])
    except BaseException:
        for f in futures:
            if not f.cancel():
                f.exception()
        raise
    for f, (lo, hi) in zip(futures, blocks[1:], strict=True):
        if f.cancel():
            body(lo, hi)
        else:
            f.result()


def _old_policy(executable):
    """Give `executable`'s thunks the split policy from before this branch: a kernel cut
    into one block per thread, split choices by the best time, direct convolutions always
    split; and answer a context that puts back the old run_blocks and library block counts
    around a run."""
    import contextlib

    from xlapy.backends.cpu.runtime import conv_thunk, kernel_thunk, pool, thunk

    class BestTimeChoice(thunk.SplitChoice):
        __slots__ = ()

        def record(self, split: bool, seconds: float) -> None:
            if self.calls == 1:
                return
            self.times[split].append(seconds)
            whole, parts = self.times
            if whole and parts:
                self.split = min(parts) < min(whole)

    class AlwaysSplit(thunk.SplitChoice):
        __slots__ = ()

        def next_split(self) -> bool:
            return True

        def record(self, split: bool, seconds: float) -> None:
            pass

    program = next(iter(executable._programs.values()))
    for t in thunk.walk_thunks(program.compiled.entry):
        if getattr(t, "split_choice", None) is not None:
            t.split_choice = BestTimeChoice()
        if isinstance(t, kernel_thunk.KernelThunk) and t.chunks > 1:
            t.chunks = min(t.kernel.outer_extent, pool.pool_size())
        if isinstance(t, conv_thunk.DirectConvThunk) and t._choice is not None:
            t._choice = AlwaysSplit()
    modules = [m for m in list(sys.modules.values())
               if getattr(m, "run_blocks", None) is pool.run_blocks]  # fmt: skip

    @contextlib.contextmanager
    def old():
        new_run, per_thread = pool.run_blocks, pool.BLOCKS_PER_THREAD
        for m in modules:
            m.run_blocks = _old_run_blocks
        pool.BLOCKS_PER_THREAD = 1
        try:
            yield
        finally:
            for m in modules:
                m.run_blocks = new_run
            pool.BLOCKS_PER_THREAD = per_thread

    return old


def measure_ab(names: list[str], runs: int, block: int = 5) -> dict[str, dict]:
    """Per program: per-run wall microseconds of this tree's split policy ("new") and the
    policy before this branch ("old", _old_policy), two executables of the same program
    timed in alternating blocks in one process."""
    import contextlib

    import jax

    from xlapy.tools.bench import time_compile

    results = {}
    for name, (fn, args) in _programs(names).items():
        text = _hlo(fn, args)
        leaves = [np.asarray(a) for a in jax.tree_util.tree_leaves(args)]
        ways = {}
        for way in ("old", "new"):
            _, executable = time_compile("cpu", text)
            buffers = [executable.client.buffer_from_pyval(a) for a in leaves]
            context = _old_policy(executable) if way == "old" else contextlib.nullcontext

            def run(executable=executable, buffers=buffers, context=context):
                with context():
                    for out in executable.execute([buffers])[0]:
                        out.block_until_ready()

            ways[way] = run
        results[name] = _alternate(ways, runs, block, warm=3)
    return results


def _alternate(ways: dict, runs: int, block: int, warm: int) -> dict[str, dict]:
    """Each way's run `warm` times, then the ways in turn, `block` timed runs each (after
    one untimed run) until every way has `runs`: per way, _stats of its per-run seconds."""
    times: dict[str, list[float]] = {way: [] for way in ways}
    for f in ways.values():
        for _ in range(warm):
            f()
    while min(len(t) for t in times.values()) < runs:
        for way, f in ways.items():
            f()
            for _ in range(block):
                t = time.perf_counter()
                f()
                times[way].append(time.perf_counter() - t)
    return {way: _stats(s) for way, s in times.items()}


def measure_handoff(names: list[str], runs: int, block: int = 5) -> dict[str, dict]:
    """Per program: per-run wall microseconds of executions handed to the device's worker
    thread (what a program over runtime/execution.py's INLINE_MAX_SECONDS gets), of the
    same never taken back by the waiting caller (Device.take_back off), and of executions
    forced inline on the calling thread: three executables of the same program timed in
    alternating blocks in one process."""
    import jax

    from xlapy.tools.bench import time_compile

    results = {}
    for name, (fn, args) in _programs(names).items():
        text = _hlo(fn, args)
        leaves = [np.asarray(a) for a in jax.tree_util.tree_leaves(args)]
        ways = {}
        for way in ("inline", "handed off", "not taken back"):
            _, executable = time_compile("cpu", text)
            buffers = [executable.client.buffer_from_pyval(a) for a in leaves]
            signature = executable._signature
            if way == "not taken back":  # this executable's own client and device
                for device in executable.client.devices():
                    device.take_back = lambda future: False

            def run(executable=executable, buffers=buffers, signature=signature, way=way):
                if way == "inline":  # taken for cheap: runs inline on an idle device
                    signature.cheap_streak, signature.streak_needed = 1 << 30, 1
                else:  # taken for slow: handed to the worker
                    signature.cheap_streak, signature.streak_needed = 0, 1 << 30
                for out in executable.execute([buffers])[0]:
                    out.block_until_ready()

            ways[way] = run
        results[name] = _alternate(ways, runs, block, warm=2)
    return results


def measure_merge(names: list[str], runs: int, block: int = 5) -> dict[str, dict]:
    """Per program: per-run wall microseconds of kernels whose outer range merges outer
    dims ("merged") and of kernels split over their outermost dim only ("outermost",
    emitter.MERGE_EXTENT = 0 while it compiles), timed in alternating blocks in one
    process. Each executable's kernels are its own: program images are off and the
    process's kernel caches are forgotten before each compile (a cached kernel whose outer
    extent differs is a miss)."""
    import jax

    from xlapy.backends.cpu.codegen import emitter
    from xlapy.backends.cpu.jit import kernel
    from xlapy.backends.cpu.runtime.thunk import walk_thunks
    from xlapy.tools.bench import time_compile

    os.environ["XLAPY_EXECUTABLE_CACHE"] = "0"
    results = {}
    for name, (fn, args) in _programs(names).items():
        text = _hlo(fn, args)
        leaves = [np.asarray(a) for a in jax.tree_util.tree_leaves(args)]
        ways, extents = {}, {}
        for way, limit in (("merged", emitter.MERGE_EXTENT), ("outermost", 0)):
            saved, emitter.MERGE_EXTENT = emitter.MERGE_EXTENT, limit
            try:
                kernel._entries.clear()
                _, executable = time_compile("cpu", text)
            finally:
                emitter.MERGE_EXTENT = saved
            buffers = [executable.client.buffer_from_pyval(a) for a in leaves]
            entry = executable.backend_program().compiled.entry
            extents[way] = [k.outer_extent for t in walk_thunks(entry) for k in t.kernels()]

            def run(executable=executable, buffers=buffers):
                for out in executable.execute([buffers])[0]:
                    out.block_until_ready()

            ways[way] = run
        changed = sum(a != b for a, b in zip(extents["merged"], extents["outermost"]))
        results[name] = {**_alternate(ways, runs, block, warm=3), "changed": changed}
    return results


def _busy(count: int) -> list[subprocess.Popen]:
    spin = "while True: pass"
    return [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(count)]


def splits(names: list[str]) -> list[str]:
    """How each thunk of the programs is cut with this process's pool, one line per thunk
    that splits: every split choice is forced to split, and every hand-off to the native
    pool or to run_blocks is recorded with the thunk that made it (found on the stack).
    OpenBLAS's own threads (large single gemms) are not seen."""
    import inspect

    import jax

    from xlapy.backends.cpu.runtime import native_pool, pool, thunk
    from xlapy.tools.bench import time_compile

    seen: dict[str, list[str]] = {}

    def owner() -> str:
        for frame in inspect.stack()[2:]:
            me = frame.frame.f_locals.get("self")
            if isinstance(me, thunk.Thunk) and hasattr(me, "instr"):
                return f"{type(me).__name__} {me.instr.name} {me.instr.shape}"
        return "?"

    native_run = native_pool.NativePool.run

    def record_native(self, function, pointers, extent, blocks):
        seen.setdefault(owner(), []).append(f"native {min(blocks, extent)}/{extent}")
        return native_run(self, function, pointers, extent, blocks)

    python_run = pool.run_blocks

    def record_python(body, blocks):
        seen.setdefault(owner(), []).append(f"python {len(blocks)}")
        return python_run(body, blocks)

    native_pool.NativePool.run = record_native  # type: ignore[method-assign]
    for module in list(sys.modules.values()):
        name = getattr(module, "__name__", "")
        if name.startswith("xlapy.backends.cpu") and getattr(module, "run_blocks", 0) is python_run:
            module.run_blocks = record_python  # type: ignore[attr-defined]
    thunk.SplitChoice.next_split = lambda self: True  # type: ignore[method-assign]
    lines = [f"task_seconds {1e6 * pool.task_seconds():.1f} us (measured here)"]
    for name, (fn, args) in _programs(names).items():
        _, executable = time_compile("cpu", _hlo(fn, args))
        leaves = jax.tree_util.tree_leaves(args)
        buffers = [executable.client.buffer_from_pyval(np.asarray(a)) for a in leaves]
        seen.clear()
        for _ in range(2):  # the first run of a thunk may differ (warm-up)
            for out in executable.execute([buffers])[0]:
                out.block_until_ready()
        for who, ways in seen.items():
            lines.append(f"{name}: {who}: {ways[-1]}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-p", action="append", help="kernel or cpu_vs_xla program (repeat)")
    parser.add_argument("--runs", type=int, default=100, help="timed runs per side")
    parser.add_argument("--busy", type=int, default=0, help="busy-loop processes to start")
    parser.add_argument("--splits", help="thread counts (1,2,4,8,16): print the split table")
    parser.add_argument("--json", action="store_true", help="one JSON object")
    parser.add_argument(
        "--handoff", action="store_true", help="inline runs against runs on the device worker"
    )
    parser.add_argument(
        "--ab", action="store_true", help="this tree's split policy against the one before it"
    )
    parser.add_argument(
        "--merge", action="store_true", help="merged outer dims against the outermost dim only"
    )
    parser.add_argument("--child-splits", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    names = args.p or list(_kernels())
    if args.child_splits:
        print("\n".join(splits(names)))
        return
    if args.splits:
        for t in args.splits.split(","):
            env = {**os.environ, "XLAPY_NUM_THREADS": t}
            cmd = [sys.executable, __file__, "--child-splits"] + [f"-p{n}" for n in names]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True)
            print(f"== {t} threads")
            print(out.stdout, end="")
            if out.returncode:
                print(out.stderr[-2000:], end="")
        return
    busy = _busy(args.busy)
    try:
        load = os.getloadavg()[0]
        how = measure_ab if args.ab else measure_handoff if args.handoff else measure
        how = measure_merge if args.merge else how
        results = how(names, args.runs)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    if args.json:
        print(json.dumps({"load": load, "busy": args.busy, "results": results}))
        return
    print(f"load {load:.1f}, {args.busy} busy processes, {args.runs} runs per side (us)")
    sides, other = ("xlapy", "xla"), "XLA min"
    if args.ab:
        sides, other = ("new", "old"), "old min"
        print("columns: this branch's split policy | the policy before it, same process")
    if args.handoff:
        sides, other = ("inline", "handed off"), "handed"
        print("columns: runs inline on the calling thread | handed to the device worker")
        print("  (then: handed to the worker and never taken back by the waiting caller)")
    if args.merge:
        sides, other = ("merged", "outermost"), "outer min"
        print("columns: merged outer dims | outermost dim only, same process")
    head = f"{'program':30s} {'min':>8s} {'median':>8s} {'p90':>8s} | "
    print(head + f"{other:>8s} {'median':>8s} {'p90':>8s}")
    for name, r in results.items():
        a, b = r[sides[0]], r[sides[1]]
        print(
            f"{name:30s} {a['min']:8.0f} {a['median']:8.0f} {a['p90']:8.0f} | "
            f"{b['min']:8.0f} {b['median']:8.0f} {b['p90']:8.0f}"
            + (f"  ({r['changed']} kernels' extents differ)" if args.merge else "")
        )
        if args.handoff:
            c = r["not taken back"]
            print(f"{'':30s} {'':26s} | {c['min']:8.0f} {c['median']:8.0f} {c['p90']:8.0f}")


if __name__ == "__main__":
    main()
