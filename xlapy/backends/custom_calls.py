"""The custom-call target registry: code a program calls by name, per platform.

A target is registered under (name, platform), platform "Host" (the CPU) or "CUDA" (the
GPU), with an API version saying how it is called. Registering the same (name, platform)
twice is an error, as is looking up a name that is not there (the message lists similar
names).

Python targets (api_version "python", the default for callables)
------------------------------------------------------------------
The operands are flattened to their leaf arrays in pre-order (a tuple operand contributes
each of its leaves, depth first), as XLA's CPU convention does. The target is called as

    fn(ins, opaque)            -> result
    fn(ins, opaque, outs)      -> result or None

`ins` is a tuple of read-only NumPy arrays, `opaque` the instruction's backend_config text
(a str, "" when absent). A target whose signature has a third parameter named `outs`
receives the result leaves preallocated (pre-order, writable): zeros, or a copy of the
operand leaf an `output_to_operand_aliasing` entry names. It may fill them in place and
return None; this is how a tuple output serves as scratch memory. Otherwise the target
returns the result: an array for an array-shaped result, and for a tuple-shaped one either
the nested tuple or a flat sequence of its leaves in pre-order; a leaf given as None keeps
its preallocated value (so an aliased leaf returns the operand's copy unchanged). Each leaf
must have the shape and dtype the instruction declares.

Later API versions (the CPU C conventions "original", "status_returning",
"status_returning_unified", "typed_ffi" and the GPU convention) are named in ApiVersion so
that registrations can say which one a C function pointer follows; the interpreter runs
Python targets only and reports any other kind as a CustomCallError.
"""

from __future__ import annotations

import difflib
import enum
import inspect
from collections.abc import Callable
from dataclasses import dataclass

from xlapy.errors import CustomCallError

PLATFORMS = ("Host", "CUDA")


class ApiVersion(enum.Enum):
    """How a target is called. PYTHON is the Python-callable convention above; the others
    are XLA's C conventions (API_VERSION_* in HLO text)."""

    PYTHON = "python"
    ORIGINAL = "API_VERSION_ORIGINAL"
    STATUS_RETURNING = "API_VERSION_STATUS_RETURNING"
    STATUS_RETURNING_UNIFIED = "API_VERSION_STATUS_RETURNING_UNIFIED"
    TYPED_FFI = "API_VERSION_TYPED_FFI"

    @staticmethod
    def parse(value: ApiVersion | str) -> ApiVersion:
        """An ApiVersion from itself, its value, or its name in any case."""
        if isinstance(value, ApiVersion):
            return value
        for version in ApiVersion:
            if value in (version.value, version.name, version.name.lower()):
                return version
        names = ", ".join(v.value for v in ApiVersion)
        raise CustomCallError(
            f"unknown custom-call api_version {value!r} (expected one of {names})"
        )


@dataclass(frozen=True, slots=True)
class CustomCallTarget:
    """One registered target."""

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


class CustomCallRegistry:
    """Targets keyed by (name, platform)."""

    def __init__(self):
        self._targets: dict[tuple[str, str], CustomCallTarget] = {}

    def register(
        self,
        name: str,
        fn: Callable,
        platform: str = "Host",
        api_version: ApiVersion | str = ApiVersion.PYTHON,
    ) -> CustomCallTarget:
        """Register `fn` as target `name` on `platform`; CustomCallError if taken."""
        if platform not in PLATFORMS:
            raise CustomCallError(
                f"custom-call platform must be one of {PLATFORMS}, got {platform!r}"
            )
        version = ApiVersion.parse(api_version)
        if version is ApiVersion.PYTHON and not callable(fn):
            raise CustomCallError(f"custom-call target {name!r}: {fn!r} is not callable")
        key = (name, platform)
        if key in self._targets:
            raise CustomCallError(
                f"custom-call target {name!r} is already registered for platform {platform}"
            )
        target = CustomCallTarget(name, platform, fn, version, takes_outs_parameter(fn))
        self._targets[key] = target
        return target

    def unregister(self, name: str, platform: str = "Host") -> None:
        """Remove target `name` from `platform` (no error if it is not there)."""
        self._targets.pop((name, platform), None)

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


def register(
    name: str,
    fn: Callable,
    platform: str = "Host",
    api_version: ApiVersion | str = ApiVersion.PYTHON,
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
    "xla.sdy.GlobalToLocalShape",
    "xla.sdy.LocalToGlobalShape",
)

for _name in BUILTIN_IDENTITY_TARGETS:
    for _platform in PLATFORMS:
        GLOBAL_REGISTRY.register(_name, _identity, _platform)
