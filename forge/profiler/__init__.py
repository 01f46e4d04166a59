"""Profiling of the `torch.nn.functional` calls a model makes: counts, cloned input samples and time per function.

Public API: `ModuleFunctionKernelProfiler`, its `ProfileResult` of `FunctionProfile`s, and `SUMMARY_COLUMNS`.
"""

from forge.profiler.attribution import LABEL_PREFIX, MODULE_LABEL, OVERHEAD_LABEL, function_label
from forge.profiler.module_profiler import ModuleFunctionKernelProfiler, normalize_data, prime_cuda_profiler
from forge.profiler.result import SUMMARY_COLUMNS, FunctionProfile, ProfileResult

__all__ = [
    "LABEL_PREFIX",
    "MODULE_LABEL",
    "OVERHEAD_LABEL",
    "SUMMARY_COLUMNS",
    "FunctionProfile",
    "ModuleFunctionKernelProfiler",
    "ProfileResult",
    "function_label",
    "normalize_data",
    "prime_cuda_profiler",
]
