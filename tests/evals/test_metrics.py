"""Metrics checked against values worked out by hand for a small set of records."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from evals import (
    compile_rate,
    correct_rate,
    cost_per_correct,
    cost_per_problem,
    failure_category,
    fast_p,
    geomean_speedup,
    mean_roofline_fraction,
    normalize_records,
    pass_at_k,
    pass_at_k_estimate,
    roofline_fraction,
    summarize,
    summarize_by_suite,
)

NAN = float("nan")


def records() -> pd.DataFrame:
    """Five problems: A fast, B slow, C wrong, D did not compile, E correct but never timed against compile."""
    return pd.DataFrame([
        dict(problem_id="A", suite="s", compiled=True, correct=True, speedup_eager=2.0, speedup_compile=1.2,
             cost_usd=0.10, latency_ms=0.5, roofline_floor_ms=0.25, prompt_tokens=100, completion_tokens=10,
             attempts=1),
        dict(problem_id="B", suite="s", compiled=True, correct=True, speedup_eager=0.5, speedup_compile=0.4,
             cost_usd=0.20, latency_ms=1.0, roofline_floor_ms=0.1, prompt_tokens=200, completion_tokens=20,
             attempts=2),
        dict(problem_id="C", suite="s", compiled=True, correct=False, speedup_eager=NAN, cost_usd=0.30,
             latency_ms=0.1, roofline_floor_ms=0.1, failure="mismatch", failure_reason="incorrect: max abs 0.5",
             attempts=3),
        dict(problem_id="D", suite="t", compiled=False, correct=False, cost_usd=0.40,
             failure="compile_error", failure_reason="compile error: nvcc exited 1", attempts=3),
        dict(problem_id="E", suite="t", compiled=True, correct=True, speedup_eager=1.6, cost_usd=0.0, attempts=1),
    ])


def test_rates_count_every_problem():
    df = records()
    assert compile_rate(df) == pytest.approx(4 / 5)
    assert correct_rate(df) == pytest.approx(3 / 5)
    # Problems that never produced a record count against when the total is known.
    assert correct_rate(df, total=10) == pytest.approx(3 / 10)
    with pytest.raises(ValueError, match="below the 5 distinct problems"):
        correct_rate(df, total=4)


def test_fast_p_counts_failures_and_missing_speedups_against():
    df = records()
    # vs eager: correct A(2.0), B(0.5), E(1.6); "faster than p" is strict.
    assert fast_p(df, 0) == pytest.approx(3 / 5)
    assert fast_p(df, 1) == pytest.approx(2 / 5)
    assert fast_p(df, 1.5) == pytest.approx(2 / 5)
    assert fast_p(df, 2) == pytest.approx(0 / 5)
    # vs compile: E is correct but unmeasured, so it fails every threshold.
    assert fast_p(df, 0, baseline="compile") == pytest.approx(2 / 5)
    assert fast_p(df, 1, baseline="compile") == pytest.approx(1 / 5)
    assert fast_p(df, 1.5, baseline="compile") == 0.0
    assert fast_p(df, 1, total=10) == pytest.approx(2 / 10)
    with pytest.raises(ValueError, match="baseline must be"):
        fast_p(df, 1, baseline="inductor")


def test_fast_p_ignores_the_speedup_of_a_wrong_kernel():
    df = records()
    df.loc[df["problem_id"] == "C", "speedup_eager"] = 50.0  # fast but wrong: must not count
    assert fast_p(df, 1) == pytest.approx(2 / 5)


def test_geomean_over_correct_problems():
    df = records()
    assert geomean_speedup(df) == pytest.approx((2.0 * 0.5 * 1.6) ** (1 / 3))
    assert geomean_speedup(df, "compile") == pytest.approx((1.2 * 0.4) ** (1 / 2))
    assert math.isnan(geomean_speedup(df[df["problem_id"].isin(["C", "D"])]))


def test_cost_and_roofline():
    df = records()
    assert cost_per_problem(df) == pytest.approx(1.0 / 5)
    assert cost_per_correct(df) == pytest.approx(1.0 / 3)
    assert math.isnan(cost_per_correct(df[df["problem_id"] == "D"]))
    fractions = roofline_fraction(df)
    assert fractions.tolist()[:2] == pytest.approx([0.5, 0.1])
    assert math.isnan(fractions.iloc[2])  # C reached its floor but is wrong: no credit
    assert mean_roofline_fraction(df) == pytest.approx(0.3)


def test_pass_at_k_unbiased_estimator():
    assert pass_at_k_estimate(5, 2, 1) == pytest.approx(0.4)   # 1 - C(3,1)/C(5,1) = 1 - 3/5
    assert pass_at_k_estimate(5, 2, 2) == pytest.approx(0.7)   # 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k_estimate(5, 0, 2) == 0.0
    assert pass_at_k_estimate(5, 4, 2) == 1.0                  # C(1,2) = 0
    with pytest.raises(ValueError, match="at least 6 samples"):
        pass_at_k_estimate(5, 2, 6)
    rows = [dict(problem_id="P", suite="s", sample_index=i, correct=i in (1, 3)) for i in range(5)]
    rows += [dict(problem_id="Q", suite="s", sample_index=i, correct=False) for i in range(5)]
    df = pd.DataFrame(rows)
    assert pass_at_k(df, 1) == pytest.approx((0.4 + 0.0) / 2)
    assert pass_at_k(df, 2) == pytest.approx((0.7 + 0.0) / 2)
    assert pass_at_k(df, 2, total=4) == pytest.approx(0.7 / 4)
    with pytest.raises(ValueError, match="s:P \\(5\\)"):
        pass_at_k(df, 6)
    # Per-problem metrics use the first sample: P's sample 0 is wrong.
    assert correct_rate(df) == 0.0


def test_normalize_fills_missing_columns():
    df = normalize_records([{"problem_id": "x", "correct": np.bool_(True)}, {"problem_id": "y", "compiled": None}])
    assert df["correct"].tolist() == [True, False]
    assert df["compiled"].tolist() == [True, False]  # correct implies compiled
    assert df["sample_index"].tolist() == [0, 0] and df["suite"].tolist() == ["", ""]
    assert df["latency_ms"].isna().all()
    with pytest.raises(ValueError, match="problem_id"):
        normalize_records([{"suite": "s"}])


def test_summarize_holds_every_metric_and_is_json_safe():
    summary = summarize(records(), total=6)
    json.dumps(summary, allow_nan=False)
    assert summary["problems"] == 6 and summary["samples"] == 5
    assert summary["compile_rate"] == pytest.approx(4 / 6) and summary["correct_rate"] == pytest.approx(3 / 6)
    assert summary["fast_p"]["eager"] == pytest.approx({"fast_0": 3 / 6, "fast_1": 2 / 6, "fast_1.5": 2 / 6,
                                                        "fast_2": 0.0})
    assert summary["fast_p"]["compile"]["fast_1"] == pytest.approx(1 / 6)
    assert summary["geomean_speedup"]["eager"] == pytest.approx(1.6 ** (1 / 3))
    assert summary["pass_at_k"] == {}
    assert summary["cost"] == pytest.approx({"total_usd": 1.0, "per_problem_usd": 1 / 6, "per_correct_usd": 1 / 3})
    assert summary["tokens"] == {"prompt": 300, "completion": 30}
    assert summary["roofline_fraction"] == pytest.approx({"mean": 0.3, "median": 0.3})
    assert summary["mean_attempts"] == pytest.approx(2.0)
    assert summary["failure_reasons"] == {"mismatch": 1, "compile_error": 1, "missing": 1}
    no_compile = summarize(records().drop(columns=["speedup_compile"]))
    assert no_compile["fast_p"]["compile"] is None and no_compile["geomean_speedup"]["compile"] is None


def test_failure_category_is_the_typed_failure_never_the_text():
    assert failure_category("compile_error") == "compile_error"
    assert failure_category(None) == failure_category(float("nan")) == failure_category("") == "unknown"


def test_summarize_by_suite():
    by_suite = summarize_by_suite(records(), totals={"t": 3, "u": 1})
    assert sorted(by_suite) == ["s", "t", "u"]
    assert by_suite["s"]["problems"] == 3 and by_suite["s"]["correct_rate"] == pytest.approx(2 / 3)
    assert by_suite["t"]["problems"] == 3 and by_suite["t"]["correct_rate"] == pytest.approx(1 / 3)
    assert by_suite["u"]["correct_rate"] == 0.0 and by_suite["u"]["failure_reasons"] == {"missing": 1}
