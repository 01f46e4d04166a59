"""Poisoned allocations, the sealed expectation and the tolerance floors, tested directly."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.nn.functional as F

import forge.checking.expectation as expectation_module
from forge.checking.compare import bits_equal, bits_mismatch
from forge.checking.expectation import build_expectation
from forge.checking.poison import POISON_LARGE, POISON_NAN, PoisonFreshAllocations
from forge.checking.tolerance import DEFAULT_TOLERANCES, allowed_error, resolve_tolerances
from forge.samples import Sample

ALLOCATORS = {
    "empty": lambda like: torch.empty(like.shape, dtype=like.dtype),
    "empty_like": lambda like: torch.empty_like(like),
    "empty_strided": lambda like: torch.empty_strided(like.shape, (1, like.shape[0]), dtype=like.dtype),
    "new_empty": lambda like: like.new_empty(like.shape),
    "new_empty_strided": lambda like: like.new_empty_strided(like.shape, (1, like.shape[0])),
}


@pytest.mark.parametrize("allocator", sorted(ALLOCATORS))
def test_every_empty_like_allocation_is_poisoned(allocator):
    like = torch.zeros(3, 5)
    with PoisonFreshAllocations(POISON_NAN) as mode:
        nan_filled = ALLOCATORS[allocator](like)
    with PoisonFreshAllocations(POISON_LARGE):
        large_filled = ALLOCATORS[allocator](like)
    assert mode.poisoned >= 1
    assert torch.isnan(nan_filled).all()
    assert (large_filled == torch.finfo(torch.float32).max / 4).all()


@pytest.mark.parametrize(
    ("dtype", "nan_value", "large_value"),
    [(torch.int32, 2**31 - 1, -(2**31)), (torch.uint8, 255, 0), (torch.bool, True, False)],
)
def test_integer_and_bool_poison_uses_extremes(dtype, nan_value, large_value):
    with PoisonFreshAllocations(POISON_NAN):
        first = torch.empty(4, dtype=dtype)
    with PoisonFreshAllocations(POISON_LARGE):
        second = torch.empty(4, dtype=dtype)
    assert (first == nan_value).all() and (second == large_value).all()


def test_computed_results_are_not_poisoned():
    x = torch.randn(8)
    with PoisonFreshAllocations(POISON_NAN):
        y = torch.relu(x) + 1
        out = torch.empty_like(x)
        torch.mul(x, 2, out=out)
    assert torch.equal(y, torch.relu(x) + 1)
    assert torch.equal(out, x * 2)


def _live_float64_tensors_holding(marker: float) -> list[torch.Tensor]:
    gc.collect()
    return [
        o for o in gc.get_objects()
        if type(o) is torch.Tensor and o.dtype == torch.float64 and o.shape == (7, 3) and bool((o == marker).all())
    ]


def test_expectation_is_sealed_away_from_live_tensors(monkeypatch):
    marker = 12345.5
    sample = Sample((torch.full((7, 3), marker),), {})
    expectation = build_expectation(lambda t: t * 1.0, sample, resolve_tolerances(None), 4.0)
    assert _live_float64_tensors_holding(marker) == []  # no live float64 reference for a candidate to find
    restored = expectation.unseal()
    assert torch.equal(restored["output/reference"], torch.full((7, 3), marker, dtype=torch.float64))
    del restored

    monkeypatch.setattr(expectation_module, "_SEAL_LIMIT_BYTES", 0)  # too big to seal: the reference stays live
    unsealed = build_expectation(lambda t: t * 1.0, sample, resolve_tolerances(None), 4.0)
    assert len(_live_float64_tensors_holding(marker)) == 1
    del unsealed


def test_expectation_records_in_place_mutation_and_aliasing():
    expectation = build_expectation(
        F.relu, Sample((torch.tensor([-1.0, 2.0, -3.0, 4.0]),), {"inplace": True}), resolve_tolerances(None), 4.0
    )
    assert expectation.mutated_inputs == ["args[0]"]
    assert expectation.aliases == {"output": "args[0]"}


def test_allowance_scales_with_eager_error_and_floors():
    reference = torch.tensor([0.0, 1.0, -100.0], dtype=torch.float64)
    no_error = allowed_error(reference, torch.zeros(3, dtype=torch.float64), torch.float32, DEFAULT_TOLERANCES, 4.0)
    assert torch.allclose(no_error, torch.tensor([1e-5, 2e-5, 1e-5 + 1e-3], dtype=torch.float64))
    eager_error = torch.tensor([0.0, 0.0, 3e-3], dtype=torch.float64)
    widened = allowed_error(reference, eager_error, torch.float32, DEFAULT_TOLERANCES, 4.0)
    assert (widened > no_error).all()  # the rms term widens every element, the local term the noisy one most
    assert widened[2] - no_error[2] > widened[0] - no_error[0]


def test_bits_equal_is_nan_aware_but_sign_of_zero_sensitive():
    a = torch.tensor([1.0, float("nan"), 0.0])
    assert bits_equal(a, a.clone())
    assert not bits_equal(a, torch.tensor([1.0, float("nan"), -0.0]))
    assert bits_mismatch(a, torch.tensor([1.0, 2.0, 0.0]), ("run 1", "run 2")).startswith("1 of 3 elements differ")


def test_the_harness_modes_leave_dynamo_unimported_and_dynamo_skips_them_once_loaded():
    """A sandbox child pays no `torch._dynamo` import for the modes (`forge.checking.dispatch_mode`); a candidate
    that compiles under them still runs (Dynamo skips the modes' frames once it is loaded)."""
    import subprocess
    import sys

    script = (
        "import sys, torch\n"
        "from forge.checking.poison import POISON_NAN, PoisonFreshAllocations\n"
        "from forge.checking.launch_check import _OpRecorder\n"
        "with PoisonFreshAllocations(POISON_NAN) as mode:\n"
        "    out = torch.empty(4)\n"
        "assert mode.poisoned == 1 and bool(out.isnan().all())\n"
        "print('torch._dynamo' in sys.modules)\n"
        "f = torch.compile(lambda x: torch.sin(x) + 1, backend='eager')\n"
        "x = torch.randn(8)\n"
        "with PoisonFreshAllocations(POISON_NAN):\n"
        "    got = f(x)\n"
        "assert torch.allclose(got, torch.sin(x) + 1)\n"
        "print('compiled under the mode')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "compiled", "under", "the", "mode"]
