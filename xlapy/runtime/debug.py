"""Debug options: XLA's `xla_dump_to` and friends, honoured or rejected, never ignored.

`CompileOptions.debug_options` (from Python, or from the DebugOptions and compiler options
JAX hands the PJRT plugin) may name:
- the options in DEBUG_OPTIONS, which xlapy honours;
- XLA options that cannot change what a program computes on xlapy's CPU device: other
  backends' options (OTHER_BACKEND_PREFIXES: XLA:CPU ignores them too) and diagnostics xlapy
  does not produce (DIAGNOSTIC_OPTIONS). They are accepted with a DebugOptionWarning naming
  them, as XLA accepts them (JAX passes such options to every backend);
any other is a RuntimeApiError naming it and the ones xlapy knows ("No such compile option"
for a name XLA does not have either; "not supported" for an XLA option that would change
the program, such as fast math or pass selection), so a setting that would change nothing
is never silently accepted.

With `xla_dump_to=DIR`, every compile writes, as XLA does, into DIR:
  module_NNNN.NAME.before_optimizations.txt                       the HLO as compiled
  module_NNNN.NAME.PLATFORM_after_optimizations.txt               what the backend runs
  module_NNNN.NAME.PLATFORM_after_optimizations-buffer-assignment.txt   its memory plan
NNNN counts the compiles of the process. `xla_dump_hlo_module_re` limits the dumps to
modules whose name it matches (re.search); `xla_dump_max_hlo_modules=N` stops after N
modules dumped in the process (negative: no limit); `xla_dump_hlo_as_text` must be true (the
text form is the only one xlapy writes).
"""

from __future__ import annotations

import itertools
import re
import threading
import warnings
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
    "xla_dump_max_hlo_modules": "dump at most this many modules in the process (<0: no limit)",
}
"""The debug options xlapy honours, with what each does."""

OTHER_BACKEND_PREFIXES = ("xla_gpu_", "xla_tpu_", "xla_jf_", "xla_sc_")
"""XLA's options for other backends: accepted with a warning, as XLA:CPU ignores them."""

DIAGNOSTIC_OPTIONS = {
    "xla_embed_ir_in_executable": "xlapy executables keep no LLVM IR (xla_dump_to gives HLO)",
    "xla_dump_hlo_pass_re": "xlapy dumps before and after optimization, not per pass",
    "xla_dump_hlo_pipeline_re": "xlapy dumps before and after optimization, not per pipeline",
    "xla_dump_hlo_as_proto": "xlapy dumps text only",
    "xla_dump_hlo_as_dot": "xlapy dumps text only",
    "xla_dump_hlo_as_url": "xlapy dumps text only",
    "xla_dump_hlo_as_html": "xlapy dumps text only",
    "xla_dump_hlo_snapshots": "xlapy dumps no snapshots",
    "xla_dump_module_metadata": "xlapy dumps no module metadata",
    "xla_dump_fusion_visualization": "xlapy dumps text only",
    "xla_dump_compress_protos": "xlapy dumps text only",
    "xla_dump_include_timestamp": "xlapy's dump names carry no timestamp",
}
"""XLA's diagnostic options xlapy does not produce (they never change a program's results):
accepted with a DebugOptionWarning saying what xlapy does instead."""


class DebugOptionWarning(UserWarning):
    """A debug option set where xlapy cannot refuse it (the DebugOptions JAX fills from
    $XLA_FLAGS) that xlapy does not honour."""


_counter = itertools.count()
_counter_lock = threading.Lock()
_dumped = [0]
"""How many modules this process has dumped (xla_dump_max_hlo_modules counts them)."""


def check_debug_options(options: CompileOptions) -> None:
    """RuntimeApiError for a debug option xlapy does not honour, or a value it cannot."""
    settings = dict(options.debug_options)
    for name in sorted(k for k in settings if k not in DEBUG_OPTIONS):
        if name.startswith(OTHER_BACKEND_PREFIXES):
            why = "it is for another backend; it has no effect on a CPU device (as on XLA:CPU)"
        elif name in DIAGNOSTIC_OPTIONS:
            why = DIAGNOSTIC_OPTIONS[name]
        else:
            continue
        warnings.warn(
            DebugOptionWarning(f"compile option {name} is not honoured by xlapy: {why}"),
            stacklevel=3,
        )
    unknown = sorted(
        k
        for k in settings
        if k not in DEBUG_OPTIONS
        and k not in DIAGNOSTIC_OPTIONS
        and not k.startswith(OTHER_BACKEND_PREFIXES)
    )
    if unknown:
        kind = (
            "is not supported by xlapy (it would change the program in a way xlapy does not"
            " implement)"
            if all(k.startswith("xla_") for k in unknown)
            else "is unknown (No such compile option)"
        )
        raise RuntimeApiError(
            f"debug option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} {kind}; "
            f"supported: {', '.join(DEBUG_OPTIONS)}; accepted with a warning: "
            f"{', '.join(p + '*' for p in OTHER_BACKEND_PREFIXES)} and the dump variants"
        )
    limit = settings.get("xla_dump_max_hlo_modules")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
        raise RuntimeApiError(f"xla_dump_max_hlo_modules must be an integer, got {limit!r}")
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
    limit = settings.get("xla_dump_max_hlo_modules")
    with _counter_lock:
        if isinstance(limit, int) and 0 <= limit <= _dumped[0]:
            return []
        _dumped[0] += 1
        number = next(_counter)
    program = executable.backend_program()
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
