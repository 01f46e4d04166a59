"""Kernel sources for evals behind one interface (`EvalSource`): `torch.compile`, pinned SDPA backends, any
`KernelProvider` (`provider:<library>` or `provider:<module>:<factory>`) and the LLM kernel generator, all judged
by the same oracle and timed against the same baselines (`evaluation`).

    from evals.sources import source_from_name
    record = source_from_name("compile").evaluate(problem, 0, "cpu")
"""

from __future__ import annotations

import functools

from evals.failures import Failure, failure_text
from evals.sources.base import USAGE_KEYS, Candidate, EvalSource
from evals.sources.evaluation import CUDA_ERROR_MARKERS, evaluate_problem, fail, failure_record, is_cuda_error
from evals.sources.llm import LLMSource
from evals.sources.provider import PROVIDER_PREFIX, ProviderSource, parse_provider_spec
from evals.sources.registry import (
    SourceEntry,
    check_source_name,
    register_source,
    source_from_name,
    source_names,
    source_usages,
)
from evals.sources.static import SDPA_BACKENDS, CompileSource, EagerSource, SDPASource

__all__ = [
    "CUDA_ERROR_MARKERS",
    "SDPA_BACKENDS",
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
    "SourceEntry",
    "check_source_name",
    "evaluate_problem",
    "fail",
    "failure_record",
    "failure_text",
    "is_cuda_error",
    "register_source",
    "source_from_name",
    "source_names",
    "source_usages",
]

# The built-in sources, in the order `kforge eval --help` lists them. A new source: its class in this folder and
# one line here.
register_source("llm", lambda llm_config=None, **options: LLMSource(llm_config, **options), takes_options=True)
register_source("compile", CompileSource)
register_source("eager", EagerSource)
register_source("sdpa", SDPASource)
for _backend in SDPA_BACKENDS:
    register_source(f"sdpa-{_backend}", functools.partial(SDPASource, _backend))
register_source(PROVIDER_PREFIX, ProviderSource, family=True, check=parse_provider_spec,
                usage=(f"{PROVIDER_PREFIX}<library>", f"{PROVIDER_PREFIX}<module>:<factory>"))
del _backend
