"""The eval's "vs compile" baseline is plain `torch.compile` of the function, as a user would write it."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from evals.sources.evaluation import plain_compile_baseline
from forge.providers import CompiledFunctionProvider


def test_compile_baseline_is_plain_torch_compile_of_the_function_once_per_process() -> None:
    baseline = plain_compile_baseline("relu")
    assert baseline is plain_compile_baseline("relu")  # compiled once, reused by every problem of the function
    assert not isinstance(baseline, CompiledFunctionProvider)  # no per-call signature lookup of ours in the timing
    x = torch.randn(4, 8)
    assert torch.equal(baseline(x), F.relu(x))
