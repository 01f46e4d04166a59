"""Kernel sources for evals behind one interface (`EvalSource`): `torch.compile`, pinned SDPA backends, any
`KernelProvider` (`provider:<library>` or `provider:<module>:<factory>`) and the LLM kernel generator, all judged
by the same oracle and timed against the same baselines (`evaluation`).

    from evals.sources import source_from_name
    record = source_from_name("compile").evaluate(problem, 0, "cpu")
"""

from __future__ import annotations

from typing import Any

from evals.failures import Failure, failure_text
from evals.sources.base import USAGE_KEYS, Candidate, EvalSource
from evals.sources.evaluation import CUDA_ERROR_MARKERS, evaluate_problem, fail, failure_record, is_cuda_error
from evals.sources.llm import LLMSource
from evals.sources.provider import PROVIDER_PREFIX, ProviderSource
from evals.sources.static import SDPA_BACKENDS, CompileSource, EagerSource, SDPASource

__all__ = [
    "CUDA_ERROR_MARKERS",
    "SDPA_BACKENDS",
    "SOURCE_NAMES",
    "USAGE_KEYS",
    "Candidate",
    "CompileSource",
    "EagerSource",
    "EvalSource",
    "Failure",
    "LLMSource",
    "PROVIDER_PREFIX",
    "ProviderSource",
    "SDPASource",
    "evaluate_problem",
    "fail",
    "failure_record",
    "failure_text",
    "is_cuda_error",
    "source_from_name",
]

SOURCE_NAMES: tuple[str, ...] = ("llm", "compile", "eager", "sdpa",
                                 *(f"sdpa-{b}" for b in ("flash", "efficient", "cudnn", "math")))


def source_from_name(name: str, *, llm_config: Any = None, **llm_options: Any) -> EvalSource:
    """`"compile"`, `"sdpa"`, `"sdpa-<backend>"`, `"provider:<spec>"` or `"llm"` -> the source. `llm_config` /
    `llm_options` are passed to `LLMSource` (ignored by the others)."""
    key = str(name).strip().lower()
    if key.startswith(PROVIDER_PREFIX):
        return ProviderSource(str(name))
    if key == "compile":
        return CompileSource()
    if key == "eager":
        return EagerSource()
    if key == "sdpa":
        return SDPASource()
    if key.startswith("sdpa-") and key in SOURCE_NAMES:
        return SDPASource(key.removeprefix("sdpa-"))
    if key == "llm":
        return LLMSource(llm_config, **llm_options)
    raise ValueError(f"unknown eval source {name!r}; choose one of: {', '.join(SOURCE_NAMES)}, "
                     f"{PROVIDER_PREFIX}<library> or {PROVIDER_PREFIX}<module>:<factory>")
