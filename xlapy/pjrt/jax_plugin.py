"""JAX's entry point for xlapy (group `jax_plugins` in pyproject.toml): JAX calls
`initialize()` at start-up, which registers xlapy's PJRT C API as the platform "xlapy"."""

from __future__ import annotations

import functools
import os
from typing import Any

SUPPORTED_JAXLIB = ("0.10.2",)
"""jaxlib versions whose PJRT framework (C API 0.112) xlapy's table (0.108) was checked
against. Other versions are refused with a message, not loaded (the C ABI is versioned)."""


class UnsupportedJaxlibError(RuntimeError):
    """The installed jaxlib is not one xlapy's PJRT plugin was built for."""


def check_jaxlib() -> None:
    """Raise UnsupportedJaxlibError unless the installed jaxlib is supported (set
    XLAPY_PJRT_ANY_JAXLIB=1 to try another one anyway)."""
    import jaxlib

    version = getattr(jaxlib, "__version__", None) or jaxlib.version.__version__
    if version in SUPPORTED_JAXLIB or os.environ.get("XLAPY_PJRT_ANY_JAXLIB") == "1":
        return
    raise UnsupportedJaxlibError(
        f"xlapy's PJRT plugin supports jaxlib {', '.join(SUPPORTED_JAXLIB)}; this is jaxlib "
        f"{version}. Install a supported jaxlib, or set XLAPY_PJRT_ANY_JAXLIB=1 to try anyway."
    )


def initialize(options: dict[str, Any] | None = None) -> Any:
    """Register xlapy with JAX as platform "xlapy" (priority below the CPU backend, so it is
    the default only with JAX_PLATFORMS=xlapy). `options` (e.g. {"device_count": 4}) are
    passed to PJRT_Client_Create (also settable as JAX's `jax_pjrt_client_create_options`
    "device_count:4", or XLAPY_DEVICE_COUNT). Calling it again does nothing. Returns the
    capsule registered, or None when the jaxlib is unsupported (a warning says why) or
    xlapy was registered before."""
    import warnings

    from jax._src import xla_bridge

    if "xlapy" in xla_bridge._backend_factories:
        return None
    try:
        check_jaxlib()
    except UnsupportedJaxlibError as e:
        warnings.warn(str(e), stacklevel=2)
        return None
    from jax._src.interpreters import mlir

    from xlapy.pjrt.capi import capsule

    if "xlapy" not in mlir._platforms_with_donation:
        mlir._platforms_with_donation.append("xlapy")  # xlapy honours donation
    # xlapy receives what XLA:CPU receives: JAX's CPU-specific lowerings (LAPACK calls for
    # jnp.linalg, ...) serve the "xlapy" platform too, later registrations for "cpu"
    # included; rules registered for "xlapy" itself (host callbacks) come first.
    mlir._platform_specific_lowerings["xlapy"] = CpuLowerings(
        mlir._platform_specific_lowerings["cpu"]
    )
    c_api = capsule()
    xla_bridge.register_plugin("xlapy", priority=-100, c_api=c_api, options=options or None)
    from xlapy.pjrt import callbacks

    callbacks.install()  # after register_plugin: JAX knows the platform name now
    install_cpu_stand_in()
    from jaxlib import xla_client

    # jax.ffi.register_ffi_target(..., platform="xlapy") / register_ffi_type: JAX hands
    # targets for a plugin's platform to the handler the plugin registers (the ones made
    # before this call are replayed now).
    xla_client.register_custom_call_handler("xlapy", register_ffi_target)
    xla_client.register_custom_type_handler("xlapy", register_ffi_type)
    register_jaxlib_lapack()
    return c_api


class CpuLowerings(dict):
    """The "xlapy" platform's lowering rules: its own, then those of "cpu" (read live)."""

    def __init__(self, cpu: dict):
        super().__init__()
        self.cpu = cpu

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, key) or key in self.cpu

    def __missing__(self, key: Any) -> Any:
        return self.cpu[key]


