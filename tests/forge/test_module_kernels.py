"""Module kernels (`forge.modules`): a module class's forward replaced for the instances and calls it was judged
on, through the optimizer, the plan (saved and loaded) and the runtime (eager, fallback, restore, compile)."""

from __future__ import annotations

import gc
import logging
import time

import pytest
import torch
from torch import nn

from forge.checking import KernelUtils
from forge.execution import TimingMode
from forge.modules import (
    CompiledModuleProvider,
    class_name,
    instance_key,
    module_target_name,
)
from forge.optimizer import KernelOptimizer
from forge.plan import KernelOptimizationPlan, PlanEntry
from forge.samples import Sample
from tests.forge.providers_for_tests import KeyedModuleKernel

UTILS = KernelUtils(fresh_inputs_per_sample=1, rounds=15, warmup=2, min_run_time_s=0.05)


class SlowNorm(nn.Module):
    """An RMSNorm written as a model library writes it (no F call), slowed so a kernel for it clearly wins."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.rand(dim) + 0.5)
        self.eps = eps

    def forward(self, x):
        time.sleep(0.004)
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norms = nn.ModuleList([SlowNorm(16), SlowNorm(16), SlowNorm(8)])
        self.proj = nn.Linear(16, 8)

    def forward(self, x):
        x = self.norms[1](self.norms[0](x))
        return self.norms[2](self.proj(x))


class NormKernel(KeyedModuleKernel, type_name="test_norm_kernel"):
    """The same math without the sleep, on the instance's own weight (shared, not copied)."""

    calls = 0

    def _bind(self, module):
        def forward(x):
            NormKernel.calls += 1
            return module.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + module.eps)
        return forward

    def _prepare_instances(self, instances, samples, counts=None):
        return all(s.args[0].shape[-1] == m.weight.shape[0] for m in instances for s in samples)



def _data():
    return [Sample((torch.randn(4, 16),), {})]


def test_make_plan_replaces_a_hot_module_class_and_keeps_it_end_to_end():
    net = Net()
    optimizer = KernelOptimizer(module_sources=[NormKernel], kernel_utils=UTILS, end_to_end_blocks=6)
    plan = optimizer.make_plan(net, _data())
    name = module_target_name(SlowNorm)
    assert plan.functions == [name, name]  # two behaviours: 16 and 8 wide
    rows = optimizer.report[optimizer.report["function"] == name]
    assert set(rows["status"]) == {"baseline", "selected"}
    assert optimizer.end_to_end.iloc[-1]["verdict"] == "kept: faster"
    NormKernel.calls = 0
    x = torch.randn(4, 16)
    with torch.no_grad():
        expected = net(x)
        with plan.apply(net) as runtime:
            got = net(x)
    torch.testing.assert_close(got, expected)
    assert NormKernel.calls == 3 and sum(s.provider_calls for s in runtime.stats.values()) == 3
    assert all("forward" not in m.__dict__ for m in net.modules())  # restored


def _norm_plan(net: Net) -> KernelOptimizationPlan:
    provider = NormKernel(class_name(SlowNorm))
    assert provider.prepare_instances(list(net.norms[:2]), _data())
    return KernelOptimizationPlan(entries=(PlanEntry(provider=provider, signatures=tuple(_data())),))


def test_unjudged_calls_and_instances_run_the_original_forward_and_errors_restore_everything():
    net = Net()
    plan = _norm_plan(net)
    NormKernel.calls = 0
    with plan.apply(net) as runtime:
        net.norms[0](torch.randn(4, 16))  # judged
        net.norms[0](torch.randn(3, 16))  # a signature it was not judged on
        net.norms[2](torch.randn(4, 8))  # an instance of another behaviour: not routed at all
    assert NormKernel.calls == 1
    stats = runtime.stats[module_target_name(SlowNorm)]
    assert (stats.provider_calls, stats.fallback_calls) == (1, 1)
    assert runtime.unserved() == []  # served once: a miss alone is not "never served"
    with plan.apply(net) as runtime:
        net.norms[0](torch.randn(3, 16))
    [(entry, why)] = runtime.unserved()
    assert entry is plan.entries[0] and why.startswith("every call fell back: argument 0: validated ('T', torch.Size"
                                                       "([4, 16])"), why
    with pytest.raises(RuntimeError, match="boom"), plan.apply(net):
        raise RuntimeError("boom")
    assert all("forward" not in m.__dict__ for m in net.modules())


