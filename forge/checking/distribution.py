"""The distributions the harness draws from: `benchmark_distribution` (how many times each unique sample appears in
one benchmark pass) and `wide_sample` (fresh inputs wider than the captured ones, for the oracle's probes).

`wide_sample`: fresh inputs drawn with the captured mean and spread are as degenerate as the captured data, so an
all-zero gelu on small bf16 activations and a constant 1/N softmax on flat logits passed every fresh draw. A wide draw
(`forge.samples.Widening`: 4x the captured spread, at least unit spread, 1/64 of the elements 8x further out) makes such
outputs fail whatever the floors: measured on the exploits' shapes (bf16 gelu of spread 4e-3, fp32 softmax of spread
1e-4), the zero gelu's median error is 9x its allowance on the wide draw (23x on the captured draw with the
scale-relative floor of `forge.checking.tolerance`), the constant softmax's ~17,000x (3x captured).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import torch

from forge.samples import Sample, Widening, draw_sample

__all__ = ["benchmark_distribution", "wide_sample"]

logger = logging.getLogger(__name__)


def benchmark_distribution(counted: Sequence[tuple[int, Sample]], max_calls: int = 64) -> list[Sample]:
    """Samples of one benchmark pass from `(count, sample)` pairs (see the module docstring)."""
    if isinstance(max_calls, bool) or not isinstance(max_calls, int) or max_calls < 1:
        raise ValueError(f"max_calls must be an int >= 1, got {max_calls!r}")
    pairs = list(counted)
    for index, pair in enumerate(pairs):
        if not (isinstance(pair, tuple) and len(pair) == 2):
            raise TypeError(f"counted[{index}] must be a (count, sample) pair, got {pair!r}")
        count = pair[0]
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"counted[{index}] has count {count!r}; counts must be ints >= 1")
    if not pairs:
        return []
    divisor = math.gcd(*(count for count, _ in pairs))
    reduced = [count // divisor for count, _ in pairs]
    total = sum(reduced)
    if total > max_calls:
        scale = max_calls / total
        scaled = [max(1, round(count * scale)) for count in reduced]
        divisor = math.gcd(*scaled)
        scaled = [count // divisor for count in scaled]
        logger.debug(
            "benchmark distribution of %d calls per pass capped at %d: counts %s scaled to %s",
            total, max_calls, reduced, scaled,
        )
        reduced = scaled
    return [sample for count, (_, sample) in zip(reduced, pairs, strict=True) for _ in range(count)]


def wide_sample(sample: Sample, generator: torch.Generator, widening: Widening | None = None) -> Sample:
    """A fresh call like `sample` (tensors or `TensorSpec`s) with floating tensors drawn wider than captured."""
    return draw_sample(sample, generator, widen=widening if widening is not None else Widening())
