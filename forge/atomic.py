"""Atomic file writes: a reader sees the old file or the new one, never half of either, and a crash leaves no litter.

Every save (plans, cache entries, sandbox verdicts, cassettes) goes through `write_text_atomic` /
`write_json_atomic`, because the obvious `path.with_name(name + ".tmp")` pattern fails under concurrency: two
processes saving one plan share the temporary name, so one renames the other's half-written file into place (a
reader then sees invalid JSON; see tests/forge/test_atomic.py, which reproduces it with two writers and a reader),
or its own rename fails because the other already moved the file. Here each write gets a unique temporary from
`tempfile.mkstemp` in the target's folder (same filesystem, so `os.replace` is an atomic rename), which is written,
flushed and fsynced before the rename; the folder is fsynced afterwards where the platform allows it, so the rename
itself survives a power loss. On any failure (disk full, interrupt, a folder as target) the temporary is removed
and the error names the target path.

The folder must exist: creating it here would hide a mistyped `--out` until hours of work had been spent.
A new file gets the permissions `open()` would give it (0o666 less the umask); a replaced file keeps its mode.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["write_bytes_atomic", "write_json_atomic", "write_text_atomic"]


def _current_umask() -> int:
    """The process umask: from /proc on Linux (reading it there changes nothing), else by setting and restoring it
    (os.umask can only be read that way, which races threads creating files, so it is done once, at import)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _current_umask()


def write_text_atomic(path: str | os.PathLike[str], text: str, *, encoding: str = "utf-8") -> Path:
    """Replace `path` with `text` atomically (see the module docstring); returns the path."""
    return write_bytes_atomic(path, text.encode(encoding))


def write_json_atomic(path: str | os.PathLike[str], data: Any, *, indent: int | None = None,
                      sort_keys: bool = False, default: Any = None, allow_nan: bool = True) -> Path:
    """Replace `path` with `data` as JSON (plus a final newline) atomically; returns the path.

    The data is serialised before any file is touched, so an object JSON cannot hold raises and leaves nothing.
    """
    text = json.dumps(data, indent=indent, sort_keys=sort_keys, default=default, allow_nan=allow_nan)
    return write_bytes_atomic(path, (text + "\n").encode("utf-8"))


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> Path:
    """Replace `path` with `data` atomically (see the module docstring); returns the path."""
    target = Path(path)
    folder = target.parent
    if target.is_dir():
        raise IsADirectoryError(f"cannot write {target}: it is a directory; give a file path inside it")
    if not folder.is_dir():
        raise FileNotFoundError(f"cannot write {target}: folder {folder} does not exist (create it first)")
    try:
        mode = stat.S_IMODE(target.stat().st_mode)
    except OSError:
        mode = 0o666 & ~_UMASK
    try:
        fd, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise _named(exc, target) from exc
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        if isinstance(exc, OSError):
            raise _named(exc, target) from exc
        raise
    _fsync_folder(folder)
    return target


def _named(exc: OSError, target: Path) -> OSError:
    """The same kind of OSError, its message naming the target instead of the temporary file."""
    reason = exc.strerror or str(exc)
    if exc.errno:
        return type(exc)(exc.errno, f"cannot write {target}: {reason}")
    return type(exc)(f"cannot write {target}: {reason}")


def _fsync_folder(folder: Path) -> None:
    """fsync a folder so a rename in it is durable; a no-op where folders cannot be opened (Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
