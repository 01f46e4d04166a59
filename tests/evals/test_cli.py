"""`kforge eval`: argument parsing and a real run over the smoke suite with torch.compile."""

from __future__ import annotations

import json

import pytest

from evals import EvalOptions
from evals.cli import build_source, default_out_dir, eval_options, summary_table
from forge.checking import KernelUtils
from kforge.cli import build_parser, main


def _parse(*argv: str):
    return build_parser().parse_args(["eval", *argv])


def test_eval_arguments_parse_with_defaults() -> None:
    args = _parse("smoke")
    assert args.suite == "smoke" and args.source == "llm" and args.samples == 1 and args.workers is None
    assert args.backend == "local" and args.device == "auto" and not args.resume and args.shard is None
    args = _parse("builtin", "--source", "sdpa-flash", "--samples", "4", "--workers", "0", "--out", "runs/x",
                  "--resume", "--shard", "1/4", "--device", "cuda:1", "--backend", "ray", "--problems", "a, b,c",
                  "--quick", "--timeout", "30")
    assert args.source == "sdpa-flash" and args.samples == 4 and args.workers == 0 and args.resume
    assert args.shard == "1/4" and args.backend == "ray" and args.problems == ["a", "b", "c"] and args.timeout == 30
    assert eval_options(args) == EvalOptions(
        samples_per_problem=4, problem_ids=("a", "b", "c"), shard="1/4", device="cuda:1", workers=0, backend="ray",
        timeout_s=30.0, kernel_utils=KernelUtils(), quick=True, resume=True)
    assert eval_options(_parse("smoke", "--no-plots")).device is None  # auto: run_eval picks CUDA when available
    args = _parse("smoke", "--replay", "c.jsonl", "--model", "m", "--candidates", "1", "--optimize-rounds", "0")
    assert args.replay == "c.jsonl" and args.record is None and args.candidates == 1 and args.optimize_rounds == 0


@pytest.mark.parametrize("argv", [
    ["--source", "triton"], ["--samples", "0"], ["--shard", "4/4"], ["--shard", "x"], ["--workers", "-1"],
    ["--record", "a.jsonl", "--replay", "b.jsonl"], ["--backend", "slurm"], ["--timeout", "0"],
    ["--language", "fortran"], ["--language", ","],
])
def test_bad_eval_arguments_are_refused(argv, capsys) -> None:
    with pytest.raises(SystemExit):
        _parse("smoke", *argv)
    assert "error" in capsys.readouterr().err


def test_llm_only_flags_are_refused_for_static_sources() -> None:
    with pytest.raises(ValueError, match="--replay only applies to --source llm"):
        build_source(_parse("smoke", "--source", "compile", "--replay", "x.jsonl"))
    with pytest.raises(ValueError, match="--language only applies to --source llm"):
        build_source(_parse("smoke", "--source", "compile", "--language", "cuda"))
    assert _parse("smoke", "--language", "Triton,cuda,triton").language == ("triton", "cuda")
    with pytest.raises(ValueError, match="no such cassette"):
        build_source(_parse("smoke", "--replay", "/nonexistent/cassette.jsonl"))


def test_record_and_replay_flags_configure_the_llm_cassette(tmp_path, monkeypatch) -> None:
    for name in ("KFORGE_LLM_MODEL", "KFORGE_LLM_BASE_URL", "OPENAI_BASE_URL", "KFORGE_LLM_API_KEY", "OPENAI_API_KEY",
                 "KFORGE_CASSETTE", "KFORGE_CASSETTE_MODE"):
        monkeypatch.delenv(name, raising=False)
    record = tmp_path / "new.jsonl"
    with pytest.raises(ValueError, match="needs a model and an endpoint"):
        build_source(_parse("smoke", "--record", str(record)))
    monkeypatch.setenv("KFORGE_LLM_BASE_URL", "http://127.0.0.1:9/v1")
    source = build_source(_parse("smoke", "--record", str(record), "--model", "m", "--attempts", "3"))
    assert source.recording and source.config.cassette == record and source.config.model == "m"
    assert source.generator_options == {"attempts": 3} and source.name == "llm:m"
    cassette = tmp_path / "old.jsonl"
    cassette.write_text(json.dumps({"request": {"model": "recorded-model", "messages": []}, "response": {}}) + "\n")
    source = build_source(_parse("smoke", "--replay", str(cassette)))
    assert not source.recording and source.config.cassette_mode == "replay"
    assert source.config.model == "recorded-model"  # replay keys include the model: taken from the cassette


