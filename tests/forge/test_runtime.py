"""The runtime swaps functions only during forward, restores them always, and guards by signature."""

from __future__ import annotations

import timeit

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from forge.checking import validate
from forge.functional import original_function
from forge.plan import KernelOptimizationPlan, PlanEntry
from forge.profiler.module_profiler import ModuleFunctionKernelProfiler
from forge.runtime import KernelProviderRuntime, _matches_call, call_pattern, patched_functions
from forge.samples import Sample, signature_of, spec_sample
from tests.forge.providers_for_tests import DoublingReluProvider, FastGeluProvider, _FunctionProvider


class ReluNet(nn.Module):
    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.fail = fail
        self.seen: list = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(F.relu)
        y = F.relu(x)
        if self.fail:
            raise RuntimeError("forward failed")
        return y


def _plan(provider, *samples: Sample) -> KernelOptimizationPlan:
    provider.prepare(list(samples))
    return KernelOptimizationPlan(entries=(PlanEntry(provider=provider, signatures=samples),))


def test_provider_used_only_inside_forward_and_restored() -> None:
    x = torch.randn(4, 8)
    provider = DoublingReluProvider()
    plan = _plan(provider, Sample((x,), {}))
    net = ReluNet()
    original = F.relu
    with plan.apply(net) as runtime:
        assert F.relu is original  # not patched outside forward
        out = net(x)
        assert F.relu is original
        assert runtime.is_active
    assert provider.calls == 1
    assert net.seen[-1] is not original and net.seen[-1].__name__ == "relu"
    assert torch.equal(out, torch.relu(x))
    assert not net._forward_pre_hooks and not net._forward_hooks
    net(x)
    assert provider.calls == 1  # plan no longer applied


def test_restored_after_forward_raises() -> None:
    x = torch.randn(4, 8)
    provider = DoublingReluProvider()
    plan = _plan(provider, Sample((x,), {}))
    net = ReluNet(fail=True)
    before = dict(vars(F))
    with plan.apply(net), pytest.raises(RuntimeError, match="forward failed"):
        net(x)
    assert provider.calls == 1
    after = dict(vars(F))
    assert before.keys() == after.keys()
    assert all(before[k] is after[k] for k in before)


def test_signature_guard_falls_back_on_unvalidated_signatures() -> None:
    x = torch.randn(4, 8)
    provider = DoublingReluProvider()
    plan = _plan(provider, Sample((x,), {}))
    net = ReluNet()
    with plan.apply(net) as runtime:
        net(torch.randn(4, 8))  # same signature, new values: provider
        net(torch.randn(5, 8))  # other shape: fallback
        net(torch.randn(4, 8, dtype=torch.float64))  # other dtype: fallback
        net(torch.randn(8, 4).t())  # other strides: fallback
    stats = runtime.stats["relu"]
    assert provider.calls == 1
    assert stats.provider_calls == 1 and stats.fallback_calls == 3


def test_guard_falls_back_on_tensor_subclasses() -> None:
    x = torch.randn(4, 8)
    provider = DoublingReluProvider()
    plan = _plan(provider, Sample((x,), {}))

    class Marked(torch.Tensor):
        pass

    net = ReluNet()
    with plan.apply(net) as runtime:
        net(x.as_subclass(Marked))  # same signature, but not a plain tensor: never validated on it
        net(nn.Parameter(x.clone(), requires_grad=False))  # parameters are plain enough
    assert provider.calls == 1 and runtime.stats["relu"].fallback_calls >= 1  # a subclass re-enters F once more


def test_guard_falls_back_when_grad_is_needed() -> None:
    x = torch.randn(4, 8)
    provider = DoublingReluProvider()
    plan = _plan(provider, Sample((x,), {}))
    net = ReluNet()
    runtime = KernelProviderRuntime(net, plan)
    runtime.activate()
    try:
        y = net(x.clone().requires_grad_())
        y.sum().backward()  # the original op has a backward; the provider would not be used here
    finally:
        runtime.deactivate()
    assert provider.calls == 0


def test_nested_and_reentrant_forwards_restore_lifo() -> None:
    x = torch.randn(4, 8)

    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = ReluNet()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(F.relu(x))

    outer = Outer()
    outer_provider, inner_provider = DoublingReluProvider(), DoublingReluProvider()
    outer_plan = _plan(outer_provider, Sample((x,), {}))
    inner_plan = _plan(inner_provider, Sample((x,), {}))
    original = F.relu
    with outer_plan.apply(outer), inner_plan.apply(outer.inner):
        outer(x)
        assert F.relu is original
    assert outer_provider.calls == 1 and inner_provider.calls == 1
    assert F.relu is original


