"""Contracts for kernel sources: `KernelProvider`, `KernelGenerator` and `KernelGenerationResult`.

A provider replaces exactly one `torch.nn.functional` function. Providers serialise to a dict carrying a stable
`type` name; `KernelProvider.from_dict` looks the type up in a registry filled by subclassing
(`class MyProvider(KernelProvider, type_name="my_provider")`). A second class under an existing type name is an
error; re-defining the same class (same module and qualified name, e.g. after `importlib.reload`) replaces it.

A generator produces providers asynchronously: `submit` returns a `Future[KernelGenerationResult]` at once.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, ClassVar

from forge.execution import Execution, TimingMode
from forge.judging.language import CandidateCode
from forge.outcome import Outcome
from forge.samples import Sample

__all__ = [
    "KernelGenerationResult",
    "KernelGenerator",
    "KernelProvider",
    "provider_type",
    "registered_provider_types",
]

logger = logging.getLogger(__name__)

_REGISTRY: dict[str, type[KernelProvider]] = {}


# Modules that define provider types, imported on demand when a plan names an unknown type, so a deploy-time
# `KernelOptimizationPlan.load` works without the caller importing them first: forge's own, and every module an
# installed distribution registers under the `kforge.providers` entry-point group (this project registers the LLM
# generator's `agent.provider` there: forge names no package above it).
_BUILTIN_PROVIDER_MODULES = ("forge.providers",)
PROVIDER_ENTRY_POINTS = "kforge.providers"


def _provider_modules() -> list[str]:
    from importlib.metadata import entry_points

    return [*_BUILTIN_PROVIDER_MODULES, *(ep.value for ep in entry_points(group=PROVIDER_ENTRY_POINTS))]


def _import_builtin_providers() -> None:
    import importlib

    for module in _provider_modules():
        try:
            importlib.import_module(module)
        except ImportError as exc:  # an optional part that is not installed
            logger.debug("cannot import provider module %s: %s", module, exc)


def registered_provider_types() -> dict[str, type[KernelProvider]]:
    """A copy of the provider registry: type name -> class."""
    return dict(_REGISTRY)


def provider_type(type_name: str) -> type[KernelProvider] | None:
    """The class registered under `type_name` (kernel-forge's own provider modules imported on demand), or None."""
    target = _REGISTRY.get(type_name)
    if target is None:
        _import_builtin_providers()
        target = _REGISTRY.get(type_name)
    return target


class KernelProvider(ABC):
    """A replacement for one `torch.nn.functional` function.

    Subclasses implement `supported_function`, `_prepare`, `_call`, `_to_dict` and `_from_dict`, and declare a
    stable `type_name` in the class statement. `prepare(samples)` must be called (and return True) before the
    provider is called or serialised; a provider restored with `from_dict` is ready at once.
    """

    type_name: ClassVar[str | None] = None
    # True for providers whose state holds code that is imported when loaded (generated kernels): plans and caches
    # holding one must be signed (`forge.signing`) and `kforge plan verify` runs them isolated first.
    carries_code: ClassVar[bool] = False

    def __init_subclass__(cls, type_name: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.type_name = type_name
        if type_name is None:
            return
        existing = _REGISTRY.get(type_name)
        if existing is not None and (existing.__module__, existing.__qualname__) != (cls.__module__, cls.__qualname__):
            raise ValueError(
                f"kernel provider type name {type_name!r} is already registered by "
                f"{existing.__module__}.{existing.__qualname__}; choose another type_name for "
                f"{cls.__module__}.{cls.__qualname__}"
            )
        _REGISTRY[type_name] = cls

    def __init__(self) -> None:
        self._ready = False

    # -- identity -----------------------------------------------------------------------------------------
    @property
    @abstractmethod
    def supported_function(self) -> str:
        """Name of the `torch.nn.functional` attribute this provider replaces (e.g. `"layer_norm"`)."""

    @property
    def name(self) -> str:
        """Human-readable name used in logs and reports."""
        return type(self).__name__

    def __repr__(self) -> str:
        return self.name

    @property
    def is_ready(self) -> bool:
        return self._ready

    # -- lifecycle ----------------------------------------------------------------------------------------
    def prepare(self, samples: Sequence[Sample]) -> bool:
        """Check that this provider can serve every sample (compile, warm up...). True = ready.

        Always re-checks against the given samples, so a provider reused for another model is not stale.
        """
        self._ready = bool(self._prepare(list(samples)))
        return self._ready

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not self._ready:
            raise RuntimeError(f"kernel provider {self.name} must be prepared (prepare(samples) -> True) before use")
        return self._call(*args, **kwargs)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe state; `KernelProvider.from_dict(provider.to_dict())` restores an equivalent provider."""
        if self.type_name is None:
            raise TypeError(f"{type(self).__qualname__} has no type_name and cannot be serialised")
        if not self._ready:
            raise RuntimeError(f"kernel provider {self.name} must be prepared before serialisation")
        state = dict(self._to_dict())
        if "type" in state:
            raise ValueError(f"{type(self).__qualname__}._to_dict() must not set the reserved key 'type'")
        return {"type": self.type_name, **state}

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> KernelProvider:
        """Restore a provider from `to_dict()` output, dispatching on its `type` through the registry."""
        if not isinstance(state, dict) or not isinstance(state.get("type"), str):
            raise ValueError(f"invalid kernel provider state (expected a dict with a string 'type'): {state!r}")
        type_name = state["type"]
        target = provider_type(type_name)
        if target is None:
            known = ", ".join(sorted(_REGISTRY)) or "none"
            raise ValueError(
                f"unknown kernel provider type {type_name!r} (registered: {known}); import the module that defines "
                "it before loading"
            )
        if cls is not KernelProvider and not issubclass(target, cls):
            raise ValueError(f"provider type {type_name!r} is a {target.__qualname__}, not a {cls.__qualname__}")
        payload = {k: v for k, v in state.items() if k != "type"}
        provider = target._from_dict(payload)
        provider._ready = True
        return provider

    def load_runtime_dependencies(self) -> None:  # noqa: B027 - optional hook
        """Import or build whatever the provider needs at run time (called when a plan is applied)."""

    def candidate_code(self) -> CandidateCode | None:
        """The source this provider carries and its language, for the judge to run in its sandbox before the
        provider runs anywhere else (`kforge plan verify`, `make_plan`). None: the provider's code is installed, not
        carried (static providers). A provider that `carries_code` must return it."""
        return None

    # -- hooks for subclasses -----------------------------------------------------------------------------
    @abstractmethod
    def _prepare(self, samples: list[Sample]) -> bool: ...

    @abstractmethod
    def _call(self, *args: Any, **kwargs: Any) -> Any: ...

    @abstractmethod
    def _to_dict(self) -> dict[str, Any]: ...

    @classmethod
    @abstractmethod
    def _from_dict(cls, state: dict[str, Any]) -> KernelProvider: ...


@dataclass(frozen=True)
class KernelGenerationResult:
    """Outcome of one generator task: exactly one of `provider` (ready) or `error`.

    `usage` holds metadata such as `{"prompt_tokens": ..., "completion_tokens": ..., "cost_usd": ..., "attempts": ...}`.
    `outcome` (a `forge.outcome.Outcome`, optional) types a failure when the generator knows it, e.g. `harness_error`
    when the harness, not the generated code, stopped it.
    """

    function: str
    provider: KernelProvider | None = None
    error: str | None = None
    description: str = ""
    usage: dict[str, Any] = field(default_factory=dict)
    outcome: Outcome | None = None

    def __post_init__(self) -> None:
        if (self.provider is None) == (self.error is None):
            raise ValueError("a kernel generation result must hold exactly one of a provider or an error")
        if self.provider is not None and not isinstance(self.provider, KernelProvider):
            raise TypeError(
                f"a kernel generation result's provider must be a KernelProvider, got {type(self.provider).__name__}"
            )

    @property
    def succeeded(self) -> bool:
        return self.provider is not None


class KernelGenerator(ABC):
    """A source of providers that are produced on demand (for example by an LLM agent)."""

    @property
    def name(self) -> str:
        return type(self).__name__

    def __repr__(self) -> str:
        return self.name

    @abstractmethod
    def supports_functions(self) -> list[str]:
        """Names of the `torch.nn.functional` functions this generator can attempt."""

    @abstractmethod
    def prepare(self, function: str, samples: Sequence[Sample]) -> bool:
        """Whether every sample can be handled (log the reason when not)."""

    @abstractmethod
    def submit(self, function: str, samples: Sequence[Sample]) -> Future[KernelGenerationResult]:
        """Start generating a provider for `function` specialised to `samples`; must not block."""

    def cancel(self) -> None:  # noqa: B027 - optional hook
        """Abandon all in-flight work (called by the optimizer when the generation timeout passes)."""

    def use_execution(self, execution: Execution) -> None:  # noqa: B027 - optional hook
        """How the model will run (`forge.execution.Execution`), told once per `make_plan` before `prepare`/`submit`
        and before module generation."""

    def use_clock(self, timing: TimingMode) -> None:  # noqa: B027 - optional hook
        """The clock the optimizer selects on for this model (`forge.execution.ClockChoice.timing`: device time under
        CUDA graphs and compile, and in eager when the model is device-bound or its blocks are replayed from CUDA
        graphs), told after `use_execution`: a generator that times its candidates should time on it, so that the
        kernel it keeps and the feedback it gives match the optimizer's selection."""
