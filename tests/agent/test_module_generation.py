"""Module kernels written by the agent for a hot module of a real model (`agent.modules`, `InstanceTarget`):
Hugging Face's `LlamaRMSNorm` in a tiny `LlamaForCausalLM`, a `ModelNew(original)` from a scripted endpoint on
loopback (the real openai client), judged in the real sandbox (real Triton under the interpreter), then planned,
saved, loaded and applied in eager and under `torch.compile` (inductor)."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from agent import GeneratorOptions, LLMConfig, LLMKernelGenerator
from agent.languages import get_language
from agent.modules import GeneratedModuleProvider, LLMModuleSource, ParameterCopyError, check_shares_parameters
from agent.prompting import InstanceTask, PromptRenderer
from forge.checking import KernelUtils
from forge.judging import InstanceTarget, Judge, JudgeOptions
from forge.modules import module_target_name, record_module_calls
from forge.optimizer import KernelOptimizer
from forge.outcome import Outcome
from forge.plan import KernelOptimizationPlan, PlanEntry
from forge.samples import Sample
from forge.sandbox import SandboxOptions
from tests.agent.llm_server import ScriptedLLMServer, reply

transformers = pytest.importorskip("transformers")
from transformers.models.llama.modeling_llama import LlamaRMSNorm  # noqa: E402

QUICK = KernelUtils(fresh_inputs_per_sample=1, rounds=3, warmup=1, min_run_time_s=0.01)
RMS_CLASS = "transformers.models.llama.modeling_llama.LlamaRMSNorm"

# Honest, in the style real replies take: `super(ModelNew, self)`, the original's parameter kept by reference.
RMS_MODELNEW = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, n_cols, x_row_stride, out_row_stride, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    variance = tl.sum(x * x, axis=0) / n_cols
    y = x * tl.rsqrt(variance + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    tl.store(out_ptr + row * out_row_stride + cols, w * y.to(w_ptr.dtype.element_ty), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, original):
        super(ModelNew, self).__init__()
        self.weight = original.weight
        self.variance_epsilon = original.variance_epsilon

    def forward(self, hidden_states):
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, shape[-1])
        if x.stride(-1) != 1:
            x = x.contiguous()
        out = torch.empty(x.shape, dtype=torch.promote_types(self.weight.dtype, hidden_states.dtype),
                          device=x.device)
        _rms_norm_kernel[(x.shape[0],)](x, self.weight, out, shape[-1], x.stride(0), out.stride(0),
                                        self.variance_epsilon, BLOCK=triton.next_power_of_2(shape[-1]))
        return out.reshape(shape)
'''

# Passes the screen (the product goes to cuBLAS, a library call a module may make; a kernel is defined) but never
# launches a kernel of its own: the run-time launch check refuses it.
LINEAR_LIBRARY_ONLY = '''
import torch
import torch.nn as nn
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def _unused(x_ptr, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(x_ptr + i, tl.load(x_ptr + i, mask=i < n), mask=i < n)


class ModelNew(nn.Module):
    def __init__(self, original):
        super().__init__()
        self.weight = original.weight
        self.bias = original.bias

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)
'''

# Computes the norm with torch ops around a token kernel: refused by the screen before anything runs.
RMS_TORCH_OPS = RMS_MODELNEW.replace("        return out.reshape(shape)",
                                     "        return self.weight * torch.rsqrt(hidden_states.pow(2).mean(-1))")


def _norm() -> tuple[LlamaRMSNorm, Sample]:
    torch.manual_seed(0)
    norm = LlamaRMSNorm(64, eps=1e-6).eval()
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    return norm, Sample((torch.randn(2, 8, 64),), {})


@pytest.fixture(scope="module")
def judge():
    judge = Judge(QUICK, JudgeOptions(SandboxOptions(timeout_s=120.0), max_concurrent=2, benchmark=False))
    yield judge
    judge.close()


def test_an_honest_modelnew_passes_and_library_only_or_torch_math_replacements_are_refused(judge) -> None:
    norm, sample = _norm()
    triton_language = get_language("triton")
    honest = judge.judge_source(RMS_MODELNEW, InstanceTarget.of(norm, [sample], [3]), triton_language)
    assert honest.ok, honest.message

    screened = judge.judge_source(RMS_TORCH_OPS, InstanceTarget.of(norm, [sample]), triton_language)
    assert screened.status is Outcome.FORBIDDEN and "rsqrt" in screened.message

    linear = nn.Linear(32, 16)
    launched_nothing = judge.judge_source(LINEAR_LIBRARY_ONLY, InstanceTarget.of(linear, [Sample((torch.randn(4, 32),),
                                                                                               {})]), triton_language)
    assert not launched_nothing.ok
    assert "no kernel of the candidate was launched" in launched_nothing.message, launched_nothing.message


def test_a_file_judged_ahead_on_several_instances_gets_each_its_own_verdict_and_judge_code_reuses_it(judge) -> None:
    """`Judge.judge_ahead`: one file, two instances judged in the sandbox at once. A file that hard-codes the first
    instance's eps is correct for it and a mismatch for the other; `judge_code` then uses those verdicts (no new
    child), and a target object it was not judged ahead on starts a child of its own."""
    from forge.judging import CandidateCode

    norms = [LlamaRMSNorm(64, eps=eps).eval() for eps in (1e-6, 0.5)]
    sample = Sample((torch.randn(2, 8, 64),), {})
    targets = [InstanceTarget.of(norm, [sample]) for norm in norms]
    hard_coded = CandidateCode(RMS_MODELNEW.replace("self.variance_epsilon = original.variance_epsilon",
                                                    "self.variance_epsilon = 1e-6"), get_language("triton"))
    heard = []
    verdicts = judge.judge_ahead(hard_coded, targets, on_verdict=lambda index, v: heard.append(index))
    assert [v.status for v in verdicts] == [Outcome.OK, Outcome.MISMATCH], [v.message for v in verdicts]
    assert sorted(heard) == [0, 1]
    children = []
    real_run = judge.pool.run
    judge.pool.run = lambda *args, **kwargs: children.append(args[1]) or real_run(*args, **kwargs)
    try:
        provider = GeneratedModuleProvider(RMS_CLASS, hard_coded.source, language="triton")
        served = [provider.bind(norm) for norm in norms]
        first = judge.judge_code(hard_coded, targets[0], served[0])
        second = judge.judge_code(hard_coded, targets[1], served[1])
        assert first.ok and first.details["in_process_s"] >= 0 and second.status is Outcome.MISMATCH
        assert children == []  # both verdicts came from the sandbox runs judged ahead
        again = judge.judge_code(hard_coded, InstanceTarget.of(norms[0], [sample]), served[0])
        assert again.ok and len(children) == 1  # a target not judged ahead: its own child
    finally:
        judge.pool.run = real_run


def test_a_modelnew_that_copies_a_parameter_is_refused_when_bound() -> None:
    norm, _ = _norm()

    class Copying(nn.Module):
        def __init__(self, original):
            super().__init__()
            self.weight = nn.Parameter(original.weight.detach().clone())

    with pytest.raises(ParameterCopyError, match="weight"):
        check_shares_parameters(Copying(norm), norm)

    class Sharing(nn.Module):
        def __init__(self, original):
            super().__init__()
            self.original = original

    check_shares_parameters(Sharing(norm), norm)


def test_a_module_kernel_that_writes_to_the_live_instance_is_refused_and_the_weights_are_restored(judge) -> None:
    """In this process a module kernel holds the user's instance, and the reference shares its tensors: a kernel
    that rewrote them would be compared with itself. The judge compares digests of every parameter and buffer (here
    a write that leaves every output right, so only that check can see it), and the optimizer puts them back
    (`restored_if_written`)."""
    from forge.judging.modules import restored_if_written

    norm, sample = _norm()
    norm.register_buffer("seen", torch.zeros(1))

    def counts_calls(hidden_states):  # stands in for a kernel that stores into a pointer of the instance's
        with torch.no_grad():
            norm.seen.add_(1)
        return norm(hidden_states)

    with restored_if_written(norm):
        verdict = judge.judge_callable(counts_calls, InstanceTarget.of(norm, [sample]))
    assert verdict.status is Outcome.FORBIDDEN and "wrote to the original module's seen" in verdict.message
    assert norm.seen.item() == 0  # put back
    honest = judge.judge_callable(lambda hidden_states: norm(hidden_states), InstanceTarget.of(norm, [sample]))
    assert honest.ok, honest.message


def test_the_instance_prompt_shows_the_forward_its_attributes_parameters_and_calls() -> None:
    norm, sample = _norm()
    task = InstanceTask.from_instance(norm, [(3, sample)], language="triton")
    text = PromptRenderer().generate_instance(task)
    assert "hidden_states.pow(2).mean(-1, keepdim=True)" in text  # the forward's source
    assert "`variance_epsilon` = 1e-06" in text and "`weight`: parameter, shape (64,)" in text
    assert "called 3 time(s)" in text and "f32[2,8,64]" in text and "ModelNew(original)" in text


def _tiny_llama():
    from forge.demos import get_demo

    demo = get_demo("hf-llama")
    return demo.model(torch.device("cpu")), demo.inputs(torch.device("cpu"))


def _generator(server: ScriptedLLMServer, tmp_path) -> LLMKernelGenerator:
    config = LLMConfig(model="scripted-model", base_url=server.base_url, api_key="sk-test",
                       cache_dir=tmp_path / "cache", max_retries=1, retry_initial_wait_s=0.01, retry_max_wait_s=0.05)
    options = GeneratorOptions(candidates=1, attempts=2, optimize_rounds=0, artifacts_dir=tmp_path / "runs")
    return LLMKernelGenerator(config, options, kernel_utils=QUICK,
                              judge_options=JudgeOptions(SandboxOptions(timeout_s=120.0), max_concurrent=2))


def test_the_optimizer_gets_a_judged_modelnew_for_a_hot_class_and_the_plan_runs_saved_loaded_and_compiled(
        scripted_llm, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("KFORGE_SIGNING_KEY", "module-generation-test-key-0123456789")
    model, data = _tiny_llama()
    scripted_llm.push(reply(f"```python\n{RMS_MODELNEW}```"))
    generator = _generator(scripted_llm, tmp_path)
    source = LLMModuleSource(generator)
    try:
        optimizer = KernelOptimizer(kernel_providers=[], kernel_utils=QUICK, module_sources=[source],
                                    module_classes=["LlamaRMSNorm"], module_min_time_share_percent=0.0,
                                    end_to_end_check=False, judge=generator.judge)
        optimizer.make_plan(model, data)
        rows = optimizer.report[optimizer.report["function"] == "module:" + RMS_CLASS]
        generated = rows[rows["source"] == "generated"]
        assert len(generated) == 1, optimizer.report.to_string()
        # Judged in the sandbox and here; on the CPU interpreter it is slower than PyTorch, so not selected.
        assert generated.iloc[0]["outcome"] == "ok", generated.to_string()
        prompt = scripted_llm.requests[0]["messages"][-1]["content"]
        assert "LlamaRMSNorm" in prompt and "variance_epsilon" in prompt
        # What a demo cassette keys on: the first request as `agent.demo_prompts` renders it, message for message.
        from agent.demo_prompts import render_instances

        rendered = render_instances("hf-llama", [RMS_CLASS], "cpu", "", None, "scripted-model", on_device=True)
        assert [r["function"] for r in rendered] == ["module:" + RMS_CLASS]
        assert rendered[0]["request"]["messages"] == scripted_llm.requests[0]["messages"]
    finally:
        generator.close()

    # The same file as a plan entry: saved (signed), loaded, applied in eager and under torch.compile.
    norms = [m for m in model.modules() if isinstance(m, LlamaRMSNorm)]
    name = module_target_name(norms[0])
    with torch.no_grad(), record_module_calls(model, {name}) as found:
        model(*data[0].args, **data[0].kwargs)
    key, group = next(iter(found[name].instances.items()))
    provider = GeneratedModuleProvider(RMS_CLASS, RMS_MODELNEW, language="triton", cache_dir=tmp_path / "kernels")
    assert provider.prepare_instances(group, found[name].samples[key])
    plan = KernelOptimizationPlan(entries=(PlanEntry(provider=provider, signatures=tuple(found[name].samples[key]),
                                                     source="generated"),))
    path = plan.save(tmp_path / "plan.json")
    loaded = KernelOptimizationPlan.load(path)
    assert loaded.functions == ["module:" + RMS_CLASS]
    assert loaded.verify(QUICK, model=model) == {"module:" + RMS_CLASS: []}  # the sandbox, then here

    sample = data[0]
    with torch.no_grad():
        expected = model(*sample.args, **sample.kwargs).logits
        with loaded.apply(model) as runtime:
            got = model(*sample.args, **sample.kwargs).logits
        stats = runtime.stats["module:" + RMS_CLASS]
        assert stats.provider_calls == len(norms) and stats.fallback_calls == 0
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
        assert all("forward" not in vars(m) for m in norms)  # restored

        # Under torch.compile each served call is one custom op node (no graph break) running the generated kernel.
        from torch._dynamo.utils import counters

        counters.clear()
        for_compile = KernelOptimizationPlan(entries=loaded.entries, execution="compile")
        compiled = torch.compile(model, backend="inductor")
        with for_compile.apply(model) as runtime:
            got_compiled = compiled(*sample.args, **sample.kwargs).logits
        torch.testing.assert_close(got_compiled, expected, rtol=1e-4, atol=1e-4)
        assert runtime.stats["module:" + RMS_CLASS].provider_calls == len(norms)
        assert not counters["graph_break"], dict(counters["graph_break"])


def test_a_library_declared_layer_is_found_and_named_like_its_class() -> None:
    """transformers declares `LlamaRMSNorm` swappable as "RMSNorm" (`use_kernel_forward_from_hub`): that name is a
    module target's name too, and `Linear` declares nothing."""
    from forge.modules import declared_layer

    assert declared_layer(RMS_CLASS) == "RMSNorm"
    assert declared_layer("torch.nn.modules.linear.Linear") is None and declared_layer("no.such.Class") is None
    optimizer = KernelOptimizer(kernel_providers=[], module_classes=["RMSNorm"], end_to_end_check=False)
    assert optimizer._module_wanted(RMS_CLASS) and not optimizer._module_wanted("torch.nn.modules.linear.Linear")


