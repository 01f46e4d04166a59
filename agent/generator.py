"""`LLMKernelGenerator`: the LLM agent that writes kernels for one `torch.nn.functional` function, and whole
`ModelNew` modules for KernelBench-format problems (`generate_module`, used by the evals).

One conversation loop serves both kinds of problem; a small `_Problem` object per kind supplies what differs (the
first, fix and optimize prompts, what a candidate is judged against, how its speed reads). The loop asks for a
candidate, has the judge check it (`forge.judging.Judge.judge_source`: screened, run in the sandbox child, the oracle
in this process, for kernels and `ModelNew`s alike) and feeds every failure back (`fix`) for up to `attempts`
turns (a `harness_error` verdict, a failure of the harness and not of the candidate, ends the conversation instead:
it is never sent to the model as its fault); after the first correct candidate it spends `optimize_rounds` more
turns asking for faster versions (`optimize` / `optimize_module`: measured time vs PyTorch; for kernels also vs the
roofline floor and an empty kernel launch), and keeps the fastest correct one (ranked by measured speedup). Module
problems used to stop at the first correct `ModelNew`, so a correct KernelBench kernel never heard its speed.

Per function it runs `candidates` independent conversations (one per module problem). The fastest correct kernel
over all conversations becomes a `GeneratedKernelProvider`. Validated kernels are cached on disk, so a second
`make_plan` on the same model makes no LLM call. Everything said and measured is written under an artifacts folder
(one transcript folder per conversation, for both kinds).

Languages with a build step (CUDA) compile each screened candidate on the language's CPU build pool before it queues
for a sandbox slot (`_prebuild`), so several conversations' candidates compile in parallel while the GPU checks
others, and the child loads the build from the cache (BENCHMARKS.md H7: an NVRTC build takes 0.07-0.24 s on the
H200 host, a cache hit 0.1 ms; nvcc takes seconds).

`submit` returns at once; `cancel` (called by the optimizer when its generation timeout passes) abandons in-flight
LLM calls and kills every sandbox child within a few seconds.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import datetime as _dt
import json
import logging
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from agent.cache import KernelCache, cache_key
from agent.languages import DEFAULT_LANGUAGE, KernelLanguage, get_language
from agent.llm import LLMClient, LLMConfig, LLMError
from agent.prompting import Failure, InstanceTask, KernelTask, ModuleTask, Performance, PromptRenderer
from agent.provider import GeneratedKernelProvider
from agent.replies import no_code_feedback
from forge.execution import Execution, TimingMode
from forge.functional import functional_names
from forge.judging import FunctionTarget, InstanceTarget, Judge, JudgeOptions, ModuleTarget, Verdict
from forge.outcome import Outcome
from forge.provider import KernelGenerationResult, KernelGenerator
from forge.samples import Sample, SampleCounter, iter_tensors
from forge.sandbox import SandboxOptions

__all__ = ["LLMKernelGenerator", "ModuleGenerationResult", "RANDOM_FUNCTIONS"]

logger = logging.getLogger(__name__)

# The candidate's time in one sandbox child (its start-up, import and calls; the harness's own work is not counted).
DEFAULT_SANDBOX_TIMEOUT_S = 300.0

# Functions whose output is random by design: the oracle cannot validate them against PyTorch.
RANDOM_FUNCTIONS = frozenset(
    {
        "dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout", "rrelu",
        "rrelu_", "gumbel_softmax", "fractional_max_pool2d", "fractional_max_pool3d",
        "fractional_max_pool2d_with_indices", "fractional_max_pool3d_with_indices",
    }
)


@dataclass
class _Attempt:
    code: str | None
    result: Verdict | None  # the judge's verdict; None when no code was found
    note: str = ""


def _status(verdict: Any) -> Outcome | None:
    """The verdict's status as an `Outcome` (None for a status outside it, from a caller's `evaluate`)."""
    try:
        return Outcome(getattr(verdict, "status", None))
    except ValueError:
        return None


def _speedup(verdict: Any) -> float:
    """Measured speedup over PyTorch of a correct verdict (0.0 when it was not timed): how correct results rank."""
    value = getattr(verdict, "speedup", None)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def _cancelled(verdict: Any) -> bool:
    details = getattr(verdict, "details", None)
    return bool(details.get("cancelled")) if isinstance(details, dict) else False


@dataclass
class _ConversationOutcome:
    index: int
    best_code: str | None = None
    best_result: Any = None
    turns: int = 0
    error: str | None = None
    harness_error: bool = False  # stopped because the harness failed, not the candidate
    history: list[_Attempt] = field(default_factory=list)

    @property
    def speedup(self) -> float:
        return _speedup(self.best_result) if self.best_result is not None else 0.0


@dataclass(frozen=True)
class GeneratorOptions:
    """How `LLMKernelGenerator` works.

    `candidates`: independent conversations per function (the fastest correct kernel wins); `attempts`: turns per
    conversation; `optimize_rounds`: turns asking for a faster kernel once one is correct; `functions` /
    `exclude`: the `torch.nn.functional` names it writes kernels for (None: every deterministic one); `languages`:
    kernel languages in order of preference (the first whose device types fit the samples is used); `prompts_dir`:
    template overrides (`prompts/README.md`); `llm_concurrency`: LLM requests in flight at once; `artifacts_dir`:
    where transcripts go (default `<cache_dir>/runs`); `use_cache`: reuse and store kernels in the signed cache."""

    candidates: int = 2
    attempts: int = 4
    optimize_rounds: int = 2
    functions: tuple[str, ...] | None = None
    exclude: tuple[str, ...] = ()
    languages: tuple[str, ...] = (DEFAULT_LANGUAGE,)
    prompts_dir: str | Path | None = None
    llm_concurrency: int = 4
    artifacts_dir: str | Path | None = None
    use_cache: bool = True

    def __post_init__(self) -> None:
        for name, low in (("candidates", 1), ("attempts", 1), ("optimize_rounds", 0), ("llm_concurrency", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"GeneratorOptions.{name} must be an int >= {low}, got {value!r}")
        languages = (self.languages,) if isinstance(self.languages, str) else tuple(dict.fromkeys(self.languages))
        if not languages:
            raise ValueError("GeneratorOptions.languages must name at least one kernel language (e.g. ('triton',) "
                             "or ('triton', 'cuda'))")
        for language in languages:
            get_language(language)  # a clear error naming the registered languages
        object.__setattr__(self, "languages", languages)
        known = set(functional_names())
        for label in ("functions", "exclude"):
            names = getattr(self, label)
            if names is None:
                continue
            names = (names,) if isinstance(names, str) else tuple(names)
            unknown = sorted(set(names) - known)
            if unknown:
                raise ValueError(f"GeneratorOptions.{label} names unknown torch.nn.functional functions: "
                                 f"{', '.join(unknown)}")
            object.__setattr__(self, label, names)


@dataclass(frozen=True)
class ModuleGenerationResult:
    """Outcome of `generate_module`: exactly one of `source` (a checked `ModelNew` file) or `error`; `outcome` is
    `harness_error` when the harness, not the model, stopped it."""

    source: str | None
    error: str | None
    usage: dict[str, Any]
    attempts: int
    outcome: Outcome | None = None


class LLMKernelGenerator(KernelGenerator):
    """Writes, checks and optimises kernels with an OpenAI-compatible LLM (see the module docstring)."""

    def __init__(
        self,
        config: LLMConfig | None = None,
        options: GeneratorOptions | None = None,
        *,
        client: LLMClient | None = None,
        judge_options: JudgeOptions | None = None,
        kernel_utils: Any = None,
    ) -> None:
        """`config`: the LLM endpoint or cassette (`LLMConfig`; None reads the environment); `options`: how the
        generator works (`GeneratorOptions`); `client`: an `LLMClient` to use instead of one built from `config`;
        `judge_options`: the sandbox's limits and concurrency (`forge.judging.JudgeOptions`); `kernel_utils`: the
        oracle's settings (`forge.checking.KernelUtils`)."""
        options = options if options is not None else GeneratorOptions()
        if not isinstance(options, GeneratorOptions):
            raise TypeError(f"options must be an agent.GeneratorOptions, got {type(options).__name__}")
        self.options = options
        candidates, llm_concurrency = options.candidates, options.llm_concurrency
        self.config = config if config is not None else (client.config if client is not None else LLMConfig.from_env())
        self._client = client
        self._client_lock = threading.Lock()
        self.candidates = candidates
        self.attempts = options.attempts
        self.optimize_rounds = options.optimize_rounds
        self.languages = tuple(get_language(name) for name in options.languages)
        self.language = self.languages[0]
        self.renderer = PromptRenderer(options.prompts_dir)
        known = set(functional_names())
        allowed = set(options.functions) if options.functions is not None else known - RANDOM_FUNCTIONS
        self._functions = sorted(allowed - set(options.exclude))
        if judge_options is None:
            judge_options = JudgeOptions(SandboxOptions(timeout_s=DEFAULT_SANDBOX_TIMEOUT_S),
                                         max_concurrent=1 if torch.cuda.is_available() else 2)
        self.kernel_utils = kernel_utils
        self.judge = Judge(kernel_utils, judge_options)
        self._llm_slots = threading.BoundedSemaphore(llm_concurrency)
        self._function_pool = cf.ThreadPoolExecutor(max_workers=4, thread_name_prefix="kforge-gen")
        self._conversation_pool = cf.ThreadPoolExecutor(
            max_workers=max(llm_concurrency, candidates), thread_name_prefix="kforge-conv"
        )
        self._cancel = threading.Event()
        self.cache = KernelCache(self.config.cache_dir) if options.use_cache else None
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        base = (Path(options.artifacts_dir) if options.artifacts_dir is not None
                else Path(self.config.cache_dir) / "runs")
        self.artifacts_dir = base / f"{stamp}-{id(self) % 10000:04d}"
        self._launch_us: dict[str, float] = {}
        self._build_pools: dict[str, Any] = {}  # language name -> its candidate_build_pool() (None: no build step)
        self._build_pools_lock = threading.Lock()

    # -- KernelGenerator ----------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return f"LLMKernelGenerator({self.config.model or 'cassette'})"

    @property
    def client(self) -> LLMClient:
        with self._client_lock:
            if self._client is None or self._client.cancelled:
                self._client = LLMClient(self.config)
            return self._client

    def supports_functions(self) -> list[str]:
        return list(self._functions)

    def use_execution(self, execution: Execution) -> None:
        """Time sandboxed candidates on the mode's clock (`execution.timing_mode`) until `use_clock` says more."""
        self.use_clock(execution.timing_mode)

    def use_clock(self, timing: TimingMode) -> None:
        """Time sandboxed candidates on the clock the optimizer selects on."""
        from forge.checking import KernelUtils

        base = self.kernel_utils if self.kernel_utils is not None else KernelUtils()
        self.kernel_utils = dataclasses.replace(base, timing=timing)
        self.judge.kernel_utils = self.kernel_utils

    def prepare(self, function: str, samples: Sequence[Sample]) -> bool:
        if function not in self._functions:
            logger.info("%s: %s is not in this generator's function list", self.name, function)
            return False
        if not samples:
            logger.info("%s: no samples for %s", self.name, function)
            return False
        devices = {t.device.type for s in samples for t in iter_tensors((s.args, s.kwargs))}
        unsupported = devices - {t for language in self.languages for t in language.device_types()}
        if unsupported:
            logger.info("%s: %s kernels cannot target %s tensors (samples of %s)", self.name, self.language.name,
                        ", ".join(sorted(unsupported)), function)
            return False
        if not devices:
            logger.info("%s: samples of %s hold no tensors", self.name, function)
            return False
        self.judge.isolation()  # SandboxUnavailableError here, before any LLM call is paid for
        return True

    def submit(self, function: str, samples: Sequence[Sample]) -> cf.Future[KernelGenerationResult]:
        cancel = self._cancel
        return self._function_pool.submit(self._generate, function, list(samples), cancel)

    def cancel(self) -> None:
        """Abandon in-flight LLM calls, kill sandbox children; later `submit`s start afresh."""
        event, self._cancel = self._cancel, threading.Event()
        event.set()
        with self._client_lock:
            if self._client is not None:
                self._client.cancel()
        killed = self.judge.kill_all()
        logger.info("%s cancelled (%d sandbox process group(s) killed)", self.name, killed)

    def close(self) -> None:
        self.cancel()
        self._function_pool.shutdown(wait=False, cancel_futures=True)
        self._conversation_pool.shutdown(wait=False, cancel_futures=True)
        self.judge.close()
        with self._build_pools_lock:
            pools, self._build_pools = list(self._build_pools.values()), {}
        for pool in pools:
            if pool is not None:
                pool.close(wait=False)

    # -- one function -------------------------------------------------------------------------------------
    def _task(self, function: str, samples: list[Sample], language: str | None = None) -> tuple[KernelTask, list[int]]:
        counter = SampleCounter()
        for sample in samples:
            counter.add(sample.args, sample.kwargs, clone=False)
        items = counter.items()
        return (KernelTask.from_samples(function, items, language=language or self.language.name),
                [c for c, _ in items])

    def cache_key_for(self, task: KernelTask) -> str:
        return cache_key(
            task_key=task.signature_key(),
            model_fingerprint=self.config.fingerprint(),
            template_hash=self.renderer.template_hash(task.language),
            language=task.language,
        )

    def _usable_languages(self, samples: list[Sample]) -> list[Any]:
        devices = {t.device.type for s in samples for t in iter_tensors((s.args, s.kwargs))}
        return [language for language in self.languages if devices <= set(language.device_types())]

    def _generate(self, function: str, samples: list[Sample], cancel: threading.Event) -> KernelGenerationResult:
        languages = self._usable_languages(samples) or [self.language]
        tasks = {language.name: self._task(function, samples, language.name) for language in languages}
        if self.cache is not None:
            for task, _ in tasks.values():
                hit = self.cache.get(self.cache_key_for(task))
                if hit is None:
                    continue
                provider, info = hit
                if provider.prepare(samples):
                    logger.info("%s: kernel for %s served from the cache (no LLM call)", self.name, function)
                    return KernelGenerationResult(
                        function=function, provider=provider, description=f"{provider.name} (cached)",
                        usage={"cached": True, "calls": 0, **{k: v for k, v in info.items() if k != "cached"}},
                    )
        folder = self.artifacts_dir / function
        # Conversation i writes in languages[i % len(languages)]: with ["triton", "cuda"] and 2 candidates, one
        # conversation per language, and the fastest correct kernel of either wins.
        problems = [_FunctionProblem(self, task, samples, counts) for task, counts in tasks.values()]
        futures = [self._conversation_pool.submit(self._conversation, problems[i % len(problems)], i, folder, cancel)
                   for i in range(self.candidates)]
        outcomes = [f.result() for f in futures]
        usage = self._usage_for(function)
        usage["attempts"] = sum(o.turns for o in outcomes)
        self._write_summary(folder, function, outcomes, usage)
        correct = [o for o in outcomes if o.best_code is not None]
        if not correct:
            errors = "; ".join(f"conversation {o.index}: {o.error}" for o in outcomes)
            harness = any(o.harness_error for o in outcomes)
            return KernelGenerationResult(function=function, error=f"no correct kernel for {function}: {errors}",
                                          usage=usage, outcome=Outcome.HARNESS_ERROR if harness else None)
        best = max(correct, key=lambda o: o.speedup)
        best_task = problems[best.index % len(problems)].task
        metadata = {
            "model": self.config.model,
            "attempts": usage["attempts"],
            "prompt_tokens": usage.get("prompt_tokens"),
            "completion_tokens": usage.get("completion_tokens"),
            "cost_usd": usage.get("cost_usd"),
            "sandbox_speedup": best.speedup,
            "conversation": best.index,
            "generated_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        }
        provider = GeneratedKernelProvider(function, best.best_code, language=best_task.language,
                                           signatures=samples, metadata=metadata)
        if not provider.prepare(samples):
            return KernelGenerationResult(function=function, error="the validated kernel could not be imported",
                                          usage=usage)
        if self.cache is not None:
            self.cache.put(self.cache_key_for(best_task), provider,
                           {"sandbox_speedup": best.speedup, "model": self.config.model})
        return KernelGenerationResult(
            function=function, provider=provider, usage=usage,
            description=f"{provider.name}: {best.speedup:.2f}x in the sandbox after {usage['attempts']} turn(s)",
        )

    def _usage_for(self, tag: str) -> dict[str, Any]:
        client = self._client
        if client is None:
            return {"calls": 0}
        return dict(client.usage.by_tag().get(tag, {"calls": 0}))

    # -- one conversation (both kinds of problem) ------------------------------------------------------------
    def _ask(self, messages: list[dict[str, str]], tag: str, cancel: threading.Event) -> Any:
        while not self._llm_slots.acquire(timeout=0.2):
            if cancel.is_set():
                raise LLMError(kind="cancelled", message="generation was cancelled")
        try:
            if cancel.is_set():
                raise LLMError(kind="cancelled", message="generation was cancelled")
            return self.client.complete(messages, tag=tag)
        finally:
            self._llm_slots.release()

    def _prebuild(self, code: str, task: KernelTask, cancel: threading.Event) -> None:
        """Languages with a build step (CUDA): compile a candidate that passes screening on the language's CPU build
        pool, waiting here in the conversation's thread, before it queues for a sandbox slot. So the conversations'
        candidates compile in parallel while the GPU checks others (a slot is never held through a compile), and
        the child, which computes the same build key, loads the build from the cache. A failed build is left to the
        child, which reports it as the candidate's compile error (diagnostics and all)."""
        language = get_language(task.language)
        with self._build_pools_lock:
            if language.name not in self._build_pools:
                self._build_pools[language.name] = language.candidate_build_pool()
            pool = self._build_pools[language.name]
        if pool is None or language.screen(code, task.function):
            return
        future = pool.submit(code)
        while not future.done() and not cancel.is_set():
            cf.wait([future], timeout=0.5)
        if future.done() and not future.cancelled() and future.exception() is not None:
            logger.debug("%s: prebuild of a %s candidate for %s failed: %s", self.name, language.name, task.function,
                         future.exception())

    def _judge(self, code: str, task: KernelTask, samples: list[Sample], counts: list[int],
               cancel: threading.Event) -> Verdict:
        target = FunctionTarget(task.function, tuple(samples), tuple(counts))
        return self.judge.judge_source(code, target, get_language(task.language), cancel_event=cancel)

    def _performance(self, task: KernelTask | InstanceTask, result: Verdict, samples: list[Sample]) -> Performance:
        from agent.roofline import estimate

        device = "cuda" if any(t.device.type == "cuda" for s in samples for t in iter_tensors((s.args, s.kwargs))) \
            else "cpu"
        if device not in self._launch_us:
            try:
                from forge.checking import empty_kernel_launch_us

                self._launch_us[device] = empty_kernel_launch_us(device)
            except Exception:  # pragma: no cover - measurement is best effort
                self._launch_us[device] = 0.0
        try:  # a module's forward has no roofline model (any mix of ops)
            roofline = estimate(task.function, task.sample_list, task.device_name) if isinstance(
                task, KernelTask) else None
        except Exception:
            roofline = None
        return Performance.of({
            "latency_ms": result.latency_ms,
            "baseline_ms": result.baseline_ms,
            "device_latency_ms": result.details.get("device_latency_ms"),
            "timing": (result.latency_ms or {}).get("mode", "eager"),
            "launch_overhead_us": self._launch_us[device] or None,
            "roofline": roofline,
            "calls": sum(1 for _ in samples),
        })

    def _conversation(self, problem: _Problem, index: int, folder: Path,
                      cancel: threading.Event) -> _ConversationOutcome:
        """One conversation: fix turns until a candidate is correct, then optimize rounds; the fastest correct
        candidate is kept (see the module docstring)."""
        outcome = _ConversationOutcome(index=index)
        log = _Transcript(folder / f"conversation-{index}")
        messages = [{"role": "system", "content": problem.system_prompt()},
                    {"role": "user", "content": problem.first_prompt()}]
        best_code: str | None = None
        best: Any = None
        last_code: str | None = None
        budget = self.attempts
        optimizing = 0
        try:
            while True:
                if best is None and budget <= 0:
                    break
                if best is not None and optimizing >= self.optimize_rounds:
                    break
                if cancel.is_set():
                    outcome.error = "cancelled"
                    break
                log.write_prompt(outcome.turns, messages[-1]["content"])
                reply = self._ask(messages, problem.tag, cancel)
                outcome.turns += 1
                if best is None:
                    budget -= 1
                else:
                    optimizing += 1
                messages.append({"role": "assistant", "content": reply.text})
                log.write_reply(outcome.turns - 1, reply.text)
                extracted = None if reply.truncated else problem.language.extract_reply(reply.text)
                if extracted is None:
                    status = "truncated" if reply.truncated else "no_code"
                    failure = Failure.of({"status": status, "reply": reply.text[-2000:],
                                          "message": no_code_feedback(reply.text, entry_point=problem.entry_point)})
                    outcome.history.append(_Attempt(None, None, status))
                    messages.append({"role": "user", "content": problem.fix_prompt(last_code, failure)})
                    continue
                code = extracted.code
                result = problem.evaluate(code, cancel)
                log.write_result(outcome.turns - 1, code, result)
                outcome.history.append(_Attempt(code, result))
                status = _status(result)
                if status == Outcome.OK:
                    if best is None or _speedup(result) > _speedup(best):
                        best_code, best = code, result
                    if optimizing >= self.optimize_rounds:
                        break
                    prompt = problem.optimize_prompt(best_code, best)
                    if prompt is None:  # nothing measured to optimise against: the first correct one stands
                        break
                    messages.append({"role": "user", "content": prompt})
                    continue
                if _cancelled(result):
                    outcome.error = "cancelled"
                    break
                if status is not None and not status.blames_candidate:  # never told to the model as its fault
                    outcome.error = f"{Outcome.HARNESS_ERROR.value}: {getattr(result, 'message', '')}"
                    outcome.harness_error = True
                    logger.warning("%s: conversation %d for %s stopped: %s", self.name, index, problem.tag,
                                   outcome.error)
                    break
                last_code = code
                messages.append({"role": "user", "content": problem.fix_prompt(code, result)})
        except LLMError as exc:
            outcome.error = f"llm {exc.kind}: {exc.message}"
            logger.warning("%s: conversation %d for %s stopped: %s", self.name, index, problem.tag, outcome.error)
        except Exception as exc:  # a bug of ours (the harness, not the model) must not take the caller down
            outcome.error = f"{Outcome.HARNESS_ERROR.value}: {type(exc).__name__}: {exc}"
            outcome.harness_error = True
            logger.warning("%s: conversation %d for %s failed", self.name, index, problem.tag, exc_info=True)
        outcome.best_code, outcome.best_result = best_code, best
        if best is None and outcome.error is None:
            last = outcome.history[-1] if outcome.history else None
            reason = getattr(last.result, "message", "") if last and last.result is not None else \
                (last.note if last else "no reply")
            outcome.error = f"no correct {problem.noun} in {self.attempts} attempt(s); last: {reason}"
        log.write_messages(messages)
        return outcome

    def _write_summary(self, folder: Path, label: str, outcomes: list[_ConversationOutcome],
                       usage: dict[str, Any]) -> None:
        if self._client is not None:  # run totals so far: every problem's calls, tokens and cost
            self._write_json(self.artifacts_dir / "usage.json", self._client.usage.summary())
        self._write_json(folder / "summary.json", {
            "problem": label,
            "conversations": [{"index": o.index, "turns": o.turns, "speedup": o.speedup, "error": o.error}
                              for o in outcomes],
            "usage": usage,
        })

    # -- module problems (KernelBench format, used by evals) ----------------------------------------------
    def generate_module(self, task: ModuleTask, target: ModuleTarget) -> ModuleGenerationResult:
        """Write a `ModelNew` for a KernelBench-format problem, in the same conversation loop as kernels.

        `task` is what the prompts show; `target` what the judge checks each candidate against (the same problem:
        `ModelNew` built in the sandbox child, `Model` here, every seed; then both timed in the child). A correct
        `ModelNew` gets `optimize_rounds` turns asking for a faster one; the fastest correct one is returned."""
        problem = _ModuleProblem(self, task, target)
        folder = self.artifacts_dir / f"module-{_safe_name(getattr(task, 'name', None) or 'Model')}"
        outcome = self._conversation(problem, 0, folder, self._cancel)
        usage = self._usage_for(problem.tag)
        usage["attempts"] = outcome.turns
        self._write_summary(folder, problem.tag, [outcome], usage)
        if outcome.best_code is not None:
            return ModuleGenerationResult(outcome.best_code, None, usage, outcome.turns)
        return ModuleGenerationResult(None, outcome.error or "no correct ModelNew", usage, outcome.turns,
                                      outcome=Outcome.HARNESS_ERROR if outcome.harness_error else None)

    # -- hot modules of a real model (forge.modules) ------------------------------------------------------
    def generate_instance(self, task: InstanceTask, target: InstanceTarget) -> ModuleGenerationResult:
        """Write a `ModelNew(original)` for a live module instance, in the same conversation loop as kernels and
        KernelBench modules: `task` is what the prompts show (`InstanceTask.from_instance`), `target` what the judge
        checks each candidate against (the instance's forward on its sampled calls, `InstanceTarget`). A correct
        file gets `optimize_rounds` turns asking for a faster one; the fastest correct one is returned."""
        problem = _InstanceProblem(self, task, target)
        folder = self.artifacts_dir / f"instance-{_safe_name(task.name)}"
        outcome = self._conversation(problem, 0, folder, self._cancel)
        usage = self._usage_for(problem.tag)
        usage["attempts"] = outcome.turns
        self._write_summary(folder, problem.tag, [outcome], usage)
        if outcome.best_code is not None:
            return ModuleGenerationResult(outcome.best_code, None, usage, outcome.turns)
        return ModuleGenerationResult(None, outcome.error or "no correct ModelNew", usage, outcome.turns,
                                      outcome=Outcome.HARNESS_ERROR if outcome.harness_error else None)

    @staticmethod
    def _write_json(path: Path, data: Any) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(data, indent=1, default=str))
        except OSError:  # artifacts are best effort
            logger.debug("cannot write %s", path, exc_info=True)


