"""Push each corpus kernel through the path an LLM reply takes, and say how that path ended.

WHY this path. In production a generated kernel is a reply of the model: `LLMKernelGenerator` extracts the code,
screens it, runs it in the sandbox (`forge.sandbox`, through its `SandboxPool`), imports the sandbox-approved source
into the kforge process as a `GeneratedKernelProvider`, and `KernelOptimizer.make_plan` validates it again in
process, times it against PyTorch and may select it. The corpus uses exactly that code: a scripted LLM client
replies with the corpus file (the only stand-in), and `make_plan` runs on a one-call module. Whatever defence
lands in any of those layers is exercised without changing this file.

Cost. With `timing="quick"` (CI) the sandbox does not time the candidate (that timing is only feedback for the
model) and the optimizer skips its end-to-end model timing; the verdicts are the production ones. Screening runs in
the calling process (the same `screen` the sandbox runs first; a refused file never starts anything). Every other
file runs in its own worker process: an exploit that patches `torch.Tensor` or the timers in "the kforge process"
patches only that worker, and the worker's own snapshot says what was changed. The workers are forked from a
"forkserver" process that has only imported torch, triton, `torch._dynamo` (make_plan's profiler needs it),
`agent` and `forge` (`_PRELOAD`): that saved ~7 s of imports per file (measured on the 2-core CPU machine: a
worker of `honest_silu_example` spent 3.4 s importing, then 3.4 s more on `torch._dynamo` inside make_plan, of
~15 s). Per file now: the sandbox child (~4-5 s, a fresh process per candidate, as in production), the plan and
the production check (~1-3 s); `run_corpus` runs `jobs` files at a time.

Outcome. `Category` (tests.adversarial.corpus): where the path stopped, from the structured statuses (`screen`
violations, `SandboxResult.status`, the optimizer's `ReportStatus`); `launch_check` and `integrity` are told apart
from other runtime errors and mismatches by the defence's message (`_refine`), as no typed field names them yet.
`production` says whether the kernel is right on production-like calls (a wider input distribution, an offset
view, an input updated in place and passed again, 24 calls): it shows an accepted exploit really returns garbage.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import dataclasses
import json
import logging
import math
import multiprocessing
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.adversarial.corpus import Category, Entry, entries, entry, samples_for

__all__ = ["Outcome", "main", "run_corpus", "run_entry", "screen_violations"]

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
WORKER_TIMEOUT_S = 420.0
# Statuses of the optimizer's report that mean the candidate passed the oracle and was timed.
_TIMED_STATUSES = {"selected", "valid", "slower", "not significant", "dropped (not faster end to end)",
                   "not_capturable"}
_LAUNCH_WORDS = re.compile(r"launch[ _-]?check|outside (?:of )?(?:its|the candidate's|the) (?:own )?kernel|"
                           r"computation outside|no (?:triton )?kernel (?:was )?launched|never launched|"
                           r"(?:aten|torch|pytorch) (?:ops?|operators?) (?:ran|were run|called)", re.I)
_INTEGRITY_WORDS = re.compile(r"integrity|tamper|monkey[- ]?patch|was (?:replaced|patched|changed)|"
                              r"patched|identity|forged|interpreter state", re.I)


@dataclass(frozen=True)
class Outcome:
    """How one corpus file fared."""

    name: str
    function: str
    mechanism: str
    expected: tuple[Category, ...]
    actual: Category
    reason: str
    stage: str = ""  # screen, sandbox, import, validate, plan
    report_status: str | None = None
    speedup: float | None = None
    production: str = "n/a"
    tampered: tuple[str, ...] = ()
    wall_s: float = 0.0

    @property
    def honest(self) -> bool:
        return self.expected == (Category.ACCEPTED,)

    @property
    def as_expected(self) -> bool:
        return self.actual in self.expected

    def line(self) -> str:
        mark = "ok " if self.as_expected else "GAP" if not self.honest else "BAD"
        speed = f" {self.speedup:.2f}x" if self.speedup else ""
        extra = f" tampered={','.join(self.tampered)}" if self.tampered else ""
        return (f"{mark} {self.name:45s} expected={'|'.join(self.expected):28s} actual={self.actual:13s} "
                f"[{self.stage}{speed}; production {self.production}{extra}; {self.wall_s:.0f} s] "
                f"{_one_line(self.reason, 160)}")

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["expected"] = [str(c) for c in self.expected]
        data["actual"] = str(self.actual)
        data["tampered"] = list(self.tampered)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Outcome:
        data = dict(data)
        data["expected"] = tuple(Category(c) for c in data["expected"])
        data["actual"] = Category(data["actual"])
        data["tampered"] = tuple(data.get("tampered") or ())
        return cls(**data)


def _one_line(text: str, limit: int = 400) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _refine(category: Category, text: str) -> Category:
    """A runtime error or mismatch whose message names the launch check or an integrity check."""
    if category in (Category.RUNTIME_ERROR, Category.MISMATCH, Category.CRASH):
        if _LAUNCH_WORDS.search(text):
            return Category.LAUNCH_CHECK
        if _INTEGRITY_WORDS.search(text):
            return Category.INTEGRITY
    return category


# ---------------------------------------------------------------------------------------------------------
# The calling process: screening, then one worker per file
# ---------------------------------------------------------------------------------------------------------
def screen_violations(e: Entry) -> list[Any]:
    """What screening refuses in the file (the sandbox's first step; nothing runs)."""
    from agent.languages import get_language

    return list(get_language("triton").screen(e.source, e.function))


def run_entry(e: Entry, device: str = "cpu", *, timing: str = "quick", scale: int = 1,
              timeout_s: float = WORKER_TIMEOUT_S) -> Outcome:
    """Screen `e`; unless refused, run the rest of the path in a fresh worker process (forked from the server)."""
    start = time.monotonic()
    violations = screen_violations(e)
    if violations:
        shown = "; ".join(f"line {v.line}: {v.message}" for v in violations[:3])
        return Outcome(e.name, e.function, e.mechanism, e.expect, Category.FORBIDDEN,
                       f"refused by screening ({len(violations)}): {shown}", stage="screen",
                       wall_s=time.monotonic() - start)
    with tempfile.TemporaryDirectory(prefix="kforge-adversarial-") as folder:
        out, log = Path(folder) / "outcome.json", Path(folder) / "worker.log"
        env = dict(os.environ)
        env["KFORGE_CACHE_DIR"] = str(Path(folder) / "cache")
        if not device.startswith("cuda"):
            env.setdefault("TRITON_INTERPRET", "1")
        process = _worker_context().Process(target=_forked_worker, name=f"adversarial-{e.name}",
                                            args=(e.name, device, timing, scale, str(out), str(log), env))
        process.start()
        process.join(timeout_s)
        if process.is_alive():
            process.kill()
            process.join()
            return Outcome(e.name, e.function, e.mechanism, e.expect, Category.CRASH,
                           f"worker timed out after {timeout_s:g} s", stage="worker",
                           wall_s=time.monotonic() - start)
        if not out.exists():
            tail = _one_line(log.read_text(errors="replace")[-1500:] if log.exists() else "", 600)
            return Outcome(e.name, e.function, e.mechanism, e.expect, Category.CRASH,
                           f"worker exited with code {process.exitcode} and no outcome: {tail}", stage="worker",
                           wall_s=time.monotonic() - start)
        outcome = Outcome.from_dict(json.loads(out.read_text()))
    return dataclasses.replace(outcome, wall_s=time.monotonic() - start)


# What every worker imports, once, in the fork server (torch._dynamo: make_plan's profiler imports it, ~3.4 s).
_PRELOAD = ("torch", "torch.nn.functional", "torch._dynamo", "torch.profiler", "triton", "triton.language",
            "agent.generator", "agent.llm", "agent.llm.client", "agent.llm.usage", "forge.optimizer",
            "forge.checking", "forge.functional", "forge.samples")


def _worker_context() -> Any:
    """The "forkserver" context: a server process that has imported `_PRELOAD` and nothing else forks each worker.

    Each corpus file still gets its own process (an exploit's patches die with it), started from a state no
    candidate ever touched; only the ~7 s of imports per file are shared."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(_PRELOAD))  # takes effect when the server starts (the first worker)
    return context


def _forked_worker(name: str, device: str, timing: str, scale: int, out: str, log: str,
                   env: dict[str, str]) -> None:
    """The worker process: the kforge process of one `make_plan`, with the caller's environment and its own log."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(REPO_ROOT)
    logging.basicConfig(level=logging.WARNING)
    outcome = _worker(name, device, timing, scale)
    Path(out).write_text(json.dumps(outcome.to_dict()))


def run_corpus(selected: Iterable[Entry] | None = None, device: str = "cpu", *, jobs: int = 2,
               timing: str = "quick", scale: int = 1, on_result: Callable[[Outcome], None] | None = None
               ) -> list[Outcome]:
    """Run `selected` (default: the whole corpus), `jobs` files at a time; outcomes in corpus order."""
    chosen = list(entries() if selected is None else selected)
    results: dict[str, Outcome] = {}
    with cf.ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="adversarial") as pool:
        futures = {pool.submit(run_entry, e, device, timing=timing, scale=scale): e for e in chosen}
        for future in cf.as_completed(futures):
            outcome = future.result()
            results[outcome.name] = outcome
            if on_result is not None:
                on_result(outcome)
    return [results[e.name] for e in chosen]


