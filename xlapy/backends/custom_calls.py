"""The custom-call target registry: code a program calls by name, per platform.

A target is registered under (name, platform), platform "Host" (the CPU) or "CUDA" (the
GPU), with an API version saying how it is called. Registering the same (name, platform)
twice is an error. A name that is not registered is reported at compile time by
`check_custom_calls(module, platform)`, which names every unknown target (and lists similar
registered names), and again at run time if a module reaches a backend unchecked.

Python and typed FFI targets see operands and results flattened to their leaf arrays in
pre-order (a tuple contributes each of its leaves, depth first). C targets on the CPU see
the seed's in-memory tuple layout instead (one pointer per operand, tuples as pointer
tables); C targets on the GPU see one flat `buffers` table. docs/custom_calls.md is the guide.

Python targets (ApiVersion.PYTHON, the default for plain callables)
--------------------------------------------------------------------
    fn(ins, opaque)            -> result
    fn(ins, opaque, outs)      -> result or None

`ins` is a tuple of read-only NumPy arrays (every operand leaf, pre-order), `opaque` the
instruction's backend_config text (a str, "" when absent). A target whose signature has a
parameter named `outs` receives the result leaves preallocated (pre-order, writable): zeros,
or a copy of the operand leaf an `output_to_operand_aliasing` entry names. It may fill them
in place and return None; this is how a tuple output serves as scratch memory. Otherwise the
target returns the result: an array for an array-shaped result, and for a tuple-shaped one
either the nested tuple or a flat sequence of its leaves in pre-order; a leaf given as None
keeps its preallocated value.

Typed FFI targets (ApiVersion.TYPED_FFI)
----------------------------------------
Handlers made with `xlapy.backends.ffi.handler`, which declares typed arguments, results and
attributes (decoded from backend_config); see that module.

C targets on the CPU ("Host")
-----------------------------
A C function given as a ctypes function pointer, a cffi function pointer, or an integer
address, registered with the API version whose signature it has:

    API_VERSION_ORIGINAL                  void f(void* out, const void** ins)
    API_VERSION_STATUS_RETURNING          void f(void* out, const void** ins,
                                                 XlaCustomCallStatus* status)
    API_VERSION_STATUS_RETURNING_UNIFIED  void f(void* out, const void** ins,
                                                 const char* opaque, size_t opaque_len,
                                                 XlaCustomCallStatus* status)

`ins` holds one pointer per operand. An array operand's entry is its data pointer
(contiguous, row-major; a token is NULL). A tuple operand's entry points at a table of
pointers, one per element, where an element that is itself a tuple is again a pointer to
its own table (seed 002's "in-memory layout of parameter 0"). `out` is the result array's
data pointer when the result is one array, and a pointer to the (possibly nested) table of
the result's elements when it is a tuple. The tables live for the duration of the call. An
output that `output_to_operand_aliasing` ties to an operand shares its memory: the
operand's pointer (wherever it sits in `ins`) and the output pointer are the same buffer, a
copy of the operand that the target may update in place. A target reports failure with
`xlapy_custom_call_status_set_failure(status, message, length)` (also spelled
`XlaCustomCallStatusSetFailure`), declared in C_HEADER (`write_c_header(folder)`).

C targets on the GPU ("CUDA")
-----------------------------
    void f(CUstream stream, void** buffers, const char* opaque, size_t opaque_len)
    (+ XlaCustomCallStatus* status for the STATUS_RETURNING versions)

`buffers` holds every operand leaf and then every result leaf, in pre-order, NULL for
tokens: `gpu_buffer_layout(instr)` computes that list and `GpuTarget` describes the call. It
runs when a GPU backend exists; the interpreter does not call GPU C targets.
"""

from __future__ import annotations

import contextlib
import ctypes
import difflib
import enum
import inspect
import re
import threading
from _ctypes import CFuncPtr
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from xlapy.backends import ffi
from xlapy.backends.xla_ffi import CHandler
from xlapy.errors import CustomCallError, XlapyError
from xlapy.ir.opcodes import Opcode
from xlapy.ir.shapes import Shape

PLATFORMS = ("Host", "CUDA")

