"""ModelNew for `4_Matrix_vector_multiplication_`: C = A @ B with A (2048, 1048576) fp32 and B (1048576, 1).

Memory-bound GEMV (8.6 GB of A read once). Kernel 1 splits K into SPLIT_K slices; each program handles BLOCK_M
rows of one slice, streams A with wide coalesced loads, reuses each B chunk for all BLOCK_M rows, accumulates
elementwise in fp32 registers and writes one partial per row. Kernel 2 sums the SPLIT_K partials per row in a fixed
order (deterministic, no atomics) and writes C (M, 1).
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _gemv_splitk_kernel(
    a_ptr,
    b_ptr,
    part_ptr,
    M,
    K,
    k_per_split,
    stride_am,
    stride_ak,
    stride_bk,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_s = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    rmask = rows < M
    k_start = pid_s * k_per_split

    a_rows = a_ptr + rows[:, None].to(tl.int64) * stride_am
    acc = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    for k0 in range(k_start, k_start + k_per_split, BLOCK_K):
        ks = k0 + offs_k
        a_ptrs = a_rows + ks[None, :] * stride_ak
        b_ptrs = b_ptr + ks * stride_bk
        if EVEN:
            a = tl.load(a_ptrs, eviction_policy="evict_first")
            b = tl.load(b_ptrs, eviction_policy="evict_last")
        else:
            kmask = ks < K
            a = tl.load(a_ptrs, mask=rmask[:, None] & kmask[None, :], other=0.0, eviction_policy="evict_first")
            b = tl.load(b_ptrs, mask=kmask, other=0.0, eviction_policy="evict_last")
        acc += a.to(tl.float32) * b.to(tl.float32)[None, :]

    partial = tl.sum(acc, axis=1)
    tl.store(part_ptr + pid_s * M + rows, partial, mask=rmask)


@triton.jit
def _reduce_partials_kernel(
    part_ptr,
    out_ptr,
    M,
    stride_om,
    SPLIT_K: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M
    offs_s = tl.arange(0, SPLIT_K)
    p = tl.load(part_ptr + offs_s[:, None] * M + offs[None, :], mask=mask[None, :], other=0.0)
    total = tl.sum(p, axis=0)
    tl.store(out_ptr + offs * stride_om, total.to(out_ptr.dtype.element_ty), mask=mask)


_BLOCK_M = 8
_BLOCK_K = 1024
_SPLIT_K = 16
_NUM_WARPS = 8
_RED_BLOCK = 256


class ModelNew(nn.Module):
    """Matrix-vector product A @ B via a split-K Triton GEMV and a deterministic partial-sum reduction."""

    def __init__(self):
        super(ModelNew, self).__init__()
        self._meta = {}

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        key = (A.shape, A.stride(), B.shape, B.stride(), A.dtype, B.dtype)
        meta = self._meta.get(key)
        if meta is None:
            if A.dim() != 2 or B.dim() != 2 or B.shape[1] != 1 or A.shape[1] != B.shape[0]:
                raise ValueError(f"expected A (M, K) and B (K, 1), got {tuple(A.shape)} and {tuple(B.shape)}")
            if A.dtype != torch.float32 or B.dtype != torch.float32:
                raise ValueError("this kernel handles float32 inputs")
            M, K = A.shape
            k_per_split = triton.cdiv(triton.cdiv(K, _SPLIT_K), _BLOCK_K) * _BLOCK_K
            even = (M % _BLOCK_M == 0) and (K == k_per_split * _SPLIT_K)
            grid1 = (triton.cdiv(M, _BLOCK_M), _SPLIT_K)
            grid2 = (triton.cdiv(M, _RED_BLOCK),)
            meta = (M, K, k_per_split, even, grid1, grid2)
            self._meta[key] = meta
        M, K, k_per_split, even, grid1, grid2 = meta

        out = torch.empty((M, 1), dtype=A.dtype, device=A.device)
        if M == 0:
            return out
        part = torch.empty((_SPLIT_K, M), dtype=torch.float32, device=A.device)

        _gemv_splitk_kernel[grid1](
            A,
            B,
            part,
            M,
            K,
            k_per_split,
            A.stride(0),
            A.stride(1),
            B.stride(0),
            BLOCK_M=_BLOCK_M,
            BLOCK_K=_BLOCK_K,
            EVEN=even,
            num_warps=_NUM_WARPS,
        )
        _reduce_partials_kernel[grid2](
            part,
            out,
            M,
            out.stride(0),
            SPLIT_K=_SPLIT_K,
            BLOCK=_RED_BLOCK,
            num_warps=4,
        )
        return out