def test_instance_keys_tell_behaviours_apart():
    a, b, c = SlowNorm(16), SlowNorm(16), SlowNorm(16, eps=1e-5)
    assert instance_key(a) == instance_key(b) != instance_key(c)
    assert instance_key(SlowNorm(8)) != instance_key(a)


def test_a_module_entry_survives_save_and_load(tmp_path):
    net = Net()
    provider = CompiledModuleProvider(class_name(SlowNorm))
    provider.instance_keys = frozenset({instance_key(net.norms[0])})
    provider._ready = True
    plan = KernelOptimizationPlan(entries=(PlanEntry(provider=provider, signatures=tuple(_data())),))
    loaded = KernelOptimizationPlan.load(plan.save(tmp_path / "plan.json"))
    (entry,) = loaded.entries
    assert entry.function == module_target_name(SlowNorm)
    assert entry.provider.serves(net.norms[1]) and not entry.provider.serves(net.norms[2])


def test_under_torch_compile_the_original_forward_is_traced():
    net = Net()
    plan = _norm_plan(net)
    NormKernel.calls = 0
    x = torch.randn(4, 16)
    with plan.apply(net):
        out = torch.compile(net, backend="aot_eager", fullgraph=False)(x)
    assert NormKernel.calls == 0
    with torch.no_grad():
        torch.testing.assert_close(out, net(x))