# Custom calls XLA itself emits for operations with HLO semantics; backends evaluate them
# directly rather than through the registry.
XLA_INTERNAL_TARGET_NAMES = frozenset({"TopK", "ApproxTopK"})


def approx_topk_dimension(instr) -> int | None:
    """An "ApproxTopK" custom call's reduction dimension, read from its backend_config
    (JAX's attribute dictionary `{..., reduction_dim = 1 : i64, ...}`, or JSON); None when
    it names none."""
    config = instr.backend_config
    found = re.search(r"\breduction_dim\b\W*(-?\d+)", config.text if config else "")
    return int(found.group(1)) if found else None


class ApiVersion(enum.Enum):
    """How a target is called. PYTHON is the Python-callable convention; the others are
    XLA's conventions (API_VERSION_* in HLO text)."""

    PYTHON = "python"
    ORIGINAL = "API_VERSION_ORIGINAL"
    STATUS_RETURNING = "API_VERSION_STATUS_RETURNING"
    STATUS_RETURNING_UNIFIED = "API_VERSION_STATUS_RETURNING_UNIFIED"
    TYPED_FFI = "API_VERSION_TYPED_FFI"

    @staticmethod
    def parse(value: ApiVersion | str | int) -> ApiVersion:
        """An ApiVersion from itself, its value, its name in any case, or XLA's number."""
        if isinstance(value, ApiVersion):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            numbered = dict(enumerate(C_API_VERSIONS, start=1)) | {4: ApiVersion.TYPED_FFI}
            if value in numbered:
                return numbered[value]
        for version in ApiVersion:
            if isinstance(value, str) and value in (
                version.value,
                version.name,
                version.name.lower(),
            ):
                return version
        names = ", ".join(v.value for v in ApiVersion)
        raise CustomCallError(
            f"unknown custom-call api_version {value!r} (expected one of {names})"
        )

    @property
    def is_c(self) -> bool:
        return self in C_API_VERSIONS


C_API_VERSIONS = (
    ApiVersion.ORIGINAL,
    ApiVersion.STATUS_RETURNING,
    ApiVersion.STATUS_RETURNING_UNIFIED,
)


@dataclass(frozen=True, slots=True)
class CustomCallTarget:
    """One registered target. `fn` is the Python callable, the ffi.FfiHandler, or (for the
    C versions) a ctypes function of the convention's signature."""

    name: str
    platform: str
    fn: Callable
    api_version: ApiVersion = ApiVersion.PYTHON
    takes_outs: bool = False


def takes_outs_parameter(fn: Callable) -> bool:
    """Whether `fn` has a parameter named `outs` (the in-place form of a Python target)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "outs" in params


# -- C signatures and the status object ----------------------------------------------------

C_HEADER = """\
/* xlapy_custom_call.h: what a C custom-call target for xlapy needs. */
#ifndef XLAPY_CUSTOM_CALL_H_
#define XLAPY_CUSTOM_CALL_H_
#include <stddef.h>

typedef struct XlaCustomCallStatus_ XlaCustomCallStatus;
struct XlaCustomCallStatus_ {
  void (*set_failure)(XlaCustomCallStatus* status, const char* message, size_t message_len);
  void* reserved;
};

