"""The LLM source: a stub generator (function and module problems), then the real `LLMKernelGenerator` recording
the smoke suite from the scripted loopback server, and the committed cassette replayed through `kforge eval` with
no server at all (metrics checked against values computed here from the records).

The scripted replies are real Triton kernels that run under TRITON_INTERPRET=1; cross_entropy deliberately gets
no code, and silu gets a wrong kernel first, so the metrics are not trivially all-correct.

When prompts change, the committed cassette goes stale (its request keys no longer match) and the record test
says so; regenerate it with `KFORGE_UPDATE_CASSETTES=1 pytest tests/evals/test_runner_llm.py -k record`.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from collections import Counter
from concurrent.futures import Future
from pathlib import Path

import pytest

from agent.llm import LLMConfig
from evals import ResultsStore, load_kernelbench_folder
from evals.runner import EvalOptions, run_eval
from evals.sources import LLMSource
from forge.functional import functional_names, original_function
from forge.judging import Judge, JudgeOptions
from forge.provider import KernelGenerationResult, KernelGenerator, KernelProvider
from forge.sandbox import SandboxOptions
from kforge.cli import main
from tests.agent.kernels import (
    MLP_TRITON,
    MLP_TRITON_SEGFAULT,
    MLP_TRITON_SLOW,
    MLP_TRITON_WRONG,
    RMS_NORM_OK,
    SILU_OK,
    SILU_WRONG,
    fenced,
)
from tests.agent.llm_server import ScriptedLLMServer, reply
from tests.evals.test_runner import LOSS, LOSS_NEW, MLP

COMMITTED_CASSETTE = Path(__file__).parent / "cassettes" / "smoke.jsonl"
GENERATOR_FLAGS = ["--candidates", "1", "--attempts", "2", "--optimize-rounds", "0"]
GENERATOR_OPTIONS = {"candidates": 1, "attempts": 2, "optimize_rounds": 0}
PRICES = {"KFORGE_LLM_INPUT_PRICE": "1.5", "KFORGE_LLM_OUTPUT_PRICE": "6"}
EXPECTED_CORRECT = {"smoke.relu", "smoke.silu", "smoke.softmax", "smoke.layer_norm", "smoke.rms_norm"}
EXPECTED_ATTEMPTS = {"smoke.relu": 1, "smoke.silu": 2, "smoke.softmax": 1, "smoke.layer_norm": 1,
                     "smoke.rms_norm": 1, "smoke.cross_entropy": 2}


# ---------------------------------------------------------------------------------------------------------
# Stub generator (no LLM at all)
# ---------------------------------------------------------------------------------------------------------
class _StubProvider(KernelProvider):
    def __init__(self, function: str, shift: float = 0.0) -> None:
        super().__init__()
        self.function, self.shift, self.fn = function, shift, original_function(function)

    @property
    def supported_function(self) -> str:
        return self.function

    @property
    def name(self) -> str:
        return f"stub {self.function}"

    def _prepare(self, samples) -> bool:
        return True

    def _call(self, *args, **kwargs):
        out = self.fn(*args, **kwargs)
        return out + self.shift if self.shift else out

    def _to_dict(self) -> dict:
        return {}

    @classmethod
    def _from_dict(cls, state):  # pragma: no cover - never serialised
        raise NotImplementedError


class StubGenerator(KernelGenerator):
    """`relu`: a correct provider; `silu`: a wrong one; anything else: an error. Modules: tries the `ModelNew`
    sources in `MODULE_TRIES[name]` in order through the judge (screening off: one of them segfaults with
    `ctypes`), keeping the first that passes."""

    MODULE_TRIES = {"LinearReLU": [MLP_TRITON_WRONG, MLP_TRITON], "LinearReLUAgain": [MLP_TRITON_WRONG],
                    "LinearReLUCrash": [MLP_TRITON_SEGFAULT, MLP_TRITON]}

    def supports_functions(self) -> list[str]:
        return functional_names()

    def prepare(self, function, samples) -> bool:
        return function != "softmax"

    def submit(self, function, samples) -> Future:
        future: Future = Future()
        usage = {"prompt_tokens": 100, "completion_tokens": 50, "cost_usd": 0.01, "attempts": 3}
        if function in ("relu", "silu"):
            provider = _StubProvider(function, shift=0.0 if function == "relu" else 1.0)
            provider.prepare(samples)
            future.set_result(KernelGenerationResult(function, provider=provider, usage=usage))
        else:
            future.set_result(KernelGenerationResult(function, error="the stub gave up", usage=usage))
        return future

    def generate_module(self, task, target):
        from agent import ModuleGenerationResult
        from agent.languages import get_language

        judge = Judge(options=JudgeOptions(SandboxOptions(screen=False)))
        statuses = []
        for source in self.MODULE_TRIES[task.name]:
            verdict = judge.judge_source(source, target, get_language("triton"))
            statuses.append(verdict.status.value)  # a forge.outcome.Outcome
            if verdict.status == "ok":
                return ModuleGenerationResult(source, None, {"prompt_tokens": 7, "cost_usd": 0.5}, len(statuses))
        return ModuleGenerationResult(None, f"verdicts {statuses}", {"prompt_tokens": 7}, len(statuses))


def make_stub_generator() -> StubGenerator:
    return StubGenerator()


def test_llm_source_with_a_stub_generator_on_function_problems(tmp_path) -> None:
    source = LLMSource(generator_factory=make_stub_generator)
    frame = run_eval("smoke", source, out_dir=tmp_path / "run",
                     options=EvalOptions(device="cpu", workers=1, quick=True,
                                         problem_ids=["smoke.relu", "smoke.silu", "smoke.softmax", "smoke.rms_norm"],
                                         progress=False, plots=False))
    rows = frame.set_index("problem_id")
    assert rows["source"].eq("llm").all()
    assert bool(rows.loc["smoke.relu", "correct"]) and rows.loc["smoke.relu", "candidate"] == "stub relu"
    assert rows.loc["smoke.silu", "failure_reason"].startswith("incorrect: ")  # the oracle caught the stub
    assert rows.loc["smoke.softmax", "failure_reason"].startswith("unsupported: ")
    assert rows.loc["smoke.rms_norm", "failure_reason"] == "generation failed: the stub gave up"
    # usage is recorded whether or not a kernel came out
    generated = rows.drop(index="smoke.softmax")
    assert (generated["attempts"] == 3).all() and (generated["prompt_tokens"] == 100).all()
    assert frame.attrs["summary"]["overall"]["cost"]["total_usd"] == pytest.approx(0.03)


def test_llm_source_module_problems_judge_each_attempt_in_the_sandbox(tmp_path) -> None:
    level = tmp_path / "level1"
    level.mkdir()
    for name in ("1_LinearReLU", "2_LinearReLUAgain", "3_LinearReLUCrash"):
        (level / f"{name}.py").write_text(MLP)
    problems = load_kernelbench_folder(level)
    source = LLMSource(generator_factory=make_stub_generator)
    frame = run_eval(problems, source, out_dir=tmp_path / "run",
                     options=EvalOptions(device="cpu", workers=1, quick=True, progress=False, plots=False))
    rows = frame.set_index("problem_id")
    first = rows.loc["level1/1_LinearReLU"]
    assert first["correct"] and first["attempts"] == 2 and first["cost_usd"] == 0.5  # the wrong one was refused
    assert rows.loc["level1/2_LinearReLUAgain", "failure_reason"] == "generation failed: verdicts ['mismatch']"
    assert rows.loc["level1/2_LinearReLUAgain", "failure"] == "generation_failed"
    # The first candidate of the third segfaults inside its sandbox child; the worker lives on.
    crash = rows.loc["level1/3_LinearReLUCrash"]
    assert crash["correct"] and crash["attempts"] == 2
    assert frame["worker_pid"].nunique() == 1


# ---------------------------------------------------------------------------------------------------------
# Real generator, scripted server, cassette
# ---------------------------------------------------------------------------------------------------------
RELU_OK = '''
import torch
import triton
import triton.language as tl


@triton.jit
def _relu(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, tl.where(x > 0, x, 0.0), mask=mask)


def kernel_function(input, inplace=False):
    x = input.contiguous()
    out = x if inplace else torch.empty_like(x)
    n = x.numel()
    _relu[(triton.cdiv(n, 1024),)](x, out, n, BLOCK=1024)
    return out
'''

SOFTMAX_OK = '''
import torch
import triton
import triton.language as tl


@triton.jit
def _softmax(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=-float("inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))
    e = tl.where(mask, e, 0.0)
    tl.store(out_ptr + row * n_cols + cols, (e / tl.sum(e, axis=0)).to(out_ptr.dtype.element_ty), mask=mask)


def kernel_function(input, dim=None, _stacklevel=3, dtype=None):
    if dtype is not None or dim not in (-1, input.dim() - 1):
        raise NotImplementedError("this kernel handles the last dimension in the input dtype only")
    x = input.contiguous()
    n_cols = x.shape[-1]
    out = torch.empty_like(x)
    _softmax[(x.numel() // n_cols,)](x, out, n_cols, BLOCK=triton.next_power_of_2(n_cols))
    return out
'''

LAYER_NORM_OK = '''
import torch
import triton
import triton.language as tl


@triton.jit
def _layer_norm(x_ptr, w_ptr, b_ptr, out_ptr, n_cols, eps, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
                BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / n_cols
    d = tl.where(mask, x - mean, 0.0)
    var = tl.sum(d * d, axis=0) / n_cols
    y = d / tl.sqrt(var + eps)
    if HAS_W:
        y = y * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_B:
        y = y + tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * n_cols + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def kernel_function(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    x = input.contiguous()
    n_cols = x.shape[-1]
    out = torch.empty_like(x)
    w = weight.contiguous() if weight is not None else x
    b = bias.contiguous() if bias is not None else x
    _layer_norm[(x.numel() // n_cols,)](x, w, b, out, n_cols, eps, HAS_W=weight is not None,
                                        HAS_B=bias is not None, BLOCK=triton.next_power_of_2(n_cols))
    return out
'''

_FUNCTION_IN_PROMPT = re.compile(r"torch\.nn\.functional\.(\w+)")


def smoke_responder(request: dict):
    """Replies by content, so any number of workers get the same answers: the function named first in the opening
    request; the turn is the number of assistant messages so far."""
    messages = request["messages"]
    opening = next(m["content"] for m in messages if m["role"] == "user")
    function = _FUNCTION_IN_PROMPT.search(opening).group(1)
    turn = sum(1 for m in messages if m["role"] == "assistant")
    if function == "relu":
        return reply(fenced(RELU_OK))
    if function == "silu":
        return reply(fenced(SILU_WRONG if turn == 0 else SILU_OK))
    if function == "softmax":
        return reply(fenced(SOFTMAX_OK))
    if function == "layer_norm":
        return reply(fenced(LAYER_NORM_OK))
    if function == "rms_norm":
        return reply(fenced(RMS_NORM_OK))
    return reply("I would rather not write a cross-entropy kernel today.")


@pytest.fixture
def isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KFORGE_CACHE_DIR", str(tmp_path / "kforge-cache"))
    for name in ("KFORGE_LLM_MODEL", "KFORGE_CASSETTE", "KFORGE_CASSETTE_MODE", "KFORGE_LLM_BUDGET_USD",
                 "KFORGE_LLM_REASONING_EFFORT", "KFORGE_LLM_MAX_COMPLETION_TOKENS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in PRICES.items():
        monkeypatch.setenv(name, value)


def _keys(path: Path) -> Counter:
    return Counter(json.loads(line)["key"] for line in path.read_text().splitlines() if line.strip())


def test_record_the_smoke_suite_from_the_scripted_server(tmp_path, isolated_cache) -> None:
    cassette = tmp_path / "smoke.jsonl"
    with ScriptedLLMServer(responder=smoke_responder) as server:
        config = LLMConfig.from_env(model="scripted-model", base_url=server.base_url, api_key="sk-test",
                                    cassette=cassette, cassette_mode="record")
        frame = run_eval("smoke", LLMSource(config, generator_options=GENERATOR_OPTIONS), out_dir=tmp_path / "run",
                         options=EvalOptions(device="cpu", workers=2, quick=True, progress=False, plots=False))
        calls = len(server.requests)
    rows = frame.set_index("problem_id")
    assert set(rows.index[rows["correct"]]) == EXPECTED_CORRECT, rows["failure_reason"].to_dict()
    assert rows["attempts"].to_dict() == EXPECTED_ATTEMPTS
    assert rows.loc["smoke.cross_entropy", "failure_reason"].startswith("generation failed: no correct kernel")
    assert (rows["prompt_tokens"] > 0).all() and (rows["cost_usd"] > 0).all()
    _assert_summary_from_records(tmp_path / "run")
    # Every call of both workers is in the merged cassette, and the per-worker parts are gone.
    assert sum(_keys(cassette).values()) == calls == sum(EXPECTED_ATTEMPTS.values())
    assert not cassette.with_name("smoke.jsonl.parts").exists()
    if os.environ.get("KFORGE_UPDATE_CASSETTES"):
        COMMITTED_CASSETTE.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(cassette, COMMITTED_CASSETTE)
    assert COMMITTED_CASSETTE.is_file() and _keys(cassette) == _keys(COMMITTED_CASSETTE), (
        f"{COMMITTED_CASSETTE} is stale (the prompts changed): regenerate it with "
        "KFORGE_UPDATE_CASSETTES=1 pytest tests/evals/test_runner_llm.py -k record")


def _assert_summary_from_records(out: Path) -> None:
    """The run's summary.json, by hand from its results.jsonl: rates, fast_p, geomeans, tokens, cost, attempts."""
    records = {r["problem_id"]: r for r in ResultsStore(out / "results.jsonl").load()}
    summary = json.loads((out / "summary.json").read_text())["overall"]
    n = 6
    correct = [r for r in records.values() if r["correct"]]
    assert summary["problems"] == n
    assert summary["correct_rate"] == pytest.approx(5 / 6)
    assert summary["compile_rate"] == pytest.approx(sum(r["compiled"] for r in records.values()) / n)
    for baseline in ("eager", "compile"):
        speedups = [r[f"speedup_{baseline}"] for r in correct]
        for p in (0.0, 1.0, 1.5, 2.0):
            assert summary["fast_p"][baseline][f"fast_{p:g}"] == pytest.approx(sum(s > p for s in speedups) / n)
        geomean = math.exp(sum(math.log(s) for s in speedups) / len(speedups))
        assert summary["geomean_speedup"][baseline] == pytest.approx(geomean)
    prompt = sum(r["prompt_tokens"] for r in records.values())
    completion = sum(r["completion_tokens"] for r in records.values())
    assert summary["tokens"] == {"prompt": prompt, "completion": completion}
    total_cost = (prompt * 1.5 + completion * 6.0) / 1e6  # the prices set in the environment
    assert summary["cost"]["total_usd"] == pytest.approx(total_cost)
    assert summary["cost"]["per_problem_usd"] == pytest.approx(total_cost / n)
    assert summary["cost"]["per_correct_usd"] == pytest.approx(total_cost / 5)
    assert summary["mean_attempts"] == pytest.approx(sum(EXPECTED_ATTEMPTS.values()) / n)
    assert summary["failure_reasons"] == {"generation_failed": 1}