def install_cpu_stand_in() -> None:
    """Let the "xlapy" platform stand in for the CPU where JAX picks code by platform name
    or assumes a CPU backend exists:
    - `lax.platform_dependent(x, cpu=f, default=g)` runs `f` on xlapy (xlapy gets the CPU's
      lowerings, so it takes the CPU's branch too), unless a branch names "xlapy" itself;
    - `lax.scan` returns a forwarded NumPy input on the first CPU device; with
      JAX_PLATFORMS=xlapy (no CPU backend) it goes on the default device instead, where
      JAX raised "Unknown backend cpu"."""
    from jax._src.interpreters import mlir
    from jax._src.lax.control_flow import conditionals, loops

    if getattr(install_cpu_stand_in, "done", False):
        return

    def platform_index_rule(ctx: Any, *, platforms: Any) -> Any:
        return conditionals._platform_index_lowering(ctx, platforms=_cpu_branch(platforms))

    def cond_rule(ctx: Any, *args: Any, **params: Any) -> Any:
        if params.get("branches_platforms") is not None:
            params["branches_platforms"] = _cpu_branch(params["branches_platforms"])
        return conditionals._cond_lowering(ctx, *args, **params)

    mlir.register_lowering(conditionals.platform_index_p, platform_index_rule, platform="xlapy")
    mlir.register_lowering(conditionals.cond_p, cond_rule, platform="xlapy")
    loops._maybe_put = functools.partial(_put_forwarded, loops._maybe_put)
    install_cpu_stand_in.done = True  # type: ignore[attr-defined]


def _cpu_branch(branches_platforms: Any) -> Any:
    """`platform_dependent`'s branch platforms with "xlapy" added to the branch naming
    "cpu" (unchanged when a branch names "xlapy" or none names "cpu")."""
    if any(ps is not None and "xlapy" in ps for ps in branches_platforms):
        return branches_platforms
    return tuple(
        ps if ps is None or "cpu" not in ps else (*ps, "xlapy") for ps in branches_platforms
    )


def _put_forwarded(original: Any, x: Any) -> Any:
    """loops._maybe_put: JAX's, which puts a NumPy array on the first CPU device; without
    a CPU backend, `jax.device_put` to the default device (uncommitted, as JAX's is)."""
    import numpy as np
    from jax._src import api
    from jax._src import xla_bridge as xb

    if isinstance(x, np.ndarray) and "cpu" not in xb.backends():
        return api.device_put(x)
    return original(x)


def register_jaxlib_lapack() -> list[str]:
    """jaxlib's own LAPACK handlers (C, XLA's FFI) for the CPU targets JAX emits that xlapy
    has no handler of its own for (tridiagonal solve, Schur, Hessenberg, pivoted QR, ...):
    the xlapy platform receives the CPU's lowerings, so each of them must resolve. xlapy's
    handlers keep their names. Returns the names registered."""
    from jaxlib.cpu import _lapack

    from xlapy.backends.custom_calls import GLOBAL_REGISTRY, ApiVersion, register
    from xlapy.backends.xla_ffi import CHandler

    _lapack.initialize()  # jaxlib's kernels call SciPy's LAPACK through pointers set here
    added = []
    for name, fn in sorted(_lapack.registrations().items()):
        if not name.endswith("_ffi") or (name, "Host") in GLOBAL_REGISTRY:
            continue
        pointer = capsule_pointer(fn, f"jaxlib's LAPACK target {name!r}")
        handler = CHandler(name, pointer, column_major=True)
        register(name, handler, "Host", ApiVersion.TYPED_FFI)
        added.append(name)
    return added + register_jaxlib_sparse()