class _Problem(Protocol):
    """What differs between the kinds of problem; `LLMKernelGenerator._conversation` is the one loop over them."""

    tag: str  # usage tag and log label
    noun: str  # what the model writes ("kernel", "ModelNew"), for messages
    entry_point: str  # what a reply's code must define, for the no-code feedback

    def system_prompt(self) -> str: ...

    def first_prompt(self) -> str: ...

    def fix_prompt(self, previous_code: str | None, failure: Any) -> str: ...

    def optimize_prompt(self, code: str, verdict: Any) -> str | None:
        """The optimize prompt for the best correct candidate so far; None when its speed was not measured."""

    def evaluate(self, code: str, cancel: threading.Event) -> Any:
        """The verdict on one candidate: `status` (`Outcome`), `message`, `details`, `speedup` when correct."""


@dataclass(frozen=True, eq=False)
class _TaskProblem:
    """What both kinds of problem share: the generator, the rendered task, its language and system prompt."""

    generator: LLMKernelGenerator
    task: KernelTask | ModuleTask

    @property
    def language(self) -> KernelLanguage:
        return get_language(self.task.language)

    def system_prompt(self) -> str:
        return self.generator.renderer.system(self.task)


@dataclass(frozen=True, eq=False)
class _FunctionProblem(_TaskProblem):
    """One `torch.nn.functional` function: the kernel runs in the sandbox against the oracle on the samples."""

    task: KernelTask
    samples: list[Sample]
    counts: list[int]
    noun: str = "kernel"
    entry_point: str = "kernel_function"

    @property
    def tag(self) -> str:
        return self.task.function

    def first_prompt(self) -> str:
        return self.generator.renderer.generate(self.task)

    def fix_prompt(self, previous_code: str | None, failure: Any) -> str:
        return self.generator.renderer.fix(self.task, previous_code, failure)

    def optimize_prompt(self, code: str, verdict: Any) -> str | None:
        performance = self.generator._performance(self.task, verdict, self.samples)
        return self.generator.renderer.optimize(self.task, code, performance)

    def evaluate(self, code: str, cancel: threading.Event) -> Any:
        self.generator._prebuild(code, self.task, cancel)
        return self.generator._judge(code, self.task, self.samples, self.counts, cancel)


