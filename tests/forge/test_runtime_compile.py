"""Plans under `torch.compile`: each validated call is one custom-op node, no graph break, the guard still holds."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
from torch import nn
from torch._dynamo.testing import CompileCounterWithBackend
from torch._dynamo.utils import counters

from forge.custom_ops import NAMESPACE, provider_op
from forge.plan import KernelOptimizationPlan, PlanEntry
from forge.runtime import _matches_call, call_pattern
from forge.samples import Sample, TensorSpec, signature_of, spec_sample
from tests.forge.providers_for_tests import DoublingReluProvider, _FunctionProvider


class TransposedSoftmaxProvider(_FunctionProvider, type_name="test_transposed_softmax"):
    """Correct values, but returned in column-major memory (PyTorch returns row-major)."""

    function_name = "softmax"

    def _call(self, x: torch.Tensor, dim: int | None = None, **kwargs: Any) -> torch.Tensor:
        self.calls += 1
        return torch.softmax(x.t().contiguous(), dim=0).t()


class IdentityReluProvider(_FunctionProvider, type_name="test_identity_relu"):
    """Returns its input: right only for non-negative inputs, and the output aliases the input."""

    function_name = "relu"

    def _call(self, x: torch.Tensor, inplace: bool = False) -> torch.Tensor:
        self.calls += 1
        return x


class Net(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x * 2 + 1) - 3


class SoftmaxNet(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the add after softmax reads the op's output by the strides the fake implementation promised
        return F.softmax(x * 3, dim=-1) + torch.arange(x.shape[-1], dtype=x.dtype)


def _plan(provider, *samples: Sample) -> KernelOptimizationPlan:
    provider.prepare(list(samples))
    return KernelOptimizationPlan(entries=(PlanEntry(provider=provider, signatures=samples),))


class Recorder:
    """A Dynamo backend that keeps every graph it is given and runs it as traced (no Inductor)."""

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Any:
        self.graphs.append(gm)
        return gm.forward

    def op_nodes(self) -> list[str]:
        return [str(n.target) for g in self.graphs for n in g.graph.nodes if f"{NAMESPACE}." in str(n.target)]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def test_compiled_forward_has_one_op_node_and_no_graph_break() -> None:
    x = torch.randn(4, 8)
    provider = DoublingReluProvider()
    plan = _plan(provider, Sample((x,), {}))
    net, recorder = Net(), Recorder()
    compiled = torch.compile(net, backend=recorder)
    with plan.apply(net) as runtime:
        out = compiled(x)
        out2 = compiled(x + 1)
    assert torch.equal(out, Net()(x)) and torch.equal(out2, Net()(x + 1))
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert len(recorder.graphs) == 1 and len(recorder.op_nodes()) == 1
    assert provider.calls == 2 and runtime.stats["relu"].provider_calls == 2


def test_compile_with_fullgraph_inside_the_applied_block() -> None:
    x = torch.randn(4, 8)
    provider = DoublingReluProvider()
    plan = _plan(provider, Sample((x,), {}))
    net, recorder = Net(), Recorder()
    with plan.apply(net):
        out = torch.compile(net, backend=recorder, fullgraph=True)(x)
    assert torch.equal(out, Net()(x)) and provider.calls == 1 and len(recorder.op_nodes()) == 1


def test_guard_holds_under_compile_with_dynamic_shapes() -> None:
    x = torch.randn(4, 8)
    provider = DoublingReluProvider()
    plan = _plan(provider, Sample((x,), {}))
    net = Net()
    compiled = torch.compile(net, backend="aot_eager")  # lowered to ATen: only the op can reach the provider
    with plan.apply(net):
        compiled(x)
        for shape in [(5, 8), (6, 8), (7, 8)]:  # the second new shape makes Dynamo mark the size dynamic
            y = torch.randn(*shape)
            assert torch.equal(compiled(y), Net()(y))
        compiled(torch.randn(8, 4).t())  # validated shape, other strides
        compiled(x.double())
        assert provider.calls == 1
        compiled(torch.randn(4, 8))  # the validated signature again
    assert provider.calls == 2
    assert not counters["graph_break"]


def test_compiled_model_outside_the_plan_runs_stock_pytorch() -> None:
    x = torch.randn(4, 8)
    provider = DoublingReluProvider()
    plan = _plan(provider, Sample((x,), {}))
    net = Net()
    compiled = torch.compile(net, backend=Recorder())
    with plan.apply(net):
        compiled(x)
    assert provider.calls == 1
    assert torch.equal(compiled(x), Net()(x))
    assert provider.calls == 1 and F.relu is torch.nn.functional.relu
    with plan.apply(net):
        compiled(x)  # back under the plan: Dynamo's cached entry for the plan is still valid
    assert provider.calls == 2


def test_graph_break_inside_model_code_keeps_the_plan() -> None:
    x = torch.randn(4, 8)
    provider = DoublingReluProvider()
    plan = _plan(provider, Sample((x,), {}))

    class Breaking(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = F.relu(x)
            torch._dynamo.graph_break()
            return F.relu(y - 1)

    net = Breaking()
    with plan.apply(net):
        out = torch.compile(net, backend=Recorder())(x)
    assert torch.equal(out, torch.relu(torch.relu(x) - 1)) and provider.calls == 2


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_backends_keep_provider_and_promised_strides(backend: str) -> None:
    x = torch.randn(4, 8)
    provider = TransposedSoftmaxProvider()
    plan = _plan(provider, Sample((x * 3,), {"dim": -1}))
    net = SoftmaxNet()
    counter = CompileCounterWithBackend(backend)
    with plan.apply(net) as runtime:
        out = torch.compile(net, backend=counter)(x)
    torch.testing.assert_close(out, SoftmaxNet()(x))
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counter.frame_count == 1
    assert provider.calls == 1 and runtime.stats["softmax"].provider_calls == 1


def test_op_output_never_aliases_an_input_nor_breaks_its_promised_layout() -> None:
    x = torch.rand(4, 8) + 0.5
    provider = IdentityReluProvider()
    provider.prepare([Sample((x,), {})])
    op = provider_op(provider)
    assert op is not None and op is provider_op(provider)  # one op per provider object
    index = op.register(spec_sample(Sample((x,), {})))
    assert index is not None and index == op.register(spec_sample(Sample((x,), {})))
    (out,) = op.op([x], index)
    assert torch.equal(out, x) and out.data_ptr() != x.data_ptr()
    assert provider.calls == 1

    soft = TransposedSoftmaxProvider()
    soft.prepare([])
    sop = provider_op(soft)
    sindex = sop.register(spec_sample(Sample((x, -1), {})))
    (sout,) = sop.op([x], sindex)
    assert sout.stride() == (8, 1) and torch.allclose(sout, torch.softmax(x, -1))


def test_op_runs_pytorch_when_handed_a_layout_it_was_not_validated_on() -> None:
    x = torch.randn(4, 8)
    provider = DoublingReluProvider()
    provider.prepare([])
    op = provider_op(provider)
    index = op.register(spec_sample(Sample((x,), {})))
    other = torch.randn(8, 4).t()  # same shape, other strides: what an Inductor layout change would pass
    (out,) = op.op([other], index)
    assert torch.equal(out, torch.relu(other)) and provider.calls == 0
    assert op.stats.fallback_calls == 1


def test_calls_that_mutate_or_alias_inputs_get_no_op() -> None:
    x = torch.randn(4, 8)
    provider = DoublingReluProvider()
    provider.prepare([])
    op = provider_op(provider)
    assert op.register(spec_sample(Sample((x,), {"inplace": True}))) is None
    dropout = IdentityReluProvider("dropout")  # only its function name matters here
    dropout.prepare([])
    assert provider_op(dropout).register(spec_sample(Sample((x,), {"p": 0.5, "training": False}))) is None


class InplaceReluProvider(_FunctionProvider, type_name="test_inplace_relu"):
    """relu that honours `inplace=True` like PyTorch."""

    function_name = "relu"

    def _call(self, x: torch.Tensor, inplace: bool = False) -> torch.Tensor:
        self.calls += 1
        return x.clamp_min_(0) if inplace else x.clamp_min(0)


def test_inplace_signature_is_traced_as_stock_pytorch() -> None:
    x = torch.randn(4, 8)
    provider = InplaceReluProvider()
    plan = _plan(provider, Sample((x,), {"inplace": True}))

    class Inplace(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = x * 1
            F.relu(y, inplace=True)
            return y

    net, recorder = Inplace(), Recorder()
    with plan.apply(net):
        torch.compile(net, backend=recorder)(x)
        torch._dynamo.reset()
        out = torch.compile(net, backend="aot_eager")(x)  # lowered to ATen: stock relu_, no provider
    assert not recorder.op_nodes()
    assert torch.equal(out, torch.relu(x)) and provider.calls == 1  # 1: the Recorder graph calls F at run time


def test_nested_runtimes_under_compile_fall_back_to_the_outer_plan() -> None:
    x = torch.randn(4, 8)
    y = torch.randn(5, 8)

    class Inner(nn.Module):
        def forward(self, t: torch.Tensor) -> torch.Tensor:
            return F.relu(t)

    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = Inner()

        def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return self.inner(a), self.inner(b)

    outer_provider, inner_provider = DoublingReluProvider(), DoublingReluProvider()
    outer_plan = _plan(outer_provider, Sample((y,), {}))  # only the outer plan knows 5x8
    inner_plan = _plan(inner_provider, Sample((x,), {}))
    net = Outer()
    with outer_plan.apply(net), inner_plan.apply(net.inner):
        a, b = torch.compile(net, backend=Recorder())(x, y)
    assert torch.equal(a, torch.relu(x)) and torch.equal(b, torch.relu(y))
    assert inner_provider.calls == 1 and outer_provider.calls == 1


def test_traced_guard_agrees_with_signature_of() -> None:
    x = torch.randn(4, 8)
    templates = [
        Sample((x, -1), {}),
        Sample((x,), {"dim": -1}),
        Sample((x, (8,)), {"eps": 1e-5, "weight": None}),
        Sample(([x, x], 1.0), {}),
        Sample((x, float("nan")), {}),
        Sample((x, torch.float16), {}),
        Sample((x,), {"size": torch.Size([4, 8]), "opts": {"a": 1, "b": None}}),
    ]
    calls = [
        *templates,
        Sample((x, -1.0), {}),  # float vs int
        Sample((x, True), {}),  # bool vs int
        Sample((x,), {"dim": 1}),
        Sample((x, [8]), {"eps": 1e-5, "weight": None}),  # list vs tuple
        Sample((x, (8,)), {"eps": 1e-6, "weight": None}),
        Sample(((x, x), 1.0), {}),
        Sample(([x, x.t()], 1.0), {}),
        Sample((x.double(), -1), {}),
        Sample((x[:, :4], -1), {}),
        Sample((x, torch.float32), {}),
        Sample((x, 0.5), {}),
        Sample((x,), {"size": (4, 8), "opts": {"a": 1, "b": None}}),  # tuple vs torch.Size
        Sample((x,), {"size": torch.Size([4, 8]), "opts": {"b": None, "a": 1}}),  # dict order
        Sample((x,), {"size": torch.Size([4, 8]), "opts": {"a": 1.0, "b": None}}),
    ]
    def spec(value: Any) -> Any:  # tensors as specs, everything else (torch.Size, dicts) exactly as given
        if isinstance(value, torch.Tensor):
            return TensorSpec.of(value)
        return [spec(v) for v in value] if isinstance(value, list) else value

    for template in templates:
        pattern = call_pattern(Sample(tuple(spec(a) for a in template.args),
                                      {k: spec(v) for k, v in template.kwargs.items()}))
        for call in calls:
            expected = signature_of(call.args, call.kwargs) == signature_of(template.args, template.kwargs)
            assert _matches_call(call.args, call.kwargs, pattern) == expected, (template.describe(), call.describe())


@pytest.mark.parametrize("tracing_mode", ["fake", "symbolic"])
def test_other_tracers_inside_a_planned_forward_never_reach_the_provider(tracing_mode: str) -> None:
    """make_fx (as AOTAutograd runs it; torch 2.11 does so with is_compiling() False) hands the router fake tensors
    with static or symbolic sizes: the eager guard must fall back, not crash and not call a kernel on fakes."""
    from torch.fx.experimental.proxy_tensor import make_fx

    x = torch.randn(4, 8)
    provider = DoublingReluProvider()
    plan = _plan(provider, Sample((x,), {}))
    traced: list[torch.fx.GraphModule] = []

    class Tracing(nn.Module):
        def forward(self, t: torch.Tensor) -> torch.Tensor:
            traced.append(make_fx(lambda u: F.relu(u), tracing_mode=tracing_mode)(t))
            return t

    net = Tracing()
    with plan.apply(net) as runtime:
        net(x)
    assert provider.calls == 0 and runtime.stats["relu"].fallback_calls >= 1
    assert torch.equal(traced[0](x), torch.relu(x))


def test_dynamo_does_not_revisit_the_forward_wrapper_on_every_call() -> None:
    """The wrapper's frame must be skipped for good; evaluating it on each call cost ~0.5 ms per forward."""
    x = torch.randn(4, 8)
    plan = _plan(DoublingReluProvider(), Sample((x,), {}))
    net = Net()
    compiled = torch.compile(net, backend="aot_eager")
    with plan.apply(net):
        for _ in range(3):
            compiled(x)
        frames = counters["frames"]["total"]
        for _ in range(5):
            compiled(x)
    assert counters["frames"]["total"] == frames


