"""Sandbox for candidate kernels: screen, then validate and time each one in a disposable, isolated child process."""

from agent.sandbox.isolation import (
    Isolation,
    IsolationLevel,
    SandboxUnavailableError,
    boundary_isolation,
    network_isolation,
    resolve_isolation,
)
from agent.sandbox.pool import SandboxPool
from agent.sandbox.result import STATUSES, SandboxResult, SandboxStatus
from agent.sandbox.runner import DEFAULT_TIMEOUT_S, ProcessRegistry, kill_all, live_process_groups, run_candidate

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "STATUSES",
    "Isolation",
    "IsolationLevel",
    "ProcessRegistry",
    "SandboxPool",
    "SandboxResult",
    "SandboxStatus",
    "SandboxUnavailableError",
    "boundary_isolation",
    "kill_all",
    "live_process_groups",
    "network_isolation",
    "resolve_isolation",
    "run_candidate",
]
