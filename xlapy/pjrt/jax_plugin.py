"""JAX's entry point for xlapy (group `jax_plugins` in pyproject.toml): JAX calls
`initialize()` at start-up, which registers xlapy's PJRT C API as the platform "xlapy"."""

from __future__ import annotations

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
    # jnp.linalg, ...) serve the "xlapy" platform too; sharing the dict keeps later
    # registrations for "cpu" visible.
    mlir._platform_specific_lowerings["xlapy"] = mlir._platform_specific_lowerings["cpu"]
    c_api = capsule()
    xla_bridge.register_plugin("xlapy", priority=-100, c_api=c_api, options=options or None)
    return c_api
