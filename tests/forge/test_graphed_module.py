"""Blocks replayed from CUDA graphs in eager execution (`forge.providers.graphed_module`): which blocks a model has
(`ModuleProfile.outermost_blocks`, on the CPU), the provider's refusal and saved form on the CPU, and on a GPU the
replay itself with every fallback, inside an applied plan with a module kernel captured into the block's graph.

The CUDA tests skip without a device; on the GPU host: `python -m pytest -q -m cuda tests/forge/test_graphed_module.py`.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from forge.end_to_end import ModelRunner
from forge.modules import ModuleKernelProvider, class_name, instance_key, module_target_name
from forge.optimizer import KernelOptimizer
from forge.plan import KernelOptimizationPlan, PlanEntry
from forge.profiler.modules import profile_modules
from forge.provider import KernelProvider
from forge.providers import GraphedModuleProvider
from forge.samples import Sample

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


class Norm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.rand(dim) + 0.5)

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class Layer(nn.Module):
    """A decoder-layer-like block: norm, projection, activation, residual."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = Norm(dim)
        self.up = nn.Linear(dim, 2 * dim)
        self.down = nn.Linear(2 * dim, dim)

    def forward(self, x, scale: float = 1.0):
        return x + scale * self.down(F.silu(self.up(self.norm(x))))


class Backbone(nn.Module):
    def __init__(self, dim: int, depth: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Layer(dim) for _ in range(depth))
        self.norm = Norm(dim)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class Model(nn.Module):
    def __init__(self, dim: int = 32, depth: int = 3) -> None:
        super().__init__()
        self.embed = nn.Linear(dim, dim)
        self.body = Backbone(dim, depth)
        self.head = nn.Linear(dim, 8)

    def forward(self, x):
        return self.head(self.body(self.embed(x)))


def _profile(model, x):
    runner = ModelRunner(model, [Sample((x,), {})])
    with torch.no_grad():
        runner()
        return profile_modules(runner, model, device=x.device, passes=3)


def _cpu_model():
    """Layers that hold nearly all the time, with ops long enough (milliseconds) that a preempted one rarely moves
    the shares (at 0.7 ms a pass, a CI run under load once saw the layers hold 30% of it)."""
    return Model(dim=256, depth=6).eval(), torch.randn(256, 256)


def test_the_outermost_blocks_are_found_below_the_backbone_and_not_a_class_that_is_also_inside_them():
    model, x = _cpu_model()
    profile = _profile(model, x)
    blocks = profile.outermost_blocks(model, min_share_percent=1.0, backbone_share=0.25)
    assert class_name(Layer) in blocks  # below the backbone (called once, most of the time) and its ModuleList
    assert class_name(Norm) not in blocks  # the final norm is outermost, but its siblings sit inside the layers
    assert class_name(nn.Linear) not in blocks  # embed and head are Linears, as inside the layers
    assert class_name(Backbone) not in blocks and class_name(Model) not in blocks


def test_a_block_under_the_share_is_not_one():
    model, x = _cpu_model()
    profile = _profile(model, x)
    assert profile.outermost_blocks(model, min_share_percent=100.0) == []


def test_the_selection_clock_sees_the_share_of_the_kernel_time_inside_the_blocks():
    from forge.execution import Execution
    from forge.optimizer import _Run

    model, x = _cpu_model()
    profile = _profile(model, x)
    optimizer = KernelOptimizer(kernel_providers=[], end_to_end_check=False)
    optimizer._run = _Run(Execution.EAGER, {}, optimizer.kernel_utils)
    optimizer._run.module_profile = profile
    optimizer._run.graph_blocks = optimizer._graph_block_classes(model, "cuda")  # as make_plan does, once
    blocks = profile.outermost_blocks(model, min_share_percent=1.0)  # the layers, or under load the backbone
    inclusive = profile.frame.set_index("module_class")["inclusive_ms"]
    share = optimizer._graph_block_share()
    assert blocks and share == pytest.approx(sum(inclusive[name] for name in blocks) / profile.total_ms)
    assert 0.0 < share <= 1.0
    optimizer.graph_blocks = False
    optimizer._run.graph_blocks = optimizer._graph_block_classes(model, "cuda")
    assert optimizer._graph_block_share() == 0.0


