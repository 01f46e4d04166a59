"""Per-GPU eval workers on a multi-GPU host: the same problems evaluated with one worker per GPU and with one
worker on GPU 0, compared for content (same problems, same verdicts, same candidates) and wall time; then a run in
which one problem's candidate kills its worker, to show the worker is replaced and the run finishes.

    python3 -m benchmarks.multi_gpu_eval [--problems N] [--out DIR]     (on a host with >= 2 GPUs)

Prints one line per check and a pandas table; writes `multi_gpu.json` under --out (default $OUT or /tmp/out).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from evals import EvalOptions, load_suite, run_eval
from evals.sources import Candidate, CompileSource

CONTENT = ["problem_id", "correct", "compiled", "candidate", "outcome"]


class KillsItsWorker(CompileSource):
    """`torch.compile` everywhere, except that the candidate for `victim` kills the process it runs in."""

    def __init__(self, victim: str) -> None:
        self.victim = victim

    @property
    def name(self) -> str:
        return "compile-with-a-killer"

    def function_candidate(self, problem: Any, samples: Any, device: Any, kernel_utils: Any) -> Candidate:
        if problem.id == self.victim:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().function_candidate(problem, samples, device, kernel_utils)


def _run(problems: list[Any], source: Any, out: Path, device: str) -> tuple[pd.DataFrame, float]:
    start = time.perf_counter()
    frame = run_eval(problems, source, out_dir=out,
                     options=EvalOptions(device=device, quick=True, progress=False, plots=False))
    return frame.sort_values("problem_id").reset_index(drop=True), time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=16)
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    args = parser.parse_args()
    gpus = torch.cuda.device_count()
    if gpus < 2:
        raise SystemExit(f"needs >= 2 GPUs, found {gpus}")
    out = Path(args.out) / "multi_gpu"
    problems = sorted(load_suite("builtin"), key=lambda p: p.id)[: args.problems]
    # Warm the inductor cache once so neither timed run pays first compiles the other does not.
    _run(problems, CompileSource(), out / "warm", "cuda:0")
    one, one_s = _run(problems, CompileSource(), out / "one-gpu", "cuda:0")
    two, two_s = _run(problems, CompileSource(), out / "all-gpus", "cuda")
    same = one[CONTENT].equals(two[CONTENT])
    print(f"content identical (problem, correct, compiled, candidate, outcome): {same}")
    print(f"wall: 1 GPU {one_s:.1f} s, {gpus} GPUs {two_s:.1f} s, ratio {two_s / one_s:.2f}")
    victim = problems[len(problems) // 2].id
    killed, killed_s = _run(problems, KillsItsWorker(victim), out / "killer", "cuda")
    row = killed.set_index("problem_id").loc[victim]
    others = killed[killed["problem_id"] != victim]
    print(f"killer run ({killed_s:.1f} s): {victim}: {row['failure_reason']}; the other {len(others)} problems "
          f"correct: {bool(others['correct'].all())}")
    table = pd.DataFrame({"problem": one["problem_id"], "1 GPU ms": one["latency_ms"], "2 GPU ms": two["latency_ms"],
                          "1 GPU correct": one["correct"], "2 GPU correct": two["correct"]})
    print(table.to_string(index=False))
    result = {"gpus": gpus, "problems": len(problems), "content_identical": bool(same), "one_gpu_s": one_s,
              "all_gpus_s": two_s, "victim": victim, "victim_reason": row["failure_reason"],
              "others_correct": bool(others["correct"].all()), "killer_s": killed_s}
    (out / "multi_gpu.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    from benchmarks.multi_gpu_eval import main as _main  # workers unpickle KillsItsWorker from an importable module

    _main()
