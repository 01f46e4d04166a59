"""Small `supports` checks shared by the library adapters: each takes the bound F arguments and returns None
(servable) or a short reason. Libraries written in Triton typically handle fp16, bf16 and fp32 only, assume a
weight tensor where F allows None, and normalise over the last dimension only."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

__all__ = ["all_of", "floating_input", "last_dim_only", "normalized_over_last_dim", "requires", "rejects_true"]

Check = Callable[[Mapping[str, Any]], "str | None"]

_TRITON_FLOATS = (torch.float16, torch.bfloat16, torch.float32)


def all_of(*checks: Check) -> Check:
    """A check that passes when every one of `checks` passes (the first reason otherwise)."""

    def check(arguments: Mapping[str, Any]) -> str | None:
        for one in checks:
            reason = one(arguments)
            if reason is not None:
                return reason
        return None

    return check


def floating_input(arguments: Mapping[str, Any]) -> str | None:
    """`input` is an fp16 / bf16 / fp32 tensor, and every other tensor argument has its dtype."""
    tensor = arguments.get("input")
    if not isinstance(tensor, torch.Tensor) or tensor.dtype not in _TRITON_FLOATS:
        return f"input must be an fp16, bf16 or fp32 tensor, got {getattr(tensor, 'dtype', type(tensor).__name__)}"
    for name, value in arguments.items():
        if isinstance(value, torch.Tensor) and value.dtype != tensor.dtype:
            return f"{name} is {value.dtype} but input is {tensor.dtype}"
    return None


def requires(*names: str) -> Check:
    """The named arguments are not None (e.g. a weight that F makes optional)."""

    def check(arguments: Mapping[str, Any]) -> str | None:
        missing = [n for n in names if arguments.get(n) is None]
        return f"needs {' and '.join(missing)} (None is not supported)" if missing else None

    return check


def rejects_true(name: str) -> Check:
    """The named flag (e.g. `inplace`) is not set."""

    def check(arguments: Mapping[str, Any]) -> str | None:
        return f"{name}=True is not supported" if arguments.get(name) else None

    return check


def normalized_over_last_dim(arguments: Mapping[str, Any]) -> str | None:
    """`normalized_shape` is exactly the input's last dimension."""
    shape = tuple(arguments.get("normalized_shape") or ())
    tensor = arguments["input"]
    if len(shape) != 1 or tensor.ndim < 1 or shape[0] != tensor.shape[-1]:
        return f"normalizes over {list(shape)}, not over the last dimension only"
    return None


def last_dim_only(arguments: Mapping[str, Any]) -> str | None:
    """softmax over the last dimension, with no `dtype` conversion."""
    tensor, dim = arguments["input"], arguments.get("dim")
    if dim is None or tensor.ndim == 0 or dim not in (-1, tensor.ndim - 1):
        return f"softmax over dim={dim}, not the last dimension"
    if arguments.get("dtype") is not None:
        return "softmax with a dtype conversion is not supported"
    return None