/* Fail the call; xlapy raises CustomCallError with `message`. */
static inline void xlapy_custom_call_status_set_failure(
    XlaCustomCallStatus* status, const char* message, size_t message_len) {
  status->set_failure(status, message, message_len);
}
static inline void XlaCustomCallStatusSetFailure(
    XlaCustomCallStatus* status, const char* message, size_t message_len) {
  status->set_failure(status, message, message_len);
}
static inline void XlaCustomCallStatusSetSuccess(XlaCustomCallStatus* status) {
  (void)status;
}
#endif
"""


def write_c_header(folder: str | Path) -> Path:
    """Write C_HEADER as `xlapy_custom_call.h` into `folder`; return its path."""
    path = Path(folder) / "xlapy_custom_call.h"
    path.write_text(C_HEADER)
    return path


_SET_FAILURE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t)


class _Status(ctypes.Structure):
    _fields_ = [("set_failure", _SET_FAILURE), ("reserved", ctypes.c_void_p)]


_failures: dict[int, str] = {}
_failures_lock = threading.Lock()


def _record_failure(status, message, length):
    text = ctypes.string_at(message, length).decode("utf-8", "replace") if message else ""
    with _failures_lock:
        _failures[status] = text


_SET_FAILURE_FN = _SET_FAILURE(_record_failure)

_PTR = ctypes.c_void_p
_PTRS = ctypes.POINTER(ctypes.c_void_p)
CPU_SIGNATURES = {
    ApiVersion.ORIGINAL: ctypes.CFUNCTYPE(None, _PTR, _PTRS),
    ApiVersion.STATUS_RETURNING: ctypes.CFUNCTYPE(None, _PTR, _PTRS, _PTR),
    ApiVersion.STATUS_RETURNING_UNIFIED: ctypes.CFUNCTYPE(
        None, _PTR, _PTRS, ctypes.c_char_p, ctypes.c_size_t, _PTR
    ),
}


@dataclass(frozen=True, slots=True)
class GpuTarget:
    """The GPU calling convention of one API version: its C signature and how to call a
    function pointer with it (a stream, the `buffers` table, the opaque string)."""

    api_version: ApiVersion
    signature: str
    cfunctype: type

    def call(self, fn, stream: int | None, buffers: Sequence[int | None], opaque: str) -> None:
        """Call GPU target `fn` (an address or function pointer); CustomCallError with the
        target's message when it reports failure through the status."""
        function = self.cfunctype(function_address(fn, "GPU target"))
        table = (ctypes.c_void_p * max(1, len(buffers)))(*buffers)
        data = opaque.encode()
        if self.api_version is ApiVersion.ORIGINAL:
            function(stream, table, data, len(data))
            return
        with _status() as status:
            function(stream, table, data, len(data), status)


_GPU_ARGS = (_PTR, _PTRS, ctypes.c_char_p, ctypes.c_size_t)
GPU_TARGETS = {
    ApiVersion.ORIGINAL: GpuTarget(
        ApiVersion.ORIGINAL,
        "void f(CUstream stream, void** buffers, const char* opaque, size_t opaque_len)",
        ctypes.CFUNCTYPE(None, *_GPU_ARGS),
    ),
    **{
        version: GpuTarget(
            version,
            "void f(CUstream stream, void** buffers, const char* opaque, size_t opaque_len,"
            " XlaCustomCallStatus* status)",
            ctypes.CFUNCTYPE(None, *_GPU_ARGS, _PTR),
        )
        for version in (ApiVersion.STATUS_RETURNING, ApiVersion.STATUS_RETURNING_UNIFIED)
    },
}


@dataclass(frozen=True, slots=True)
class BufferSlot:
    """One entry of the GPU `buffers` table: an operand leaf or a result leaf."""

    role: str  # "operand" or "result"
    number: int  # the operand number (0 for the result)
    index: tuple[int, ...]  # the shape index within that operand or result
    shape: Shape

    @property
    def is_null(self) -> bool:
        return self.shape.is_token


def gpu_buffer_layout(instr) -> list[BufferSlot]:
    """The `buffers` table of a GPU custom call: every operand leaf, then every result leaf,
    each in pre-order (tokens included, as NULL entries)."""
    slots = [
        BufferSlot("operand", n, index, leaf)
        for n, op in enumerate(instr.operands)
        for index, leaf in op.shape.leaves()
    ]
    slots += [BufferSlot("result", 0, index, leaf) for index, leaf in instr.shape.leaves()]
    return slots


class _status:
    """A fresh XlaCustomCallStatus for one call; raises the recorded failure on exit."""

    def __enter__(self):
        self.struct = _Status(_SET_FAILURE_FN, None)
        self.address = ctypes.addressof(self.struct)
        return ctypes.c_void_p(self.address)

    def __exit__(self, *exc):
        with _failures_lock:
            message = _failures.pop(self.address, None)
        if message is not None and exc[0] is None:
            raise CustomCallError(message)
        return False


