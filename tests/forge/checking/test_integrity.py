"""The judge's integrity (issue 10, mechanism 1): patches of what compares or times a kernel are found, named,
undone, and the kernel behind them is rejected."""

from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from forge.checking import KernelUtils, benchmark, integrity
from forge.checking.integrity import ChangeKind, IntegrityError, Snapshot
from forge.checking.probes import Probe
from forge.optimizer import KernelOptimizer, ReportStatus
from forge.samples import Sample
from tests.forge.providers_for_tests import _FunctionProvider

_REAL_PERF_COUNTER = time.perf_counter
_REAL_ANY = torch.Tensor.any


@pytest.fixture(autouse=True)
def _judge_restored():
    """Whatever a test patches, the next test sees the real functions."""
    yield
    time.perf_counter = _REAL_PERF_COUNTER
    if "any" in vars(torch.Tensor):
        del torch.Tensor.any
    integrity.baseline().restore()


def _blind_any(self, *args, **kwargs):
    return torch.tensor(False)


def test_snapshot_names_replaced_and_shadowing_attributes_and_restores_them():
    snapshot = Snapshot.take()
    assert snapshot.changes() == []
    torch.Tensor.any = _blind_any  # shadows the inherited TensorBase.any: blinds every comparison
    time.perf_counter = lambda: 0.0
    changes = {c.name: c.kind for c in snapshot.changes()}
    assert changes == {"torch.Tensor.any": ChangeKind.ADDED, "time.perf_counter": ChangeKind.REPLACED}
    with pytest.raises(IntegrityError, match=r"torch\.Tensor\.any was added.*time\.perf_counter was replaced|"
                                             r"time\.perf_counter was replaced.*torch\.Tensor\.any was added"):
        snapshot.check("in a test")
    assert time.perf_counter is _REAL_PERF_COUNTER and "any" not in vars(torch.Tensor)
    assert bool(torch.ones(2).any())


def test_functional_and_mode_stacks_are_covered():
    snapshot = Snapshot.take()
    real_softmax = F.softmax
    F.softmax = lambda *a, **k: real_softmax(*a, **k)
    mode = torch.overrides.TorchFunctionMode()
    mode.__enter__()
    try:
        names = {c.name for c in snapshot.changes()}
    finally:
        mode.__exit__(None, None, None)
        F.softmax = real_softmax
    assert {"torch.nn.functional.softmax", "the torch function mode stack"} <= names
    assert snapshot.changes() == []


def test_importing_compilers_and_running_the_triton_interpreter_changes_nothing():
    import torch._dynamo  # noqa: F401
    import triton
    import triton.language as tl

    before = Snapshot.take()

    @triton.jit
    def double(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)

    x, y = torch.randn(16), torch.empty(16)
    double[(1,)](x, y, 16, BLOCK=16)
    assert torch.equal(y, x * 2)
    assert before.changes() == [] and integrity.baseline().changes() == []


def test_benchmark_raises_when_the_timed_function_patches_the_clock():
    def patches_clock(x):
        time.perf_counter = lambda: 0.0  # every pass would take 0 ms
        return x * 2

    with pytest.raises(IntegrityError, match=r"time\.perf_counter was replaced"):
        benchmark(patches_clock, [Sample((torch.randn(8),), {})], warmup=0, rounds=2, min_run_time_s=0.0)
    assert time.perf_counter is _REAL_PERF_COUNTER  # put back before raising


def test_benchmark_raises_when_the_timed_function_patches_tensor_methods():
    def patches_any(x):
        torch.Tensor.any = _blind_any
        return x * 2

    with pytest.raises(IntegrityError, match=r"torch\.Tensor\.any was added"):
        benchmark(patches_any, [Sample((torch.randn(8),), {})], warmup=0, rounds=2, min_run_time_s=0.0)
    assert "any" not in vars(torch.Tensor)


def test_validation_rejects_a_kernel_that_patches_the_judge_and_restores_it():
    def silu_patching_any(x, inplace=False):
        torch.Tensor.any = _blind_any
        return F.silu(x) * 1.5  # wrong, but `.any()` of the mismatch mask now says "no mismatch"

    issues = KernelUtils().validate(F.silu, silu_patching_any, [Sample((torch.randn(4, 8),), {})])
    integrity_issues = [i for i in issues if i.run == Probe.INTEGRITY]
    assert integrity_issues and "torch.Tensor.any was added" in integrity_issues[0]
    assert "any" not in vars(torch.Tensor)


def test_a_patch_made_before_validation_is_undone_not_charged():
    torch.Tensor.any = _blind_any  # e.g. by a kernel imported earlier
    assert KernelUtils().validate(F.silu, lambda x, inplace=False: x * torch.sigmoid(x),
                                  [Sample((torch.randn(4, 8),), {})]) == []
    assert "any" not in vars(torch.Tensor)


class _ClockPatchingGelu(_FunctionProvider, type_name="test_integrity_clock_patching_gelu"):
    """Correct gelu that, once past the calls validation and the probes make, speeds up the clock it is timed with."""

    def _call(self, x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
        self.calls += 1
        if self.calls > 60:
            real = _REAL_PERF_COUNTER
            time.perf_counter = lambda: real() / 1000.0
        return 0.5 * x * (1.0 + torch.erf(x * 0.7071067811865476))


class _GeluNet(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x)


def test_the_optimizer_never_selects_a_kernel_that_patches_its_timer():
    provider = _ClockPatchingGelu()
    utils = KernelUtils(fresh_inputs_per_sample=1, rounds=15, warmup=2, min_run_time_s=0.05)
    optimizer = KernelOptimizer(kernel_providers=[provider], kernel_utils=utils, end_to_end_check=False)
    plan = optimizer.make_plan(_GeluNet(), [Sample((torch.randn(8, 16),), {})])
    assert len(plan) == 0
    row = optimizer.report.set_index("candidate").loc[provider.name]
    assert row["status"] == ReportStatus.MISMATCH  # IntegrityError.outcome, as the integrity probe reports it
    assert "time.perf_counter was replaced" in row["error"]
    assert time.perf_counter is _REAL_PERF_COUNTER


def test_integrity_error_lists_at_most_eight_names():
    changes = [integrity.Change(f"torch.x{i}", ChangeKind.REPLACED, integrity.Group.TORCH) for i in range(10)]
    assert "and 2 more" in str(IntegrityError(changes))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_a_patched_event_timer_makes_the_benchmark_raise():
    real = torch.cuda.Event.elapsed_time

    def patches_events(x):
        torch.cuda.Event.elapsed_time = lambda self, other: 1e-6
        return x * 2

    try:
        with pytest.raises(IntegrityError, match=r"torch\.cuda\.Event\.elapsed_time was added|elapsed_time was repl"):
            benchmark(patches_events, [Sample((torch.randn(1024, device="cuda"),), {})], warmup=0, rounds=2,
                      min_run_time_s=0.0)
        assert torch.cuda.Event.elapsed_time is real
    finally:
        if torch.cuda.Event.elapsed_time is not real:
            torch.cuda.Event.elapsed_time = real
