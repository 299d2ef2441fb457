"""The non-numeric classes of issue 16's outside attack on the runtime, reproducible and opt-in
(the numeric class is runtime_attack_numeric.py). Each class runs its cases as an outside
user would and counts a defect for every crash, hang, wrong result, leak, untyped error
(anything but an XlapyError where the input was bad; MemoryError is allowed for sizes the
machine cannot hold) or bad input accepted:

  misuse    every public Client / Device / MemorySpace / Buffer / LoadedExecutable /
            Future / custom-call API with wrong types, states and values
  threads   N threads x S seconds on one executable mixing execute, to_numpy, donate,
            delete, external_reference and copy_to_device on shared buffers
  leaks     10,000 runs in each mode: device allocator back to its baseline, RSS growth
  cache     disk-cache faults in child processes: tampered, truncated, FIFO, symlink,
            foreign owner, open permissions, concurrent writers, unusable locations
  serial    tampered serialized executables: bit flips, truncation, version and key edits
  custom    custom calls across threads, re-entry, KeyboardInterrupt / SystemExit inside,
            exceptions of odd types, bad results (Python and C targets)
  pjrt      the PJRT plugin's C API through cffi: NULL arguments, wrong struct sizes,
            double destroy, use after destroy (in a child process: a crash is a defect)

Run (not part of CI; XLAPY_ATTACK=1 is required so a test collector never starts it):

    XLAPY_ATTACK=1 PYTHONPATH=. python benchmarks/runtime_attack.py [--classes misuse,...]
        [--seed S] [--threads 8] [--seconds 20] [--runs 10000]

Prints each defect and one line per class: cases run, defects found. Exit status 1 when any
defect is found."""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import traceback
import warnings
from collections.abc import Callable

import numpy as np

from xlapy.errors import XlapyError

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

AFFINE = """HloModule affine, input_output_alias={ {}: (0, {}, may-alias) }
ENTRY e {
  x = f32[256] parameter(0)
  two = f32[] constant(2)
  t = f32[256] broadcast(two), dimensions={}
  m = f32[256] multiply(x, t)
  one = f32[] constant(1)
  o = f32[256] broadcast(one), dimensions={}
  ROOT r = f32[256] add(m, o)
}"""
TWO_PARAMS = """HloModule two
ENTRY e {
  a = f32[4] parameter(0)
  b = s32[4] parameter(1)
  c = f32[4] convert(b)
  ROOT r = f32[4] add(a, c)
}"""
CALLBACK = """HloModule cb
ENTRY e {
  x = f32[4] parameter(0)
  ROOT c = f32[4] custom-call(x), custom_call_target="attack_target"
}"""


def affine(x: np.ndarray) -> np.ndarray:
    return x * np.float32(2) + np.float32(1)


class Tally:
    """Cases run and defects found in one class."""

    def __init__(self, name: str):
        self.name, self.cases, self.defects = name, 0, []

    def defect(self, case: str, what: str) -> None:
        self.defects.append(f"{case}: {what}")
        print(f"  DEFECT [{self.name}] {case}: {what}", flush=True)

    def summary(self) -> str:
        return f"{self.name:8s} cases {self.cases:6d}  defects {len(self.defects)}"


def bounded(fn: Callable[[], object], seconds: float = 30.0):
    """("ok", value) | ("error", exception) | ("hang", None): fn() on a daemon thread."""
    box: list = []

    def go() -> None:
        try:
            box.append(("ok", fn()))
        except BaseException as e:  # the outcome under test
            box.append(("error", e))

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(seconds)
    return box[0] if box else ("hang", None)


def expect_error(tally: Tally, case: str, fn: Callable[[], object], allow=()) -> None:
    """Bad input: an XlapyError (or one of `allow`) is the only right outcome."""
    tally.cases += 1
    kind, value = bounded(fn)
    if kind == "hang":
        tally.defect(case, "hangs (30 s)")
    elif kind == "ok":
        tally.defect(case, f"accepted, returned {value!r:.80}")
    elif not isinstance(value, (XlapyError, *allow)):
        tally.defect(case, f"untyped {type(value).__name__}: {value}")


def expect_ok(tally: Tally, case: str, fn: Callable[[], object], check=None) -> None:
    tally.cases += 1
    kind, value = bounded(fn)
    if kind == "hang":
        tally.defect(case, "hangs (30 s)")
    elif kind == "error":
        tally.defect(case, f"fails: {type(value).__name__}: {value}")
    elif check is not None and not check(value):
        tally.defect(case, f"wrong result {value!r:.120}")


