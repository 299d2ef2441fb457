# LLVM IR text -> native code in this process, through llvmlite.
#
# The target machine is the host CPU with all its features (so AVX/FMA are used where the
# machine has them). Optimization is LLVM's O3 pipeline built by the new pass manager
# (PassBuilder with loop and SLP vectorization on). The optimized module is emitted as an
# object file, and the object file is loaded into an MCJIT execution engine of its own.
#
# Compiled objects are cached on disk, keyed by a SHA-256 of the IR text, the CPU name and
# features, the xlapy and llvmlite versions. Files are written to a temporary name and
# renamed into place (os.replace), so concurrent compilers never see half a file. The
# directory is $XLAPY_CACHE_DIR, or ~/.cache/xlapy/kernels.

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import hashlib
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import llvmlite
import llvmlite.binding as llvm

import xlapy
from xlapy.backends.cpu.math import LIBM_FUNCTIONS

_lock = threading.Lock()


@functools.cache
def _initialize() -> None:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    libm = ctypes.util.find_library("m")
    if libm:
        lib = ctypes.CDLL(libm)
        for name in LIBM_FUNCTIONS | {"fmod", "fmodf"}:
            llvm.add_symbol(name, ctypes.cast(getattr(lib, name), ctypes.c_void_p).value)


@dataclass(frozen=True, slots=True)
class HostTarget:
    """The host CPU as LLVM sees it."""

    triple: str
    cpu: str
    features: str


@functools.cache
def host_target() -> HostTarget:
    """Triple, CPU name and feature string of the machine running xlapy."""
    _initialize()
    return HostTarget(
        llvm.get_process_triple(), llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()
    )


@functools.cache
def target_machine():
    """The O3 target machine for the host CPU that optimization and code emission share."""
    return new_target_machine()


def new_target_machine():
    """A fresh O3 target machine for the host CPU (an execution engine takes ownership of
    the one it is given, so each engine needs its own)."""
    host = host_target()
    target = llvm.Target.from_triple(host.triple)
    return target.create_target_machine(
        cpu=host.cpu, features=host.features, opt=3, reloc="pic", codemodel="jitdefault"
    )


@functools.cache
def data_layout() -> str:
    """The host target's data layout string."""
    return str(target_machine().target_data)


def cache_dir() -> Path:
    """Where compiled objects are kept: $XLAPY_CACHE_DIR or ~/.cache/xlapy/kernels."""
    env = os.environ.get("XLAPY_CACHE_DIR")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "xlapy" / "kernels"


def cache_key(ir_text: str) -> str:
    """The content hash naming the object compiled from `ir_text` on this machine."""
    host = host_target()
    h = hashlib.sha256()
    for part in (ir_text, host.triple, host.cpu, host.features, xlapy.__version__):
        h.update(part.encode())
        h.update(b"\0")
    h.update(llvmlite.__version__.encode())
    return h.hexdigest()


def optimize(ir_text: str) -> llvm.ModuleRef:
    """Parse `ir_text` and run LLVM's O3 pipeline on it for the host CPU."""
    tm = target_machine()
    mod = llvm.parse_assembly(ir_text)
    mod.triple = host_target().triple
    mod.data_layout = data_layout()
    mod.verify()
    pto = llvm.PipelineTuningOptions(speed_level=3)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    pto.loop_interleaving = True
    pto.loop_unrolling = True
    pb = llvm.create_pass_builder(tm, pto)
    mpm = pb.getModulePassManager()
    mpm.run(mod, pb)
    return mod


def assembly(mod: llvm.ModuleRef) -> str:
    return target_machine().emit_assembly(mod)


@dataclass(frozen=True, slots=True)
class CompiledObject:
    """An object file and where it came from."""

    key: str
    data: bytes
    from_cache: bool


def compile_object(ir_text: str, use_cache: bool = True) -> CompiledObject:
    """The native object for `ir_text`, from the disk cache when it is there."""
    key = cache_key(ir_text)
    path = cache_dir() / f"{key}.o"
    if use_cache and path.is_file():
        try:
            return CompiledObject(key, path.read_bytes(), True)
        except OSError:
            pass
    with _lock:
        mod = optimize(ir_text)
        data = target_machine().emit_object(mod)
    if use_cache:
        _write_atomic(path, data)
    return CompiledObject(key, data, False)


def _write_atomic(path: Path, data: bytes) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".o")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only or full cache directory only costs the next compile


class LoadedObject:
    """An object file loaded into its own execution engine; symbols by address."""

    def __init__(self, data: bytes):
        _initialize()
        with _lock:
            empty = llvm.parse_assembly("")
            empty.triple = host_target().triple
            self.engine = llvm.create_mcjit_compiler(empty, new_target_machine())
            self.engine.add_object_file(llvm.ObjectFileRef.from_data(data))
            self.engine.finalize_object()

    def address(self, name: str) -> int:
        addr = self.engine.get_function_address(name)
        if not addr:
            raise RuntimeError(f"symbol {name} is not in the loaded object")
        return addr
