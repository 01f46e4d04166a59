"""The eval runner end to end on CPU: real worker processes, real torch.compile, the real oracle and benchmark.

Test sources are module-level classes so spawned workers can unpickle them.
"""

from __future__ import annotations

import json
import math
import os
import signal
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from evals import ResultsStore, load_kernelbench_folder, load_suite, summarize
from evals.runner import QUICK_KERNEL_UTILS, EvalOptions, run_eval, select_problems
from evals.sources import Candidate, CompileSource, EvalSource, Failure, SDPASource, source_from_name
from evals.workers import WorkItem, group_work, plan_workers
from forge.checking import KernelUtils
from forge.functional import original_function

QUICK = QUICK_KERNEL_UTILS


# ---------------------------------------------------------------------------------------------------------
# Test sources
# ---------------------------------------------------------------------------------------------------------
class _Shifted:
    """PyTorch's function plus 0.5: a wrong kernel."""

    def __init__(self, function: str) -> None:
        self.fn = original_function(function)

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs) + 0.5


class _Raises:
    def __init__(self, message: str) -> None:
        self.message = message

    def __call__(self, *args, **kwargs):
        raise RuntimeError(self.message)


class ScriptedSource(EvalSource):
    """PyTorch's own function as the candidate, except for the problems given a behaviour: `wrong`, `raise`,
    `segfault` (kills the worker with SIGSEGV), `cuda_error` (raises like an illegal memory access), `hang`,
    `unsupported`. Module problems get the `ModelNew` source in `modules[problem.id]`."""

    def __init__(self, behaviours: dict[str, str] | None = None, modules: dict[str, str] | None = None) -> None:
        self.behaviours = dict(behaviours or {})
        self.modules = dict(modules or {})

    @property
    def name(self) -> str:
        return "scripted"

    def function_candidate(self, problem, samples, device, kernel_utils) -> Candidate:
        behaviour = self.behaviours.get(problem.id, "ok")
        usage = {"attempts": 1, "prompt_tokens": 10, "completion_tokens": 5, "cost_usd": 0.001}
        if behaviour == "segfault":
            os.kill(os.getpid(), signal.SIGSEGV)
        if behaviour == "hang":
            time.sleep(3600)
        if behaviour == "unsupported":
            return Candidate.failed(Failure.UNSUPPORTED, "not this one", usage)
        if behaviour == "wrong":
            return Candidate(name="shifted", fn=_Shifted(problem.function), usage=usage)
        if behaviour == "raise":
            return Candidate(name="raises", fn=_Raises("boom"), usage=usage)
        if behaviour == "cuda_error":
            return Candidate(name="faulty", fn=_Raises("CUDA error: an illegal memory access was encountered"),
                             usage=usage)
        return Candidate(name=f"eager {problem.function}", fn=original_function(problem.function), usage=usage)

    def module_candidate(self, problem, device, kernel_utils) -> Candidate:
        source = self.modules.get(problem.id)
        if source is None:
            return Candidate.failed(Failure.UNSUPPORTED, f"no ModelNew for {problem.id}")
        return Candidate(name="ModelNew (test)",
                         build=lambda seed: problem.instantiate_candidate(source, device, seed))


def _smoke(*ids: str):
    problems = load_suite("smoke")
    return [p for p in problems if p.id in ids] if ids else problems


def _records(out: Path) -> list[dict]:
    return ResultsStore(out / "results.jsonl").load()


