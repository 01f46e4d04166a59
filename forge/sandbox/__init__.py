"""The sandbox: run a candidate (a kernel file or a `ModelNew` file) in a disposable, isolated child process while
the harness judges it in this one. Callers use the judge (`forge.judging.Judge`); this package is its boundary."""

from forge.sandbox.isolation import (
    Isolation,
    IsolationLevel,
    SandboxUnavailableError,
    boundary_isolation,
    network_isolation,
    resolve_isolation,
)
from forge.sandbox.options import DEFAULT_TIMEOUT_S, SandboxOptions
from forge.sandbox.pool import SandboxPool
from forge.sandbox.runner import ProcessRegistry, kill_all, live_process_groups, run_candidate

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "Isolation",
    "IsolationLevel",
    "ProcessRegistry",
    "SandboxOptions",
    "SandboxPool",
    "SandboxUnavailableError",
    "boundary_isolation",
    "kill_all",
    "live_process_groups",
    "network_isolation",
    "resolve_isolation",
    "run_candidate",
]
