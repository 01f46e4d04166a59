"""`PatchConvProvider`: a `conv2d` whose stride equals its kernel (a ViT's patch embedding) as one GEMM.

Why: with stride == kernel size and no padding the patches do not overlap, so the convolution is a reshape of the
input into rows of `C * kh * kw` values (one copy) and a matrix product with the weight flattened the same way
(cuBLAS through `F.linear`, bias fused in the epilogue). cuDNN has no fast path for this shape class on the H200: for
timm's `vit_base_patch16_224` at batch 32 fp16 the profile showed 233 us in the conv kernel plus 88 us of NCHW <->
NHWC layout copies around it, for a 7.4 GFLOP product that cuBLAS runs in well under a tenth of that.

The output has PyTorch's layout (contiguous NCHW for a contiguous input: the oracle requires it, see
`forge.checking.compare.layout_error`), which costs one more copy of the output; the GEMM's natural NHWC result
would let timm's `flatten(2).transpose(1, 2)` skip its own copy, but other models `view` the conv's output.
Anything else (padding, dilation, groups, overlapping windows, non-4D inputs) is refused by `prepare`.
"""

from __future__ import annotations

from typing import Any

import torch

from forge.functional import original_function
from forge.provider import KernelProvider
from forge.samples import Sample

__all__ = ["PatchConvProvider"]


def _pair(value: Any) -> tuple[int, int] | None:
    if isinstance(value, int):
        return value, value
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return int(value[0]), int(value[1])
    return None


def _arguments(args: tuple, kwargs: dict) -> dict[str, Any]:
    names = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
    bound = dict(zip(names, args, strict=False))
    bound.update(kwargs)
    return {"bias": None, "stride": 1, "padding": 0, "dilation": 1, "groups": 1, **bound}


def _servable(call: dict[str, Any]) -> bool:
    x, w = call.get("input"), call.get("weight")
    if not isinstance(x, torch.Tensor) or not isinstance(w, torch.Tensor) or x.dim() != 4 or w.dim() != 4:
        return False
    stride, dilation = _pair(call["stride"]), _pair(call["dilation"])
    padding = call["padding"]
    kernel = (int(w.shape[2]), int(w.shape[3]))
    no_padding = padding in (0, (0, 0), [0, 0], "valid")
    return (stride == kernel and dilation == (1, 1) and no_padding and call["groups"] == 1
            and x.shape[1] == w.shape[1] and x.shape[2] % kernel[0] == 0 and x.shape[3] % kernel[1] == 0
            and x.dtype == w.dtype and x.is_floating_point())


class PatchConvProvider(KernelProvider, type_name="patch_conv_gemm"):
    """Non-overlapping `conv2d` (stride == kernel, no padding, groups 1) as patch reshape + one GEMM."""

    @property
    def supported_function(self) -> str:
        return "conv2d"

    @property
    def name(self) -> str:
        return "patch conv2d as GEMM"

    def _prepare(self, samples: list[Sample]) -> bool:
        return bool(samples) and all(_servable(_arguments(tuple(s.args), dict(s.kwargs))) for s in samples)

    def _call(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        call = _arguments(args, kwargs)
        if not _servable(call):
            return original_function("conv2d")(*args, **kwargs)
        x, weight, bias = call["input"], call["weight"], call["bias"]
        batch, channels, height, width = x.shape
        out_channels, _, kh, kw = weight.shape
        rows, cols = height // kh, width // kw
        patches = (x.reshape(batch, channels, rows, kh, cols, kw).permute(0, 2, 4, 1, 3, 5)
                   .reshape(batch * rows * cols, channels * kh * kw))
        out = original_function("linear")(patches, weight.reshape(out_channels, -1), bias)
        nhwc = out.view(batch, rows, cols, out_channels).permute(0, 3, 1, 2)
        return nhwc.contiguous(memory_format=torch.channels_last if x.is_contiguous(
            memory_format=torch.channels_last) and not x.is_contiguous() else torch.contiguous_format)

    def _to_dict(self) -> dict[str, Any]:
        return {}

    @classmethod
    def _from_dict(cls, state: dict[str, Any]) -> PatchConvProvider:
        return cls()
