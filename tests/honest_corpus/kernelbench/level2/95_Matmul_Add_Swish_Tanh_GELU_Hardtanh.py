"""ModelNew for `95_Matmul_Add_Swish_Tanh_GELU_Hardtanh`:
    y = hardtanh(gelu(tanh(swish(x @ W^T + b + add_value))), -1, 1)

One fused Triton kernel:
* tiled GEMM (128 x 128 x 32) in true fp32 (tl.dot with input_precision="ieee"), grouped tile order so the
  row-tiles that share a weight column-block run together (weight read from HBM about once);
* epilogue in registers, in the reference's order: + linear bias, + add_value, swish (x * sigmoid(x)),
  tanh, exact GELU 0.5 * x * (1 + erf(x / sqrt(2))), hardtanh clamp to [-1, 1]; one fp32 store.
tanh is evaluated as sign(x) * (1 - e) / (1 + e) with e = exp(-2|x|) (no overflow), with a short odd Taylor
series for |x| < 0.05, where the exp form would lose relative accuracy to cancellation.
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _tanh(x):
    ax = tl.abs(x)
    e = tl.exp(-2.0 * ax)
    t = (1.0 - e) / (1.0 + e)
    x2 = x * x
    # tanh(x) = x - x^3/3 + 2x^5/15 - ... ; truncation error < 1e-9 relative for |x| < 0.05
    small = x * (1.0 - x2 * (0.3333333333333333 - x2 * 0.13333333333333333))
    big = tl.where(x >= 0.0, t, -t)
    return tl.where(ax < 0.05, small, big)


@triton.jit
def _gemm_add_act_kernel(
    a_ptr,
    w_ptr,
    b_ptr,
    add_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_wn,
    stride_wk,
    stride_add,
    stride_om,
    stride_on,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (pid % num_pid_in_group) % group_size_m
    pid_n = (pid % num_pid_in_group) // group_size_m

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    rm = offs_m % M  # wrapped rows/cols keep the main loop mask-free; they are never stored
    rn = offs_n % N

    a_ptrs = a_ptr + rm[:, None] * stride_am + offs_k[None, :] * stride_ak  # [BLOCK_M, BLOCK_K]
    w_ptrs = w_ptr + rn[None, :] * stride_wn + offs_k[:, None] * stride_wk  # [BLOCK_K, BLOCK_N] = W^T tile

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(w_ptrs)
        else:
            k_rem = K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_rem, other=0.0)
            b = tl.load(w_ptrs, mask=offs_k[:, None] < k_rem, other=0.0)
        acc += tl.dot(a, b, input_precision="ieee")
        a_ptrs += BLOCK_K * stride_ak
        w_ptrs += BLOCK_K * stride_wk

    y = acc
    if HAS_BIAS:
        y = y + tl.load(b_ptr + rn).to(tl.float32)[None, :]
    y = y + tl.load(add_ptr + rn * stride_add).to(tl.float32)[None, :]
    # Swish
    y = y * (1.0 / (1.0 + tl.exp(-y)))
    # Tanh
    y = _tanh(y)
    # GELU (exact, erf form -- torch's default approximate='none')
    y = 0.5 * y * (1.0 + tl.math.erf(y * 0.7071067811865476))
    # Hardtanh(-1, 1)
    y = tl.minimum(tl.maximum(y, -1.0), 1.0)

    out_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(out_ptrs, y.to(out_ptr.dtype.element_ty), mask=mask)


class ModelNew(nn.Module):
    """
    Matmul, add, Swish, Tanh, GELU and Hardtanh, fused into one Triton kernel.
    """

    BLOCK_M = 128
    BLOCK_N = 128
    BLOCK_K = 32
    GROUP_M = 8

    def __init__(self, in_features, out_features, add_value_shape):
        super(ModelNew, self).__init__()
        self.matmul = nn.Linear(in_features, out_features)
        self.add_value = nn.Parameter(torch.randn(add_value_shape))

    def forward(self, x):
        w = self.matmul.weight
        b = self.matmul.bias
        if x.dim() != 2:
            raise ValueError("expected a 2-D (batch, in_features) input")
        if x.dtype != torch.float32 or w.dtype != torch.float32:
            raise TypeError("this kernel serves float32 inputs and weights")
        M, K = x.shape
        N = w.shape[0]
        add = self.add_value
        if add.dim() != 1 or add.shape[0] != N:
            raise ValueError("add_value must have shape (out_features,)")
        out = torch.empty((M, N), dtype=x.dtype, device=x.device)
        if M == 0 or N == 0:
            return out
        grid = (triton.cdiv(M, self.BLOCK_M) * triton.cdiv(N, self.BLOCK_N),)
        _gemm_add_act_kernel[grid](
            x,
            w,
            b if b is not None else add,
            add,
            out,
            M,
            N,
            K,
            x.stride(0),
            x.stride(1),
            w.stride(0),
            w.stride(1),
            add.stride(0),
            out.stride(0),
            out.stride(1),
            HAS_BIAS=b is not None,
            BLOCK_M=self.BLOCK_M,
            BLOCK_N=self.BLOCK_N,
            BLOCK_K=self.BLOCK_K,
            GROUP_M=self.GROUP_M,
            EVEN_K=K % self.BLOCK_K == 0,
            num_warps=8,
            num_stages=3,
        )
        return out
