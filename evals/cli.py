"""`kforge eval`: run an offline eval of a kernel source over a suite and print the summary.

    kforge eval smoke --source compile --device cpu --quick
    kforge eval builtin --source sdpa-flash --out runs/sdpa
    kforge eval smoke --source llm --model gpt-x --record runs/smoke.jsonl
    kforge eval smoke --source llm --replay tests/evals/cassettes/smoke.jsonl      (no network)
    kforge eval builtin --source provider:flaggems          (any KernelProvider: a kernel library, or module:factory)
    kforge eval path/to/KernelBench/level1 --source llm --problems level1/19_ReLU --workers 4

`kforge.cli` adds this subcommand through `add_eval_parser` when the `evals` package is importable.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from evals.metrics import BASELINES
from evals.options import BACKENDS, EvalOptions
from evals.sources import source_usages
from forge.text import clip

__all__ = ["add_eval_parser", "build_source", "default_out_dir", "eval_options", "run_eval_command"]


def _languages(text: str) -> tuple[str, ...]:
    from agent.cli_support import parse_languages

    return parse_languages(text)


def _int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number >= `minimum`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected a number >= {minimum}, got {value}")
        return value

    return parse


_positive_int = _int_at_least(1)
_count = _int_at_least(0)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value > 0 or not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return value


def _source(text: str) -> str:
    """An argparse type: a name of the eval source registry (`evals.sources.source_names()`, or a family such as
    `provider:<library>` / `provider:<module>:<factory>`)."""
    from evals.sources import check_source_name

    try:
        return check_source_name(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _shard(text: str) -> str:
    from evals.results import parse_shard

    try:
        parse_shard(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _problem_ids(text: str) -> list[str]:
    ids = [part.strip() for part in text.split(",") if part.strip()]
    if not ids:
        raise argparse.ArgumentTypeError("expected comma-separated problem ids, e.g. smoke.relu,smoke.silu")
    return ids


def add_eval_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add `kforge eval` to a `kforge` subparsers object; returns the new parser."""
    parser = subparsers.add_parser(
        "eval", help="offline evals of kernel sources over benchmark suites",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("suite", metavar="SUITE",
                        help="builtin, smoke, a JSON suite file, or a folder of KernelBench problem files")
    parser.add_argument("--source", type=_source, default="llm", metavar="SOURCE",
                        help=f"the kernel source to evaluate: {', '.join(source_usages())} (e.g. provider:flaggems; "
                        "default llm)")
    parser.add_argument("--model", help="LLM model name (default $KFORGE_LLM_MODEL; with --replay, the cassette's)")
    parser.add_argument("--samples", type=_positive_int, default=1, metavar="K",
                        help="independent samples per problem, for pass@k (default 1)")
    cassette = parser.add_mutually_exclusive_group()
    cassette.add_argument("--record", metavar="CASSETTE", help="record every LLM call into this JSONL cassette")
    cassette.add_argument("--replay", metavar="CASSETTE",
                          help="answer every LLM call from this cassette (no network)")
    parser.add_argument("--workers", type=_count, default=None, metavar="N",
                        help="worker processes (default: one per visible GPU, 1 on CPU; 0 = in this process)")
    parser.add_argument("--out", metavar="DIR", help="output folder (default runs/eval/<suite>-<source>)")
    parser.add_argument("--resume", action="store_true", help="continue the run in --out, skipping recorded samples")
    parser.add_argument("--shard", type=_shard, metavar="i/N", help="evaluate only shard i of N (i from 0)")
    parser.add_argument("--device", default="auto", help="auto (CUDA when available), cpu, cuda, cuda:N")
    parser.add_argument("--backend", choices=BACKENDS, default="local",
                        help="local worker processes, or Ray tasks (pip install kernel-forge[ray])")
    parser.add_argument("--ray-address", metavar="ADDR", help="Ray cluster to join (default: a local instance)")
    parser.add_argument("--problems", type=_problem_ids, metavar="ID,ID", help="evaluate only these problem ids")
    parser.add_argument("--quick", action="store_true",
                        help="few benchmark passes (same correctness checks); for smoke runs and CI")
    parser.add_argument("--timing", choices=("eager", "device"), default="eager",
                        help="eager: host-inclusive time (what an eager forward pays); device: kernel time from a "
                        "CUDA-graph replay (what CUDA graphs / compiled models pay); the same clock as "
                        "`kforge optimize --execution`")
    parser.add_argument("--timeout", type=_seconds, metavar="S",
                        help="per-sample limit in seconds; a sample over it is recorded as a timeout")
    parser.add_argument("--generation-timeout", type=_seconds, metavar="S",
                        help="give up one problem's LLM generation after S seconds")
    parser.add_argument("--candidates", type=_positive_int, metavar="N",
                        help="LLM conversations per problem (generator default when unset)")
    parser.add_argument("--attempts", type=_positive_int, metavar="N",
                        help="LLM turns per conversation before giving up (generator default when unset)")
    parser.add_argument("--optimize-rounds", type=_count, metavar="N",
                        help="LLM turns spent optimizing after the first correct kernel (generator default)")
    parser.add_argument("--language", type=_languages, metavar="NAMES",
                        help="kernel language(s) the LLM writes: triton (default), cuda, or triton,cuda")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.set_defaults(func=run_eval_command)
    return parser


def _suite_label(suite: str) -> str:
    path = Path(suite)
    return path.stem if path.suffix else (path.name or "suite")


def default_out_dir(suite: str, source: str) -> Path:
    """`runs/eval/<suite>-<source>`: stable, so `--resume` finds the run again (`:` and `/` of a provider spec
    become `-`)."""
    label = source.replace(":", "-").replace("/", "-")
    return Path("runs") / "eval" / f"{_suite_label(suite)}-{label}"


def _cassette_model(path: Path) -> str | None:
    """The model of the first recorded call in a cassette (replay keys include the model)."""
    try:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    return (json.loads(line).get("request") or {}).get("model")
    except (OSError, ValueError):
        return None
    return None


def build_source(args: argparse.Namespace) -> Any:
    """The `EvalSource` the arguments ask for (LLM config from the environment, overridden by the flags)."""
    from evals.sources import source_from_name

    if args.source != "llm":
        for flag in ("record", "replay", "model", "candidates", "attempts", "optimize_rounds", "generation_timeout",
                     "language"):
            if getattr(args, flag, None) is not None:
                raise ValueError(f"--{flag.replace('_', '-')} only applies to --source llm")
        return source_from_name(args.source)
    from agent.llm import LLMConfig

    overrides: dict[str, Any] = {}
    if args.record:
        overrides.update(cassette=Path(args.record), cassette_mode="record")
    if args.replay:
        replay = Path(args.replay)
        if not replay.is_file():
            raise ValueError(f"--replay {replay}: no such cassette file")
        overrides.update(cassette=replay, cassette_mode="replay")
    if args.model:
        overrides["model"] = args.model
    config = LLMConfig.from_env(**overrides)
    if args.replay and not config.model:
        config = LLMConfig.from_env(**overrides, model=_cassette_model(Path(args.replay)))
    if config.resolved_cassette_mode() != "replay" and not (config.model and (config.base_url or config.api_key)):
        raise ValueError("--source llm needs a model and an endpoint (--model and KFORGE_LLM_BASE_URL / "
                         "KFORGE_LLM_API_KEY), also when recording, or a cassette to replay (--replay CASSETTE)")
    options = {name: getattr(args, name) for name in ("candidates", "attempts", "optimize_rounds")
               if getattr(args, name) is not None}
    if args.language is not None:
        options["language"] = list(args.language)
    return source_from_name("llm", llm_config=config, generator_options=options,
                            generation_timeout_s=args.generation_timeout)


def _fmt(value: Any, spec: str = "{:.3g}") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return spec.format(value)


def _pct(value: Any) -> str:
    return _fmt(value * 100 if isinstance(value, (int, float)) else None, "{:.1f}%")


def summary_table(summary: dict[str, Any]) -> pd.DataFrame:
    """The headline metrics of one `summarize()` dict as a one-row-per-metric table."""
    rows: list[tuple[str, str]] = [
        ("problems", str(summary.get("problems"))),
        ("compile rate", _pct(summary.get("compile_rate"))),
        ("correct rate", _pct(summary.get("correct_rate"))),
    ]
    for baseline in BASELINES:
        fast = summary.get("fast_p", {}).get(baseline) or {}
        if baseline == "cuda_graphs" and not fast:
            continue
        rows += [(f"{name} vs {baseline}", _pct(value)) for name, value in fast.items()]
        rows.append((f"geomean speedup vs {baseline}", _fmt((summary.get("geomean_speedup") or {}).get(baseline),
                                                             "{:.3f}x")))
    for k, value in (summary.get("pass_at_k") or {}).items():
        rows.append((f"pass@{k}", _pct(value)))
    cost = summary.get("cost") or {}
    rows += [
        ("cost total", _fmt(cost.get("total_usd"), "${:.4f}")),
        ("cost per problem", _fmt(cost.get("per_problem_usd"), "${:.4f}")),
        ("cost per correct kernel", _fmt(cost.get("per_correct_usd"), "${:.4f}")),
        ("roofline fraction (mean)", _pct((summary.get("roofline_fraction") or {}).get("mean"))),
        ("mean attempts", _fmt(summary.get("mean_attempts"), "{:.2f}")),
        ("wall time (sum over samples)", _fmt(summary.get("wall_s"), "{:.1f} s")),
        ("harness time (slowest problem)", _fmt((summary.get("harness_s") or {}).get("max"), "{:.1f} s")),
    ]
    failures = summary.get("failure_reasons") or {}
    if failures:
        rows.append(("failures", ", ".join(f"{k}: {v}" for k, v in sorted(failures.items()))))
    return pd.DataFrame(rows, columns=["metric", "value"])


def problem_table(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per recorded sample: status, timings, speedups and the failure reason (clipped)."""
    if frame.empty:
        return pd.DataFrame()

    def status(row: pd.Series) -> str:
        return "correct" if row["correct"] else ("incorrect" if row["compiled"] else "failed")

    table = pd.DataFrame({
        "problem": frame["problem_id"],
        "sample": frame["sample_index"],
        "status": frame.apply(status, axis=1),
        "latency_ms": frame["latency_ms"],
        "eager_ms": frame["eager_ms"],
        "compile_ms": frame["compile_ms"],
        "x_eager": frame["speedup_eager"],
        "x_compile": frame["speedup_compile"],
        "x_graphs": frame.get("speedup_cuda_graphs"),
        "harness_s": frame.get("harness_s"),
        "cost_usd": frame["cost_usd"],
        "reason": frame["failure_reason"].map(lambda r: _clip(r) if isinstance(r, str) else "-"),
    })
    if (table["sample"] == 0).all():
        table = table.drop(columns=["sample"])
    return table


def _clip(text: str, width: int = 70) -> str:
    return clip(text, width, ellipsis="…")


def eval_options(args: argparse.Namespace) -> EvalOptions:
    """The `EvalOptions` of `kforge eval`'s flags (one field per flag)."""
    from forge.checking import KernelUtils

    return EvalOptions(
        samples_per_problem=args.samples, problem_ids=args.problems, shard=args.shard,
        device=None if args.device == "auto" else args.device, workers=args.workers, backend=args.backend,
        ray_address=args.ray_address, timeout_s=args.timeout, kernel_utils=KernelUtils(timing=args.timing),
        quick=args.quick, resume=args.resume, plots=not args.no_plots,
    )


def run_eval_command(args: argparse.Namespace) -> int:
    """Body of `kforge eval`: run, then print the per-problem table, the summary and the report's paths."""
    from evals.runner import run_eval

    try:
        source = build_source(args)
        out = Path(args.out) if args.out else default_out_dir(args.suite, args.source)
        frame = run_eval(args.suite, source, out_dir=out, options=eval_options(args))
    except (ValueError, FileExistsError, FileNotFoundError, NotADirectoryError, ImportError, RuntimeError) as exc:
        print(f"kforge eval: {exc}", file=sys.stderr)
        return 2
    summary = frame.attrs.get("summary", {})
    overall = summary.get("overall", {})
    print(f"\n== {source.name} on {args.suite}: per problem ==")
    table = problem_table(frame)
    print("(no records)" if table.empty else table.to_string(index=False, float_format=lambda v: f"{v:.4g}",
                                                             na_rep="-"))
    print(f"\n== {source.name} on {args.suite}: summary ==")
    print(summary_table(overall).to_string(index=False))
    print("\nreport files:")
    print(f"  results  {out / 'results.jsonl'}")
    for name, path in frame.attrs.get("report_files", {}).items():
        print(f"  {name:8s} {path}")
    return 0