# -- misuse ----------------------------------------------------------------------------------
def attack_misuse(args) -> Tally:
    from xlapy.runtime import (
        Client,
        CompileOptions,
        HostBufferSemantics,
        register_custom_call,
        wait_all,
    )

    t = Tally("misuse")
    rng = np.random.default_rng(args.seed)
    x = rng.standard_normal(256).astype(np.float32)
    c = Client("cpu", device_count=2)
    other = Client("cpu")
    exe = c.compile(AFFINE)
    two = c.compile(TWO_PARAMS)
    buf = lambda a=None: c.buffer_from_pyval(x if a is None else a)  # noqa: E731
    d0, d1 = c.devices()
    bad_values = [None, -1, 1.5, float("nan"), "0", b"0", True, 1 << 70, [0], object()]

    # clients
    for bad in ("tpu", None, 5, b"cpu"):
        expect_error(t, f"Client(platform={bad!r})", lambda bad=bad: Client(bad))
    for bad in (0, -1, 1.5, "2", None, float("nan"), 1 << 40, True):
        expect_error(t, f"Client(device_count={bad!r})", lambda bad=bad: Client("cpu", bad))
    expect_error(t, "Client(distributed='tcp')", lambda: Client("cpu", distributed="tcp"))
    for bad in bad_values:
        expect_error(t, f"lookup_device({bad!r})", lambda bad=bad: c.lookup_device(bad))
        expect_error(t, f"memory_stats({bad!r})", lambda bad=bad: c.memory_stats(bad))
    for r, p in ((0, 1), (-1, 1), (1.5, 1), (3, 1), (1, "1"), (None, 1), (1 << 62, 1)):
        expect_error(
            t, f"default_device_assignment({r!r}, {p!r})",
            lambda r=r, p=p: c.default_device_assignment(r, p),
        )  # fmt: skip
    expect_error(t, "inline_execution='no'", lambda: setattr(c, "inline_execution", "no"))

    # transfers
    host_bad = {
        "object array": np.array([object()]),
        "str": "abc",
        "None": None,
        "dict": {"a": 1},
        "unicode array": np.array(["a", "b"]),
        "datetime array": np.array(["2026-01-01"], dtype="datetime64[D]"),
        "ragged list": [[1, 2], [3]],
        "void": np.zeros(2, dtype="V4"),
        "structured": np.zeros(2, dtype=[("a", "f4")]),
        "huge broadcast": np.broadcast_to(np.float32(1), (1 << 40,)),
    }
    for name, value in host_bad.items():
        expect_error(
            t, f"buffer_from_pyval({name})", lambda v=value: c.buffer_from_pyval(v),
            allow=(MemoryError,),
        )  # fmt: skip
    for bad in (0, "cpu:0", other.devices()[0], other.devices()[0].default_memory_space, 1.5):
        expect_error(
            t, f"buffer_from_pyval(device={bad!r:.40})",
            lambda bad=bad: c.buffer_from_pyval(x, bad),
        )  # fmt: skip
    for bad in ("bogus", 7, None):
        expect_error(
            t, f"buffer_from_pyval(semantics={bad!r})",
            lambda bad=bad: c.buffer_from_pyval(x, None, bad),
        )  # fmt: skip
    expect_ok(
        t, "buffer_from_pyval(zero-copy, non-contiguous)",
        lambda: c.buffer_from_pyval(x[::2], None, HostBufferSemantics.IMMUTABLE_ZERO_COPY)
        .to_numpy(), lambda v: np.array_equal(v, x[::2]),
    )  # fmt: skip
    for bad in ("hbm", None, 3, "DEVICE"):
        expect_error(t, f"device.memory_space({bad!r})", lambda bad=bad: d0.memory_space(bad))

    # compilation
    programs = {
        "None": None, "int": 42, "bad utf-8": b"\xff\xfe\x00", "empty": "", "header only":
        "HloModule m", "list": [AFFINE], "garbage": "ENTRY {{{",
        "huge shape": "HloModule h\nENTRY e { ROOT p = f32[9223372036854775807,2] parameter(0) }",
        "negative dim": "HloModule h\nENTRY e { ROOT p = f32[-4] parameter(0) }",
        "nan dim": "HloModule h\nENTRY e { ROOT p = f32[nan] parameter(0) }",
    }  # fmt: skip
    for name, program in programs.items():
        expect_error(t, f"compile({name})", lambda p=program: c.compile(p))
    options = {
        "str": "fast",
        "replicas=-1": lambda: CompileOptions.make(num_replicas=-1),
        "replicas=1.5": lambda: CompileOptions.make(num_replicas=1.5),
        "replicas=3 on 2 devices": lambda: CompileOptions.make(num_replicas=3),
        "assignment [[5]]": lambda: CompileOptions.make(device_assignment=[[5]]),
        "assignment [['a']]": lambda: CompileOptions.make(device_assignment=[["a"]]),
        "assignment [[0, 0]]": lambda: CompileOptions.make(
            num_partitions=2, device_assignment=[[0, 0]]
        ),
        "unknown backend option": lambda: CompileOptions.make(backend_options={"bogus": 1}),
        "backend option object": lambda: CompileOptions.make(backend_options={"x": object()}),
        "dump_to int": lambda: CompileOptions.make(debug_options={"xla_dump_to": 5}),
        "denormals nan": lambda: CompileOptions.make(backend_options={"denormals": float("nan")}),
        "collective_timeout -1": lambda: CompileOptions.make(
            num_replicas=2, backend_options={"collective_timeout": "soon"}
        ),
    }
    for name, make in options.items():

        def compile_with(make=make):
            return c.compile(AFFINE, make() if callable(make) else make)

        expect_error(t, f"compile(options {name})", compile_with)

    # execution
    execute_bad = {
        "too few arguments": lambda: exe.execute([[]]),
        "too many arguments": lambda: exe.execute([[buf(), buf()]]),
        "argument lists for 2 devices": lambda: exe.execute([[buf()], [buf()]]),
        "numpy argument": lambda: exe.execute([[x]]),
        "None argument": lambda: exe.execute([[None]]),
        "argument_lists a buffer": lambda: exe.execute(buf()),
        "argument_lists None": lambda: exe.execute(None),
        "wrong dtype": lambda: exe.execute([[buf(x.astype(np.float64))]]),
        "wrong shape": lambda: exe.execute([[buf(x[:8])]]),
        "wrong rank": lambda: exe.execute([[buf(x.reshape(16, 16))]]),
        "other client's buffer": lambda: exe.execute([[other.buffer_from_pyval(x)]]),
        "buffer on device 1": lambda: exe.execute([[c.buffer_from_pyval(x, d1)]]),
        "tuple for array": lambda: exe.execute([[(buf(),)]]),
        "swapped types": lambda: two.execute(
            [[buf(np.zeros(4, np.int32)), buf(np.ones(4, np.float32))]]
        ),
        "portable on other client": lambda: exe.execute_portable([buf()], other.devices()[0]),
        "portable on None": lambda: exe.execute_portable([buf()], None),
        "portable on int": lambda: exe.execute_portable([buf()], 1),
        "sharded on device 1": lambda: exe.execute_sharded([buf()], d1),
        "sharded on None": lambda: exe.execute_sharded([buf()], None),
    }
    for name, fn in execute_bad.items():
        expect_error(t, f"execute({name})", fn)
    for bad in ([5], [-1], [1.5], ["0"], [float("nan")], [True], [None], 0, "0", [[0]], [0, 0]):
        expect_error(
            t, f"execute(donate={bad!r})", lambda bad=bad: exe.execute([[buf()]], donate=bad)
        )
        if bad != [0, 0]:  # vetoing a parameter twice is harmless
            expect_error(
                t, f"execute(non_donatable={bad!r})",
                lambda bad=bad: exe.execute([[buf()]], non_donatable=bad),
            )  # fmt: skip
    expect_error(
        t, "execute(strict_donation='yes')",
        lambda: exe.execute([[buf()]], strict_donation="yes"),
    )  # fmt: skip

    def donated_twice():
        b = buf()
        return exe.execute([[b]], donate=[0]) and exe.execute([[b]], donate=[0])

    expect_error(t, "execute(donated buffer)", donated_twice)

    def deleted():
        b = buf()
        b.delete()
        return exe.execute([[b]])

    expect_error(t, "execute(deleted buffer)", deleted)

    def donate_while_referenced():
        b = buf()
        with b.external_reference():
            return exe.execute([[b]], donate=[0])

    expect_error(t, "donate while externally referenced", donate_while_referenced)

    # buffers in every state
    def dead(state: str):
        b = buf()
        if state == "deleted":
            b.delete()
        else:
            exe.execute([[b]], donate=[0])
        return b

    for state in ("deleted", "donated"):
        uses = {
            "to_numpy": lambda b: b.to_numpy(),
            "copy_to_host": lambda b: b.copy_to_host().result(10),
            "copy_to_device": lambda b: b.copy_to_device(d1).to_numpy(),
            "external_reference": lambda b: b.external_reference().__enter__(),
            "ready": lambda b: b.ready(),
            "block_until_ready": lambda b: b.block_until_ready(),
            "unsafe_buffer_pointer": lambda b: b.unsafe_buffer_pointer(),
            "__array__": lambda b: np.asarray(b),
            "__dlpack__": lambda b: b.__dlpack__(),
        }
        for name, use in uses.items():
            expect_error(t, f"{state} buffer .{name}", lambda use=use, s=state: use(dead(s)))
    for bad in (None, 0, "1", d0.default_memory_space):
        expect_error(t, f"copy_to_device({bad!r:.40})", lambda bad=bad: buf().copy_to_device(bad))
    for bad in (None, "device", d0):
        expect_error(
            t, f"copy_to_memory_space({bad!r:.40})",
            lambda bad=bad: buf().copy_to_memory_space(bad),
        )  # fmt: skip
    c.register_custom_call("attack_slow", lambda ins, o: (time.sleep(0.3), ins[0])[1])
    for bad in (-1, "1", float("nan")):
        expect_error(
            t, f"ready().result(timeout={bad!r}) of pending",
            lambda bad=bad: c.compile(CALLBACK_SLOW).execute([[buf(np.ones(4, np.float32))]])[0][
                0
            ].ready().result(bad),
            allow=(TimeoutError,),
        )  # fmt: skip
    expect_error(t, "wait_all(None)", lambda: wait_all(None))
    expect_error(t, "wait_all([1, 2])", lambda: wait_all([1, 2]))

    # custom-call registration
    targets = {
        "int 42": 42, "zero": 0, "None": None, "str": "abc", "float": 1.5, "bytes": b"x",
        "ctypes NULL": ctypes.c_void_p(0), "negative": -1, "huge": 1 << 70,
    }  # fmt: skip
    for name, fn in targets.items():
        expect_error(
            t, f"register_custom_call(fn={name})",
            lambda fn=fn, name=name: c.register_custom_call(f"t_{abs(hash(name))}", fn),
        )  # fmt: skip
    for name in (None, 5, "", b"x"):
        expect_error(
            t, f"register_custom_call(name={name!r})",
            lambda name=name: c.register_custom_call(name, lambda ins, o: ins[0]),
        )  # fmt: skip
    for bad in ("TPU", None, 3):
        expect_error(
            t, f"register_custom_call(platform={bad!r})",
            lambda bad=bad: c.register_custom_call("p", lambda ins, o: ins[0], bad),
        )  # fmt: skip
    for bad in ("bogus", 99, -1, 1.5):
        expect_error(
            t, f"register_custom_call(api_version={bad!r})",
            lambda bad=bad: c.register_custom_call("v", lambda ins, o: ins[0], "Host", bad),
        )  # fmt: skip
    c.register_custom_call("twice", lambda ins, o: ins[0])
    expect_error(
        t, "register_custom_call twice", lambda: c.register_custom_call("twice", lambda i, o: i)
    )
    expect_error(t, "global register int 42", lambda: register_custom_call("g42", 42))

    # a closed client
    closed = Client("cpu", device_count=2)
    cexe = closed.compile(AFFINE)
    cbuf = closed.buffer_from_pyval(x)
    closed.close()
    after_close = {
        "compile": lambda: closed.compile(TWO_PARAMS),
        "buffer_from_pyval": lambda: closed.buffer_from_pyval(x),
        "execute": lambda: cexe.execute([[cbuf]]),
        "execute_portable": lambda: cexe.execute_portable([cbuf], closed.devices()[1]),
        "copy_to_device": lambda: cbuf.copy_to_device(closed.devices()[1]).to_numpy(),
        "deserialize": lambda: closed.deserialize_executable(cexe.serialize()),
        "register_custom_call": lambda: closed.register_custom_call("z", lambda i, o: i[0]),
    }
    for name, fn in after_close.items():
        expect_error(t, f"closed client: {name}", fn)
    expect_ok(
        t, "closed client: old buffer readable", cbuf.to_numpy, lambda v: np.array_equal(v, x)
    )
    expect_ok(t, "close twice", closed.close)
    other.close()
    c.close()
    return t