def test_one_file_serves_every_behaviour_group_it_is_correct_for_and_a_group_it_is_wrong_for_gets_its_own(
        scripted_llm, tmp_path, caplog) -> None:
    """Llama's sixteen `LlamaAttention`s differ only in `layer_idx`, a plain attribute, so each is a behaviour group
    of its own: the file written for the first group is judged on the others before any new conversation. Here
    three `LlamaRMSNorm`s: two alike but for a `layer_idx`, one with another eps. The first reply hard-codes the
    first eps: correct for the first two groups (one conversation), a mismatch on the third, which gets a second
    conversation and the honest file."""
    norms = [LlamaRMSNorm(64, eps=eps) for eps in (1e-6, 1e-6, 0.5)]
    for index, norm in enumerate(norms):
        norm.layer_idx = index
    model = nn.Sequential(*norms).eval()
    data = [Sample((torch.randn(2, 8, 64),), {})]
    hard_coded = RMS_MODELNEW.replace("self.variance_epsilon = original.variance_epsilon",
                                      "self.variance_epsilon = 1e-6")
    scripted_llm.push(reply(f"```python\n{hard_coded}```"), reply(f"```python\n{RMS_MODELNEW}```"))
    generator = _generator(scripted_llm, tmp_path)
    try:
        optimizer = KernelOptimizer(kernel_providers=[], kernel_utils=QUICK,
                                    module_sources=[LLMModuleSource(generator)],
                                    module_classes=["LlamaRMSNorm"], module_min_time_share_percent=0.0,
                                    end_to_end_check=False, judge=generator.judge)
        with caplog.at_level(logging.INFO, logger="forge.progress"):
            result = optimizer.optimize(model, data)
    finally:
        generator.close()
    generated = result.report[result.report["source"] == "generated"]
    assert list(generated["outcome"]) == ["ok", "ok", "mismatch", "ok"], generated.to_string()
    said = [r.getMessage() for r in caplog.records]  # the later groups were judged in the sandbox at once
    assert any("on the 2 other group(s) in the sandbox" in line for line in said), said
    assert any("2 sandbox verdict(s) in" in line for line in said), said
    assert len(scripted_llm.requests) == 2  # one conversation per file, not per group
    assert generated["candidate"].iloc[0] == generated["candidate"].iloc[2] != generated["candidate"].iloc[3]
    assert result.module_targets == (RMS_CLASS,)
    reach = result.reach
    assert reach is not None and reach.reachable_pct == pytest.approx(100.0)  # the norms are all the model does


