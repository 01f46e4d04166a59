"""`EvalOptions`: how one eval run selects, spreads, times and reports its samples, in one frozen object.

    from evals import EvalOptions, run_eval
    run_eval("smoke", "compile", out_dir="runs/smoke", options=EvalOptions(device="cpu", quick=True))

Every field has the default a plain `kforge eval SUITE` uses; `kforge eval`'s flags map onto the fields one to one
(`evals.cli.run_eval_command`). The options are checked when they are made, so a bad value fails before any
problem is loaded or worker started; only what depends on the machine (is CUDA there?) is checked by `run_eval`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from evals.results import parse_shard
from forge.checking import KernelUtils

__all__ = ["BACKENDS", "QUICK_KERNEL_UTILS", "EvalOptions"]

BACKENDS = ("local", "ray")

# Short timing for CI and smoke runs: the correctness checks are unchanged, only fewer benchmark passes.
QUICK_KERNEL_UTILS = KernelUtils(warmup=1, rounds=5, min_run_time_s=0.0)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class EvalOptions:
    """Settings of one `run_eval` call.

    `samples_per_problem`: independent samples per problem (pass@k). `problem_ids`: keep only these problem ids (in
    suite order); `shard` (`"i/N"` or `(i, N)`): then only static shard i of N of them. `device`: None (or
    `"auto"`) = CUDA when available, else CPU. `workers`: worker processes (None = one per visible GPU, or 1 on CPU;
    0 = evaluate in this process, without isolation). `backend`: `"local"` (worker processes) or `"ray"` (Ray tasks;
    `ray_address` joins a cluster, default a local instance). `timeout_s` (local worker processes only): per-sample
    limit, after which the sample is recorded as a timeout and its worker replaced. `kernel_utils`: the oracle and
    benchmark settings (None = `KernelUtils()`); `quick=True` keeps its checks but times with
    `QUICK_KERNEL_UTILS`' few passes. `resume`: continue the run already in the output folder, skipping recorded
    samples. `progress`: show a progress bar. `title`: the report's title (default names source and suites).
    `plots=False` skips the PNGs."""

    samples_per_problem: int = 1
    problem_ids: Sequence[str] | None = None
    shard: str | tuple[int, int] | None = None
    device: str | torch.device | None = None
    workers: int | None = None
    backend: str = "local"
    ray_address: str | None = None
    timeout_s: float | None = None
    kernel_utils: KernelUtils | None = None
    quick: bool = False
    resume: bool = False
    progress: bool = True
    title: str | None = None
    plots: bool = True

    def __post_init__(self) -> None:
        if not _is_int(self.samples_per_problem) or self.samples_per_problem < 1:
            raise ValueError(f"samples_per_problem must be an int >= 1 (samples per problem, for pass@k), got "
                             f"{self.samples_per_problem!r}")
        if self.workers is not None and (not _is_int(self.workers) or self.workers < 0):
            raise ValueError(f"workers must be None (one per GPU) or an int >= 0 (0 = in this process), got "
                             f"{self.workers!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        timeout = self.timeout_s
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                    or not 0 < timeout < math.inf):
            raise ValueError(f"timeout_s must be None or a finite number of seconds > 0, got {self.timeout_s!r}")
        if self.kernel_utils is not None and not isinstance(self.kernel_utils, KernelUtils):
            raise TypeError(f"kernel_utils must be a forge.checking.KernelUtils or None, got "
                            f"{type(self.kernel_utils).__name__}")
        if isinstance(self.shard, str):
            parse_shard(self.shard)  # names the expected form, i/N
        elif self.shard is not None:
            try:
                index, count = (int(v) for v in self.shard)
            except (TypeError, ValueError):
                raise ValueError(f"shard must be 'i/N' or a pair (i, N), got {self.shard!r}") from None
            if count < 1 or not 0 <= index < count:
                raise ValueError(f"shard {self.shard!r}: need N >= 1 and 0 <= i < N (shards are numbered from 0)")
            object.__setattr__(self, "shard", (index, count))
        if self.problem_ids is not None:
            if isinstance(self.problem_ids, str):
                raise TypeError(f"problem_ids must be a sequence of ids, not one string {self.problem_ids!r}; "
                                "pass [id, ...] (the CLI's --problems splits on commas)")
            object.__setattr__(self, "problem_ids", tuple(str(i) for i in self.problem_ids))

    def replace(self, **changes: Any) -> EvalOptions:
        return dataclasses.replace(self, **changes)

    def resolved_kernel_utils(self) -> KernelUtils:
        """The oracle and benchmark settings the run uses: `kernel_utils` (default `KernelUtils()`), with
        `QUICK_KERNEL_UTILS`' timing passes when `quick`."""
        utils = self.kernel_utils if self.kernel_utils is not None else KernelUtils()
        if self.quick:
            utils = dataclasses.replace(utils, warmup=QUICK_KERNEL_UTILS.warmup, rounds=QUICK_KERNEL_UTILS.rounds,
                                        min_run_time_s=QUICK_KERNEL_UTILS.min_run_time_s)
        return utils
