"""ModelNew for `36_RMSNorm_`: y = x / sqrt(mean(x^2, dim=1, keepdim=True) + eps).

x is [B, C, *spatial] with the normalisation over C (dim 1).  Every spatial position is normalised
independently across its C channels, which are spaced by the channel stride.  One Triton kernel, one pass:
* a program owns one batch element and BLOCK_S consecutive spatial positions; it loads the whole
  [BLOCK_C, BLOCK_S] tile (each channel row is a contiguous, coalesced run of BLOCK_S floats), reduces the
  squares over the channel axis in fp32, takes sqrt(mean + eps) per position and stores x / rms;
* each element is read once and written once (7.5 GB in, 7.5 GB out for the served shape); loads are
  marked evict-first because nothing is reused.
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _rmsnorm_dim1_kernel(
    x_ptr,
    out_ptr,
    C,
    S,
    stride_xb,
    stride_xc,
    stride_ob,
    stride_oc,
    eps,
    BLOCK_C: tl.constexpr,
    BLOCK_S: tl.constexpr,
    EVEN_C: tl.constexpr,
    EVEN_S: tl.constexpr,
):
    pid_s = tl.program_id(0)
    pid_b = tl.program_id(1).to(tl.int64)

    offs_c = tl.arange(0, BLOCK_C)
    offs_s = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)
    x_ptrs = x_ptr + pid_b * stride_xb + offs_c[:, None] * stride_xc + offs_s[None, :]
    o_ptrs = out_ptr + pid_b * stride_ob + offs_c[:, None] * stride_oc + offs_s[None, :]

    if EVEN_C and EVEN_S:
        x = tl.load(x_ptrs, eviction_policy="evict_first")
    else:
        mask = (offs_c[:, None] < C) & (offs_s[None, :] < S)
        x = tl.load(x_ptrs, mask=mask, other=0.0, eviction_policy="evict_first")
    xf = x.to(tl.float32)

    mean_sq = tl.sum(xf * xf, axis=0) / C  # [BLOCK_S]
    rms = tl.sqrt(mean_sq + eps)
    y = xf / rms[None, :]

    if EVEN_C and EVEN_S:
        tl.store(o_ptrs, y.to(out_ptr.dtype.element_ty))
    else:
        tl.store(o_ptrs, y.to(out_ptr.dtype.element_ty), mask=mask)


class ModelNew(nn.Module):
    """
    RMS normalization over the feature dimension (dim 1), as one Triton kernel.
    """

    def __init__(self, num_features: int, eps: float = 1e-5):
        super(ModelNew, self).__init__()
        self.num_features = num_features
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() < 2:
            raise ValueError("expected an input of shape (batch, features, *)")
        B, C = x.shape[0], x.shape[1]
        S = 1
        for d in x.shape[2:]:
            S *= d
        # The spatial dims must collapse into one unit-stride axis (true for the contiguous served input).
        if x.dim() > 2:
            expected = 1
            for i in range(x.dim() - 1, 1, -1):
                if x.shape[i] != 1 and x.stride(i) != expected:
                    raise ValueError(f"spatial dims must be dense and unit-stride, got stride {x.stride()}")
                expected *= x.shape[i]

        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        if out.numel() == 0:
            return out

        block_c = triton.next_power_of_2(C)
        if block_c > 1024:
            raise NotImplementedError("this kernel keeps all channels of a tile in registers (C <= 1024)")
        block_s = max(16, min(256, 16384 // block_c, triton.next_power_of_2(S)))
        grid = (triton.cdiv(S, block_s), B)
        _rmsnorm_dim1_kernel[grid](
            x,
            out,
            C,
            S,
            x.stride(0),
            x.stride(1),
            C * S,
            S,
            self.eps,
            BLOCK_C=block_c,
            BLOCK_S=block_s,
            EVEN_C=block_c == C,
            EVEN_S=S % block_s == 0,
            num_warps=8,
        )
        return out
