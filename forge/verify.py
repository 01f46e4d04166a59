"""`kforge plan verify` with a deadline per kernel: each entry is re-validated in its own child process.

`KernelOptimizationPlan.verify()` validates in the calling process, which is what the Python API wants (no process
start, the caller's providers and devices), but a kernel that never returns (a Triton loop whose exit condition
depends on a value it never reaches, a deadlock) then hangs the caller for good: a Python thread stuck inside a
kernel launch or a C call cannot be interrupted. The CLI therefore runs each entry in a spawned child
(`multiprocessing` "spawn": no forked CUDA context; the parent's `sys.path` goes with it) in its own session, and
kills the child's whole process group when the entry is not done `timeout_s` after the child reported that the
plan was loaded (the child's start-up, mostly `import torch`, has its own `startup_timeout_s`, so a short
`--timeout` is not eaten by the import). A kernel that runs out its time is reported as `TIMEOUT`, a child that
dies (a segfault, an abort, OOM) as `CRASHED` with its exit status, and the remaining kernels are still verified.

The child imports the modules that define the plan's provider types (as the parent loaded them) before loading the
plan, so plans of user-defined providers verify as they do in process.

A provider that carries code (a generated kernel) is first judged by the judge (`forge.judging.Judge.judge_source`
on its `KernelProvider.candidate_code()`: screened, run in the sandbox, the verdict in this process): only a kernel
that passes there is then checked in the verifying child, which imports it with this machine's environment. A
kernel that fails, hangs or cannot be sandboxed is reported from the judge's verdict and never imported outside
the sandbox. The sandboxed run gets `timeout_s + sandbox_startup_s` of the candidate's time (its child starts
Python and imports torch inside the boundary: a whole sandboxed validation of a silu kernel took 4.9-9.3 s on the
shared 2-core CPU machine; 30 s leaves room for CUDA initialisation).

Every entry's outcome is a `forge.outcome.Outcome` (`ok`, `mismatch`, `runtime_error`, `timeout`, `crash`,
`harness_error` where the harness, not the kernel, failed or could not sandbox it), the judge's vocabulary.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import multiprocessing
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forge.outcome import Outcome, outcome_of_issues

__all__ = ["KernelVerification", "VerifySettings", "verify_plan_file", "DEFAULT_VERIFY_TIMEOUT_S"]

logger = logging.getLogger(__name__)

DEFAULT_VERIFY_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class VerifySettings:
    """`timeout_s`: per kernel, from the moment its child has loaded the plan; `startup_timeout_s`: for the child
    to start and load the plan; `sandbox_startup_s`: added to `timeout_s` for the sandboxed run of a provider that
    carries code (that child's start-up is inside its deadline). `trust_unsigned`: load an unsigned or mis-signed
    plan carrying code anyway (`forge.signing`)."""

    timeout_s: float = DEFAULT_VERIFY_TIMEOUT_S
    startup_timeout_s: float = 300.0
    sandbox_startup_s: float = 30.0
    trust_unsigned: bool = False

    def __post_init__(self) -> None:
        for name in ("timeout_s", "startup_timeout_s", "sandbox_startup_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0 < value < float("inf"):
                raise ValueError(f"{name} must be a finite number of seconds > 0, got {value!r}")


@dataclass(frozen=True)
class KernelVerification:
    """The outcome for one plan entry: `errors` holds the validation errors or why it did not finish."""

    index: int
    function: str
    status: Outcome
    errors: tuple[str, ...] = ()
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status is Outcome.OK


def verify_plan_file(path: str | os.PathLike, settings: VerifySettings | None = None) -> list[KernelVerification]:
    """Re-validate every entry of the plan at `path`, each in a child process with a deadline.

    Raises `PlanLoadError` when the plan does not load here (nothing is started then).
    """
    from forge.plan import KernelOptimizationPlan

    settings = settings or VerifySettings()
    path = Path(path)
    plan = KernelOptimizationPlan.load(path, trust_unsigned=settings.trust_unsigned)
    modules = sorted({type(entry.provider).__module__ for entry in plan.entries} - {"__main__"})
    results = []
    for index, entry in enumerate(plan.entries):
        isolated = _verify_isolated(index, entry, settings)
        results.append(isolated if isolated is not None else _verify_entry(path, index, entry.function, modules,
                                                                             settings))
    return results


def _verify_isolated(index: int, entry: Any, settings: VerifySettings) -> KernelVerification | None:
    """The judge's verdict on an entry that carries code, when it is not `ok` (the result to report), else None (go
    on to the child). A provider that carries code but hands the judge none is refused: it is never imported
    unsandboxed."""
    from forge.judging import FunctionTarget, Judge, JudgeOptions
    from forge.sandbox import SandboxOptions, SandboxUnavailableError

    provider = entry.provider
    start = time.monotonic()
    code = provider.candidate_code()
    if code is None:
        if type(provider).carries_code:
            return KernelVerification(index, entry.function, Outcome.HARNESS_ERROR, (
                f"{provider.name} carries code but gives the judge none to sandbox; it was not run",), 0.0)
        return None
    options = JudgeOptions(SandboxOptions(timeout_s=settings.timeout_s + settings.sandbox_startup_s), benchmark=False)
    judge = Judge(options=options)
    try:
        verdict = judge.judge_source(code.source, FunctionTarget(entry.function, tuple(entry.signatures)),
                                     code.language)
    except SandboxUnavailableError as exc:
        return KernelVerification(index, entry.function, Outcome.HARNESS_ERROR, (
            f"the sandbox cannot be set up here, so the kernel was not run: {exc}",), time.monotonic() - start)
    finally:
        judge.close()
    seconds = time.monotonic() - start
    if verdict.ok:
        logger.info("%s passed in the sandbox (%s) in %.1f s", entry.function, verdict.isolation, seconds)
        return None
    errors = tuple(str(e) for e in verdict.details.get("errors") or ()) or (verdict.message,)
    if verdict.status is Outcome.TIMEOUT:
        errors = (f"not done within {settings.timeout_s:g} s (+{settings.sandbox_startup_s:g} s sandbox start-up); "
                  "the kernel was stopped",)
    return KernelVerification(index, entry.function, verdict.status, errors, seconds)


def _verify_entry(path: Path, index: int, function: str, modules: list[str], settings: VerifySettings,
                  ) -> KernelVerification:
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(str(path), index, modules, settings.trust_unsigned, sender),
                              daemon=True,
                              name=f"kforge-verify-{function}")
    start = time.monotonic()
    process.start()
    sender.close()
    try:
        outcome = _wait(process, receiver, settings)
    finally:
        _kill_group(process)
        receiver.close()
    seconds = time.monotonic() - start
    if outcome is None:
        return KernelVerification(index, function, Outcome.TIMEOUT,
                                  (f"not done within {settings.timeout_s:g} s; the kernel was stopped",), seconds)
    kind, payload = outcome
    if kind == "errors":
        status = outcome_of_issues(payload)
        return KernelVerification(index, function, status, tuple(str(e) for e in payload), seconds)
    return KernelVerification(index, function, Outcome.CRASH, (str(payload),), seconds)


def _wait(process: Any, receiver: Any, settings: VerifySettings) -> tuple[str, Any] | None:
    """The child's final message, None on timeout, or ("crash", why) when it dies without one."""
    deadline = time.monotonic() + settings.startup_timeout_s
    loaded = False
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None if loaded else ("crash", f"the verifying process did not start within "
                                                 f"{settings.startup_timeout_s:g} s")
        try:
            ready = receiver.poll(min(remaining, 0.5))
        except (EOFError, OSError):
            ready = False
        if ready:
            try:
                kind, payload = receiver.recv()
            except (EOFError, OSError):
                return ("crash", _death(process))
            if kind == "loaded":
                loaded, deadline = True, time.monotonic() + settings.timeout_s
                continue
            return kind, payload
        if not process.is_alive():
            with contextlib.suppress(EOFError, OSError):
                if receiver.poll(0):
                    kind, payload = receiver.recv()
                    if kind != "loaded":
                        return kind, payload
            return ("crash", _death(process))