def function_address(fn, what: str) -> int:
    """The address of a C function given as an int, a ctypes or a cffi function pointer,
    checked to lie in executable memory of this process (CustomCallError otherwise: a NULL
    or made-up address would crash the process when the program runs)."""
    if isinstance(fn, int) and not isinstance(fn, bool):
        address: int | None = fn
    elif isinstance(fn, CFuncPtr):
        address = ctypes.cast(fn, ctypes.c_void_p).value
    elif type(fn).__module__ == "_cffi_backend":
        import cffi

        address = int(cffi.FFI().cast("uintptr_t", fn))
    else:
        raise CustomCallError(
            f"{what}: {fn!r} is not a C function pointer (give a ctypes or cffi function "
            f"pointer or an integer address)"
        )
    if not address:
        raise CustomCallError(f"{what}: the function pointer is null")
    if not 0 < address < 1 << 64 or executable_address(address) is False:
        raise CustomCallError(
            f"{what}: {address:#x} is not the address of code in this process (no executable "
            "mapping holds it); give the function pointer of a loaded library's function"
        )
    return address


def executable_address(address: int) -> bool | None:
    """Whether `address` lies in an executable mapping of this process (/proc/self/maps);
    None where the maps cannot be read (then only NULL is rejected)."""
    try:
        with open("/proc/self/maps") as maps:
            lines = maps.readlines()
    except OSError:
        return None
    for line in lines:
        span, perms = line.split(maxsplit=2)[:2]
        lo, _, hi = span.partition("-")
        if int(lo, 16) <= address < int(hi, 16):
            return "x" in perms
    return False


_calls = threading.local()


@contextlib.contextmanager
def calling(name: str) -> Iterator[None]:
    """Mark the calling thread as running custom-call target `name` (see `current_call`)."""
    outer = getattr(_calls, "name", None)
    _calls.name = name
    try:
        yield
    finally:
        _calls.name = outer


def current_call() -> str | None:
    """The custom-call target the calling thread is running, or None: the runtime bounds the
    waits such code makes, since what it waits for may be queued behind the call itself."""
    return getattr(_calls, "name", None)


def call_cpu_c_target(
    target: CustomCallTarget,
    operands: Sequence,
    result,
    opaque: str,
) -> None:
    """Call C target `target` on the CPU. `operands` holds one value per operand and
    `result` is the result value (filled in place); a value is a contiguous NumPy array,
    None for a token, or a tuple of values. Tuples are passed as nested pointer tables (see
    the module docstring). A failure the target reports raises CustomCallError."""
    keep: list = []  # the pointer tables, alive until the call returns
    ins = _pointer_table([_pointer(target, v, keep) for v in operands], keep)
    out = _pointer(target, result, keep)
    version = target.api_version
    if version is ApiVersion.ORIGINAL:
        with calling(target.name):
            target.fn(out, ins)
        return
    with _status() as status, calling(target.name):
        if version is ApiVersion.STATUS_RETURNING:
            target.fn(out, ins, status)
        else:
            data = opaque.encode()
            target.fn(out, ins, data, len(data), status)


def _pointer(target: CustomCallTarget, value, keep: list) -> int | None:
    """The pointer that stands for `value`: an array's data, NULL for a token, the address
    of a pointer table for a tuple."""
    if value is None:
        return None
    if isinstance(value, tuple):
        table = _pointer_table([_pointer(target, v, keep) for v in value], keep)
        return ctypes.addressof(table)
    if not value.flags.c_contiguous:
        raise CustomCallError(f"custom-call target {target.name!r}: non-contiguous buffer")
    return value.ctypes.data


def _pointer_table(pointers: list, keep: list):
    table = (ctypes.c_void_p * max(1, len(pointers)))(*pointers)
    keep.append(table)
    return table


# -- the registry -------------------------------------------------------------------------


def _infer_version(fn) -> ApiVersion:
    if isinstance(fn, ffi.FfiHandler | CHandler):
        return ApiVersion.TYPED_FFI
    if isinstance(fn, int | CFuncPtr) or type(fn).__module__ == "_cffi_backend":
        return ApiVersion.ORIGINAL
    return ApiVersion.PYTHON