CALLBACK_SLOW = CALLBACK.replace("attack_target", "attack_slow")


# -- threads ---------------------------------------------------------------------------------
def attack_threads(args) -> Tally:
    from xlapy.runtime import BufferDeletedError, Client, DonationError

    t = Tally("threads")
    c = Client("cpu", device_count=2)
    exe = c.compile(AFFINE)
    d0, d1 = c.devices()
    rng = np.random.default_rng(args.seed)
    shared_lock = threading.Lock()
    pool: list[tuple[object, np.ndarray]] = []

    def fresh():
        v = rng.standard_normal(256).astype(np.float32)
        return c.buffer_from_pyval(v), v

    for _ in range(8):
        pool.append(fresh())
    expected = (BufferDeletedError, DonationError)
    deadline = time.monotonic() + args.seconds
    counts = [0] * args.threads
    errors: list[str] = []

    def pick():
        with shared_lock:
            return pool[random.randrange(len(pool))]

    def replace(item) -> None:
        with shared_lock:
            if item in pool:
                pool[pool.index(item)] = fresh()

    def worker(k: int) -> None:
        r = random.Random(args.seed * 100 + k)
        while time.monotonic() < deadline:
            op = r.randrange(7)
            item = pick()
            b, v = item
            try:
                if op == 0:  # execute on a fresh input
                    w = np.float32(r.random()) * np.ones(256, np.float32)
                    out = exe.execute([[c.buffer_from_pyval(w)]])[0][0].to_numpy()
                    if not np.array_equal(out, affine(w)):
                        errors.append("execute: wrong result")
                elif op == 1:  # read a shared buffer
                    got = b.to_numpy()
                    if not np.array_equal(got, v):
                        errors.append("to_numpy of a shared buffer: torn or changed data")
                elif op == 2:  # donate a shared buffer
                    out = exe.execute([[b]], donate=[0])[0][0]
                    replace(item)
                    if not np.array_equal(out.to_numpy(), affine(v)):
                        errors.append("donated execute: wrong result")
                elif op == 3:
                    b.delete()
                    replace(item)
                elif op == 4:
                    with b.external_reference() as view:
                        first = view.copy()
                        time.sleep(0.0005)
                        if not np.array_equal(view, first) or not np.array_equal(first, v):
                            errors.append("external reference changed while held")
                elif op == 5:
                    moved = b.copy_to_device(d1 if r.random() < 0.5 else d0)
                    if not np.array_equal(moved.to_numpy(), v):
                        errors.append("copy_to_device: wrong data")
                else:
                    out = exe.execute_portable([b.copy_to_device(d1)], d1)[0].to_numpy()
                    if not np.array_equal(out, affine(v)):
                        errors.append("execute_portable on device 1: wrong result")
            except expected:
                pass
            except BaseException as e:  # every other outcome is a defect
                errors.append(f"op {op}: {type(e).__name__}: {e}")
            counts[k] += 1

    threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(args.threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(args.seconds + 60)
    t.cases = sum(counts)
    if any(th.is_alive() for th in threads):
        t.defect("threads", "a thread is still running 60 s after the deadline (deadlock)")
    for what in sorted(set(errors)):
        t.defect("threads", f"{what} (x{errors.count(what)})")
    expect_ok(t, "client works afterwards", lambda: exe.execute([[fresh()[0]]])[0][0].to_numpy())
    c.close()
    return t


# -- leaks -----------------------------------------------------------------------------------
def rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def attack_leaks(args) -> Tally:
    from xlapy.runtime import Client

    t = Tally("leaks")
    c = Client("cpu", device_count=2)
    exe = c.compile(AFFINE)
    fail = Client("cpu")

    def boom(ins, opaque):
        raise ValueError("attack: custom call fails")

    fail.register_custom_call("attack_target", boom)
    failing = fail.compile(CALLBACK)
    d1 = c.devices()[1]
    x = np.random.default_rng(args.seed).standard_normal(256).astype(np.float32)
    blob = exe.serialize()

    def run_execute():
        exe.execute([[c.buffer_from_pyval(x)]])[0][0].to_numpy()

    def run_donate():
        exe.execute([[c.buffer_from_pyval(x)]], donate=[0])[0][0].to_numpy()

    def run_delete():
        b = c.buffer_from_pyval(x)
        exe.execute([[b]])
        b.delete()

    def run_external():
        b = c.buffer_from_pyval(x)
        with b.external_reference() as v:
            v.sum()
        b.delete()

    def run_copy():
        c.buffer_from_pyval(x).copy_to_device(d1).to_numpy()

    def run_copy_to_host():
        c.buffer_from_pyval(x).copy_to_host().result()

    def run_failed():
        out = failing.execute([[fail.buffer_from_pyval(x[:4])]])[0][0]
        with contextlib.suppress(XlapyError):
            out.to_numpy()

    def run_async():
        outs = [exe.execute_portable([c.buffer_from_pyval(x, d1)], d1)[0] for _ in range(4)]
        for o in outs:
            o.to_numpy()

    def run_deserialize():
        c.deserialize_executable(blob).execute([[c.buffer_from_pyval(x)]])[0][0].to_numpy()

    def run_bad_donation():
        b = c.buffer_from_pyval(x)
        with contextlib.suppress(XlapyError):
            exe.execute([[b, b]], donate=[0])
        with contextlib.suppress(XlapyError):
            exe.execute([[c.buffer_from_pyval(x[:8])]])

    modes = {
        "execute": run_execute, "donate": run_donate, "delete": run_delete,
        "external_reference": run_external, "copy_to_device": run_copy,
        "copy_to_host": run_copy_to_host, "failed execution": run_failed,
        "async on device 1": run_async, "deserialize": run_deserialize,
        "rejected calls": run_bad_donation,
    }  # fmt: skip
    for name, run in modes.items():
        runs = args.runs if name != "deserialize" else max(args.runs // 20, 10)
        for _ in range(min(200, runs)):  # warm
            run()
        gc.collect()
        base_rss = rss_kib()
        base = [d.memory_stats() for d in (*c.devices(), *fail.devices())]
        start = time.perf_counter()
        for _ in range(runs):
            run()
        seconds = time.perf_counter() - start
        time.sleep(0.05)  # let the workers finish their last task
        after = [d.memory_stats() for d in (*c.devices(), *fail.devices())]
        grown = rss_kib() - base_rss
        t.cases += runs
        for before, now in zip(base, after, strict=True):
            if now.bytes_in_use != before.bytes_in_use:
                t.defect(name, f"allocator {before.bytes_in_use} -> {now.bytes_in_use} bytes")
        if grown * 1024 / runs > 256:
            t.defect(name, f"RSS grew {grown} KiB over {runs} runs")
        print(
            f"  leaks {name:20s} {runs:6d} runs {seconds:6.2f} s  RSS {grown:+6d} KiB  "
            f"in use {after[0].bytes_in_use} B",
            flush=True,
        )
    c.close()
    fail.close()
    return t


# -- cache -----------------------------------------------------------------------------------
CHILD = textwrap.dedent(
    """
    import sys, warnings, numpy as np
    warnings.simplefilter("always")
    from xlapy.runtime import Client
    c = Client("cpu")
    text = open(sys.argv[1]).read()
    x = np.linspace(-3, 3, 256, dtype=np.float32)
    out = c.compile(text).execute([[c.buffer_from_pyval(x)]])[0][0].to_numpy()
    want = np.sin(x) * np.float32(3) + x
    ok = np.allclose(out, want, rtol=1e-5, atol=1e-6)
    print("RESULT", "ok" if ok else "WRONG", flush=True)
    """
)
CACHE_PROGRAM = """HloModule cached
ENTRY e {
  x = f32[256] parameter(0)
  s = f32[256] sine(x)
  three = f32[] constant(3)
  t = f32[256] broadcast(three), dimensions={}
  m = f32[256] multiply(s, t)
  ROOT r = f32[256] add(m, x)
}"""


def child_run(cache: str, program: str, timeout: float = 120) -> tuple[str, str]:
    """Run the cache child; ("ok" | "WRONG" | "crash rc" | "hang", stderr)."""
    env = {**os.environ, "XLAPY_CACHE_DIR": cache, "PYTHONPATH": ROOT}
    try:
        p = subprocess.run(
            [sys.executable, "-c", CHILD, program], env=env, capture_output=True, text=True,
            timeout=timeout,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return "hang", ""
    if "RESULT ok" in p.stdout:
        return "ok", p.stderr
    if "RESULT WRONG" in p.stdout:
        return "WRONG", p.stderr
    return f"crash rc={p.returncode}", p.stderr[-400:]


def attack_cache(args) -> Tally:
    t = Tally("cache")
    work = tempfile.mkdtemp(prefix="xlapy-attack-")
    program = os.path.join(work, "program.hlo")
    with open(program, "w") as f:
        f.write(CACHE_PROGRAM)

    def check(case: str, cache: str, warn: str | None = None) -> None:
        t.cases += 1
        outcome, err = child_run(cache, program)
        if outcome != "ok":
            t.defect(case, f"{outcome} {err.strip()[-300:]}")
        elif warn is not None and warn not in err:
            t.defect(case, f"no warning containing {warn!r}: {err.strip()[-200:]}")

    def warm(name: str) -> tuple[str, list[str]]:
        cache = os.path.join(work, name)
        check(f"{name}: cold", cache)
        entries = sorted(os.path.join(dp, f) for dp, _, fs in os.walk(cache) for f in fs)
        return cache, entries

    cache, entries = warm("base")
    check("base: warm", cache)
    if not entries:
        t.defect("base", "the cache wrote no entries")
    print(f"  cache: {len(entries)} entries", flush=True)
    rng = random.Random(args.seed)
    faults = {
        "flip a byte": lambda p: _flip(p, rng),
        "flip the last byte": lambda p: _flip(p, rng, last=True),
        "truncate to half": lambda p: _truncate(p, 0.5),
        "truncate to 0": lambda p: _truncate(p, 0.0),
        "FIFO": lambda p: (os.unlink(p), os.mkfifo(p)),
        "symlink to /dev/zero": lambda p: (os.unlink(p), os.symlink("/dev/zero", p)),
        "symlink to another entry": lambda p: _relink(p, entries),
        "directory": lambda p: (os.unlink(p), os.mkdir(p)),
        "mode 000": lambda p: os.chmod(p, 0),
        "owned by nobody": lambda p: os.chown(p, 65534, 65534),
        "world-writable entry": lambda p: os.chmod(p, 0o666),
        "append junk": lambda p: _append(p, b"\0" * 4096),
        "swap with another entry": lambda p: _swap(p, entries),
    }
    for name, fault in faults.items():
        for k, entry in enumerate(entries):
            cache_k = os.path.join(work, f"fault-{abs(hash(name)) % 10**6}-{k}")
            shutil.copytree(cache, cache_k, symlinks=True)
            target = os.path.join(cache_k, os.path.relpath(entry, cache))
            try:
                fault(target)
            except OSError as e:
                print(f"  cache: cannot apply {name}: {e}", flush=True)
                continue
            check(f"{name} on {os.path.basename(entry)}", cache_k)
            shutil.rmtree(cache_k, ignore_errors=True)
    # the directory itself
    layouts = {
        "dir mode 777": (lambda d: os.chmod(d, 0o777), "writable by other users"),
        "dir owned by nobody": (lambda d: os.chown(d, 65534, 65534), "owned by"),
        "dir read-only 500": (lambda d: os.chmod(d, 0o500), None),
        "dir is a file": (lambda d: (shutil.rmtree(d), open(d, "w").close()), None),
        "dir is a symlink to /dev/null": (
            lambda d: (shutil.rmtree(d), os.symlink("/dev/null", d)), None
        ),
        "dir under /proc": (None, None),
        "dir on /dev/full": (None, None),
    }  # fmt: skip
    for name, (change, warn) in layouts.items():
        cache_k = os.path.join(work, f"layout-{abs(hash(name)) % 10**6}")
        shutil.copytree(cache, cache_k, symlinks=True)
        if change is not None:
            change(cache_k)
        elif "proc" in name:
            cache_k = "/proc/self/xlapy-cache"
        else:
            cache_k = "/dev/full/xlapy-cache"
        check(name, cache_k, warn)
    # a full disk: a 64 KiB file system cannot be mounted without privileges everywhere;
    # RLIMIT_FSIZE makes every write past 0 bytes fail the same way (EFBIG)
    t.cases += 1
    full = os.path.join(work, "full")
    env = {**os.environ, "XLAPY_CACHE_DIR": full, "PYTHONPATH": ROOT}
    code = "import resource, signal; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
    code += "resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0)); exec(open(%r).read())"
    child_file = os.path.join(work, "child.py")
    with open(child_file, "w") as f:
        f.write(CHILD)
    p = subprocess.run(
        [sys.executable, "-c", code % child_file, program], env=env, capture_output=True,
        text=True, timeout=180,
    )  # fmt: skip
    if "RESULT ok" not in p.stdout:
        t.defect("full disk (RLIMIT_FSIZE=0)", f"rc={p.returncode} {p.stderr[-300:]}")
    # concurrent writers: several processes, cold cache, the same programs at once
    t.cases += 1
    shared = os.path.join(work, "concurrent")
    env = {**os.environ, "XLAPY_CACHE_DIR": shared, "PYTHONPATH": ROOT}
    procs = [
        subprocess.Popen(
            [sys.executable, child_file, program],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    for p2 in procs:
        out, err = p2.communicate(timeout=300)
        if "RESULT ok" not in out:
            t.defect("concurrent writers", f"rc={p2.returncode} {err[-300:]}")
    check("after concurrent writers", shared)
    shutil.rmtree(work, ignore_errors=True)
    return t


def _flip(path: str, rng: random.Random, last: bool = False) -> None:
    with open(path, "rb") as f:
        data = bytearray(f.read())
    if not data:
        return
    i = len(data) - 1 if last else rng.randrange(len(data))
    data[i] ^= 1 << rng.randrange(8)
    with open(path, "wb") as f:
        f.write(bytes(data))


def _append(path: str, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def _truncate(path: str, fraction: float) -> None:
    size = os.path.getsize(path)
    os.truncate(path, int(size * fraction))


def _relink(path: str, entries: list[str]) -> None:
    others = [e for e in entries if os.path.basename(e) != os.path.basename(path)]
    if others:
        source = os.path.join(os.path.dirname(path), os.path.basename(others[0]))
        os.unlink(path)
        os.symlink(source, path)


def _swap(path: str, entries: list[str]) -> None:
    others = [
        e for e in entries
        if os.path.basename(e) != os.path.basename(path)
        and os.path.splitext(e)[1] == os.path.splitext(path)[1]
    ]  # fmt: skip
    if others:
        source = os.path.join(os.path.dirname(path), os.path.basename(others[0]))
        shutil.copyfile(source, path)


# -- serialized executables -----------------------------------------------------------------
def attack_serial(args) -> Tally:
    import hashlib
    import struct

    from xlapy.runtime import Client

    t = Tally("serial")
    c = Client("cpu")
    exe = c.compile(AFFINE)
    blob = exe.serialize()
    x = np.random.default_rng(args.seed).standard_normal(256).astype(np.float32)
    rng = random.Random(args.seed)

    def load_and_run(data: bytes):
        return c.deserialize_executable(data).execute([[c.buffer_from_pyval(x)]])[0][0].to_numpy()

    expect_ok(t, "round trip", lambda: load_and_run(blob), lambda v: np.array_equal(v, affine(x)))
    for _ in range(args.flips):
        data = bytearray(blob)
        i = rng.randrange(len(data))
        data[i] ^= 1 << rng.randrange(8)
        expect_error(t, f"bit flip at {i}", lambda d=bytes(data): load_and_run(d))
    for n in sorted({0, 1, 7, 8, 12, 16, 23, 24, len(blob) // 2, len(blob) - 32, len(blob) - 1}):
        expect_error(t, f"truncated to {n}", lambda n=n: load_and_run(blob[:n]))
    expect_error(t, "trailing byte", lambda: load_and_run(blob + b"\0"))
    meta_len = struct.unpack_from("<I", blob, 12)[0]
    hlo_len = struct.unpack_from("<Q", blob, 16)[0]
    meta = json.loads(blob[24 : 24 + meta_len])
    hlo = blob[24 + meta_len : 24 + meta_len + hlo_len].decode()

    def rebuild(
        meta=meta, hlo=hlo, version=1, magic=b"XLAPYEXE", fix_hash=True, raw=None, raw_hlo=None
    ) -> bytes:
        m = json.dumps(meta).encode() if raw is None else raw
        h = hlo.encode() if raw_hlo is None else raw_hlo
        body = magic + struct.pack("<IIQ", version, len(m), len(h)) + m + h
        return body + (hashlib.sha256(body).digest() if fix_hash else b"\0" * 32)

    expect_ok(
        t, "rebuilt unchanged", lambda: load_and_run(rebuild()),
        lambda v: np.array_equal(v, affine(x)),
    )  # fmt: skip
    edits = {
        "version 2": rebuild(version=2),
        "version 0": rebuild(version=0),
        "version 2**32-1": rebuild(version=2**32 - 1),
        "magic": rebuild(magic=b"XLAPYEXF"),
        "hash zeroed": rebuild(fix_hash=False),
        "platform interpreter": rebuild(meta={**meta, "platform": "interpreter"}),
        "platform missing": rebuild(meta={k: v for k, v in meta.items() if k != "platform"}),
        "fingerprint changed": rebuild(meta={**meta, "fingerprint": "0" * 64}),
        "options not a dict": rebuild(meta={**meta, "options": 5}),
        "options bogus keys": rebuild(meta={**meta, "options": {"num_replicas": "x"}}),
        "metadata a list": rebuild(meta=[1, 2]),  # type: ignore[arg-type]
        "metadata nested deep": rebuild(raw=b"[" * 100_000 + b"]" * 100_000),
        "metadata not json": rebuild(raw=b"{'platform': 'cpu'}"),
        "metadata huge number": rebuild(raw=b"1" + b"0" * 100_000),
        "hlo: different program, same fingerprint": rebuild(hlo=hlo.replace("multiply", "add")),
        "hlo: custom call to a C address": rebuild(
            hlo=hlo.replace(
                "ROOT r = f32[256] add(m, o)",
                'ROOT r = f32[256] custom-call(m), custom_call_target="0x41414141"',
            )
        ),
        "hlo: not utf-8": rebuild(raw_hlo=b"HloModule \xff\xfe"),
        "hlo: empty": rebuild(hlo=""),
    }
    for name, data in edits.items():
        expect_error(t, name, lambda d=data: load_and_run(d))
    for bad in ("text", None, 5, bytearray(b"x"), memoryview(b"XLAPYEXE")):
        expect_error(t, f"deserialize({type(bad).__name__})", lambda b=bad: load_and_run(b))
    c.close()
    return t


# -- custom calls ----------------------------------------------------------------------------
def attack_custom(args) -> Tally:
    from xlapy.runtime import Client

    t = Tally("custom")
    x = np.arange(4, dtype=np.float32)

    # many threads, one Python target and one C target, each thread its own device
    calls = [0]
    lock = threading.Lock()
    for kind in ("python", "c"):
        c = Client("cpu", device_count=4)
        calls[0] = 0

        def py_target(ins, opaque):
            with lock:
                calls[0] += 1
            return ins[0] * 2

        proto = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p))

        def c_body(out, ins):
            src = (ctypes.c_float * 4).from_address(ins[0])
            dst = (ctypes.c_float * 4).from_address(out)
            for i in range(4):
                dst[i] = src[i] * 2
            with lock:
                calls[0] += 1

        c_target = proto(c_body)
        if kind == "python":
            c.register_custom_call("attack_target", py_target)
        else:
            c.register_custom_call("attack_target", ctypes.cast(c_target, ctypes.c_void_p).value)
        exe = c.compile(CALLBACK)
        bad: list[str] = []
        deadline = time.monotonic() + args.seconds / 2

        def worker(k: int, c=c, exe=exe, bad=bad, deadline=deadline) -> None:
            device = c.devices()[k % 4]
            n = 0
            while time.monotonic() < deadline:
                v = x + k + n
                try:
                    out = exe.execute_portable([c.buffer_from_pyval(v, device)], device)[0]
                    if not np.array_equal(out.to_numpy(), v * 2):
                        bad.append("wrong result")
                except BaseException as e:  # every outcome is recorded
                    bad.append(f"{type(e).__name__}: {e}")
                n += 1

        threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(args.seconds + 60)
        t.cases += calls[0]
        if any(th.is_alive() for th in threads):
            t.defect(f"{kind} target x 8 threads", "deadlock")
        for what in sorted(set(bad)):
            t.defect(f"{kind} target x 8 threads", f"{what} (x{bad.count(what)})")
        print(f"  custom: {calls[0]} {kind} custom calls from 8 threads", flush=True)
        c.close()

    # what a target may do wrong: each must fail that execution with a typed error, the
    # interrupt kinds must reach the caller as themselves, and the client must keep working
    class OddError(Exception):
        def __str__(self):
            raise RuntimeError("str() of this error fails")

    class NotAnException(BaseException):
        pass

    class WeirdArgs(Exception):
        def __init__(self):
            super().__init__(object(), b"\xff", None)

    behaviours: dict[str, tuple[Callable, tuple]] = {
        "raises ValueError": (lambda ins, o: 1 / 0, (XlapyError,)),
        "raises an error whose str fails": (lambda ins, o: _raise(OddError()), (XlapyError,)),
        "raises odd args": (lambda ins, o: _raise(WeirdArgs()), (XlapyError,)),
        "raises BaseException subclass": (
            lambda ins, o: _raise(NotAnException()), (XlapyError, NotAnException)
        ),
        "raises KeyboardInterrupt": (
            lambda ins, o: _raise(KeyboardInterrupt()), (KeyboardInterrupt,)
        ),
        "raises SystemExit": (lambda ins, o: _raise(SystemExit(3)), (SystemExit,)),
        "raises GeneratorExit": (
            lambda ins, o: _raise(GeneratorExit()), (XlapyError, GeneratorExit)
        ),
        "returns None": (lambda ins, o: None, (XlapyError,)),
        "returns a string": (lambda ins, o: "abc", (XlapyError,)),
        "returns wrong shape": (lambda ins, o: np.zeros(5, np.float32), (XlapyError,)),
        "returns wrong dtype": (lambda ins, o: np.zeros(4, np.complex128), (XlapyError,)),
        "returns object array": (lambda ins, o: np.array([object()] * 4), (XlapyError,)),
        "returns NaN ints": (lambda ins, o: [float("nan")] * 4, (XlapyError,)),
        "returns a tuple": (lambda ins, o: (ins[0], ins[0]), (XlapyError,)),
        "returns a huge array": (lambda ins, o: np.zeros(1 << 24, np.float32), (XlapyError,)),
        "writes its input": (lambda ins, o: _write(ins[0]), (XlapyError,)),
        "deletes the client": (None, (XlapyError,)),
        "re-enters on its device": (None, (XlapyError,)),
        "runs on another device": (None, ()),
    }  # fmt: skip
    for inline in (True, False):
        for name, (fn, allowed) in behaviours.items():
            c = Client("cpu", device_count=2, inline_execution=inline)
            neg = c.compile(TWO_PARAMS)
            d1 = c.devices()[1]
            if name == "deletes the client":
                fn = lambda ins, o, c=c: c.close()  # noqa: E731
            elif name == "re-enters on its device":
                fn = lambda ins, o, c=c, neg=neg: neg.execute(  # noqa: E731
                    [[c.buffer_from_pyval(ins[0]), c.buffer_from_pyval(np.zeros(4, np.int32))]]
                )[0][0].to_numpy()
            elif name == "runs on another device":
                fn = lambda ins, o, c=c, neg=neg, d1=d1: neg.execute_portable(  # noqa: E731
                    [c.buffer_from_pyval(ins[0], d1),
                     c.buffer_from_pyval(np.zeros(4, np.int32), d1)], d1
                )[0].to_numpy()  # fmt: skip
            c.register_custom_call("attack_target", fn)
            exe = c.compile(CALLBACK)
            case = f"target {name} (inline={inline})"
            for _ in range(2):
                t.cases += 1
                kind, value = bounded(
                    lambda c=c, exe=exe: exe.execute([[c.buffer_from_pyval(x)]])[0][0].to_numpy()
                )
                if kind == "hang":
                    t.defect(case, "hangs")
                    break
                if not allowed:
                    if kind != "ok" or not np.array_equal(value, x):
                        t.defect(case, f"{kind}: {value!r:.200}")
                    continue
                if kind == "ok":
                    t.defect(case, f"accepted: {value!r:.80}")
                elif not isinstance(value, allowed):
                    t.defect(case, f"{type(value).__name__}: {value!s:.200}")
            if name != "deletes the client":
                t.cases += 1
                kind, value = bounded(
                    lambda c=c, neg=neg: neg.execute(
                        [[c.buffer_from_pyval(x), c.buffer_from_pyval(np.ones(4, np.int32))]]
                    )[0][0].to_numpy()
                )
                if kind != "ok" or not np.array_equal(value, x + 1):
                    t.defect(case, f"client unusable afterwards: {kind} {value!r:.200}")
            c.close()
    return t


def _raise(e: BaseException):
    raise e


def _write(a: np.ndarray):
    a[...] = 7  # a read-only input: ValueError, as a typed execution failure
    return a


# -- pjrt ------------------------------------------------------------------------------------
PJRT_CHILD = textwrap.dedent(
    """
    import sys
    import numpy as np
    from xlapy.pjrt import abi, capi
    ffi = abi.ffi
    API = ffi.cast("PJRT_Api *", capi.api_pointer())
    start = int(sys.argv[1])

    def fn(name, args_type):
        return ffi.cast(f"PJRT_Error *(*)({args_type} *)", API.slots[abi.SLOTS.index(name)])

    def new(args_type, size=None, **fields):
        a = ffi.new(f"{args_type} *")
        a.struct_size = ffi.sizeof(args_type) if size is None else size
        for k, v in fields.items():
            setattr(a, k, v)
        return a

    def outcome(err):
        if err == ffi.NULL:
            return "ok"
        code = err.code
        msg = ffi.string(err.message, err.message_size).decode(errors="replace")
        destroy = ffi.cast("void(*)(PJRT_Error_Destroy_Args *)",
                           API.slots[abi.SLOTS.index("Error_Destroy")])
        d = ffi.new("PJRT_Error_Destroy_Args *")
        d.struct_size = ffi.sizeof("PJRT_Error_Destroy_Args")
        d.error = err
        destroy(d)
        return f"error {code}: {msg[:60]}"

    def client():
        a = new("PJRT_Client_Create_Args")
        assert outcome(fn("Client_Create", "PJRT_Client_Create_Args")(a)) == "ok"
        return a.client

    def device(cl):
        a = new("PJRT_Client_Devices_Args", client=cl)
        fn("Client_Devices", "PJRT_Client_Devices_Args")(a)
        return a.devices[0]

    DATA = np.arange(4, dtype=np.float32)
    DIMS = ffi.new("int64_t[]", [4])

    def buffer(cl):
        a = new("PJRT_Client_BufferFromHostBuffer_Args", client=cl, data=ffi.from_buffer(DATA),
                type=abi_type_f32(), dims=DIMS, num_dims=1, host_buffer_semantics=0,
                device=device(cl))
        err = fn("Client_BufferFromHostBuffer", "PJRT_Client_BufferFromHostBuffer_Args")(a)
        assert outcome(err) == "ok", "buffer"
        if a.done_with_host_buffer != ffi.NULL:
            e = new("PJRT_Event_Destroy_Args", event=a.done_with_host_buffer)
            fn("Event_Destroy", "PJRT_Event_Destroy_Args")(e)
        return a.buffer

    def abi_type_f32():
        from xlapy.pjrt.buffers import BUFFER_TYPE_OF
        from xlapy.ir.types import PrimitiveType
        return BUFFER_TYPE_OF[PrimitiveType.F32]

    CASES = []
    def case(f):
        CASES.append(f)
        return f

    NULLABLE = [
        ("Client_PlatformName", "PJRT_Client_PlatformName_Args"),
        ("Client_Devices", "PJRT_Client_Devices_Args"),
        ("Client_AddressableDevices", "PJRT_Client_AddressableDevices_Args"),
        ("Client_Destroy", "PJRT_Client_Destroy_Args"),
        ("Buffer_Destroy", "PJRT_Buffer_Only_Args"),
        ("Buffer_ElementType", "PJRT_Buffer_ElementType_Args"),
        ("Buffer_Dimensions", "PJRT_Buffer_Dimensions_Args"),
        ("Buffer_Device", "PJRT_Buffer_Device_Args"),
        ("Buffer_Memory", "PJRT_Buffer_Memory_Args"),
        ("Buffer_Delete", "PJRT_Buffer_Only_Args"),
        ("Buffer_IsDeleted", "PJRT_Buffer_Flag_Args"),
        ("Buffer_ToHostBuffer", "PJRT_Buffer_ToHostBuffer_Args"),
        ("Buffer_ReadyEvent", "PJRT_Buffer_ReadyEvent_Args"),
        ("Executable_NumOutputs", "PJRT_Executable_Count_Args"),
        ("Executable_NumReplicas", "PJRT_Executable_Count_Args"),
        ("Event_Await", "PJRT_Event_Await_Args"),
        ("Event_IsReady", "PJRT_Event_IsReady_Args"),
        ("Event_Destroy", "PJRT_Event_Destroy_Args"),
        ("Event_OnReady", "PJRT_Event_OnReady_Args"),
        ("Device_GetDescription", "PJRT_Device_GetDescription_Args"),
        ("Device_DefaultMemory", "PJRT_Device_DefaultMemory_Args"),
        ("Memory_Kind", "PJRT_Memory_Text_Args"),
        ("LoadedExecutable_Execute", "PJRT_LoadedExecutable_Execute_Args"),
        ("LoadedExecutable_Destroy", "PJRT_LoadedExecutable_Destroy_Args"),
        ("Client_Compile", "PJRT_Client_Compile_Args"),
        ("Client_BufferFromHostBuffer", "PJRT_Client_BufferFromHostBuffer_Args"),
        ("Error_GetCode", "PJRT_Error_GetCode_Args"),
    ]
    for name, args_type in NULLABLE:
        def null_args(name=name, args_type=args_type):
            return outcome(fn(name, args_type)(ffi.NULL))
        null_args.__name__ = f"{name}(NULL args)"
        case(null_args)
        def null_fields(name=name, args_type=args_type):
            return outcome(fn(name, args_type)(new(args_type)))
        null_fields.__name__ = f"{name}(NULL handles)"
        case(null_fields)
        for size in (0, 8, 1 << 40):
            def sized(name=name, args_type=args_type, size=size):
                return outcome(fn(name, args_type)(new(args_type, size)))
            sized.__name__ = f"{name}(struct_size={size})"
            case(sized)

    @case
    def buffer_double_destroy():
        b = buffer(client())
        f = fn("Buffer_Destroy", "PJRT_Buffer_Only_Args")
        first = outcome(f(new("PJRT_Buffer_Only_Args", buffer=b)))
        return first + " / " + outcome(f(new("PJRT_Buffer_Only_Args", buffer=b)))

    for getter, args_type, field in [
        ("Buffer_ElementType", "PJRT_Buffer_ElementType_Args", "buffer"),
        ("Buffer_Dimensions", "PJRT_Buffer_Dimensions_Args", "buffer"),
        ("Buffer_Device", "PJRT_Buffer_Device_Args", "buffer"),
        ("Buffer_Memory", "PJRT_Buffer_Memory_Args", "buffer"),
        ("Buffer_OnDeviceSizeInBytes", "PJRT_Buffer_OnDeviceSizeInBytes_Args", "buffer"),
        ("Buffer_ToHostBuffer", "PJRT_Buffer_ToHostBuffer_Args", "src"),
        ("Buffer_ReadyEvent", "PJRT_Buffer_ReadyEvent_Args", "buffer"),
        ("Buffer_IsDeleted", "PJRT_Buffer_Flag_Args", "buffer"),
        ("Buffer_Delete", "PJRT_Buffer_Only_Args", "buffer"),
    ]:
        def use_after_destroy(getter=getter, args_type=args_type, field=field):
            b = buffer(client())
            destroy = fn("Buffer_Destroy", "PJRT_Buffer_Only_Args")
            outcome(destroy(new("PJRT_Buffer_Only_Args", buffer=b)))
            for _ in range(2000):  # let the allocator reuse the freed memory
                ffi.new("char[]", 32)
            a = new(args_type, **{field: b})
            if getter == "Buffer_ToHostBuffer":
                out = np.zeros(4, np.float32)
                a.dst, a.dst_size = ffi.from_buffer(out), 16
            r = outcome(fn(getter, args_type)(a))
            if r == "ok":
                return "ok (a destroyed buffer answered)"
            return r
        use_after_destroy.__name__ = f"{getter} after Buffer_Destroy"
        case(use_after_destroy)

    @case
    def bogus_handle():
        junk = ffi.new("char[]", 256)
        b = ffi.cast("PJRT_Buffer *", junk)
        args_type = "PJRT_Buffer_Dimensions_Args"
        return outcome(fn("Buffer_Dimensions", args_type)(new(args_type, buffer=b)))

    @case
    def error_destroy_null():
        d = ffi.new("PJRT_Error_Destroy_Args *")
        d.struct_size = ffi.sizeof("PJRT_Error_Destroy_Args")
        slot = API.slots[abi.SLOTS.index("Error_Destroy")]
        ffi.cast("void(*)(PJRT_Error_Destroy_Args *)", slot)(d)
        return "ok"

    @case
    def error_double_destroy():
        args_type = "PJRT_Buffer_Dimensions_Args"
        err = fn("Buffer_Dimensions", args_type)(new(args_type))
        slot = API.slots[abi.SLOTS.index("Error_Destroy")]
        destroy = ffi.cast("void(*)(PJRT_Error_Destroy_Args *)", slot)
        for _ in range(2):
            d = ffi.new("PJRT_Error_Destroy_Args *")
            d.struct_size = ffi.sizeof("PJRT_Error_Destroy_Args")
            d.error = err
            destroy(d)
        return "ok"

    @case
    def error_message_null():
        slot = API.slots[abi.SLOTS.index("Error_Message")]
        m = ffi.cast("void(*)(PJRT_Error_Message_Args *)", slot)
        m(ffi.NULL)
        return "ok"

    for i, f in enumerate(CASES):
        if i < start:
            continue
        print(f"CASE {i} {f.__name__}", flush=True)
        try:
            r = f()
        except BaseException as e:
            r = f"python {type(e).__name__}: {e}"
        print(f"DONE {i} {r}", flush=True)
    print("ALL", len(CASES), flush=True)
    """
)


def attack_pjrt(args) -> Tally:
    """Every case in a child process that resumes after a crash: a crash is a defect."""
    t = Tally("pjrt")
    env = {**os.environ, "PYTHONPATH": ROOT}
    start = 0
    while True:
        p = subprocess.run(
            [sys.executable, "-c", PJRT_CHILD, str(start)], env=env, capture_output=True,
            text=True, timeout=600,
        )  # fmt: skip
        current = None
        for line in p.stdout.splitlines():
            if line.startswith("CASE "):
                current = line.split(" ", 2)
                t.cases += 1
            elif line.startswith("DONE "):
                _, _, result = line.split(" ", 2)
                name = current[2] if current else "?"
                if "python " in result:
                    t.defect(name, f"a Python exception reached the caller: {result}")
                elif (
                    any(w in name for w in ("NULL", "after", "size", "bogus"))
                    and result.startswith("ok")
                    and not _may_succeed(name)
                ):
                    t.defect(name, f"returned success: {result}")
                current = None
        if "ALL " in p.stdout:
            break
        if current is None:
            t.defect("pjrt child", f"failed to start: rc={p.returncode} {p.stderr[-400:]}")
            break
        t.defect(current[2], f"crashed the process (rc={p.returncode}) {p.stderr.strip()[-200:]}")
        start = int(current[1]) + 1
    return t


def _may_succeed(name: str) -> bool:
    """Calls allowed to answer without an error for that input."""
    if "Destroy(" not in name:
        return False
    # destroying NULL is a no-op, as free(NULL); a larger struct is a newer caller's
    return name.endswith(("(NULL handles)", f"(struct_size={1 << 40})"))


CLASSES = {
    "misuse": attack_misuse,
    "threads": attack_threads,
    "leaks": attack_leaks,
    "cache": attack_cache,
    "serial": attack_serial,
    "custom": attack_custom,
    "pjrt": attack_pjrt,
}


def main() -> int:
    if os.environ.get("XLAPY_ATTACK") != "1":
        print("opt-in: set XLAPY_ATTACK=1 to run the runtime attack", file=sys.stderr)
        return 2
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--classes", default=",".join(CLASSES))
    ap.add_argument("--seed", type=int, default=16)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--runs", type=int, default=10_000)
    ap.add_argument("--flips", type=int, default=200)
    args = ap.parse_args()
    random.seed(args.seed)
    warnings.simplefilter("ignore")
    tallies = []
    for name in args.classes.split(","):
        print(f"== {name}", flush=True)
        start = time.perf_counter()
        try:
            tally = CLASSES[name](args)
        except BaseException:  # the attack itself broke: report, go on
            tally = Tally(name)
            tally.defect("harness", traceback.format_exc()[-800:])
        print(f"   {tally.summary()}  ({time.perf_counter() - start:.1f} s)", flush=True)
        tallies.append(tally)
    print(f"== summary (seed {args.seed})")
    for tally in tallies:
        print("  " + tally.summary())
    total = sum(len(x.defects) for x in tallies)
    print(f"  total cases {sum(x.cases for x in tallies)}, defects {total}")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
