"""`BenchmarkResult.is_faster_than` tells a real gain from noise with a Mann-Whitney U test on the pass times."""

from __future__ import annotations

import itertools
import random

import pytest

from forge.checking.benchmarking import mann_whitney_p_less, summarize


def _exact_u_a(a: list[float], b: list[float]) -> float:
    return sum(1.0 if x > y else 0.5 if x == y else 0.0 for x, y in itertools.product(a, b))


def test_p_value_orders_and_matches_the_u_statistic() -> None:
    a, b = [1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]
    assert _exact_u_a(a, b) == 0.0
    assert mann_whitney_p_less(a, b) < 0.05 < mann_whitney_p_less(b, a)
    assert mann_whitney_p_less([1.0] * 10, [1.0] * 10) == 1.0  # all ties: no evidence either way


def test_shifted_but_overlapping_distributions_are_a_real_gain() -> None:
    rng = random.Random(0)
    # a busy host: bimodal timings whose quartiles overlap, but the candidate is faster in most passes
    base = [rng.choice([0.070, 0.071, 0.072, 0.120]) + rng.random() * 0.01 for _ in range(60)]
    cand = [rng.choice([0.023, 0.024, 0.050, 0.090]) + rng.random() * 0.01 for _ in range(60)]
    candidate, baseline = summarize(cand, "cuda"), summarize(base, "cuda")
    assert candidate.is_faster_than(baseline)
    assert not baseline.is_faster_than(candidate)


def test_identical_distributions_are_noise() -> None:
    rng = random.Random(1)
    a = summarize([rng.gauss(1.0, 0.2) for _ in range(80)], "cpu")
    b = summarize([rng.gauss(1.0, 0.2) for _ in range(80)], "cpu")
    assert not a.is_faster_than(b) and not b.is_faster_than(a)


def test_small_gain_below_min_gain_is_refused_even_if_significant() -> None:
    a = summarize([1.00 + i * 1e-6 for i in range(50)], "cpu")
    b = summarize([1.02 + i * 1e-6 for i in range(50)], "cpu")
    assert mann_whitney_p_less(a.times_ms, b.times_ms) < 1e-6
    assert not a.is_faster_than(b, min_gain=0.03)
    assert a.is_faster_than(b, min_gain=0.01)


def test_results_without_times_fall_back_to_quartiles() -> None:
    from forge.checking import BenchmarkResult

    fast = BenchmarkResult(median_ms=1.0, q25_ms=0.9, q75_ms=1.1, min_ms=0.8, runs=30, device="cpu")
    slow = BenchmarkResult(median_ms=2.0, q25_ms=1.9, q75_ms=2.1, min_ms=1.8, runs=30, device="cpu")
    assert fast.is_faster_than(slow) and not slow.is_faster_than(fast)
    assert BenchmarkResult.from_dict(fast.to_dict()) == fast
    with pytest.raises(ValueError, match="min_gain"):
        fast.is_faster_than(slow, min_gain=-1)
