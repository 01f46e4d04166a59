"""Summarise a `kforge eval <KernelBench>/level1 --source eager` run at shipped sizes (issue 8: every level-1 problem
validates on one H200, each in under 30 s of harness time): counts, the slowest harness times, and every problem
that was not judged correct with its reason. Reads `results.jsonl` (so a run cut short by its time limit still
reports what it finished).

    python3 benchmarks/kb_level1_sweep.py RUN_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd


def main(run_dir: str) -> int:
    rows = [json.loads(line) for line in (Path(run_dir) / "results.jsonl").read_text().splitlines() if line.strip()]
    frame = pd.DataFrame(rows)
    if frame.empty:
        print("no results")
        return 1
    frame["harness_s"] = pd.to_numeric(frame.get("harness_s"), errors="coerce")
    judged = frame["correct"].fillna(False).astype(bool)
    print(f"problems finished: {len(frame)}; correct: {int(judged.sum())}; not correct: {int((~judged).sum())}")
    print(f"harness time: median {frame['harness_s'].median():.1f} s, max {frame['harness_s'].max():.1f} s, "
          f"over 30 s: {int((frame['harness_s'] > 30).sum())}")
    slowest = frame.sort_values("harness_s", ascending=False).head(8)
    print(slowest[["problem_id", "harness_s", "correct"]].to_string(index=False))
    failed = frame[~judged]
    if not failed.empty:
        print(failed[["problem_id", "harness_s", "failure_reason"]].to_string(index=False, max_colwidth=150))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
