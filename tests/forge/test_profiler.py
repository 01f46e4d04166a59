"""Tests for forge.profiler: scoping, counting, sampling, restoration, attribution and the summary (real torch, CPU)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd import DeviceType

from forge.functional import functional_names, original_function
from forge.profiler import (
    MODULE_LABEL,
    OVERHEAD_LABEL,
    SUMMARY_COLUMNS,
    ModuleFunctionKernelProfiler,
    ProfileResult,
    function_label,
)
from forge.profiler.attribution import (
    attribute_cpu_time,
    attribute_device_time,
    nearest_label,
    parse_function_label,
)
from forge.samples import Sample


def _profiler(**kwargs: Any) -> ModuleFunctionKernelProfiler:
    kwargs.setdefault("warmup_iterations", 0)
    return ModuleFunctionKernelProfiler(**kwargs)


def _functional_snapshot() -> dict[str, Any]:
    return {name: getattr(F, name) for name in functional_names()}


def _assert_restored(before: dict[str, Any], module: nn.Module) -> None:
    after = _functional_snapshot()
    changed = [name for name in before if after[name] is not before[name]]
    assert changed == []
    for sub in module.modules():
        assert not sub._forward_hooks and not sub._forward_pre_hooks
        assert "forward" not in vars(sub)


class TwoLinears(nn.Module):
    """linear1 once, linear2 twice (nn.Linear) and three direct F.linear calls, all with the same signature."""

    def __init__(self) -> None:
        super().__init__()
        self.linear1 = nn.Linear(8, 8)
        self.linear2 = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.linear1(x)
        x = self.linear2(self.linear2(x))
        for _ in range(3):
            x = F.linear(x, self.linear1.weight, self.linear1.bias)
        return x


class Activation(nn.Module):
    """Calls `torch.nn.functional.<name>` looked up at call time (as `F.gelu(x)` in a forward would)."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(F, self.name)(x)


# ---------------------------------------------------------------------------------------------------------
# Scoping and counting
# ---------------------------------------------------------------------------------------------------------
def test_calls_outside_the_module_are_not_counted() -> None:
    model = Activation("gelu")

    def wrapper(x: torch.Tensor) -> torch.Tensor:
        x = F.relu(x)
        x = F.relu(x)
        return model(F.silu(x))

    result = _profiler().profile(wrapper, [Sample((torch.randn(4, 8),), {})], module=model)

    assert list(result.functions) == ["gelu"]
    assert result.functions["gelu"].calls == 1


def test_calls_inside_the_module_are_counted_even_when_the_wrapper_makes_the_same_call() -> None:
    model = Activation("relu")
    result = _profiler().profile(lambda x: model(F.relu(x)), [Sample((torch.randn(4, 8),), {})], module=model)
    assert result.functions["relu"].calls == 1


def test_linear_counts_across_submodules_and_direct_calls() -> None:
    model = TwoLinears().eval()
    x = torch.randn(2, 8)

    result = _profiler(function_names={"linear"}).profile(model, [Sample((x,), {})])

    linear = result.functions["linear"]
    assert linear.calls == 6
    assert linear.unique_samples == 1
    (count, sample), = linear.samples
    assert count == 6
    assert len(sample.args) == 3 and sample.kwargs == {}
    torch.testing.assert_close(sample.args[0], x)
    assert len(linear.sample_times_ms) == 1


def test_two_batch_sizes_give_two_samples_and_calls_are_per_pass() -> None:
    model = TwoLinears().eval()
    data = [Sample((torch.randn(2, 8),), {}), (((torch.randn(3, 8)),), {})]

    result = _profiler(profile_iterations=3).profile(model, data)

    linear = result.functions["linear"]
    assert [count for count, _ in linear.samples] == [6, 6]
    assert [tuple(s.args[0].shape) for _, s in linear.samples] == [(2, 8), (3, 8)]
    assert linear.calls == 12
    assert result.profile_iterations == 3