# Replayed through the CLI: a problem fixed on its second attempt and one never solved (the record test covers all six).
REPLAYED = ("smoke.silu", "smoke.cross_entropy")


def test_replay_the_committed_smoke_cassette_offline_through_the_cli(tmp_path, isolated_cache, monkeypatch,
                                                                      capsys) -> None:
    with ScriptedLLMServer() as server:
        dead_endpoint = server.base_url
    # The server is down: any network call would fail (replay must not make one).
    monkeypatch.setenv("KFORGE_LLM_BASE_URL", dead_endpoint)
    monkeypatch.setenv("KFORGE_LLM_API_KEY", "sk-test")
    out = tmp_path / "run"
    code = main(["eval", "smoke", "--source", "llm", "--replay", str(COMMITTED_CASSETTE), "--device", "cpu",
                 "--quick", "--workers", "1", "--problems", ",".join(REPLAYED), "--out", str(out), *GENERATOR_FLAGS])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert "llm:scripted-model" in printed.out  # the model came from the cassette

    records = {r["problem_id"]: r for r in ResultsStore(out / "results.jsonl").load()}
    assert {pid for pid, r in records.items() if r["correct"]} == EXPECTED_CORRECT & set(REPLAYED)
    assert {pid: r["attempts"] for pid, r in records.items()} == {p: EXPECTED_ATTEMPTS[p] for p in REPLAYED}
    assert all(r["prompt_tokens"] > 0 for r in records.values())
    summary = json.loads((out / "summary.json").read_text())["overall"]
    assert summary["problems"] == 2 and summary["failure_reasons"] == {"generation_failed": 1}
    assert str(out / "report.md") in printed.out