# ---------------------------------------------------------------------------------------------------------
# End to end with torch.compile
# ---------------------------------------------------------------------------------------------------------
def test_compile_source_over_the_smoke_suite_writes_records_and_a_consistent_report(tmp_path) -> None:
    out = tmp_path / "run"
    frame = run_eval("smoke", "compile", out_dir=out, options=EvalOptions(device="cpu", quick=True, progress=False))

    problems = load_suite("smoke")
    assert sorted(frame["problem_id"]) == sorted(p.id for p in problems)
    assert frame["source"].eq("compile").all()
    # torch.compile of a function is correct on every smoke problem, and timed against both baselines.
    assert frame["correct"].all(), frame[["problem_id", "failure_reason"]]
    for column in ("latency_ms", "eager_ms", "compile_ms", "roofline_floor_ms"):
        assert (frame[column] > 0).all(), column
    recomputed = frame["eager_ms"] / frame["latency_ms"]
    assert (recomputed - frame["speedup_eager"]).abs().max() < 1e-9

    for name in ("results.jsonl", "run.json", "summary.json", "report.md", "speedup_eager.png",
                 "speedup_compile.png", "cost_vs_speedup.png"):
        assert (out / name).is_file(), name
    summary = json.loads((out / "summary.json").read_text())["overall"]
    # Metrics against the records, computed here by hand.
    n = len(problems)
    assert summary["problems"] == n and summary["correct_rate"] == 1.0 and summary["compile_rate"] == 1.0
    for p in (0.0, 1.0, 1.5, 2.0):
        expected = sum(1 for s in frame["speedup_eager"] if s > p) / n
        assert summary["fast_p"]["eager"][f"fast_{p:g}"] == pytest.approx(expected)
    geomean = math.exp(sum(math.log(s) for s in frame["speedup_compile"]) / n)
    assert summary["geomean_speedup"]["compile"] == pytest.approx(geomean)
    assert frame.attrs["summary"]["overall"] == summary
    assert "smoke.layer_norm" in (out / "report.md").read_text()
    # Where the time went: the harness's own share, per problem, adds up; no CUDA graphs baseline on CPU.
    for _, row in frame.iterrows():
        assert row["harness_s"] == pytest.approx(row["wall_s"] - row["generation_s"])
        assert 0 < row["validate_s"] + row["timing_s"] <= row["harness_s"] and row["timing"] == "eager"
    assert frame["cuda_graphs_ms"].isna().all() and summary["fast_p"]["cuda_graphs"] is None
    assert summary["harness_s"]["max"] == pytest.approx(frame["harness_s"].max())
    run = json.loads((out / "run.json").read_text())
    assert run["source"] == "compile" and run["problems"] == n and run["kernel_utils"]["rounds"] == QUICK.rounds


def test_a_second_run_into_the_same_folder_needs_resume(tmp_path) -> None:
    out = tmp_path / "run"
    run_eval(_smoke("smoke.relu"), ScriptedSource({"smoke.relu": "wrong"}), out_dir=out,
             options=EvalOptions(device="cpu", workers=0, quick=True, progress=False, plots=False))
    with pytest.raises(FileExistsError, match="resume"):
        run_eval(_smoke("smoke.relu"), ScriptedSource(), out_dir=out,
                 options=EvalOptions(device="cpu", workers=0, progress=False))
    with pytest.raises(ValueError, match="source 'scripted'"):
        run_eval(_smoke("smoke.relu"), "compile", out_dir=out,
                 options=EvalOptions(device="cpu", workers=0, resume=True, progress=False))


# ---------------------------------------------------------------------------------------------------------
# Failures are classified and the run goes on
# ---------------------------------------------------------------------------------------------------------
def test_wrong_raising_and_unsupported_candidates_are_classified(tmp_path) -> None:
    behaviours = {"smoke.relu": "wrong", "smoke.silu": "raise", "smoke.softmax": "unsupported"}
    frame = run_eval(_smoke("smoke.relu", "smoke.silu", "smoke.softmax", "smoke.rms_norm"),
                     ScriptedSource(behaviours), out_dir=tmp_path / "run",
                     options=EvalOptions(device="cpu", workers=0, quick=True, progress=False, plots=False))
    rows = frame.set_index("problem_id")
    assert rows.loc["smoke.relu", "failure_reason"].startswith("incorrect: ")
    assert "max abs" in rows.loc["smoke.relu", "failure_reason"] or "mismatch" in rows.loc["smoke.relu",
                                                                                            "failure_reason"]
    assert bool(rows.loc["smoke.relu", "compiled"]) and not bool(rows.loc["smoke.relu", "correct"])
    assert rows.loc["smoke.silu", "failure_reason"].startswith("runtime error: ")
    assert "boom" in rows.loc["smoke.silu", "failure_reason"] and not bool(rows.loc["smoke.silu", "compiled"])
    assert rows.loc["smoke.softmax", "failure_reason"] == "unsupported: not this one"
    assert bool(rows.loc["smoke.rms_norm", "correct"])
    # Usage from the source lands in the record.
    assert rows["cost_usd"].sum() == pytest.approx(0.004) and (rows["attempts"] == 1).all()
    # Wrong candidates are not timed.
    assert math.isnan(rows.loc["smoke.relu", "latency_ms"]) and rows.loc["smoke.rms_norm", "latency_ms"] > 0


