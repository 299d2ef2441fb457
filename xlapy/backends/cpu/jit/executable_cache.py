# The whole-executable cache: one disk entry per compiled program, so that a warm compile
# reads one file instead of running the pass pipeline and reading an entry and an object
# per kernel.
#
# Key: a SHA-256 (engine.content_key: it also covers the CPU and its features, the xlapy
# and llvmlite versions and LLVM's optimization level) of the program's text as the CPU
# compiler receives it, every compile option (JSON), the subnormal mode and a SHA-256 of
# every Python source of xlapy (module_cache.package_fingerprint: any change to a pass, the
# lowering or the code generator is a miss).
#
# Value ("<name>.exe", authenticated and written atomically like every entry, disk_cache.py):
#
#   {"module": <the optimized, scheduled module's text>,
#    "kernels": [[instruction, in-place pairs, flush, kernel key, object key,
#                 outputs, params, outer extent], ...],
#    "objects": [[object key, length], ...]}\n<the objects' bytes, in that order>
#
# A warm compile parses the module text, checks it has the program's parameter and result
# shapes, assigns its buffers and lowers it; each kernel the lowering asks for is found in
# the entry by (instruction, in-place pairs, flush) without printing its computation, and
# its object is loaded from the entry's bytes. Nothing in the entry is trusted beyond its
# authentication: every kernel's shapes, in-place pairs and outer extent are recomputed
# from the module being lowered (kernel._validated) and an entry that disagrees, is
# damaged, truncated or not authenticated by this user's key is not used: a CacheEntryWarning
# says so and the program is compiled again (and the entry rewritten).

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from xlapy.backends.cpu.jit import engine as jit
from xlapy.backends.cpu.jit.disk_cache import read_entry_or_warn, warn_rejected
from xlapy.backends.cpu.jit.module_cache import package_fingerprint

SUFFIX = ".exe"
UNKEYED_OPTIONS = frozenset({"custom_calls"})
"""Options outside the key: the client's custom-call registry (an object per client) is
read by the lowering alone, which every compile runs, never by what the entry holds."""
_HEX64 = re.compile(r"[0-9a-f]{64}")

KernelId = tuple[str, tuple[tuple[int, int], ...], int]
"""A kernel's place in a program: (site, in-place pairs, flush denormals), the site being
"computation/instruction" (kernel.kernel_site)."""


@dataclass(frozen=True, slots=True)
class KernelRecord:
    """Which cached kernel an instruction of the program runs, and its entry (the shapes
    as text, checked against the computation when the entry is used)."""

    kernel_key: str
    object_key: str
    outputs: tuple[str, ...]
    params: tuple[str, ...]
    outer_extent: int


@dataclass
class KernelBook:
    """The kernels of one compile: those an entry gave (`known`, with their objects' bytes)
    and those this compile used (`used`, written to a new entry)."""

    known: dict[KernelId, KernelRecord] = field(default_factory=dict)
    objects: dict[str, bytes] = field(default_factory=dict)
    used: dict[KernelId, KernelRecord] = field(default_factory=dict)
    rejected: list[str] = field(default_factory=list)
    """Why entries' kernels were not used (the compile then made them again)."""
    known_names: frozenset[str] = frozenset()
    """The sites of `known`."""
    ambiguous: set[KernelId] = field(default_factory=set)
    """Ids this compile gave two different kernels: an entry cannot say which of them an
    instruction runs, so it leaves them out (they compile, or come from the per-kernel
    cache, on every compile)."""

    def record(self, kid: KernelId, record: KernelRecord) -> None:
        """Note that the instruction at `kid` runs the kernel of `record`."""
        if self.used.setdefault(kid, record) != record:
            self.ambiguous.add(kid)


@dataclass
class Entry:
    """A program's cache entry, as read."""

    key: str
    module_text: str
    book: KernelBook


ENABLE_ENV = "XLAPY_EXECUTABLE_CACHE"


def enabled() -> bool:
    """Whether compiles read and write whole-executable entries: yes unless
    $XLAPY_EXECUTABLE_CACHE=0 (the per-kernel cache is used either way). It was opt-in for a
    session after a warm entry gave a native switch loop wrong results: kernels were named
    by instruction alone, and the three branches' roots were all `r` (kernel.kernel_site)."""
    return os.environ.get(ENABLE_ENV, "1").strip() != "0"


