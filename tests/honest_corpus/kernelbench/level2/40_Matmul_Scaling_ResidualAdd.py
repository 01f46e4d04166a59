"""ModelNew for `40_Matmul_Scaling_ResidualAdd`.

Reference: y = x @ W^T + b;  out = y * scaling_factor + y   (original_x is a detached copy of y).
One Triton kernel: a tiled IEEE-fp32 GEMM (no TF32) with the bias, scaling and residual add fused into the
epilogue, evaluated in the same order as the reference (y*s + y) so the rounding matches.
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _linear_scale_residual_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_xk,
    stride_wn,
    stride_wk,
    stride_om,
    stride_on,
    scaling,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    EVEN_M: tl.constexpr,
    EVEN_N: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    # Grouped tile ordering for L2 reuse of W panels.
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    if EVEN_M:
        offs_am = offs_m
    else:
        offs_am = offs_m % M
    if EVEN_N:
        offs_bn = offs_n
    else:
        offs_bn = offs_n % N

    # A = x (M, K); B = W^T, element [k, n] = W[n, k].
    a_ptrs = x_ptr + offs_am[:, None] * stride_xm + offs_k[None, :] * stride_xk
    b_ptrs = w_ptr + offs_k[:, None] * stride_wk + offs_bn[None, :] * stride_wn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_rem = K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_rem, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_rem, other=0.0)
        acc = tl.dot(a, b, acc, input_precision="ieee")
        a_ptrs += BLOCK_K * stride_xk
        b_ptrs += BLOCK_K * stride_wk

    bias = tl.load(bias_ptr + offs_bn).to(tl.float32)
    y = acc + bias[None, :]
    y = y * scaling + y  # x * scaling_factor + original_x

    out_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
    y = y.to(out_ptr.dtype.element_ty)
    if EVEN_M and EVEN_N:
        tl.store(out_ptrs, y)
    else:
        tl.store(out_ptrs, y, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


_BLOCK_M = 128
_BLOCK_N = 128
_BLOCK_K = 32
_GROUP_M = 8
_NUM_WARPS = 8
_NUM_STAGES = 3


class ModelNew(nn.Module):
    """Linear -> scale -> residual add, as one fused Triton GEMM."""

    def __init__(self, in_features, out_features, scaling_factor):
        super(ModelNew, self).__init__()
        self.matmul = nn.Linear(in_features, out_features)
        self.scaling_factor = scaling_factor
        self._meta = {}

    def forward(self, x):
        w = self.matmul.weight
        b = self.matmul.bias
        key = (x.shape, x.dtype)
        meta = self._meta.get(key)
        if meta is None:
            if x.dim() != 2 or x.shape[1] != w.shape[1]:
                raise ValueError(f"expected x of shape (M, {w.shape[1]}), got {tuple(x.shape)}")
            if x.dtype != torch.float32 or w.dtype != torch.float32:
                raise ValueError("this kernel handles float32 inputs")
            M, K = x.shape
            N = w.shape[0]
            if K == 0:
                raise ValueError("K == 0 is not supported by this kernel")
            grid = (triton.cdiv(M, _BLOCK_M) * triton.cdiv(N, _BLOCK_N),)
            meta = (M, N, K, grid, M % _BLOCK_M == 0, N % _BLOCK_N == 0, K % _BLOCK_K == 0)
            self._meta[key] = meta
        M, N, K, grid, even_m, even_n, even_k = meta

        out = torch.empty((M, N), dtype=x.dtype, device=x.device)
        if M == 0 or N == 0:
            return out
        _linear_scale_residual_kernel[grid](
            x,
            w,
            b,
            out,
            M,
            N,
            K,
            x.stride(0),
            x.stride(1),
            w.stride(0),
            w.stride(1),
            out.stride(0),
            out.stride(1),
            float(self.scaling_factor),
            BLOCK_M=_BLOCK_M,
            BLOCK_N=_BLOCK_N,
            BLOCK_K=_BLOCK_K,
            GROUP_M=_GROUP_M,
            EVEN_M=even_m,
            EVEN_N=even_n,
            EVEN_K=even_k,
            num_warps=_NUM_WARPS,
            num_stages=_NUM_STAGES,
        )
        return out
