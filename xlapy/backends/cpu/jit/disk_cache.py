# The on-disk cache's files, and why xlapy may trust what it reads from them.
#
# The cache holds native code that this process loads and runs, and programs it compiles,
# so an entry is trusted only when this user's xlapy provably wrote it for this very key:
#
# 1. The directory ($XLAPY_CACHE_DIR, or ~/.cache/xlapy/kernels) is created 0700. A
#    directory owned by another user, or writable by group or others, is refused: a
#    CacheTrustWarning says why (once per directory and process) and the process runs
#    without the disk cache (as pip does with a cache directory it does not own).
# 2. Every entry is authenticated with HMAC-SHA256 under a per-user secret key kept outside
#    the cache: $XDG_CONFIG_HOME/xlapy/cache-key (default ~/.config/xlapy/cache-key), 32
#    random bytes, created 0600 in a 0700 directory; a key file that is not a regular file
#    of this user, or that others may read, is refused the same way. The MAC covers the
#    format, the entry's name (its key and suffix) and its payload, so neither a forged
#    entry nor an authentic entry copied under another key's name is accepted: a checksum
#    would only have caught accidents.
# 3. Entries are opened without following symbolic links and without blocking (a FIFO
#    cannot hang the compile), and read only when they are regular files owned by this user
#    no larger than MAX_ENTRY_BYTES. Anything else reads as a miss.
#
# Readers still recompute what they can from the program being compiled rather than trust
# it (kernel.py recomputes a kernel's shapes and loop extent; compiler.py checks that a
# cached module has the program's parameter and result shapes), so that a leaked key alone
# does not turn into out-of-bounds writes.
#
# Writes go to a temporary file in the directory (mkstemp: 0600) that is renamed into place,
# so concurrent compilers never see half a file.

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import stat
import tempfile
import threading
import warnings
from pathlib import Path

FORMAT = b"xlapy-cache 4"
"""The first word of every entry; also part of every cache key, so older layouts are never
read."""

MAX_ENTRY_BYTES = 1 << 30
"""Entries larger than this are neither written nor read."""

KEY_BYTES = 32
KEY_FILE = "cache-key"

_lock = threading.Lock()
_keys: dict[str, bytes] = {}  # _key_file_id() -> secret key
_trusted: dict[str, Path] = {}  # ($XLAPY_CACHE_DIR, $HOME) -> directory found private
_warned: set[str] = set()


class CacheTrustWarning(UserWarning):
    """The disk cache is not used: its directory or key is not private to this user."""


def cache_dir() -> Path:
    """Where cache entries are kept: $XLAPY_CACHE_DIR or ~/.cache/xlapy/kernels."""
    env = os.environ.get("XLAPY_CACHE_DIR")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "xlapy" / "kernels"


LIBRARY_ENV = "XLAPY_LIBRARY_DIR"
"""Environment variable: where the kernel library's objects are kept (jit/kernel_library.py)."""


def library_dir() -> Path:
    """Where the kernel library's objects are kept: $XLAPY_LIBRARY_DIR or
    ~/.cache/xlapy/library. Apart from the kernel cache on purpose: the library is built
    once per machine (like the kernels XLA ships in its binary) and a fresh kernel cache
    directory does not build it again. Same trust rules as the cache (a private directory,
    authenticated entries)."""
    env = os.environ.get(LIBRARY_ENV)
    if env:
        return Path(env)
    return Path.home() / ".cache" / "xlapy" / "library"


def key_file() -> Path:
    """The per-user secret key's file: $XDG_CONFIG_HOME/xlapy/cache-key (default
    ~/.config/xlapy/cache-key)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "xlapy" / KEY_FILE


def _warn(what: str, message: str) -> None:
    with _lock:
        if what in _warned:
            return
        _warned.add(what)
    warnings.warn(
        f"xlapy: {message}; compiling without the disk cache", CacheTrustWarning, stacklevel=4
    )


def _unsafe_dir(path: Path, st: os.stat_result) -> str | None:
    """Why directory `path` is not private to this user, or None."""
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    if st.st_uid != os.getuid():
        return f"{path} is owned by uid {st.st_uid}, not by this user (uid {os.getuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (
            f"{path} is writable by other users (mode {stat.S_IMODE(st.st_mode):o}); "
            f"make it private with `chmod 700 {path}`"
        )
    return None


def _private_dir(path: Path, what: str) -> Path | None:
    """`path`, created 0700 when missing; None (and a warning) when it cannot be made or is
    not private to this user."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.stat(path)
    except OSError as e:
        _warn(str(path), f"the {what} {path} cannot be created: {e}")
        return None
    reason = _unsafe_dir(path, st)
    if reason is not None:
        _warn(str(path), f"the {what} is not trusted: {reason}")
        return None
    return path


def trusted_dir(directory: Path | None = None) -> Path | None:
    """The cache directory (or `directory`) when it is private to this user, else None
    (after a warning). The cache directory found private is remembered for the process (it
    is checked once, as pip checks its cache once; every entry is still authenticated),
    until a write finds it gone (`_forget_dir`); a `directory` given is checked each time."""
    if directory is not None:
        return _private_dir(directory, "cache directory")
    ident = f"{os.environ.get('XLAPY_CACHE_DIR') or ''}\0{os.environ.get('HOME') or ''}"
    known = _trusted.get(ident)
    if known is not None:
        return known
    found = _private_dir(cache_dir(), "cache directory")
    if found is not None:
        with _lock:
            _trusted[ident] = found
    return found


def _forget_dir(directory: Path) -> None:
    with _lock:
        for ident in [i for i, d in _trusted.items() if d == directory]:
            del _trusted[ident]