def make_target(
    name: str, fn, platform: str = "Host", api_version: ApiVersion | str | None = None
) -> CustomCallTarget:
    """A CustomCallTarget for `fn`, checked against its API version (C functions are bound
    to the version's signature). The API version is inferred when None: an ffi handler is
    TYPED_FFI, a C function pointer ORIGINAL, any other callable PYTHON."""
    if not isinstance(name, str) or not name:
        raise CustomCallError(f"a custom-call target's name must be a non-empty str, got {name!r}")
    if platform not in PLATFORMS:
        raise CustomCallError(f"custom-call platform must be one of {PLATFORMS}, got {platform!r}")
    version = _infer_version(fn) if api_version is None else ApiVersion.parse(api_version)
    what = f"custom-call target {name!r}"
    if version is ApiVersion.PYTHON and not callable(fn):
        raise CustomCallError(f"{what}: {fn!r} is not callable")
    if version is ApiVersion.TYPED_FFI and not isinstance(fn, ffi.FfiHandler | CHandler):
        raise CustomCallError(
            f"{what}: API_VERSION_TYPED_FFI needs a handler made with xlapy.backends.ffi.handler"
            " or a C handler of XLA's FFI (xlapy.backends.xla_ffi.CHandler)"
        )
    if version.is_c:
        address = function_address(fn, what)
        signature = (
            CPU_SIGNATURES[version] if platform == "Host" else GPU_TARGETS[version].cfunctype
        )
        fn = signature(address)
    return CustomCallTarget(name, platform, fn, version, takes_outs_parameter(fn))


class CustomCallRegistry:
    """Targets keyed by (name, platform). `version` counts the changes made to it, so a
    cache of compiled programs can tell that a registry changed since it compiled."""

    def __init__(self) -> None:
        self._targets: dict[tuple[str, str], CustomCallTarget] = {}
        self.version = 0

    def register(
        self,
        name: str,
        fn,
        platform: str = "Host",
        api_version: ApiVersion | str | None = None,
    ) -> CustomCallTarget:
        """Register `fn` as target `name` on `platform` (see make_target for `api_version`);
        CustomCallError if (name, platform) is taken."""
        key = (name, platform)
        if key in self._targets:
            raise CustomCallError(
                f"custom-call target {name!r} is already registered for platform {platform}"
            )
        target = make_target(name, fn, platform, api_version)
        self._targets[key] = target
        self.version += 1
        return target

    def unregister(self, name: str, platform: str = "Host") -> None:
        """Remove target `name` from `platform` (no error if it is not there)."""
        if self._targets.pop((name, platform), None) is not None:
            self.version += 1

    def get(self, name: str, platform: str = "Host") -> CustomCallTarget | None:
        return self._targets.get((name, platform))

    def lookup(self, name: str, platform: str = "Host") -> CustomCallTarget:
        """The target `name` on `platform`; CustomCallError naming it when unknown."""
        target = self._targets.get((name, platform))
        if target is not None:
            return target
        raise CustomCallError(unknown_target_message(name, platform, self.names(platform)))

    def names(self, platform: str = "Host") -> list[str]:
        return sorted(n for n, p in self._targets if p == platform)

    def __contains__(self, key) -> bool:
        name, platform = key if isinstance(key, tuple) else (key, "Host")
        return (name, platform) in self._targets


def unknown_target_message(name: str, platform: str, known: list[str]) -> str:
    """The error text for an unknown target, listing the registered names closest to it."""
    text = f"no custom-call target {name!r} is registered for platform {platform}"
    similar = difflib.get_close_matches(name, known, n=5, cutoff=0.5)
    if similar:
        text += "; similar registered names: " + ", ".join(similar)
    return text


GLOBAL_REGISTRY = CustomCallRegistry()

RegistryLike = CustomCallRegistry | Mapping | None


def resolve(name: str, platform: str = "Host", registry: RegistryLike = None):
    """The target `name` for `platform`, from `registry` (a CustomCallRegistry, or a dict
    from name to callable / handler / CustomCallTarget) first, then the global registry;
    None when neither has it."""
    if isinstance(registry, CustomCallRegistry):
        target = registry.get(name, platform)
        if target is not None:
            return target
    elif isinstance(registry, Mapping) and name in registry:
        fn = registry[name]
        return fn if isinstance(fn, CustomCallTarget) else make_target(name, fn, platform)
    return GLOBAL_REGISTRY.get(name, platform)


def known_names(platform: str, registry: RegistryLike = None) -> list[str]:
    """Every name `resolve` can find for `platform`."""
    known = set(GLOBAL_REGISTRY.names(platform))
    if isinstance(registry, CustomCallRegistry):
        known |= set(registry.names(platform))
    elif isinstance(registry, Mapping):
        known |= set(registry)
    return sorted(known)