def test_a_backbone_is_not_a_module_target():
    """A class holding most of the model (LlamaModel in a Llama) is the model: `--execution compile`, not a kernel."""

    class Backbone(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = Net()

        def forward(self, x):
            return self.net(x) * 2.0  # glue of its own, so only the share rule keeps it out

    class Wrapper(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.backbone = Backbone()

        def forward(self, x):
            return self.backbone(x)

    optimizer = KernelOptimizer(module_sources=[NormKernel], kernel_utils=UTILS, end_to_end_check=False,
                                module_min_time_share_percent=0.0)
    optimizer.make_plan(Wrapper(), _data())
    tried = set(optimizer.report["function"])
    assert module_target_name(SlowNorm) in tried
    assert not any(name.endswith("Backbone") or name.endswith(".Net") for name in tried)


def test_plan_verify_checks_a_module_entry_against_the_models_instances():
    net = Net()
    plan = _norm_plan(net)
    assert plan.verify(UTILS, model=net) == {module_target_name(SlowNorm): []}
    (error,) = plan.verify(UTILS)[module_target_name(SlowNorm)]
    assert "not verified" in error and "model=" in error

    class WrongNorm(NormKernel, type_name="test_wrong_norm_kernel"):
        def _bind(self, module):
            return lambda x: module.weight * x  # forgets the normalisation

    wrong = WrongNorm(class_name(SlowNorm))
    assert wrong.prepare_instances(list(net.norms[:2]), _data())
    bad = KernelOptimizationPlan(entries=(PlanEntry(provider=wrong, signatures=tuple(_data())),))
    assert bad.verify(UTILS, model=net)[module_target_name(SlowNorm)]


def test_code_for_one_behaviour_group_is_judged_on_the_others_and_a_fixed_source_is_not_asked_again(caplog):
    """Three norms: two alike but for a plain attribute (a `layer_idx`: two behaviour groups), one with another
    eps. A source whose code hard-codes the first eps is asked once: its code serves the first two groups (judged on
    each), is wrong for the third, and, since asking it again gives the same code (`rewrites` is False), is not
    asked again; the third norm keeps its forward."""

    class FixedEps(NormKernel, type_name="test_fixed_eps_kernel"):
        def _bind(self, module):
            return lambda x: module.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

        def sibling(self):
            return FixedEps(self.target_class)

    asked = []

    def source(target_class):
        asked.append(target_class)
        return FixedEps(target_class)

    norms = [SlowNorm(16), SlowNorm(16), SlowNorm(16, eps=0.5)]
    norms[1].layer_idx = 1
    model = nn.Sequential(*norms)
    optimizer = KernelOptimizer(kernel_providers=[], kernel_utils=UTILS, module_sources=[source],
                                module_min_time_share_percent=0.0, end_to_end_check=False)
    with caplog.at_level(logging.INFO, logger="forge.progress"):
        result = optimizer.optimize(model, [Sample((torch.randn(4, 16),), {})])
    tried = result.report[result.report["source"] == "static"]
    assert list(tried["outcome"]) == ["ok", "ok", "mismatch"], result.report.to_string()
    assert asked == [class_name(SlowNorm)]
    groups = [r.getMessage().split(": ", 1)[1] for r in caplog.records if "behaviour group" in r.getMessage()]
    assert groups == [f"behaviour group {i} of 3 (1 instance(s))" for i in (1, 2, 3)]  # long work says where it is
    assert len(result.plan) == 2 and len({id(e.provider) for e in result.plan.entries}) == 2
    with torch.no_grad(), result.plan.apply(model) as runtime:
        model(torch.randn(4, 16))
        assert "forward" in vars(norms[0]) and "forward" in vars(norms[1]) and "forward" not in vars(norms[2])
    served = [s for name, s in runtime.stats.items() if name.startswith(module_target_name(SlowNorm))]
    assert sum(s.provider_calls for s in served) == 2 and sum(s.fallback_calls for s in served) == 0


class StepNorm(SlowNorm):
    """A norm its model calls with a per-call counter (a value in the call's signature that never repeats)."""

    def forward(self, x, step=0):
        return super().forward(x)


class Stepping(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = StepNorm(16)
        self.steps = 0

    def forward(self, x):
        for _ in range(2):
            self.steps += 1
            x = self.norm(x, step=self.steps)
        return x


class StepNormKernel(NormKernel, type_name="test_step_norm_kernel"):
    def _bind(self, module):
        forward = super()._bind(module)
        return lambda x, step=0: forward(x)


def test_an_entry_the_model_never_calls_with_its_judged_signature_is_dropped_saying_which_argument_differs(caplog):
    """Judged and faster on the calls seen while planning, but the model's later calls never have that signature
    (here a counter argument): the end-to-end check's runs show it never served, and it is not kept."""
    net = Stepping()
    optimizer = KernelOptimizer(kernel_providers=[], module_sources=[StepNormKernel], kernel_utils=UTILS,
                                module_min_time_share_percent=0.0, end_to_end_blocks=5)
    with caplog.at_level(logging.WARNING, logger="forge.optimizer"):
        plan = optimizer.make_plan(net, _data())
    assert len(plan) == 0
    name = module_target_name(StepNorm)
    rows = optimizer.report[optimizer.report["function"] == name]
    [why] = list(rows[rows["status"].str.startswith("dropped")]["error"])
    assert why.startswith("never served in the model: every call fell back: keyword step: validated (<class 'int'>, "
                          ), why
    assert any("never served in the model" in r.getMessage() for r in caplog.records)


def test_the_end_to_end_report_says_which_module_entries_a_variant_never_served() -> None:
    from forge.end_to_end import compare_end_to_end

    net = Stepping()
    provider = StepNormKernel(class_name(StepNorm))
    sample = Sample((torch.randn(4, 16),), {"step": 0})
    assert provider.prepare_instances([net.norm], [sample])
    plan = KernelOptimizationPlan(entries=(PlanEntry(provider=provider, signatures=(sample,)),))
    report = compare_end_to_end(net, _data(), plan, executions=["eager"], blocks=1, rounds=2, min_run_time_s=0.0)
    planned = next(row for row in report.rows if row.with_plan)
    [missed] = planned.unserved
    assert missed.startswith(f"{module_target_name(StepNorm)}: every call fell back: keyword step: validated "
                             f"(<class 'int'>, 0), called (<class 'int'>, "), missed
    assert "1 module entry never served" in planned.note
    assert not next(row for row in report.rows if not row.with_plan).unserved


class HostTimedNormKernel(NormKernel, type_name="test_host_timed_norm_kernel"):
    """A source timed on its own clock (as `GraphedModuleProvider` is host-inclusive on any selection clock)."""

    timed_on = TimingMode.DEVICE  # not the CPU plan's eager clock, so the test sees which one ran


def test_a_source_with_its_own_clock_is_timed_on_it_against_its_baseline(monkeypatch):
    timings = []
    benchmark = KernelUtils.benchmark

    def spy(self, *args, **kwargs):
        timings.append(self.timing)
        return benchmark(self, *args, **kwargs)

    monkeypatch.setattr(KernelUtils, "benchmark", spy)
    optimizer = KernelOptimizer(kernel_providers=[], module_sources=[HostTimedNormKernel], kernel_utils=UTILS,
                                end_to_end_check=False)
    plan = optimizer.make_plan(Net(), _data())
    assert optimizer.clock.timing is TimingMode.EAGER and len(plan) == 2
    # Per behaviour group: the baseline, the candidate, the baseline again, all on the source's clock.
    assert timings == [TimingMode.DEVICE] * 6



class WeightKernel(NormKernel, type_name="test_weight_norm_kernel"):
    """Holds the instance's weight, not the instance (as a generated `ModelNew` does)."""

    def _bind(self, module):
        weight, eps = module.weight, module.eps
        return lambda x: weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def test_a_new_instance_at_the_address_of_a_collected_one_gets_its_own_replacement():
    """Replacements are cached per instance: a module created where a collected one lived (CPython reuses
    addresses) must not get the old one's replacement, which computes with the old weights. The cache lets go of a
    collected instance, so nothing is left for an instance at its address to pick up (a cache by id would be)."""
    provider = WeightKernel(class_name(SlowNorm))
    first = SlowNorm(16)
    provider.bind(first)
    del first
    gc.collect()
    assert len(provider._bound) == 0
    second = SlowNorm(16)
    x = torch.randn(2, 16)
    expected = second.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + second.eps)
    torch.testing.assert_close(provider.bind(second)(x), expected)


class PairNorm(SlowNorm):
    """Returns `(output, None)`, as Hugging Face attention returns `(output, weights)`: no custom op can stand for
    it, which the runtime finds out by running the forward on fake tensors."""

    fake_runs = 0

    def forward(self, x):
        if isinstance(x, torch._subclasses.fake_tensor.FakeTensor):
            PairNorm.fake_runs += 1
        return super().forward(x), None


class CodeNormKernel(NormKernel, type_name="test_code_norm_kernel"):
    carries_code = True  # as a generated kernel: the runtime builds a custom op per instance for torch.compile

    def _bind(self, module):
        forward = super()._bind(module)
        return lambda x: (forward(x), None)


def test_a_call_that_cannot_be_a_custom_op_is_found_out_once_not_at_every_activation():
    """An eager plan is activated once a forward (the end-to-end check times hundreds). Each activation asks every
    served instance's custom op for its signatures; one whose output cannot be an op was asked again each time, and
    the answer is the whole forward on fake tensors: 16 LlamaAttentions made a 14 ms Llama pass 100 ms on an H100."""
    net = nn.Sequential(PairNorm(16))
    provider = CodeNormKernel(class_name(PairNorm))
    assert provider.prepare_instances([net[0]], _data())
    plan = KernelOptimizationPlan(entries=(PlanEntry(provider=provider, signatures=tuple(_data())),))
    runtime = plan.runtime(net)
    PairNorm.fake_runs = NormKernel.calls = 0
    x = _data()[0].args[0]
    for _ in range(5):
        with runtime.applied():
            out, none = net(x)
    assert PairNorm.fake_runs == 1 and NormKernel.calls == 5 and none is None
    torch.testing.assert_close(out, SlowNorm.forward(net[0], x))


def test_an_activation_reuses_the_instance_wrappers_but_not_over_a_forward_replaced_in_between():
    """Activating a plan again installs the wrappers it built the first time (an eager run activates it once a
    pass); a forward the user set on an instance in between is what the new wrapper falls back to."""
    net = Net()
    runtime = _norm_plan(net).runtime(net)
    with runtime.applied():
        first = net.norms[0].forward
    with runtime.applied():
        assert net.norms[0].forward is first
    seen = []
    mine = lambda x: seen.append(x.shape) or SlowNorm.forward(net.norms[0], x)  # noqa: E731
    net.norms[0].forward = mine
    with runtime.applied():
        assert net.norms[0].forward is not first
        net.norms[0](torch.randn(3, 16))  # not judged: falls back to the user's forward
    assert seen == [torch.Size([3, 16])] and net.norms[0].forward is mine
