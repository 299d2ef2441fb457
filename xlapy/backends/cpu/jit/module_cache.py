# The compiled-module cache: the CPU pipeline's result for a module, kept on disk.
#
# Compiling a module runs the pass pipeline (simplification, fusion, layout, copy
# insertion) and the preparation for buffer assignment (flattening, scheduling, copies);
# their result is a scheduled module whose text order is the schedule. A warm compile of
# the same module with the same options gets the same result, so it is kept: the text of
# the prepared module, in the kernel cache's directory (jit.cache_dir()), keyed by the
# input module's text, the options the pipeline reads and a SHA-256 of every Python source
# of xlapy (any change to a pass, the parser or the printer is a miss). Buffer assignment
# and lowering run as always on the parsed text; the file is authenticated (HMAC under the
# user's key) and written atomically like every cache file (disk_cache.py), and a cached
# module is used only when it has the compiled program's parameter and result shapes.
#
# This is XLA's persistent compilation cache in miniature; unlike XLA's, it keeps the
# optimized HLO rather than the executable, so the thunks, the arena layout and the kernel
# bindings are always made by the code that runs them.

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from xlapy.backends.cpu.jit import engine as jit

SUFFIX = ".hlo"
PIPELINE_OPTIONS = ("optimize", "verify", "memory_scheduler")
"""The compile options the cached result depends on (the others affect lowering only;
memory_scheduler decides where copy insertion puts copies)."""


@functools.cache
def package_fingerprint() -> str:
    """A SHA-256 of every Python source of the xlapy package, computed once per process."""
    root = Path(__file__).resolve().parents[3]
    sources = []
    for folder, subfolders, files in os.walk(root):  # (strings: pathlib cost more than the hashing)
        subfolders.sort()
        relative = os.path.relpath(folder, root)
        sources += [os.path.normpath(os.path.join(relative, f)) for f in files if f.endswith(".py")]
    h = hashlib.sha256()
    for name in sorted(sources, key=lambda n: n.split(os.sep)):  # (Path order, as before)
        h.update(name.encode())
        with open(os.path.join(root, name), "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def cache_key(module_text: str, options: Mapping[str, Any]) -> str:
    """The name of the cache file for compiling `module_text` with `options`."""
    pipeline = {k: options[k] for k in PIPELINE_OPTIONS if k in options}
    return jit.content_key(
        "module", module_text, json.dumps(pipeline, sort_keys=True), package_fingerprint()
    )


def read(key: str) -> str | None:
    """The prepared module's text cached under `key`, or None (missing or damaged)."""
    data = jit.read_entry(key, SUFFIX)
    if data is None:
        return None
    try:
        return data.decode()
    except UnicodeDecodeError:
        return None


def write(key: str, prepared_text: str) -> None:
    """Keep `prepared_text` under `key` (failures to write are ignored: a cache)."""
    jit.write_entry(key, SUFFIX, prepared_text.encode())
