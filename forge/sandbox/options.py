"""`SandboxOptions`: how a sandbox child is bounded and isolated, in one frozen object.

The resource limits are the harness's, not the candidate's budget: a kernel that needs more than the harness gave it
is not wrong. So the limits are sized from the case (`sized_for`): the largest call's inputs and expected outputs
must fit, with room, in what the child may allocate (RLIMIT_DATA) and in what one reply may carry to the parent (its
tensors travel as sealed memory files, which count against RLIMIT_FSIZE like any file). An lm_head of a
Llama-3.2-1B at prefill writes 525 MB, KernelBench's shipped problems read and write several GB; the old fixed
256 MiB file-size limit refused both, and the refusal reached the model as "your file raised an exception". When a
limit is reached anyway, the verdict is `harness_error` naming it (`forge.judging.verdict.HarnessLimit`).

Raising the file-size limit does not open the disk: inside the boundary the only writable places are tmpfs mounts of
bounded size (`scratch_bytes`: the child's home, temporary folder and private kernel caches; `/tmp`, `/dev/shm`),
and the child's stdout and stderr are pipes the parent drains, keeping a tail.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from forge.sandbox.isolation import IsolationLevel

__all__ = ["DEFAULT_MEMORY_LIMIT_BYTES", "DEFAULT_PROCESS_LIMIT", "DEFAULT_TIMEOUT_S", "SandboxOptions"]

DEFAULT_TIMEOUT_S = 180.0
# RLIMIT_DATA (heap and private writable mappings; not RLIMIT_AS, whose address-space reservations break CUDA):
# an import of torch + triton + the harness uses about 0.25 GB of it.
DEFAULT_MEMORY_LIMIT_BYTES = 16 << 30
# RLIMIT_NPROC: tasks (processes and threads) per sandbox; counted per user namespace inside the boundary.
DEFAULT_PROCESS_LIMIT = 512
_MIN_FILE_BYTES = 256 << 20
_MIN_REPLY_BYTES = 1 << 30  # a reply may always carry this much (the memory limit above it raises it)


@dataclass(frozen=True)
class SandboxOptions:
    """Bounds and isolation of one sandbox child.

    `timeout_s`: the child's time: its start-up and import plus the time it holds the turn in calls (the harness's
    own work, e.g. a slow float64 reference, does not count); past it the child is killed (`timeout`). A backstop of
    `backstop_factor` x that on the whole run stops a harness that hangs (`harness_error`). `cpu_limit_s`: RLIMIT_CPU
    (default twice the timeout plus 10 s). `memory_limit_bytes` (RLIMIT_DATA) and `process_limit` (RLIMIT_NPROC,
    per sandbox inside the boundary): None for no limit. `file_size_limit_bytes` (RLIMIT_FSIZE) and
    `reply_limit_bytes` (tensor bytes one reply may carry): None sizes them from the memory limit. `scratch_bytes`:
    size of the child's writable tmpfs mounts. `isolation`: "auto" (the bubblewrap boundary, or
    `SandboxUnavailableError` unless `allow_unsafe` / `KFORGE_UNSAFE_SANDBOX=1`), "boundary", or an explicit unsafe
    "network" / "none". `extra_env`: more variables for the child (credential-like names are refused). `keep`: keep
    the run folder (`workdir`: an empty folder to use). `screen=False` skips static screening and runs any code:
    UNSAFE, for tests of the sandbox only."""

    timeout_s: float = DEFAULT_TIMEOUT_S
    cpu_limit_s: float | None = None
    memory_limit_bytes: int | None = DEFAULT_MEMORY_LIMIT_BYTES
    process_limit: int | None = DEFAULT_PROCESS_LIMIT
    open_files_limit: int = 1024
    file_size_limit_bytes: int | None = None
    reply_limit_bytes: int | None = None
    scratch_bytes: int = 4 << 30
    backstop_factor: float = 4.0
    isolation: IsolationLevel | str = "auto"
    allow_unsafe: bool | None = None
    extra_env: Mapping[str, str] = field(default_factory=dict)
    keep: bool = False
    workdir: str | os.PathLike[str] | None = None
    screen: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.timeout_s, (int, float)) or not 0 < self.timeout_s < float("inf"):
            raise ValueError(f"timeout_s must be a finite number of seconds > 0, got {self.timeout_s!r}")
        for name in ("memory_limit_bytes", "process_limit", "file_size_limit_bytes", "reply_limit_bytes"):
            limit = getattr(self, name)
            if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
                raise ValueError(f"{name} must be None or an int >= 1, got {limit!r}")
        from forge.sandbox.environment import looks_secret

        for name in self.extra_env:
            if looks_secret(name):
                raise ValueError(f"extra_env may not pass {name!r} to a sandbox child: it looks like a credential")
        object.__setattr__(self, "extra_env", dict(self.extra_env))

    def replace(self, **changes: Any) -> SandboxOptions:
        return dataclasses.replace(self, **changes)

    def sized_for(self, case_bytes: int) -> SandboxOptions:
        """These options with the memory limit raised where a case whose largest call moves `case_bytes` (inputs plus
        expected outputs) needs more: the child holds inputs, outputs and its own temporaries (4x, plus 512 MiB). A
        limit already large enough stays (the 16 GiB default covers an import of torch and a compiler). The reply
        and file-size limits follow the memory limit unless set explicitly (then they are kept as given)."""
        if self.memory_limit_bytes is None:
            return self
        return self.replace(memory_limit_bytes=max(self.memory_limit_bytes, 4 * case_bytes + (512 << 20)))

    @property
    def reply_bytes(self) -> int | None:
        """Most tensor bytes one reply of the child may carry (bounds what a hostile child can make the harness
        allocate): `reply_limit_bytes`, else the memory limit (at least 1 GiB), else None (unbounded)."""
        if self.reply_limit_bytes is not None:
            return self.reply_limit_bytes
        if self.memory_limit_bytes is not None:
            return max(_MIN_REPLY_BYTES, self.memory_limit_bytes)
        return None

    @property
    def file_size_bytes(self) -> int:
        """RLIMIT_FSIZE: at least what one reply carries (its storages are memory files), at least 256 MiB."""
        if self.file_size_limit_bytes is not None:
            return self.file_size_limit_bytes
        return max(_MIN_FILE_BYTES, self.reply_bytes or 0) if self.reply_bytes is not None else 1 << 62

    @property
    def cpu_seconds(self) -> int:
        return max(1, int(self.cpu_limit_s if self.cpu_limit_s is not None else 2 * self.timeout_s + 10))
