"""`Judge`: the one component that judges every candidate, function kernel or module, static or generated.

Why one: judging used to be assembled in four places (the optimizer's `KernelUtils.validate` plus probes, the
sandbox's launch check, the evals' seed and size rules for modules, `module_verdict` in a plain child where the
candidate shared a process with its own verdict), with three isolation mechanisms and as many status vocabularies.
Now every caller (the generator's conversations, `make_plan`, `kforge eval`, `kforge plan verify`) asks this one
object, and a new check is added in one place:

- `judge_source(source, target, language)`: code from a model (hostile). Screened by its language; then run in a
  sandbox child (`forge.sandbox`: the bubblewrap boundary, limits sized from the case) while this process runs the
  oracle on what the child sends back: `validate` with the probes and the integrity check (`KernelUtils.validate`),
  the run-time launch check, a module target's seed and size rules (`forge.judging.modules.check_module`). The
  child also times the candidate against the reference, for the model's feedback only (a kernel controls its own
  process and clocks).
- `judge_code(code, target, serving)`: code from a model that will then run here (a plan's provider, an eval's
  timed candidate): `judge_source` first, then, passed there, `judge_callable` on the same code imported here.
- `judge_ahead(code, targets)`: the sandbox half of `judge_code` for one file on many targets at once (a `ModelNew`
  written for one behaviour group of a class, then judged on each of its other groups), several children at a time;
  the later `judge_code` for each target uses that verdict instead of starting another child. Why: a sandbox
  judgement is mostly the child's start-up (measured on the CPU for the Hugging Face Llama's tiny `LlamaAttention`:
  8.0 s in the sandbox, of which 1.8 s the oracle's calls, beside 1.5 s in this process; on the H200 each of the
  sixteen `LlamaAttention` groups took 22-30 s to judge and time, 7 minutes for one class, and judged ahead four at
  a time the fifteen later groups took 93-119 s in all: BENCHMARKS.md K8), and children of one file on different
  instances are independent.
- `judge_callable(fn, target)`: code this process already trusts (a static provider, a kernel library, an eval's
  eager or compiled baseline, a generated kernel being re-checked where it will serve): the same oracle, in
  process.
- `time(fn, samples, reference=...)`: the timing that decides (the optimizer's selection, the eval's speedups), in
  the process that will serve the kernel, behind the integrity snapshot and with spot checks of timed passes
  (`KernelUtils.benchmark`).

Every answer is a `forge.judging.verdict.Verdict` whose `status` is a `forge.outcome.Outcome`.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from forge.checking.kernel_utils import KernelUtils
from forge.env import env_int
from forge.judging.modules import ModelCall, changed_tensors, check_module, tensor_digest
from forge.judging.targets import FunctionTarget, InstanceTarget, ModuleTarget
from forge.judging.verdict import Verdict
from forge.outcome import CandidateCall, HarnessError, Outcome, ValidationIssue, issue_of, outcome_of_issues
from forge.samples import Sample
from forge.sandbox.options import SandboxOptions
from forge.text import clip

if TYPE_CHECKING:
    from forge.sandbox.isolation import Isolation

__all__ = ["Judge", "JudgeOptions", "TrustedCall", "default_concurrency"]

logger = logging.getLogger(__name__)

_MESSAGE_CHARS = 300
# Sandbox children at once for `judge_ahead` when not set: one per four cores, at most four (each child imports
# torch and the model's library, and runs the oracle's calls; a 2-core machine gets one).
_CORES_PER_CHILD = 4
_MAX_DEFAULT_CHILDREN = 4


def default_concurrency() -> int:
    """Sandbox children a `Judge` runs at once where nothing else uses the device (`judge_ahead`):
    `$KFORGE_JUDGE_CONCURRENCY`, else one per four cores, at most four."""
    cores = os.cpu_count() or 1
    fallback = max(1, min(_MAX_DEFAULT_CHILDREN, cores // _CORES_PER_CHILD))
    return int(env_int("KFORGE_JUDGE_CONCURRENCY", fallback, minimum=1, what="a number of sandbox children",
                       hint="give a whole number >= 1, such as 4"))


@dataclass(frozen=True)
class JudgeOptions:
    """`sandbox`: limits and isolation of each child (`SandboxOptions`); `max_concurrent`: children at once (one
    per GPU is the usual choice); `benchmark`: time correct candidates in the child for the model's feedback."""

    sandbox: SandboxOptions = field(default_factory=SandboxOptions)
    max_concurrent: int = 1
    benchmark: bool = True


