"""LLMKernelGenerator end to end against a scripted OpenAI-compatible server on loopback (real sockets, the real
openai SDK, real sandbox subprocesses, real Triton under the interpreter)."""

from __future__ import annotations

import json
import time

import pytest
import torch
import torch.nn.functional as F

from agent import GeneratedKernelProvider, GeneratorOptions, LLMConfig, LLMKernelGenerator
from forge.checking import KernelUtils
from forge.demo import demo_inputs, demo_model
from forge.judging import JudgeOptions
from forge.optimizer import KernelOptimizer
from forge.outcome import Outcome
from forge.plan import KernelOptimizationPlan, PlanEntry
from forge.provider import KernelProvider
from forge.samples import Sample
from forge.sandbox import SandboxOptions
from tests.agent.kernels import (
    RMS_NORM_OK,
    SILU_COMPILE_ERROR,
    SILU_FORBIDDEN,
    SILU_HANG,
    SILU_OK,
    SILU_WRONG,
    fenced,
)
from tests.agent.llm_server import ScriptedLLMServer, reply, server_error

QUICK = KernelUtils(fresh_inputs_per_sample=1, rounds=3, warmup=1, min_run_time_s=0.01)


def _generator(server: ScriptedLLMServer, tmp_path, **kwargs) -> LLMKernelGenerator:
    config = LLMConfig(model="scripted-model", base_url=server.base_url, api_key="sk-test",
                       cache_dir=tmp_path / "cache",
                       max_retries=2, retry_initial_wait_s=0.01, retry_max_wait_s=0.05,
                       input_price_per_mtok=1.0, output_price_per_mtok=2.0, **kwargs.pop("config", {}))
    sandbox = SandboxOptions(timeout_s=kwargs.pop("sandbox_timeout_s", 120.0), **kwargs.pop("sandbox", {}))
    collaborators = {"kernel_utils": kwargs.pop("kernel_utils", QUICK),
                     "judge_options": kwargs.pop("judge_options", JudgeOptions(sandbox, max_concurrent=2))}
    if "functions" in kwargs:
        kwargs["functions"] = tuple(kwargs["functions"])
    options = GeneratorOptions(**{"candidates": 1, "attempts": 4, "optimize_rounds": 0,
                                  "artifacts_dir": tmp_path / "runs", **kwargs})
    return LLMKernelGenerator(config, options, **collaborators)


def _silu_samples() -> list[Sample]:
    # Seeded: the oracle's mismatch values appear in fix prompts, so a replay needs the same inputs.
    return [Sample((torch.randn(8, 64, generator=torch.Generator().manual_seed(0)),), {})]


def _user_prompts(server: ScriptedLLMServer) -> list[str]:
    return [r["messages"][-1]["content"] for r in server.requests]


def test_compile_error_then_wrong_then_correct_gives_a_provider(scripted_llm, tmp_path) -> None:
    scripted_llm.push(reply(fenced(SILU_COMPILE_ERROR)), reply(fenced(SILU_WRONG)), reply(fenced(SILU_OK)))
    generator = _generator(scripted_llm, tmp_path)
    samples = _silu_samples()
    assert generator.prepare("silu", samples)
    result = generator.submit("silu", samples).result(timeout=300)
    assert result.succeeded, result.error
    assert isinstance(result.provider, GeneratedKernelProvider)
    x = torch.randn(8, 64)
    torch.testing.assert_close(result.provider(x), F.silu(x))
    prompts = _user_prompts(scripted_llm)
    assert len(prompts) == 3
    assert "compile" in prompts[1].lower() and "arange" in prompts[1]  # the compile log went back
    assert "mismatch" in prompts[2].lower() or "max abs" in prompts[2].lower()  # the oracle's errors went back
    assert result.usage["attempts"] == 3 and result.usage["prompt_tokens"] > 0
    assert result.usage["cost_usd"] is not None
    state = result.provider.to_dict()
    assert state["source"].strip() == SILU_OK.strip() and state["metadata"]["model"] == "scripted-model"
    # artifacts: the conversation is on disk
    assert list((tmp_path / "runs").rglob("turn02-kernel.py"))


