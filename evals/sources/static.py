"""Static kernel sources: `torch.compile` (`CompileSource`), pinned PyTorch SDPA backends (`SDPASource`) and eager
PyTorch itself (`EagerSource`).

They need no LLM and cost nothing, so they set the bar the generated kernels are compared against in one table.
`EagerSource` submits the reference as the candidate: it needs no compile, so its `harness_s` is what the harness
itself costs on a problem (validation at the shipped size plus the timing of candidate and baselines), and its
speedup vs eager is the timer's noise floor (1.00x expected).
"""

from __future__ import annotations

from typing import Any

import torch

from evals.failures import Failure
from evals.problems import FunctionProblem, ModuleProblem
from evals.sources.base import Candidate, EvalSource
from evals.sources.evaluation import compile_baseline
from forge.checking import KernelUtils
from forge.providers.torch_sdpa import sdpa_backend_names
from forge.samples import Sample

__all__ = ["SDPA_BACKENDS", "CompileSource", "EagerSource", "SDPASource"]

# Backends tried in this order by `SDPASource()` (no backend given); the first that accepts every call wins. The
# names and their order are forge's table (`forge.providers.torch_sdpa.SDPA_BACKENDS`).
SDPA_BACKENDS: tuple[str, ...] = sdpa_backend_names()


class CompileSource(EvalSource):
    """`torch.compile` as a kernel source: `CompiledFunctionProvider` for function problems (one compiled callable
    per call signature, as `make_plan` uses it), `torch.compile(Model(...))` for module problems."""

    @property
    def name(self) -> str:
        return "compile"

    def function_candidate(self, problem: FunctionProblem, samples: list[Sample], device: torch.device,
                           kernel_utils: KernelUtils) -> Candidate:
        provider = compile_baseline(problem.function)
        if not provider.prepare(samples):
            return Candidate.failed(Failure.COMPILE_ERROR, f"torch.compile({problem.function}) failed on these calls "
                                    "(see the INFO log)", name=provider.name)
        return Candidate(name=provider.name, fn=provider, trusted=True)

    def module_candidate(self, problem: ModuleProblem, device: torch.device, kernel_utils: KernelUtils) -> Candidate:
        def build(seed: int) -> Any:
            model, _ = problem.instantiate(device, seed)
            return torch.compile(model)

        return Candidate(name="torch.compile(Model)", build=build, trusted=True)


class EagerSource(EvalSource):
    """Eager PyTorch as its own candidate: `F.<function>` for function problems, a fresh `Model` for module problems.
    Not trusted, so the oracle runs every check on it, as on a generated kernel."""

    @property
    def name(self) -> str:
        return "eager"

    def function_candidate(self, problem: FunctionProblem, samples: list[Sample], device: torch.device,
                           kernel_utils: KernelUtils) -> Candidate:
        return Candidate(name=f"F.{problem.function} (eager)", fn=problem.reference)

    def module_candidate(self, problem: ModuleProblem, device: torch.device, kernel_utils: KernelUtils) -> Candidate:
        return Candidate(name="Model (eager)", build=lambda seed: problem.instantiate(device, seed)[0])


class SDPASource(EvalSource):
    """`scaled_dot_product_attention` pinned to one PyTorch backend (a name of `SDPA_BACKENDS`: `"cudnn"`,
    `"flash"`, `"efficient"`, `"math"`), or with `backend=None` the first of them that accepts every call of the
    problem.

    Problems of any other function, and module problems, are recorded as `unsupported` failures.
    """

    def __init__(self, backend: str | None = None) -> None:
        from forge.providers import TorchSDPAProvider

        if backend is not None:
            TorchSDPAProvider(backend)  # a clear error for an unknown backend name, raised in the parent
        self.backend = backend

    @property
    def name(self) -> str:
        return "sdpa" if self.backend is None else f"sdpa-{self.backend}"

    def function_candidate(self, problem: FunctionProblem, samples: list[Sample], device: torch.device,
                           kernel_utils: KernelUtils) -> Candidate:
        from forge.providers import TorchSDPAProvider

        if problem.function != "scaled_dot_product_attention":
            return Candidate.failed(Failure.UNSUPPORTED, f"{self.name} only provides scaled_dot_product_attention, "
                                    f"not {problem.function}")
        tried = []
        for backend in (self.backend,) if self.backend is not None else SDPA_BACKENDS:
            provider = TorchSDPAProvider(backend)
            if provider.prepare(samples):
                return Candidate(name=provider.name, fn=provider)
            tried.append(provider.name)
        return Candidate.failed(Failure.UNSUPPORTED, f"{' / '.join(tried)} rejected these calls (shape, dtype, mask "
                                f"or device) on {device}")

    def module_candidate(self, problem: ModuleProblem, device: torch.device, kernel_utils: KernelUtils) -> Candidate:
        return Candidate.failed(Failure.UNSUPPORTED, f"{self.name} does not rewrite whole modules")