@dataclass(frozen=True, eq=False)
class _ModuleProblem(_TaskProblem):
    """A KernelBench-format problem: the judge checks (and times) each `ModelNew` against `target`."""

    task: ModuleTask
    target: ModuleTarget
    noun: str = "ModelNew"
    entry_point: str = "ModelNew"

    @property
    def tag(self) -> str:
        name = getattr(self.task, "name", None)
        return f"module:{name}" if name else "module"

    def first_prompt(self) -> str:
        return self.generator.renderer.generate_module(self.task)

    def fix_prompt(self, previous_code: str | None, failure: Any) -> str:
        return self.generator.renderer.fix_module(self.task, previous_code, failure)

    def optimize_prompt(self, code: str, verdict: Any) -> str | None:
        latency = getattr(verdict, "latency_ms", None)
        if latency is None:
            return None
        timing = latency.get("mode", "eager") if isinstance(latency, dict) else "eager"
        try:
            performance = Performance.of({"latency_ms": latency, "baseline_ms": getattr(verdict, "baseline_ms", None),
                                          "timing": timing, "calls": 1})
        except ValueError as exc:  # an unusable measurement (e.g. a zero median): nothing to optimise against
            logger.info("%s: no usable timing for %s: %s", self.generator.name, self.tag, exc)
            return None
        return self.generator.renderer.optimize_module(self.task, code, performance)

    def evaluate(self, code: str, cancel: threading.Event) -> Any:
        return self.generator.judge.judge_source(code, self.target, self.language, cancel_event=cancel)