def test_a_candidate_that_kills_its_worker_is_recorded_as_a_crash_and_the_run_goes_on(tmp_path) -> None:
    problems = _smoke("smoke.relu", "smoke.silu", "smoke.softmax")
    behaviours = {"smoke.relu": "wrong", "smoke.silu": "segfault", "smoke.softmax": "wrong"}
    out = tmp_path / "run"
    frame = run_eval(problems, ScriptedSource(behaviours), out_dir=out,
                     options=EvalOptions(device="cpu", workers=1, quick=True, progress=False, plots=False))
    rows = frame.set_index("problem_id")
    assert rows.loc["smoke.silu", "failure_reason"] == "crash: worker died with signal SIGSEGV"
    assert rows.loc["smoke.relu", "failure_reason"].startswith("incorrect")
    assert rows.loc["smoke.softmax", "failure_reason"].startswith("incorrect")
    # The problem after the crash ran in a fresh worker.
    assert rows.loc["smoke.softmax", "worker_pid"] != rows.loc["smoke.relu", "worker_pid"]
    assert summarize(frame)["failure_reasons"] == {"crash": 1, "mismatch": 2}


def test_a_cuda_fault_makes_the_worker_exit_and_a_fresh_one_continue(tmp_path) -> None:
    problems = _smoke("smoke.relu", "smoke.silu", "smoke.softmax")
    behaviours = {"smoke.relu": "wrong", "smoke.silu": "cuda_error", "smoke.softmax": "wrong"}
    frame = run_eval(problems, ScriptedSource(behaviours), out_dir=tmp_path / "run",
                     options=EvalOptions(device="cpu", workers=1, quick=True, progress=False, plots=False))
    rows = frame.set_index("problem_id")
    assert rows.loc["smoke.silu", "failure_reason"].startswith("cuda_error: ")
    assert "illegal memory access" in rows.loc["smoke.silu", "failure_reason"]
    # The faulty worker left after recording; the next problem ran in a new process.
    assert rows.loc["smoke.relu", "worker_pid"] == rows.loc["smoke.silu", "worker_pid"]
    assert rows.loc["smoke.softmax", "worker_pid"] != rows.loc["smoke.silu", "worker_pid"]
    assert rows.loc["smoke.softmax", "failure_reason"].startswith("incorrect")


def test_a_hanging_sample_is_recorded_as_a_timeout(tmp_path) -> None:
    problems = _smoke("smoke.relu", "smoke.silu")
    frame = run_eval(problems, ScriptedSource({"smoke.relu": "hang", "smoke.silu": "wrong"}),
                     out_dir=tmp_path / "run",
                     options=EvalOptions(device="cpu", workers=1, quick=True, progress=False, plots=False,
                                         timeout_s=4.0))
    rows = frame.set_index("problem_id")
    assert rows.loc["smoke.relu", "failure_reason"].startswith("timeout: no result within 4 s")
    assert rows.loc["smoke.silu", "failure_reason"].startswith("incorrect")


