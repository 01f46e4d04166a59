"""ModelNew for KernelBench 44_MiniGPTBlock (minGPT transformer block) with Triton kernels.

forward(x):  x1 = x + c_proj(attn(ln_1(x)))           -> LN kernel, GEMM(c_attn), flash attention, GEMM(+residual)
             out = x1 + mlp_proj(gelu(c_fc(ln_2(x1))))  -> LN kernel, GEMM(+bias+NewGELU), GEMM(+residual)
All arithmetic is fp32; every tl.dot uses input_precision="ieee" (no TF32).
"""

import math

import torch
import torch.nn as nn
import triton
import triton.language as tl


# ----------------------------------------------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------------------------------------------

@triton.jit
def _layernorm_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, n_rows, n_cols, stride_x, stride_y, eps,
    ROWS: tl.constexpr, BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = pid * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    rmask = rows < n_rows
    cmask = cols < n_cols
    mask = rmask[:, None] & cmask[None, :]
    rows64 = rows.to(tl.int64)
    x = tl.load(x_ptr + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, 1) / n_cols
    xc = tl.where(mask, x - mean[:, None], 0.0)
    var = tl.sum(xc * xc, 1) / n_cols
    rstd = tl.rsqrt(var + eps)
    w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    y = xc * rstd[:, None] * w[None, :] + b[None, :]
    tl.store(y_ptr + rows64[:, None] * stride_y + cols[None, :], y, mask=mask)


@triton.jit
def _linear_kernel(
    a_ptr, w_ptr, bias_ptr, res_ptr, c_ptr,
    M, N, K,
    stride_am, stride_wn, stride_rm, stride_cm,
    EPILOGUE: tl.constexpr,  # 0: + bias, 1: + bias then NewGELU, 2: + bias then + residual
    EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    # C[M, N] = A[M, K] @ W[N, K]^T (+ epilogue); grouped program order for L2 reuse of A and W tiles.
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
    rm = (offs_m % M).to(tl.int64)  # wrapped rows/cols: loads need no M/N masks, stores are masked
    rn = offs_n % N
    a_ptrs = a_ptr + rm[:, None] * stride_am + offs_k[None, :]
    w_ptrs = w_ptr + rn[None, :] * stride_wn + offs_k[:, None]  # [BK, BN] view of W^T

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs)
            w = tl.load(w_ptrs)
        else:
            kmask = offs_k < K - k
            a = tl.load(a_ptrs, mask=kmask[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=kmask[:, None], other=0.0)
        acc = tl.dot(a, w, acc, input_precision="ieee")
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K

    n_mask = offs_n < N
    bias = tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0)
    acc = acc + bias[None, :]
    if EPILOGUE == 1:
        # NewGELU: 0.5*x*(1 + tanh(u)) == x * sigmoid(2u) == x / (1 + exp(-2u)),  u = sqrt(2/pi)*(x + 0.044715 x^3)
        inner = 0.7978845608028654 * (acc + 0.044715 * (acc * acc * acc))
        acc = acc / (1.0 + tl.exp(-2.0 * inner))
    offs_m64 = offs_m.to(tl.int64)
    c_mask = (offs_m[:, None] < M) & n_mask[None, :]
    if EPILOGUE == 2:
        res = tl.load(res_ptr + offs_m64[:, None] * stride_rm + offs_n[None, :], mask=c_mask, other=0.0)
        acc = acc + res
    tl.store(c_ptr + offs_m64[:, None] * stride_cm + offs_n[None, :], acc, mask=c_mask)


