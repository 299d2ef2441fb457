"""Where a cold compile's LLVM time goes: the kernels of one program, compiled in settings.

Compiles MODULE.hlo once (into a temporary kernel cache) while recording the LLVM IR of every
object the JIT builds, then compiles those IRs again in each setting and reports the CPU time
of this thread (time.thread_time, so a machine shared with other jobs inflates it far less
than wall time) spent in LLVM's optimization pipeline and in object emission, and the bytes
of code made:

  separate     one module per kernel (what xlapy does), at level 3
  linked N     groups of N kernels linked into one module each (one object per group)
  level L      one module per kernel, the pipeline at speed level L
  no unroll    level 3 without the loop-unrolling passes

  .venv/bin/python benchmarks/llvm_compile_cost.py MODULE.hlo [--rounds 2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import llvmlite.binding as llvm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from xlapy.backends.cpu.jit import engine as jit
from xlapy.backends.cpu.jit import kernel as kernel_mod
from xlapy.tools.bench import kernel_cache_dir, time_compile


def program_irs(text: str) -> list[tuple[str, str]]:
    """(kernel symbol, LLVM IR) of every object a cold compile of `text` builds."""
    seen: list[tuple[str, str]] = []
    original = jit.compile_object

    def recording(ir_text, use_cache=True, symbol="xla_kernel", key=None):
        seen.append((symbol, ir_text))
        return original(ir_text, use_cache, symbol, key)

    kernel_mod.jit.compile_object = recording  # type: ignore[assignment]
    try:
        with tempfile.TemporaryDirectory() as tmp, kernel_cache_dir(tmp):
            time_compile("cpu", text)
    finally:
        kernel_mod.jit.compile_object = original  # type: ignore[assignment]
    return seen


def compile_groups(irs, group: int, level: int, unroll: bool = True) -> tuple[float, float, int]:
    """(ms in the pipeline, ms emitting objects, object bytes), thread CPU time."""
    tm = jit.new_target_machine()
    opt = emit = 0.0
    size = 0
    for start in range(0, len(irs), group):
        context = llvm.create_context()
        module = None
        for i, (symbol, ir) in enumerate(irs[start : start + group], start):
            part = jit._parse(ir, context, (symbol, f"kernel_{i}"))
            if module is None:
                module = part
            else:
                module.link_in(part)
        assert module is not None
        t0 = time.thread_time()
        pto = llvm.PipelineTuningOptions(speed_level=level)
        pto.loop_vectorization = pto.slp_vectorization = pto.loop_interleaving = True
        pto.loop_unrolling = unroll
        pb = llvm.create_pass_builder(tm, pto)
        pb.getModulePassManager().run(module, pb)
        t1 = time.thread_time()
        size += len(jit._emit_object_unlocked(module, tm))
        opt, emit = opt + t1 - t0, emit + time.thread_time() - t1
    return 1e3 * opt, 1e3 * emit, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("module", help="an HLO text file")
    parser.add_argument("--rounds", type=int, default=2, help="measurements per setting (min)")
    args = parser.parse_args()
    irs = program_irs(Path(args.module).read_text())
    print(f"{args.module}: {len(irs)} objects, {sum(len(ir) for _, ir in irs)} bytes of IR")
    settings = [
        ("separate (level 3)", 1, 3, True),
        ("linked 8", 8, 3, True),
        (f"linked {len(irs)}", max(len(irs), 1), 3, True),
        ("level 2", 1, 2, True),
        ("level 1", 1, 1, True),
        ("no unroll (level 3)", 1, 3, False),
    ]
    print(f"{'setting':22} {'opt ms':>9} {'emit ms':>9} {'total':>9} {'code KB':>9}")
    for name, group, level, unroll in settings:
        runs = [compile_groups(irs, group, level, unroll) for _ in range(args.rounds)]
        opt = min(r[0] for r in runs)
        emit = min(r[1] for r in runs)
        print(f"{name:22} {opt:9.0f} {emit:9.0f} {opt + emit:9.0f} {runs[0][2] / 1024:9.1f}")


if __name__ == "__main__":
    main()