def test_a_wrong_kernels_fix_prompt_carries_the_mismatch_table_with_the_real_numbers(scripted_llm, tmp_path) -> None:
    scripted_llm.push(reply(fenced(SILU_WRONG)), reply(fenced(SILU_OK)))
    generator = _generator(scripted_llm, tmp_path, use_cache=False)
    assert generator.submit("silu", _silu_samples()).result(timeout=300).succeeded
    fix = _user_prompts(scripted_llm)[1]
    assert "Worst elements (expected = PyTorch, actual = your kernel" in fix
    assert "| sample | input | output | index | expected | actual | abs_diff | allowed |" in fix
    x = _silu_samples()[0].args[0].double()
    expected, got = F.silu(x), 1.5 * F.silu(x)  # SILU_WRONG computes 1.5 * x * sigmoid(x)
    rows = [line.split(" | ") for line in fix.splitlines() if line.startswith("| 0 | captured | output | (")]
    assert len(rows) == 5
    for row in rows:
        index = tuple(int(i) for i in row[3].strip("()").split(", "))
        assert float(row[4]) == pytest.approx(expected[index].item(), rel=1e-5)
        assert float(row[5]) == pytest.approx(got[index].item(), rel=1e-5)


def test_a_harness_error_ends_the_conversation_without_blaming_the_model(scripted_llm, tmp_path) -> None:
    from tests.forge.sandbox.harness_faults import FailingReferenceUtils

    scripted_llm.push(reply(fenced(SILU_OK)), reply(fenced(SILU_OK)))
    utils = FailingReferenceUtils(fresh_inputs_per_sample=1, rounds=3, warmup=1, min_run_time_s=0.01, failure="oom")
    # isolation "none": the boundary binds only agent/ and forge/, and these settings come from the tests package
    generator = _generator(scripted_llm, tmp_path, kernel_utils=utils, use_cache=False,
                           sandbox={"isolation": "none", "allow_unsafe": True})
    result = generator.submit("silu", _silu_samples()).result(timeout=300)
    assert not result.succeeded and result.outcome == Outcome.HARNESS_ERROR and "ran out of memory" in result.error
    assert len(scripted_llm.requests) == 1  # no fix prompt: the model is never told the harness failure is its fault


def test_reply_without_code_and_forbidden_kernel_get_specific_feedback(scripted_llm, tmp_path) -> None:
    scripted_llm.push(reply("I think you should use a fused kernel."), reply(fenced(SILU_FORBIDDEN)),
                      reply(fenced(SILU_OK)))
    generator = _generator(scripted_llm, tmp_path)
    result = generator.submit("silu", _silu_samples()).result(timeout=300)
    assert result.succeeded
    prompts = _user_prompts(scripted_llm)
    assert "no" in prompts[1].lower() and "```python" in prompts[1]
    assert "torch.nn.functional.silu" in prompts[2] or "F.silu" in prompts[2] or "forbidden" in prompts[2].lower()


def test_server_errors_past_the_retry_budget_give_a_failure_result(scripted_llm, tmp_path) -> None:
    scripted_llm.push(*[server_error(503) for _ in range(5)])
    generator = _generator(scripted_llm, tmp_path)
    result = generator.submit("silu", _silu_samples()).result(timeout=60)
    assert not result.succeeded
    assert "server" in result.error


def test_hanging_kernel_times_out_and_the_loop_goes_on(scripted_llm, tmp_path) -> None:
    scripted_llm.push(reply(fenced(SILU_HANG)), reply(fenced(SILU_OK)))
    generator = _generator(scripted_llm, tmp_path, sandbox_timeout_s=20.0)
    result = generator.submit("silu", _silu_samples()).result(timeout=300)
    assert result.succeeded
    assert "timeout" in _user_prompts(scripted_llm)[1].lower()
    assert generator.judge.pool.live_process_groups() == []