def test_a_kept_file_wrong_for_the_first_group_is_judged_on_the_others_at_once_and_read_once(caplog) -> None:
    """A kept file (`benchmarks.real_models --module-file`; its source gives the same file again) that is wrong for
    the first behaviour group is still tried on the others, which may differ, but judged on them all at once in the
    sandbox rather than one after another (Llama's captured attention: 16 groups at ~12 s each, one by one, on an
    H100), and its source is asked once."""
    norms = [LlamaRMSNorm(64, eps=1e-6) for _ in range(3)]
    for index, norm in enumerate(norms):
        norm.layer_idx = index
    model = nn.Sequential(*norms).eval()
    wrong = RMS_MODELNEW.replace("self.variance_epsilon = original.variance_epsilon", "self.variance_epsilon = 0.5")
    asked = []

    def kept_file(target_class: str) -> GeneratedModuleProvider:
        asked.append(target_class)
        return GeneratedModuleProvider(target_class, wrong, language="triton")

    optimizer = KernelOptimizer(kernel_providers=[], kernel_utils=QUICK, module_sources=[kept_file],
                                module_classes=["LlamaRMSNorm"], module_min_time_share_percent=0.0,
                                end_to_end_check=False)
    try:
        with caplog.at_level(logging.INFO, logger="forge.progress"):
            result = optimizer.optimize(model, [Sample((torch.randn(2, 8, 64),), {})])
    finally:
        optimizer.judge.close()
    generated = result.report[result.report["source"] == "generated"]
    assert list(generated["outcome"]) == ["mismatch"] * 3, generated.to_string()
    said = [r.getMessage() for r in caplog.records]
    assert any("on the 2 other group(s) in the sandbox" in line for line in said), said
    assert asked == [RMS_CLASS] and len(result.plan) == 0


