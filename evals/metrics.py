"""Standard eval metrics as pure functions over a DataFrame of per-problem records.

One record (row) per evaluated sample of a problem. Columns (`RECORD_COLUMNS`; missing ones read as empty):

| column | meaning |
|---|---|
| `problem_id` | the problem's id (`Problem.id`) |
| `suite` | the suite it belongs to |
| `sample_index` | 0, 1, ... when several independent samples of one problem are evaluated (pass@k); default 0 |
| `compiled` | the candidate loaded/compiled and ran (bool) |
| `correct` | it passed the correctness check (bool) |
| `attempts` | generation attempts (agent turns) spent on this sample |
| `latency_ms` | the candidate's time per call (count-weighted sum over the problem's calls) |
| `eager_ms` | PyTorch eager's time for the same work |
| `compile_ms` | `torch.compile`'s time for the same work |
| `speedup_eager` | `eager_ms / latency_ms` |
| `speedup_compile` | `compile_ms / latency_ms` |
| `cuda_graphs_ms` | eager replayed from a CUDA graph of one pass (host-inclusive timing on CUDA only) |
| `speedup_cuda_graphs` | `cuda_graphs_ms / latency_ms` |
| `prompt_tokens`, `completion_tokens` | LLM tokens spent |
| `cost_usd` | LLM cost in US dollars |
| `wall_s` | wall-clock seconds spent on the sample (generation + checking + timing) |
| `generation_s` | seconds the source spent producing the candidate (LLM turns, sandbox checks) |
| `harness_s` | `wall_s - generation_s`: the harness's own validation and timing |
| `failure` | why it is not correct: an `evals.failures.Failure` value (`mismatch`, `compile_error`...), or None |
| `outcome` | the judge's verdict, a `forge.outcome.Outcome` value (None when no candidate was judged) |
| `failure_reason` | the same for people: `"<label>: <detail>"` (e.g. `"compile error: ..."`) |
| `bytes_moved`, `flops` | the work the problem needs (for the roofline) |
| `roofline_floor_ms` | the lower bound from bytes/bandwidth and flops/peak |

Summaries count failures by their `failure` value.

Conventions (as in KernelBench): rates and `fast_p` divide by ALL problems (pass `total` to count problems that
have no record at all), so a missing, failed or unmeasured problem counts against; per-problem metrics use each
problem's first sample (lowest `sample_index`); pass@k uses all samples.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, Literal

import pandas as pd

__all__ = [
    "BASELINES",
    "FAST_P_THRESHOLDS",
    "RECORD_COLUMNS",
    "Baseline",
    "compile_rate",
    "correct_rate",
    "cost_per_correct",
    "cost_per_problem",
    "failure_category",
    "fast_p",
    "geomean_speedup",
    "normalize_records",
    "pass_at_k",
    "pass_at_k_estimate",
    "per_problem",
    "problem_count",
    "roofline_fraction",
    "mean_roofline_fraction",
    "summarize",
    "summarize_by_suite",
]

Baseline = Literal["eager", "compile", "cuda_graphs"]
BASELINES: tuple[str, ...] = ("eager", "compile", "cuda_graphs")

FAST_P_THRESHOLDS: tuple[float, ...] = (0.0, 1.0, 1.5, 2.0)

RECORD_COLUMNS: dict[str, str] = {
    "problem_id": "the problem's id",
    "suite": "the suite the problem belongs to",
    "sample_index": "index of this independent sample of the problem (pass@k); default 0",
    "compiled": "the candidate loaded/compiled and ran (bool)",
    "correct": "the candidate passed the correctness check (bool)",
    "attempts": "generation attempts spent on this sample",
    "latency_ms": "candidate time (count-weighted over the problem's calls), ms",
    "eager_ms": "PyTorch eager time for the same work, ms",
    "compile_ms": "torch.compile time for the same work, ms",
    "speedup_eager": "eager_ms / latency_ms",
    "speedup_compile": "compile_ms / latency_ms",
    "cuda_graphs_ms": "eager replayed from a CUDA graph of one pass (host-inclusive timing on CUDA only), ms",
    "speedup_cuda_graphs": "cuda_graphs_ms / latency_ms",
    "prompt_tokens": "LLM prompt tokens",
    "completion_tokens": "LLM completion tokens",
    "cost_usd": "LLM cost, US dollars",
    "wall_s": "wall-clock seconds spent on the sample",
    "generation_s": "seconds the source spent producing the candidate",
    "harness_s": "wall_s - generation_s: the harness's own validation and timing",
    "failure": "why it is not correct (an evals.failures.Failure value)",
    "outcome": "the judge's verdict (a forge.outcome.Outcome value)",
    "failure_reason": "short reason when not correct, for people",
    "bytes_moved": "bytes the problem must move (roofline)",
    "flops": "floating-point operations the problem needs (roofline)",
    "roofline_floor_ms": "lower bound on latency from bytes/bandwidth and flops/peak, ms",
}

_BOOL_COLUMNS = ("compiled", "correct")
_TEXT_COLUMNS = ("problem_id", "suite", "failure", "outcome", "failure_reason")
_KEY = ["suite", "problem_id"]


def normalize_records(records: pd.DataFrame | Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """A copy with every `RECORD_COLUMNS` column present and typed: booleans (missing -> False), numbers
    (missing -> NaN), `sample_index` (missing -> 0), `suite` (missing -> ""). Extra columns are kept."""
    df = records.copy() if isinstance(records, pd.DataFrame) else pd.DataFrame(list(records))
    for column in RECORD_COLUMNS:
        if column not in df.columns:
            df[column] = None
    if df["problem_id"].isna().any():
        raise ValueError("every record needs a problem_id")
    df["problem_id"] = df["problem_id"].astype(str)
    df["suite"] = df["suite"].where(df["suite"].notna(), "").astype(str)
    for column in _BOOL_COLUMNS:
        df[column] = df[column].map(lambda v: bool(v) if v is not None and not _isnan(v) else False).astype(bool)
    df["sample_index"] = pd.to_numeric(df["sample_index"], errors="coerce").fillna(0).astype(int)
    for column in RECORD_COLUMNS:
        if column not in _BOOL_COLUMNS and column not in _TEXT_COLUMNS and column != "sample_index":
            df[column] = pd.to_numeric(df[column], errors="coerce").astype(float)
    reasons = df["failure_reason"].astype(object)
    df["failure_reason"] = reasons.where(reasons.notna(), None)
    # A candidate cannot be correct without having compiled.
    df.loc[df["correct"], "compiled"] = True
    return df


def _isnan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def per_problem(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (suite, problem_id): the sample with the lowest `sample_index`."""
    df = normalize_records(df)
    return df.sort_values([*_KEY, "sample_index"], kind="stable").drop_duplicates(_KEY, keep="first")