def test_prepare_refuses_what_it_cannot_handle(tmp_path) -> None:
    generator = LLMKernelGenerator(LLMConfig(model="m", base_url="http://127.0.0.1:9/v1", cache_dir=tmp_path),
                                   GeneratorOptions(functions=("silu",)))
    assert generator.supports_functions() == ["silu"]
    assert not generator.prepare("relu", _silu_samples())
    assert not generator.prepare("silu", [Sample((torch.randn(2, 2, device="meta"),), {})])
    assert not generator.prepare("silu", [])
    assert "dropout" not in LLMKernelGenerator(LLMConfig(model="m", base_url="http://x", cache_dir=tmp_path)) \
        .supports_functions()
    with pytest.raises(ValueError, match="unknown torch.nn.functional"):
        GeneratorOptions(functions=("not_a_function",))


def test_a_generator_holds_several_languages_and_uses_those_that_fit_the_device(tmp_path) -> None:
    """CUDA C++ kernels need a CUDA device: on CPU samples a CUDA-only generator declines, a Triton + CUDA one
    writes Triton only (each conversation would otherwise alternate languages)."""
    config = LLMConfig(model="m", base_url="http://127.0.0.1:9/v1", cache_dir=tmp_path)
    both = LLMKernelGenerator(config, GeneratorOptions(functions=("silu",), languages=("triton", "cuda")))
    assert [language.name for language in both.languages] == ["triton", "cuda"]
    assert both.prepare("silu", _silu_samples())
    assert [language.name for language in both._usable_languages(_silu_samples())] == ["triton"]
    assert not LLMKernelGenerator(config, GeneratorOptions(functions=("silu",), languages=("cuda",))).prepare(
        "silu", _silu_samples())
    with pytest.raises(ValueError, match="unknown kernel language"):
        GeneratorOptions(languages=("triton", "fortran"))


def test_prepare_refuses_before_any_llm_call_when_the_sandbox_boundary_is_missing(tmp_path, monkeypatch) -> None:
    """Without the boundary (and no opt-out) the generator refuses in `prepare`, so no conversation is paid for."""
    import forge.sandbox.pool as pool_module
    from forge.sandbox.isolation import SandboxUnavailableError

    def unavailable(*args, **kwargs):
        raise SandboxUnavailableError("refusing to run generated code: the sandbox boundary is unavailable (test)")

    monkeypatch.setattr(pool_module, "resolve_isolation", unavailable)
    generator = LLMKernelGenerator(LLMConfig(model="m", base_url="http://127.0.0.1:9/v1", cache_dir=tmp_path),
                                   GeneratorOptions(functions=("silu",)))
    with pytest.raises(SandboxUnavailableError, match="boundary is unavailable"):
        generator.prepare("silu", _silu_samples())


def test_replay_from_cassette_with_the_server_down(tmp_path) -> None:
    cassette = tmp_path / "silu.jsonl"
    with ScriptedLLMServer([reply(fenced(SILU_WRONG)), reply(fenced(SILU_OK))]) as server:
        generator = _generator(server, tmp_path, config={"cassette": cassette, "cassette_mode": "record"},
                               use_cache=False)
        recorded = generator.submit("silu", _silu_samples()).result(timeout=300)
        assert recorded.succeeded
        generator.close()
    assert server.pending_steps == 0
    # The server is gone: replay must not touch the network.
    replay = LLMKernelGenerator(
        LLMConfig(model="scripted-model", base_url="http://127.0.0.1:9/v1", cassette=cassette,
                  cassette_mode="replay", cache_dir=tmp_path / "cache2"),
        GeneratorOptions(candidates=1, attempts=4, optimize_rounds=0, artifacts_dir=tmp_path / "runs2"),
        kernel_utils=QUICK,
    )
    replayed = replay.submit("silu", _silu_samples()).result(timeout=300)
    assert replayed.succeeded
    assert replayed.provider.source == recorded.provider.source
    assert replayed.usage["cassette_calls"] == 2


