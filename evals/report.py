"""Write an eval report: `summary.json`, `report.md` (a table per suite, one row per problem) and PNG plots.

Plots need matplotlib (the `plots` extra); without it they are skipped with a logged warning. Plots are drawn on a
bare `matplotlib.figure.Figure` with the Agg canvas, so the global pyplot backend is never touched.
"""

from __future__ import annotations

import datetime as _dt
import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from forge.atomic import write_json_atomic, write_text_atomic
from forge.text import clip

from .metrics import (
    BASELINES,
    FAST_P_THRESHOLDS,
    normalize_records,
    per_problem,
    roofline_fraction,
    summarize,
    summarize_by_suite,
)

__all__ = ["PLOT_FILES", "markdown_table", "write_report"]

logger = logging.getLogger(__name__)

PLOT_FILES = {
    "speedup_eager": "speedup_eager.png",
    "speedup_compile": "speedup_compile.png",
    "speedup_cuda_graphs": "speedup_cuda_graphs.png",
    "cost_vs_speedup": "cost_vs_speedup.png",
}


# ---------------------------------------------------------------------------------------------------------
# Markdown
# ---------------------------------------------------------------------------------------------------------
def _cell(value: Any) -> str:
    text = "" if value is None else str(value)
    return " ".join(text.split()).replace("|", "\\|")


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], align: str | None = None) -> str:
    """A GitHub-flavoured markdown table; `align` has one of `l`, `r`, `c` per column (default left).

    Cells are stringified, newlines folded to spaces and `|` escaped.
    """
    align = align or "l" * len(headers)
    if len(align) != len(headers):
        raise ValueError(f"align has {len(align)} entries for {len(headers)} columns")
    for i, row in enumerate(rows):
        if len(row) != len(headers):
            raise ValueError(f"row {i} has {len(row)} cells for {len(headers)} columns")
    marks = {"l": ":---", "r": "---:", "c": ":---:"}
    try:
        rule = [marks[a] for a in align]
    except KeyError as exc:
        raise ValueError(f"align characters must be l, r or c, got {exc.args[0]!r}") from None
    lines = ["| " + " | ".join(_cell(h) for h in headers) + " |", "| " + " | ".join(rule) + " |"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _num(value: Any, fmt: str = "{:.3g}", suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return fmt.format(value) + suffix


def _pct(value: Any) -> str:
    return _num(value * 100 if isinstance(value, (int, float)) else None, "{:.1f}", "%")


def _usd(value: Any) -> str:
    return _num(value, "${:.4f}")


def _status(row: pd.Series) -> str:
    if row["correct"]:
        return "correct"
    if row["compiled"]:
        return "incorrect"
    return "failed"


def _summary_rows(summary: Mapping[str, Any]) -> list[list[str]]:
    rows = [
        ["problems", str(summary["problems"])],
        ["samples", str(summary["samples"])],
        ["compiled", _pct(summary["compile_rate"])],
        ["correct", _pct(summary["correct_rate"])],
    ]
    for baseline in BASELINES:
        fast = summary["fast_p"].get(baseline)
        if fast is None:
            rows.append([f"fast_p vs {_LABELS[baseline]}", "not measured"])
            continue
        rows.append([f"fast_p vs {_LABELS[baseline]} (p = {', '.join(f'{p:g}' for p in FAST_P_THRESHOLDS)})",
                     " / ".join(_pct(fast[f"fast_{p:g}"]) for p in FAST_P_THRESHOLDS)])
        rows.append([f"geomean speedup vs {_LABELS[baseline]} (correct only)",
                     _num(summary["geomean_speedup"][baseline], "{:.2f}", "x")])
    for k, value in summary["pass_at_k"].items():
        rows.append([f"pass@{k}", _pct(value)])
    cost = summary["cost"]
    rows += [
        ["cost total", _usd(cost["total_usd"])],
        ["cost per problem", _usd(cost["per_problem_usd"])],
        ["cost per correct kernel", _usd(cost["per_correct_usd"])],
        ["tokens (prompt / completion)", f"{summary['tokens']['prompt']} / {summary['tokens']['completion']}"],
        ["roofline reached (mean / median)",
         f"{_pct(summary['roofline_fraction']['mean'])} / {_pct(summary['roofline_fraction']['median'])}"],
        ["mean attempts", _num(summary["mean_attempts"])],
        ["wall time (sum over samples; workers run in parallel)", _num(summary["wall_s"], "{:.1f}", " s")],
        ["harness time (total / slowest problem)", " / ".join(_num(summary["harness_s"][k], "{:.1f}", " s")
                                                              for k in ("total", "max"))],
    ]
    if summary["failure_reasons"]:
        rows.append(["failures", ", ".join(f"{r}: {n}" for r, n in summary["failure_reasons"].items())])
    return rows


def _problem_rows(df: pd.DataFrame) -> list[list[str]]:
    """One row per problem (its first sample), with how many of its samples were correct when there are several."""
    rows = per_problem(df).sort_values("problem_id", kind="stable")
    fractions = roofline_fraction(rows)
    samples = df.groupby(["suite", "problem_id"])["correct"].agg(["size", "sum"])
    out = []
    for index, row in rows.iterrows():
        n, ok = samples.loc[(row["suite"], row["problem_id"])]
        status = _status(row) + (f" ({int(ok)}/{int(n)} samples)" if n > 1 else "")
        reason = "" if row["correct"] or pd.isna(row["failure_reason"]) else str(row["failure_reason"])
        reason = clip(reason, 120, collapse=False)
        prompt, completion = row["prompt_tokens"], row["completion_tokens"]
        tokens = "-"
        if pd.notna(prompt) or pd.notna(completion):
            tokens = f"{int(prompt) if pd.notna(prompt) else 0}/{int(completion) if pd.notna(completion) else 0}"
        out.append([
            row["problem_id"], status, _num(row["attempts"], "{:.0f}"),
            _num(row["latency_ms"], "{:.4g}"), _num(row["eager_ms"], "{:.4g}"), _num(row["compile_ms"], "{:.4g}"),
            _num(row["cuda_graphs_ms"], "{:.4g}"), _num(row["speedup_eager"], "{:.2f}", "x"),
            _num(row["speedup_compile"], "{:.2f}", "x"), _num(row["speedup_cuda_graphs"], "{:.2f}", "x"),
            _pct(fractions.loc[index]), _num(row["harness_s"], "{:.1f}"), tokens, _usd(row["cost_usd"]), reason,
        ])
    return out


_PROBLEM_HEADERS = ["problem", "status", "attempts", "latency ms", "eager ms", "compile ms", "graphs ms", "vs eager",
                    "vs compile", "vs graphs", "roofline", "harness s", "tokens in/out", "cost", "failure reason"]
_LABELS = {"eager": "eager", "compile": "torch.compile", "cuda_graphs": "eager under CUDA graphs"}


def _markdown(title: str, summary: Mapping[str, Any], by_suite: Mapping[str, Mapping[str, Any]], df: pd.DataFrame,
              plots: Mapping[str, Path]) -> str:
    parts = [f"# {title}", "", "## Overall", "", markdown_table(["metric", "value"], _summary_rows(summary), "lr"), ""]
    for suite, suite_summary in by_suite.items():
        rows = df[df["suite"] == suite]
        parts += [f"## Suite `{suite or '(none)'}`", ""]
        parts += [markdown_table(["metric", "value"], _summary_rows(suite_summary), "lr"), ""]
        if not rows.empty:
            parts += [markdown_table(_PROBLEM_HEADERS, _problem_rows(rows), "llrrrrrrrrrrrrl"), ""]
    if plots:
        parts += ["## Plots", ""]
        captions = {"speedup_eager": "Speedup vs eager", "speedup_compile": "Speedup vs torch.compile",
                    "speedup_cuda_graphs": "Speedup vs eager under CUDA graphs",
                    "cost_vs_speedup": "Cost vs speedup"}
        for name, path in plots.items():
            parts += [f"![{captions.get(name, name)}]({path.name})", ""]
    return "\n".join(parts)


# ---------------------------------------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------------------------------------
def _matplotlib() -> tuple[Any, Any] | None:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        logger.warning("matplotlib is not installed: skipping the report's plots (install the 'plots' extra)")
        return None
    return Figure, FigureCanvasAgg


def _speedup_axis(ax: Any) -> None:
    """Label a log-scale speedup axis as `0.5x`, `1x`, `2x` instead of powers of ten."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    formatter = FuncFormatter(lambda y, _: f"{y:g}x")
    low, high = ax.get_ylim()
    ax.yaxis.set_major_formatter(formatter)
    # Within one decade there are no major ticks to read, so label the minor ones; beyond that they clutter.
    ax.yaxis.set_minor_formatter(formatter if low > 0 and high / low < 10 else NullFormatter())


def _speedup_plot(Figure: Any, Canvas: Any, rows: pd.DataFrame, baseline: str, path: Path) -> None:
    column = f"speedup_{baseline}"
    measured = rows[rows["correct"] & rows[column].notna() & (rows[column] > 0)].sort_values(column)
    failed = len(rows) - len(measured)
    fig = Figure(figsize=(max(6.0, 0.28 * len(measured) + 2), 4.5))
    Canvas(fig)
    ax = fig.add_subplot()
    label = _LABELS[baseline]
    if measured.empty:
        ax.text(0.5, 0.5, "no correct problem with a measured speedup", ha="center", va="center",
                transform=ax.transAxes)
        ax.set_axis_off()
    else:
        values = measured[column].tolist()
        colors = ["tab:green" if v > 1 else "tab:red" for v in values]
        ax.bar(range(len(values)), values, color=colors)
        ax.set_yscale("log")
        ax.axhline(1.0, color="black", linewidth=1, linestyle="--", label="1x (no change)")
        ax.set_xticks(range(len(values)))
        ax.set_xticklabels(measured["problem_id"].tolist(), rotation=75, ha="right", fontsize=7)
        ax.set_ylabel(f"speedup vs {label} (log)")
        _speedup_axis(ax)
        ax.legend(loc="upper left")
    ax.set_title(f"Speedup vs {label}\n{len(measured)} correct and measured, {failed} failed or unmeasured",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=110)


def _cost_plot(Figure: Any, Canvas: Any, rows: pd.DataFrame, path: Path) -> None:
    fig = Figure(figsize=(6.5, 4.5))
    Canvas(fig)
    ax = fig.add_subplot()
    ok = rows[rows["correct"] & rows["speedup_eager"].notna() & (rows["speedup_eager"] > 0)]
    bad = rows[~rows.index.isin(ok.index)]
    if ok.empty and bad.empty:
        ax.text(0.5, 0.5, "no records", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
    else:
        if not ok.empty:
            ax.scatter(ok["cost_usd"].fillna(0), ok["speedup_eager"], color="tab:blue", label="correct")
            ax.set_yscale("log")
            ax.axhline(1.0, color="black", linewidth=1, linestyle="--")
        if not bad.empty:
            floor = float(ok["speedup_eager"].min()) / 2 if not ok.empty else 1.0
            ax.scatter(bad["cost_usd"].fillna(0), [floor] * len(bad), color="tab:red", marker="x",
                       label="failed / unmeasured (drawn at the bottom)")
        _speedup_axis(ax)
        ax.set_xlabel("LLM cost per problem (USD)")
        ax.set_ylabel("speedup vs eager (log)")
        ax.legend(loc="best", fontsize=8)
    ax.set_title("Cost vs speedup")
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=110)


def _write_plots(df: pd.DataFrame, out_dir: Path) -> dict[str, Path]:
    mpl = _matplotlib()
    if mpl is None:
        return {}
    Figure, Canvas = mpl
    rows = per_problem(df)
    # Aggregate cost over all samples of a problem for the cost plot.
    cost = df.groupby(["suite", "problem_id"])["cost_usd"].sum(min_count=1)
    rows = rows.assign(cost_usd=[cost.get((s, p)) for s, p in zip(rows["suite"], rows["problem_id"], strict=True)])
    written: dict[str, Path] = {}
    for baseline in BASELINES:
        if baseline != "eager" and not rows[f"speedup_{baseline}"].notna().any():
            continue  # a baseline this run did not measure gets no empty plot
        path = out_dir / PLOT_FILES[f"speedup_{baseline}"]
        _speedup_plot(Figure, Canvas, rows, baseline, path)
        written[f"speedup_{baseline}"] = path
    path = out_dir / PLOT_FILES["cost_vs_speedup"]
    _cost_plot(Figure, Canvas, rows, path)
    written["cost_vs_speedup"] = path
    return written


# ---------------------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------------------
def write_report(df: pd.DataFrame, out_dir: str | Path, title: str = "kernel-forge eval", *,
                 total: int | None = None, suite_totals: Mapping[str, int] | None = None,
                 plots: bool = True) -> dict[str, Path]:
    """Write `summary.json`, `report.md` and (with matplotlib, unless `plots=False`) the PNG plots to `out_dir`.

    `total` / `suite_totals` give the number of problems that were meant to run (overall / per suite), so
    problems without a record count as failures. Returns `{"summary": ..., "report": ..., <plot name>: ...}`.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    records = normalize_records(df)
    summary = summarize(records, total)
    by_suite = summarize_by_suite(records, suite_totals)
    written = _write_plots(records, out) if plots else {}
    summary_path = write_json_atomic(out / "summary.json", {  # read back by run_eval and by dashboards
        "title": title,
        "generated_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "overall": summary,
        "suites": by_suite,
        "plots": {name: path.name for name, path in written.items()},
    }, indent=2)
    report_path = write_text_atomic(out / "report.md", _markdown(title, summary, by_suite, records, written) + "\n")
    return {"summary": summary_path, "report": report_path, **written}
