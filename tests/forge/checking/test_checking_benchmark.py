"""Benchmark timing on CPU, BenchmarkResult comparisons, the benchmark distribution, KernelUtils and launch cost."""

from __future__ import annotations

import dataclasses
import logging
import math
import random

import pytest
import torch
import torch.nn.functional as F

import forge.checking.benchmarking as benchmark_module
from forge.checking import (
    BenchmarkResult,
    KernelUtils,
    benchmark,
    benchmark_distribution,
    empty_kernel_launch_us,
    validate,
)
from forge.checking.probes import ProbeSettings
from forge.samples import Sample

FAST = {"warmup": 2, "rounds": 5, "min_run_time_s": 0.0}


def _result(median: float, q25: float, q75: float, device: str = "cuda:0") -> BenchmarkResult:
    return BenchmarkResult(median_ms=median, q25_ms=q25, q75_ms=q75, min_ms=q25 * 0.9, runs=100, device=device)


def test_benchmark_returns_sane_statistics_on_cpu():
    samples = [Sample((torch.randn(64, 64), torch.randn(64, 64)), {})]
    result = benchmark(torch.mm, samples, warmup=2, rounds=20, min_run_time_s=0.01)
    assert result.device == "cpu"
    assert result.runs >= 20
    assert 0 < result.min_ms <= result.q25_ms <= result.median_ms <= result.q75_ms
    assert math.isfinite(result.spread) and result.spread >= 0


def test_benchmark_calls_each_sample_per_pass_under_no_grad():
    calls = []

    def fn(x, *, tag):
        calls.append((tag, torch.is_grad_enabled()))
        return x + 1

    samples = [Sample((torch.randn(4, requires_grad=True),), {"tag": "a"}), Sample((torch.randn(3),), {"tag": "b"})]
    result = benchmark(fn, [samples[0], samples[0], samples[1]], **FAST)
    assert len(calls) == 3 * (FAST["warmup"] + result.runs)
    assert [tag for tag, _ in calls[:3]] == ["a", "a", "b"]
    assert not any(grad for _, grad in calls)


def test_benchmark_gives_new_values_every_pass_in_two_recurring_input_sets():
    original = torch.randn(512, 128).t()  # non-contiguous: the input sets must keep the strides
    seen = []

    def fn(x):
        seen.append((x.data_ptr(), x.stride(), x.clone()))

    benchmark(fn, [Sample((original,), {}), Sample((original,), {})], **FAST)
    assert all(stride == original.stride() for _, stride, _ in seen)
    ordered = original.reshape(-1).sort().values
    assert all(torch.equal(values.reshape(-1).sort().values, ordered) for _, _, values in seen)  # re-arranged
    assert all(not torch.equal(a, b) for (_, _, a), (_, _, b) in zip(seen, seen[1:], strict=False))
    pointers = [ptr for ptr, _, _ in seen]
    assert original.data_ptr() not in pointers
    assert len(set(pointers[0::2])) == 2 and len(set(pointers[1::2])) == 2  # two sets, addresses recur
    assert pointers[0] != pointers[1]  # a repeated sample gets its own copy within a pass


def test_benchmark_large_inputs_use_two_sets_and_no_extra_variant(monkeypatch):
    monkeypatch.setattr(benchmark_module, "_SMALL_INPUT_BYTES", 16)
    original = torch.randn(1 << 17)  # a random rotation repeats with probability 2**-17 per pass
    seen = []
    benchmark(lambda x: seen.append((x.data_ptr(), x.clone())), [Sample((original,), {})], **FAST)
    assert len({ptr for ptr, _ in seen}) == 2
    assert all(not torch.equal(a, b) for (_, a), (_, b) in zip(seen, seen[1:], strict=False))
    source = benchmark_module._InputSource([Sample((original,), {})], random.Random(0))
    assert not source.small and len(source._variants) == 1  # no reversed copy above 64 MB


def test_benchmark_rejects_bad_arguments():
    with pytest.raises(ValueError, match="at least one sample"):
        benchmark(torch.relu, [], **FAST)
    with pytest.raises(ValueError, match="rounds >= 1"):
        benchmark(torch.relu, [Sample((torch.randn(2),), {})], warmup=1, rounds=0)


