"""`ProviderSource`: any `forge.KernelProvider` as an eval source, so a kernel library or a provider of your own needs
no eval code of its own.

    kforge eval builtin --source provider:flaggems                       # a registered kernel library
    kforge eval builtin --source provider:forge.providers:CompiledFunctionProvider
    ProviderSource([MyLayerNorm(), MySoftmax()]).evaluate(problem, 0, "cuda")   # instances, from Python

A spec string is `provider:<library>` (a name in `forge.providers.libraries`' registry: one `LibraryKernelProvider`
per problem function the library serves) or `provider:<module>:<attribute>`, a factory called with
`function_name=<the problem's function>` when it takes a `function_name` (or `function`) parameter and with no
argument otherwise; it returns a `KernelProvider` or a list of them. For each function problem the providers of
that function are prepared on the problem's calls in order, and the first that accepts them is the candidate; the
candidate then goes through the same oracle and timing as every other source (`evals.sources.evaluation`).

Spec strings are resolved in the parent (an unknown library, a library that is not installed or a factory that
cannot be imported is a one-line ValueError before any worker starts) and providers are built in each worker, so
nothing unpicklable crosses processes.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from evals.failures import Failure
from evals.problems import FunctionProblem, ModuleProblem
from evals.sources.base import Candidate, EvalSource
from forge.checking import KernelUtils
from forge.provider import KernelProvider
from forge.samples import Sample

__all__ = ["PROVIDER_PREFIX", "ProviderSource", "parse_provider_spec"]

logger = logging.getLogger(__name__)

PROVIDER_PREFIX = "provider:"

ProviderSpec = str | KernelProvider | Sequence[KernelProvider]


def parse_provider_spec(spec: str) -> tuple[str, str | None]:
    """`"provider:flaggems"` -> `("flaggems", None)`; `"provider:pkg.mod:Factory"` -> `("pkg.mod", "Factory")`
    (the `provider:` prefix is optional). A ValueError for an empty or malformed spec."""
    body = spec.strip()
    if body.lower().startswith(PROVIDER_PREFIX):
        body = body[len(PROVIDER_PREFIX):]
    head, separator, attribute = body.partition(":")
    if not head or (separator and not attribute) or ":" in attribute:
        raise ValueError(f"bad provider spec {spec!r}: use provider:<library> (e.g. provider:flaggems) or "
                         "provider:<module>:<factory> (e.g. provider:forge.providers:CompiledFunctionProvider)")
    return (head.lower(), None) if not attribute else (head, attribute)


def _load_factory(module: str, attribute: str) -> Callable[..., Any]:
    try:
        target = getattr(importlib.import_module(module), attribute)
    except ImportError as exc:
        raise ValueError(f"provider spec {module}:{attribute}: cannot import {module} ({exc})") from None
    except AttributeError:
        raise ValueError(f"provider spec {module}:{attribute}: {module} has no attribute {attribute!r}") from None
    if not callable(target):
        raise ValueError(f"provider spec {module}:{attribute} is not callable")
    return target


def _function_keyword(factory: Callable[..., Any]) -> str | None:
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return None
    return next((name for name in ("function_name", "function") if name in parameters), None)


def _as_providers(made: Any, origin: str) -> list[KernelProvider]:
    items = [made] if isinstance(made, KernelProvider) else list(made) if isinstance(made, Iterable) else [made]
    bad = [type(item).__name__ for item in items if not isinstance(item, KernelProvider)]
    if bad:
        raise TypeError(f"{origin} must give KernelProvider instances, got {', '.join(bad)}")
    return items


class ProviderSource(EvalSource):
    """Kernel providers as an eval source (see the module docstring).

    `spec`: a spec string, a `KernelProvider`, or a list of them. Function problems only; module problems and
    functions no provider serves are recorded as `unsupported`.
    """

    def __init__(self, spec: ProviderSpec) -> None:
        self.spec_text: str | None = None
        self._instances: list[KernelProvider] = []
        self._library: str | None = None
        self._factory: tuple[str, str] | None = None
        if isinstance(spec, str):
            self.spec_text = spec.strip()
            head, attribute = parse_provider_spec(spec)
            if attribute is None:
                self._library = self._check_library(head)
            else:
                _load_factory(head, attribute)  # a clear error now, in the parent
                self._factory = (head, attribute)
        else:
            self._instances = _as_providers(spec, "ProviderSource(spec)")
            if not self._instances:
                raise ValueError("ProviderSource needs at least one provider")

    @staticmethod
    def _check_library(name: str) -> str:
        from forge.providers.libraries import LibraryUnavailable, get_library

        library = get_library(name)
        if not library.is_installed():
            raise LibraryUnavailable(f"{library.title} is not installed; install it with {library.install_hint}")
        return library.name

    @property
    def name(self) -> str:
        if self._library is not None:
            return f"{PROVIDER_PREFIX}{self._library}"
        if self._factory is not None:
            return f"{PROVIDER_PREFIX}{self._factory[0]}:{self._factory[1]}"
        return PROVIDER_PREFIX + "+".join(sorted({p.name for p in self._instances}))

    # -- providers per problem ----------------------------------------------------------------------------------
    def providers_for(self, function: str) -> list[KernelProvider]:
        """The providers of `function` this source offers, in the order they are tried."""
        if self._library is not None:
            from forge.providers.libraries import LibraryKernelProvider, get_library

            library = get_library(self._library)
            return [LibraryKernelProvider(library.name, function)] if function in library.function_names else []
        if self._factory is not None:
            factory = _load_factory(*self._factory)
            keyword = _function_keyword(factory)
            made = factory(**{keyword: function}) if keyword else factory()
            providers = _as_providers(made, f"{self._factory[0]}:{self._factory[1]}")
        else:
            providers = self._instances
        return [p for p in providers if p.supported_function == function]

    def function_candidate(self, problem: FunctionProblem, samples: list[Sample], device: torch.device,
                           kernel_utils: KernelUtils) -> Candidate:
        try:
            providers = self.providers_for(problem.function)
        except Exception as exc:  # noqa: BLE001 - a factory that fails is a compile error of the source
            return Candidate.failed(Failure.COMPILE_ERROR, f"{type(exc).__name__}: {exc}")
        if not providers:
            return Candidate.failed(Failure.UNSUPPORTED, f"{self.name} has no provider for F.{problem.function}")
        reasons = []
        for provider in providers:
            if provider.prepare(samples):
                trusted = not getattr(provider, "allows_dispatch_poisoning", True)
                return Candidate(name=provider.name, fn=provider, trusted=trusted)
            reasons.append(f"{provider.name}: {self._refusal(provider, samples)}")
        return Candidate.failed(Failure.UNSUPPORTED, "; ".join(reasons))

    @staticmethod
    def _refusal(provider: KernelProvider, samples: list[Sample]) -> str:
        """Why `provider` refused, when it can say (library providers can), else a pointer to the log."""
        explain = getattr(provider, "refusal", None)
        if callable(explain):
            try:
                reasons = [r for r in (explain(s) for s in samples) if r]
            except Exception as exc:  # noqa: BLE001 - e.g. the library cannot be imported here
                return str(exc)
            if reasons:
                return reasons[0]
        return "refused these calls (see the INFO log)"

    def module_candidate(self, problem: ModuleProblem, device: torch.device, kernel_utils: KernelUtils) -> Candidate:
        return Candidate.failed(Failure.UNSUPPORTED, f"{self.name} provides F functions, not whole modules")