def test_make_plan_on_the_demo_model_validates_a_generated_kernel_and_reuses_the_cache(tmp_path) -> None:
    model, data = demo_model("cpu"), demo_inputs("cpu")
    with ScriptedLLMServer([reply(fenced(RMS_NORM_OK))]) as server:
        generator = _generator(server, tmp_path, functions=["rms_norm"])
        optimizer = KernelOptimizer(kernel_generators=generator, kernel_utils=QUICK,
                                    generator_min_time_share_percent=0.0, generation_timeout=600)
        optimizer.make_plan(model, data)
        rows = optimizer.report[optimizer.report["source"] == "generated"]
        assert len(rows) == 1
        # validated in-process by the optimizer's oracle; interpreted Triton on a CPU is not faster than eager
        assert rows.iloc[0]["status"] in {"selected", "slower", "not significant"}, rows.iloc[0]["error"]
        assert len(server.requests) == 1

        # a second make_plan on the same model: served from the kernel cache, no LLM call
        generator2 = _generator(server, tmp_path, functions=["rms_norm"])
        optimizer2 = KernelOptimizer(kernel_generators=generator2, kernel_utils=QUICK,
                                     generator_min_time_share_percent=0.0, generation_timeout=600)
        optimizer2.make_plan(model, data)
        assert len(server.requests) == 1
        cached = optimizer2.report[optimizer2.report["source"] == "generated"]
        assert cached.iloc[0]["status"] in {"selected", "slower", "not significant"}

    # the generated provider round-trips through a plan file and runs with no LLM
    provider = generator2.cache.get(generator2.cache_key_for(generator2._task("rms_norm", [
        s for _, s in _rms_samples(model, data)])[0]))[0]
    provider.prepare([])
    entry = PlanEntry(provider=provider, signatures=tuple(s for _, s in _rms_samples(model, data)), source="generated")
    path = KernelOptimizationPlan(entries=(entry,)).save(tmp_path / "plan.json")
    data_json = json.loads(path.read_text())
    assert "tl.sum" in data_json["entries"][0]["provider"]["source"]
    loaded = KernelOptimizationPlan.load(path)
    with loaded.apply(model) as runtime:
        out = model(*data[0].args)
    assert runtime.stats["rms_norm"].provider_calls > 0
    with torch.no_grad():
        torch.testing.assert_close(out, model(*data[0].args))


def _rms_samples(model, data):
    from forge.profiler import ModuleFunctionKernelProfiler

    profile = ModuleFunctionKernelProfiler({"rms_norm"}, warmup_iterations=0).profile(model, data)
    return profile.functions["rms_norm"].samples


def test_generation_timeout_cancels_in_flight_calls(tmp_path) -> None:
    from tests.agent.llm_server import hang

    with ScriptedLLMServer([hang(60)]) as server:
        generator = _generator(server, tmp_path, functions=["silu"])
        optimizer = KernelOptimizer(kernel_generators=generator, kernel_utils=QUICK,
                                    generator_min_time_share_percent=0.0, generation_timeout=2.0)

        class SiluNet(torch.nn.Module):
            def forward(self, x):
                return F.silu(x)

        start = time.monotonic()
        plan = optimizer.make_plan(SiluNet(), _silu_samples())
        assert time.monotonic() - start < 30
        assert len(plan) == 0
        assert list(optimizer.report["status"]) == ["timeout"]
        assert generator.judge.pool.live_process_groups() == []


