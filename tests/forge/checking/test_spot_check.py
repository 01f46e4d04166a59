"""Inputs that change between timed passes, and spot checks of timed passes (`forge.checking.spot_check`).

Real torch on the CPU; kernels are plain Python callables that behave like the exploits of issue 10 (correct on the
calls `validate` makes, wrong or cached when timed)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from forge.checking import KernelUtils, SpotCheck, SpotCheckError
from forge.checking.benchmarking import benchmark
from forge.execution import TimingMode
from forge.outcome import HarnessError
from forge.samples import Sample

_QUICK = {"warmup": 1, "rounds": 6, "min_run_time_s": 0.0}


def _samples() -> list[Sample]:
    return [Sample((torch.randn(16, 64),), {}), Sample((torch.randn(4, 32),), {})]


class _WrongAfter:
    """Correct for the first `calls` calls (what validate sees), wrong on one element afterwards."""

    def __init__(self, calls: int) -> None:
        self.calls = 0
        self.limit = calls

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        out = F.silu(x)
        if self.calls > self.limit:
            out.view(-1)[0] += 0.5
        return out


def test_a_kernel_wrong_on_later_passes_fails_the_spot_check() -> None:
    kernel = _WrongAfter(calls=2)
    with pytest.raises(SpotCheckError) as caught:
        benchmark(kernel, _samples(), spot_check=SpotCheck(F.silu), **_QUICK)
    error = caught.value
    assert error.pass_number >= 1 and error.call in (0, 1)
    assert error.issue.max_abs_error == pytest.approx(0.5, rel=1e-3)
    assert f"timed pass {error.pass_number}" in str(error) and "max abs error" in str(error)


def test_an_honest_function_passes_and_is_timed() -> None:
    result = benchmark(F.silu, _samples(), spot_check=SpotCheck(F.silu, passes=(3, 3)), **_QUICK)
    assert result.runs >= 6 and result.median_ms > 0


def test_an_in_place_function_passes() -> None:
    # The reference mutates its input: the check compares the input after the call too, on rebuilt inputs.
    relu_ = lambda x: F.relu(x, inplace=True)  # noqa: E731
    benchmark(relu_, _samples(), spot_check=SpotCheck(relu_, passes=(3, 3)), **_QUICK)


def test_values_change_between_passes_but_not_their_distribution() -> None:
    seen: list[torch.Tensor] = []
    x = torch.randn(128, 1024)  # a rotation repeats with probability 2**-17 per pass
    benchmark(lambda t: seen.append(t.clone()), [Sample((x,), {})], warmup=2, rounds=12, min_run_time_s=0.0)
    prints = {tuple(t.view(-1)[::61].tolist()) for t in seen}
    assert len(prints) == len(seen), "a sparse value fingerprint repeated between passes"
    for t in seen:  # a re-arrangement of the captured values: same multiset
        assert torch.equal(t.view(-1).sort().values, x.view(-1).sort().values)
        assert not torch.equal(t, x)


def test_integer_and_masking_tensors_keep_their_values() -> None:
    index = torch.randint(0, 10, (64,))
    mask = torch.zeros(8, 8).masked_fill(torch.ones(8, 8).triu(1).bool(), float("-inf"))
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    benchmark(lambda i, m: seen.append((i.clone(), m.clone())), [Sample((index, mask), {})], warmup=1, rounds=4,
              min_run_time_s=0.0)
    assert all(torch.equal(i, index) and torch.equal(m, mask) for i, m in seen)


class _ValueCache:
    """Serves the output of the last call whose sparse fingerprint (every 61st element) matches."""

    def __init__(self) -> None:
        self.cache: dict[tuple[float, ...], tuple[torch.Tensor, torch.Tensor]] = {}
        self.stale = 0  # hits on other values than the cached call's (served a wrong output)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        key = tuple(x.view(-1)[::61].tolist())
        if key in self.cache:
            seen, out = self.cache[key]
            self.stale += not torch.equal(seen, x)
            return out.clone()
        out = F.silu(x)
        self.cache[key] = (x.clone(), out.clone())
        return out


def test_a_value_fingerprint_cache_never_serves_a_stale_output() -> None:
    """Values are rotations of the captured ones, so a fingerprint matches only when the rotation repeats (1 in
    2 x numel per pass: a few percent over this test's passes for the 128-element sample), and then every value
    is the same: what the cache serves is right."""
    kernel = _ValueCache()
    benchmark(kernel, _samples(), spot_check=SpotCheck(F.silu), **_QUICK)
    assert kernel.stale == 0 and len(kernel.cache) >= 8


class _AddressCache:
    """Serves the output of the last call with the same input address (recurring addresses, as in a model)."""

    def __init__(self) -> None:
        self.cache: dict[int, torch.Tensor] = {}
        self.hits = 0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        hit = self.cache.get(x.data_ptr())
        if hit is not None:
            self.hits += 1
            return hit.clone()
        out = F.silu(x)
        self.cache[x.data_ptr()] = out.clone()
        return out


def test_an_address_cache_is_served_stale_values_and_caught() -> None:
    kernel = _AddressCache()
    with pytest.raises(SpotCheckError):
        benchmark(kernel, _samples(), spot_check=SpotCheck(F.silu, passes=(2, 3)), warmup=1, rounds=8,
                  min_run_time_s=0.0)
    assert kernel.hits > 0


def test_without_a_spot_check_the_wrong_kernel_is_timed() -> None:
    # The failing test above is the spot check's doing, not the benchmark's.
    result = benchmark(_WrongAfter(calls=2), _samples(), **_QUICK)
    assert result.runs >= 6


def test_device_mode_on_cpu_is_wall_time_and_spot_checked() -> None:
    with pytest.raises(SpotCheckError):
        benchmark(_WrongAfter(calls=2), _samples(), spot_check=SpotCheck(F.silu), mode=TimingMode.DEVICE, **_QUICK)
    result = benchmark(F.silu, _samples(), spot_check=SpotCheck(F.silu), mode=TimingMode.DEVICE, **_QUICK)
    assert result.mode == TimingMode.DEVICE.value and result.device == "cpu"


def test_a_reference_that_rejects_the_timed_inputs_is_a_harness_error() -> None:
    def picky(x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 4:
            raise ValueError("no")
        return F.silu(x)

    with pytest.raises(HarnessError):
        benchmark(F.silu, _samples(), spot_check=SpotCheck(picky), **_QUICK)


def test_kernel_utils_benchmark_spot_checks_with_a_reference() -> None:
    utils = KernelUtils(warmup=1, rounds=4, min_run_time_s=0.0)
    utils.benchmark(F.silu, _samples(), reference=F.silu)
    with pytest.raises(SpotCheckError):
        utils.benchmark(_WrongAfter(calls=2), _samples(), reference=F.silu)


@pytest.mark.parametrize("passes", [(0, 1), (3, 2)])
def test_spot_check_settings_are_checked(passes: tuple[int, int]) -> None:
    with pytest.raises(ValueError):
        SpotCheck(F.silu, passes=passes)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("mode", [TimingMode.EAGER, TimingMode.DEVICE])
def test_cuda_spot_check_catches_a_wrong_timed_pass(mode: TimingMode) -> None:
    samples = [Sample((torch.randn(256, 1024, device="cuda"),), {})]
    benchmark(F.silu, samples, spot_check=SpotCheck(F.silu), mode=mode, **_QUICK)
    # Graph mode: the captured pass is wrong on every replay (captured after the kernel turned wrong).
    with pytest.raises(SpotCheckError):
        benchmark(_WrongAfter(calls=1), samples, spot_check=SpotCheck(F.silu), mode=mode, **_QUICK)