@dataclass(frozen=True, eq=False)
class _InstanceProblem(_TaskProblem):
    """A live module of a user's model: the judge checks (and times) each `ModelNew(original)` against the
    instance's forward on the calls it got in the model."""

    task: InstanceTask
    target: InstanceTarget
    noun: str = "ModelNew"
    entry_point: str = "ModelNew"

    @property
    def tag(self) -> str:
        return self.target.function

    def first_prompt(self) -> str:
        return self.generator.renderer.generate_instance(self.task)

    def fix_prompt(self, previous_code: str | None, failure: Any) -> str:
        return self.generator.renderer.fix_instance(self.task, previous_code, failure)

    def optimize_prompt(self, code: str, verdict: Any) -> str | None:
        if getattr(verdict, "latency_ms", None) is None:
            return None
        try:
            performance = self.generator._performance(self.task, verdict, list(self.target.samples))
        except ValueError as exc:  # an unusable measurement: nothing to optimise against
            logger.info("%s: no usable timing for %s: %s", self.generator.name, self.tag, exc)
            return None
        return self.generator.renderer.optimize_instance(self.task, code, performance)

    def evaluate(self, code: str, cancel: threading.Event) -> Any:
        return self.generator.judge.judge_source(code, self.target, self.language, cancel_event=cancel)


