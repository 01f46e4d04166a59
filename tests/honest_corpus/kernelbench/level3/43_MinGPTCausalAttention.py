"""ModelNew for 43_MinGPTCausalAttention with Triton kernels.

  qkv = x @ W_attn^T + b_attn                      (_linear_kernel, fp32 IEEE dot, fused bias)
  y   = causal_softmax(q k^T / sqrt(hs)) v         (_causal_attention_kernel: flash-style online softmax,
                                                    reads q/k/v per head from qkv via strides, writes y as
                                                    [B, T, C] = the reference's transpose(1, 2).view(B, T, C))
  out = y @ W_proj^T + b_proj                      (_linear_kernel)
Dropout probabilities are 0.0 (identity). The registered `bias` buffer is the lower-triangular causal mask by
construction, so the kernel applies the mask structurally (key index <= query index).
"""

import math

import torch
import torch.nn as nn
import triton
import triton.language as tl

_LOG2E = 1.4426950408889634


@triton.jit
def _linear_kernel(
    a_ptr, w_ptr, bias_ptr, c_ptr,
    M, N, K,
    stride_am, stride_ak, stride_wn, stride_wk, stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, EVEN_K: tl.constexpr,
):
    # C[M, N] = A[M, K] @ W[N, K]^T + bias[N]
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
    # wrap out-of-range rows/cols onto valid memory so the K loop needs no M/N masks (results discarded)
    offs_am = offs_m % M
    offs_bn = offs_n % N
    a_ptrs = a_ptr + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak
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
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_wk

    n_mask = offs_n < N
    bias = tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0)
    c = acc + bias[None, :]
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, c, mask=(offs_m < M)[:, None] & n_mask[None, :])


@triton.jit
def _causal_attention_kernel(
    qkv_ptr, y_ptr,
    T, n_head, C,
    stride_qkv_b, stride_qkv_t, stride_y_b, stride_y_t,
    qk_scale,
    HS: tl.constexpr, DA: tl.constexpr, DB: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    # Heaviest query blocks (most keys under the causal mask) are scheduled first.
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // n_head
    h = pid_bh - b * n_head
    base = qkv_ptr + b.to(tl.int64) * stride_qkv_b
    q_col = h * HS
    k_col = C + h * HS
    v_col = 2 * C + h * HS

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = offs_m < T
    offs_n0 = tl.arange(0, BLOCK_N)
    # head dim split into a DA-wide and a DB-wide piece (96 = 64 + 32): no padded dot work
    offs_da = tl.arange(0, DA)
    offs_db = DA + tl.arange(0, DB)
    db_mask = offs_db < HS

    q_rows = base + offs_m[:, None] * stride_qkv_t
    q_a = tl.load(q_rows + (q_col + offs_da)[None, :], mask=m_mask[:, None], other=0.0)
    q_b = tl.load(q_rows + (q_col + offs_db)[None, :], mask=m_mask[:, None] & db_mask[None, :], other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc_a = tl.zeros([BLOCK_M, DA], dtype=tl.float32)
    acc_b = tl.zeros([BLOCK_M, DB], dtype=tl.float32)

    hi = tl.minimum((pid_m + 1) * BLOCK_M, T)
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        n_mask = offs_n < T
        k_rows = base + offs_n[None, :] * stride_qkv_t
        kt_a = tl.load(k_rows + (k_col + offs_da)[:, None], mask=n_mask[None, :], other=0.0)
        kt_b = tl.load(k_rows + (k_col + offs_db)[:, None], mask=n_mask[None, :] & db_mask[:, None], other=0.0)
        s = tl.dot(q_a, kt_a, input_precision="ieee")
        s = tl.dot(q_b, kt_b, acc=s, input_precision="ieee")
        s = s * qk_scale  # = (q.k / sqrt(hs)) * log2(e)
        keep = (offs_m[:, None] >= offs_n[None, :]) & n_mask[None, :]
        s = tl.where(keep, s, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, axis=1))  # finite: key 0 is visible to every query
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)

        v_rows = base + offs_n[:, None] * stride_qkv_t
        v_a = tl.load(v_rows + (v_col + offs_da)[None, :], mask=n_mask[:, None], other=0.0)
        v_b = tl.load(v_rows + (v_col + offs_db)[None, :], mask=n_mask[:, None] & db_mask[None, :], other=0.0)
        acc_a = tl.dot(p, v_a, acc=acc_a * alpha[:, None], input_precision="ieee")
        acc_b = tl.dot(p, v_b, acc=acc_b * alpha[:, None], input_precision="ieee")
        m_i = m_new

    acc_a = acc_a / l_i[:, None]
    acc_b = acc_b / l_i[:, None]
    y_rows = y_ptr + b.to(tl.int64) * stride_y_b + offs_m[:, None] * stride_y_t
    tl.store(y_rows + (q_col + offs_da)[None, :], acc_a, mask=m_mask[:, None])
    tl.store(y_rows + (q_col + offs_db)[None, :], acc_b, mask=m_mask[:, None] & db_mask[None, :])


