"""`LLMKernelGenerator`: the LLM agent that writes kernels for one `torch.nn.functional` function.

Per function it runs `candidates` independent conversations. Each conversation asks for a kernel (the `generate`
prompt), screens it, runs it in the sandbox against the harness oracle, and feeds every failure back (`fix`) for up
to `attempts` turns (a `harness_error` verdict, a failure of the harness and not of the kernel, ends the
conversation instead: it is never sent to the model as its fault); after the first correct kernel it spends
`optimize_rounds` more turns asking for faster versions (`optimize`: latency vs PyTorch, vs the roofline floor and
vs an empty kernel launch). The fastest correct
kernel over all conversations becomes a `GeneratedKernelProvider`. Validated kernels are cached on disk, so a second
`make_plan` on the same model makes no LLM call. Everything said and measured is written under an artifacts folder.

`submit` returns at once; `cancel` (called by the optimizer when its generation timeout passes) abandons in-flight
LLM calls and kills every sandbox child within a few seconds.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import datetime as _dt
import json
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from agent.cache import KernelCache, cache_key
from agent.languages import get_language
from agent.llm import LLMClient, LLMConfig, LLMError
from agent.prompting import Failure, KernelTask, ModuleTask, Performance, PromptRenderer
from agent.provider import GeneratedKernelProvider
from agent.replies import extract_code, no_code_feedback
from agent.sandbox import SandboxPool, SandboxResult
from forge.execution import Execution
from forge.functional import functional_names
from forge.outcome import Outcome
from forge.provider import KernelGenerationResult, KernelGenerator
from forge.samples import Sample, SampleCounter, iter_tensors

__all__ = ["LLMKernelGenerator", "ModuleGenerationResult", "RANDOM_FUNCTIONS"]

logger = logging.getLogger(__name__)

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
    result: SandboxResult | None
    note: str = ""


@dataclass
class _ConversationOutcome:
    index: int
    best_code: str | None = None
    best_result: SandboxResult | None = None
    turns: int = 0
    error: str | None = None
    harness_error: bool = False  # stopped because the harness failed, not the kernel
    history: list[_Attempt] = field(default_factory=list)

    @property
    def speedup(self) -> float:
        if self.best_result is None:
            return 0.0
        return self.best_result.speedup or 0.0


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
        *,
        client: LLMClient | None = None,
        candidates: int = 2,
        attempts: int = 4,
        optimize_rounds: int = 2,
        functions: Sequence[str] | None = None,
        exclude: Sequence[str] | None = None,
        language: str = "triton",
        prompts_dir: str | Path | None = None,
        llm_concurrency: int = 4,
        sandbox_concurrency: int | None = None,
        sandbox_timeout_s: float = 300.0,
        kernel_utils: Any = None,
        artifacts_dir: str | Path | None = None,
        use_cache: bool = True,
    ) -> None:
        for name, value, low in (("candidates", candidates, 1), ("attempts", attempts, 1),
                                 ("optimize_rounds", optimize_rounds, 0), ("llm_concurrency", llm_concurrency, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        self.config = config if config is not None else (client.config if client is not None else LLMConfig.from_env())
        self._client = client
        self._client_lock = threading.Lock()
        self.candidates = candidates
        self.attempts = attempts
        self.optimize_rounds = optimize_rounds
        self.language = get_language(language)
        self.renderer = PromptRenderer(prompts_dir)
        known = set(functional_names())
        for label, names in (("functions", functions), ("exclude", exclude)):
            unknown = sorted(set(names or ()) - known)
            if unknown:
                raise ValueError(f"{label} names unknown torch.nn.functional functions: {', '.join(unknown)}")
        allowed = set(functions) if functions is not None else known - RANDOM_FUNCTIONS
        self._functions = sorted(allowed - set(exclude or ()))
        if sandbox_concurrency is None:
            sandbox_concurrency = 1 if torch.cuda.is_available() else 2
        self.sandbox_timeout_s = float(sandbox_timeout_s)
        self.kernel_utils = kernel_utils
        sandbox_defaults: dict[str, Any] = {"timeout_s": self.sandbox_timeout_s, "language": self.language.name}
        if kernel_utils is not None:
            sandbox_defaults["kernel_utils"] = kernel_utils
        self.sandbox = SandboxPool(sandbox_concurrency, **sandbox_defaults)
        self._llm_slots = threading.BoundedSemaphore(llm_concurrency)
        self._function_pool = cf.ThreadPoolExecutor(max_workers=4, thread_name_prefix="kforge-gen")
        self._conversation_pool = cf.ThreadPoolExecutor(
            max_workers=max(llm_concurrency, candidates), thread_name_prefix="kforge-conv"
        )
        self._cancel = threading.Event()
        self.cache = KernelCache(self.config.cache_dir) if use_cache else None
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        base = Path(artifacts_dir) if artifacts_dir is not None else Path(self.config.cache_dir) / "runs"
        self.artifacts_dir = base / f"{stamp}-{id(self) % 10000:04d}"
        self._launch_us: dict[str, float] = {}

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
        """Time sandboxed candidates on the clock the optimizer will select on (`execution.timing_mode`)."""
        from forge.checking import KernelUtils

        base = self.kernel_utils if self.kernel_utils is not None else KernelUtils()
        self.kernel_utils = dataclasses.replace(base, timing=execution.timing_mode)
        self.sandbox.defaults["kernel_utils"] = self.kernel_utils

    def prepare(self, function: str, samples: Sequence[Sample]) -> bool:
        if function not in self._functions:
            logger.info("%s: %s is not in this generator's function list", self.name, function)
            return False
        if not samples:
            logger.info("%s: no samples for %s", self.name, function)
            return False
        devices = {t.device.type for s in samples for t in iter_tensors((s.args, s.kwargs))}
        unsupported = devices - set(self.language.device_types())
        if unsupported:
            logger.info("%s: %s kernels cannot target %s tensors (samples of %s)", self.name, self.language.name,
                        ", ".join(sorted(unsupported)), function)
            return False
        if not devices:
            logger.info("%s: samples of %s hold no tensors", self.name, function)
            return False
        self.sandbox.isolation()  # SandboxUnavailableError here, before any LLM call is paid for
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
        killed = self.sandbox.kill_all()
        logger.info("%s cancelled (%d sandbox process group(s) killed)", self.name, killed)

    def close(self) -> None:
        self.cancel()
        self._function_pool.shutdown(wait=False, cancel_futures=True)
        self._conversation_pool.shutdown(wait=False, cancel_futures=True)
        self.sandbox.close()

    # -- one function -------------------------------------------------------------------------------------
    def _task(self, function: str, samples: list[Sample]) -> tuple[KernelTask, list[int]]:
        counter = SampleCounter()
        for sample in samples:
            counter.add(sample.args, sample.kwargs, clone=False)
        items = counter.items()
        return KernelTask.from_samples(function, items, language=self.language.name), [c for c, _ in items]

    def cache_key_for(self, task: KernelTask) -> str:
        return cache_key(
            task_key=task.signature_key(),
            model_fingerprint=self.config.fingerprint(),
            template_hash=self.renderer.template_hash(),
            language=self.language.name,
        )

    def _generate(self, function: str, samples: list[Sample], cancel: threading.Event) -> KernelGenerationResult:
        task, counts = self._task(function, samples)
        key = self.cache_key_for(task)
        if self.cache is not None:
            hit = self.cache.get(key)
            if hit is not None:
                provider, info = hit
                if provider.prepare(samples):
                    logger.info("%s: kernel for %s served from the cache (no LLM call)", self.name, function)
                    return KernelGenerationResult(
                        function=function, provider=provider, description=f"{provider.name} (cached)",
                        usage={"cached": True, "calls": 0, **{k: v for k, v in info.items() if k != "cached"}},
                    )
        folder = self.artifacts_dir / function
        futures = [
            self._conversation_pool.submit(self._conversation, task, samples, counts, i, folder, cancel)
            for i in range(self.candidates)
        ]
        outcomes = [f.result() for f in futures]
        usage = self._usage_for(function)
        usage["attempts"] = sum(o.turns for o in outcomes)
        if self._client is not None:  # run totals so far: every function's calls, tokens and cost
            self._write_json(self.artifacts_dir / "usage.json", self._client.usage.summary())
        self._write_json(folder / "summary.json", {
            "function": function,
            "conversations": [{"index": o.index, "turns": o.turns, "speedup": o.speedup, "error": o.error}
                              for o in outcomes],
            "usage": usage,
        })
        correct = [o for o in outcomes if o.best_code is not None]
        if not correct:
            errors = "; ".join(f"conversation {o.index}: {o.error}" for o in outcomes)
            harness = any(o.harness_error for o in outcomes)
            return KernelGenerationResult(function=function, error=f"no correct kernel for {function}: {errors}",
                                          usage=usage, outcome=Outcome.HARNESS_ERROR if harness else None)
        best = max(correct, key=lambda o: o.speedup)
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
        provider = GeneratedKernelProvider(function, best.best_code, language=self.language.name,
                                           signatures=samples, metadata=metadata)
        if not provider.prepare(samples):
            return KernelGenerationResult(function=function, error="the validated kernel could not be imported",
                                          usage=usage)
        if self.cache is not None:
            self.cache.put(key, provider, {"sandbox_speedup": best.speedup, "model": self.config.model})
        return KernelGenerationResult(
            function=function, provider=provider, usage=usage,
            description=f"{provider.name}: {best.speedup:.2f}x in the sandbox after {usage['attempts']} turn(s)",
        )

    def _usage_for(self, tag: str) -> dict[str, Any]:
        client = self._client
        if client is None:
            return {"calls": 0}
        return dict(client.usage.by_tag().get(tag, {"calls": 0}))

    # -- one conversation ---------------------------------------------------------------------------------
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

    def _run_sandbox(self, code: str, task: KernelTask, samples: list[Sample], counts: list[int],
                     cancel: threading.Event) -> SandboxResult:
        return self.sandbox.run(code, task.function, samples, counts=counts, cancel_event=cancel)

    def _performance(self, task: KernelTask, result: SandboxResult, samples: list[Sample]) -> Performance:
        from agent.roofline import estimate

        device = "cuda" if any(t.device.type == "cuda" for s in samples for t in iter_tensors((s.args, s.kwargs))) \
            else "cpu"
        if device not in self._launch_us:
            try:
                from forge.checking import empty_kernel_launch_us

                self._launch_us[device] = empty_kernel_launch_us(device)
            except Exception:  # pragma: no cover - measurement is best effort
                self._launch_us[device] = 0.0
        try:
            roofline = estimate(task.function, task.sample_list, task.device_name)
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

    def _conversation(self, task: KernelTask, samples: list[Sample], counts: list[int], index: int,
                      folder: Path, cancel: threading.Event) -> _ConversationOutcome:
        outcome = _ConversationOutcome(index=index)
        log = _Transcript(folder / f"conversation-{index}")
        messages = [{"role": "system", "content": self.renderer.system(task)},
                    {"role": "user", "content": self.renderer.generate(task)}]
        best_code: str | None = None
        best: SandboxResult | None = None
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
                reply = self._ask(messages, task.function, cancel)
                outcome.turns += 1
                if best is None:
                    budget -= 1
                else:
                    optimizing += 1
                messages.append({"role": "assistant", "content": reply.text})
                log.write_reply(outcome.turns - 1, reply.text)
                extracted = None if reply.truncated else extract_code(reply.text)
                if extracted is None:
                    status = "truncated" if reply.truncated else "no_code"
                    failure = Failure.of({"status": status, "message": no_code_feedback(reply.text),
                                          "reply": reply.text[-2000:]})
                    outcome.history.append(_Attempt(None, None, status))
                    messages.append({"role": "user", "content": self.renderer.fix(task, last_code, failure)})
                    continue
                code = extracted.code
                result = self._run_sandbox(code, task, samples, counts, cancel)
                log.write_result(outcome.turns - 1, code, result)
                outcome.history.append(_Attempt(code, result))
                if result.ok:
                    if best is None or (result.speedup or 0.0) > (best.speedup or 0.0):
                        best_code, best = code, result
                    messages.append({"role": "user", "content": self.renderer.optimize(
                        task, best_code, self._performance(task, best, samples))})
                else:
                    if result.details.get("cancelled"):
                        outcome.error = "cancelled"
                        break
                    if not result.status.blames_candidate:  # the harness failed: never told to the model as its fault
                        outcome.error = f"{Outcome.HARNESS_ERROR.value}: {result.message}"
                        outcome.harness_error = True
                        logger.warning("%s: conversation %d for %s stopped: %s", self.name, index, task.function,
                                       outcome.error)
                        break
                    last_code = code
                    messages.append({"role": "user", "content": self.renderer.fix(task, code, result)})
        except LLMError as exc:
            outcome.error = f"llm {exc.kind}: {exc.message}"
            logger.warning("%s: conversation %d for %s stopped: %s", self.name, index, task.function, outcome.error)
        except Exception as exc:  # a bug must not take the optimizer down
            outcome.error = f"{type(exc).__name__}: {exc}"
            logger.warning("%s: conversation %d for %s failed", self.name, index, task.function, exc_info=True)
        outcome.best_code, outcome.best_result = best_code, best
        if best is None and outcome.error is None:
            last = outcome.history[-1] if outcome.history else None
            reason = last.result.message if last and last.result else (last.note if last else "no reply")
            outcome.error = f"no correct kernel in {self.attempts} attempt(s); last: {reason}"
        log.write_messages(messages)
        return outcome

    # -- module problems (KernelBench format, used by evals) ----------------------------------------------
    def generate_module(self, task: ModuleTask, evaluate: Callable[[str], Any]) -> ModuleGenerationResult:
        """Write a `ModelNew` for a KernelBench-format problem. `evaluate(source)` checks one candidate and returns
        an object with `status` / `message` / `details` (a `SandboxResult`-like verdict; `status == "ok"` = pass)."""
        tag = f"module:{task.name}" if getattr(task, "name", None) else "module"
        messages = [{"role": "system", "content": self.renderer.system(task)},
                    {"role": "user", "content": self.renderer.generate_module(task)}]
        last_code = None
        turns = 0
        cancel = self._cancel
        try:
            for _ in range(self.attempts):
                reply = self._ask(messages, tag, cancel)
                turns += 1
                messages.append({"role": "assistant", "content": reply.text})
                extracted = None if reply.truncated else extract_code(reply.text)
                if extracted is None:
                    failure = Failure.of({"status": "no_code", "message": no_code_feedback(reply.text,
                                                                                           entry_point="ModelNew")})
                    messages.append({"role": "user", "content": self.renderer.fix_module(task, last_code, failure)})
                    continue
                verdict = evaluate(extracted.code)
                status = getattr(verdict, "status", None)
                if status == Outcome.OK:
                    return ModuleGenerationResult(extracted.code, None, self._usage_for(tag), turns)
                if status == Outcome.HARNESS_ERROR:  # not the model's fault: stop without blaming it
                    return ModuleGenerationResult(
                        None, f"{Outcome.HARNESS_ERROR.value}: {getattr(verdict, 'message', '')}",
                        self._usage_for(tag), turns, outcome=Outcome.HARNESS_ERROR)
                last_code = extracted.code
                messages.append({"role": "user", "content": self.renderer.fix_module(task, last_code, verdict)})
        except LLMError as exc:
            return ModuleGenerationResult(None, f"llm {exc.kind}: {exc.message}", self._usage_for(tag), turns)
        return ModuleGenerationResult(None, f"no correct ModelNew in {self.attempts} attempt(s)",
                                      self._usage_for(tag), turns)

    @staticmethod
    def _write_json(path: Path, data: Any) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(data, indent=1, default=str))
        except OSError:  # artifacts are best effort
            logger.debug("cannot write %s", path, exc_info=True)


class _Transcript:
    """Writes one conversation's prompts, replies, code and sandbox verdicts as files (best effort)."""

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

    def write_result(self, turn: int, code: str, result: SandboxResult) -> None:
        self._write(f"turn{turn:02d}-kernel.py", code)
        self._write(f"turn{turn:02d}-result.json", json.dumps(result.to_dict(), indent=1, default=str))

    def write_messages(self, messages: list[dict[str, str]]) -> None:
        self._write("messages.json", json.dumps(messages, indent=1))

