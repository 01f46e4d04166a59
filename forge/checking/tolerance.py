"""Error allowances: how far a candidate's output may sit from the float64 reference.

The allowance for element `i` of a floating output leaf is

    allowed_i = atol * min(1, scale) + rtol * |ref_i| + error_factor * (err_eager_i + rms(err_eager))
    scale     = max(rms(ref), smallest normal of the dtype)

where `ref` is the reference function run on float64-upcast inputs, `err_eager = |eager - ref|` is eager
PyTorch's own error on the native-dtype inputs, and `(atol, rtol)` is a per-dtype floor. The eager term lets an
honest re-implementation be as inexact as PyTorch itself (times `error_factor`); the rms term keeps elements where
eager happens to be exact from getting an impossibly tight bound; the floor absorbs one rounding step of the
output dtype.

Why the scale: the absolute floors are one rounding step *at 1.0*. An output whose values are all much smaller than 1
sat entirely under them: an all-zero gelu on bf16 activations of spread 4e-3 (|gelu| ~ 2e-3, under bf16's 1e-2) and a
constant 1/64 softmax on logits of spread 1e-4 (deviations ~2e-6, under fp32's 1e-5) passed and were selected. The floor
is therefore scaled by the output's own root-mean-square magnitude when that is below 1 (outputs larger than 1 keep it:
`rtol` already grows with them). Measured on those shapes (CPU, fp64 reference): the all-zero gelu now exceeds its
allowance 23x at the median element (62x worst), the constant softmax 3x (18x worst), an fp32 rms_norm whose sum of
squares is accumulated in bf16 fails on a small-gain layer (outputs ~2e-4), while the honest interpreted Triton gelu on
the same bf16 sample uses 0.3% of its allowance at its worst element. An honest kernel's error near zero is still
covered by eager PyTorch's own error (the rms term), and an all-zero reference keeps the dtype's smallest normal as its
floor instead of zero.

What the floors cannot see: a bf16-in, bf16-out rms_norm accumulating in bf16 is, at hidden size 1024, as close to
the float64 reference as an honest fp32-accumulating kernel (rms of error/allowance 0.07-0.13 vs 0.06-0.09 over
normal and outlier-heavy draws, tree or 128-wide chunks even closer); sequential 16-wide bf16 chunks fail on their
own at hidden size 4096 (worst element 1.6-7x its allowance). The oracle judges numbers, not the method: a precision
downgrade that stays as accurate as the honest kernel is not a wrong answer.

The outlier budget: on an output of n elements, up to `outlier_budget(n)` = floor(n * 1e-5) elements may exceed
their allowance when none exceeds the tail bound, `error_factor` times eager PyTorch's own largest error on that
output (`tail_allowance`; none at all under 100,000 elements). Why: the eager term is eager's error *at the same
element*, and a kernel with another rounding order has its rare worst elements elsewhere. Measured on the H200 (Llama-
3.2-1B `LlamaAttention`, bf16, 1 x 2048 x 2048 outputs): an honest Triton flash attention (online softmax, bf16
probabilities before the value product, as FlashAttention does) put 8-12 of 4,194,304 elements outside their
allowance (worst 4.6x it, 0.0118 absolute), and PyTorch's own FLASH_ATTENTION backend 1 element on a wide-value probe,
against the allowance eager (cuDNN) set. Neither is a wrong answer; a kernel that is wrong (zeros, a skipped row, a
lower precision) is off on far more elements than the budget, or by more than PyTorch ever is.

Where eager itself is off: some outputs are decided by rounding (on the oracle's wide draw, `LlamaAttention`'s bf16
logits are so large that the rounding of q and k picks which key wins). Eager PyTorch is then beyond the floor on many
elements, and an honest kernel with another rounding order is off as often, at other elements: measured on the H200,
`torch.compile` of the original forward put 6,515-12,145 of 4,194,304 elements outside their allowance on that draw, the
model's Triton flash attention 4,650-9,405. So the budget grows by `error_factor` times the count of elements where
eager's own error exceeds the floor (`eager_outlier_count`: the allowance less its per-element eager term). A
well-conditioned output has none (eager is within a rounding step of the reference, under `rtol`), so its budget is
unchanged; a kernel that is wrong is off on far more elements than PyTorch is, or by more than its worst error. With
this rule the model's attention file is judged correct on the H200 (BENCHMARKS K7).

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
    "OUTLIER_FRACTION",
    "allowed_error",
    "eager_outlier_count",
    "outlier_budget",
    "output_scale",
    "resolve_tolerances",
    "tail_allowance",
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
    return atol * output_scale(magnitude, dtype) + rtol * magnitude + error_factor * (eager_error + rms)


# Of an output of n elements, up to floor(n * OUTLIER_FRACTION) may exceed their allowance if each stays within the tail
# bound (`tail_allowance`): error_factor times eager PyTorch's own largest error on that output. Outputs under 100,000
# elements get no outliers.
OUTLIER_FRACTION = 1e-5


def outlier_budget(numel: int, eager_outliers: int = 0, error_factor: float = 1.0) -> int:
    """How many elements of an output of `numel` may exceed their allowance (each within the tail bound):
    floor(numel * OUTLIER_FRACTION), plus `error_factor` times the elements where eager PyTorch's own error exceeds
    the floor (`eager_outliers`, see `eager_outlier_count`)."""
    return int(numel * OUTLIER_FRACTION) + math.ceil(error_factor * eager_outliers)


def eager_outlier_count(allowed: torch.Tensor, eager_error: torch.Tensor | None, error_factor: float) -> torch.Tensor:
    """How many elements (0-dim int64) of one output eager PyTorch itself puts beyond the floor: `eager_error` above
    `allowed` (from `allowed_error`) less its own per-element eager term. Zero on a well-conditioned output (eager is
    within a rounding step there), the count of elements the rounding order decides on an ill-conditioned one."""
    if eager_error is None or not eager_error.numel():
        return torch.zeros((), dtype=torch.int64, device=allowed.device)
    return (eager_error > allowed - error_factor * eager_error).sum()


def tail_allowance(worst_eager_error: torch.Tensor | None, error_factor: float) -> torch.Tensor:
    """The tail bound of one output (0-dim float64): `error_factor` times eager PyTorch's largest error on it
    (`|eager - reference|`, or one rounding step of the largest value when eager is the reference); 0 for an empty
    output."""
    if worst_eager_error is None:
        return torch.zeros((), dtype=torch.float64)
    return (error_factor * worst_eager_error.to(torch.float64)).reshape(())


def output_scale(magnitude: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The factor on the absolute floor: `rms(|ref|)` clamped to [smallest normal of `dtype`, 1] (a 0-dim tensor).

    `magnitude` is `|reference|` with non-finite values zeroed."""
    if not magnitude.numel():
        return magnitude.new_ones(())
    tiny = float(torch.finfo(_COMPLEX_COMPONENT.get(dtype, dtype)).tiny)
    return magnitude.square().mean().sqrt().clamp(min=tiny, max=1.0)
