"""ModelNew for 33_Gemm_Scale_BatchNorm with Triton kernels.

forward(x) = BatchNorm1d((x @ W^T + b) * scale)

Training mode (batch statistics, as the reference module, which is in training mode by default):
  1. _gemm_scale_bn_kernel: z = (x @ W^T + b) * scale (fp32 IEEE dot), stored once; the epilogue also
     writes per-(row-block, column) mean and M2 of its BLOCK_M rows.
  2. _bn_apply_kernel: Chan-merges the row-block partials into the batch mean / biased variance,
     normalises z in place, and (first row of programs) updates running_mean / running_var / num_batches_tracked.
Eval mode: the running statistics are applied directly in the GEMM epilogue (single kernel).
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl

_BM, _BN, _BK, _GROUP_M = 128, 128, 32, 8
_APPLY_BM, _APPLY_BN = 64, 128


@triton.jit
def _gemm_scale_bn_kernel(
    x_ptr, w_ptr, bias_ptr, scale_ptr, z_ptr, part_ptr,
    rmean_ptr, rvar_ptr, gamma_ptr, beta_ptr,
    M, N, K, eps,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_zm,
    TRAINING: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, EVEN_K: tl.constexpr,
):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    n_mask = offs_n < N
    # wrap out-of-range rows/cols onto valid memory so the K loop needs no M/N masks (results discarded)
    offs_am = offs_m % M
    offs_bn = offs_n % N
    a_ptrs = x_ptr + offs_am[:, None] * stride_xm + offs_k[None, :] * stride_xk
    b_ptrs = w_ptr + offs_bn[None, :] * stride_wn + offs_k[:, None] * stride_wk  # [BK, BN] tile of W^T

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_rem = K - kb * BLOCK_K
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_rem, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_rem, other=0.0)
        acc = tl.dot(a, b, acc=acc, input_precision="ieee")
        a_ptrs += BLOCK_K * stride_xk
        b_ptrs += BLOCK_K * stride_wk

    bias = tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0)
    scale = tl.load(scale_ptr + offs_n, mask=n_mask, other=0.0)
    z = (acc + bias[None, :]) * scale[None, :]
    mask2 = m_mask[:, None] & n_mask[None, :]
    z_ptrs = z_ptr + offs_m[:, None] * stride_zm + offs_n[None, :]

    if TRAINING:
        tl.store(z_ptrs, z, mask=mask2)
        # per-column statistics of this block's valid rows: local mean and M2 = sum((z - mean)^2)
        cnt = tl.minimum(M - pid_m * BLOCK_M, BLOCK_M).to(tl.float32)
        mean = tl.sum(tl.where(mask2, z, 0.0), axis=0) / cnt
        d = tl.where(mask2, z - mean[None, :], 0.0)
        m2 = tl.sum(d * d, axis=0)
        tl.store(part_ptr + pid_m * N + offs_n, mean, mask=n_mask)
        tl.store(part_ptr + (num_pid_m + pid_m) * N + offs_n, m2, mask=n_mask)
    else:
        rm = tl.load(rmean_ptr + offs_n, mask=n_mask, other=0.0)
        rv = tl.load(rvar_ptr + offs_n, mask=n_mask, other=1.0)
        g = tl.load(gamma_ptr + offs_n, mask=n_mask, other=0.0)
        bt = tl.load(beta_ptr + offs_n, mask=n_mask, other=0.0)
        invstd = 1.0 / tl.sqrt(rv + eps)
        y = (z - rm[None, :]) * (invstd * g)[None, :] + bt[None, :]
        tl.store(z_ptrs, y, mask=mask2)


@triton.jit
def _bn_apply_kernel(
    z_ptr, part_ptr, gamma_ptr, beta_ptr, rmean_ptr, rvar_ptr, nbt_ptr,
    M, N, stride_zm, num_mb,
    inv_m, unbias, eps, momentum,
    GEMM_BM: tl.constexpr, MB_PAD: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, UPDATE_RUNNING: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_n = pid_n * BN + tl.arange(0, BN)
    n_mask = offs_n < N

    # Chan's parallel merge of the per-row-block (mean, M2) partials -> batch mean / biased variance
    mb = tl.arange(0, MB_PAD)
    mb_mask = mb < num_mb
    cnt = tl.where(mb_mask, tl.minimum(M - mb * GEMM_BM, GEMM_BM), 0).to(tl.float32)
    pmask = mb_mask[:, None] & n_mask[None, :]
    p_mean = tl.load(part_ptr + mb[:, None] * N + offs_n[None, :], mask=pmask, other=0.0)
    p_m2 = tl.load(part_ptr + (num_mb + mb)[:, None] * N + offs_n[None, :], mask=pmask, other=0.0)
    mean = tl.sum(cnt[:, None] * p_mean, axis=0) * inv_m
    dm = p_mean - mean[None, :]
    m2 = tl.sum(p_m2 + cnt[:, None] * dm * dm, axis=0)
    var = m2 * inv_m
    invstd = 1.0 / tl.sqrt(var + eps)
    g = tl.load(gamma_ptr + offs_n, mask=n_mask, other=0.0)
    bt = tl.load(beta_ptr + offs_n, mask=n_mask, other=0.0)
    a = invstd * g

    offs_m = pid_m * BM + tl.arange(0, BM)
    mask2 = (offs_m < M)[:, None] & n_mask[None, :]
    ptrs = z_ptr + offs_m[:, None] * stride_zm + offs_n[None, :]
    z = tl.load(ptrs, mask=mask2, other=0.0)
    y = (z - mean[None, :]) * a[None, :] + bt[None, :]
    tl.store(ptrs, y, mask=mask2)

    if UPDATE_RUNNING:
        if pid_m == 0:
            rm = tl.load(rmean_ptr + offs_n, mask=n_mask, other=0.0)
            rv = tl.load(rvar_ptr + offs_n, mask=n_mask, other=0.0)
            tl.store(rmean_ptr + offs_n, (1.0 - momentum) * rm + momentum * mean, mask=n_mask)
            tl.store(rvar_ptr + offs_n, (1.0 - momentum) * rv + momentum * (var * unbias), mask=n_mask)
            if pid_n == 0:
                nbt = tl.load(nbt_ptr)
                tl.store(nbt_ptr, nbt + 1)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, scale_shape, eps=1e-5, momentum=0.1):
        super(ModelNew, self).__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.scale = nn.Parameter(torch.randn(scale_shape))
        self.bn = nn.BatchNorm1d(out_features, eps=eps, momentum=momentum)

    def forward(self, x):
        if x.dim() != 2 or x.dtype != torch.float32:
            raise ValueError("expected a 2-D float32 input")
        M, K = x.shape
        N = self.gemm.out_features
        bn = self.bn
        w = self.gemm.weight
        out = torch.empty((M, N), device=x.device, dtype=torch.float32)
        if M == 0:
            return out

        use_batch_stats = bn.training or bn.running_mean is None
        update_running = bn.training and bn.running_mean is not None
        if use_batch_stats and M <= 1:
            raise ValueError(f"Expected more than 1 value per channel when training, got input size {tuple(x.shape)}")
        if update_running and bn.momentum is None:
            raise NotImplementedError("cumulative moving average (momentum=None) is not implemented")

        num_mb = triton.cdiv(M, _BM)
        grid = (num_mb * triton.cdiv(N, _BN),)
        rmean = bn.running_mean if bn.running_mean is not None else out
        rvar = bn.running_var if bn.running_var is not None else out
        part = torch.empty((2 * num_mb, N), device=x.device, dtype=torch.float32) if use_batch_stats else out

        _gemm_scale_bn_kernel[grid](
            x, w, self.gemm.bias, self.scale, out, part,
            rmean, rvar, bn.weight, bn.bias,
            M, N, K, bn.eps,
            x.stride(0), x.stride(1), w.stride(0), w.stride(1), out.stride(0),
            TRAINING=use_batch_stats,
            BLOCK_M=_BM, BLOCK_N=_BN, BLOCK_K=_BK, GROUP_M=_GROUP_M, EVEN_K=(K % _BK == 0),
            num_warps=8, num_stages=3,
        )

        if use_batch_stats:
            nbt = bn.num_batches_tracked if update_running else out
            momentum = float(bn.momentum) if update_running else 0.0
            apply_grid = (triton.cdiv(M, _APPLY_BM), triton.cdiv(N, _APPLY_BN))
            _bn_apply_kernel[apply_grid](
                out, part, bn.weight, bn.bias, rmean, rvar, nbt,
                M, N, out.stride(0), num_mb,
                1.0 / M, M / (M - 1), bn.eps, momentum,
                GEMM_BM=_BM, MB_PAD=triton.next_power_of_2(num_mb),
                BM=_APPLY_BM, BN=_APPLY_BN, UPDATE_RUNNING=update_running,
                num_warps=4,
            )
        return out
