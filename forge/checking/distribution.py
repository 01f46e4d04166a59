"""`benchmark_distribution`: how many times each unique sample appears in one benchmark pass.

Counts are divided by their GCD (the seed's rule: counts 300/100 become 3/1), each sample repeated that many times
in first-seen order. Unlike the seed, the pass is capped: when the reduced total exceeds `max_calls` (coprime counts
such as 1000/999 would give 1999 calls per pass), counts are scaled proportionally, each unique sample keeping at
least one call.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

from forge.samples import Sample

__all__ = ["benchmark_distribution"]

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