class InterruptedNet(nn.Module):
    """Calls relu, then raises a BaseException that is not an Exception (Ctrl-C, sys.exit)."""

    def __init__(self, error: type[BaseException]) -> None:
        super().__init__()
        self.error = error

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        F.relu(x)
        raise self.error()


@pytest.mark.parametrize("error", [KeyboardInterrupt, SystemExit, GeneratorExit])
def test_base_exceptions_in_forward_restore_functional(error: type[BaseException]) -> None:
    x = torch.randn(4, 8)
    provider = DoublingReluProvider()
    plan = _plan(provider, Sample((x,), {}))
    net = InterruptedNet(error)
    before = dict(vars(F))
    runtime = KernelProviderRuntime(net, plan)
    runtime.activate()  # no context manager: only the forward wrapper can restore
    try:
        with pytest.raises(error):
            net(x)
        assert provider.calls == 1
        assert all(vars(F)[k] is v for k, v in before.items()) and patched_functions() == {}
        F.relu(x)  # this thread is outside the model again: stock PyTorch
        assert provider.calls == 1
        net.error = RuntimeError
        with pytest.raises(RuntimeError):
            net(x)  # the runtime still works after the interrupt
        assert provider.calls == 2
    finally:
        runtime.deactivate()
    assert F.relu is before["relu"]


def test_interrupt_in_inner_module_caught_by_outer_forward_restores_the_outer_plan() -> None:
    x = torch.randn(4, 8)

    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = InterruptedNet(KeyboardInterrupt)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            try:
                self.inner(x)
            except KeyboardInterrupt:
                pass
            return F.relu(x)

    outer = Outer()
    outer_provider, inner_provider = DoublingReluProvider(), DoublingReluProvider()
    with _plan(outer_provider, Sample((x,), {})).apply(outer), _plan(inner_provider, Sample((x,), {})).apply(
        outer.inner
    ):
        outer(x)
    assert inner_provider.calls == 1 and outer_provider.calls == 1
    assert patched_functions() == {}


def test_forward_wrapper_is_removed_and_leaves_no_hooks() -> None:
    x = torch.randn(4, 8)
    plan = _plan(DoublingReluProvider(), Sample((x,), {}))
    net = ReluNet()
    runtime = KernelProviderRuntime(net, plan)
    runtime.activate()
    runtime.activate()  # idempotent
    assert "forward" in vars(net) and runtime.is_active
    assert not net._forward_pre_hooks and not net._forward_hooks  # make_graphed_callables refuses hooked modules
    runtime.deactivate()
    runtime.deactivate()
    assert "forward" not in vars(net) and not runtime.is_active


def test_instance_forward_is_restored_and_a_later_wrapper_is_kept() -> None:
    x = torch.randn(4, 8)
    provider = DoublingReluProvider()
    plan = _plan(provider, Sample((x,), {}))
    net = ReluNet()
    own = net.forward
    net.forward = own  # an instance attribute that was there before the plan
    runtime = KernelProviderRuntime(net, plan)
    runtime.activate()
    wrapper = net.forward
    runtime.deactivate()
    assert vars(net)["forward"] is own

    runtime.activate()
    later = vars(net)["forward"]

    def graphed(*args):  # what make_graphed_callables does: wraps the current forward
        return later(*args)

    net.forward = graphed
    runtime.deactivate()  # cannot unwrap under someone else's wrapper: becomes a pass-through
    assert vars(net)["forward"] is graphed and wrapper is not later
    assert torch.equal(net(x), torch.relu(x)) and provider.calls == 0 and patched_functions() == {}


def test_provider_error_at_runtime_falls_back() -> None:
    x = torch.randn(4, 8)

    class Broken(DoublingReluProvider, type_name="test_broken_relu"):
        def _call(self, x, inplace=False):
            raise RuntimeError("boom")

    plan = _plan(Broken(), Sample((x,), {}))
    net = ReluNet()
    with plan.apply(net) as runtime:
        out = net(x)
    assert torch.equal(out, torch.relu(x))
    assert runtime.stats["relu"].provider_errors == 1


def test_apply_runs_under_no_grad_and_restores_grad_mode() -> None:
    x = torch.randn(4, 8)
    plan = _plan(FastGeluProvider(), Sample((x,), {}))
    assert torch.is_grad_enabled()
    with plan.apply(nn.GELU()):
        assert not torch.is_grad_enabled()
    assert torch.is_grad_enabled()