def test_function_is_called_warmup_plus_profile_times_for_each_sample() -> None:
    model = TwoLinears().eval()
    seen: list[int] = []

    def function(x: torch.Tensor) -> torch.Tensor:
        seen.append(x.shape[0])
        return model(x)

    data = [Sample((torch.randn(1, 8),), {}), Sample((torch.randn(2, 8),), {})]
    _profiler(warmup_iterations=2, profile_iterations=2).profile(function, data, module=model)
    assert seen == [1, 2] * 4


def test_data_none_calls_function_without_arguments() -> None:
    model = TwoLinears().eval()
    x = torch.randn(5, 8)
    calls = []

    def function() -> torch.Tensor:
        calls.append(1)
        return model(x)

    result = _profiler(warmup_iterations=2).profile(function, module=model)

    assert len(calls) == 3
    assert result.functions["linear"].calls == 6
    assert tuple(result.functions["linear"].samples[0][1].args[0].shape) == (5, 8)


@pytest.mark.parametrize(
    ("layer", "make_input", "expected"),
    [
        (lambda: nn.Linear(8, 4), lambda: torch.randn(2, 8), "linear"),
        (lambda: nn.LayerNorm(8), lambda: torch.randn(2, 8), "layer_norm"),
        (lambda: nn.GELU(), lambda: torch.randn(2, 8), "gelu"),
        (lambda: nn.SiLU(), lambda: torch.randn(2, 8), "silu"),
        (lambda: nn.Softmax(dim=-1), lambda: torch.randn(2, 8), "softmax"),
        (lambda: nn.Embedding(10, 4), lambda: torch.randint(0, 10, (2, 3)), "embedding"),
        (lambda: nn.GroupNorm(2, 4), lambda: torch.randn(2, 4, 3, 3), "group_norm"),
        (lambda: nn.Conv2d(4, 2, 3), lambda: torch.randn(1, 4, 5, 5), "conv2d"),
        (lambda: nn.RMSNorm(8), lambda: torch.randn(2, 8), "rms_norm"),
    ],
)
def test_nn_modules_are_seen_as_their_functional(layer: Any, make_input: Any, expected: str) -> None:
    module = layer().eval()
    result = _profiler().profile(module, [Sample((make_input(),), {})])
    assert expected in result.functions
    assert result.functions[expected].calls == 1
    assert result.functions[expected].samples


# ---------------------------------------------------------------------------------------------------------
# Samples: de-duplication and cloning
# ---------------------------------------------------------------------------------------------------------
def test_same_shape_different_dtype_gives_two_samples() -> None:
    model = Activation("gelu")
    x = torch.randn(4, 4)
    result = _profiler().profile(model, [Sample((x,), {}), Sample((x.double(),), {}), Sample((x.clone(),), {})])

    gelu = result.functions["gelu"]
    assert gelu.unique_samples == 2
    assert [(count, s.args[0].dtype) for count, s in gelu.samples] == [(2, torch.float32), (1, torch.float64)]


def test_contiguous_and_transposed_view_give_two_samples() -> None:
    model = Activation("gelu")
    x = torch.randn(4, 4)
    result = _profiler().profile(model, [Sample((x,), {}), Sample((x.t(),), {})])

    gelu = result.functions["gelu"]
    assert gelu.unique_samples == 2
    strides = [s.args[0].stride() for _, s in gelu.samples]
    assert strides == [(4, 1), (1, 4)]
    torch.testing.assert_close(gelu.samples[1][1].args[0], x.t())