def _safe_name(name: str) -> str:
    """A problem name as one folder name."""
    return re.sub(r"[^\w.-]+", "_", name).strip("_") or "problem"


def _verdict_dict(verdict: Any) -> Any:
    """A verdict in JSON-safe form for the transcript (`to_dict()` where it has one)."""
    to_dict = getattr(verdict, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    if dataclasses.is_dataclass(verdict) and not isinstance(verdict, type):
        return dataclasses.asdict(verdict)
    return getattr(verdict, "__dict__", repr(verdict))


class _Transcript:
    """Writes one conversation's prompts, replies, code and verdicts as files (best effort)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def _write(self, name: str, text: str) -> None:
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            (self.folder / name).write_text(text)
        except OSError:
            logger.debug("cannot write artifact %s", name, exc_info=True)

    def write_prompt(self, turn: int, text: str) -> None:
        self._write(f"turn{turn:02d}-prompt.md", text)

    def write_reply(self, turn: int, text: str) -> None:
        self._write(f"turn{turn:02d}-reply.md", text)

    def write_result(self, turn: int, code: str, result: Any) -> None:
        self._write(f"turn{turn:02d}-kernel.py", code)
        self._write(f"turn{turn:02d}-result.json", json.dumps(_verdict_dict(result), indent=1, default=str))

    def write_messages(self, messages: list[dict[str, str]]) -> None:
        self._write("messages.json", json.dumps(messages, indent=1))