def test_default_out_dir_is_stable_for_resume() -> None:
    assert str(default_out_dir("smoke", "compile")) == "runs/eval/smoke-compile"
    assert str(default_out_dir("suites/my.json", "llm")) == "runs/eval/my-llm"
    assert str(default_out_dir("/data/KernelBench/level1", "llm")) == "runs/eval/level1-llm"


def test_cli_run_on_smoke_with_compile_prints_the_tables_and_report_paths(tmp_path, capsys) -> None:
    out = tmp_path / "run"
    code = main(["eval", "smoke", "--source", "compile", "--device", "cpu", "--quick", "--workers", "1",
                 "--problems", "smoke.relu,smoke.layer_norm", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0
    assert "smoke.relu" in printed and "smoke.layer_norm" in printed and "smoke.silu" not in printed
    assert "correct rate" in printed and "100.0%" in printed
    for name in ("report.md", "summary.json", "speedup_eager.png", "results.jsonl"):
        assert str(out / name) in printed
    summary = json.loads((out / "summary.json").read_text())["overall"]
    assert summary["problems"] == 2 and summary["correct_rate"] == 1.0

    # Running again without --resume is refused with the fix; with --resume nothing is left to do.
    assert main(["eval", "smoke", "--source", "compile", "--device", "cpu", "--out", str(out),
                 "--problems", "smoke.relu,smoke.layer_norm"]) == 2
    assert "--resume" in capsys.readouterr().err
    assert main(["eval", "smoke", "--source", "compile", "--device", "cpu", "--out", str(out), "--resume",
                 "--problems", "smoke.relu,smoke.layer_norm", "--no-plots"]) == 0
    assert len((out / "results.jsonl").read_text().splitlines()) == 2


def test_cli_reports_a_bad_suite_clearly(tmp_path, capsys) -> None:
    assert main(["eval", str(tmp_path / "missing.json"), "--source", "compile", "--device", "cpu",
                 "--out", str(tmp_path / "o")]) == 2
    assert "kforge eval:" in capsys.readouterr().err


def test_summary_table_shows_the_headline_metrics() -> None:
    summary = {"problems": 4, "compile_rate": 0.75, "correct_rate": 0.5,
               "fast_p": {"eager": {"fast_0": 0.5, "fast_1": 0.25}, "compile": None},
               "geomean_speedup": {"eager": 1.5, "compile": None}, "pass_at_k": {"2": 0.6},
               "cost": {"total_usd": 0.1}, "failure_reasons": {"crash": 1, "incorrect": 1}}
    table = summary_table(summary).set_index("metric")["value"]
    assert table["correct rate"] == "50.0%" and table["fast_1 vs eager"] == "25.0%"
    assert table["geomean speedup vs eager"] == "1.500x" and table["geomean speedup vs compile"] == "-"
    assert table["pass@2"] == "60.0%" and table["failures"] == "crash: 1, incorrect: 1"


def test_cli_timing_mode_is_the_clock_of_the_run(tmp_path, capsys) -> None:
    out = tmp_path / "run"
    assert main(["eval", "smoke", "--source", "compile", "--device", "cpu", "--quick", "--workers", "0",
                 "--problems", "smoke.relu", "--timing", "device", "--no-plots", "--out", str(out)]) == 0
    settings = json.loads((out / "run.json").read_text())
    assert settings["kernel_utils"]["timing"] == "device"
    with pytest.raises(SystemExit):
        main(["eval", "smoke", "--source", "compile", "--timing", "wall", "--out", str(tmp_path / "x")])
    assert "invalid choice: 'wall'" in capsys.readouterr().err
