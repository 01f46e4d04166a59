import math

import torch
import torch.nn as nn
import triton
import triton.language as tl


# ----------------------------------------------------------------------------
# Rotary embedding for K. It is computed once and the attention kernel reuses it.
# It reproduces the PyTorch bf16 rounding exactly:
#   a = bf16(k*cos), b = bf16(rot(k)*sin), out = bf16(a + b)
# ----------------------------------------------------------------------------
@triton.jit
def _rope_k_kernel(K, KO, COS, SIN,
                   n_rows, S,
                   stride_kr, stride_kor,
                   stride_cb, stride_cs, stride_cd,
                   stride_sb, stride_ss, stride_sd,
                   N_COLS: tl.constexpr, BLOCK_C: tl.constexpr,
                   HEAD_DIM: tl.constexpr, BLOCK_R: tl.constexpr):
    HALF: tl.constexpr = HEAD_DIM // 2
    pid = tl.program_id(0)
    rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_C)
    d = cols % HEAD_DIM
    rot_cols = cols - d + (d + HALF) % HEAD_DIM
    rmask = rows < n_rows
    cmask = cols < N_COLS
    m2 = rmask[:, None] & cmask[None, :]
    b = rows // S
    s = rows - b * S

    x = tl.load(K + rows[:, None] * stride_kr + cols[None, :], mask=m2, other=0.0)
    xr = tl.load(K + rows[:, None] * stride_kr + rot_cols[None, :], mask=m2, other=0.0)
    c = tl.load(COS + b[:, None] * stride_cb + s[:, None] * stride_cs + d[None, :] * stride_cd,
                mask=m2, other=0.0)
    sn = tl.load(SIN + b[:, None] * stride_sb + s[:, None] * stride_ss + d[None, :] * stride_sd,
                 mask=m2, other=0.0)

    dt = x.dtype
    sign = tl.where(d < HALF, -1.0, 1.0)
    a = (x.to(tl.float32) * c.to(tl.float32)).to(dt).to(tl.float32)
    r = ((xr.to(tl.float32) * sign[None, :]) * sn.to(tl.float32)).to(dt).to(tl.float32)
    y = (a + r).to(KO.dtype.element_ty)
    tl.store(KO + rows[:, None] * stride_kor + cols[None, :], y, mask=m2)


