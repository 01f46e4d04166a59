"""The honest corpus: replies written in real model style (by stand-in models given only the rendered request) for
KernelBench module problems and built-in function problems, kept under `tests/honest_corpus/`.

Why: the screen once refused every honest KernelBench reply for `super(ModelNew, self).__init__()` and for reading a
submodule's `weight`; a corpus of honest replies is what keeps "honest code is never refused" true. CI screens every
file (`tests/agent/test_honest_corpus.py`); this tool renders the requests the files answer and, on a GPU, judges
every file through the real judge and reports the correct rate and the screen's false refusals.

    python3 -m benchmarks.honest_corpus render --kernelbench KernelBench/KernelBench --out requests/
    python3 -m benchmarks.honest_corpus judge --kernelbench KernelBench/KernelBench [--device cuda] [--out rows.jsonl]
        [--time FILE-SUBSTRING ...] [--shard I/N]
    python3 -m benchmarks.honest_corpus report rows.jsonl [...]

`manifest.json` beside the files names, for each reply, the problem it answers: a KernelBench path
(`level2/12_Gemm_Multiply_LeakyReLU.py`) or a built-in suite problem id (`bert_base.softmax`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

CORPUS_DIR = Path(__file__).resolve().parents[1] / "tests" / "honest_corpus"
MANIFEST = CORPUS_DIR / "manifest.json"
# The device the requests describe (the replies are judged there).
REQUEST_DEVICE = ("NVIDIA H200", (9, 0))


def load_manifest() -> list[dict[str, Any]]:
    """The corpus entries: `file` (relative to the corpus folder), `kind` ("module" or "function") and `problem`."""
    return json.loads(MANIFEST.read_text(encoding="utf-8"))["entries"]


def _module_request(kernelbench: Path, problem: str) -> tuple[str, str]:
    from agent.prompting import ModuleTask, PromptRenderer

    source = (kernelbench / problem).read_text(encoding="utf-8")
    task = ModuleTask.from_source(source, name=Path(problem).stem, language="triton")
    task = dataclasses.replace(task, device_name=REQUEST_DEVICE[0], compute_capability=REQUEST_DEVICE[1])
    renderer = PromptRenderer()
    return renderer.system(task), renderer.generate_module(task)


def _function_request(problem_id: str) -> tuple[str, str]:
    from agent.prompting import KernelTask, PromptRenderer
    from evals.problems.suite import load_suite

    problem = next(p for p in load_suite("builtin") if p.id == problem_id)
    task = KernelTask(problem.function, tuple(problem.calls), REQUEST_DEVICE[0], REQUEST_DEVICE[1], language="triton")
    renderer = PromptRenderer()
    return renderer.system(task), renderer.generate(task)


def request_for(entry: dict[str, Any], kernelbench: Path | None) -> tuple[str, str]:
    """The (system, user) messages the generator sends first for a corpus entry's problem."""
    if entry["kind"] == "module":
        if kernelbench is None:
            raise SystemExit("module problems need --kernelbench (the KernelBench/ folder holding level1..level3)")
        return _module_request(kernelbench, entry["problem"])
    return _function_request(entry["problem"])


