"""kernel-forge: replace a PyTorch model's `torch.nn.functional` calls with faster kernels, each proved correct
and faster before it is used.

    from forge import KernelOptimizer
    plan = KernelOptimizer(kernel_providers=...).make_plan(model, samples)
    plan.save("plan.json")
    with KernelOptimizationPlan.load("plan.json").apply(model):
        model(*inputs)
"""

from forge.checking import KernelUtils, benchmark, validate
from forge.optimizer import KernelOptimizer
from forge.plan import KernelOptimizationPlan, PlanEntry, PlanLoadError
from forge.provider import KernelGenerationResult, KernelGenerator, KernelProvider
from forge.runtime import KernelProviderRuntime
from forge.samples import Sample, TensorSpec

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
