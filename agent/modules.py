"""Module kernels written by the agent: a `ModelNew(original)` for a hot module class of a user's model.

Why: on real models much of the kernel time is in module forwards that are not one `torch.nn.functional` call
(`LlamaRMSNorm`: pow, mean, rsqrt, a multiply and casts, one kernel each; `forge.profiler.modules`). The optimizer
asks a module source (`forge.optimizer.KernelOptimizer(module_sources=...)`) for a provider per hot class;
`LLMModuleSource` is the agent's: for each behaviour group of instances (`forge.modules.instance_key`) it runs one
conversation of `LLMKernelGenerator.generate_instance`, whose prompt shows the class's forward and helpers, the
instance's attributes and parameters and every call the model made, and whose candidates the judge runs in the
sandbox against the instance (`forge.judging.InstanceTarget`). The same conversation loop and the same `ModelNew`
file format serve KernelBench module problems.

`GeneratedModuleProvider` is the plan entry's provider: the file's source (signed with the plan, screened again
before it is imported), its language and the instance keys it was judged on. `bind(instance)` builds
`ModelNew(instance)`, which must keep the instance's parameters by reference: a parameter of `ModelNew` that is not
one of the instance's tensors is refused (a copy would double the weights' memory and miss later weight updates).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from agent.languages import get_language
from agent.provider import cached_source_file
from agent.screening import format_violations
from forge.errors import CandidateError
from forge.judging.language import CandidateCode
from forge.modules import ModuleKernelProvider, _key_from_repr, attribute_names
from forge.samples import Sample

if TYPE_CHECKING:
    from agent.generator import LLMKernelGenerator
    from forge.execution import Execution, TimingMode

__all__ = ["GeneratedModuleProvider", "LLMModuleSource", "ParameterCopyError", "check_shares_parameters",
           "instance_task"]

logger = logging.getLogger(__name__)


class ParameterCopyError(CandidateError, ValueError):
    """A `ModelNew` holds a parameter that is not one of the original instance's tensors (a copy): `forbidden`."""

    outcome = "forbidden"


def _storages(module: nn.Module) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in [*module.parameters(), *module.buffers()] if t.numel()}


def check_shares_parameters(new: nn.Module, original: nn.Module) -> None:
    """`ParameterCopyError` naming the first parameter of `new` that does not share storage with a parameter or
    buffer of `original`."""
    own = _storages(original)
    for name, parameter in new.named_parameters():
        if parameter.numel() and parameter.untyped_storage().data_ptr() not in own:
            raise ParameterCopyError(
                f"ModelNew's parameter {name!r} {tuple(parameter.shape)} is not one of the original's tensors (a "
                f"copy): keep it by reference, e.g. `self.{name.split('.')[-1]} = original.{name.split('.')[-1]}`")