def find(name: str, platform: str = "Host", registry: RegistryLike = None) -> CustomCallTarget:
    """Like resolve, but CustomCallError naming the target when it is unknown."""
    target = resolve(name, platform, registry)
    if target is None:
        raise CustomCallError(
            unknown_target_message(name, platform, known_names(platform, registry))
        )
    return target


def typed_ffi_target(name: str | None, registry: RegistryLike) -> CustomCallTarget | None:
    """The typed-FFI handler registered as `name` for "Host" (in `registry`, then the global
    one) that the CPU backend runs as an FfiCallThunk, or None: whether it is one is the only
    way a custom call's lowering depends on the registry (a program image checks it again
    when it is loaded)."""
    try:
        target = find(name or "", "Host", registry)
    except XlapyError:
        return None
    typed = target.api_version is ApiVersion.TYPED_FFI and isinstance(target.fn, ffi.FfiHandler)
    return target if typed else None  # a handler in C goes through CustomCallThunk


def check_custom_calls(module, platform: str = "Host", registry: RegistryLike = None) -> None:
    """The compile-time check of every custom-call in `module` for `platform`: each target
    must be registered, a typed FFI handler must accept the instruction's operand and
    result types and attributes, and a C target's API version must be the one the
    instruction asks for. Raises one CustomCallError listing every problem."""
    problems = []
    for instr in module.instructions():
        if instr.opcode is not Opcode.CUSTOM_CALL:
            continue
        name = instr.custom_call_target
        if not name:
            problems.append(f"{instr.name}: custom-call needs custom_call_target=")
            continue
        if name in XLA_INTERNAL_TARGET_NAMES:
            continue
        target = resolve(name, platform, registry)
        if target is None:
            message = unknown_target_message(name, platform, known_names(platform, registry))
            problems.append(f"{instr.name}: {message}")
            continue
        if target.api_version is ApiVersion.TYPED_FFI:
            problems += ffi.check_signature(target.fn, instr)
        declared = instr.custom_call_api_version
        if declared is not None and target.api_version.is_c:
            wanted = ApiVersion.parse(declared)
            if wanted.is_c and wanted is not target.api_version:
                problems.append(
                    f"{instr.name}: target {name!r} is registered as "
                    f"{target.api_version.value}, the instruction calls it as {wanted.value}"
                )
    if problems:
        raise CustomCallError("\n".join(problems))


def register(
    name: str,
    fn,
    platform: str = "Host",
    api_version: ApiVersion | str | None = None,
) -> CustomCallTarget:
    """Register a target in the global registry (see CustomCallRegistry.register)."""
    return GLOBAL_REGISTRY.register(name, fn, platform, api_version)


def lookup(name: str, platform: str = "Host") -> CustomCallTarget:
    """A target of the global registry (see CustomCallRegistry.lookup)."""
    return GLOBAL_REGISTRY.lookup(name, platform)


def _identity(ins, opaque):
    return ins[0] if len(ins) == 1 else tuple(ins)


# Markers JAX emits around otherwise plain programs; on one device they change nothing.
BUILTIN_IDENTITY_TARGETS = (
    "Sharding",
    "SPMDFullToShardShape",
    "SPMDShardToFullShape",
    "annotate_device_placement",
    "MoveToHost",
    "MoveToDevice",
    "xla.sdy.FuncResultSharding",
    "xla.sdy.ShardingGroup",
    "xla.sdy.GlobalToLocalShape",
    "xla.sdy.LocalToGlobalShape",
)

for _name in BUILTIN_IDENTITY_TARGETS:
    for _platform in PLATFORMS:
        GLOBAL_REGISTRY.register(_name, _identity, _platform)


# The checks of StableHLO's test suite (`check.expect_eq(%got, %want)` and friends, and
# `check.eq`, which returns whether they are equal): a program of that style runs on any
# backend and fails with a message naming the first differing element.
def _check_failure(target: str, got: np.ndarray, want: np.ndarray, bad: np.ndarray) -> str:
    where = np.flatnonzero(bad)
    first = int(where[0])
    index = np.unravel_index(first, got.shape) if got.shape else ()
    return (
        f"{target} failed: {where.size} of {got.size} elements differ; first at index "
        f"{list(map(int, index))}: got {got.reshape(-1)[first].item()!r}, expected "
        f"{want.reshape(-1)[first].item()!r}"
    )


