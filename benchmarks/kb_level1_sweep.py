"""Summarise a `kforge eval <KernelBench>/level1 --source eager` run at shipped sizes (the harness's target: every
level-1 problem validates on one H200, each in under 30 s of harness time): counts, the slowest harness times, and
every problem that was not judged correct with its reason. Reads `results.jsonl` (so a run cut short by its time
limit still reports what it finished).

    python3 benchmarks/kb_level1_sweep.py RUN_DIR

`--ids LEVEL_DIR NUMBERS` prints the problem ids `kforge eval --problems` takes for problem numbers instead (e.g.
`83-98,100,68` -> `level1/83_...,level1/84_...`), in the order given:

    kforge eval KernelBench/level1 --problems "$(python3 benchmarks/kb_level1_sweep.py --ids KernelBench/level1 61,68)"
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd


def problem_ids(level_dir: str | Path, numbers: str) -> list[str]:
    """`level/<file stem>` of each numbered problem in `level_dir`; `numbers` is comma-separated, with ranges `a-b`."""
    folder = Path(level_dir)
    wanted: list[int] = []
    for part in (p.strip() for p in numbers.split(",") if p.strip()):
        low, _, high = part.partition("-")
        wanted += list(range(int(low), int(high or low) + 1))
    by_number = {int(path.name.split("_", 1)[0]): path.stem for path in folder.glob("[0-9]*_*.py")}
    missing = [n for n in wanted if n not in by_number]
    if missing:
        raise SystemExit(f"no problem numbered {', '.join(map(str, missing))} in {folder}")
    return [f"{folder.name}/{by_number[n]}" for n in wanted]


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


def cli(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", nargs="?", help="the --out folder of a kforge eval run")
    parser.add_argument("--ids", nargs=2, metavar=("LEVEL_DIR", "NUMBERS"), help="print problem ids instead")
    args = parser.parse_args(argv)
    if args.ids:
        print(",".join(problem_ids(*args.ids)))
        return 0
    if not args.run_dir:
        parser.error("give RUN_DIR, or --ids LEVEL_DIR NUMBERS")
    return main(args.run_dir)


if __name__ == "__main__":
    sys.exit(cli())