def _death(process: Any) -> str:
    process.join(5)
    code = process.exitcode
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"the verifying process died of {signal.Signals(-code).name}"
    return f"the verifying process exited with status {code} without a result"


def _kill_group(process: Any) -> None:
    """Stop the child and anything it started (it leads its own session once running)."""
    if process.pid is not None and process.is_alive():
        with contextlib.suppress(OSError):
            if os.getpgid(process.pid) == process.pid:
                os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            process.kill()
    process.join(10)


def _child(path: str, index: int, modules: list[str], trust_unsigned: bool,
           sender: Any) -> None:  # pragma: no cover - runs in a child
    with contextlib.suppress(OSError):
        os.setsid()
    logging.getLogger("forge.plan").setLevel(logging.ERROR)  # the parent already warned (environment, signature)
    try:
        for name in modules:
            importlib.import_module(name)
        from forge.plan import KernelOptimizationPlan

        plan = KernelOptimizationPlan.load(path, trust_unsigned=trust_unsigned)
        entry = plan.entries[index]
        sender.send(("loaded", None))
        errors = KernelOptimizationPlan(entries=(entry,), environment=plan.environment).verify()[entry.function]
        sender.send(("errors", list(errors)))  # ValidationIssues pickle with their kind
    except BaseException as exc:  # noqa: BLE001 - any failure is the outcome reported for this kernel
        sender.send(("crash", f"{type(exc).__name__}: {exc}"))
    finally:
        sender.close()
