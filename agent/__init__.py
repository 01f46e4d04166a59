"""LLM kernel generator: writes Triton kernels for one `torch.nn.functional` function, screens them, checks them in a
sandbox against the harness oracle, feeds failures back, and returns the fastest correct one as a provider.

    from agent import LLMKernelGenerator, LLMConfig
    generator = LLMKernelGenerator()            # configured from KFORGE_LLM_* / OPENAI_* / KFORGE_CASSETTE
    KernelOptimizer(kernel_generators=generator).make_plan(model, samples)
"""

from agent.generator import RANDOM_FUNCTIONS, LLMKernelGenerator, ModuleGenerationResult
from agent.llm import LLMClient, LLMConfig, LLMError
from agent.provider import GeneratedKernelProvider

__all__ = [
    "RANDOM_FUNCTIONS",
    "GeneratedKernelProvider",
    "LLMClient",
    "LLMConfig",
    "LLMError",
    "LLMKernelGenerator",
    "ModuleGenerationResult",
]