def problem_count(df: pd.DataFrame, total: int | None = None) -> int:
    """The denominator of rates: `total` when given (it must cover every recorded problem), else the number of
    distinct (suite, problem_id) pairs."""
    recorded = len(per_problem(df))
    if total is None:
        return recorded
    if total < recorded:
        raise ValueError(f"total={total} is below the {recorded} distinct problems recorded")
    return int(total)


def _rate(mask: pd.Series, n: int) -> float:
    return float(mask.sum()) / n if n else math.nan


def compile_rate(df: pd.DataFrame, total: int | None = None) -> float:
    """Share of all problems whose (first) candidate compiled."""
    return _rate(per_problem(df)["compiled"], problem_count(df, total))


def correct_rate(df: pd.DataFrame, total: int | None = None) -> float:
    """Share of all problems whose (first) candidate is correct."""
    return _rate(per_problem(df)["correct"], problem_count(df, total))


def _speedup_column(baseline: str) -> str:
    if baseline not in BASELINES:
        raise ValueError(f"baseline must be one of {', '.join(BASELINES)}, got {baseline!r}")
    return f"speedup_{baseline}"


def fast_p(df: pd.DataFrame, p: float, baseline: Baseline = "eager", total: int | None = None) -> float:
    """Share of ALL problems that are correct and have speedup over `baseline` strictly above `p`.

    Failed, missing and unmeasured (NaN speedup) problems count as failures; `fast_p(df, 0)` is the correct rate
    among measured problems.
    """
    rows = per_problem(df)
    speedup = rows[_speedup_column(baseline)]
    return _rate(rows["correct"] & speedup.notna() & (speedup > p), problem_count(df, total))