# ---------------------------------------------------------------------------------------------------------
# Resume and shards
# ---------------------------------------------------------------------------------------------------------
def test_resume_after_an_interrupted_run_evaluates_only_the_missing_samples(tmp_path) -> None:
    problems = _smoke("smoke.relu", "smoke.silu", "smoke.softmax")
    out = tmp_path / "run"
    run_eval(problems[:1], ScriptedSource({"smoke.relu": "wrong"}), out_dir=out,
             options=EvalOptions(device="cpu", workers=0, samples_per_problem=2, quick=True, progress=False,
                                 plots=False))
    results = out / "results.jsonl"
    first = results.read_text().splitlines()
    assert len(first) == 2
    # Interrupted while writing the next record: a truncated last line.
    with open(results, "a") as fh:
        fh.write('{"problem_id": "smoke.silu", "suite": "smoke", "sample_ind')

    behaviours = {"smoke.relu": "segfault", "smoke.silu": "wrong", "smoke.softmax": "wrong"}  # relu must not rerun
    frame = run_eval(problems, ScriptedSource(behaviours), out_dir=out,
                     options=EvalOptions(device="cpu", workers=1, samples_per_problem=2, resume=True, quick=True,
                                         progress=False, plots=False))
    lines = results.read_text().splitlines()
    assert lines[:2] == first and len(lines) == 6
    assert all(json.loads(line) for line in lines)  # the truncated line is gone
    keys = sorted(zip(frame["problem_id"], frame["sample_index"], strict=True))
    assert keys == [(p.id, i) for p in sorted(problems, key=lambda p: p.id) for i in (0, 1)]
    assert not frame["failure_reason"].str.startswith("crash").any()
    # Both samples of one problem ran in one worker, in order.
    silu = frame[frame["problem_id"] == "smoke.silu"]
    assert silu["worker_pid"].nunique() == 1
    run = json.loads((out / "run.json").read_text())
    assert [s["resume"] for s in run["sessions"]] == [False, True]
    # Two samples per problem: pass@1 and pass@2 are reported (nothing here is correct).
    assert frame.attrs["summary"]["overall"]["pass_at_k"] == {"1": 0.0, "2": 0.0}


def test_shards_split_the_suite_and_each_report_counts_its_own_problems(tmp_path) -> None:
    seen = []
    for index in range(3):
        out = tmp_path / f"shard{index}"
        frame = run_eval("smoke", ScriptedSource({p.id: "wrong" for p in load_suite("smoke")}), out_dir=out,
                         options=EvalOptions(device="cpu", workers=0, shard=f"{index}/3", quick=True, progress=False,
                                             plots=False))
        summary = frame.attrs["summary"]["overall"]
        assert summary["problems"] == len(frame) == 2
        seen += list(frame["problem_id"])
    assert sorted(seen) == sorted(p.id for p in load_suite("smoke"))
    assert select_problems("smoke", shard=(1, 3)) == select_problems("smoke", shard="1/3")


def test_problem_selection_errors_name_the_fix() -> None:
    with pytest.raises(ValueError, match="unknown problem id.*nope"):
        select_problems("smoke", problem_ids=["smoke.relu", "nope"])
    with pytest.raises(ValueError, match="i/N"):
        select_problems("smoke", shard="2")
    with pytest.raises(ValueError, match="unknown eval source"):
        source_from_name("triton-magic")
    with pytest.raises(ValueError, match="CUDA is not available"):
        if torch.cuda.is_available():
            pytest.skip("this machine has CUDA")
        run_eval("smoke", "compile", out_dir="unused", options=EvalOptions(device="cuda"))


