"""Turning samples into live inputs: samples may hold `TensorSpec`s (e.g. loaded from JSON) instead of tensors."""

from __future__ import annotations

from typing import Any

import torch

from forge.samples import Sample, TensorSpec, draw_sample, map_values

__all__ = ["as_sample", "has_tensor_specs", "materialise"]


def as_sample(value: Any, index: int) -> Sample:
    """`value` as a `Sample` (a plain `(args, kwargs)` pair is accepted); a clear error for anything else."""
    if isinstance(value, Sample):
        return value
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], (tuple, list)) and isinstance(
        value[1], dict
    ):
        return Sample(tuple(value[0]), dict(value[1]))
    raise TypeError(f"samples[{index}] must be a forge.samples.Sample (args, kwargs), got {type(value).__name__}")


def has_tensor_specs(sample: Sample) -> bool:
    """Whether any argument is a `TensorSpec` rather than a tensor."""
    found: list[TensorSpec] = []

    def visit(value: Any) -> Any:
        if isinstance(value, TensorSpec):
            found.append(value)
        return value

    map_values((tuple(sample.args), dict(sample.kwargs)), visit)
    return bool(found)


def materialise(sample: Sample, generator: torch.Generator) -> Sample:
    """`sample` itself when it holds tensors only; else a copy with every `TensorSpec` drawn with `generator`."""
    return draw_sample(sample, generator) if has_tensor_specs(sample) else sample