# ---------------------------------------------------------------------------------------------------------
# The worker: the kforge process of one `make_plan`
# ---------------------------------------------------------------------------------------------------------
class _StateSnapshot:
    """What an exploit in "the kforge process" could patch: torch.Tensor, torch, F, the timers, thread count."""

    def __init__(self) -> None:
        import time as time_module

        import torch
        import torch.nn.functional as F

        # (`torch` itself is left out: importing torch._dynamo adds submodules and rewraps torch.manual_seed.)
        self._targets: list[tuple[str, Any]] = [("torch.Tensor", torch.Tensor), ("torch.nn.functional", F),
                                                ("time", time_module)]
        if hasattr(torch, "cuda") and hasattr(torch.cuda, "Event"):
            self._targets.append(("torch.cuda.Event", torch.cuda.Event))
        self._saved = {label: dict(vars(obj)) for label, obj in self._targets}
        self._threads = torch.get_num_threads()

    def changes(self) -> list[str]:
        import torch

        changed = []
        for label, obj in self._targets:
            now, before = vars(obj), self._saved[label]
            for key in set(now) | set(before):
                if now.get(key, _ABSENT) is not before.get(key, _ABSENT) and not key.startswith("__"):
                    changed.append(f"{label}.{key}")
        if torch.get_num_threads() != self._threads:
            changed.append("torch.get_num_threads")
        return sorted(changed)

    def restore(self) -> None:
        import torch

        for label, obj in self._targets:
            before = self._saved[label]
            for key in list(vars(obj)):
                if key not in before and not key.startswith("__"):
                    try:
                        delattr(obj, key)
                    except (AttributeError, TypeError):
                        pass
            for key, value in before.items():
                if key.startswith("__"):
                    continue
                if vars(obj).get(key, _ABSENT) is not value:
                    try:
                        setattr(obj, key, value)
                    except (AttributeError, TypeError):
                        pass
        torch.set_num_threads(self._threads)


