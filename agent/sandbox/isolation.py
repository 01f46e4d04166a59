"""Network isolation for sandbox children: a fresh network namespace through `unshare`, when the host allows it.

`network_isolation()` probes once per process (cached) whether `unshare -n` (as root) or `unshare -rn` (through
a user namespace) can start a program, and returns the command prefix to use, or none with the reason.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import threading
from dataclasses import dataclass

__all__ = ["NetworkIsolation", "network_isolation"]

logger = logging.getLogger(__name__)

_LOCK = threading.Lock()
_CACHED: NetworkIsolation | None = None


@dataclass(frozen=True)
class NetworkIsolation:
    """`mode` is `"netns"` (children run in a fresh network namespace: no network) or `"none"`."""

    mode: str
    prefix: tuple[str, ...]
    reason: str


def _probe() -> NetworkIsolation:
    unshare = shutil.which("unshare")
    if unshare is None:
        return NetworkIsolation("none", (), "the unshare command is not installed")
    attempts = [(unshare, "-n"), (unshare, "-rn")]
    if os.geteuid() != 0:
        attempts.reverse()
    failures = []
    for prefix in attempts:
        try:
            proc = subprocess.run([*prefix, "true"], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=10, check=False)
        except (OSError, subprocess.SubprocessError) as exc:
            failures.append(f"{' '.join(prefix[1:])}: {exc}")
            continue
        if proc.returncode == 0:
            return NetworkIsolation("netns", prefix, f"unshare {prefix[1]} (fresh network namespace)")
        failures.append(f"unshare {prefix[1]}: {(proc.stderr or '').strip() or f'exit code {proc.returncode}'}")
    return NetworkIsolation("none", (), "unshare failed (" + "; ".join(failures) + ")")


def network_isolation(*, refresh: bool = False) -> NetworkIsolation:
    """The isolation children get on this host (probed once; `refresh=True` probes again)."""
    global _CACHED
    with _LOCK:
        if _CACHED is None or refresh:
            _CACHED = _probe()
            logger.debug("sandbox network isolation: %s (%s)", _CACHED.mode, _CACHED.reason)
        return _CACHED