def test_dispatch_overhead_is_measured() -> None:
    """Guard + routing cost per planned call over calling the provider directly, as a forward pays it (under
    `torch.no_grad()`, as `plan.apply` runs). Printed; the target (< 2 us) lives in BENCHMARKS.md, not in an assert.
    """
    x = torch.randn(4, 8)
    provider = DoublingReluProvider()
    plan = _plan(provider, Sample((x,), {}))
    n = 20000
    timings: dict[str, float] = {}

    class Timed(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            relu = F.relu  # the router, as model code sees it
            timings["routed"] = min(timeit.repeat(lambda: relu(x), number=n, repeat=3)) / n
            timings["direct"] = min(timeit.repeat(lambda: provider(x), number=n, repeat=3)) / n
            return x

    net = Timed()
    with plan.apply(net):
        net(x)
    print(f"dispatch overhead: {(timings['routed'] - timings['direct']) * 1e6:.2f} us per call")
    assert provider.calls == 6 * n


# ---------------------------------------------------------------------------------------------------------
# Storage offset and alignment (issue 10) and torch.Size arguments
# ---------------------------------------------------------------------------------------------------------
class OffsetBlindReluProvider(_FunctionProvider, type_name="test_offset_blind_relu"):
    """relu that reads its input from the start of its storage: exact on fresh tensors, wrong on `x[1:]` of a larger
    buffer (the kernel of issue 10, item 4)."""

    function_name = "relu"

    def _call(self, x: torch.Tensor, inplace: bool = False) -> torch.Tensor:
        self.calls += 1
        start = torch.empty(0, dtype=x.dtype, device=x.device).set_(x.untyped_storage(), 0, x.shape, x.stride())
        return torch.clamp_min(start, 0)


def test_offset_view_runs_pytorch_when_only_fresh_tensors_were_validated() -> None:
    fresh, buf = torch.randn(4, 8), torch.randn(5, 8)
    provider = OffsetBlindReluProvider()
    provider.prepare([Sample((fresh,), {})])
    assert validate(original_function("relu"), provider, [Sample((fresh,), {})]) == []  # fooled on fresh tensors
    plan = _plan(provider, Sample((fresh,), {}))
    net = ReluNet()
    before = provider.calls
    with plan.apply(net) as runtime:
        out = net(buf[1:])
    assert torch.equal(out, torch.relu(buf[1:]))
    assert provider.calls == before and runtime.stats["relu"].fallback_calls == 1
    assert not torch.equal(provider(buf[1:]), torch.relu(buf[1:]))  # what it would have returned


def test_validation_of_a_captured_offset_view_draws_offset_views() -> None:
    buf = torch.randn(5, 8)
    sample = Sample((buf[1:],), {})
    provider = OffsetBlindReluProvider()
    provider.prepare([sample])
    errors = validate(original_function("relu"), provider, [sample])
    assert any("(captured)" in e for e in errors) and any("(fresh #1)" in e for e in errors)
    spec_only = spec_sample(sample)  # a plan's signature: fresh inputs are views at offset 8 as well
    assert any("(fresh #1)" in e for e in validate(original_function("relu"), provider, [spec_only]))


def test_offset_validated_signature_serves_views_of_its_address_class_only() -> None:
    fresh, buf = torch.randn(4, 8), torch.randn(6, 8)
    provider = DoublingReluProvider()
    plan = _plan(provider, Sample((fresh,), {}), Sample((buf[1:5],), {}))
    misaligned = torch.randn(40)[1:33].view(4, 8)  # offset 1: 4 bytes past a 16-byte boundary
    net = ReluNet()
    with plan.apply(net) as runtime:
        for x in (fresh, buf[1:5], buf[2:], misaligned):
            assert torch.equal(net(x), torch.relu(x))
    assert provider.calls == 3 and runtime.stats["relu"].fallback_calls == 1


def test_traced_guard_agrees_with_signature_of_on_offsets_and_sizes() -> None:
    fresh, buf, flat = torch.randn(4, 8), torch.randn(6, 8), torch.randn(40)
    tensors = [fresh, buf[1:5], buf[2:], flat[1:33].view(4, 8), flat[4:36].view(4, 8), buf[:4]]
    calls = [Sample((t, torch.Size([8])), {}) for t in tensors] + [Sample((t, (8,)), {}) for t in tensors]
    calls += [Sample((fresh, [8]), {})]
    for template in calls:
        pattern = call_pattern(spec_sample(template))
        for call in calls:
            expected = signature_of(call.args, call.kwargs) == signature_of(template.args, template.kwargs)
            assert _matches_call(call.args, call.kwargs, pattern) == expected, (template.describe(), call.describe())


def test_offset_views_under_compile_reach_only_signatures_of_their_address_class() -> None:
    """Dynamo neither reads nor guards the offset (one graph serves `x` and `x[1:]`): the op's run-time check sends
    each call to the validated signature of its own address class, or to PyTorch."""
    import torch._dynamo

    class PlainReluNet(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.relu(x)

    graphs: list[torch.fx.GraphModule] = []

    def recording(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        graphs.append(gm)
        return gm.forward

    fresh, buf = torch.randn(4, 8), torch.randn(6, 8)
    blind, honest = OffsetBlindReluProvider(), DoublingReluProvider()
    torch._dynamo.reset()
    try:
        net = PlainReluNet()
        compiled = torch.compile(net, backend=recording)
        with _plan(blind, Sample((fresh,), {})).apply(net) as runtime:
            assert torch.equal(compiled(fresh), torch.relu(fresh))
            assert torch.equal(compiled(buf[1:5]), torch.relu(buf[1:5]))
        assert blind.calls == 1 and runtime.stats["relu"].fallback_calls == 1
        torch._dynamo.reset()
        net = PlainReluNet()
        compiled = torch.compile(net, backend=recording)
        with _plan(honest, Sample((fresh,), {}), Sample((buf[1:5],), {})).apply(net) as runtime:
            for x in (fresh, buf[1:5], buf[2:], torch.randn(40)[1:33].view(4, 8)):
                assert torch.equal(compiled(x), torch.relu(x))
        assert honest.calls == 3 and runtime.stats["relu"].fallback_calls == 1
    finally:
        torch._dynamo.reset()
    # every call went through the provider's op (not an eager fallback of a broken graph)
    assert graphs and all(any(str(n.target).startswith("kforge.") for n in g.graph.nodes) for g in graphs)


class MarkedLayerNormProvider(_FunctionProvider, type_name="test_marked_layer_norm"):
    """Exact layer_norm (PyTorch's), counting calls."""

    function_name = "layer_norm"

    def _call(self, x, normalized_shape, weight=None, bias=None, eps=1e-5) -> torch.Tensor:
        self.calls += 1
        return original_function("layer_norm")(x, normalized_shape, weight, bias, eps)


class SizeNormNet(nn.Module):
    """Passes `x.shape[-1:]` (a torch.Size) as normalized_shape, as much model code does."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(width))
        self.bias = nn.Parameter(torch.randn(width))
        self.as_tuple = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = tuple(x.shape[-1:]) if self.as_tuple else x.shape[-1:]
        return F.layer_norm(x, shape, self.weight, self.bias, 1e-5)


def test_layer_norm_called_with_a_torch_size_uses_the_provider_after_profile_save_and_load(tmp_path) -> None:
    net, x = SizeNormNet(64), torch.randn(3, 64)
    profile = ModuleFunctionKernelProfiler({"layer_norm"}, warmup_iterations=0).profile(net, [Sample((x,), {})])
    samples = [s for _, s in profile.functions["layer_norm"].samples]
    assert len(samples) == 1 and type(samples[0].args[1]) is torch.Size  # the clone kept the Size
    provider = MarkedLayerNormProvider()
    _plan(provider, *samples).save(tmp_path / "plan.json")
    plan = KernelOptimizationPlan.load(tmp_path / "plan.json")
    with plan.apply(net) as runtime:
        y = net(torch.randn(3, 64))
        net.as_tuple = True  # PyTorch takes a tuple wherever a Size goes: the same validated call
        net(torch.randn(3, 64))
    loaded = plan.entries[0].provider
    assert loaded.calls == 2 and runtime.stats["layer_norm"].fallback_calls == 0
    assert y.shape == (3, 64)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("compiled", [False, True])
def test_offset_views_on_cuda_reach_only_offset_validated_signatures(compiled: bool) -> None:
    """On the GPU (CUDA allocations are 512-byte aligned; Inductor may copy misaligned graph inputs): a view at an
    offset runs PyTorch unless a signature of its address class was validated, eager and under Inductor."""
    import torch._dynamo

    class PlainReluNet(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.relu(x)

    fresh, buf = torch.randn(64, 128, device="cuda"), torch.randn(66, 128, device="cuda")
    blind, honest = OffsetBlindReluProvider(), DoublingReluProvider()
    torch._dynamo.reset()
    try:
        for provider, samples, expected in (
            (blind, (Sample((fresh,), {}),), 1),
            (honest, (Sample((fresh,), {}), Sample((buf[1:65],), {})), 3),
        ):
            torch._dynamo.reset()
            net = PlainReluNet()
            run = torch.compile(net) if compiled else net
            with _plan(provider, *samples).apply(net):
                for x in (fresh, buf[1:65], buf[2:]):
                    assert torch.equal(run(x), torch.relu(x))
            torch.cuda.synchronize()
            assert provider.calls == expected
    finally:
        torch._dynamo.reset()
