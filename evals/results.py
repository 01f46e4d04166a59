"""The results store (one JSON record per line, appended and fsynced as each problem finishes) and static sharding.

`ResultsStore(path).append(record)` survives a crash at any point: a run that is killed mid-write leaves at most
a truncated last line, which `load()` skips with a warning and the next `append` cuts off before writing. With
`--resume`, `pending()` lists the (problem, sample) pairs that have no record yet. `shard(problems, i, n)` splits
a suite for batch schedulers (`--shard i/N`, `i` counted from 0) by sorted problem id, so every shard process
agrees on the split whatever order it loaded the problems in.

`OutputFolderLock(folder)` makes a run the only writer of its output folder: two `kforge eval --resume` on one
`--out` both saw the same pending problems and appended duplicate records (5 in the run that showed it). It takes
an exclusive, non-blocking `fcntl.flock` on `<folder>/.kforge-eval.lock` and writes its pid there; a second run
fails at once with `OutputFolderBusyError` naming the folder and that pid. The kernel drops the lock when the
holder exits, however it exits, so a killed run never leaves a stale lock (the file itself stays, harmlessly).
flock is advisory and local: runs on different hosts sharing a network folder are not kept apart.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import math
import os
import socket
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import pandas as pd

from forge.errors import KernelForgeError

from .metrics import normalize_records
from .problems.base import Problem

__all__ = [
    "LOCK_FILE", "OutputFolderBusyError", "OutputFolderLock", "ResultsStore", "parse_shard", "record_key", "shard",
]

LOCK_FILE = ".kforge-eval.lock"

logger = logging.getLogger(__name__)

P = TypeVar("P", bound=Problem)


def record_key(suite: str, problem_id: str, sample_index: int = 0) -> tuple[str, str, int]:
    """The identity of one record: (suite, problem_id, sample_index)."""
    return (str(suite), str(problem_id), int(sample_index))


def _json_safe(value: Any, where: str) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if hasattr(value, "item") and callable(value.item) and not isinstance(value, (str, bytes)):
        try:
            value = value.item()  # numpy / torch scalars
        except (ValueError, RuntimeError):
            raise TypeError(f"record field {where} is not a scalar: {value!r}") from None
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise TypeError(f"record field {where} has type {type(value).__name__}, which JSON cannot hold: {value!r}")


class ResultsStore:
    """An append-only JSONL file of eval records (see `evals.metrics.RECORD_COLUMNS` for the fields)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._repaired = False

    # -- reading ----------------------------------------------------------------------------------------
    def _read_lines(self) -> tuple[list[dict[str, Any]], int | None]:
        """Records, and the byte offset where a truncated last line starts (None if the file ends cleanly)."""
        if not self.path.exists():
            return [], None
        data = self.path.read_bytes()
        records: list[dict[str, Any]] = []
        offset = 0
        lines = data.split(b"\n")
        last_nonempty = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
        for number, line in enumerate(lines):
            start, offset = offset, offset + len(line) + 1
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                if not isinstance(record, dict):
                    raise ValueError("not a JSON object")
            except ValueError as exc:
                if number == last_nonempty:
                    logger.warning("%s: ignoring a truncated last record (%d bytes), probably from an interrupted "
                                   "run", self.path, len(line))
                    return records, start
                raise ValueError(f"{self.path}: line {number + 1} is not a JSON record ({exc}); only the last line "
                                 "may be truncated, so this file was edited or corrupted") from None
            records.append(record)
        return records, None

    def load(self) -> list[dict[str, Any]]:
        """All complete records, in file order (a truncated last line is skipped)."""
        return self._read_lines()[0]

    def frame(self) -> pd.DataFrame:
        """The records as a DataFrame with every metric column present (`evals.metrics.normalize_records`)."""
        return normalize_records(self.load())

    def recorded_keys(self) -> set[tuple[str, str, int]]:
        """`record_key`s of the complete records."""
        return {record_key(r.get("suite", ""), r.get("problem_id", ""), r.get("sample_index") or 0)
                for r in self.load()}

    def pending(self, problems: Iterable[P], samples_per_problem: int = 1) -> list[tuple[P, int]]:
        """(problem, sample_index) pairs without a record yet, in the given order (what `--resume` still runs)."""
        if samples_per_problem < 1:
            raise ValueError(f"samples_per_problem must be >= 1, got {samples_per_problem}")
        done = self.recorded_keys()
        return [(p, i) for p in problems for i in range(samples_per_problem)
                if record_key(p.suite, p.id, i) not in done]

    # -- writing ----------------------------------------------------------------------------------------
    def _repair(self) -> None:
        """Cut off a truncated last line and make sure the file ends with a newline."""
        _, bad_offset = self._read_lines()
        if bad_offset is not None:
            with open(self.path, "r+b") as fh:
                fh.truncate(bad_offset)
                fh.flush()
                os.fsync(fh.fileno())
            logger.warning("%s: removed the truncated last record before appending", self.path)
        if self.path.exists() and self.path.stat().st_size > 0:
            with open(self.path, "rb") as fh:
                fh.seek(-1, os.SEEK_END)
                ends_cleanly = fh.read(1) == b"\n"
            if not ends_cleanly:
                with open(self.path, "ab") as fh:
                    fh.write(b"\n")
        self._repaired = True

    def append(self, record: Mapping[str, Any]) -> None:
        """Write one record as a line, then flush and fsync; NaN/inf become null.

        The record needs `problem_id`; `suite` and `sample_index` default to "" and 0.
        """
        if "problem_id" not in record:
            raise ValueError(f"a result record needs a 'problem_id'; got fields {sorted(record)}")
        line = json.dumps(_json_safe(dict(record), "record"), allow_nan=False) + "\n"
        with self._lock:
            if not self._repaired:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._repair()
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(line)
                fh.flush()
                os.fsync(fh.fileno())