def geomean_speedup(df: pd.DataFrame, baseline: Baseline = "eager") -> float:
    """Geometric mean of the speedup over `baseline` across correct problems with a measured speedup (NaN if none)."""
    rows = per_problem(df)
    speedup = rows.loc[rows["correct"], _speedup_column(baseline)]
    speedup = speedup[speedup.notna() & (speedup > 0) & speedup.map(math.isfinite)]
    if speedup.empty:
        return math.nan
    return float(math.exp(sum(math.log(s) for s in speedup) / len(speedup)))


def pass_at_k_estimate(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem with `n` samples of which `c` are correct: 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass@{k} needs at least {k} samples per problem, got {n}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_at_k(df: pd.DataFrame, k: int, total: int | None = None) -> float:
    """Unbiased pass@k averaged over problems (problems without records count as 0 when `total` is given).

    Every recorded problem needs at least `k` samples; a `ValueError` names those that have fewer.
    """
    df = normalize_records(df)
    groups = df.groupby(_KEY, sort=True)["correct"].agg(["size", "sum"])
    short = groups[groups["size"] < k]
    if not short.empty:
        names = ", ".join(f"{s}:{p} ({n})" for (s, p), n in short["size"].items())
        raise ValueError(f"pass@{k} needs at least {k} samples per problem; too few for {names}")
    n = problem_count(df, total)
    if n == 0:
        return math.nan
    return sum(pass_at_k_estimate(int(size), int(ok), k) for size, ok in groups.itertuples(index=False)) / n


def cost_per_problem(df: pd.DataFrame, total: int | None = None) -> float:
    """Total LLM cost of all samples divided by the number of problems."""
    n = problem_count(df, total)
    return float(normalize_records(df)["cost_usd"].fillna(0).sum()) / n if n else math.nan


def cost_per_correct(df: pd.DataFrame) -> float:
    """Total LLM cost of all samples divided by the number of correct kernels (samples); NaN if none is correct."""
    df = normalize_records(df)
    correct = int(df["correct"].sum())
    return float(df["cost_usd"].fillna(0).sum()) / correct if correct else math.nan


def roofline_fraction(df: pd.DataFrame) -> pd.Series:
    """Per row: `roofline_floor_ms / latency_ms` (1.0 = at the hardware floor) for correct rows, NaN otherwise."""
    df = normalize_records(df)
    valid = df["correct"] & (df["latency_ms"] > 0) & (df["roofline_floor_ms"] > 0)
    return (df["roofline_floor_ms"] / df["latency_ms"]).where(valid)


def mean_roofline_fraction(df: pd.DataFrame) -> float:
    """Mean fraction of the roofline reached over correct problems that have a floor (NaN if none)."""
    fractions = roofline_fraction(per_problem(df)).dropna()
    return float(fractions.mean()) if not fractions.empty else math.nan


def failure_category(failure: Any) -> str:
    """A record's `failure` value as counted in summaries (`"unknown"` when the record has none)."""
    if failure is None or (isinstance(failure, float) and math.isnan(failure)) or not str(failure):
        return "unknown"
    return str(failure)


def _clean(value: Any) -> Any:
    """JSON-safe: NaN/inf -> None, numpy scalars -> Python."""
    if hasattr(value, "item") and not isinstance(value, (list, dict, str)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def summarize(df: pd.DataFrame, total: int | None = None) -> dict[str, Any]:
    """Every metric in one JSON-safe dict (unavailable values are None).

    Keys: `problems`, `samples`, `compile_rate`, `correct_rate`, `fast_p` (`{baseline: {"fast_0": ..., "fast_1": ...,
    "fast_1.5": ..., "fast_2": ...}}` for each of `BASELINES`; a baseline with no measured speedup at all is None),
    `geomean_speedup` (`{"eager": ..., "compile": ...}`), `pass_at_k` (`{"1": ..., "2": ...}` for k in 1, 2, 5,
    10, 20, 50, 100 up to the fewest samples of any problem; empty with one sample per problem), `cost`
    (`total_usd`, `per_problem_usd`, `per_correct_usd`), `tokens` (`prompt`, `completion`), `roofline_fraction`
    (`mean`, `median`), `mean_attempts`, `wall_s` (summed over samples: with several workers more than the run's
    elapsed time), `harness_s` (`total`, `max`), `failure_reasons` (`{failure_category: problems}`, plus
    `"missing"` for problems without a record).
    """
    df = normalize_records(df)
    rows = per_problem(df)
    n = problem_count(df, total)
    fast: dict[str, Any] = {}
    geomean: dict[str, Any] = {}
    for baseline in BASELINES:
        measured = rows[f"speedup_{baseline}"].notna().any()
        fast[baseline] = (
            {f"fast_{p:g}": _clean(fast_p(df, p, baseline, total)) for p in FAST_P_THRESHOLDS} if measured else None
        )
        geomean[baseline] = _clean(geomean_speedup(df, baseline)) if measured else None
    pass_k: dict[str, Any] = {}
    if not df.empty:
        fewest = int(df.groupby(_KEY)["sample_index"].size().min())
        if df.groupby(_KEY).size().max() > 1:
            pass_k = {str(k): _clean(pass_at_k(df, k, total)) for k in (1, 2, 5, 10, 20, 50, 100) if k <= fewest}
    fractions = roofline_fraction(rows).dropna()
    failures = rows.loc[~rows["correct"], "failure"].map(failure_category)
    missing = n - len(rows)
    reasons = {str(k): int(v) for k, v in failures.value_counts().items()}
    if missing:
        reasons["missing"] = reasons.get("missing", 0) + missing
    return {
        "problems": n,
        "samples": int(len(df)),
        "compile_rate": _clean(compile_rate(df, total)),
        "correct_rate": _clean(correct_rate(df, total)),
        "fast_p": fast,
        "geomean_speedup": geomean,
        "pass_at_k": pass_k,
        "cost": {
            "total_usd": _clean(float(df["cost_usd"].fillna(0).sum())),
            "per_problem_usd": _clean(cost_per_problem(df, total)),
            "per_correct_usd": _clean(cost_per_correct(df)),
        },
        "tokens": {
            "prompt": int(df["prompt_tokens"].fillna(0).sum()),
            "completion": int(df["completion_tokens"].fillna(0).sum()),
        },
        "roofline_fraction": {
            "mean": _clean(float(fractions.mean())) if not fractions.empty else None,
            "median": _clean(float(fractions.median())) if not fractions.empty else None,
        },
        "mean_attempts": _clean(float(df["attempts"].mean())) if df["attempts"].notna().any() else None,
        "wall_s": _clean(float(df["wall_s"].fillna(0).sum())),
        "harness_s": {
            "total": _clean(float(df["harness_s"].fillna(0).sum())),
            "max": _clean(float(df["harness_s"].max())) if df["harness_s"].notna().any() else None,
        },
        "failure_reasons": reasons,
    }


def summarize_by_suite(df: pd.DataFrame, totals: Mapping[str, int] | None = None) -> dict[str, dict[str, Any]]:
    """`summarize` for each suite, keyed by suite name (`totals` optionally gives each suite's problem count)."""
    df = normalize_records(df)
    totals = dict(totals or {})
    suites = sorted(set(df["suite"]) | set(totals))
    return {s: summarize(df[df["suite"] == s], totals.get(s)) for s in suites}