def test_a_cassette_miss_is_a_recorded_generation_failure(tmp_path, isolated_cache) -> None:
    def function_of(line: str) -> str:
        messages = json.loads(line)["request"]["messages"]
        opening = next(m["content"] for m in messages if m["role"] == "user")
        return _FUNCTION_IN_PROMPT.search(opening).group(1)

    lines = [line for line in COMMITTED_CASSETTE.read_text().splitlines() if line.strip()]
    partial = tmp_path / "partial.jsonl"
    # Keep only the relu call: every other problem misses the cassette.
    partial.write_text("".join(line + "\n" for line in lines if function_of(line) == "relu"))
    assert partial.read_text().strip(), "the committed cassette has no relu call"
    config = LLMConfig.from_env(model="scripted-model", cassette=partial, cassette_mode="replay")
    frame = run_eval("smoke", LLMSource(config, generator_options=GENERATOR_OPTIONS), out_dir=tmp_path / "run",
                     options=EvalOptions(device="cpu", workers=0, quick=True,
                                         problem_ids=["smoke.relu", "smoke.softmax"], progress=False, plots=False))
    rows = frame.set_index("problem_id")
    assert bool(rows.loc["smoke.relu", "correct"])
    assert rows.loc["smoke.softmax", "failure_reason"].startswith("generation failed")
    assert "cassette" in rows.loc["smoke.softmax", "failure_reason"]


