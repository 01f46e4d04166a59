"""The honest corpus: replies written in real model style (by stand-in models given only the rendered request) for
KernelBench module problems and built-in function problems, kept under `tests/honest_corpus/`.

Why: the screen once refused every honest KernelBench reply for `super(ModelNew, self).__init__()` and for reading a
submodule's `weight`; a corpus of honest replies is what keeps "honest code is never refused" true. CI screens every
file (`tests/agent/test_honest_corpus.py`); this tool renders the requests the files answer and, on a GPU, judges
every file through the real judge and reports the correct rate and the screen's false refusals.

    python3 -m benchmarks.honest_corpus render --kernelbench KernelBench/KernelBench --out requests/
    python3 -m benchmarks.honest_corpus judge --kernelbench KernelBench/KernelBench [--device cuda] [--out report.json]

`manifest.json` beside the files names, for each reply, the problem it answers: a KernelBench path
(`level2/12_Gemm_Multiply_LeakyReLU.py`) or a built-in suite problem id (`bert_base.softmax`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
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
    task = ModuleTask.from_source(source, name=Path(problem).stem)
    task = dataclasses.replace(task, device_name=REQUEST_DEVICE[0], compute_capability=REQUEST_DEVICE[1])
    renderer = PromptRenderer()
    return renderer.system(task), renderer.generate_module(task)


def _function_request(problem_id: str) -> tuple[str, str]:
    from agent.prompting import KernelTask, PromptRenderer
    from evals.problems.suite import load_suite

    problem = next(p for p in load_suite("builtin") if p.id == problem_id)
    task = KernelTask(problem.function, tuple(problem.calls), REQUEST_DEVICE[0], REQUEST_DEVICE[1])
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks.honest_corpus", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("render", help="write the first request of each corpus problem (or of --problems)")
    r.add_argument("--kernelbench", help="the KernelBench/ folder holding level1..level3")
    r.add_argument("--out", required=True)
    r.add_argument("--problems", nargs="*", help="KernelBench paths (level1/19_ReLU.py) or builtin problem ids")
    args = parser.parse_args(argv)
    return {"render": render}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
