"""The CPU backend's fft through DUCC (xlapy/backends/cpu/runtime/fft_thunk.py) against the
interpreter (scipy.fft) and XLA: every FftType in single and double precision, odd, prime
and length-1 axes, batch dims, transposed operand layouts, transforms large enough to run
as per-axis passes split over the pool (the same bits however they are cut), the scipy.fft
path both when asked for and when ducc0 cannot be imported, an operand sharing the
result's bytes, JAX programs (an FFT over a non-minor axis, a 2-D rfft convolution round
trip), and a program image that runs ducc0 again where it is loaded."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from test_cpu_program_image import cold_then_warm, run
from test_fft import TEXT, random

from xlapy.backends import execute
from xlapy.backends.cpu import CpuBackend
from xlapy.backends.cpu.runtime import fft_thunk
from xlapy.backends.cpu.runtime.fft_thunk import FftThunk, plan_passes
from xlapy.backends.cpu.runtime.thunk import BufferSlice, ExecutionContext, walk_thunks
from xlapy.backends.fft import THREADED_MIN_ELEMENTS
from xlapy.ir.parser import parse_module
from xlapy.ir.shapes import Shape
from xlapy.runtime import Client, CompileOptions

pytestmark = pytest.mark.usefixtures("x64_mode", "kernel_cache")

# of the largest magnitude of the reference, by the result's element type
TOL = {"f32": 4e-6, "c64": 4e-6, "f64": 1e-13, "c128": 1e-13}
LIBRARIES = ["ducc0", "scipy", "no-ducc0"]

# (kind, operand dims, fft_length): length 1, odd and prime lengths, 1-3 axes, 0-2 batch
# dims; the last ones have THREADED_MIN_ELEMENTS or more and (but the rank-1 one) run as
# split passes
CASES = [
    ("FFT", (1,), (1,)),
    ("FFT", (5, 1), (1,)),
    ("RFFT", (4, 1), (1,)),
    ("IRFFT", (4, 1), (1,)),
    ("IRFFT", (3, 2), (2,)),
    ("FFT", (3, 101), (101,)),
    ("IFFT", (2, 7, 13), (7, 13)),
    ("RFFT", (3, 5, 7, 11), (5, 7, 11)),
    ("IRFFT", (2, 5, 7, 6), (5, 7, 11)),
    ("FFT", (64, 1024), (1024,)),
    ("FFT", (8, 6007), (6007,)),
    ("FFT", (40000,), (40000,)),
    ("IFFT", (8, 64, 97), (64, 97)),
    ("RFFT", (4, 32, 16, 33), (32, 16, 33)),
    ("IRFFT", (6, 48, 129), (48, 256)),
    ("IRFFT", (2, 8, 16, 65), (8, 16, 128)),
]
BIG = [
    c for c in CASES if max(np.prod(c[1]), np.prod(c[2])) >= THREADED_MIN_ELEMENTS and len(c[1]) > 1
]


def operand(kind, dims, double, seed):
    rng = np.random.default_rng(seed)
    if kind == "RFFT":
        return random(rng, dims, np.float64 if double else np.float32)
    return random(rng, dims, np.complex128 if double else np.complex64)


def fft_text(kind, x, lengths, out_shape, out_dtype, layout=""):
    dims = ",".join(map(str, x.shape))
    out = ",".join(map(str, out_shape))
    fft_len = ",".join(map(str, lengths))
    return (
        f"HloModule m\nENTRY e {{\n  p = {TEXT[x.dtype]}[{dims}]{layout} parameter(0)\n"
        f"  ROOT r = {TEXT[np.dtype(out_dtype)]}[{out}] fft(p), fft_type={kind}, "
        f"fft_length={{{fft_len}}}\n}}"
    )


def xla(kind, x, lengths):
    return np.asarray(jax.jit(lambda v: lax.fft(v, kind, lengths))(x))


def compile_with(text, library, monkeypatch):
    if library == "no-ducc0":
        monkeypatch.setattr(fft_thunk, "ducc_fft", lambda: None)
    options = {} if library == "no-ducc0" else {"fft_library": library}
    return CpuBackend().compile(parse_module(text), options)


def fft_thunks(program) -> list[FftThunk]:
    return [t for t in walk_thunks(program.compiled.entry) if isinstance(t, FftThunk)]


def close(ours, ref, what):
    assert ours.dtype == ref.dtype and ours.shape == ref.shape, what
    tol = TOL[TEXT[ref.dtype]] * max(1.0, float(np.max(np.abs(ref))))
    np.testing.assert_allclose(ours, ref, rtol=0, atol=tol, err_msg=what)


@pytest.mark.parametrize("library", LIBRARIES)
@pytest.mark.parametrize("double", [False, True], ids=["single", "double"])
@pytest.mark.parametrize("kind,dims,lengths", CASES)
def test_fft_matches_the_interpreter_and_xla(kind, dims, lengths, double, library, monkeypatch):
    x = operand(kind, dims, double, seed=sum(dims) + 7 * len(lengths))
    ref = xla(kind, x, lengths)
    text = fft_text(kind, x, lengths, ref.shape, ref.dtype)
    program = compile_with(text, library, monkeypatch)
    listing = program.thunk_listing()
    want = "(ducc0" if library == "ducc0" else "(scipy.fft"
    assert want in listing, listing
    if library == "no-ducc0":
        assert "ducc0 is not importable" in listing
    ours = program.run([x])
    close(ours, ref, "against XLA")
    close(ours, execute(parse_module(text), [x], "interpreter"), "against the interpreter")


@pytest.mark.parametrize("library", ["ducc0", "no-ducc0"])
@pytest.mark.parametrize(
    "kind,dims,lengths,layout",
    [
        ("FFT", (6, 10), (10,), "{0,1}"),
        ("IFFT", (5, 6, 7), (6, 7), "{0,1,2}"),
        ("RFFT", (4, 9, 12), (12,), "{1,2,0}"),
        ("IRFFT", (3, 4, 8, 5), (4, 8, 8), "{2,0,3,1}"),
        ("FFT", (48, 32, 31), (32, 31), "{0,1,2}"),
        ("IRFFT", (40, 24, 33), (24, 64), "{1,0,2}"),
    ],
)
def test_transposed_operand_layouts(kind, dims, lengths, layout, library, monkeypatch):
    """The operand's slice read where it lies through a strided view (no copy first)."""
    x = operand(kind, dims, double=False, seed=len(layout) + dims[0])
    ref = xla(kind, x, lengths)
    text = fft_text(kind, x, lengths, ref.shape, ref.dtype, layout)
    program = compile_with(text, library, monkeypatch)
    assert layout in program.thunk_listing()
    close(program.run([x]), ref, f"layout {layout}")


