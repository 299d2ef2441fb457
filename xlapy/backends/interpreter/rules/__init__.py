"""Per-opcode evaluation rules. Importing this package registers the rules of every op that
computes on its operands alone (what constant folding may evaluate); `register_all()` adds
the rules that reach the backends' machinery: custom calls and FFI (`custom_call`) and
collectives between devices (`collectives`). The interpreter registers all of them."""

import importlib
import pkgutil

BACKEND_FACING = ("collectives", "custom_call")
"""Rule modules that import backends.custom_calls / ffi / collectives: not loaded with the
package, so that constant folding (passes) does not load them."""

for _info in pkgutil.iter_modules(__path__):
    if _info.name not in BACKEND_FACING:
        importlib.import_module(f"{__name__}.{_info.name}")


def register_all() -> None:
    """Register the backend-facing rules too (idempotent)."""
    for name in BACKEND_FACING:
        importlib.import_module(f"{__name__}.{name}")
