"""kernel-forge: replace a PyTorch model's `torch.nn.functional` calls with faster kernels, each proved correct
and faster before it is used.

    from forge import KernelOptimizer
    plan = KernelOptimizer(kernel_providers=...).make_plan(model, samples)
    plan.save("plan.json")
    with KernelOptimizationPlan.load("plan.json").apply(model):
        model(*inputs)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from forge.lazy import lazy_exports

if TYPE_CHECKING:
    from forge.checking import KernelUtils, benchmark, validate
    from forge.optimizer import KernelOptimizer
    from forge.plan import KernelOptimizationPlan, PlanEntry, PlanLoadError
    from forge.provider import KernelGenerationResult, KernelGenerator, KernelProvider
    from forge.runtime import KernelProviderRuntime
    from forge.samples import Sample, TensorSpec

# Imported on first use (`forge.lazy`): every sandbox child imports this package on its way to `forge.sandbox.child`.
__getattr__, __dir__ = lazy_exports(__name__, {
    "KernelUtils": "forge.checking", "benchmark": "forge.checking", "validate": "forge.checking",
    "KernelOptimizer": "forge.optimizer",
    "KernelOptimizationPlan": "forge.plan", "PlanEntry": "forge.plan", "PlanLoadError": "forge.plan",
    "KernelGenerationResult": "forge.provider", "KernelGenerator": "forge.provider", "KernelProvider": "forge.provider",
    "KernelProviderRuntime": "forge.runtime",
    "Sample": "forge.samples", "TensorSpec": "forge.samples",
})

__all__ = [
    "KernelGenerationResult",
    "KernelGenerator",
    "KernelOptimizationPlan",
    "KernelOptimizer",
    "KernelProvider",
    "KernelProviderRuntime",
    "KernelUtils",
    "PlanEntry",
    "PlanLoadError",
    "Sample",
    "TensorSpec",
    "benchmark",
    "validate",
]

__version__ = "0.1.0"
