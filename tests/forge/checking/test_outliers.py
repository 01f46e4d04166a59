"""The outlier budget: on a large output a few elements may exceed their allowance when each stays within the tail
bound (error_factor times eager PyTorch's own worst error on that output). Why: on the H200 an honest Triton flash
attention for Llama's `LlamaAttention` (bf16, 4.2M outputs) put 8-12 elements outside their allowance, and PyTorch's
own FLASH_ATTENTION backend 1, while eager (cuDNN) set the allowance: another rounding order has its rare worst
elements elsewhere than eager's."""

from __future__ import annotations

import torch

from forge.checking.compare import float_mismatch_issue
from forge.checking.expectation import build_expectation, leaf_value_issues
from forge.checking.tolerance import DEFAULT_TOLERANCES, allowed_error, outlier_budget
from forge.samples import Sample

N = 200_000  # budget 2


def _case():
    reference = torch.randn(N, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    return reference, torch.full((N,), 1e-3, dtype=torch.float64), torch.tensor(4e-3, dtype=torch.float64)


def _with(reference: torch.Tensor, errors: dict[int, float]) -> torch.Tensor:
    got = reference + 5e-4
    for index, error in errors.items():
        got[index] = reference[index] + error
    return got


def test_a_few_outliers_within_the_tail_pass_and_more_or_larger_ones_fail() -> None:
    reference, allowed, tail = _case()
    assert outlier_budget(N) == 2 and outlier_budget(99_999) == 0
    assert float_mismatch_issue(_with(reference, {}), reference, allowed, None, tail=tail) is None
    two = _with(reference, {7: 2e-3, 90_000: -3e-3})
    assert float_mismatch_issue(two, reference, allowed, None, tail=tail) is None
    assert float_mismatch_issue(two, reference, allowed, None) is not None  # no tail: every element within
    three = _with(reference, {7: 2e-3, 90_000: -3e-3, 150_000: 2e-3})
    assert float_mismatch_issue(three, reference, allowed, None, tail=tail).bad_elements == 3
    beyond = _with(reference, {7: 5e-3})
    assert float_mismatch_issue(beyond, reference, allowed, None, tail=tail).bad_elements == 1
    small = reference[:1000]
    one = _with(small, {3: 2e-3})
    assert float_mismatch_issue(one, small, allowed[:1000], None, tail=tail) is not None  # small outputs: none


def test_the_expectation_holds_the_tail_of_eager_pytorchs_own_worst_error() -> None:
    x = torch.randn(400, 512, generator=torch.Generator().manual_seed(1))
    expectation = build_expectation(torch.exp, Sample((x,), {}), DEFAULT_TOLERANCES, 4.0)
    expected = expectation.unseal()
    reference = torch.exp(x.double()).flatten()
    eager_error = (torch.exp(x).double().flatten() - reference).abs()
    tail = float(expected["output/tail"])
    assert tail == 4.0 * float(eager_error.max())
    allowed = allowed_error(reference, eager_error, torch.float32, DEFAULT_TOLERANCES, 4.0)
    between = torch.nonzero(allowed < 0.8 * tail).flatten()[:3].tolist()
    assert len(between) == 3
    got = torch.exp(x).flatten().double()
    for index in between[:2]:  # beyond their allowance, within the tail: the budget (2 of 204,800) takes them
        got[index] = reference[index] + (float(allowed[index]) + tail) / 2
    assert leaf_value_issues(expectation, expected, {"output": got.float().view(400, 512)}) == []
    got[between[2]] = reference[between[2]] + (float(allowed[between[2]]) + tail) / 2
    issues = leaf_value_issues(expectation, expected, {"output": got.float().view(400, 512)})
    assert len(issues) == 1 and issues[0].bad_elements == 3