# ---------------------------------------------------------------------------------------------------------
# One writer per output folder
# ---------------------------------------------------------------------------------------------------------
class OutputFolderBusyError(KernelForgeError, RuntimeError):
    """Another run holds the output folder's lock. `holder` is what it wrote in the lock file (pid, host, start)."""

    def __init__(self, folder: Path, holder: Mapping[str, Any]) -> None:
        self.folder = folder
        self.holder = dict(holder)
        pid = holder.get("pid", "unknown")
        where = f" on {holder['host']}" if holder.get("host") and holder.get("host") != socket.gethostname() else ""
        since = f", started {holder['started_at']}" if holder.get("started_at") else ""
        super().__init__(f"output folder {folder} is in use by another kforge eval run (pid {pid}{where}{since}); "
                         "wait for it to finish or stop it, or pass another --out")


class OutputFolderLock:
    """Exclusive lock on an eval output folder, held while a run writes it (see the module docstring).

        with OutputFolderLock(out):      # OutputFolderBusyError at once if another run holds it
            ...
    """

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK_FILE
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> OutputFolderLock:
        """Take the lock (creating the folder), or raise `OutputFolderBusyError` without waiting."""
        if self._fd is not None:
            raise RuntimeError(f"{self.path} is already held by this lock object")
        try:
            import fcntl
        except ImportError:  # not POSIX: run unlocked rather than not at all
            logger.warning("no fcntl on this platform: %s is not locked against a second run", self.folder)
            return self
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _read_holder(fd)
            os.close(fd)
            raise OutputFolderBusyError(self.folder, holder) from None
        stamp = {"pid": os.getpid(), "host": socket.gethostname(),
                 "started_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(stamp) + "\n").encode("utf-8"), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        """Drop the lock (also dropped by the kernel when the process exits)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        import fcntl

        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def __enter__(self) -> OutputFolderLock:
        return self.acquire()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


def _read_holder(fd: int) -> dict[str, Any]:
    """What the holding run wrote in the lock file; {} while it has not written yet (or wrote nonsense)."""
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


# ---------------------------------------------------------------------------------------------------------
# Sharding
# ---------------------------------------------------------------------------------------------------------
def parse_shard(text: str) -> tuple[int, int]:
    """`"i/N"` -> `(i, N)` with 0 <= i < N; a clear error otherwise."""
    parts = str(text).split("/")
    try:
        if len(parts) != 2:
            raise ValueError
        index, count = int(parts[0]), int(parts[1])
    except ValueError:
        raise ValueError(f"shard must look like i/N (e.g. 0/4), got {text!r}") from None
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"shard {text!r}: need N >= 1 and 0 <= i < N (shards are numbered from 0)")
    return index, count


def shard(problems: Sequence[P], index: int, count: int) -> list[P]:
    """The problems of shard `index` of `count`: every `count`-th problem in (id, suite) order, starting at
    `index`, returned in the input order. The shards are disjoint, cover every problem and differ in size by at
    most one."""
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"shard {index}/{count}: need count >= 1 and 0 <= index < count")
    keys = [(p.id, p.suite) for p in problems]
    if len(set(keys)) != len(keys):
        dupes = sorted({f"{s}:{i}" for i, s in keys if keys.count((i, s)) > 1})
        raise ValueError(f"problem ids must be unique to shard; duplicates: {', '.join(dupes)}")
    chosen = {key for position, key in enumerate(sorted(keys)) if position % count == index}
    return [p for p, key in zip(problems, keys, strict=True) if key in chosen]