def test_eval_options_refuse_bad_values_when_made_and_name_the_fix() -> None:
    for bad, match in [
        (dict(samples_per_problem=0), "samples_per_problem must be an int >= 1"),
        (dict(samples_per_problem=True), "samples_per_problem"),
        (dict(workers=-1), "workers must be None .* or an int >= 0"),
        (dict(backend="slurm"), "backend must be one of local, ray"),
        (dict(timeout_s=0), "timeout_s must be None or a finite number"),
        (dict(timeout_s=float("inf")), "timeout_s"),
        (dict(shard="2"), "i/N"),
        (dict(shard=(3, 3)), "0 <= i < N"),
    ]:
        with pytest.raises(ValueError, match=match):
            EvalOptions(**bad)
    with pytest.raises(TypeError, match=r"pass \[id, ...\]"):
        EvalOptions(problem_ids="smoke.relu")
    with pytest.raises(TypeError, match="options must be an evals.EvalOptions"):
        run_eval("smoke", "compile", out_dir="unused", options={"device": "cpu"})  # type: ignore[arg-type]
    options = EvalOptions(problem_ids=["smoke.relu"], shard=[0, 2])
    assert options.problem_ids == ("smoke.relu",) and options.shard == (0, 2)
    assert options.replace(quick=True).resolved_kernel_utils().rounds == QUICK_KERNEL_UTILS.rounds
    assert EvalOptions().resolved_kernel_utils() == KernelUtils()


def test_worker_plans_and_work_grouping() -> None:
    assert [p.device for p in plan_workers("cpu", 3)] == ["cpu"] * 3
    assert plan_workers("cpu", None)[0].env["TRITON_INTERPRET"] == os.environ.get("TRITON_INTERPRET", "1")
    with pytest.raises(ValueError, match="workers"):
        plan_workers("cpu", -1)
    relu, silu = _smoke("smoke.relu", "smoke.silu")
    items = group_work([(relu, 0), (silu, 0), (relu, 1)])
    assert items == [WorkItem(relu, (0, 1)), WorkItem(silu, (0,))]


def test_sdpa_source_records_other_functions_as_unsupported(tmp_path) -> None:
    frame = run_eval(_smoke("smoke.relu"), SDPASource("math"), out_dir=tmp_path / "run",
                     options=EvalOptions(device="cpu", workers=0, quick=True, progress=False, plots=False))
    assert frame.loc[0, "failure_reason"].startswith("unsupported: sdpa-math only provides scaled_dot_product")
    assert frame.loc[0, "source"] == "sdpa-math"
    with pytest.raises(ValueError, match="unknown SDPA backend"):
        SDPASource("warp-speed")


def test_sdpa_source_runs_attention_problems(tmp_path) -> None:
    suite = {
        "suite": "attn",
        "problems": [{
            "id": "tiny.sdpa",
            "function": "scaled_dot_product_attention",
            "provenance": {"model": "toy", "layer": "attention", "source": "test"},
            "calls": [{"count": 2, "args": [{"tensor": {"shape": [1, 2, 8, 16], "dtype": "float32"}}] * 3,
                       "kwargs": {"is_causal": True}}],
        }],
    }
    path = tmp_path / "attn.json"
    path.write_text(json.dumps(suite))
    frame = run_eval(path, "sdpa", out_dir=tmp_path / "run",
                     options=EvalOptions(device="cpu", workers=0, quick=True, progress=False, plots=False))
    row = frame.iloc[0]
    assert row["correct"], row["failure_reason"]
    assert row["candidate"].startswith("PyTorch SDPA") and row["compile_ms"] > 0 and row["flops"] > 0