@triton.jit
def _causal_attention_kernel(
    qkv_ptr, y_ptr, T, H, C, stride_qkv, stride_y, qk_scale,
    HS: tl.constexpr, D0: tl.constexpr, D1: tl.constexpr, PAD1: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    # q/k/v of head h live in qkv[b*T + t, {0, C, 2C} + h*HS + d]; the head dimension is split in two
    # power-of-two parts [0, D0) and [D0, D0 + D1) (the second masked to HS when PAD1).
    num_m = tl.cdiv(T, BLOCK_M)
    pid_m = num_m - 1 - tl.program_id(0)  # longest (most keys) query blocks first
    bh = tl.program_id(1)
    b = bh // H
    h = bh - b * H

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d0 = tl.arange(0, D0)
    offs_d1 = D0 + tl.arange(0, D1)
    m_mask = offs_m < T
    d1_mask = offs_d1 < HS

    q_base = qkv_ptr + b.to(tl.int64) * T * stride_qkv + h * HS
    k_base = q_base + C
    v_base = q_base + 2 * C

    q_rows = q_base + offs_m[:, None] * stride_qkv
    q0 = tl.load(q_rows + offs_d0[None, :], mask=m_mask[:, None], other=0.0)
    if PAD1:
        q1 = tl.load(q_rows + offs_d1[None, :], mask=m_mask[:, None] & d1_mask[None, :], other=0.0)
    else:
        q1 = tl.load(q_rows + offs_d1[None, :], mask=m_mask[:, None], other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc0 = tl.zeros([BLOCK_M, D0], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_M, D1], dtype=tl.float32)

    hi = tl.minimum((pid_m + 1) * BLOCK_M, T)
    for start_n in range(0, hi, BLOCK_N):
        n_idx = start_n + offs_n
        n_mask = n_idx < T

        k_cols = k_base + n_idx[None, :] * stride_qkv
        kt0 = tl.load(k_cols + offs_d0[:, None], mask=n_mask[None, :], other=0.0)        # [D0, BN]
        if PAD1:
            kt1 = tl.load(k_cols + offs_d1[:, None], mask=n_mask[None, :] & d1_mask[:, None], other=0.0)
        else:
            kt1 = tl.load(k_cols + offs_d1[:, None], mask=n_mask[None, :], other=0.0)    # [D1, BN]

        s = tl.dot(q0, kt0, input_precision="ieee")
        s = tl.dot(q1, kt1, s, input_precision="ieee")
        s = s * qk_scale  # (q.k / sqrt(HS)) * log2(e)
        keep = (offs_m[:, None] >= n_idx[None, :]) & n_mask[None, :]
        s = tl.where(keep, s, float("-inf"))

        # Every query row sees key 0 in the first block, so m_new is finite from the first iteration on.
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)

        v_rows = v_base + n_idx[:, None] * stride_qkv
        v0 = tl.load(v_rows + offs_d0[None, :], mask=n_mask[:, None], other=0.0)        # [BN, D0]
        if PAD1:
            v1 = tl.load(v_rows + offs_d1[None, :], mask=n_mask[:, None] & d1_mask[None, :], other=0.0)
        else:
            v1 = tl.load(v_rows + offs_d1[None, :], mask=n_mask[:, None], other=0.0)    # [BN, D1]
        acc0 = tl.dot(p, v0, acc0 * alpha[:, None], input_precision="ieee")
        acc1 = tl.dot(p, v1, acc1 * alpha[:, None], input_precision="ieee")
        m_i = m_new

    out0 = acc0 / l_i[:, None]
    out1 = acc1 / l_i[:, None]
    y_rows = y_ptr + (b.to(tl.int64) * T + offs_m)[:, None] * stride_y + h * HS
    tl.store(y_rows + offs_d0[None, :], out0, mask=m_mask[:, None])
    if PAD1:
        tl.store(y_rows + offs_d1[None, :], out1, mask=m_mask[:, None] & d1_mask[None, :])
    else:
        tl.store(y_rows + offs_d1[None, :], out1, mask=m_mask[:, None])


# ----------------------------------------------------------------------------------------------------------------
# Host-side launchers
# ----------------------------------------------------------------------------------------------------------------

_LIN_BM, _LIN_BN, _LIN_BK, _LIN_GROUP_M = 128, 128, 16, 8
_ATT_BM, _ATT_BN = 64, 64