@pytest.mark.parametrize(
    ("make", "dense"),
    [
        (lambda: torch.randn(4, 6), True),
        (lambda: torch.randn(4, 6).t(), True),  # a permutation still fills its storage once
        (lambda: torch.randn(2, 3, 4).permute(2, 0, 1), True),
        (lambda: torch.randn(4, 1, 6), True),
        (lambda: torch.randn(1), True),
        (lambda: torch.randn(4, 6)[:, :3], False),  # a gap between rows
        (lambda: torch.randn(4, 6)[::2], False),
        (lambda: torch.randn(6).expand(4, 6), False),  # rows overlap
        (lambda: torch.randn(4, 1).expand(4, 6), False),
    ],
)
def test_a_static_copy_keeps_the_layout_only_of_a_dense_non_overlapping_argument(make, dense):
    from forge.providers.graphed_module import _is_dense

    assert _is_dense(make()) is dense


def test_a_graphed_forward_reads_its_block_tensors_again_after_a_parameter_or_buffer_is_re_bound():
    from forge.providers.graphed_module import GraphedForward

    layer = Layer(8).eval()
    forward = GraphedForward(layer, pool=None)
    before = forward._tensors_now()
    assert forward._tensors_now() is before  # nothing registered since: the list is not rebuilt on a call
    layer.down.weight = nn.Parameter(torch.zeros_like(layer.down.weight))
    assert any(t is layer.down.weight for t in forward._tensors_now())
    layer.norm.register_buffer("scale", torch.ones(8))
    assert any(t is layer.norm.scale for t in forward._tensors_now())
    layer.requires_grad_(False)
    layer.up.bias = nn.Parameter(torch.zeros(16))  # requires grad: autograd would record a replay
    forward._tensors_now()
    assert forward._needs_grad


def test_on_the_cpu_the_provider_refuses_with_the_reason_and_the_optimizer_tries_no_block():
    model = Model().eval()
    layer = model.body.layers[0]
    provider = GraphedModuleProvider(class_name(layer))
    assert not provider.prepare_instances([layer], [Sample((torch.randn(4, 32),), {})])
    assert provider.error == "CUDA graphs need a CUDA device"
    if torch.cuda.is_available():
        return
    optimizer = KernelOptimizer(kernel_providers=[], end_to_end_check=False)
    result = optimizer.optimize(model, [Sample((torch.randn(4, 32),), {})])
    assert result.graph_blocks == () and len(result.plan) == 0


def test_a_graphed_entry_is_saved_and_loaded_with_its_instances(tmp_path):
    layer = Layer(32).eval()
    provider = GraphedModuleProvider(class_name(layer))
    provider.instance_keys = frozenset({instance_key(layer)})
    provider._ready = True
    plan = KernelOptimizationPlan(entries=(PlanEntry(provider=provider, signatures=(Sample((torch.randn(4, 32),),
                                                                                            {}),)),))
    loaded = KernelOptimizationPlan.load(plan.save(tmp_path / "graphed.plan.json")).entries[0].provider
    assert isinstance(loaded, GraphedModuleProvider) and not type(loaded).carries_code  # nothing to sign
    assert loaded.serves(layer) and loaded.supported_function == module_target_name(layer)
    assert not loaded.serves(Layer(16).eval())
    assert isinstance(KernelProvider.from_dict(provider.to_dict()), GraphedModuleProvider)


# -- on a GPU ----------------------------------------------------------------------------------------------
@cuda
@pytest.mark.cuda
def test_a_replay_computes_what_the_forward_does_and_never_overwrites_an_output_it_returned():
    layer = Layer(64).cuda().eval()
    provider = GraphedModuleProvider(class_name(layer))
    x = torch.randn(8, 64, device="cuda")
    assert provider.prepare_instances([layer], [Sample((x,), {})]), provider.error
    forward = provider.bind(layer)
    with torch.no_grad():
        inputs = [torch.randn(8, 64, device="cuda") for _ in range(3)]
        outputs = [forward(t) for t in inputs]
        expected = [layer(t) for t in inputs]
    assert len(forward.graphs) == 1  # one signature, one capture, three replays
    for got, want in zip(outputs, expected, strict=True):
        torch.testing.assert_close(got, want)
    with torch.no_grad():  # another plain value is another signature: its own graph
        torch.testing.assert_close(forward(inputs[0], scale=0.5), layer(inputs[0], scale=0.5))
    assert len(forward.graphs) == 2


