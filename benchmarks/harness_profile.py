"""Where the harness's time goes on one KernelBench problem at its shipped size: `evaluate_problem` with eager as its
own candidate (no compile of the candidate) under cProfile, on CUDA when available.

    python3 -m benchmarks.harness_profile [KB_FOLDER] [PROBLEM_ID ...]

Prints per problem the phase times of the record and the top functions by cumulative and by own time.
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time

import torch

from evals.problems import load_kernelbench_folder
from evals.sources import source_from_name
from evals.sources.evaluation import evaluate_problem


def main(argv: list[str]) -> None:
    folder = argv[0] if argv else ".gpu/kernelbench/level1"
    wanted = argv[1:] or ["level1/1_Square_matrix_multiplication_"]
    problems = {p.id: p for p in load_kernelbench_folder(folder)}
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for problem_id in wanted:
        profile = cProfile.Profile()
        start = time.perf_counter()
        profile.enable()
        record = evaluate_problem(source_from_name("eager"), problems[problem_id], 0, device)
        profile.disable()
        phases = {k: round(record[k], 2) for k in ("validate_s", "timing_s", "harness_s") if record.get(k) is not None}
        print(f"== {problem_id}: {time.perf_counter() - start:.1f} s, correct {record['correct']}, {phases}")
        stats = pstats.Stats(profile)
        stats.sort_stats("cumulative").print_stats(30)
        stats.sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main(sys.argv[1:])