def test_is_faster_than_needs_a_gain_beyond_the_noise():
    baseline = _result(1.0, 0.95, 1.05)
    assert _result(0.5, 0.48, 0.52).is_faster_than(baseline)
    assert not baseline.is_faster_than(_result(0.5, 0.48, 0.52))
    assert not _result(0.9, 0.8, 0.97).is_faster_than(baseline)  # quartiles overlap
    assert not _result(0.985, 0.98, 0.99, "cuda:0").is_faster_than(_result(1.0, 0.995, 1.005))  # gain < 3 %
    assert _result(0.985, 0.98, 0.99).is_faster_than(_result(1.0, 0.995, 1.005), min_gain=0.01)
    with pytest.raises(ValueError, match="different devices"):
        _result(0.5, 0.4, 0.6, "cpu").is_faster_than(baseline)


def test_result_speedup_spread_and_dict_round_trip():
    fast, slow = _result(0.5, 0.45, 0.55), _result(2.0, 1.9, 2.1)
    assert fast.speedup_over(slow) == pytest.approx(4.0)
    assert fast.spread == pytest.approx(0.2)
    data = fast.to_dict()
    assert data["spread"] == pytest.approx(0.2)
    assert BenchmarkResult.from_dict(data) == fast
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.median_ms = 0.1  # type: ignore[misc]


def test_benchmark_distribution_reduces_counts_by_gcd():
    a, b, c = (Sample((i,), {}) for i in range(3))
    assert benchmark_distribution([(300, a), (100, b), (200, c)]) == [a, a, a, b, c, c]
    assert benchmark_distribution([]) == []


def test_benchmark_distribution_caps_coprime_counts(caplog):
    a, b, c = (Sample((i,), {}) for i in range(3))
    with caplog.at_level(logging.DEBUG, logger="forge.checking.distribution"):
        calls = benchmark_distribution([(1000, a), (999, b), (1, c)], max_calls=64)
    assert len(calls) <= 65
    assert calls.count(a) == calls.count(b) >= 30
    assert calls.count(c) == 1  # every unique sample stays at least once
    assert any("capped" in r.getMessage() for r in caplog.records)
    with pytest.raises(ValueError, match="counts must be ints >= 1"):
        benchmark_distribution([(0, a)])


def test_empty_kernel_launch_cost_on_cpu_is_positive():
    cost = empty_kernel_launch_us("cpu")
    assert math.isfinite(cost) and cost > 0


def test_kernel_utils_bundles_settings_and_can_be_subclassed():
    cache: dict = {}

    def memoised(x, dim):  # right only for inputs it has already seen by shape
        return cache.setdefault(tuple(x.shape), F.softmax(x, dim=dim)).clone()

    samples = [Sample((torch.randn(3, 8),), {"dim": -1})]
    no_probes = ProbeSettings(enabled=False)  # the probes' fresh calls catch it too (see test_probes.py)
    assert KernelUtils(fresh_inputs_per_sample=0, probes=no_probes).validate(F.softmax, memoised, samples) == []
    cache.clear()
    assert KernelUtils().validate(F.softmax, memoised, samples)
    utils = KernelUtils(warmup=1, rounds=3, min_run_time_s=0.0, max_benchmark_calls=4)
    assert utils.benchmark(torch.relu, [Sample((torch.randn(16),), {})]).runs >= 3
    assert len(utils.benchmark_distribution([(7, samples[0]), (5, Sample((1,), {}))])) <= 5
    with pytest.raises(dataclasses.FrozenInstanceError):
        utils.seed = 3  # type: ignore[misc]

    class StrictUtils(KernelUtils):
        def validate(self, reference_fn, candidate, samples):
            return super().validate(reference_fn, candidate, samples) or (
                ["candidate is the reference itself"] if candidate is reference_fn else []
            )

    assert StrictUtils().validate(F.softmax, F.softmax, samples) == ["candidate is the reference itself"]
    assert validate(F.softmax, F.softmax, samples) == []