@cuda
@pytest.mark.cuda
def test_the_original_forward_serves_grad_a_cpu_argument_and_a_forward_that_writes_its_input():
    layer = Layer(64).cuda().eval()
    forward = GraphedModuleProvider(class_name(layer)).bind(layer)
    x = torch.randn(8, 64, device="cuda")
    out = forward(x)  # grad enabled, parameters require grad: autograd must record it
    assert out.requires_grad and not forward.graphs

    class Writes(nn.Module):
        def forward(self, x):
            x.mul_(2)
            return x + 1

    writes = Writes().cuda()
    forward = GraphedModuleProvider(class_name(writes)).bind(writes)
    y = torch.ones(4, device="cuda")
    with torch.no_grad():
        assert torch.equal(forward(y), torch.full((4,), 3.0, device="cuda"))
    assert torch.equal(y, torch.full((4,), 2.0, device="cuda"))  # the caller's tensor was written, as eagerly
    assert not forward.graphs and "writes to one of its inputs" in next(iter(forward.refused.values()))

    class Mixed(nn.Module):
        def forward(self, x, table):
            return x + table.to(x.device)

    mixed = Mixed()
    forward = GraphedModuleProvider(class_name(mixed)).bind(mixed)
    with torch.no_grad():
        assert torch.equal(forward(torch.zeros(3, device="cuda"), torch.ones(3)), torch.ones(3, device="cuda"))
    assert not forward.graphs and "on cpu" in next(iter(forward.refused.values()))


@cuda
@pytest.mark.cuda
def test_a_forward_that_synchronises_is_refused_when_prepared():
    class Syncs(nn.Module):
        def forward(self, x):
            return x * float(x.sum())

    syncs = Syncs().cuda()
    provider = GraphedModuleProvider(class_name(syncs))
    assert not provider.prepare_instances([syncs], [Sample((torch.randn(4, device="cuda"),), {})])
    assert provider.error.startswith("capture failed")
    with torch.no_grad():  # and the process can still capture and run
        layer = Layer(16).cuda().eval()
        forward = GraphedModuleProvider(class_name(layer)).bind(layer)
        x = torch.randn(2, 16, device="cuda")
        torch.testing.assert_close(forward(x), layer(x))


@cuda
@pytest.mark.cuda
def test_a_rebound_parameter_is_read_after_the_capture_again():
    layer = Layer(32).cuda().eval()
    forward = GraphedModuleProvider(class_name(layer)).bind(layer)
    x = torch.randn(4, 32, device="cuda")
    with torch.no_grad():
        forward(x)
        layer.down.weight = nn.Parameter(torch.zeros_like(layer.down.weight))
        layer.down.bias = nn.Parameter(torch.zeros_like(layer.down.bias))
        torch.testing.assert_close(forward(x), x)


class CountingNorm(ModuleKernelProvider, type_name="test_graphed_counting_norm"):
    """The norm's math, counting its calls: run once per capture, never per replay."""

    calls = 0

    def _bind(self, module):
        def forward(x):
            CountingNorm.calls += 1
            return module.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return forward

    def _prepare_instances(self, instances, samples, counts=None):
        return True

    def _to_dict(self):
        return {"target_class": self.target_class}

    @classmethod
    def _from_dict(cls, state):
        return cls(state["target_class"])


