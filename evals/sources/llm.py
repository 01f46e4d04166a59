"""`LLMSource`: the LLM kernel generator (`agent.LLMKernelGenerator`, the same code path `make_plan` uses) as an
eval source.

Function problems: `generator.prepare(function, samples)`, then `generator.submit(function, samples).result()`;
a result with a ready `provider` is the candidate, its `usage` (prompt/completion tokens, cost, attempts) goes into
the record. Module problems: `generator.generate_module(task, target)` with an `agent.prompting.ModuleTask` (what
the prompts show) and a `forge.judging.ModuleTarget` (what the judge checks): each `ModelNew` the LLM writes runs in
the judge's sandbox child, `Model` and the oracle in the generator's process, so a candidate that crashes only costs
that attempt and never shares a process with its verdict. A correct `ModelNew` is then timed in the child against
`Model` (one forward pass on `get_inputs()`, in the eval's timing mode), so the generator's optimize rounds tell the
model its speed and keep the fastest correct `ModelNew`, exactly as for function kernels.

Either way the candidate handed to the eval carries its code (`Candidate.code`): the eval's own verdict is the
judge's, in the sandbox, before the candidate is imported here for timing.

The generator is built in each worker (`setup`), with its kernel cache off (an eval measures generation, not the
cache) and its artifacts under the run folder. `agent` is imported lazily, so `evals` works without it.

Cassettes: replaying is read-only, so every worker reads the same file. Recording is not: each worker records into
its own part file (`<cassette>.parts/`), and `finish_run` concatenates the parts into the cassette (after the
lines already there when resuming), so crashed and replaced workers lose nothing.
"""

from __future__ import annotations

import concurrent.futures as cf
import copy
import dataclasses
import datetime as _dt
import logging
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from evals.failures import Failure
from evals.problems import FunctionProblem, ModuleProblem
from evals.sources.base import Candidate, EvalSource
from forge.atomic import write_text_atomic
from forge.checking import KernelUtils
from forge.judging import CandidateCode, ModuleTarget
from forge.outcome import Outcome
from forge.provider import KernelGenerator
from forge.samples import Sample

__all__ = ["LLMSource"]

logger = logging.getLogger(__name__)

_PARTS_SUFFIX = ".parts"
# The language `ModelNew` files of KernelBench module problems are written in (function problems use the generator's).
_MODULE_LANGUAGE = "triton"


def _import_generator_class() -> type:
    try:
        import agent
    except ImportError as exc:
        raise RuntimeError(f"--source llm needs the `agent` package (the LLM kernel generator): {exc}") from exc
    cls = getattr(agent, "LLMKernelGenerator", None)
    if cls is None:
        try:
            from agent.generator import LLMKernelGenerator as cls  # noqa: N813
        except ImportError as exc:
            raise RuntimeError("agent.LLMKernelGenerator is not available in this installation; --source llm "
                               f"cannot run ({exc})") from exc
    return cls


def _failure(result: Any) -> Failure:
    """`harness_error` when the generator says the harness stopped it (its typed `outcome`), else
    `generation_failed`."""
    return Failure.HARNESS_ERROR if getattr(result, "outcome", None) == Outcome.HARNESS_ERROR else \
        Failure.GENERATION_FAILED


