"""`judge_file`: one sandboxed judgement of a kernel file, for tests and benchmarks that call the sandbox directly
with keyword settings (`forge.sandbox.run_candidate` takes a target, a language object and `SandboxOptions`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from forge.judging import FunctionTarget, Verdict
from forge.samples import Sample
from forge.sandbox import SandboxOptions, run_candidate

__all__ = ["judge_file"]

_OPTION_FIELDS = {f.name for f in dataclasses.fields(SandboxOptions)}


def judge_file(source: str, function: str, samples: Sequence[Sample], *, language: str = "triton",
               counts: Sequence[int] | None = None, kernel_utils: Any = None, benchmark: bool = True,
               cancel_event: Any = None, registry: Any = None, **options: Any) -> Verdict:
    """`run_candidate` for `function` on `samples`; every other keyword is a `SandboxOptions` field."""
    from agent.languages import get_language

    unknown = set(options) - _OPTION_FIELDS
    if unknown:
        raise TypeError(f"unknown sandbox settings {sorted(unknown)}")
    target = FunctionTarget(function, tuple(samples), tuple(counts) if counts is not None else None)
    return run_candidate(source, target, get_language(language), options=SandboxOptions(**options),
                         kernel_utils=kernel_utils, benchmark=benchmark, cancel_event=cancel_event, registry=registry)