def _check_pair(target: str, ins) -> tuple[np.ndarray, np.ndarray]:
    if len(ins) != 2:
        raise CustomCallError(f"{target} takes 2 operands (result, expected), got {len(ins)}")
    got, want = np.asarray(ins[0]), np.asarray(ins[1])
    if got.shape != want.shape:
        raise CustomCallError(f"{target}: shapes differ: {got.shape} and {want.shape}")
    return got, want


def _differs(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    if got.dtype.kind in "fcV" or got.dtype.name.startswith(("bfloat", "float")):
        a, b = got.astype(np.complex128), want.astype(np.complex128)
        return ~((a == b) | (np.isnan(a) & np.isnan(b)))
    return got != want


def _not_close(got: np.ndarray, want: np.ndarray, opaque: str) -> np.ndarray:
    """Outside max_ulp_difference ulps (default 3) and outside a relative tolerance fitting
    the element type."""
    if not (got.dtype.kind in "fc" or got.dtype.name.startswith(("bfloat", "float"))):
        return got != want
    ulps = 3
    if opaque.startswith("max_ulp_difference="):
        ulps = int(opaque.split("=", 1)[1])
    bits = got.dtype.itemsize * 8
    eps = {8: 2.0**-2, 16: 2.0**-7 if "bfloat" in got.dtype.name else 2.0**-10}.get(bits, 1e-5)
    if got.dtype.kind == "c" or bits == 64:
        eps = 1e-5 if bits <= 64 and got.dtype.kind == "c" else 1e-12
    a, b = got.astype(np.complex128), want.astype(np.complex128)
    spacing = (
        np.spacing(np.abs(want.astype(np.float64)).astype(np.float64))
        if got.dtype.kind != "c"
        else 0
    )
    limit = np.maximum(ulps * eps * np.abs(b), ulps * np.abs(spacing)) + 1e-30
    with np.errstate(invalid="ignore"):
        return ~((np.abs(a - b) <= limit) | (np.isnan(a) & np.isnan(b)) | (a == b))


def _expect_almost_eq(ins, opaque):
    """Every element within `tolerance` (default 1e-4, from the opaque `tolerance=...`)."""
    got, want = _check_pair("check.expect_almost_eq", ins)
    tolerance = float(opaque.split("=", 1)[1]) if opaque.startswith("tolerance=") else 1e-4
    a, b = got.astype(np.complex128), want.astype(np.complex128)
    with np.errstate(invalid="ignore"):
        ok = (np.abs(a - b) <= tolerance) | (a == b) | (np.isnan(a) & np.isnan(b))
    if not ok.all():
        raise CustomCallError(_check_failure("check.expect_almost_eq", got, want, ~ok))
    return ()


def _expect_eq(ins, opaque):
    got, want = _check_pair("check.expect_eq", ins)
    bad = _differs(got, want)
    if bad.any():
        raise CustomCallError(_check_failure("check.expect_eq", got, want, bad))
    return ()


def _expect_close(ins, opaque):
    got, want = _check_pair("check.expect_close", ins)
    bad = _not_close(got, want, opaque)
    if bad.any():
        raise CustomCallError(_check_failure("check.expect_close", got, want, bad))
    return ()


def _check_eq(ins, opaque):
    got, want = _check_pair("check.eq", ins)
    return np.asarray(not _differs(got, want).any())


CHECK_TARGETS = {
    "check.expect_eq": _expect_eq,
    "check.expect_almost_eq": _expect_almost_eq,
    "check.expect_close": _expect_close,
    "check.eq": _check_eq,
}
for _name, _fn in CHECK_TARGETS.items():
    GLOBAL_REGISTRY.register(_name, _fn, "Host")


def _register_lapack() -> None:
    from xlapy.backends.lapack import LAPACK_HANDLERS

    for name, handler in LAPACK_HANDLERS.items():
        GLOBAL_REGISTRY.register(name, handler, "Host", ApiVersion.TYPED_FFI)


_register_lapack()
