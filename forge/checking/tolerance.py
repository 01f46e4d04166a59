"""Error allowances: how far a candidate's output may sit from the float64 reference.

The allowance for element `i` of a floating output leaf is

    allowed_i = atol + rtol * |ref_i| + error_factor * (err_eager_i + rms(err_eager))

where `ref` is the reference function run on float64-upcast inputs, `err_eager = |eager - ref|` is eager
PyTorch's own error on the native-dtype inputs, and `(atol, rtol)` is a per-dtype floor. The eager term lets an
honest re-implementation be as inexact as PyTorch itself (times `error_factor`); the rms term keeps elements where
eager happens to be exact from getting an impossibly tight bound; the floor absorbs one rounding step of the
output dtype.

Default floors (`DEFAULT_TOLERANCES`), as `(atol, rtol)`:

- float64: 1e-7 (an honest fp64 kernel is off by ~1e-13; 1e-7 is still far below any real bug),
- float32: 1e-5 (a different reduction order or fused multiply-adds cost ~1e-6; TF32 matmuls, ~1e-3, fail:
  that is a precision downgrade),
- float16: 2e-3 (two fp16 ulps at 1.0; fp16 has 3 more mantissa bits than bf16, so 1e-2 would let `ref*1.005`
  pass),
- bfloat16: 1e-2 (about 1.3 bf16 ulps at 1.0),
- float8 types: 0.125 (e4m3) / 0.25 (e5m2), one ulp at 1.0,
- any other floating dtype: 2 * finfo(dtype).eps; complex dtypes use their real component dtype.

With these floors a candidate that returns zeros, `ref * 1.01` in fp32 or `ref + 0.1` in bf16 fails, while
fp32-accumulating re-implementations with another reduction order pass. When the float64 reference is not
available (the reference raises on float64 inputs), eager output is the reference and its own error is estimated
as one rounding step, `finfo(dtype).eps * |eager_i|`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

__all__ = [
    "DEFAULT_TOLERANCES",
    "allowed_error",
    "resolve_tolerances",
    "tolerance_for",
]

DEFAULT_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1e-2, 1e-2),
}
for _name, _tol in (
    ("float8_e4m3fn", 0.125),
    ("float8_e4m3fnuz", 0.125),
    ("float8_e5m2", 0.25),
    ("float8_e5m2fnuz", 0.25),
):
    _dtype = getattr(torch, _name, None)
    if isinstance(_dtype, torch.dtype):
        DEFAULT_TOLERANCES[_dtype] = (_tol, _tol)

_COMPLEX_COMPONENT = {torch.complex64: torch.float32, torch.complex128: torch.float64}
if hasattr(torch, "complex32"):
    _COMPLEX_COMPONENT[torch.complex32] = torch.float16


def resolve_tolerances(
    overrides: Mapping[torch.dtype, tuple[float, float]] | None,
) -> dict[torch.dtype, tuple[float, float]]:
    """The default floors with `overrides` (dtype -> (atol, rtol)) applied; a clear error for malformed input."""
    table = dict(DEFAULT_TOLERANCES)
    if overrides is None:
        return table
    if not isinstance(overrides, Mapping):
        raise TypeError(
            f"tolerances must be a dict mapping torch.dtype to (atol, rtol), got {type(overrides).__name__}"
        )
    for dtype, pair in overrides.items():
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"tolerances keys must be torch.dtype objects (e.g. torch.float32), got {dtype!r}")
        try:
            atol, rtol = (float(v) for v in pair)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"tolerances[{dtype}] must be a pair (atol, rtol) of numbers, got {pair!r}") from exc
        if not (math.isfinite(atol) and math.isfinite(rtol) and atol >= 0 and rtol >= 0):
            raise ValueError(f"tolerances[{dtype}] must hold finite non-negative numbers, got {pair!r}")
        table[dtype] = (atol, rtol)
    return table


def tolerance_for(dtype: torch.dtype, table: Mapping[torch.dtype, tuple[float, float]]) -> tuple[float, float]:
    """`(atol, rtol)` floor for a floating or complex dtype (complex dtypes use their component dtype)."""
    if dtype in table:
        return table[dtype]
    component = _COMPLEX_COMPONENT.get(dtype)
    if component is not None:
        return tolerance_for(component, table)
    eps = 2.0 * float(torch.finfo(dtype).eps)
    return (eps, eps)


def rounding_unit(dtype: torch.dtype) -> float:
    """`finfo(dtype).eps` (of the component dtype for complex dtypes)."""
    return float(torch.finfo(_COMPLEX_COMPONENT.get(dtype, dtype)).eps)


def allowed_error(
    reference: torch.Tensor,
    eager_error: torch.Tensor | None,
    dtype: torch.dtype,
    table: Mapping[torch.dtype, tuple[float, float]],
    error_factor: float,
) -> torch.Tensor:
    """Per-element allowance (float64, same shape as `reference`).

    `reference` is the float64 reference (finite where it matters); `eager_error` is `|eager - reference|` in
    float64, zero where not finite, or None when eager output *is* the reference (float64 run unavailable), in
    which case one rounding step of `dtype` stands in for it.
    """
    atol, rtol = tolerance_for(dtype, table)
    magnitude = reference.abs().nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
    if eager_error is None:
        eager_error = magnitude * rounding_unit(dtype)
    rms = eager_error.square().mean().sqrt() if eager_error.numel() else eager_error.new_zeros(())
    return atol + rtol * magnitude + error_factor * (eager_error + rms)
