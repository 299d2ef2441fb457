"""xlapy as a PJRT plugin for JAX: the PJRT C API over xlapy.runtime (capi), registered as
JAX's platform "xlapy" (jax_plugin.initialize, the `jax_plugins` entry point). See
docs/jax.md."""

from xlapy.pjrt.capi import api_pointer, capsule, implemented
from xlapy.pjrt.core import profile
from xlapy.pjrt.executables import executable_of, memory_report
from xlapy.pjrt.jax_plugin import initialize

__all__ = [
    "api_pointer",
    "capsule",
    "executable_of",
    "implemented",
    "initialize",
    "memory_report",
    "profile",
]