@cuda
@pytest.mark.cuda
def test_an_applied_plan_captures_its_module_kernels_into_the_block_graph():
    model = Model(dim=64, depth=3).cuda().eval()
    x = torch.randn(16, 64, device="cuda")
    layers = list(model.body.layers)
    with torch.no_grad():
        expected = model(x)
        layer_calls, norm_calls = [], []
        hooks = [layer.register_forward_pre_hook(lambda m, a: layer_calls.append(a)) for layer in layers]
        hooks += [layer.norm.register_forward_pre_hook(lambda m, a: norm_calls.append(a)) for layer in layers]
        model(x)
        for hook in hooks:
            hook.remove()
    graphed = GraphedModuleProvider(class_name(Layer))
    assert graphed.prepare_instances(layers, [Sample(layer_calls[0], {})]), graphed.error
    norm = CountingNorm(class_name(Norm))
    norm.prepare_instances([layer.norm for layer in layers], [Sample(norm_calls[0], {})])
    plan = KernelOptimizationPlan(entries=(
        PlanEntry(provider=norm, signatures=(Sample(norm_calls[0], {}),)),
        PlanEntry(provider=graphed, signatures=(Sample(layer_calls[0], {}),)),
    ))
    CountingNorm.calls = 0
    runtime = plan.runtime(model)
    with torch.no_grad():
        for _ in range(4):
            with runtime.applied():
                torch.testing.assert_close(model(x), expected)
    # each layer's norm ran at its layer's warm-up and capture only (2 + 1 runs), and the final norm once a pass
    assert CountingNorm.calls == len(layers) * 3 + 4
    assert runtime.stats[graphed.supported_function].provider_calls == 4 * len(layers)
    bound = {id(sub): replacement for sub, entry, _, replacement in runtime._served if entry is plan.entries[1]}
    assert all(bound[id(layer)].graphs for layer in layers)


class Masked(nn.Module):
    def forward(self, x, mask=None):
        return x if mask is None else x * mask


class MasksWhenCaptured(nn.Module):
    """Calls its inner module as transformers 5.17 calls `LlamaAttention`: an explicit mask inside a CUDA-graph
    capture, None outside one."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = Masked()

    def forward(self, x):
        mask = (x > 0).to(x.dtype) if torch.cuda.is_current_stream_capturing() else None
        return self.inner(x, mask=mask)


@cuda
@pytest.mark.cuda
def test_module_calls_are_recorded_as_the_model_runs_inside_a_capture_with_their_values():
    from forge.modules import recorded_calls

    model = MasksWhenCaptured().cuda().eval()
    x = torch.randn(4, 8, device="cuda")
    name = module_target_name(Masked)
    eager = recorded_calls(lambda: model(x), model, {name})[name]
    captured = recorded_calls(lambda: model(x), model, {name}, captured=True)[name]
    (eager_sample,), = eager.samples.values()
    (captured_sample,), = captured.samples.values()
    assert eager_sample.kwargs["mask"] is None
    torch.testing.assert_close(captured_sample.args[0], x)  # the replay filled the recorded copies
    torch.testing.assert_close(captured_sample.kwargs["mask"], (x > 0).float())


class SoftmaxWhenCaptured(nn.Module):
    """Calls an F function with another signature inside a capture (as transformers 5.17 calls SDPA with a mask)."""

    def forward(self, x):
        if torch.cuda.is_current_stream_capturing():
            return F.softmax(x * 2.0, dim=-1, dtype=torch.float32)
        return F.softmax(x, dim=-1)


@cuda
@pytest.mark.cuda
def test_a_cuda_graphs_plan_judges_f_calls_on_the_calls_made_inside_a_capture():
    model = SoftmaxWhenCaptured().cuda().eval()
    x = torch.randn(4, 8, device="cuda", dtype=torch.float16)
    optimizer = KernelOptimizer(kernel_providers=[], end_to_end_check=False)
    calls = optimizer._captured_function_calls(model, [Sample((x,), {})], model, {"softmax"})
    ((count, sample),) = calls["softmax"]
    assert count == 1 and sample.kwargs["dtype"] == torch.float32
    torch.testing.assert_close(sample.args[0], x * 2.0)  # the replay filled the recorded copy


def test_a_model_that_cannot_be_captured_keeps_its_eager_f_calls_saying_why(caplog):
    if torch.cuda.is_available():
        pytest.skip("on a GPU the model is captured (the test above)")
    model = SoftmaxWhenCaptured().eval()
    optimizer = KernelOptimizer(kernel_providers=[], end_to_end_check=False)
    with caplog.at_level("WARNING", logger="forge.optimizer"):
        calls = optimizer._captured_function_calls(model, [Sample((torch.randn(4, 8),), {})], model, {"softmax"})
    assert calls == {} and "its F calls are judged on the eager calls" in caplog.text