# ---------------------------------------------------------------------------------------------------------
# KernelBench-format module problems
# ---------------------------------------------------------------------------------------------------------
MLP = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    """A linear layer followed by ReLU."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return torch.relu(self.linear(x))


def get_inputs():
    return [torch.rand(4, 16)]


def get_init_inputs():
    return [16, 8]
'''

MLP_NEW = '''
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return torch.clamp_min(torch.addmm(self.linear.bias, x, self.linear.weight.t()), 0.0)
'''

# |linear(x)| instead of relu(linear(x)): wrong wherever the linear output is negative.
MLP_WRONG = MLP_NEW.replace("torch.clamp_min(", "torch.abs(").replace(", 0.0)", ")")

LOSS = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, predictions, targets):
        return torch.nn.functional.cross_entropy(predictions, targets)


def get_inputs():
    return [torch.rand(8, 10), torch.randint(0, 10, (8,))]


def get_init_inputs():
    return []
'''

LOSS_NEW = '''
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, predictions, targets):
        if targets.dtype != torch.int64:
            raise TypeError(f"targets must stay int64, got {targets.dtype}")
        logp = predictions - torch.logsumexp(predictions, dim=1, keepdim=True)
        return -logp.gather(1, targets[:, None]).mean()
'''

CRASHING_NEW = '''
import os
import signal
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, predictions, targets):
        os.kill(os.getpid(), signal.SIGSEGV)
'''


def _kernelbench(tmp_path: Path) -> Path:
    level = tmp_path / "KernelBench" / "level1"
    level.mkdir(parents=True)
    (level / "1_LinearReLU.py").write_text(textwrap.dedent(MLP))
    (level / "2_LinearReLUAgain.py").write_text(textwrap.dedent(MLP))
    (level / "3_CrossEntropy.py").write_text(textwrap.dedent(LOSS))
    return tmp_path / "KernelBench"


def test_kernelbench_module_problems_correct_and_wrong_candidates(tmp_path) -> None:
    folder = _kernelbench(tmp_path)
    modules = {"level1/1_LinearReLU": MLP_NEW, "level1/2_LinearReLUAgain": MLP_WRONG,
               "level1/3_CrossEntropy": LOSS_NEW}
    frame = run_eval(folder, ScriptedSource(modules=modules), out_dir=tmp_path / "run",
                     options=EvalOptions(device="cpu", workers=0, quick=True, progress=False, plots=False))
    rows = frame.set_index("problem_id")
    assert rows["suite"].eq("kernelbench-level1").all() and rows["kind"].eq("module").all()
    good = rows.loc["level1/1_LinearReLU"]
    assert good["correct"], good["failure_reason"]
    assert good["latency_ms"] > 0 and good["eager_ms"] > 0 and good["compile_ms"] > 0
    bad = rows.loc["level1/2_LinearReLUAgain"]
    assert not bad["correct"] and bad["compiled"] and bad["failure_reason"].startswith("incorrect: seed 42")
    # Integer targets keep their dtype through get_inputs() and the fresh draws.
    loss = rows.loc["level1/3_CrossEntropy"]
    assert loss["correct"], loss["failure_reason"]


def test_kernelbench_candidate_that_cannot_be_built_and_one_that_crashes(tmp_path) -> None:
    folder = _kernelbench(tmp_path)
    modules = {"level1/1_LinearReLU": MLP_NEW.replace("class ModelNew", "class ModelOld"),
               "level1/3_CrossEntropy": CRASHING_NEW}
    frame = run_eval(folder, ScriptedSource(modules=modules), out_dir=tmp_path / "run",
                     options=EvalOptions(device="cpu", workers=1, quick=True, progress=False, plots=False))
    rows = frame.set_index("problem_id")
    assert rows.loc["level1/1_LinearReLU", "failure_reason"].startswith("compile error: seed 42: building ModelNew")
    assert rows.loc["level1/2_LinearReLUAgain", "failure_reason"].startswith("unsupported")
    assert rows.loc["level1/3_CrossEntropy", "failure_reason"] == "crash: worker died with signal SIGSEGV"
    assert frame.attrs["summary"]["overall"]["problems"] == 3


def test_compile_source_on_a_module_problem(tmp_path) -> None:
    problems = load_kernelbench_folder(_kernelbench(tmp_path) / "level1")[:1]
    frame = run_eval(problems, CompileSource(), out_dir=tmp_path / "run",
                     options=EvalOptions(device="cpu", workers=0, quick=True, progress=False, plots=False))
    row = frame.iloc[0]
    assert row["correct"], row["failure_reason"]
    assert row["candidate"] == "torch.compile(Model)" and row["latency_ms"] > 0


def test_records_frame_is_a_dataframe_with_metric_columns(tmp_path) -> None:
    frame = run_eval(_smoke("smoke.relu"), ScriptedSource({"smoke.relu": "wrong"}), out_dir=tmp_path / "run",
                     options=EvalOptions(device="cpu", workers=0, quick=True, progress=False, plots=False))
    assert isinstance(frame, pd.DataFrame)
    for column in ("problem_id", "suite", "sample_index", "compiled", "correct", "speedup_eager", "wall_s"):
        assert column in frame.columns
    assert frame.loc[0, "wall_s"] > 0


# ---------------------------------------------------------------------------------------------------------
# Typed outcomes: harness failures are never the candidate's
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("failure", "out_of_memory"), [("raise", False), ("oom", True), ("memory_error", True)])
def test_a_failing_reference_is_a_harness_error_not_incorrect(failure: str, out_of_memory: bool) -> None:
    from evals.sources.evaluation import evaluate_problem
    from tests.forge.sandbox.harness_faults import FailingReferenceUtils

    utils = FailingReferenceUtils(fresh_inputs_per_sample=0, warmup=1, rounds=3, min_run_time_s=0.0, failure=failure)
    record = evaluate_problem(ScriptedSource(), _smoke("smoke.relu")[0], 0, "cpu", kernel_utils=utils)
    assert record["failure_reason"].startswith("harness_error: the reference"), record["failure_reason"]
    assert record["failure"] == "harness_error"
    assert record["outcome"] == "harness_error" and record["out_of_memory"] is out_of_memory
    assert not record["correct"] and not record.get("errors")
    assert summarize(pd.DataFrame([record]))["failure_reasons"] == {"harness_error": 1}


def test_records_carry_the_typed_outcome(tmp_path) -> None:
    from evals.sources.evaluation import evaluate_problem

    behaviours = {"smoke.relu": "wrong", "smoke.silu": "raise", "smoke.softmax": "unsupported"}
    source = ScriptedSource(behaviours)
    outcomes = {p.id: evaluate_problem(source, p, 0, "cpu", kernel_utils=QUICK)["outcome"]
                for p in _smoke("smoke.relu", "smoke.silu", "smoke.softmax", "smoke.rms_norm")}
    assert outcomes == {"smoke.relu": "mismatch", "smoke.silu": "runtime_error", "smoke.softmax": None,
                        "smoke.rms_norm": "ok"}


def test_eager_source_measures_the_harness_alone(tmp_path) -> None:
    """Eager as its own candidate: correct everywhere, every check run (untrusted), the timer's noise floor."""
    problems = [*_smoke("smoke.relu"), *load_kernelbench_folder(_kernelbench(tmp_path) / "level1")[:1]]
    frame = run_eval(problems, "eager", out_dir=tmp_path / "run",
                     options=EvalOptions(device="cpu", workers=0, quick=True, progress=False, plots=False))
    assert frame["correct"].all(), frame[["problem_id", "failure_reason"]]
    assert set(frame["candidate"]) == {"F.relu (eager)", "Model (eager)"}
    assert (frame["harness_s"] > 0).all() and (frame["generation_s"] < frame["harness_s"]).all()
    assert (frame["speedup_eager"] > 0).all()


