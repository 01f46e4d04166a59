"""Report files: summary.json, report.md tables and real PNG plots (and none without matplotlib)."""

from __future__ import annotations

import json
import logging
import sys

import pandas as pd
import pytest

from evals import PLOT_FILES, markdown_table, summarize, write_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def records() -> pd.DataFrame:
    return pd.DataFrame([
        dict(problem_id="llama.rms_norm", suite="builtin", compiled=True, correct=True, attempts=2, latency_ms=0.01,
             eager_ms=0.02, compile_ms=0.04, speedup_eager=2.0, speedup_compile=4.0, cuda_graphs_ms=0.015,
             speedup_cuda_graphs=1.5, prompt_tokens=1200, completion_tokens=300, cost_usd=0.012, wall_s=30.0,
             harness_s=4.25, roofline_floor_ms=0.008),
        dict(problem_id="llama.silu", suite="builtin", compiled=True, correct=True, attempts=1, latency_ms=0.04,
             eager_ms=0.035, compile_ms=0.04, speedup_eager=0.875, speedup_compile=1.0, cost_usd=0.02),
        dict(problem_id="bert.softmax", suite="builtin", compiled=True, correct=False, attempts=3, failure="mismatch",
             failure_reason="incorrect: output | max abs diff 0.5\nat [0, 3]", cost_usd=0.05),
        dict(problem_id="level1/19_ReLU", suite="kernelbench-level1", compiled=False, correct=False, attempts=3,
             failure="compile_error", failure_reason="compile error: " + "x" * 300, cost_usd=0.03),
    ])


def test_a_baseline_the_run_did_not_measure_gets_no_plot(tmp_path):
    df = records().drop(columns=["cuda_graphs_ms", "speedup_cuda_graphs"])
    paths = write_report(df, tmp_path / "out", total=5)
    assert "speedup_cuda_graphs" not in paths and "speedup_compile" in paths
    assert summarize(df, total=5)["fast_p"]["cuda_graphs"] is None
    assert "fast_p vs eager under CUDA graphs | not measured" in paths["report"].read_text()


def test_write_report_writes_json_markdown_and_pngs(tmp_path):
    df = records()
    paths = write_report(df, tmp_path / "out", title="Nightly eval", total=5)
    assert set(paths) == {"summary", "report", *PLOT_FILES}
    for name in PLOT_FILES:
        data = paths[name].read_bytes()
        assert paths[name].name == PLOT_FILES[name] and data.startswith(PNG_MAGIC) and len(data) > 1000

    summary = json.loads(paths["summary"].read_text())
    assert summary["title"] == "Nightly eval"
    assert summary["overall"] == json.loads(json.dumps(summarize(df, total=5)))
    assert set(summary["suites"]) == {"builtin", "kernelbench-level1"}
    assert summary["plots"] == {name: file for name, file in PLOT_FILES.items()}

    text = paths["report"].read_text()
    assert text.startswith("# Nightly eval\n")
    assert "## Suite `builtin`" in text and "## Suite `kernelbench-level1`" in text
    rows = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines() if line.startswith("| ")}
    assert "correct" in rows["llama.rms_norm"] and "| 2.00x | 4.00x | 1.50x |" in rows["llama.rms_norm"]
    assert "| 4.2 |" in rows["llama.rms_norm"]  # harness seconds per problem
    assert "harness time (total / slowest problem) | 4.2 s / 4.2 s" in text
    assert "1200/300" in rows["llama.rms_norm"] and "$0.0120" in rows["llama.rms_norm"]
    assert "100.0%" not in rows["llama.rms_norm"] and "80.0%" in rows["llama.rms_norm"]  # roofline 0.008/0.01
    assert "incorrect: output \\| max abs diff 0.5 at [0, 3]" in rows["bert.softmax"]
    assert "failed" in rows["level1/19_ReLU"] and rows["level1/19_ReLU"].count("x" * 100) == 1
    assert "..." in rows["level1/19_ReLU"]
    assert "missing: 1" in text  # the fifth problem never reported
    assert "compile_error: 1" in text  # failures are counted by their typed `failure`, never by their text
    for file in PLOT_FILES.values():
        assert f"]({file})" in text


def test_report_without_matplotlib_skips_plots_with_a_warning(tmp_path, monkeypatch, caplog):
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)
    with caplog.at_level(logging.WARNING, logger="evals.report"):
        paths = write_report(records(), tmp_path)
    assert set(paths) == {"summary", "report"}
    assert not list(tmp_path.glob("*.png"))
    assert "matplotlib is not installed" in caplog.text
    assert "## Plots" not in paths["report"].read_text()


def test_report_with_no_correct_problem_still_draws(tmp_path):
    df = records()
    df["correct"] = False
    paths = write_report(df, tmp_path)
    assert paths["speedup_eager"].read_bytes().startswith(PNG_MAGIC)


def test_markdown_table_formats_and_rejects_bad_shapes():
    table = markdown_table(["a", "b|c"], [[1, "x\ny"], [None, 2.5]], align="lr")
    assert table.splitlines() == ["| a | b\\|c |", "| :--- | ---: |", "| 1 | x y |", "|  | 2.5 |"]
    with pytest.raises(ValueError, match="row 0 has 1 cells for 2 columns"):
        markdown_table(["a", "b"], [[1]])
    with pytest.raises(ValueError, match="align characters"):
        markdown_table(["a"], [[1]], align="x")