def render(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    entries = load_manifest() if not args.problems else [
        {"file": "", "kind": "module" if p.endswith(".py") else "function", "problem": p} for p in args.problems]
    for entry in entries:
        system, user = request_for(entry, Path(args.kernelbench) if args.kernelbench else None)
        name = Path(entry["problem"]).stem if entry["kind"] == "module" else entry["problem"]
        (out / f"{entry['kind']}--{name}.md").write_text(f"# system\n\n{system}\n\n# user\n\n{user}", encoding="utf-8")
    print(f"{len(entries)} request(s) written to {out}")
    return 0


def _target(entry: dict[str, Any], kernelbench: Path | None, device: str) -> Any:
    """The judge's target for an entry."""
    from forge.judging import FunctionTarget, ModuleSource, ModuleTarget

    if entry["kind"] == "module":
        if kernelbench is None:
            raise SystemExit("module problems need --kernelbench (the KernelBench/ folder holding level1..level3)")
        source = ModuleSource((kernelbench / entry["problem"]).read_text(encoding="utf-8"), name=entry["problem"])
        return ModuleTarget(source, device)
    problem = _function_problem(entry["problem"])
    calls = problem.materialize(device, seed=0)
    return FunctionTarget(problem.function, tuple(s for _, s in calls), tuple(c for c, _ in calls))


def _function_problem(problem_id: str) -> Any:
    from evals.problems.suite import load_suite

    return next(p for p in load_suite("builtin") if p.id == problem_id)


def _in_process_speedup(entry: dict[str, Any], code: str, target: Any, judge: Any) -> float:
    """The candidate imported here and timed as `make_plan` and `kforge eval` time it (`Judge.time`, spot checks,
    the baseline before and after it, the faster baseline run: `Bracket`), for comparison with the child's
    feedback timing of the same file."""
    from forge.checking.benchmarking import Bracket
    from forge.judging.modules import ModelCall, ReferenceModel
    from forge.samples import Sample
    from forge.source_files import load_source_text

    module = load_source_text(code, name=Path(entry["file"]).stem)
    if entry["kind"] == "module":
        model, inputs = target.source.instantiate(target.device, target.seeds[0])
        fn, baseline_fn, reference = (ModelCall(target.source.build(module.ModelNew, target.device, target.seeds[0])),
                                      model, ReferenceModel(model))
        samples = [Sample(tuple(inputs), {})]
    else:
        fn, baseline_fn = module.kernel_function, target.reference_fn
        reference = baseline_fn
        samples = judge.kernel_utils.benchmark_distribution(list(zip(target.counts, target.samples, strict=True)))
    first = judge.time(baseline_fn, samples)
    timed = judge.time(fn, samples, reference=reference)
    bracket = Bracket(first, judge.time(baseline_fn, samples))
    return bracket.baseline.median_ms / timed.median_ms


def judge_corpus(args: argparse.Namespace) -> int:
    """Every corpus file through the real judge (screen, sandbox child, the oracle here), then, for those named by
    `--time`, timed here as the optimizer and the eval time kernels: the correct rate, the screen's false refusals,
    and how the child's feedback speedup compares with this process's. Rows are appended to `--out` (JSON lines)
    as they finish, so a run cut short keeps what it judged."""
    import pandas as pd

    from agent.languages import get_language
    from forge.judging import Judge, JudgeOptions
    from forge.sandbox import SandboxOptions

    kernelbench = Path(args.kernelbench) if args.kernelbench else None
    timed_files = args.time or []
    judge = Judge(options=JudgeOptions(SandboxOptions(timeout_s=args.timeout), benchmark=False))
    timing_judge = Judge(options=JudgeOptions(SandboxOptions(timeout_s=args.timeout), benchmark=True))
    triton = get_language("triton")
    rows = []
    entries = [e for e in load_manifest() if not args.only or any(o in e["file"] for o in args.only)]
    if args.shard:
        index, count = (int(part) for part in args.shard.split("/"))
        entries = entries[index::count]
    out = Path(args.out) if args.out else None
    for index, entry in enumerate(entries, 1):
        code = (CORPUS_DIR / entry["file"]).read_text(encoding="utf-8")
        started = time.monotonic()
        row: dict[str, Any] = {"file": entry["file"], "kind": entry["kind"]}
        timed = any(t in entry["file"] for t in timed_files)
        try:
            target = _target(entry, kernelbench, args.device)
            verdict = (timing_judge if timed else judge).judge_source(code, target, triton)
            row.update(status=verdict.status.value, limit=verdict.limit.value if verdict.limit else None,
                       child_speedup=verdict.speedup, message=verdict.message[:400],
                       errors=[str(e)[:400] for e in (verdict.details.get("errors") or [])[:2]],
                       stderr=verdict.stderr[-600:] if not verdict.ok else "",
                       screened_out=verdict.details.get("phase") == "screening",
                       oracle_scaled=verdict.details.get("oracle_scaled"))
            del target
            if verdict.ok and timed:
                row["here_speedup"] = _in_process_speedup(entry, code, _target(entry, kernelbench, args.device),
                                                          judge)
        except Exception as exc:  # noqa: BLE001 - one broken entry is a row, the sweep goes on
            row.update(status="tool_error", message=f"{type(exc).__name__}: {exc}"[:400])
        row["seconds"] = round(time.monotonic() - started, 1)
        rows.append(row)
        if out is not None:
            with open(out, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(row, default=str) + "\n")
        print(f"[{index}/{len(entries)}] {entry['file']}: {row['status']} ({row['seconds']} s) "
              f"{'' if row['status'] == 'ok' else row.get('message', '')[:300]}", flush=True)
        if args.device.startswith("cuda"):
            import torch

            torch.cuda.empty_cache()
    judge.close()
    timing_judge.close()
    print(summarize(pd.DataFrame(rows)))
    return 0


def summarize(frame: Any) -> str:
    """The table and the summary (correct rate, false refusals, child vs here speedup) of judged rows."""
    refused = int(frame.get("screened_out", False).fillna(False).astype(bool).sum()) if "screened_out" in frame \
        else 0
    correct = int((frame["status"] == "ok").sum())
    summary: dict[str, Any] = {"files": len(frame), "screen_false_refusals": refused,
                               "false_refusal_rate": refused / max(1, len(frame)), "correct": correct,
                               "correct_rate": correct / max(1, len(frame)),
                               "statuses": frame["status"].value_counts().to_dict()}
    if "here_speedup" in frame:
        both = frame.dropna(subset=["child_speedup", "here_speedup"])
        summary["child_over_here"] = (both["child_speedup"] / both["here_speedup"]).round(3).tolist()
    columns = [c for c in ("file", "status", "limit", "child_speedup", "here_speedup", "seconds") if c in frame]
    return frame[columns].to_string(index=False) + "\n" + json.dumps(summary, indent=1, default=str)


def report(args: argparse.Namespace) -> int:
    """The summary of one or more `judge --out` files (JSON lines)."""
    import pandas as pd

    rows = [json.loads(line) for path in args.files for line in Path(path).read_text().splitlines() if line.strip()]
    print(summarize(pd.DataFrame(rows)))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks.honest_corpus", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("render", help="write the first request of each corpus problem (or of --problems)")
    r.add_argument("--kernelbench", help="the KernelBench/ folder holding level1..level3")
    r.add_argument("--out", required=True)
    r.add_argument("--problems", nargs="*", help="KernelBench paths (level1/19_ReLU.py) or builtin problem ids")
    j = sub.add_parser("judge", help="judge every corpus file through the real judge (a GPU for shipped sizes)")
    j.add_argument("--kernelbench", help="the KernelBench/ folder holding level1..level3")
    j.add_argument("--device", default="cuda")
    j.add_argument("--timeout", type=float, default=300.0, help="sandbox time per file (the candidate's), seconds")
    j.add_argument("--time", nargs="*", help="substrings of the files also timed in the child and in this process")
    j.add_argument("--only", nargs="*", help="substrings of the files to judge")
    j.add_argument("--shard", help="I/N: judge every N-th file from the I-th (parallel processes)")
    j.add_argument("--out", help="append each judged row to this file (JSON lines)")
    s = sub.add_parser("report", help="summarise judge --out files")
    s.add_argument("files", nargs="+")
    args = parser.parse_args(argv)
    return {"render": render, "judge": judge_corpus, "report": report}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
