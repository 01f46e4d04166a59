"""LLM kernel generator: writes Triton kernels for one `torch.nn.functional` function, screens them, checks them in a
sandbox against the harness oracle, feeds failures back, and returns the fastest correct one as a provider.

    from agent import LLMKernelGenerator, LLMConfig
    generator = LLMKernelGenerator()            # configured from KFORGE_LLM_* / OPENAI_* / KFORGE_CASSETTE
    KernelOptimizer(kernel_generators=generator).make_plan(model, samples)

Names are imported lazily, so `forge.sandbox` (the sandbox child) starts without the LLM client stack.
"""

from __future__ import annotations

from forge.lazy import lazy_exports

_EXPORTS = {
    "RANDOM_FUNCTIONS": "agent.generator",
    "LLMKernelGenerator": "agent.generator",
    "GeneratorOptions": "agent.generator",
    "ModuleGenerationResult": "agent.generator",
    "LLMClient": "agent.llm",
    "LLMConfig": "agent.llm",
    "LLMError": "agent.llm",
    "GeneratedKernelProvider": "agent.provider",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
