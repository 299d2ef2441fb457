"""Debug options: XLA's `xla_dump_to` and friends, honoured or rejected, never ignored.

`CompileOptions.debug_options` (from Python, or from the DebugOptions and compiler options
JAX hands the PJRT plugin) may only name the options in DEBUG_OPTIONS; any other is a
RuntimeApiError naming it and the ones xlapy knows, so a setting that would change nothing
is never silently accepted.

With `xla_dump_to=DIR`, every compile writes, as XLA does, into DIR:
  module_NNNN.NAME.before_optimizations.txt                       the HLO as compiled
  module_NNNN.NAME.PLATFORM_after_optimizations.txt               what the backend runs
  module_NNNN.NAME.PLATFORM_after_optimizations-buffer-assignment.txt   its memory plan
NNNN counts the compiles of the process. `xla_dump_hlo_module_re` limits the dumps to
modules whose name it matches (re.search); `xla_dump_hlo_as_text` must be true (the text
form is the only one xlapy writes).
"""

from __future__ import annotations

import itertools
import re
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from xlapy.errors import XlapyError
from xlapy.runtime.errors import RuntimeApiError

if TYPE_CHECKING:
    from xlapy.runtime.executable import LoadedExecutable
    from xlapy.runtime.options import CompileOptions

DEBUG_OPTIONS = {
    "xla_dump_to": "directory to write the HLO before and after optimization into",
    "xla_dump_hlo_as_text": "dump HLO as text (the only form xlapy writes; must be true)",
    "xla_dump_hlo_module_re": "dump only modules whose name matches this regular expression",
}
"""The debug options xlapy honours, with what each does."""


class DebugOptionWarning(UserWarning):
    """A debug option set where xlapy cannot refuse it (the DebugOptions JAX fills from
    $XLA_FLAGS) that xlapy does not honour."""


_counter = itertools.count()
_counter_lock = threading.Lock()


def check_debug_options(options: CompileOptions) -> None:
    """RuntimeApiError for a debug option xlapy does not honour, or a value it cannot."""
    settings = dict(options.debug_options)
    unknown = sorted(k for k in settings if k not in DEBUG_OPTIONS)
    if unknown:
        raise RuntimeApiError(
            f"debug option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} "
            f"{'are' if len(unknown) > 1 else 'is'} not supported by xlapy (it would be "
            f"ignored); supported: {', '.join(DEBUG_OPTIONS)}"
        )
    dump_to = settings.get("xla_dump_to")
    if dump_to is not None and (not isinstance(dump_to, str) or not dump_to):
        raise RuntimeApiError(f"xla_dump_to must name a directory, got {dump_to!r}")
    if settings.get("xla_dump_hlo_as_text", True) not in (True, "true", "True", 1):
        raise RuntimeApiError(
            "xla_dump_hlo_as_text=false: xlapy dumps HLO as text only (no proto or dot form)"
        )
    pattern = settings.get("xla_dump_hlo_module_re")
    if pattern is not None:
        try:
            re.compile(str(pattern))
        except re.error as e:
            raise RuntimeApiError(f"xla_dump_hlo_module_re {pattern!r}: {e}") from e


def dump_compiled(executable: LoadedExecutable) -> list[Path]:
    """Write the dumps `xla_dump_to` asks for (see the module comment); the paths."""
    settings = dict(executable.options.debug_options)
    directory = settings.get("xla_dump_to")
    if not directory:
        return []
    pattern = settings.get("xla_dump_hlo_module_re")
    if pattern is not None and not re.search(str(pattern), executable.name):
        return []
    program = executable.backend_program()
    with _counter_lock:
        number = next(_counter)
    stem = f"module_{number:04d}.{executable.name}"
    after = f"{stem}.{executable.platform}_after_optimizations"
    try:
        plan = program.buffer_assignment.to_text() + "\n"
    except XlapyError as e:  # the module could not be planned: say why
        plan = f"no buffer assignment: {e}\n"
    files = {
        f"{stem}.before_optimizations.txt": executable.hlo_text(),
        f"{after}.txt": program.module.to_text(),
        f"{after}-buffer-assignment.txt": plan,
    }
    out = Path(str(directory))
    try:
        out.mkdir(parents=True, exist_ok=True)
        paths = []
        for name, text in files.items():
            path = out / name
            path.write_text(text)
            paths.append(path)
    except OSError as e:
        raise RuntimeApiError(f"xla_dump_to={directory}: cannot write the dumps: {e}") from e
    return paths