class LLMSource(EvalSource):
    """The LLM kernel generator as an eval source (see the module docstring).

    `config`: an `agent.llm.LLMConfig` (model, endpoint, cassette...); None reads it from the environment.
    `generator_factory`: builds the `forge.KernelGenerator` in each worker instead of `agent.LLMKernelGenerator`
    (must be picklable: a module-level function or class). `generator_options`: `agent.GeneratorOptions` fields (e.g.
    `candidates`, `attempts`, `optimize_rounds`) and the generator's `judge_options` / `kernel_utils` / `client`.
    `generation_timeout_s`: give up on one problem's generation after this long (recorded as `timeout`).
    """

    def __init__(self, config: Any = None, *, generator_factory: Callable[[], KernelGenerator] | None = None,
                 generator_options: Mapping[str, Any] | None = None,
                 generation_timeout_s: float | None = None) -> None:
        if config is None and generator_factory is None:
            from agent.llm import LLMConfig

            config = LLMConfig.from_env()
        if config is not None and config.cassette is not None and config.cassette_mode is None:
            # Decide auto mode once, in the parent, so workers agree (and parts merged later do not flip it).
            config = dataclasses.replace(config, cassette_mode=config.resolved_cassette_mode())
        self.config = config
        self.generator_factory = generator_factory
        self.generator_options = dict(generator_options or {})
        self.generation_timeout_s = generation_timeout_s
        self.artifacts_dir: Path | None = None
        self._run_token = ""
        self._generator: KernelGenerator | None = None

    @property
    def name(self) -> str:
        model = getattr(self.config, "model", None)
        return f"llm:{model}" if model else "llm"

    @property
    def recording(self) -> bool:
        """Whether this source records a cassette."""
        return self.config is not None and self.config.cassette is not None and self.config.cassette_mode == "record"

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_generator"] = None  # per-process; rebuilt by setup()
        return state

    # -- run lifecycle (parent) ---------------------------------------------------------------------------
    def _parts_dir(self) -> Path:
        cassette = Path(self.config.cassette)
        return cassette.with_name(cassette.name + _PARTS_SUFFIX)

    def start_run(self, run_dir: Path | None, *, resume: bool) -> None:
        self._run_token = f"{_dt.datetime.now().strftime('%Y%m%d%H%M%S')}-{os.getpid()}"
        if self.recording and not resume:
            shutil.rmtree(self._parts_dir(), ignore_errors=True)

    def for_worker(self, worker_index: int, run_dir: Path | None) -> LLMSource:
        copy_ = copy.copy(self)
        copy_._generator = None
        if run_dir is not None:
            copy_.artifacts_dir = Path(run_dir) / "llm-artifacts" / f"worker-{self._run_token}-{worker_index:04d}"
        if self.recording:
            part = self._parts_dir() / f"{self._run_token}-{worker_index:04d}.jsonl"
            copy_.config = dataclasses.replace(self.config, cassette=part, cassette_mode="record")
        return copy_

    def finish_run(self, run_dir: Path | None, *, resume: bool) -> None:
        """Concatenate the workers' recorded parts into the cassette (see the module docstring)."""
        if not self.recording:
            return
        cassette = Path(self.config.cassette)
        parts_dir = self._parts_dir()
        parts = sorted(parts_dir.glob("*.jsonl")) if parts_dir.is_dir() else []
        lines: list[str] = []
        if resume and cassette.exists():
            lines += [line for line in cassette.read_text(encoding="utf-8").splitlines() if line.strip()]
        for part in parts:
            lines += [line for line in part.read_text(encoding="utf-8").splitlines() if line.strip()]
        cassette.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(cassette, "".join(line + "\n" for line in lines))
        shutil.rmtree(parts_dir, ignore_errors=True)
        logger.info("cassette %s: %d recorded call(s) from %d worker(s)", cassette, len(lines), len(parts))

    # -- worker lifecycle ---------------------------------------------------------------------------------
    def setup(self, device: torch.device, kernel_utils: KernelUtils) -> None:
        if self._generator is not None:
            return
        if self.generator_factory is not None:
            self._generator = self.generator_factory()
            return
        generator_class = _import_generator_class()
        from agent.generator import GeneratorOptions

        fields: dict[str, Any] = {"use_cache": False}
        if self.artifacts_dir is not None:
            fields["artifacts_dir"] = self.artifacts_dir
        fields.update(self.generator_options)
        # The generator's collaborators are arguments of their own; the rest are `GeneratorOptions` fields.
        collaborators = {"kernel_utils": fields.pop("kernel_utils", kernel_utils)}
        for name in ("client", "judge_options"):
            if name in fields:
                collaborators[name] = fields.pop(name)
        for name in ("functions", "exclude", "languages"):
            if isinstance(fields.get(name), list):
                fields[name] = tuple(fields[name])
        self._generator = generator_class(self.config, GeneratorOptions(**fields), **collaborators)

    def close(self) -> None:
        generator, self._generator = self._generator, None
        closer = getattr(generator, "close", None)
        if callable(closer):
            try:
                closer()
            except Exception:  # noqa: BLE001 - best effort at shutdown
                logger.debug("closing the generator failed", exc_info=True)

    @property
    def generator(self) -> KernelGenerator:
        if self._generator is None:
            raise RuntimeError("LLMSource.setup(device, kernel_utils) must run before candidates are asked for")
        return self._generator

    # -- candidates ---------------------------------------------------------------------------------------
    def function_candidate(self, problem: FunctionProblem, samples: list[Sample], device: torch.device,
                           kernel_utils: KernelUtils) -> Candidate:
        self.setup(device, kernel_utils)
        generator = self.generator
        if not generator.prepare(problem.function, samples):
            return Candidate.failed(Failure.UNSUPPORTED, f"{generator.name} cannot write {problem.function} for "
                                    f"these calls on {device}")
        future = generator.submit(problem.function, samples)
        try:
            result = future.result(timeout=self.generation_timeout_s)
        except cf.TimeoutError:
            generator.cancel()
            return Candidate.failed(Failure.TIMEOUT, f"generation took more than {self.generation_timeout_s:g} s and "
                                    "was cancelled")
        usage = dict(result.usage or {})
        if result.error is not None or result.provider is None:
            return Candidate.failed(_failure(result), result.error or "no provider", usage)
        code = getattr(result.provider, "candidate_code", lambda: None)()
        return Candidate(name=result.provider.name, fn=result.provider, usage=usage, code=code)

    def module_candidate(self, problem: ModuleProblem, device: torch.device, kernel_utils: KernelUtils) -> Candidate:
        self.setup(device, kernel_utils)
        generator = self.generator
        generate = getattr(generator, "generate_module", None)
        if not callable(generate):
            return Candidate.failed(Failure.UNSUPPORTED, f"{generator.name} cannot write whole modules (no "
                                    "generate_module)")
        from agent.languages import get_language
        from agent.prompting import ModuleTask

        languages = [language.name for language in getattr(generator, "languages", ())]
        if languages and _MODULE_LANGUAGE not in languages:
            return Candidate.failed(Failure.UNSUPPORTED, f"KernelBench module problems are written in Triton; "
                                    f"--language {','.join(languages)} covers function problems only")
        task = ModuleTask.from_source(problem.source, name=problem.name or "Model", device=device,
                                      language=_MODULE_LANGUAGE)
        result = generate(task, ModuleTarget(problem.module_source, str(device)))
        usage = dict(getattr(result, "usage", None) or {})
        if getattr(result, "attempts", None) is not None:
            usage.setdefault("attempts", result.attempts)
        if result.error is not None or result.source is None:
            return Candidate.failed(_failure(result), result.error or "no ModelNew", usage)
        code = result.source
        return Candidate(name="ModelNew (LLM)", build=lambda seed: problem.instantiate_candidate(code, device, seed),
                         usage=usage, code=CandidateCode(code, get_language(_MODULE_LANGUAGE)))
