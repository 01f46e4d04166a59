"""LLM kernel generator: writes Triton kernels for one `torch.nn.functional` function, screens them, checks them in a
sandbox against the harness oracle, feeds failures back, and returns the fastest correct one as a provider.

    from agent import LLMKernelGenerator, LLMConfig
    generator = LLMKernelGenerator()            # configured from KFORGE_LLM_* / OPENAI_* / KFORGE_CASSETTE
    KernelOptimizer(kernel_generators=generator).make_plan(model, samples)

Names are imported lazily, so `forge.sandbox` (the sandbox child) starts without the LLM client stack.
"""

from __future__ import annotations

import importlib
from typing import Any

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


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'agent' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