def test_large_module_inputs_get_one_seed_and_the_record_says_so(tmp_path, monkeypatch) -> None:
    """Over the size threshold the module check uses the first seed only (KernelBench shipped sizes fit one GPU);
    the judge's rule (tests/forge/judging/test_module_check.py), and the record says so."""
    from evals.sources.evaluation import evaluate_problem
    from forge.judging import modules

    problem = load_kernelbench_folder(_kernelbench(tmp_path) / "level1")[0]
    monkeypatch.setattr(modules, "LARGE_MODULE_INPUT_BYTES", 0)
    record = evaluate_problem(ScriptedSource(modules={problem.id: MLP_NEW}), problem, 0, "cpu", kernel_utils=QUICK)
    assert record["correct"] and record["oracle_scaled"], record["failure_reason"]
    assert any("checked on seed 42 only" in note for note in record["notes"])


def test_a_slow_first_seed_stops_the_module_check_there_and_the_record_says_why(tmp_path, monkeypatch) -> None:
    """A module whose first seed takes longer than SLOW_MODULE_SEED_S to check (a float64 3-D transposed
    convolution) is checked on that seed only (the judge's rule), and the record says why."""
    from evals.sources.evaluation import evaluate_problem
    from forge.judging import modules

    problem = load_kernelbench_folder(_kernelbench(tmp_path) / "level1")[0]
    monkeypatch.setattr(modules, "SLOW_MODULE_SEED_S", 0.0)
    record = evaluate_problem(ScriptedSource(modules={problem.id: MLP_NEW}), problem, 0, "cpu", kernel_utils=QUICK)
    assert record["correct"] and record["oracle_scaled"], record["failure_reason"]
    assert any("the reference is slow" in note for note in record["notes"])