# ----------------------------------------------------------------------------
# Causal flash attention (GQA), with the rotary embedding of Q fused in.
# Q: [B*S, H*D], K/V: [B*S, KVH*D], O: [B*S, H*D] (row-major 2D buffers)
# ----------------------------------------------------------------------------
@triton.jit
def _attn_fwd_kernel(Q, K, V, O, COS, SIN,
                     S, qk_scale,
                     stride_qr, stride_kr, stride_vr, stride_or,
                     stride_cb, stride_cs, stride_cd,
                     stride_sb, stride_ss, stride_sd,
                     N_REP: tl.constexpr, HEAD_DIM: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    HALF: tl.constexpr = HEAD_DIM // 2
    h = tl.program_id(0)
    pid_m = tl.num_programs(1) - 1 - tl.program_id(1)   # heavy blocks first
    b = tl.program_id(2)
    kvh = h // N_REP

    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    rot_d = (offs_d + HALF) % HEAD_DIM
    sign = tl.where(offs_d < HALF, -1.0, 1.0)
    m_mask = offs_m < S
    row_base = b * S

    # ---- load Q and apply the rotary embedding (same bf16 rounding as PyTorch) ----
    q_rows = (row_base + offs_m)[:, None] * stride_qr + h * HEAD_DIM
    qx = tl.load(Q + q_rows + offs_d[None, :], mask=m_mask[:, None], other=0.0)
    qr = tl.load(Q + q_rows + rot_d[None, :], mask=m_mask[:, None], other=0.0)
    c = tl.load(COS + b * stride_cb + offs_m[:, None] * stride_cs + offs_d[None, :] * stride_cd,
                mask=m_mask[:, None], other=0.0)
    sn = tl.load(SIN + b * stride_sb + offs_m[:, None] * stride_ss + offs_d[None, :] * stride_sd,
                 mask=m_mask[:, None], other=0.0)
    dt = qx.dtype
    qa = (qx.to(tl.float32) * c.to(tl.float32)).to(dt).to(tl.float32)
    qb = ((qr.to(tl.float32) * sign[None, :]) * sn.to(tl.float32)).to(dt).to(tl.float32)
    q = (qa + qb).to(dt)

    k_base = K + row_base * stride_kr + kvh * HEAD_DIM
    v_base = V + row_base * stride_vr + kvh * HEAD_DIM

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)

    # ---- stage 1: fully visible key blocks (no mask) ----
    for start_n in range(0, start_m, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        kn = start_n + offs_n
        k = tl.load(k_base + kn[:, None] * stride_kr + offs_d[None, :])
        qk = tl.dot(q, tl.trans(k))
        m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        qk = qk * qk_scale - m_ij[:, None]
        p = tl.math.exp2(qk)
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = tl.load(v_base + kn[:, None] * stride_vr + offs_d[None, :])
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_ij

    # ---- stage 2: diagonal key blocks (causal mask) ----
    hi = tl.minimum(start_m + BLOCK_M, S)
    for start_n in range(start_m, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        kn = start_n + offs_n
        n_mask = kn < S
        k = tl.load(k_base + kn[:, None] * stride_kr + offs_d[None, :],
                    mask=n_mask[:, None], other=0.0)
        qk = tl.dot(q, tl.trans(k))
        causal = (offs_m[:, None] >= kn[None, :]) & n_mask[None, :]
        qk = tl.where(causal, qk * qk_scale, float("-inf"))
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_ij[:, None])
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = tl.load(v_base + kn[:, None] * stride_vr + offs_d[None, :],
                    mask=n_mask[:, None], other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_ij

    acc = acc / l_i[:, None]
    o_ptrs = O + (row_base + offs_m)[:, None] * stride_or + h * HEAD_DIM + offs_d[None, :]
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=m_mask[:, None])


class ModelNew(nn.Module):
    def __init__(self, original):
        super().__init__()
        self.original = original
        self.head_dim = original.head_dim
        self.num_key_value_groups = original.num_key_value_groups
        self.scaling = original.scaling

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None,
                past_key_values=None, **kwargs):
        orig = self.original
        B, S, Hd = hidden_states.shape
        D = self.head_dim

        x2d = hidden_states.view(B * S, Hd)
        lin = torch.nn.functional.linear
        q = lin(x2d, orig.q_proj.weight, orig.q_proj.bias)
        k = lin(x2d, orig.k_proj.weight, orig.k_proj.bias)
        v = lin(x2d, orig.v_proj.weight, orig.v_proj.bias)

        n_heads = q.shape[1] // D
        n_kv = k.shape[1] // D
        n_rep = n_heads // n_kv

        cos, sin = position_embeddings
        stride_cb = cos.stride(0) if cos.shape[0] > 1 else 0
        stride_sb = sin.stride(0) if sin.shape[0] > 1 else 0

        # rotary embedding for K
        n_rows = B * S
        kv_cols = k.shape[1]
        k_rot = torch.empty_like(k)
        BLOCK_R = 16
        _rope_k_kernel[(triton.cdiv(n_rows, BLOCK_R),)](
            k, k_rot, cos, sin,
            n_rows, S,
            k.stride(0), k_rot.stride(0),
            stride_cb, cos.stride(1), cos.stride(2),
            stride_sb, sin.stride(1), sin.stride(2),
            N_COLS=kv_cols, BLOCK_C=triton.next_power_of_2(kv_cols),
            HEAD_DIM=D, BLOCK_R=BLOCK_R,
            num_warps=4,
        )

        # causal flash attention with the rotary embedding of Q fused in
        o = torch.empty((B * S, n_heads * D), dtype=hidden_states.dtype,
                        device=hidden_states.device)
        BLOCK_M = 128
        BLOCK_N = 64
        qk_scale = float(self.scaling) * 1.4426950408889634
        grid = (n_heads, triton.cdiv(S, BLOCK_M), B)
        _attn_fwd_kernel[grid](
            q, k_rot, v, o, cos, sin,
            S, qk_scale,
            q.stride(0), k_rot.stride(0), v.stride(0), o.stride(0),
            stride_cb, cos.stride(1), cos.stride(2),
            stride_sb, sin.stride(1), sin.stride(2),
            N_REP=n_rep, HEAD_DIM=D,
            BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
            num_warps=4, num_stages=3,
        )

        out = lin(o, orig.o_proj.weight, orig.o_proj.bias)
        return out.view(B, S, out.shape[-1]), None