def test_real_generator_fixes_a_module_problem_from_the_oracle_feedback(tmp_path, isolated_cache) -> None:
    level = tmp_path / "level1"
    level.mkdir()
    (level / "1_LinearReLU.py").write_text(MLP)
    with ScriptedLLMServer([reply(fenced(MLP_TRITON_WRONG)), reply(fenced(MLP_TRITON))]) as server:
        config = LLMConfig.from_env(model="scripted-model", base_url=server.base_url, api_key="sk-test")
        source = LLMSource(config, generator_options={"attempts": 3, "optimize_rounds": 0})
        frame = run_eval(level, source, out_dir=tmp_path / "run",
                         options=EvalOptions(device="cpu", workers=1, quick=True, progress=False, plots=False))
        fix_prompt = server.requests[1]["messages"][-1]["content"]
    row = frame.iloc[0]
    assert row["correct"], row["failure_reason"]
    assert row["attempts"] == 2 and row["prompt_tokens"] > 0 and row["cost_usd"] > 0
    # The wrong ModelNew was refused by the judge, and its mismatch went back to the LLM.
    assert "mismatch" in fix_prompt and "seed 42" in fix_prompt and "max abs error" in fix_prompt


def test_generated_module_files_are_screened_before_they_run(tmp_path) -> None:
    from agent.languages import get_language
    from evals import module_problem_from_source
    from forge.judging import ModuleTarget

    problem = module_problem_from_source(LOSS, problem_id="level1/3_CrossEntropy", suite="kb")
    verdict = Judge().judge_source(LOSS_NEW, ModuleTarget(problem.module_source), get_language("triton"))
    assert verdict.status == "forbidden"
    constructs = {v["construct"] for v in verdict.details["violations"]}
    assert "@triton.jit" in constructs and any("logsumexp" in c for c in constructs)


