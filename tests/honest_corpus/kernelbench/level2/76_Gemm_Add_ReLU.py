"""ModelNew for `76_Gemm_Add_ReLU`: y = relu(x @ W^T + bias)   (the Linear has no bias; `bias` is a parameter).

One fused Triton kernel:
* tiled GEMM (128 x 128 x 32) in true fp32 (tl.dot with input_precision="ieee"), with a grouped tile order so
  the row-tiles that share a weight column-block run together (weight read from HBM about once, activation
  resident in L2);
* epilogue in registers: + bias, ReLU, one store of the fp32 result.
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _gemm_bias_relu_kernel(
    a_ptr,
    w_ptr,
    b_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_wn,
    stride_wk,
    stride_b,
    stride_om,
    stride_on,
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

    bias = tl.load(b_ptr + rn * stride_b).to(tl.float32)
    y = tl.maximum(acc + bias[None, :], 0.0)

    out_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(out_ptrs, y.to(out_ptr.dtype.element_ty), mask=mask)


class ModelNew(nn.Module):
    """
    Matrix multiplication, bias add and ReLU, fused into one Triton kernel.
    """

    BLOCK_M = 128
    BLOCK_N = 128
    BLOCK_K = 32
    GROUP_M = 8

    def __init__(self, in_features, out_features, bias_shape):
        super(ModelNew, self).__init__()
        self.gemm = nn.Linear(in_features, out_features, bias=False)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        w = self.gemm.weight
        if x.dim() != 2:
            raise ValueError("expected a 2-D (batch, in_features) input")
        if x.dtype != torch.float32 or w.dtype != torch.float32:
            raise TypeError("this kernel serves float32 inputs and weights")
        M, K = x.shape
        N = w.shape[0]
        if self.bias.dim() != 1 or self.bias.shape[0] != N:
            raise ValueError("bias must have shape (out_features,)")
        out = torch.empty((M, N), dtype=x.dtype, device=x.device)
        if M == 0 or N == 0:
            return out
        grid = (triton.cdiv(M, self.BLOCK_M) * triton.cdiv(N, self.BLOCK_N),)
        _gemm_bias_relu_kernel[grid](
            x,
            w,
            self.bias,
            out,
            M,
            N,
            K,
            x.stride(0),
            x.stride(1),
            w.stride(0),
            w.stride(1),
            self.bias.stride(0),
            out.stride(0),
            out.stride(1),
            BLOCK_M=self.BLOCK_M,
            BLOCK_N=self.BLOCK_N,
            BLOCK_K=self.BLOCK_K,
            GROUP_M=self.GROUP_M,
            EVEN_K=K % self.BLOCK_K == 0,
            num_warps=8,
            num_stages=3,
        )
        return out
