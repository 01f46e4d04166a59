"""CUDA C++ as a kernel language: `CudaLanguage` (registered as "cuda" in `agent.languages`).

Modules: `source` (the file format, read statically), `screening` (what a candidate may contain), `toolchain`
(compilers found, fingerprint), `build` (cubin builds, cache, thread pool), `diagnostics` (compiler output -> file,
line, message), `runtime` (`load_cuda`, launches), `language` (the seam), `prompts/` + `cuda_example.py` (prompts).
Importing this package does not import torch's CUDA or any compiler.
"""

from agent.languages.cuda.language import CudaLanguage, PromptFragments

__all__ = ["CudaLanguage", "PromptFragments"]