def _layernorm(x2d, ln, out):
    M, Cn = x2d.shape
    block = triton.next_power_of_2(Cn)
    rows = max(1, min(8, 4096 // block))
    _layernorm_kernel[(triton.cdiv(M, rows),)](
        x2d, ln.weight, ln.bias, out, M, Cn, x2d.stride(0), out.stride(0), ln.eps,
        ROWS=rows, BLOCK=block, num_warps=4,
    )


def _linear(a, lin, out, epilogue, residual=None):
    M, K = a.shape
    w = lin.weight
    N = w.shape[0]
    if w.stride(1) != 1 or a.stride(1) != 1 or out.stride(1) != 1:
        raise ValueError("linear kernel: expected unit inner strides")
    res = residual if residual is not None else out
    grid = (triton.cdiv(M, _LIN_BM) * triton.cdiv(N, _LIN_BN),)
    _linear_kernel[grid](
        a, w, lin.bias, res, out, M, N, K,
        a.stride(0), w.stride(0), res.stride(0), out.stride(0),
        EPILOGUE=epilogue, EVEN_K=(K % _LIN_BK == 0),
        BLOCK_M=_LIN_BM, BLOCK_N=_LIN_BN, BLOCK_K=_LIN_BK, GROUP_M=_LIN_GROUP_M,
        num_warps=8, num_stages=3,
    )


def _head_split(hs):
    if hs < 32:
        raise NotImplementedError("attention kernel: head size < 32 is not supported")
    d0 = 1 << (hs.bit_length() - 1)
    if d0 == hs:
        d0 = hs // 2
    rest = hs - d0
    d1 = max(16, triton.next_power_of_2(rest))
    return d0, d1, d1 != rest


def _attention(qkv, y, B, T, n_head, C):
    hs = C // n_head
    d0, d1, pad1 = _head_split(hs)
    qk_scale = (1.0 / math.sqrt(hs)) * 1.4426950408889634
    grid = (triton.cdiv(T, _ATT_BM), B * n_head)
    _causal_attention_kernel[grid](
        qkv, y, T, n_head, C, qkv.stride(0), y.stride(0), qk_scale,
        HS=hs, D0=d0, D1=d1, PAD1=pad1, BLOCK_M=_ATT_BM, BLOCK_N=_ATT_BN,
        num_warps=8, num_stages=2,
    )


# ----------------------------------------------------------------------------------------------------------------
# Modules (same structure / parameter creation order as the reference)
# ----------------------------------------------------------------------------------------------------------------

class NewGELU(nn.Module):
    """Parameter-free; its math is fused into the c_fc GEMM epilogue."""

    def __init__(self):
        super(NewGELU, self).__init__()


class CausalSelfAttention(nn.Module):
    """Parameter container mirroring the reference; the computation lives in ModelNew.forward."""

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


class ModelNew(nn.Module):
    """ an unassuming Transformer block, with Triton kernels """

    def __init__(self, n_embd, n_head, attn_pdrop, resid_pdrop, max_seqlen):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, attn_pdrop, resid_pdrop, max_seqlen)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.ModuleDict(dict(
            c_fc=nn.Linear(n_embd, 4 * n_embd),
            c_proj=nn.Linear(4 * n_embd, n_embd),
            act=NewGELU(),
            dropout=nn.Dropout(resid_pdrop),
        ))
        self.max_seqlen = max_seqlen

    def forward(self, x):
        attn = self.attn
        mlp = self.mlp
        if self.training and (attn.attn_dropout.p > 0 or attn.resid_dropout.p > 0 or mlp.dropout.p > 0):
            raise NotImplementedError("dropout with p > 0 in training mode is not supported")
        if x.dim() != 3 or x.dtype != torch.float32 or not x.is_contiguous():
            raise ValueError("expected a contiguous fp32 input of shape (B, T, C)")
        B, T, C = x.shape
        if C != attn.n_embd or T > self.max_seqlen:
            raise ValueError(f"unexpected input shape {tuple(x.shape)}")
        M = B * T
        dev = x.device
        f32 = torch.float32

        xf = x.view(M, C)
        h = torch.empty((M, C), dtype=f32, device=dev)
        qkv = torch.empty((M, 3 * C), dtype=f32, device=dev)
        y = torch.empty((M, C), dtype=f32, device=dev)
        x1 = torch.empty((M, C), dtype=f32, device=dev)
        g = torch.empty((M, mlp.c_fc.weight.shape[0]), dtype=f32, device=dev)
        out = torch.empty((B, T, C), dtype=f32, device=dev)

        # x1 = x + c_proj(attn(ln_1(x)))
        _layernorm(xf, self.ln_1, h)
        _linear(h, attn.c_attn, qkv, epilogue=0)
        _attention(qkv, y, B, T, attn.n_head, C)
        _linear(y, attn.c_proj, x1, epilogue=2, residual=xf)

        # out = x1 + mlp_c_proj(gelu(c_fc(ln_2(x1))))
        _layernorm(x1, self.ln_2, h)
        _linear(h, mlp.c_fc, g, epilogue=1)
        _linear(g, mlp.c_proj, out.view(M, C), epilogue=2, residual=x1)
        return out