def test_large_module_outputs_stop_the_check_after_the_first_seed(tmp_path, monkeypatch) -> None:
    """KernelBench's 63_conv_standard_2D reads 1 GiB and writes 8.5 GB; inputs and outputs together over the size
    threshold stop the module check after its first seed (the judge's rule), and the record says so."""
    from evals.sources.evaluation import evaluate_problem
    from forge.checking.expectation import tensor_bytes
    from forge.judging import MODULE_SEEDS, modules

    problem = load_kernelbench_folder(_kernelbench(tmp_path) / "level1")[0]
    _, inputs = problem.instantiate(torch.device("cpu"), MODULE_SEEDS[0])
    monkeypatch.setattr(modules, "LARGE_MODULE_INPUT_BYTES", tensor_bytes(inputs))  # inputs alone: not over it
    record = evaluate_problem(ScriptedSource(modules={problem.id: MLP_NEW}), problem, 0, "cpu", kernel_utils=QUICK)
    assert record["correct"] and record["oracle_scaled"], record["failure_reason"]
    assert any("inputs and outputs over" in note for note in record["notes"])


class _WrongWhenTimed:
    """Correct until the benchmark starts building its inputs, then off by one: a kernel that tells timing apart."""

    timing = False

    def __init__(self, fn) -> None:
        self.fn = fn

    def __call__(self, *args, **kwargs):
        out = self.fn(*args, **kwargs)
        return out + 1.0 if _WrongWhenTimed.timing else out


class _TimedPassSource(EvalSource):
    @property
    def name(self) -> str:
        return "wrong-when-timed"

    def function_candidate(self, problem, samples, device, kernel_utils) -> Candidate:
        return Candidate(name="detector", fn=_WrongWhenTimed(original_function(problem.function)))

    def module_candidate(self, problem, device, kernel_utils) -> Candidate:
        return Candidate(name="detector", build=lambda seed: _WrongWhenTimed(problem.instantiate(device, seed)[0]))


def test_a_candidate_wrong_only_while_timed_is_incorrect_for_function_and_module_problems(tmp_path, monkeypatch):
    """Issue 10: the eval spot-checks timed passes (function and module problems alike), so a candidate that passes
    the oracle and the probes and then computes something else while timed is recorded as incorrect."""
    from evals.sources.evaluation import evaluate_problem
    from forge.checking import benchmarking

    build_inputs = benchmarking._InputSource.__init__

    def timing_starts(self, *args, **kwargs):
        _WrongWhenTimed.timing = True
        build_inputs(self, *args, **kwargs)

    monkeypatch.setattr(benchmarking._InputSource, "__init__", timing_starts)
    problems = [_smoke("smoke.relu")[0], load_kernelbench_folder(_kernelbench(tmp_path) / "level1")[0]]
    for problem in problems:
        _WrongWhenTimed.timing = False
        record = evaluate_problem(_TimedPassSource(), problem, 0, "cpu", kernel_utils=QUICK)
        assert not record["correct"], problem.id
        assert record["failure_reason"].startswith("incorrect") and "spot check" in record["failure_reason"], record