def register_jaxlib_sparse() -> list[str]:
    """jaxlib's CPU sparse kernels (`cpu_csr_sparse_dense_ffi`: BCSR times dense), which
    jax.experimental.sparse registers for platform "cpu" alone, though the xlapy platform
    receives the same CPU lowerings. Returns the names registered."""
    from jaxlib import cpu_sparse

    from xlapy.backends.custom_calls import GLOBAL_REGISTRY, ApiVersion, register
    from xlapy.backends.xla_ffi import CHandler

    added = []
    for name, fn, api_version in cpu_sparse.registrations().get("cpu", []):
        if api_version != 1 or (name, "Host") in GLOBAL_REGISTRY:
            continue
        pointer = capsule_pointer(fn, f"jaxlib's sparse target {name!r}")
        register(name, CHandler(name, pointer), "Host", ApiVersion.TYPED_FFI)
        added.append(name)
    return added


def capsule_pointer(obj: Any, what: str) -> int:
    """The pointer a PyCapsule holds (whatever its name); TypeError if `obj` is none."""
    import ctypes

    api = ctypes.pythonapi
    api.PyCapsule_IsValid.restype = ctypes.c_int
    api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
    api.PyCapsule_GetName.restype = ctypes.c_char_p
    api.PyCapsule_GetName.argtypes = [ctypes.py_object]
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    if type(obj).__name__ != "PyCapsule":
        raise TypeError(f"{what}: expected a PyCapsule holding a function pointer, got {obj!r}")
    name = api.PyCapsule_GetName(obj)
    pointer = api.PyCapsule_GetPointer(obj, name)
    if not pointer:
        raise TypeError(f"{what}: the PyCapsule holds a null pointer")
    return pointer


def register_ffi_target(
    name: str, fn: Any, platform: str, api_version: int = 0, traits: Any = 0
) -> None:
    """JAX's custom-call handler for platform "xlapy": `fn` is a PyCapsule holding an XLA FFI
    handler (api_version 1; or a dict of stage -> capsule: "execute", and "instantiate" for
    a handler keeping per-instruction state; "prepare" and "initialize" are GPU stages,
    which XLA:CPU does not run either) or a C custom-call function (api_version 0:
    API_VERSION_ORIGINAL). The target goes to xlapy's global custom-call registry for the
    CPU ("Host")."""
    from xlapy.backends.custom_calls import ApiVersion, register
    from xlapy.backends.xla_ffi import CHandler

    what = f"custom-call target {name!r} for xlapy"
    if api_version == 0:
        register(name, capsule_pointer(fn, what), "Host", ApiVersion.ORIGINAL)
        return
    if api_version != 1:
        raise ValueError(f"{what}: api_version must be 0 or 1, got {api_version}")
    instantiate = 0
    if isinstance(fn, dict):
        unknown = set(fn) - {"execute", "instantiate", "prepare", "initialize"}
        if unknown or "execute" not in fn:
            raise ValueError(
                f"{what}: an FFI handler's stages are instantiate, prepare, initialize and "
                f"execute, and the execute stage is required; got {sorted(fn)}"
            )
        if "instantiate" in fn:
            instantiate = capsule_pointer(fn["instantiate"], f"{what} (instantiate stage)")
        fn = fn["execute"]
    handler = CHandler(name, capsule_pointer(fn, what), instantiate=instantiate)
    register(name, handler, "Host", ApiVersion.TYPED_FFI)


def register_ffi_type(name: str, registration: Any) -> None:
    """JAX's type-id handler for platform "xlapy" (jax.ffi.register_ffi_type): gives the
    type an id and writes it into the XLA_FFI_TypeId the capsule points at; an optional
    "type_info" capsule (XLA_FFI_TypeInfo) gives the deleter of state objects of the type."""
    from xlapy.backends import xla_ffi

    info = None
    if isinstance(registration, dict):
        capsule = registration.get("type_id")
        if registration.get("type_info") is not None:
            where = f"FFI type {name!r} for xlapy (type_info)"
            address = capsule_pointer(registration["type_info"], where)
            info = xla_ffi.ffi.cast("XLA_FFI_TypeInfo *", address)
    else:
        capsule = registration
    pointer = capsule_pointer(capsule, f"FFI type {name!r} for xlapy")
    xla_ffi.register_type(name, xla_ffi.ffi.cast("XLA_FFI_TypeId *", pointer), info)