def cache_key(text: str, options: Mapping[str, Any], flush_denormals: bool) -> str:
    """The entry name for compiling `text` with `options`."""
    keyed = {k: v for k, v in options.items() if k not in UNKEYED_OPTIONS}
    opts = json.dumps(keyed, sort_keys=True, default=repr)
    mode = "flush-denormals" if flush_denormals else "ieee-denormals"
    return jit.content_key("executable", text, opts, mode, package_fingerprint())


def read(key: str) -> Entry | None:
    """The entry `key`, or None: missing, or rejected (damaged, truncated, forged, or not a
    private regular file: a CacheEntryWarning says which)."""
    payload = read_entry_or_warn(key, SUFFIX, "compiled program")
    if payload is None:
        return None
    try:
        return _decode(key, payload)
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        warn_rejected(key + SUFFIX, f"its contents are malformed ({e})")
        return None


def _decode(key: str, payload: bytes) -> Entry:
    head, sep, blob = payload.partition(b"\n")
    if not sep:
        raise ValueError("no header line")
    doc = json.loads(head.decode())
    book = KernelBook()
    offset = 0
    for object_key, length in doc["objects"]:
        if not (isinstance(object_key, str) and _HEX64.fullmatch(object_key)):
            raise ValueError(f"bad object key {object_key!r}")
        if not isinstance(length, int) or length <= 0 or offset + length > len(blob):
            raise ValueError("object lengths exceed the entry (truncated?)")
        book.objects[object_key] = blob[offset : offset + length]
        offset += length
    if offset != len(blob):
        raise ValueError(f"{len(blob) - offset} trailing bytes after the objects")
    for name, pairs, flush, kernel_key, object_key, outputs, params, extent in doc["kernels"]:
        if not (_HEX64.fullmatch(kernel_key) and object_key in book.objects):
            raise ValueError(f"kernel {name!r} names an object the entry does not hold")
        kid = (str(name), tuple((int(o), int(i)) for o, i in pairs), int(flush))
        book.known[kid] = KernelRecord(
            kernel_key, object_key, tuple(map(str, outputs)), tuple(map(str, params)), int(extent)
        )
    book.known_names = frozenset(name for name, _, _ in book.known)
    module_text = doc["module"]
    if not isinstance(module_text, str):
        raise ValueError("the module is not text")
    return Entry(key, module_text, book)


def write(key: str, module_text: str, book: KernelBook) -> bool:
    """Write the entry for a compile that produced `module_text` and used `book.used`; the
    objects are read back from the disk cache (False, and nothing written, when one of them
    is not there: the entry would be incomplete)."""
    objects: dict[str, bytes] = {}
    for kid, record in book.used.items():
        if record.object_key in objects or kid in book.ambiguous:
            continue
        data = book.objects.get(record.object_key) or jit.read_entry(record.object_key, ".o")
        if data is None:
            return False
        objects[record.object_key] = data
    kernels = [
        [
            *(name, [list(p) for p in pairs], flush, r.kernel_key, r.object_key),
            *(list(r.outputs), list(r.params), r.outer_extent),
        ]
        for (name, pairs, flush), r in sorted(book.used.items())
        if (name, pairs, flush) not in book.ambiguous
    ]
    head = {
        "module": module_text,
        "kernels": kernels,
        "objects": [[k, len(v)] for k, v in objects.items()],
    }
    payload = json.dumps(head).encode() + b"\n" + b"".join(objects.values())
    jit.write_entry(key, SUFFIX, payload)
    return True


VERIFIED = ".verified"
_VERIFIED_MARK = b"verified"


def _verified_key(text: str) -> str:
    return jit.content_key("verified", text, package_fingerprint())


def verified_before(text: str) -> bool:
    """Whether this user's xlapy, with these very sources, verified the module of `text`
    before (an authenticated marker: verification depends on nothing else)."""
    return jit.read_entry(_verified_key(text), VERIFIED) == _VERIFIED_MARK


def mark_verified(text: str) -> None:
    """Record that the module of `text` passed the verifier."""
    jit.write_entry(_verified_key(text), VERIFIED, _VERIFIED_MARK)