# Honest, as a stand-in model wrote it for Llama's MLP on the H200 (benchmarks/replies/llama_mlp_h200.py), for any
# dtype: the products through F.linear (a library call a module may make), SiLU(gate) * up in its own kernel, the
# projections read through the original's submodules (`orig.gate_proj.weight`).
MLP_MODELNEW = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _silu_mul_kernel(g_ptr, u_ptr, o_ptr, n_elements, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    s = (g / (1.0 + tl.exp(-g))).to(o_ptr.dtype.element_ty).to(tl.float32)
    tl.store(o_ptr + offs, (s * u).to(o_ptr.dtype.element_ty), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, original):
        super(ModelNew, self).__init__()
        self.original = original

    def forward(self, x):
        orig = self.original
        gate = torch.nn.functional.linear(x, orig.gate_proj.weight, orig.gate_proj.bias)
        up = torch.nn.functional.linear(x, orig.up_proj.weight, orig.up_proj.bias)
        n = gate.numel()
        _silu_mul_kernel[(triton.cdiv(n, 1024),)](gate, up, gate, n, BLOCK=1024)
        return torch.nn.functional.linear(gate, orig.down_proj.weight, orig.down_proj.bias)
'''


def test_a_modelnew_may_read_the_instance_submodules_by_name_and_nothing_more(judge) -> None:
    """`orig.gate_proj.weight` is how real replies reach a module's weights: the screen allows the live instance's
    own submodule, parameter and setting names (`attribute_names`), judged in the sandbox with them; without the
    instance it refuses them, and a submodule named like a kernel's internals (`fn`) opens nothing."""
    from transformers.models.llama.modeling_llama import LlamaMLP

    from forge.modules import attribute_names

    model, _ = _tiny_llama()
    mlp = next(m for m in model.modules() if isinstance(m, LlamaMLP))
    triton_language = get_language("triton")
    names = attribute_names(mlp)
    assert {"gate_proj", "up_proj", "down_proj", "act_fn", "weight", "intermediate_size"} <= names
    assert triton_language.screen_module(MLP_MODELNEW, names) == []
    assert any(v.construct.endswith(".gate_proj") for v in triton_language.screen_module(MLP_MODELNEW))

    sample = Sample((torch.randn(1, 8, mlp.hidden_size),), {})
    verdict = judge.judge_source(MLP_MODELNEW, InstanceTarget.of(mlp, [sample], [2]), triton_language)
    assert verdict.ok, verdict.message

    holder = nn.Module()
    holder.fn = nn.Linear(4, 4)  # a submodule named like JITFunction.fn
    reaching = MLP_MODELNEW.replace("        n = gate.numel()",
                                    "        n = gate.numel()\n        f = _silu_mul_kernel.fn")
    refused = triton_language.screen_module(reaching, attribute_names(holder) | names)
    assert any(v.construct.endswith(".fn") for v in refused), refused


def test_the_generation_timeout_cuts_a_module_conversation_that_hangs(scripted_llm, tmp_path) -> None:
    """Module conversations share the optimizer's `generation_timeout`: one whose LLM call hangs is cancelled (the
    call abandoned), reported `timeout`, and the plan is made without it."""
    from tests.agent.llm_server import hang

    scripted_llm.push(hang(120))
    model = nn.Sequential(LlamaRMSNorm(64), LlamaRMSNorm(64)).eval()
    generator = _generator(scripted_llm, tmp_path)
    try:
        optimizer = KernelOptimizer(kernel_providers=[], kernel_utils=QUICK,
                                    module_sources=[LLMModuleSource(generator)], module_min_time_share_percent=0.0,
                                    end_to_end_check=False, judge=generator.judge, generation_timeout=2.0)
        result = optimizer.optimize(model, [Sample((torch.randn(2, 8, 64),), {})])
    finally:
        generator.close()
    rows = result.report[result.report["source"] == "generated"]
    assert list(rows["status"]) == ["timeout"], result.report.to_string()
    assert "within 2.0s" in rows.iloc[0]["error"] and len(result.plan) == 0
    assert generator.judge.pool.live_process_groups() == []