# ---------------------------------------------------------------------------------------------------------
# Module problems: optimize rounds in the shared conversation loop
# ---------------------------------------------------------------------------------------------------------
# The reference itself fails: every verdict is the harness's failure, never the candidate's.
MLP_BROKEN_REFERENCE = MLP.replace("return torch.relu(self.linear(x))",
                                   "raise RuntimeError('the reference Model is broken')")


def _module_conversation(tmp_path, problem_source: str, replies: list[str], **options):
    """The real generator on one module problem, each `ModelNew` judged in the generator's sandbox (screening off:
    the slow candidate imports `time`): (result, every verdict in order, every prompt the server got)."""
    from agent.prompting import ModuleTask
    from evals import module_problem_from_source
    from evals.runner import QUICK_KERNEL_UTILS
    from forge.judging import ModuleTarget

    problem = module_problem_from_source(problem_source, problem_id="level1/1_LinearReLU", suite="kb",
                                         name="LinearReLU")
    verdicts = []
    with ScriptedLLMServer([reply(fenced(text)) for text in replies]) as server:
        config = LLMConfig.from_env(model="scripted-model", base_url=server.base_url, api_key="sk-test")
        judge_options = JudgeOptions(SandboxOptions(screen=False))
        source = LLMSource(config, generator_options={"artifacts_dir": tmp_path / "runs",
                                                      "judge_options": judge_options, **options})
        source.setup("cpu", QUICK_KERNEL_UTILS)
        judge = source.generator.judge
        judge_source = judge.judge_source

        def recording(*args, **kwargs):
            verdicts.append(judge_source(*args, **kwargs))
            return verdicts[-1]

        judge.judge_source = recording
        try:
            task = ModuleTask.from_source(problem.source, name="LinearReLU", language="triton")
            result = source.generator.generate_module(task, ModuleTarget(problem.module_source))
        finally:
            source.close()
        prompts = [r["messages"][-1]["content"] for r in server.requests]
    return result, verdicts, prompts