class InPlaceThenSilu(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.clone()
        F.relu(y, inplace=True)
        return F.silu(y)


def test_stored_samples_are_clones_unaffected_by_in_place_ops_and_later_mutation() -> None:
    x = torch.randn(4, 8)
    x[0, 0] = -1.0
    original = x.clone()

    result = _profiler().profile(InPlaceThenSilu(), [Sample((x,), {})])

    relu_input = result.functions["relu"].samples[0][1].args[0]
    silu_input = result.functions["silu"].samples[0][1].args[0]
    torch.testing.assert_close(relu_input, original)  # recorded before relu mutated it in place
    torch.testing.assert_close(silu_input, torch.relu(original))
    x.zero_()
    torch.testing.assert_close(relu_input, original)
    assert relu_input.data_ptr() != x.data_ptr()


def test_sample_ids_and_times_line_up_per_signature() -> None:
    model = Activation("gelu")
    data = [Sample((torch.randn(2, 4),), {}), Sample((torch.randn(3, 4),), {}), Sample((torch.randn(2, 4),), {})]
    result = _profiler().profile(model, data)

    gelu = result.functions["gelu"]
    assert len(gelu.sample_times_ms) == len(gelu.samples) == 2
    assert all(t > 0 for t in gelu.sample_times_ms)
    assert gelu.total_time_ms == pytest.approx(sum(gelu.sample_times_ms))


# ---------------------------------------------------------------------------------------------------------
# Restoration
# ---------------------------------------------------------------------------------------------------------
class FailsAfterLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.patched_during_forward: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.patched_during_forward.append(F.linear is not original_function("linear"))
        self.linear(x)
        raise RuntimeError("forward exploded")


def test_everything_is_restored_when_forward_raises() -> None:
    model = FailsAfterLinear()
    before = _functional_snapshot()

    with pytest.raises(RuntimeError, match="forward exploded"):
        _profiler().profile(model, [Sample((torch.randn(2, 4),), {})])

    assert model.patched_during_forward == [True]
    _assert_restored(before, model)
    assert F.linear(torch.ones(1, 4), torch.ones(4, 4)).sum().item() == 16.0


def test_everything_is_restored_after_success() -> None:
    model = TwoLinears()
    before = _functional_snapshot()
    _profiler(warmup_iterations=1, profile_iterations=2).profile(model, [Sample((torch.randn(2, 8),), {})])
    _assert_restored(before, model)


def test_profiler_calls_the_original_not_a_function_already_patched_into_F(monkeypatch: pytest.MonkeyPatch) -> None:
    foreign_calls = []

    def foreign_gelu(*args: Any, **kwargs: Any) -> torch.Tensor:
        foreign_calls.append(1)
        return torch.zeros(())

    monkeypatch.setattr(F, "gelu", foreign_gelu)
    model = Activation("gelu")
    result = _profiler().profile(model, [Sample((torch.randn(2, 4),), {})])

    assert foreign_calls == []
    assert result.functions["gelu"].calls == 1
    assert F.gelu is foreign_gelu


# ---------------------------------------------------------------------------------------------------------
# Input validation
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("data", "error", "match"),
    [
        ({"x": 1}, TypeError, "data must be a sequence"),
        ("x", TypeError, "data must be a sequence"),
        (Sample((torch.ones(1),), {}), TypeError, "data must be a sequence"),
        ([], ValueError, "data is empty"),
        ([torch.ones(2)], TypeError, r"data\[0\] is Tensor"),
        ([Sample((torch.ones(1),), {}), (torch.ones(1), {})], TypeError, r"data\[1\] must hold"),
        ([((torch.ones(1),), [1])], TypeError, r"data\[0\] must hold"),
    ],
)
def test_bad_data_is_rejected_before_anything_runs(data: Any, error: type, match: str) -> None:
    calls = []

    def function(*args: Any, **kwargs: Any) -> None:
        calls.append(1)

    with pytest.raises(error, match=match):
        _profiler().profile(function, data, module=nn.Identity())
    assert calls == []


def test_module_is_required_when_function_is_not_a_module() -> None:
    with pytest.raises(ValueError, match="module must be given when function is not an nn.Module"):
        _profiler().profile(lambda: None)
    with pytest.raises(TypeError, match="module must be a torch.nn.Module"):
        _profiler().profile(lambda: None, module="model")


def test_module_never_called_through_call_is_an_error() -> None:
    model = TwoLinears()
    x = torch.randn(2, 8)
    before = _functional_snapshot()
    with pytest.raises(RuntimeError, match="never called while profiling"):
        _profiler().profile(lambda: model.forward(x), module=model)
    _assert_restored(before, model)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"function_names": {"not_a_function"}}, ValueError, "unknown torch.nn.functional"),
        ({"function_names": "linear"}, TypeError, "not a string"),
        ({"warmup_iterations": -1}, ValueError, "warmup_iterations must be an int >= 0"),
        ({"profile_iterations": 0}, ValueError, "profile_iterations must be an int >= 1"),
        ({"profile_iterations": 1.5}, ValueError, "profile_iterations must be an int >= 1"),
    ],
)
def test_bad_profiler_settings_are_rejected(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        ModuleFunctionKernelProfiler(**kwargs)


# ---------------------------------------------------------------------------------------------------------
# Filtering, nesting, summary
# ---------------------------------------------------------------------------------------------------------
class LinearNormGelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.norm(self.linear(x)))


