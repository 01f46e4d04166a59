"""Where the harness's time goes on one KernelBench problem at its shipped size: `evaluate_problem` with eager as its
own candidate (no compile of the candidate) under cProfile, on CUDA when available.

    python3 -m benchmarks.harness_profile KB_FOLDER [PROBLEM_ID ...] [--device cuda] [--top 30]

KB_FOLDER is a KernelBench level folder (e.g. KernelBench/level1); the problems default to
`level1/1_Square_matrix_multiplication_`. Prints per problem the phase times of the record and the top functions by
cumulative and by own time.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time

import torch

from evals.problems import load_kernelbench_folder
from evals.sources import source_from_name
from evals.sources.evaluation import evaluate_problem


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="a KernelBench level folder, e.g. KernelBench/level1")
    parser.add_argument("problems", nargs="*", default=["level1/1_Square_matrix_multiplication_"],
                        help="problem ids (default: level1/1_Square_matrix_multiplication_)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--top", type=int, default=30, help="functions listed by cumulative time (half by own time)")
    args = parser.parse_args(argv)
    problems = {p.id: p for p in load_kernelbench_folder(args.folder)}
    unknown = [p for p in args.problems if p not in problems]
    if unknown:
        parser.error(f"unknown problem id(s) in {args.folder}: {', '.join(unknown)}")
    for problem_id in args.problems:
        profile = cProfile.Profile()
        start = time.perf_counter()
        profile.enable()
        record = evaluate_problem(source_from_name("eager"), problems[problem_id], 0, args.device)
        profile.disable()
        phases = {k: round(record[k], 2) for k in ("validate_s", "timing_s", "harness_s") if record.get(k) is not None}
        print(f"== {problem_id}: {time.perf_counter() - start:.1f} s, correct {record['correct']}, {phases}")
        stats = pstats.Stats(profile)
        stats.sort_stats("cumulative").print_stats(args.top)
        stats.sort_stats("tottime").print_stats(max(1, args.top * 2 // 3))
    return 0


if __name__ == "__main__":
    sys.exit(main())