def test_provider_restored_from_an_edited_plan_is_refused() -> None:
    provider = GeneratedKernelProvider("silu", SILU_OK, language="triton", signatures=_silu_samples())
    assert provider.prepare(_silu_samples())
    state = provider.to_dict()
    state["source"] = state["source"].replace("tl.exp(-x)", "tl.exp(x)")
    with pytest.raises(ValueError, match="sha256"):
        KernelProvider.from_dict(state)
    forbidden = GeneratedKernelProvider("silu", SILU_FORBIDDEN, language="triton")
    assert not forbidden.prepare(_silu_samples())


def test_optimize_rounds_show_the_measurements_and_keep_the_fastest_correct_kernel(scripted_llm, tmp_path) -> None:
    # Turn 1: a correct kernel. Optimize round 1: a wrong "faster" one (fix feedback follows, the best stays).
    # Optimize round 2: a correct rewrite with another block size.
    rewrite = SILU_OK.replace("BLOCK=1024", "BLOCK=256").replace("triton.cdiv(n, 1024)", "triton.cdiv(n, 256)")
    scripted_llm.push(reply(fenced(SILU_OK)), reply(fenced(SILU_WRONG)), reply(fenced(rewrite)))
    generator = _generator(scripted_llm, tmp_path, optimize_rounds=2)
    result = generator.submit("silu", _silu_samples()).result(timeout=300)
    assert result.succeeded, result.error
    prompts = _user_prompts(scripted_llm)
    assert len(prompts) == 3 and result.usage["attempts"] == 3
    optimize = prompts[1]
    for needle in ("PyTorch", "roofline", "launch"):
        assert needle.lower() in optimize.lower(), needle
    assert "mismatch" in prompts[2].lower() or "max abs" in prompts[2].lower()
    # the provider is one of the two correct kernels, whichever measured faster in the sandbox
    assert result.provider.source.strip() in {SILU_OK.strip(), rewrite.strip()}
    assert result.provider.metadata["sandbox_speedup"] > 0
    usage = json.loads(next((tmp_path / "runs").rglob("usage.json")).read_text())
    assert usage["calls"] == 3 and usage["per_tag"]["silu"]["calls"] == 3


def test_a_module_problem_runs_in_the_same_loop_and_an_untimed_verdict_ends_it_at_the_first_correct_one(
        scripted_llm, tmp_path) -> None:
    """`generate_module` shares the conversation loop: no-code and fix feedback for `ModelNew`, each candidate judged
    in the sandbox against the problem's `Model`; a judge that does not time (`benchmark=False`) gives nothing to
    optimise, so no optimize round is asked."""
    from agent.prompting import ModuleTask
    from forge.judging import ModuleSource, ModuleTarget
    from tests.agent.kernels import MLP_TRITON, MLP_TRITON_WRONG
    from tests.evals.test_runner import MLP

    scripted_llm.push(reply("Here is my plan: fuse the linear layer and the ReLU."),
                      reply(fenced(MLP_TRITON_WRONG)), reply(fenced(MLP_TRITON)))
    generator = _generator(scripted_llm, tmp_path, attempts=3, optimize_rounds=2,
                           judge_options=JudgeOptions(SandboxOptions(timeout_s=120), benchmark=False))
    result = generator.generate_module(ModuleTask.from_source(MLP, name="LinearReLU", language="triton"),
                                       ModuleTarget(ModuleSource(MLP, "LinearReLU")))
    assert result.error is None and result.source.strip() == MLP_TRITON.strip()
    assert result.attempts == 3 and result.usage["calls"] == 3 and result.usage["prompt_tokens"] > 0
    prompts = _user_prompts(scripted_llm)
    assert len(prompts) == 3  # no optimize round: the correct verdict carried no timing
    assert prompts[1].startswith("# Fix your `ModelNew`") and "defines `ModelNew`" in prompts[1]
    assert prompts[2].startswith("# Fix your `ModelNew`") and "seed 42" in prompts[2] and "mismatch" in prompts[2]
    folder = tmp_path / "runs"
    assert len(list(folder.rglob("module-LinearReLU/conversation-0/turn*-kernel.py"))) == 2


