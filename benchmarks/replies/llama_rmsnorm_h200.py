# A stand-in model's first reply to the instance prompt for transformers' LlamaRMSNorm on an NVIDIA H200
# (benchmarks/replies/README.md); the code below is unedited.
import math
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _rmsnorm_fwd_kernel(
    x_ptr, w_ptr, out_ptr,
    S,
    stride_xb, stride_xs, stride_xn,
    stride_ob, stride_os,
    N, eps,
    BLOCK_N: tl.constexpr,
    EVEN_N: tl.constexpr,
):
    row = tl.program_id(0)
    b = row // S
    s = row - b * S
    x_row = x_ptr + b.to(tl.int64) * stride_xb + s.to(tl.int64) * stride_xs
    o_row = out_ptr + b.to(tl.int64) * stride_ob + s.to(tl.int64) * stride_os
    cols = tl.arange(0, BLOCK_N)

    if EVEN_N:
        x = tl.load(x_row + cols * stride_xn, eviction_policy="evict_first")
        w = tl.load(w_ptr + cols, eviction_policy="evict_last")
    else:
        mask = cols < N
        x = tl.load(x_row + cols * stride_xn, mask=mask, other=0.0,
                    eviction_policy="evict_first")
        w = tl.load(w_ptr + cols, mask=mask, other=0.0,
                    eviction_policy="evict_last")

    xf = x.to(tl.float32)
    var = tl.sum(xf * xf, axis=0) / N
    rstd = 1.0 / tl.sqrt(var + eps)
    # hidden_states.to(input_dtype)
    y = (xf * rstd).to(x_ptr.dtype.element_ty)
    # weight * y  (computed in fp32, rounded once to the promoted output dtype)
    out = (w.to(tl.float32) * y.to(tl.float32)).to(out_ptr.dtype.element_ty)

    if EVEN_N:
        tl.store(o_row + cols, out)
    else:
        tl.store(o_row + cols, out, mask=cols < N)


class ModelNew(nn.Module):
    def __init__(self, original):
        super().__init__()
        self.weight = original.weight
        self.variance_epsilon = original.variance_epsilon

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        x = hidden_states
        w = self.weight
        N = x.shape[-1]
        out_dtype = torch.promote_types(w.dtype, x.dtype)
        out = torch.empty(x.shape, dtype=out_dtype, device=x.device)

        nd = x.dim()
        if nd == 1:
            B, S = 1, 1
            sxb, sxs, sxn = 0, 0, x.stride(0)
        elif nd == 2:
            B, S = 1, x.shape[0]
            sxb, sxs, sxn = 0, x.stride(0), x.stride(1)
        elif nd == 3:
            B, S = x.shape[0], x.shape[1]
            sxb, sxs, sxn = x.stride(0), x.stride(1), x.stride(2)
        else:
            x = x.contiguous().view(-1, N)
            B, S = 1, x.shape[0]
            sxb, sxs, sxn = 0, x.stride(0), x.stride(1)

        M = B * S
        if M == 0 or N == 0:
            return out
        # output is contiguous
        sob = S * N
        sos = N

        BLOCK_N = triton.next_power_of_2(N)
        EVEN_N = BLOCK_N == N
        if BLOCK_N >= 8192:
            num_warps = 16
        elif BLOCK_N >= 2048:
            num_warps = 8
        elif BLOCK_N >= 1024:
            num_warps = 4
        else:
            num_warps = 2

        _rmsnorm_fwd_kernel[(M,)](
            x, w, out,
            S,
            sxb, sxs, sxn,
            sob, sos,
            N, float(self.variance_epsilon),
            BLOCK_N=BLOCK_N,
            EVEN_N=EVEN_N,
            num_warps=num_warps,
        )
        return out