def test_op_rebuilds_calls_in_the_order_the_traced_side_collects_tensors() -> None:
    from forge.custom_ops import _SignatureCall, _top_level_slots
    from forge.runtime import _tensors

    a, b, c = torch.randn(2), torch.randn(3), torch.randn(4)
    flat = Sample((a, 1.5), {"bias": b, "weight": c, "eps": 1e-5})
    nested = Sample(([a, (b, 2)],), {"weight": c})
    for call, top_level in ((flat, True), (nested, False)):
        template = spec_sample(call)
        slots = _top_level_slots(template)
        assert (slots is not None) == top_level
        tensors = _tensors(call.args, call.kwargs, call_pattern(template))
        for use in (slots, None):  # the fast path and the walk agree
            args, kwargs = _SignatureCall(template, None, (), None, use).rebuild(tensors)
            assert signature_of(args, kwargs) == signature_of(call.args, call.kwargs)
            assert all(x is y for x, y in zip(_tensors(args, kwargs, call_pattern(template)), tensors, strict=True))


def test_plan_applied_to_the_compiled_module_itself() -> None:
    x = torch.randn(4, 8)
    provider = DoublingReluProvider()
    plan = _plan(provider, Sample((x * 2 + 1,), {}))
    compiled = torch.compile(Net(), backend="aot_eager")
    own_forward = vars(compiled)["forward"]  # OptimizedModule keeps its compiled forward on the instance
    with plan.apply(compiled):
        out = compiled(x)
    assert torch.equal(out, Net()(x)) and provider.calls == 1 and not counters["graph_break"]
    assert vars(compiled)["forward"] is own_forward
