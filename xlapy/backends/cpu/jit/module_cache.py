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
import re
import time
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
    """A SHA-256 of every Python source of the xlapy package, computed once per process.
    The digest is also kept in the disk cache under a key made of every source's name,
    size, modification and change times and inode (`os.stat`: what Python's own bytecode
    cache trusts, and more), so a fresh process stats the sources (~1 ms) instead of
    reading and hashing them (~10 ms) while none has changed."""
    return source_fingerprint(str(Path(__file__).resolve().parents[3]))


def source_fingerprint(root: str) -> str:
    """package_fingerprint of the Python sources under `root`."""
    sources = _sources(root)
    stamp = hashlib.sha256()
    newest = 0
    for name in sources:
        st = os.stat(os.path.join(root, name))
        newest = max(newest, st.st_mtime_ns, st.st_ctime_ns)
        stamp.update(
            f"{name}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}\0{st.st_ino}\0".encode()
        )
    memo = jit.content_key("source-fingerprint", str(root), stamp.hexdigest())
    known = jit.read_entry(memo, FINGERPRINT_SUFFIX)
    if known is not None and _HEX64.fullmatch(known):
        return known.decode()
    h = hashlib.sha256()
    for name in sources:
        h.update(name.encode())
        with open(os.path.join(root, name), "rb") as f:
            h.update(f.read())
    digest = h.hexdigest()
    if time.time_ns() - newest > RACY_NS:
        jit.write_entry(memo, FINGERPRINT_SUFFIX, digest.encode())
    return digest


FINGERPRINT_SUFFIX = ".fp"
RACY_NS = 2_000_000_000
"""No memo is written while a source changed less than this long ago: file times advance
in clock ticks, so a file written again within one tick at the same size has the same
stats (git's "racy clean" entries, handled the same way)."""
_HEX64 = re.compile(rb"[0-9a-f]{64}")


def _sources(root: str) -> list[str]:
    """The package's Python sources under `root`, relative, in Path order."""
    sources = []
    for folder, subfolders, files in os.walk(root):  # (strings: pathlib cost more than the hashing)
        subfolders.sort()
        relative = os.path.relpath(folder, root)
        sources += [os.path.normpath(os.path.join(relative, f)) for f in files if f.endswith(".py")]
    return sorted(sources, key=lambda n: n.split(os.sep))  # (Path order, as before)


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