def secret_key() -> bytes | None:
    """This user's cache key (created on first use), or None (after a warning) when it
    cannot be made or its file is not private."""
    known = _keys.get(_key_file_id())
    if known is not None:
        return known
    path = key_file()
    if _private_dir(path.parent, "cache key directory") is None:
        return None
    try:
        secret = _read_key(path)
        if secret is None:
            _create_key(path)
            secret = _read_key(path)
    except (OSError, ValueError) as e:
        _warn(str(path), f"the cache key {path} is not usable: {e}")
        return None
    if secret is None:
        _warn(str(path), f"the cache key {path} cannot be created")
        return None
    with _lock:
        return _keys.setdefault(_key_file_id(), secret)


def _key_file_id() -> str:
    """What names the key file (key_file() without building its path): the secret key is
    remembered under it."""
    return f"{os.environ.get('XDG_CONFIG_HOME') or ''}\0{os.environ.get('HOME') or ''}"


def _read_key(path: Path) -> bytes | None:
    """The key in `path`; None when there is no such file; ValueError when it is not a
    private regular file of this user holding KEY_BYTES bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("it is not a regular file")
        if st.st_uid != os.getuid():
            raise ValueError(f"it is owned by uid {st.st_uid}, not by this user")
        if st.st_mode & 0o077:
            raise ValueError(
                f"other users may access it (mode {stat.S_IMODE(st.st_mode):o}); "
                f"`chmod 600 {path}` (and consider its old entries leaked)"
            )
        data = os.read(fd, KEY_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) != KEY_BYTES:
        raise ValueError(f"it holds {len(data)} bytes, not {KEY_BYTES}")
    return data


def _create_key(path: Path) -> None:
    """Write a fresh random key to `path` unless another process got there first (the key
    is written to a temporary file, then linked into place, which fails if `path` exists)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-key-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(KEY_BYTES))
            f.flush()
            os.fsync(f.fileno())
        with contextlib.suppress(FileExistsError):  # another process made it first
            os.link(tmp, path)
    finally:
        os.unlink(tmp)


def key_tag() -> str:
    """A short tag of this user's cache key ("" without one): the kernel library names
    its objects with it, so objects authenticated under another key (a test's own key
    directory) are never read, rejected and written over by turns."""
    secret = secret_key()
    if secret is None:
        return ""
    return hmac.new(secret, b"xlapy key tag", hashlib.sha256).hexdigest()[:16]


def _mac(secret: bytes, name: str, payload: bytes) -> bytes:
    h = hmac.new(secret, FORMAT, hashlib.sha256)
    h.update(b"\0" + name.encode() + b"\0")
    h.update(payload)
    return h.hexdigest().encode()


def read_entry(key: str, suffix: str, directory: Path | None = None) -> bytes | None:
    """The payload of entry `key + suffix` of the cache (or of `directory`, a library); None
    when it is missing, not a regular file of this user, too large, damaged or not
    authenticated by this user's key (or the directory is not trusted)."""
    directory = trusted_dir(directory)
    secret = secret_key() if directory is not None else None
    if secret is None or directory is None:
        return None
    name = f"{key}{suffix}"
    try:
        fd = os.open(directory / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if (
            not stat.S_ISREG(st.st_mode)
            or st.st_uid != os.getuid()
            or st.st_size > MAX_ENTRY_BYTES + 256
        ):
            return None
        with os.fdopen(os.dup(fd), "rb") as f:
            raw = f.read(st.st_size + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    head, _, payload = raw.partition(b"\n")
    magic, _, mac = head.rpartition(b" ")
    if magic != FORMAT or not hmac.compare_digest(mac, _mac(secret, name, payload)):
        return None
    return payload


def write_entry(key: str, suffix: str, payload: bytes, directory: Path | None = None) -> None:
    """Write entry `key + suffix` atomically to the cache (or to `directory`): an
    untrusted, full or read-only directory is ignored (it only costs the next compile)."""
    if len(payload) > MAX_ENTRY_BYTES:
        return
    given = directory
    directory = trusted_dir(given)
    secret = secret_key() if directory is not None else None
    if secret is None or directory is None:
        return
    name = f"{key}{suffix}"
    head = FORMAT + b" " + _mac(secret, name, payload) + b"\n"
    try:
        try:
            fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=suffix)
        except FileNotFoundError:  # the directory went: check (and make) it again
            _forget_dir(directory)
            directory = trusted_dir(given)
            if directory is None:
                return
            fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=suffix)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(head + payload)
            os.replace(tmp, directory / name)
        except OSError:
            os.unlink(tmp)
            raise
    except OSError:
        pass


class CacheEntryWarning(UserWarning):
    """A cache entry was found but not used (damaged, truncated, not authenticated by this
    user's key, not a private regular file, or inconsistent with the program): the program
    is compiled again and the entry replaced."""


def warn_rejected(name: str, why: str) -> None:
    """Say that entry `name` is not used, and why."""
    warnings.warn(
        f"xlapy: the disk cache entry {name} is not used: {why}; compiling again",
        CacheEntryWarning,
        stacklevel=3,
    )


def read_entry_or_warn(
    key: str, suffix: str, what: str, directory: Path | None = None
) -> bytes | None:
    """`read_entry`, with a CacheEntryWarning when the entry exists but is rejected (a
    missing entry is an ordinary miss and says nothing)."""
    payload = read_entry(key, suffix, directory)
    if payload is not None:
        return payload
    directory = trusted_dir(directory)
    if directory is None:
        return None
    try:
        os.lstat(directory / f"{key}{suffix}")
    except OSError:
        return None
    warn_rejected(
        f"{key}{suffix}",
        f"the {what} is damaged, truncated, not authenticated by this user's key, too large "
        "or not a regular file of this user",
    )
    return None