class GeneratedModuleProvider(ModuleKernelProvider, type_name="generated_module"):
    """A generated `ModelNew(original)` for instances of one module class (see the module docstring). Built
    with a `source`, or with a `generator` that writes it in `prepare_instances`."""

    carries_code = True

    def __init__(self, target_class: str, source: str | None = None, *, language: str,
                 generator: LLMKernelGenerator | None = None, metadata: dict[str, Any] | None = None,
                 cache_dir: str | os.PathLike | None = None) -> None:
        super().__init__(target_class)
        if source is None and generator is None:
            raise ValueError("GeneratedModuleProvider needs a source or a generator that writes one")
        self.source = source
        self.language = get_language(language).name
        self.generator = generator
        self.metadata = dict(metadata or {})
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.error: str | None = None
        # The names the file may read on the instance (`forge.modules.attribute_names`), screened with it.
        self.attributes: frozenset[str] = frozenset()
        self._class: type | None = None
        self._load_lock = threading.Lock()
        self._cancelled = threading.Event()

    @property
    def source_hash(self) -> str:
        return hashlib.sha256((self.source or "").encode()).hexdigest()

    @property
    def name(self) -> str:
        short = self.target_class.rsplit(".", 1)[-1]
        model = self.metadata.get("model")
        tag = self.source_hash[:8] if self.source is not None else "not written"
        return f"generated {self.language} {short} [{tag}{', ' + model if model else ''}]"

    @property
    def rewrites(self) -> bool:
        return self.generator is not None

    @property
    def writes_on_prepare(self) -> bool:
        return self.generator is not None and self.source is None

    def cancel(self) -> None:
        """Stop the conversation writing this file (its LLM call and sandbox children): `generation_timeout`."""
        self._cancelled.set()
        if self.generator is not None:
            self.generator.cancel()

    def sibling(self) -> GeneratedModuleProvider | None:
        """The same file, for another behaviour group of the class (judged there on its own)."""
        if self.source is None:
            return None
        sibling = GeneratedModuleProvider(self.target_class, self.source, language=self.language,
                                          generator=self.generator, metadata=self.metadata, cache_dir=self.cache_dir)
        sibling.attributes = self.attributes
        return sibling

    # -- writing and loading ---------------------------------------------------------------------------
    def _prepare_instances(self, instances: list[nn.Module], samples: list[Sample],
                           counts: list[int] | None = None) -> bool:
        self.attributes = self.attributes.union(*(attribute_names(m) for m in instances))
        if self.source is None:
            self.source = self._write(instances[0], samples, counts)
            if self.source is None:
                return False
        try:
            self._load()
        except Exception as exc:  # noqa: BLE001 - reported as not ready
            self.error = f"the ModelNew file cannot be loaded: {type(exc).__name__}: {exc}"
            logger.warning("%s: %s", self.target_class, self.error)
            return False
        return True

    def _write(self, instance: nn.Module, samples: list[Sample], counts: list[int] | None) -> str | None:
        from forge.judging import InstanceTarget

        assert self.generator is not None
        task = instance_task(instance, samples, counts, self.language)
        target = InstanceTarget.of(instance, samples, counts)
        if self._cancelled.is_set():
            self.error = "cancelled before the conversation began"
            return None
        result = self.generator.generate_instance(task, target)
        if self._cancelled.is_set():
            self.error = "cancelled: the generation time is up"
            return None
        self.metadata.update(model=self.generator.config.model, attempts=result.attempts,
                             usage={k: v for k, v in result.usage.items() if isinstance(v, (int, float, str))})
        if result.source is None:
            self.error = result.error
            logger.info("%s: no correct ModelNew: %s", self.target_class, result.error)
        return result.source

    def _load(self) -> type:
        with self._load_lock:
            if self._class is not None:
                return self._class
            if self.source is None:
                raise RuntimeError(f"no ModelNew was written for {self.target_class}")
            language = get_language(self.language)
            violations = language.screen_module(self.source, self.attributes)
            if violations:
                raise ValueError(f"the generated ModelNew for {self.target_class} fails screening and will not be "
                                 "imported:\n" + format_violations(violations))
            short = self.target_class.rsplit(".", 1)[-1]
            path = cached_source_file(self.source, language, self.cache_dir, "modules",
                                      f"{short}_{self.source_hash[:16]}")
            self._class = language.load(path, f"kforge_module_{short}_{self.source_hash[:16]}", "ModelNew")
            return self._class

    def load_runtime_dependencies(self) -> None:
        self._load()

    def _bind(self, module: nn.Module) -> Callable[..., Any]:
        with torch.no_grad():
            new = self._load()(module)
        check_shares_parameters(new, module)
        return new

    def candidate_code(self) -> CandidateCode | None:
        """The file and its language, for the judge's sandbox (`Judge.judge_code`, `kforge plan verify`)."""
        return CandidateCode(self.source, get_language(self.language)) if self.source is not None else None

    # -- serialisation ---------------------------------------------------------------------------------
    def _to_dict(self) -> dict[str, Any]:
        if self.source is None:
            raise ValueError(f"no ModelNew was written for {self.target_class}: nothing to save")
        return {"target_class": self.target_class, "language": self.language, "source": self.source,
                "source_sha256": self.source_hash, "metadata": self.metadata,
                "instance_attributes": sorted(self.attributes),
                "instance_keys": [repr(k) for k in sorted(self.instance_keys, key=repr)]}

    @classmethod
    def _from_dict(cls, state: dict[str, Any]) -> GeneratedModuleProvider:
        source = state["source"]
        if hashlib.sha256(source.encode()).hexdigest() != state.get("source_sha256", ""):
            raise ValueError("generated ModelNew source does not match its recorded sha256 (the file was edited)")
        attributes = frozenset(state.get("instance_attributes", []))
        violations = get_language(state["language"]).screen_module(source, attributes)
        if violations:  # refused at load (PlanLoadError), not later at apply
            raise ValueError("generated ModelNew fails screening: " + format_violations(violations))
        provider = cls(state["target_class"], source, language=state["language"], metadata=state.get("metadata"))
        provider.attributes = attributes
        provider.instance_keys = frozenset(_key_from_repr(k) for k in state.get("instance_keys", []))
        provider._ready = True
        return provider


def instance_task(instance: nn.Module, samples: Sequence[Sample], counts: Sequence[int] | None,
                  language: str) -> Any:
    """The `InstanceTask` (what the prompt shows) for one behaviour group's first instance and its calls: the one
    place it is built, so a rendered demo request and the run's own first request are the same."""
    from agent.prompting import InstanceTask

    entries = list(zip(counts, samples, strict=True)) if counts else list(samples)
    return InstanceTask.from_instance(instance, entries, language=language)


class LLMModuleSource:
    """The agent as a module source for `KernelOptimizer(module_sources=[...])`: called with a qualified class
    name, returns a `GeneratedModuleProvider` that writes its `ModelNew` with `generator` when prepared."""

    def __init__(self, generator: LLMKernelGenerator, language: str | None = None) -> None:
        self.generator = generator
        self.language = language or generator.language.name

    def __call__(self, target_class: str) -> GeneratedModuleProvider:
        return GeneratedModuleProvider(target_class, language=self.language, generator=self.generator)

    def use_execution(self, execution: Execution) -> None:
        """The optimizer's hook (as `KernelGenerator.use_execution`), passed to the generator that writes the files."""
        self.generator.use_execution(execution)

    def use_clock(self, timing: TimingMode) -> None:
        """The optimizer's hook (as `KernelGenerator.use_clock`), passed to the generator that writes the files."""
        self.generator.use_clock(timing)

    def __repr__(self) -> str:
        return f"LLMModuleSource({self.generator.name}, {self.language})"