class Judge:
    """Judges candidates against targets with one oracle (see the module docstring). `kernel_utils`: the oracle and
    timing settings (`KernelUtils`), shared by every judgement."""

    def __init__(self, kernel_utils: KernelUtils | None = None, options: JudgeOptions | None = None) -> None:
        self.kernel_utils = kernel_utils if kernel_utils is not None else KernelUtils()
        self.options = options if options is not None else JudgeOptions()
        from forge.sandbox.pool import SandboxPool  # the sandbox imports the judge's targets and verdicts

        self.pool = SandboxPool(self.options.max_concurrent, self.options.sandbox)
        # Sandbox verdicts judged ahead (`judge_ahead`), by (target object, source, language, oracle settings); the
        # target is held so its id cannot be reused while its verdict waits.
        self._ahead: dict[tuple[int, str, str, int], tuple[Any, Verdict]] = {}
        self._ahead_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Judge(timing={self.kernel_utils.timing.value}, max_concurrent={self.options.max_concurrent})"

    # -- code from a model ------------------------------------------------------------------------------
    def isolation(self) -> Isolation:
        """The isolation source candidates get; `SandboxUnavailableError` when they would be refused (ask before
        spending LLM calls)."""
        return self.pool.isolation()

    def judge_source(self, source: str, target: FunctionTarget | ModuleTarget, language: Any, *,
                     benchmark: bool | None = None, cancel_event: threading.Event | None = None,
                     kernel_utils: KernelUtils | None = None) -> Verdict:
        """Screen, build and run `source` in a sandbox child; the verdict is computed here (module docstring).
        `kernel_utils` replaces the judge's oracle settings for this judgement."""
        return self.pool.run(source, target, language, kernel_utils=kernel_utils or self.kernel_utils,
                             benchmark=self.options.benchmark if benchmark is None else benchmark,
                             cancel_event=cancel_event)

    def judge_code(self, code: Any, target: FunctionTarget | ModuleTarget, serving: Callable[..., Any], *,
                   kernel_utils: KernelUtils | None = None) -> Verdict:
        """A candidate that carries code (`CandidateCode`) and will then run in this process as `serving` (the same
        code, imported here: a plan's provider, an eval's timed candidate): the sandbox verdict first, so nothing runs
        here unless it passed there, then the same oracle again here, where it will serve and be timed. A kernel
        that behaves differently in a process that has called it fewer times (counting its calls, keying on
        addresses) meets the oracle's randomised calls in both processes."""
        with self._ahead_lock:
            ahead = self._ahead.pop(self._ahead_key(code, target, kernel_utils), None)
        verdict = ahead[1] if ahead is not None else self.judge_source(code.source, target, code.language,
                                                                         benchmark=False, kernel_utils=kernel_utils)
        if not verdict.ok:
            return verdict
        here = self.judge_callable(serving, target, kernel_utils=kernel_utils)
        if here.ok:  # the sandbox's verdict, with the time each process took (where a judgement's time goes)
            timing = {"sandbox_s": verdict.wall_s, "in_process_s": here.wall_s, "judged_ahead": ahead is not None}
            return dataclasses.replace(verdict, details={**verdict.details, **timing},
                                       wall_s=verdict.wall_s + here.wall_s)
        return dataclasses.replace(here, details={**here.details, "judged": "in the sandbox, then in this process"},
                                   isolation=verdict.isolation)

    def judge_ahead(self, code: Any, targets: Sequence[FunctionTarget | ModuleTarget], *,
                    kernel_utils: KernelUtils | None = None,
                    on_verdict: Callable[[int, Verdict], None] | None = None) -> list[Verdict | None]:
        """The sandbox verdicts of `code` (`CandidateCode`) on each of `targets`, up to `options.max_concurrent`
        children at a time; each is kept for the `judge_code` call with the same code, target object and
        `kernel_utils`, which then starts no child of its own (its in-process run still follows). Call it only
        while nothing else times on the device. `on_verdict(index, verdict)` hears each as it comes; a judgement
        that raised is None here and is judged again by `judge_code`."""
        if not targets:
            return []
        results: list[Verdict | None] = [None] * len(targets)
        workers = min(self.options.max_concurrent, len(targets))
        with cf.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kforge-judge") as executor:
            futures = {executor.submit(self.judge_source, code.source, target, code.language, benchmark=False,
                                       kernel_utils=kernel_utils): index for index, target in enumerate(targets)}
            for future in cf.as_completed(futures):
                index = futures[future]
                try:
                    verdict = future.result()
                except Exception as exc:  # noqa: BLE001 - judge_code judges this target itself
                    logger.info("judging ahead on %s raised %s: %s; it is judged on its turn", targets[index].label,
                                type(exc).__name__, exc)
                    continue
                results[index] = verdict
                with self._ahead_lock:
                    self._ahead[self._ahead_key(code, targets[index], kernel_utils)] = (targets[index], verdict)
                if on_verdict is not None:
                    on_verdict(index, verdict)
        return results

    def forget_ahead(self) -> None:
        """Drop the verdicts judged ahead that no `judge_code` used (a class left before its last group)."""
        with self._ahead_lock:
            self._ahead.clear()

    @staticmethod
    def _ahead_key(code: Any, target: Any, kernel_utils: KernelUtils | None) -> tuple[int, str, str, int]:
        language = getattr(code.language, "name", None) or type(code.language).__name__
        return id(target), code.source, str(language), id(kernel_utils)

    # -- code this process trusts -----------------------------------------------------------------------
    def judge_callable(self, candidate: Callable[..., Any], target: FunctionTarget | ModuleTarget, *,
                       trusted: bool = False, kernel_utils: KernelUtils | None = None) -> Verdict:
        """The oracle on a candidate that runs in this process: for a function target `candidate(*args, **kwargs)`;
        for a module target `candidate(seed)` builds the module under that seed (e.g. `lambda seed:
        target.source.build(ModelNew, target.device, seed)`). `trusted`: code from a trusted compiler (Inductor),
        so the dispatch-mode runs are skipped. Exceptions the candidate raises are its verdict; `harness_error` when
        the harness failed. `kernel_utils` replaces the judge's oracle settings for this judgement."""
        started = time.monotonic()
        utils = kernel_utils or self.kernel_utils
        try:
            if isinstance(target, ModuleTarget):
                errors, outcome, details = self._module_in_process(candidate, target, trusted, utils)
            else:
                fn = candidate if not trusted else TrustedCall(candidate)
                before = tensor_digest(target.module) if isinstance(target, InstanceTarget) else None
                errors = [issue_of(e) for e in utils.validate(target.reference_fn, CandidateCall(fn),
                                                              list(target.samples))]
                if before is not None:
                    errors += _written_weights(before, target.module)
                outcome, details = outcome_of_issues(errors), {"phase": "validation"}
        except HarnessError as exc:
            return Verdict(Outcome.HARNESS_ERROR, _short(exc.reason),
                           details={"phase": "validation", "out_of_memory": exc.out_of_memory},
                           wall_s=time.monotonic() - started)
        if not errors:
            return Verdict(Outcome.OK, "correct on every sample", details={**details, "validated_in": "this process"},
                           wall_s=time.monotonic() - started)
        details.update(errors=[str(e) for e in errors], issues=[e.to_dict() for e in errors])
        message = _short(str(errors[0])) if len(errors) == 1 else \
            f"{len(errors)} validation error(s); first: {_short(str(errors[0]), 200)}"
        return Verdict(outcome, message, details=details, wall_s=time.monotonic() - started)

    @staticmethod
    def _module_in_process(build: Callable[[int], Any], target: ModuleTarget, trusted: bool, utils: KernelUtils
                           ) -> tuple[list[ValidationIssue], Outcome, dict[str, Any]]:
        by_value = dataclasses.replace(utils, check_layout=False)  # a problem's output is its end (check_module)
        check = check_module(target.source, lambda seed: ModelCall(build(seed), trusted=trusted), by_value.validate,
                             target.device, seeds=target.seeds, dtype=target.dtype)
        details: dict[str, Any] = {"phase": "module check", "seeds_checked": check.seeds_checked}
        if check.scaled is not None:
            details.update(oracle_scaled=check.scaled.value, note=check.scaled.note(target.seeds[0]))
        return check.errors, check.outcome, details

    # -- the timing that decides ------------------------------------------------------------------------
    def time(self, fn: Callable[..., Any], samples: Sequence[Sample], *,
             reference: Callable[..., Any] | None = None) -> Any:
        """`KernelUtils.benchmark` in this process: per-pass timing, spot checks against `reference` when given
        (`SpotCheckError` when a timed pass computed something else)."""
        return self.kernel_utils.benchmark(fn, samples, reference=reference)

    # -- lifecycle --------------------------------------------------------------------------------------
    def kill_all(self, timeout_s: float = 5.0) -> int:
        """End every live sandbox child of this judge (cancelled runs return `timeout`, `details["cancelled"]`)."""
        return self.pool.kill_all(timeout_s)

    def close(self) -> None:
        self.pool.close()


def _written_weights(before: dict[str, str], module: Any) -> list[ValidationIssue]:
    """A module kernel runs here with the live instance in hand: its parameters and buffers must come out as they
    went in (the reference shares them, so a kernel that rewrote them would be compared with itself)."""
    changed = changed_tensors(before, module)
    if not changed:
        return []
    return [ValidationIssue(f"the candidate wrote to the original module's {', '.join(changed[:5])}"
                            f"{' ...' if len(changed) > 5 else ''}: a module kernel may only read the instance's "
                            "parameters and buffers", kind=Outcome.FORBIDDEN)]


class TrustedCall:
    """A callable from a trusted compiler (Inductor): the oracle skips its dispatch-mode runs (see
    `forge.checking`)."""

    allows_dispatch_poisoning = False

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


def _short(text: str, limit: int = _MESSAGE_CHARS) -> str:
    return clip(text, limit)
