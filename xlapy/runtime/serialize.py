"""The serialized form of an executable: versioned, checksummed, and loaded without running
any code (no pickle).

Layout (integers little-endian):

    offset  size  field
    0       8     magic b"XLAPYEXE"
    8       4     format version (uint32, currently 1)
    12      4     metadata length M (uint32)
    16      8     HLO text length H (uint64)
    24      M     metadata: UTF-8 JSON object (platform, fingerprint, options, module name,
                  xlapy version)
    24+M    H     the compiled module as HLO text (UTF-8), aliases included
    24+M+H  32    SHA-256 of every byte before it

Loading checks the magic, the version, the lengths, the checksum and the JSON, then parses
and verifies the HLO text like any other input.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from typing import Any

from xlapy.runtime.errors import SerializationError

MAGIC = b"XLAPYEXE"
FORMAT_VERSION = 1
_HEADER = struct.Struct("<8sIIQ")
_DIGEST = 32


@dataclass(frozen=True, slots=True)
class SerializedExecutable:
    """The decoded parts of serialized bytes."""

    metadata: dict[str, Any]
    hlo_text: str


def encode(metadata: dict[str, Any], hlo_text: str) -> bytes:
    """Serialized bytes holding `metadata` (JSON-able) and `hlo_text`."""
    meta = json.dumps(metadata, sort_keys=True, separators=(",", ":")).encode()
    hlo = hlo_text.encode()
    body = _HEADER.pack(MAGIC, FORMAT_VERSION, len(meta), len(hlo)) + meta + hlo
    return body + hashlib.sha256(body).digest()


def decode(data: bytes) -> SerializedExecutable:
    """Check and split serialized bytes; SerializationError saying what is wrong."""
    if isinstance(data, str) or not isinstance(data, bytes | bytearray | memoryview):
        raise SerializationError(
            f"serialized executable must be bytes (what Executable.serialize() returned), "
            f"got {type(data).__name__}"
        )
    data = bytes(data)
    if len(data) < _HEADER.size + _DIGEST:
        raise SerializationError(
            f"serialized executable is truncated: {len(data)} bytes, the header and checksum "
            f"alone take {_HEADER.size + _DIGEST}"
        )
    magic, version, meta_len, hlo_len = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise SerializationError(
            f"not a serialized xlapy executable: magic {magic!r}, expected {MAGIC!r}"
        )
    if version != FORMAT_VERSION:
        raise SerializationError(
            f"serialized executable has format version {version}; this xlapy reads version "
            f"{FORMAT_VERSION} (recompile the program)"
        )
    expected = _HEADER.size + meta_len + hlo_len + _DIGEST
    if len(data) != expected:
        what = "is truncated" if len(data) < expected else "has trailing bytes"
        raise SerializationError(
            f"serialized executable {what}: {len(data)} bytes, the header says {expected}"
        )
    body, digest = data[:-_DIGEST], data[-_DIGEST:]
    if hashlib.sha256(body).digest() != digest:
        raise SerializationError("serialized executable is corrupted: SHA-256 checksum mismatch")
    start = _HEADER.size
    try:
        metadata = json.loads(data[start : start + meta_len].decode())
    except (ValueError, RecursionError) as e:  # not UTF-8 / JSON, nested or numbers too deep
        raise SerializationError(f"serialized executable has unreadable metadata: {e}") from e
    try:
        hlo_text = data[start + meta_len : start + meta_len + hlo_len].decode()
    except UnicodeDecodeError as e:
        raise SerializationError(
            f"serialized executable's HLO text is not UTF-8: {e.reason} at byte {e.start} "
            f"of the text"
        ) from e
    if not isinstance(metadata, dict):
        raise SerializationError("serialized executable metadata is not a JSON object")
    return SerializedExecutable(metadata, hlo_text)
