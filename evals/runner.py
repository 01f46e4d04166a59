"""`run_eval`: evaluate a kernel source over a suite, saving each record as it finishes, then write the report.

    from evals.runner import EvalOptions, run_eval
    df = run_eval("smoke", "compile", out_dir="runs/smoke-compile", options=EvalOptions(device="cpu"))

Records go to `<out_dir>/results.jsonl` (`evals.ResultsStore`) the moment a worker returns them, so an interrupted
run continues with `EvalOptions(resume=True)`: (problem, sample) pairs that already have a record are skipped. The
run's settings are kept in `<out_dir>/run.json`; resuming with another source is refused, and a second run on a
folder that a run is using fails at once (`evals.results.OutputFolderLock`). At the end the report
(`summary.json`, `report.md`, PNG plots) is written to `out_dir` over the selected problems, with every selected
problem counted, so problems without a record count as failures.

Backends: `"local"` (worker processes, one per visible GPU by default: `evals.workers`) and `"ray"` (Ray tasks with
one GPU each: `evals.ray_backend`, needs `pip install kernel-forge[ray]`).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import enum
import json
import logging
import platform
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from evals.failures import Failure
from evals.options import BACKENDS, QUICK_KERNEL_UTILS, EvalOptions
from evals.problems import Problem, load_suite
from evals.progress import ProgressBar
from evals.report import write_report
from evals.results import OutputFolderLock, ResultsStore, parse_shard
from evals.results import shard as shard_problems
from evals.sources import EvalSource, source_from_name
from evals.workers import group_work, plan_workers, run_in_process, run_workers
from forge.atomic import write_json_atomic
from forge.checking import KernelUtils

__all__ = ["BACKENDS", "QUICK_KERNEL_UTILS", "RESULTS_FILE", "RUN_FILE", "EvalOptions", "resolve_device", "run_eval",
           "select_problems"]

logger = logging.getLogger(__name__)

RESULTS_FILE = "results.jsonl"
RUN_FILE = "run.json"


def resolve_device(device: str | torch.device | None) -> torch.device:
    """`None` -> CUDA when available, else CPU; a clear error for CUDA on a machine without it."""
    if device is None or str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        target = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"not a torch device: {device!r} (use cpu, cuda or cuda:N)") from None
    if target.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} was asked for but CUDA is not available here; use --device cpu")
    return target


def select_problems(problems: str | Path | Sequence[Problem], *, problem_ids: Sequence[str] | None = None,
                    shard: str | tuple[int, int] | None = None) -> list[Problem]:
    """Load a suite by name or path (or take a list of problems), keep `problem_ids` (in suite order), then the
    problems of shard `i/N`. Errors name unknown ids and duplicate problems."""
    selected = load_suite(problems) if isinstance(problems, (str, Path)) else list(problems)
    if not selected:
        raise ValueError("no problems to evaluate")
    for problem in selected:
        if not isinstance(problem, Problem):
            raise TypeError(f"expected evals Problems, got {type(problem).__name__}")
    keys = [(p.suite, p.id) for p in selected]
    duplicates = sorted({f"{s}:{i}" for s, i in keys if keys.count((s, i)) > 1})
    if duplicates:
        raise ValueError(f"duplicate problems: {', '.join(duplicates)}")
    if problem_ids:
        wanted = [str(i).strip() for i in problem_ids if str(i).strip()]
        known = {p.id for p in selected}
        unknown = [i for i in wanted if i not in known]
        if unknown:
            raise ValueError(f"unknown problem id(s): {', '.join(unknown)}; this suite has: {', '.join(sorted(known))}")
        selected = [p for p in selected if p.id in set(wanted)]
    if shard is not None:
        index, count = parse_shard(shard) if isinstance(shard, str) else (int(shard[0]), int(shard[1]))
        selected = shard_problems(selected, index, count)
    return selected


def _status(record: dict[str, Any]) -> str:
    label = f"{record.get('problem_id')}#{record.get('sample_index', 0)}"
    if record.get("correct"):
        speedup = record.get("speedup_eager")
        return f"{label} correct" + (f" {speedup:.2f}x eager" if isinstance(speedup, (int, float)) else "")
    failure = record.get("failure")
    return f"{label} {Failure(failure).label if failure else 'not correct'}"


def _jsonable(value: Any) -> Any:
    """Settings as JSON: nested frozen dataclasses (e.g. the oracle's `ProbeSettings`) become dicts, enums values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    return value


def _run_settings(problems: list[Problem], source: EvalSource, samples: int, device: torch.device, backend: str,
                  shard: Any, kernel_utils: KernelUtils) -> dict[str, Any]:
    utils = {f.name: _jsonable(getattr(kernel_utils, f.name)) for f in dataclasses.fields(kernel_utils)
             if f.name != "tolerances"}
    return {
        "source": source.name,
        "suites": sorted({p.suite for p in problems}),
        "problems": len(problems),
        "samples_per_problem": samples,
        "device": str(device),
        "backend": backend,
        "shard": shard if isinstance(shard, (str, type(None))) else list(shard),
        "kernel_utils": utils,
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def _prepare_out_dir(out: Path, store: ResultsStore, settings: dict[str, Any], resume: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    run_file = out / RUN_FILE
    now = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    previous: dict[str, Any] = {}
    if run_file.exists():
        try:
            previous = json.loads(run_file.read_text(encoding="utf-8"))
        except ValueError:
            previous = {}
    if not resume:
        if store.load():
            raise FileExistsError(f"{store.path} already holds results; pass EvalOptions(resume=True) (--resume) to "
                                  "continue that run, or choose a new output folder (--out)")
    elif previous.get("source") not in (None, settings["source"]):
        raise ValueError(f"{out} holds a run of source {previous['source']!r}; resuming it with {settings['source']!r} "
                         "would mix two sources in one report. Use a new --out for the new source.")
    history = list(previous.get("sessions", [])) if resume else []
    history.append({"started_at": now, "resume": resume})
    write_json_atomic(run_file, {**settings, "sessions": history}, indent=2)


def run_eval(
    problems: str | Path | Sequence[Problem],
    source: EvalSource | str,
    *,
    out_dir: str | Path,
    options: EvalOptions | None = None,
) -> pd.DataFrame:
    """Evaluate `source` on `problems` and return the records of the selected problems (one row per sample).

    `problems`: a suite name (`"builtin"`, `"smoke"`), a JSON suite path, a KernelBench folder, or a list of
    `Problem`s. `source`: an `EvalSource` or a name for `evals.sources.source_from_name` (`"compile"`,
    `"sdpa-flash"`...). `out_dir`: the run's folder (records, run.json, report). `options`: which problems and
    samples, the device, workers and backend, the timing settings and the report (`EvalOptions`; default
    `EvalOptions()`).

    The returned frame's `attrs` hold `"summary"` (the summary.json content) and `"report_files"` (name -> path).
    """
    opts = options if options is not None else EvalOptions()
    if not isinstance(opts, EvalOptions):
        raise TypeError(f"options must be an evals.EvalOptions, got {type(opts).__name__}")
    samples_per_problem, workers, backend, resume = opts.samples_per_problem, opts.workers, opts.backend, opts.resume
    selected = select_problems(problems, problem_ids=opts.problem_ids, shard=opts.shard)
    eval_source = source_from_name(source) if isinstance(source, str) else source
    if not isinstance(eval_source, EvalSource):
        raise TypeError(f"source must be an EvalSource or a source name, got {type(source).__name__}")
    target = resolve_device(opts.device)
    utils = opts.resolved_kernel_utils()
    plans = plan_workers(target, workers) if backend == "local" and workers != 0 else []

    out = Path(out_dir)
    with OutputFolderLock(out):  # one run per folder: a second --resume would duplicate records
        store = ResultsStore(out / RESULTS_FILE)
        settings = _run_settings(selected, eval_source, samples_per_problem, target, backend, opts.shard, utils)
        _prepare_out_dir(out, store, settings, resume)
        pending = store.pending(selected, samples_per_problem)
        items = group_work(pending)
        skipped = len(selected) * samples_per_problem - len(pending)
        if skipped:
            logger.info("resuming: %d sample(s) already recorded, %d to go", skipped, len(pending))

        bar = ProgressBar(len(pending), label=f"eval {eval_source.name}") if opts.progress else None

        def on_record(record: dict[str, Any]) -> None:
            store.append(record)
            if bar is not None:
                bar.update(_status(record))

        eval_source.start_run(out, resume=resume)
        try:
            if backend == "ray":
                from evals.ray_backend import run_ray

                run_ray(items, eval_source, device=target, kernel_utils=utils, on_record=on_record, run_dir=out,
                        address=opts.ray_address)
            elif workers == 0:
                run_in_process(items, eval_source, device=target, kernel_utils=utils, on_record=on_record, run_dir=out)
            else:
                run_workers(items, eval_source, plans=plans, kernel_utils=utils, on_record=on_record,
                            timeout_s=opts.timeout_s, run_dir=out)
        finally:
            if bar is not None:
                bar.close()
            eval_source.finish_run(out, resume=resume)

        frame = store.frame()
        wanted = {(p.suite, p.id) for p in selected}
        if not frame.empty:
            keep = [(s, p) in wanted and i < samples_per_problem
                    for s, p, i in zip(frame["suite"], frame["problem_id"], frame["sample_index"], strict=True)]
            frame = frame[keep].sort_values(["suite", "problem_id", "sample_index"], kind="stable")
            frame = frame.reset_index(drop=True)
        suite_totals = Counter(p.suite for p in selected)
        files = write_report(frame, out, opts.title or f"kernel-forge eval: {eval_source.name} on "
                             f"{', '.join(sorted(suite_totals))}", total=len(selected), suite_totals=dict(suite_totals),
                             plots=opts.plots)
        frame.attrs["report_files"] = {name: str(path) for name, path in files.items()}
        frame.attrs["summary"] = json.loads(Path(files["summary"]).read_text(encoding="utf-8"))
        return frame