@pytest.mark.parametrize("kind,dims,lengths", BIG)
def test_how_a_pass_is_cut_changes_no_bit(kind, dims, lengths, monkeypatch):
    """Large transforms run one axis per pass, each cut along another axis into blocks of
    whole groups of ducc's SIMD lines over the pool; ducc0 itself always runs on one
    thread."""
    x = operand(kind, dims, double=False, seed=3)
    ref = xla(kind, x, lengths)
    program = compile_with(fft_text(kind, x, lengths, ref.shape, ref.dtype), "ducc0", monkeypatch)
    passes = plan_passes(kind, x.shape, lengths, 4)
    assert len(passes) == len(lengths) and all(p.split is not None for p in passes)
    for p in passes:
        assert p.split not in p.axes and p.extent == (ref if p.src == "out" else x).shape[p.split]
    if len(dims) > 1:
        assert "split over the pool" in program.thunk_listing()
    calls: list[dict] = []
    real = fft_thunk.ducc_fft()

    class Spy:
        def __getattr__(self, name):
            def call(*args, **kwargs):
                calls.append(kwargs)
                return getattr(real, name)(*args, **kwargs)

            return call

    monkeypatch.setattr(fft_thunk, "split_parts", lambda units, seconds: 1)
    whole = program.run([x])
    for parts in (2, 3, 7):
        monkeypatch.setattr(fft_thunk, "split_parts", lambda units, seconds, n=parts: n)
        for p in passes:  # cut unless one group of SIMD lines holds the whole split axis
            vlen = fft_thunk.vector_lines(p.itemsize)
            assert (len(p.blocks()) > 1) == (p.extent > vlen // np.gcd(vlen, p.lines))
        np.testing.assert_array_equal(program.run([x]), whole, err_msg=f"{parts} blocks")
    (thunk,) = fft_thunks(program)
    monkeypatch.setattr(thunk, "_fft", Spy())
    np.testing.assert_array_equal(program.run([x]), whole)
    assert calls and all(c.get("nthreads", 1) == 1 and c["out"] is not None for c in calls)
    close(whole, ref, "against XLA")


def test_small_transforms_are_one_call_on_the_calling_thread():
    passes = plan_passes("IRFFT", (3, 4, 8, 5), (4, 8, 8), 4)
    assert len(passes) == 1 and passes[0].split is None and passes[0].axes == (1, 2, 3)
    assert passes[0].op == "c2r" and passes[0].lastsize == 8 and passes[0].inorm == 2
    program = CpuBackend().compile(
        parse_module(
            fft_text("FFT", np.zeros((4, 16), np.complex64), (16,), (4, 16), np.complex64)
        ),
        {},
    )
    (thunk,) = fft_thunks(program)
    assert thunk.runs_alone() and "(ducc0)" in program.thunk_listing()


@pytest.mark.parametrize("kind,lengths", [("FFT", (12,)), ("IFFT", (4, 6)), ("RFFT", (8,))])
def test_an_operand_sharing_the_results_bytes(kind, lengths):
    """ducc0 wants its input and output apart: a thunk whose slices share bytes computes
    through scipy.fft and then stores the result."""
    x = operand(kind, (3, *lengths), double=False, seed=5)
    ref = xla(kind, x, lengths)
    instr = parse_module(fft_text(kind, x, lengths, ref.shape, ref.dtype)).entry.root
    size = max(x.nbytes, ref.nbytes)
    mem = np.zeros(size, np.uint8)
    mem[: x.nbytes] = x.view(np.uint8).ravel()
    thunk = FftThunk(
        instr,
        BufferSlice(0, 0, x.nbytes, Shape.array(TEXT[x.dtype], x.shape)),
        BufferSlice(0, 0, ref.nbytes, Shape.array(TEXT[ref.dtype], ref.shape)),
    )
    assert "share bytes" in thunk.describe()[0]
    thunk.run(ExecutionContext([mem], {}))
    close(mem[: ref.nbytes].view(ref.dtype).reshape(ref.shape), ref, "in place")


def test_empty_transforms_fill_nothing_or_zeros(monkeypatch):
    x = np.zeros((0, 8), np.complex64)
    program = compile_with(fft_text("FFT", x, (8,), (0, 8), np.complex64), "ducc0", monkeypatch)
    assert program.run([x]).shape == (0, 8)
    x = np.ones((3, 0), np.float32)
    program = compile_with(fft_text("RFFT", x, (0,), (3, 1), np.complex64), "ducc0", monkeypatch)
    np.testing.assert_array_equal(program.run([x]), np.zeros((3, 1), np.complex64))


def non_minor(x):
    return jnp.fft.fft(x.astype(jnp.complex64), axis=0)


def rfft2_convolution(x, k):
    spectrum = jnp.fft.rfft2(x) * jnp.fft.rfft2(k, s=x.shape[-2:])
    return jnp.fft.irfft2(spectrum, s=x.shape[-2:])


def batched_small(x):
    return jnp.fft.ifft(jnp.fft.fft(x.astype(jnp.complex128), axis=-1) * 2.0, axis=-1)


def fftn_3d(x):
    return jnp.fft.fftn(x.astype(jnp.complex64), axes=(0, 1, 2))


JAX_PROGRAMS = {
    "non_minor": (non_minor, [(257, 48)], np.float32),
    "rfft2_convolution": (rfft2_convolution, [(4, 96, 80), (5, 5)], np.float32),
    "batched_small": (batched_small, [(512, 8)], np.float64),
    "fftn_3d": (fftn_3d, [(33, 40, 9)], np.float32),
}


@pytest.mark.parametrize("name", list(JAX_PROGRAMS))
def test_jax_programs_match_xla(name):
    fn, shapes, dtype = JAX_PROGRAMS[name]
    rng = np.random.default_rng(len(name))
    args = [rng.standard_normal(s).astype(dtype) for s in shapes]
    text = jax.jit(fn).lower(*args).as_text(dialect="hlo")
    exe = Client("cpu").compile(text)
    listing = exe.backend_program().compiled.thunk_listing()
    assert "(ducc0" in listing and not exe.backend_program().compiled.fallbacks
    ours = run(exe, args)[0]
    ref = np.asarray(jax.jit(fn)(*args))
    tol = TOL[TEXT[ref.dtype]] * 8 * max(1.0, float(np.max(np.abs(ref))))
    np.testing.assert_allclose(ours, ref, rtol=0, atol=tol)


def test_a_program_image_runs_ducc0_where_it_is_loaded(image_cache, monkeypatch):
    fn, shapes, dtype = JAX_PROGRAMS["rfft2_convolution"]
    args = [np.random.default_rng(9).standard_normal(s).astype(dtype) for s in shapes]
    text = jax.jit(fn).lower(*args).as_text(dialect="hlo")
    cold, exe, warm = cold_then_warm(image_cache, monkeypatch, text, args)
    thunks = fft_thunks(exe.backend_program())
    assert thunks and all(t.fft_module() is fft_thunk.ducc_fft() for t in thunks)
    np.testing.assert_array_equal(warm[0], cold[0])


def test_the_fft_library_option_is_checked():
    client = Client("cpu")
    text = fft_text("FFT", np.zeros((4, 8), np.complex64), (8,), (4, 8), np.complex64)
    with pytest.raises(Exception, match="fft_library"):
        client.compile(text, CompileOptions.make(backend_options={"fft_library": "fftw"}))


_PROFILE_PROBE = """
import os, sys
from xlapy.backends.cpu.runtime import fft_thunk
assert fft_thunk.ducc_fft() is not None
import ducc0
info = ducc0.misc.cpu_info()
print(info["active_profile"], "|", info["available_profiles"][-1], "|",
      os.environ.get("DUCC0_MAX_PSABI_LEVEL", "unset"))
"""


@pytest.mark.parametrize(("user_level", "max_isa"), [(None, None), ("1", None), (None, "SSE4_2")])
def test_ducc_kernel_level_capped_at_avx2_unless_the_user_says(user_level, max_isa):
    """xlapy imports ducc0 with its kernels capped at x86-64-v3 (AVX2: its AVX-512 build ran
    f32 transforms at half speed on an AVX-512 AMD EPYC), leaves the process's environment
    as it was, and respects a user's own DUCC0_MAX_PSABI_LEVEL; $XLAPY_CPU_MAX_ISA below
    AVX2 caps it at its baseline build."""
    import os
    import subprocess
    import sys

    ducc0 = pytest.importorskip("ducc0")
    if not hasattr(ducc0.misc, "cpu_info") or not ducc0.misc.cpu_info().get("multiarch"):
        pytest.skip("this ducc0 has one kernel build (no multiarch profiles to choose)")
    drop = ("DUCC0_MAX_PSABI_LEVEL", "XLAPY_CPU_MAX_ISA")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    if user_level is not None:
        env["DUCC0_MAX_PSABI_LEVEL"] = user_level
    if max_isa is not None:
        env["XLAPY_CPU_MAX_ISA"] = max_isa
    done = subprocess.run(
        [sys.executable, "-c", _PROFILE_PROBE],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    active, widest, left = (part.strip() for part in done.stdout.split("|"))
    if max_isa is not None:
        assert left == "unset"
        expected = "x86-64"
    elif user_level is None:
        assert left == "unset"
        expected = "x86-64-v3" if widest in ("x86-64-v3", "x86-64-v4") else widest
    else:
        assert left == user_level
        expected = "x86-64"
    assert active == expected
