"""The end-to-end check's decision (`forge.end_to_end.check_plan`) on scripted model timings.

The timers stand in for whole-model block medians so the rule itself is tested: paired blocks against the better
neighbouring baseline, a sign test, entries dropped one at a time. The real timing path is tested end to end in
test_optimizer.py (a real model, real providers)."""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass

import pytest

from forge.end_to_end import PairedComparison, check_plan, sign_test_p
from forge.execution import Execution


@dataclass(frozen=True)
class Entry:
    function: str
    saves_ms: float  # what the entry takes off (negative: adds) a 10 ms model
    baseline_ms: float = 1.0
    latency_ms: float = 0.5


def scripted(noise: float = 0.02, seed: int = 0, baseline_pattern=None):
    """`measure` for check_plan: 10 ms minus what the selected entries save, times lognormal-ish noise."""
    rng = random.Random(seed)
    calls = {"baseline": 0}

    def measure(selection):
        total = 10.0 - sum(e.saves_ms for e in selection)
        if not selection and baseline_pattern is not None:
            pattern = itertools.cycle(baseline_pattern)
            return lambda: total * next(pattern)

        def block():
            calls["baseline"] += not selection
            return total * (1.0 + rng.uniform(-noise, noise))
        return block

    return measure


def test_sign_test():
    assert sign_test_p(8, 8) == pytest.approx(1 / 256)
    assert sign_test_p(7, 8) == pytest.approx(9 / 256)
    assert sign_test_p(0, 8) == 1.0


def test_a_plan_faster_in_every_block_is_kept():
    entries = [Entry("conv2d", 0.9)]
    check = check_plan(entries, scripted(), execution=Execution.EAGER, blocks=8)
    assert check.kept == tuple(entries) and not check.dropped
    row = check.frame().iloc[0]
    assert row["verdict"] == "kept: faster" and row["blocks_won"] == "8/8" and row["speedup"] > 1.05


def test_a_plan_slower_end_to_end_is_dropped_with_the_reason():
    entries = [Entry("sdpa", -0.5)]
    check = check_plan(entries, scripted(), execution=Execution.COMPILE, blocks=8)
    assert check.kept == ()
    (entry, why), = check.dropped
    assert entry is entries[0] and "not faster with it" in why and "0 of 8 blocks" in why


def test_one_slow_baseline_per_block_does_not_keep_a_plan_that_is_no_faster():
    """Each block times a baseline before and after the plan; here the first is always 30% slow (a noisy host),
    the plan no faster than the second. The rule that kept a plan unless BOTH baselines beat it kept this one."""
    entries = [Entry("group_norm", 0.0)]
    measure = scripted(noise=0.0, baseline_pattern=[1.3, 1.0])
    check = check_plan(entries, measure, execution=Execution.CUDA_GRAPHS, blocks=8)
    assert check.kept == ()
    assert check.trials[0][2].speedup == pytest.approx(1.0)


def test_entries_are_dropped_one_at_a_time_until_the_rest_wins():
    helps, hurts, neutral = Entry("conv2d", 0.8), Entry("sdpa", -1.5), Entry("gelu", 0.0)
    check = check_plan([helps, hurts, neutral], scripted(), execution=Execution.EAGER, blocks=8)
    assert check.kept == (helps,) or check.kept == (helps, neutral)
    assert hurts in [e for e, _ in check.dropped]
    frame = check.frame()
    assert frame.iloc[0]["verdict"] == "loses: dropping an entry"
    assert frame.iloc[-1]["verdict"] == "kept: faster"


def test_beyond_the_leave_one_out_limit_the_smallest_estimated_saving_goes_first():
    entries = [Entry(f"f{i}", 0.3 if i else -3.0, latency_ms=0.9 if i == 0 else 0.5) for i in range(6)]
    check = check_plan(entries, scripted(), execution=Execution.EAGER, blocks=8,
                       saving=lambda e: e.baseline_ms - e.latency_ms, leave_one_out_limit=4)
    assert check.dropped[0][0] is entries[0]
    assert check.kept == tuple(entries[1:])


def test_paired_comparison_statistics():
    comparison = PairedComparison((2.0, 2.0, 2.0, 2.0), (1.0, 1.0, 4.0, 1.0))
    assert comparison.wins == 3 and comparison.speedup == 2.0
    assert not comparison.faster(alpha=0.05)  # 3 of 4 is not significant
    assert math.isclose(comparison.p_value, 5 / 16)
