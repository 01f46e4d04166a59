"""`SandboxPool`: a concurrency limit for sandbox runs, with `kill_all()` for the ones it started.

The agent shares one pool between its workers: at most `max_concurrent` children run at once (one per GPU is the
usual choice), a run waiting for a slot aborts as soon as its `cancel_event` is set or the pool is closed, and
`kill_all()` ends every live child of this pool within a few seconds (used when the generation timeout passes).
`isolation()` says, before any LLM call is spent, whether runs will get the boundary or be refused
(`SandboxUnavailableError`; a run itself raises the same error and runs nothing).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from forge.judging.targets import FunctionTarget, ModuleTarget
from forge.judging.verdict import Verdict
from forge.sandbox.isolation import Isolation, resolve_isolation
from forge.sandbox.options import SandboxOptions
from forge.sandbox.runner import ProcessRegistry, run_candidate

__all__ = ["SandboxPool"]

_WAIT_SLICE_S = 0.05


class SandboxPool:
    """At most `max_concurrent` sandbox children at a time, each bounded by `options`; `run` takes the arguments
    of `run_candidate`."""

    def __init__(self, max_concurrent: int = 1, options: SandboxOptions | None = None) -> None:
        if isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int) or max_concurrent < 1:
            raise ValueError(f"max_concurrent must be an int >= 1, got {max_concurrent!r}")
        self.max_concurrent = max_concurrent
        self.options = options if options is not None else SandboxOptions()
        self._slots = threading.BoundedSemaphore(max_concurrent)
        self._registry = ProcessRegistry()
        self._closed = threading.Event()

    def __repr__(self) -> str:
        return f"SandboxPool(max_concurrent={self.max_concurrent}, live={len(self.live_process_groups())})"

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def isolation(self) -> Isolation:
        """The isolation this pool's runs get (`resolve_isolation` with the pool's `isolation` / `allow_unsafe`
        options); raises `SandboxUnavailableError` when they would refuse. Call it before spending LLM calls."""
        return resolve_isolation(self.options.isolation, allow_unsafe=self.options.allow_unsafe)

    def live_process_groups(self) -> list[int]:
        """Process-group ids of this pool's live children."""
        return self._registry.process_groups()

    def run(
        self,
        source: str,
        target: FunctionTarget | ModuleTarget,
        language: Any,
        *,
        cancel_event: threading.Event | None = None,
        **kwargs: Any,
    ) -> Verdict:
        """`run_candidate` (with this pool's options) once a slot is free. Waiting ends early (status `timeout`,
        `details["cancelled"]`) when `cancel_event` is set or the pool is closed."""
        started = time.monotonic()
        kwargs.setdefault("options", self.options)
        while not self._slots.acquire(timeout=_WAIT_SLICE_S):
            if self._closed.is_set() or (cancel_event is not None and cancel_event.is_set()):
                reason = "the sandbox pool was closed" if self._closed.is_set() else "cancel_event was set"
                return Verdict(status="timeout", message=f"cancelled while waiting for a sandbox slot ({reason})",
                                     details={"cancelled": True, "reason": reason},
                                     wall_s=time.monotonic() - started)
        try:
            if self._closed.is_set():
                return Verdict(status="timeout", message="cancelled: the sandbox pool was closed",
                                     details={"cancelled": True, "reason": "the sandbox pool was closed"},
                                     wall_s=time.monotonic() - started)
            return run_candidate(source, target, language, cancel_event=cancel_event, registry=self._registry,
                                 **kwargs)
        finally:
            self._slots.release()

    def kill_all(self, timeout_s: float = 5.0) -> int:
        """End every live child of this pool (SIGTERM, then SIGKILL); returns how many were live."""
        return self._registry.kill_all(timeout_s)

    def close(self, timeout_s: float = 5.0) -> int:
        """Refuse new and waiting runs, then `kill_all`."""
        self._closed.set()
        return self.kill_all(timeout_s)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