def test_function_names_filter_collects_only_those_samples_but_profiles_all() -> None:
    result = _profiler(function_names={"linear"}).profile(LinearNormGelu(), [Sample((torch.randn(2, 8),), {})])

    assert set(result.functions) == {"linear", "layer_norm", "gelu"}
    assert result.functions["linear"].samples
    assert result.functions["layer_norm"].samples == [] and result.functions["gelu"].samples == []
    assert result.functions["gelu"].calls == 1 and result.functions["gelu"].unique_samples == 1


def test_empty_function_names_collects_nothing() -> None:
    result = _profiler(function_names=set()).profile(LinearNormGelu(), [Sample((torch.randn(2, 8),), {})])
    assert result.functions and all(not p.samples for p in result.functions.values())


class MultiHeadAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention = nn.MultiheadAttention(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.attention
        return F.multi_head_attention_forward(
            x, x, x, 8, 2, a.in_proj_weight, a.in_proj_bias, None, None, False, 0.0,
            a.out_proj.weight, a.out_proj.bias, training=False, need_weights=False,
        )[0]


def test_nested_functionals_get_their_own_rows_and_time() -> None:
    result = _profiler().profile(MultiHeadAttention().eval(), [Sample((torch.randn(5, 2, 8),), {})])

    names = set(result.functions)
    assert {"multi_head_attention_forward", "linear", "scaled_dot_product_attention"} <= names
    assert result.functions["multi_head_attention_forward"].calls == 1
    assert result.functions["linear"].calls >= 2  # in-projection(s) and out-projection, called from inside MHA
    for name in ("multi_head_attention_forward", "linear", "scaled_dot_product_attention"):
        assert result.functions[name].total_time_ms > 0
    assert sum(p.total_time_ms for p in result.functions.values()) <= result.total_time_ms * (1 + 1e-9)


def test_summary_columns_order_and_percentages() -> None:
    profiler = _profiler(profile_iterations=2)
    with pytest.raises(RuntimeError, match="nothing profiled yet"):
        profiler.summary()
    result = profiler.profile(MultiHeadAttention().eval(), [Sample((torch.randn(5, 2, 8),), {})])

    frame = result.summary()
    assert tuple(frame.columns) == SUMMARY_COLUMNS
    assert len(frame) == len(result.functions)
    times = list(frame["total_time_ms"])
    assert times == sorted(times, reverse=True)
    assert list(frame["function_name"]) == list(result.functions)
    assert (frame["time_spent_pct"] >= 0).all()
    assert frame["time_spent_pct"].sum() <= 100.0 + 1e-6
    row = frame.iloc[0]
    assert row["mean_time_us"] == pytest.approx(row["total_time_ms"] * 1000 / row["calls"])
    assert row["time_spent_pct"] == pytest.approx(100 * row["total_time_ms"] / result.total_time_ms)
    assert result.device == "cpu" and result.total_time_ms > 0

    top = profiler.summary(top_k=2)
    assert list(top["function_name"]) == list(frame["function_name"][:2])
    with pytest.raises(ValueError, match="top_k"):
        result.summary(top_k=-1)


def test_empty_result_summary_has_the_columns() -> None:
    frame = ProfileResult(functions={}, total_time_ms=0.0, device="cpu").summary()
    assert tuple(frame.columns) == SUMMARY_COLUMNS and len(frame) == 0


def test_progress_is_logged_at_info(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="forge.profiler"):
        _profiler(warmup_iterations=2, profile_iterations=2).profile(TwoLinears(), [Sample((torch.randn(1, 8),), {})])
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "profiling: warm-up 1/2",
        "profiling: warm-up 2/2",
        "profiling pass 1/2",
        "profiling pass 2/2",
    ]