def _linear(a, M, K, stride_am, stride_ak, weight, bias, out, stride_cm, stride_cn):
    """out[M, N] = a[M, K] @ weight^T + bias, `a` addressed through (stride_am, stride_ak)."""
    N = weight.shape[0]
    BM, BN, BK = 128, 128, 32
    grid = (triton.cdiv(M, BM) * triton.cdiv(N, BN),)
    _linear_kernel[grid](
        a, weight, bias, out, M, N, K,
        stride_am, stride_ak, weight.stride(0), weight.stride(1), stride_cm, stride_cn,
        BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, GROUP_M=8, EVEN_K=(K % BK == 0),
        num_warps=8, num_stages=3,
    )


class ModelNew(nn.Module):
    def __init__(self, n_embd, n_head, attn_pdrop, resid_pdrop, max_seqlen):
        super().__init__()
        assert n_embd % n_head == 0
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.attn_dropout = nn.Dropout(attn_pdrop)
        self.resid_dropout = nn.Dropout(resid_pdrop)
        self.register_buffer("bias", torch.tril(torch.ones(max_seqlen, max_seqlen))
                                     .view(1, 1, max_seqlen, max_seqlen))
        self.n_head = n_head
        self.n_embd = n_embd

    def forward(self, x):
        if x.dim() != 3 or x.dtype != torch.float32:
            raise ValueError("expected a (B, T, C) float32 input")
        if self.training and (self.attn_dropout.p > 0.0 or self.resid_dropout.p > 0.0):
            raise NotImplementedError("dropout with p > 0 in training mode is not implemented")
        B, T, C = x.shape
        nh = self.n_head
        hs = C // nh
        if T > self.bias.shape[-1]:
            raise ValueError("sequence length exceeds max_seqlen")
        if hs < 32:
            raise NotImplementedError("head size < 32 is not supported by this kernel")
        if B > 1 and T > 1 and x.stride(0) != T * x.stride(1):
            raise ValueError(f"unsupported input layout stride={x.stride()}")
        dev = x.device
        M = B * T
        row_stride = x.stride(1) if T > 1 else x.stride(0)

        # 1) fused QKV projection; (B, T) flatten to M rows without a copy
        qkv = torch.empty((B, T, 3 * C), device=dev, dtype=torch.float32)
        _linear(x, M, C, row_stride, x.stride(2), self.c_attn.weight, self.c_attn.bias, qkv, 3 * C, 1)

        # 2) causal flash attention, output already in (B, T, C) layout
        y = torch.empty((B, T, C), device=dev, dtype=torch.float32)
        da = 1 << (hs.bit_length() - 1)  # largest power of two <= hs
        if da == hs:
            da = hs // 2                  # power-of-two head: two equal halves
        db = max(16, triton.next_power_of_2(hs - da))
        BLOCK = 64
        grid = (triton.cdiv(T, BLOCK), B * nh)
        _causal_attention_kernel[grid](
            qkv, y, T, nh, C,
            qkv.stride(0), qkv.stride(1), y.stride(0), y.stride(1),
            (1.0 / math.sqrt(hs)) * _LOG2E,
            HS=hs, DA=da, DB=db, BLOCK_M=BLOCK, BLOCK_N=BLOCK,
            num_warps=4, num_stages=2,
        )

        # 3) output projection
        out = torch.empty((B, T, C), device=dev, dtype=torch.float32)
        _linear(y, M, C, C, 1, self.c_proj.weight, self.c_proj.bias, out, C, 1)
        return out