def test_a_module_problem_gets_optimize_rounds_and_keeps_the_fastest_correct_modelnew(tmp_path,
                                                                                      isolated_cache) -> None:
    from agent.prompting import format_time_ms

    # Turn 1: correct but slow. Optimize 1: wrong (a fix prompt follows). Optimize 2: correct and fast.
    # Optimize 3: correct and slow again (must not replace the fast one).
    result, verdicts, prompts = _module_conversation(
        tmp_path, MLP, [MLP_TRITON_SLOW, MLP_TRITON_WRONG, MLP_TRITON, MLP_TRITON_SLOW], attempts=2,
        optimize_rounds=3)
    assert [v.status.value for v in verdicts] == ["ok", "mismatch", "ok", "ok"]
    assert result.error is None and result.attempts == 4 and result.usage["calls"] == 4
    # Correct verdicts carry the timing of ModelNew and of the reference Model, taken in the sandbox child.
    for verdict in (verdicts[0], verdicts[2], verdicts[3]):
        assert verdict.latency_ms["median_ms"] > 0 and verdict.baseline_ms["median_ms"] > 0
        assert verdict.latency_ms["mode"] == verdict.baseline_ms["mode"] == "eager"
    assert verdicts[1].latency_ms is None  # a wrong one is not timed
    # The optimize prompt shows the measured numbers of the (then) best ModelNew, and its code.
    optimize = prompts[1]
    assert "Make your `ModelNew` for the module problem `LinearReLU` faster" in optimize
    assert f"| your ModelNew | {format_time_ms(verdicts[0].latency_ms['median_ms'])} |" in optimize
    assert (f"| PyTorch eager (`Model`) | {format_time_ms(verdicts[0].baseline_ms['median_ms'])} | "
            f"speedup {verdicts[0].speedup:.2f}x") in optimize
    assert "time.sleep(0.02)" in optimize
    assert "mismatch" in prompts[2] and "seed 42" in prompts[2]  # the wrong "faster" one got its fix prompt
    assert "Make your `ModelNew`" in prompts[3] and "time.sleep" not in prompts[3]  # MLP_TRITON is now the best
    # The fastest correct ModelNew is the one returned (the one the child measured fastest).
    fastest = max((verdicts[i].speedup, replies) for i, replies in ((0, MLP_TRITON_SLOW), (2, MLP_TRITON),
                                                                     (3, MLP_TRITON_SLOW)))
    assert result.source.strip() == fastest[1].strip() == MLP_TRITON.strip()
    # The transcript is on disk, as for function problems.
    folder = next((tmp_path / "runs").rglob("module-LinearReLU"))
    assert len(list(folder.rglob("turn*-kernel.py"))) == 4 and (folder / "conversation-0" / "messages.json").is_file()
    assert json.loads((folder / "summary.json").read_text())["conversations"][0]["turns"] == 4