# ---------------------------------------------------------------------------------------------------------
# Attribution from profiler events (synthetic events: the CUDA path's logic, checked without a GPU)
# ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FakeTimeRange:
    start: float
    end: float


@dataclass(eq=False)
class FakeEvent:
    """The parts of a `torch.autograd.profiler_util.FunctionEvent` that attribution reads."""

    name: str
    id: int = 0
    cpu_time_total: float = 0.0
    cpu_parent: FakeEvent | None = None
    device_type: Any = DeviceType.CPU
    time_range: FakeTimeRange = FakeTimeRange(0.0, 0.0)
    is_async: bool = False
    is_user_annotation: bool = False


def _kernel(name: str, correlation_id: int, us: float, **kwargs: Any) -> FakeEvent:
    return FakeEvent(name, id=correlation_id, device_type=DeviceType.CUDA, time_range=FakeTimeRange(10.0, 10.0 + us),
                     **kwargs)


def test_labels_round_trip() -> None:
    assert parse_function_label(function_label("linear", 3)) == ("linear", 3)
    assert parse_function_label(function_label("multi_head_attention_forward", 0)) == (
        "multi_head_attention_forward", 0)
    assert parse_function_label(MODULE_LABEL) is None
    assert parse_function_label(OVERHEAD_LABEL) is None
    assert parse_function_label("aten::mm") is None
    assert parse_function_label("kforge::linear::x") is None


def test_nearest_label_walks_up_to_the_innermost_label() -> None:
    module = FakeEvent(MODULE_LABEL)
    outer = FakeEvent(function_label("multi_head_attention_forward", 0), cpu_parent=module)
    inner = FakeEvent(function_label("linear", 0), cpu_parent=outer)
    op = FakeEvent("aten::addmm", cpu_parent=FakeEvent("aten::linear", cpu_parent=inner))
    assert nearest_label(op) is inner
    assert nearest_label(inner) is inner
    assert nearest_label(FakeEvent("aten::mm")) is None
    assert nearest_label(None) is None


def test_device_time_goes_to_the_nearest_label_of_the_launching_call() -> None:
    module = FakeEvent(MODULE_LABEL, id=1, is_user_annotation=True)
    mha = FakeEvent(function_label("multi_head_attention_forward", 0), id=2, cpu_parent=module, is_user_annotation=True)
    linear = FakeEvent(function_label("linear", 0), id=3, cpu_parent=mha, is_user_annotation=True)
    addmm = FakeEvent("aten::addmm", id=4, cpu_parent=linear)
    addmm_launch = FakeEvent("cudaLaunchKernel", id=100, cpu_parent=addmm)
    # torch copies an op's kernels onto lazy-loading events with the op's id: they must not count again
    lazy = FakeEvent("Lazy Function Loading", id=4, cpu_parent=FakeEvent("cudaFuncSetAttribute", id=99,
                                                                          cpu_parent=addmm))
    softmax = FakeEvent("aten::_softmax", id=5, cpu_parent=mha)
    softmax_launch = FakeEvent("cudaLaunchKernel", id=101, cpu_parent=softmax)
    gelu = FakeEvent(function_label("gelu", 1), id=6, cpu_parent=module, is_user_annotation=True)
    triton_launch = FakeEvent("cuLaunchKernelEx", id=102, cpu_parent=gelu)  # no aten op around a Triton launch
    glue_launch = FakeEvent("cudaLaunchKernel", id=103, cpu_parent=FakeEvent("aten::add", id=7, cpu_parent=module))
    overhead = FakeEvent(OVERHEAD_LABEL, id=8, cpu_parent=module, is_user_annotation=True)
    clone_launch = FakeEvent("cudaMemcpyAsync", id=104, cpu_parent=FakeEvent("aten::copy_", id=9, cpu_parent=overhead))
    outside_launch = FakeEvent("cudaLaunchKernel", id=105, cpu_parent=FakeEvent("aten::relu", id=10))
    cpu_events = [module, mha, linear, addmm, addmm_launch, lazy, softmax, softmax_launch, gelu, triton_launch,
                  glue_launch, overhead, clone_launch, outside_launch]
    device_events = [
        _kernel("sm90_gemm", 100, 30.0),
        _kernel("softmax_kernel", 101, 7.0),
        _kernel("triton_poi_fused_gelu_0", 102, 5.0),
        _kernel("add_kernel", 103, 2.0),
        _kernel("Memcpy DtoD", 104, 100.0),
        _kernel("relu_kernel", 105, 1000.0),
        _kernel("unmatched_kernel", 999, 500.0),
        _kernel(function_label("linear", 0), 3, 400.0, is_user_annotation=True),  # GPU mirror of the label
        _kernel(MODULE_LABEL, 1, 800.0),  # a mirror on a torch without is_user_annotation
    ]

    times = attribute_device_time(cpu_events + device_events)

    assert times.function_us == {
        ("linear", 0): 30.0,
        ("multi_head_attention_forward", 0): 7.0,
        ("gelu", 1): 5.0,
    }
    assert times.module_us == 30.0 + 7.0 + 5.0 + 2.0