# ---------------------------------------------------------------------------------------------------------
# CUDA candidates are built on the language's CPU pool before they reach the sandbox
# ---------------------------------------------------------------------------------------------------------
def test_cuda_candidates_are_built_into_the_sandbox_cache_before_the_sandbox_runs(tmp_path, monkeypatch) -> None:
    """The real `_FunctionProblem.evaluate` path with a real compiler (sm_90, no GPU needed to build); the sandbox
    run is replaced by what its child does first: load the file with the child's environment, compilers disabled,
    which works only from the warm build cache. Skipped where neither nvcc nor NVRTC is present."""
    import threading

    from agent.generator import _FunctionProblem
    from agent.languages import get_language
    from agent.languages.cuda import build as cuda_build
    from agent.languages.cuda import runtime as cuda_runtime
    from agent.languages.cuda import toolchain as cuda_toolchain
    from agent.languages.cuda.reference_candidates import RMS_NORM_FILE

    if cuda_toolchain.find_nvcc() is None and cuda_toolchain.nvrtc_library() is None:
        pytest.skip("neither nvcc nor NVRTC is available: nothing to build")
    cuda = get_language("cuda")
    monkeypatch.setenv("KFORGE_SANDBOX_CACHE_DIR", str(tmp_path / "sandbox-cache"))
    monkeypatch.delenv(cuda_toolchain.TOOLCHAIN_ENV, raising=False)
    monkeypatch.setattr(cuda_toolchain, "device_arch", lambda device=None: "sm_90")  # the GPU the child would see
    child_env = cuda.child_environment("cuda", tmp_path / "scratch")
    assert cuda_toolchain.TOOLCHAIN_ENV in child_env  # the parent's toolchain, pinned for the child
    cubins = tmp_path / "sandbox-cache" / "cuda" / "cubin"

    generator = LLMKernelGenerator(LLMConfig(model="unused", base_url="http://127.0.0.1:9", api_key="sk-test",
                                             cache_dir=tmp_path / "cache"),
                                   GeneratorOptions(languages=("cuda",), use_cache=False,
                                                    artifacts_dir=tmp_path / "runs"))
    samples = [Sample((torch.randn(4, 64), (64,)), {})]
    task, counts = generator._task("rms_norm", samples, "cuda")
    problem = _FunctionProblem(generator, task, samples, counts)
    loaded: list[str] = []

    def child_load(code, task, samples, counts, cancel):  # what the sandbox child does at import
        def no_compiler(*args, **kwargs):
            raise AssertionError("the child compiled: the build was not in the cache")

        with monkeypatch.context() as child:
            for name, value in child_env.items():
                child.setenv(name, value)
            child.setattr(cuda_build, "_nvrtc_compile", no_compiler)
            child.setattr(cuda_build, "_nvcc_compile", no_compiler)
            cuda_runtime.clear_loaded()
            path = tmp_path / f"candidate{len(loaded)}.py"
            path.write_text(code)
            cuda.load(path, f"kforge_test_prebuilt_{len(loaded)}")
        loaded.append(code)
        return "verdict"

    monkeypatch.setattr(generator, "_judge", child_load)
    try:
        assert problem.evaluate(RMS_NORM_FILE, threading.Event()) == "verdict"
        assert len(list(cubins.glob("*.cubin"))) == 1 and loaded == [RMS_NORM_FILE]
        # a candidate that fails screening is not built (the sandbox reports the screen's findings)
        forbidden = RMS_NORM_FILE.replace("rsqrtf(", "printf(\"x\"); rsqrtf(")
        assert get_language("cuda").screen(forbidden, "rms_norm")
        monkeypatch.setattr(generator, "_judge", lambda *args: "screened")
        assert problem.evaluate(forbidden, threading.Event()) == "screened"
        assert len(list(cubins.glob("*.cubin"))) == 1
    finally:
        generator.close()
        cuda_runtime.clear_loaded()
    assert generator._build_pools == {}
