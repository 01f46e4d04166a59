"""Triton as a kernel language: `TritonLanguage` (registered as "triton" in `agent.languages`), laid out like
`agent.languages.cuda`.

Modules: `language` (the seam: file format, screening rules, prompts, launch monitor), `hooks` (the launch-counting
and interpreter hooks the judging processes install), `launch` (cached launchers for generated kernels).
"""

from agent.languages.triton.language import (
    TritonLanguage,
    module_function_internals,
    module_host_attributes,
    triton_function_internals,
    triton_language_constant,
)

__all__ = ["TritonLanguage", "module_function_internals", "module_host_attributes", "triton_function_internals",
           "triton_language_constant"]