def test_cpu_time_subtracts_directly_nested_labels() -> None:
    module = FakeEvent(MODULE_LABEL, cpu_time_total=100.0)
    overhead = FakeEvent(OVERHEAD_LABEL, cpu_time_total=4.0, cpu_parent=module)
    mha = FakeEvent(function_label("multi_head_attention_forward", 0), cpu_time_total=60.0, cpu_parent=module)
    inner_overhead = FakeEvent(OVERHEAD_LABEL, cpu_time_total=1.0, cpu_parent=mha)
    linear = FakeEvent(function_label("linear", 0), cpu_time_total=20.0, cpu_parent=mha)
    op = FakeEvent("aten::addmm", cpu_time_total=15.0, cpu_parent=linear)
    sdpa = FakeEvent(function_label("scaled_dot_product_attention", 0), cpu_time_total=25.0,
                     cpu_parent=FakeEvent("python_glue", cpu_time_total=26.0, cpu_parent=mha))

    times = attribute_cpu_time([module, overhead, mha, inner_overhead, linear, op, sdpa])

    assert times.function_us == {
        ("multi_head_attention_forward", 0): 60.0 - 1.0 - 20.0 - 25.0,
        ("linear", 0): 20.0,
        ("scaled_dot_product_attention", 0): 25.0,
    }
    assert times.module_us == pytest.approx(100.0 - 4.0 - 1.0)


# ---------------------------------------------------------------------------------------------------------
# CUDA (skipped without a GPU)
# ---------------------------------------------------------------------------------------------------------
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.cuda
@needs_cuda
def test_cuda_profile_attributes_kernel_time_to_functions() -> None:
    model = MultiHeadAttention().cuda().eval()
    x = torch.randn(5, 2, 8, device="cuda")

    result = _profiler(warmup_iterations=1, profile_iterations=2).profile(lambda t: model(F.relu(t)), [
        Sample((x,), {})], module=model)

    assert result.device == "cuda" and result.total_time_ms > 0
    assert "relu" not in result.functions
    for name in ("linear", "scaled_dot_product_attention"):
        assert result.functions[name].total_time_ms > 0
        assert result.functions[name].samples[0][1].args[0].is_cuda
    assert sum(p.total_time_ms for p in result.functions.values()) <= result.total_time_ms * (1 + 1e-9)


@pytest.mark.cuda
@needs_cuda
def test_cuda_triton_launch_outside_any_aten_op_is_attributed_to_its_label() -> None:
    import triton
    import triton.language as tl

    @triton.jit
    def add_one(pointer, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        tl.store(pointer + offsets, tl.load(pointer + offsets, mask=mask) + 1, mask=mask)

    y = torch.zeros(4096, device="cuda")
    add_one[(4,)](y, 4096, BLOCK=1024)
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        with torch.profiler.record_function(MODULE_LABEL):
            with torch.profiler.record_function(function_label("custom", 0)):
                add_one[(4,)](y, 4096, BLOCK=1024)
            y.mul_(2)
        torch.cuda.synchronize()

    times = attribute_device_time(prof.events())

    assert times.function_us.get(("custom", 0), 0.0) > 0
    assert times.module_us > times.function_us[("custom", 0)]