def test_a_harness_error_ends_a_module_conversation_without_blaming_the_model(tmp_path, isolated_cache) -> None:
    result, verdicts, prompts = _module_conversation(tmp_path, MLP_BROKEN_REFERENCE, [MLP_TRITON, MLP_TRITON],
                                                     attempts=2, optimize_rounds=1)
    assert [v.status.value for v in verdicts] == ["harness_error"]
    assert result.source is None and result.outcome == "harness_error" and result.error.startswith("harness_error")
    assert "the reference Model is broken" in result.error
    assert len(prompts) == 1  # no fix prompt: the model is never told the harness's failure is its fault


def test_the_judge_times_only_correct_modules_in_the_child(tmp_path) -> None:
    """A correct `ModelNew` is timed in its sandbox child against `Model` (feedback for the model); a wrong one is
    not timed at all."""
    from agent.languages import get_language
    from evals import module_problem_from_source
    from forge.judging import ModuleTarget

    problem = module_problem_from_source(MLP, problem_id="level1/1_LinearReLU", suite="kb")
    target, judge = ModuleTarget(problem.module_source), Judge()
    timed = judge.judge_source(MLP_TRITON, target, get_language("triton"))
    assert timed.ok and timed.latency_ms["median_ms"] > 0 and timed.baseline_ms["median_ms"] > 0
    assert timed.details["timing_source"] == "sandbox child (feedback only)"
    wrong = judge.judge_source(MLP_TRITON_WRONG, target, get_language("triton"))
    assert wrong.status == "mismatch" and wrong.latency_ms is None and wrong.baseline_ms is None
    assert wrong.details["errors"][0].startswith("seed 42: ")
    untimed = judge.judge_source(MLP_TRITON, target, get_language("triton"), benchmark=False)
    assert untimed.ok and untimed.latency_ms is None
