"""ModelNew for `1_Square_matrix_multiplication_`: C = A @ B (fp32, 4096 x 4096) with a Triton GEMM.

The dot products run in IEEE fp32 (`input_precision="ieee"`: no TF32), accumulating in fp32 registers. Tiles are
128x128x32 with a 3-stage pipeline and grouped (L2-friendly) tile ordering; masks are compiled out when the shape
divides the tiles evenly, which it does here.
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _matmul_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    EVEN_M: tl.constexpr,
    EVEN_N: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    # Grouped ordering: GROUP_M row-tiles share each column panel of B while it is hot in L2.
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
    # Out-of-range rows/cols are wrapped (reads stay in bounds) and masked on the store.
    if EVEN_M:
        offs_am = offs_m
    else:
        offs_am = offs_m % M
    if EVEN_N:
        offs_bn = offs_n
    else:
        offs_bn = offs_n % N

    a_ptrs = a_ptr + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn

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
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    c = acc.to(c_ptr.dtype.element_ty)
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    if EVEN_M and EVEN_N:
        tl.store(c_ptrs, c)
    else:
        tl.store(c_ptrs, c, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


_BLOCK_M = 128
_BLOCK_N = 128
_BLOCK_K = 32
_GROUP_M = 8
_NUM_WARPS = 8
_NUM_STAGES = 3


class ModelNew(nn.Module):
    """C = A @ B with a Triton fp32 (IEEE) GEMM."""

    def __init__(self):
        super(ModelNew, self).__init__()
        self._meta = {}

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        key = (A.shape, B.shape, A.dtype, B.dtype)
        meta = self._meta.get(key)
        if meta is None:
            if A.dim() != 2 or B.dim() != 2 or A.shape[1] != B.shape[0]:
                raise ValueError(f"matmul shape mismatch: {tuple(A.shape)} @ {tuple(B.shape)}")
            if A.dtype != torch.float32 or B.dtype != torch.float32:
                raise ValueError("this kernel handles float32 inputs")
            M, K = A.shape
            N = B.shape[1]
            grid = (triton.cdiv(M, _BLOCK_M) * triton.cdiv(N, _BLOCK_N),)
            meta = (M, N, K, grid, M % _BLOCK_M == 0, N % _BLOCK_N == 0, K % _BLOCK_K == 0)
            self._meta[key] = meta
        M, N, K, grid, even_m, even_n, even_k = meta

        C = torch.empty((M, N), dtype=A.dtype, device=A.device)
        if M == 0 or N == 0:
            return C
        if K == 0:
            raise ValueError("K == 0 is not supported by this kernel")
        _matmul_kernel[grid](
            A,
            B,
            C,
            M,
            N,
            K,
            A.stride(0),
            A.stride(1),
            B.stride(0),
            B.stride(1),
            C.stride(0),
            C.stride(1),
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
        return C