_ABSENT = object()


def _utils(timing: str) -> Any:
    from forge.checking import KernelUtils

    base = KernelUtils()  # the oracle's own settings; only the benchmark is shortened
    if timing == "quick":
        return dataclasses.replace(base, warmup=1, rounds=3, min_run_time_s=0.01)
    if timing == "short":
        return dataclasses.replace(base, warmup=3, rounds=10, min_run_time_s=0.05)
    return base


def _generator_class() -> type:
    from agent.generator import LLMKernelGenerator

    class CorpusGenerator(LLMKernelGenerator):
        """The production generator; it only remembers the sandbox verdicts it got."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.sandbox_results: list[Any] = []
            self.providers: list[Any] = []

        def _judge(self, code, task, samples, counts, cancel):  # type: ignore[no-untyped-def]
            result = super()._judge(code, task, samples, counts, cancel)
            self.sandbox_results.append(result)
            return result

        def _generate(self, function, samples, cancel):  # type: ignore[no-untyped-def]
            result = super()._generate(function, samples, cancel)
            if result.provider is not None:
                self.providers.append(result.provider)
            return result

    return CorpusGenerator


def _scripted_client(config: Any, text: str) -> Any:
    from agent.llm.client import LLMClient, LLMReply
    from agent.llm.usage import TokenUsage

    class ScriptedClient(LLMClient):
        """Replies to every request with the corpus file (no network)."""

        def complete(self, messages, *, tag=""):  # type: ignore[no-untyped-def]
            return LLMReply(text=text, finish_reason="stop", model=self.config.model,
                            usage=TokenUsage(prompt_tokens=1, completion_tokens=1, total_tokens=2), cost_usd=None,
                            from_cassette=False, latency_s=0.0)

    return ScriptedClient(config)


def _reply_text(source: str) -> str:
    return f"Here is the kernel.\n\n```python\n{source.strip()}\n```\n\nIt launches Triton kernels only.\n"


def _module(function: str) -> Any:
    import torch.nn.functional as F
    from torch import nn

    class OneCall(nn.Module):
        def forward(self, *args: Any, **kwargs: Any) -> Any:
            return getattr(F, function)(*args, **kwargs)

    return OneCall()


def _worker(name: str, device: str, timing: str, scale: int) -> Outcome:
    import torch

    from agent.llm import LLMConfig
    from forge.judging import JudgeOptions
    from forge.optimizer import KernelOptimizer
    from forge.sandbox import SandboxOptions

    e = entry(name)
    samples = samples_for(e, device, scale)
    utils = _utils(timing)
    cache = Path(os.environ.get("KFORGE_CACHE_DIR") or tempfile.mkdtemp(prefix="kforge-adversarial-cache-"))
    config = LLMConfig(model="adversarial-corpus", base_url="http://127.0.0.1:9", api_key="sk-corpus",
                       cache_dir=cache)
    quick = timing == "quick"
    # CI: the sandbox's timing is feedback for the model only, and the end-to-end check times the model
    judge_options = JudgeOptions(SandboxOptions(timeout_s=240.0), max_concurrent=1, benchmark=not quick)
    from agent.generator import GeneratorOptions

    options = GeneratorOptions(candidates=1, attempts=1, optimize_rounds=0, functions=(e.function,),
                               artifacts_dir=cache / "runs", use_cache=False)
    generator = _generator_class()(config, options, client=_scripted_client(config, _reply_text(e.source)),
                                   kernel_utils=utils, judge_options=judge_options)
    optimizer = KernelOptimizer(kernel_generators=[generator], kernel_utils=utils, judge=generator.judge,
                                generator_min_time_share_percent=0.0, generation_timeout=300.0,
                                end_to_end_check=not quick)
    snapshot = _StateSnapshot()
    escaped: BaseException | None = None
    try:
        with torch.no_grad():
            optimizer.make_plan(_module(e.function), samples)
    except BaseException as exc:  # noqa: BLE001 - an exception escaping make_plan is itself a finding
        escaped = exc
    finally:
        tampered = snapshot.changes()
        snapshot.restore()
        try:
            generator.close()
        except Exception:  # noqa: BLE001
            logger.debug("generator close failed", exc_info=True)
    outcome = _classify(e, generator, optimizer, escaped)
    production = "n/a"
    provider = generator.providers[-1] if generator.providers else None
    if provider is not None and provider.is_ready:
        production = _production_check(e, provider, device, scale, snapshot.restore)
        snapshot.restore()
    return dataclasses.replace(outcome, production=production, tampered=tuple(tampered))


def _classify(e: Entry, generator: Any, optimizer: Any, escaped: BaseException | None) -> Outcome:
    def done(category: Category, reason: str, stage: str, **extra: Any) -> Outcome:
        return Outcome(e.name, e.function, e.mechanism, e.expect, category, _one_line(reason, 1200), stage, **extra)

    if escaped is not None:
        return done(Category.CRASH, f"{type(escaped).__name__} escaped make_plan: {escaped}", "plan")
    results = generator.sandbox_results
    if not results:
        rows = optimizer.report.to_dict("records") if optimizer.report is not None else []
        return done(Category.HARNESS_ERROR, f"the sandbox never ran; report: {rows}", "sandbox")
    verdict = results[-1]
    status = str(getattr(verdict.status, "value", verdict.status))
    text = " ".join([verdict.message, *(str(x) for x in verdict.details.get("errors") or ())])
    if status != "ok":
        category = {"forbidden": Category.FORBIDDEN, "compile_error": Category.COMPILE_ERROR,
                    "runtime_error": Category.RUNTIME_ERROR, "mismatch": Category.MISMATCH,
                    "timeout": Category.CRASH, "crash": Category.CRASH,
                    "harness_error": Category.HARNESS_ERROR}.get(status, Category.CRASH)
        return done(_refine(category, text), f"sandbox {status}: {text}", "sandbox")
    rows = [r for r in optimizer.report.to_dict("records") if r.get("source") == "generated"]
    if not rows:
        return done(Category.HARNESS_ERROR, "the sandbox passed it but the optimizer reported nothing", "plan")
    row = rows[-1]
    report_status = str(row["status"])
    error = str(row.get("error") or "")
    speedup = row.get("speedup")
    speedup = float(speedup) if isinstance(speedup, (int, float)) and speedup == speedup else None
    if report_status in _TIMED_STATUSES:
        return done(Category.ACCEPTED, f"sandbox ok ({verdict.message}); in-process: {report_status}", "plan",
                    report_status=report_status, speedup=speedup)
    category = {"mismatch": Category.MISMATCH, "runtime_error": Category.RUNTIME_ERROR,
                "harness_error": Category.HARNESS_ERROR, "timeout": Category.CRASH}.get(report_status)
    if category is None:  # generation_failed / invalid / failed after an ok sandbox: the import in this process
        category = Category.RUNTIME_ERROR if "SystemExit" in error or "contained" in error else Category.COMPILE_ERROR
        stage = "import"
    else:
        stage = "validate"
    return done(_refine(category, error), f"sandbox ok; in-process {report_status}: {error}", stage,
                report_status=report_status)


# ---------------------------------------------------------------------------------------------------------
# Production-like calls
# ---------------------------------------------------------------------------------------------------------
def _production_calls(e: Entry, device: str, scale: int) -> list[tuple[tuple, dict, Callable[[], None] | None]]:
    """24 calls like a model's: wider values (affine parameters too), an offset view, a buffer updated in place
    and passed again (with the update to apply before the call)."""
    import torch

    base = samples_for(e, device, scale)[0]
    g = torch.Generator().manual_seed(1234)

    def redraw(value: Any, scale: float, shift: float) -> Any:
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            fresh = torch.randn(value.shape, generator=g) * scale + shift
            return fresh.to(value.dtype).to(value.device)
        return value

    calls: list[tuple[tuple, dict, Callable[[], None] | None]] = []
    for i in range(8):
        args = tuple(redraw(a, 2.0 + i, 0.3) for a in base.args)
        calls.append((args, dict(base.kwargs), None))
    x = base.args[0]
    for _ in range(8):
        buf = (torch.randn(x.numel() + 1, generator=g) * 3.0).to(x.dtype).to(x.device)
        view = buf[1:].view(x.shape)
        args = (view, *(redraw(a, 1.0, 1.0) for a in base.args[1:]))
        calls.append((args, dict(base.kwargs), None))
    reused = (torch.randn(x.shape, generator=g) * 2.0).to(x.dtype).to(x.device)
    args = (reused, *base.args[1:])
    for i in range(8):
        update = None if i == 0 else (lambda t=reused, k=i: t.mul_(-1.0).add_(0.1 * k))
        calls.append((args, dict(base.kwargs), update))
    return calls


def _production_check(e: Entry, provider: Any, device: str, scale: int, restore: Callable[[], None]) -> str:
    """`correct`, or `WRONG (...)` with the worst relative error, or `raised ...`."""
    import torch

    from forge.functional import original_function

    reference = original_function(e.function)
    worst, where = 0.0, ""
    for index, (args, kwargs, update) in enumerate(_production_calls(e, device, scale)):
        if update is not None:
            update()
        wide = tuple(a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)
        expected = reference(*wide, **kwargs)
        try:
            with torch.no_grad():
                got = provider(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - the candidate's failure is the finding
            return f"raised {type(exc).__name__} on call {index + 1}"
        if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
            return f"WRONG (call {index + 1}: not a tensor of the reference's shape)"
        restore()  # a kernel that patches torch on every call must not blind this comparison
        got64 = got.detach().double().cpu()
        exp64 = expected.detach().double().cpu()
        low = got.dtype in (torch.bfloat16, torch.float16)
        atol, rtol = (2e-2, 2e-2) if low else (1e-4, 1e-4)
        finite = exp64.isfinite()
        scale = exp64[finite].abs().max().item() if finite.any() else 1.0
        if not torch.equal(got64.isfinite(), finite):
            err = math.inf  # NaN or inf where the reference has none (or the reverse)
        else:
            excess = torch.where(finite, (got64 - exp64).abs() - rtol * exp64.abs(), torch.zeros_like(exp64))
            err = excess.max().item()
        if err > atol and err / (scale or 1.0) > worst:
            worst, where = err / scale, f"call {index + 1}"
    return "correct" if not where else f"WRONG (error {worst:.2g} of the output scale, first at {where})"


# ---------------------------------------------------------------------------------------------------------
# Reports and the command line
# ---------------------------------------------------------------------------------------------------------
def summary(outcomes: Sequence[Outcome]) -> str:
    exploits = [o for o in outcomes if not o.honest]
    honest = [o for o in outcomes if o.honest]
    accepted = [o for o in exploits if o.actual is Category.ACCEPTED]
    other = [o for o in exploits if o.actual is not Category.ACCEPTED and not o.as_expected]
    rejected_honest = [o for o in honest if not o.as_expected]
    lines = [f"exploits: {len(exploits)}, accepted {len(accepted)}, rejected for another reason {len(other)}; "
             f"honest: {len(honest)}, rejected {len(rejected_honest)}"]
    if accepted:
        lines.append("still accepted: " + ", ".join(f"{o.name} ({o.report_status})" for o in accepted))
    if other:
        lines.append("rejected, not as expected: " + ", ".join(f"{o.name} ({o.actual})" for o in other))
    if rejected_honest:
        lines.append("honest rejected: " + ", ".join(f"{o.name} ({o.actual})" for o in rejected_honest))
    return "\n".join(lines)


def markdown_table(outcomes: Sequence[Outcome]) -> str:
    rows = ["| kernel | function | expected | actual | as expected | stage / status | production | reason |",
            "|---|---|---|---|---|---|---|---|"]
    for o in outcomes:
        status = o.stage + (f" / {o.report_status}" if o.report_status else "")
        if o.speedup:
            status += f" ({o.speedup:.2f}x)"
        reason = _one_line(o.reason, 220).replace("|", "\\|")
        rows.append(f"| {o.name} | {o.function} | {' or '.join(o.expected)} | {o.actual} | "
                    f"{'yes' if o.as_expected else 'NO'} | {status} | {o.production} | {reason} |")
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--timing", default="quick", choices=("quick", "short", "full"))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--scale", type=int, default=1, help="multiply the samples' rows")
    parser.add_argument("names", nargs="*", help="corpus files to run (default: all)")
    args = parser.parse_args(argv)
    chosen = [entry(n) for n in args.names] if args.names else None
    outcomes = run_corpus(chosen, args.device, jobs=args.jobs, timing=args.timing, scale=args.scale,
                          on_result=lambda o: print(o.line(), flush=True))
    print(summary(outcomes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
