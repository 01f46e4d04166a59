# A stand-in model's first reply to the instance prompt for transformers' LlamaAttention as a CUDA-graph capture
# calls it (an explicit bool causal mask) on an NVIDIA H200 (benchmarks/replies/README.md); the code below is unedited.
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
import triton
import triton.language as tl


# ----------------------------------------------------------------------------
# Rotary embedding applied to K (written to a contiguous [B, S, KVH*D] buffer)
# ----------------------------------------------------------------------------
@triton.jit
def _k_rope_kernel(
    K, C, Sn, KO,
    n_rows, KVH, S,
    stride_kb, stride_ks,
    stride_cb, stride_cs, stride_cd,
    stride_sb, stride_ss, stride_sd,
    HEAD_DIM: tl.constexpr, BLOCK_R: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = rows < n_rows
    kvh = rows % KVH
    bs = rows // KVH
    s = bs % S
    b = bs // S
    HALF: tl.constexpr = HEAD_DIM // 2
    offs_d = tl.arange(0, HEAD_DIM)
    offs_r = (offs_d + HALF) % HEAD_DIM
    m2 = rmask[:, None]

    kbase = b * stride_kb + s * stride_ks + kvh * HEAD_DIM
    x = tl.load(K + kbase[:, None] + offs_d[None, :], mask=m2, other=0.0).to(tl.float32)
    xr = tl.load(K + kbase[:, None] + offs_r[None, :], mask=m2, other=0.0).to(tl.float32)
    c = tl.load(C + (b * stride_cb + s * stride_cs)[:, None] + offs_d[None, :] * stride_cd,
                mask=m2, other=0.0).to(tl.float32)
    sn = tl.load(Sn + (b * stride_sb + s * stride_ss)[:, None] + offs_d[None, :] * stride_sd,
                 mask=m2, other=0.0).to(tl.float32)
    sign = tl.where(offs_d < HALF, -1.0, 1.0)
    y = x * c + xr * sn * sign[None, :]
    tl.store(KO + (rows * HEAD_DIM)[:, None] + offs_d[None, :],
             y.to(KO.dtype.element_ty), mask=m2)


# ----------------------------------------------------------------------------
# Block-level classification of the boolean mask: 0 = empty, 1 = full, 2 = partial
# ----------------------------------------------------------------------------
@triton.jit
def _mask_flags_kernel(
    M, FL,
    stride_mb, stride_mq, stride_mk,
    stride_fb, NNB,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    mb = tl.program_id(0)
    nb = tl.program_id(1)
    bb = tl.program_id(2)
    offs_m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.load(M + bb * stride_mb + offs_m[:, None] * stride_mq + offs_n[None, :] * stride_mk)
    cnt = tl.sum(tl.sum((m != 0).to(tl.int32), axis=1), axis=0)
    flag = tl.where(cnt == 0, 0, tl.where(cnt == BLOCK_M * BLOCK_N, 1, 2))
    tl.store(FL + bb * stride_fb + mb * NNB + nb, flag)


# ----------------------------------------------------------------------------
# Flash attention with fused Q-rotary, GQA and boolean mask (block skipping)
# ----------------------------------------------------------------------------
@triton.jit
def _attn_kernel(
    Q, K, V, C, Sn, M, FL, O,
    stride_qb, stride_qs,
    stride_kb, stride_ks,
    stride_vb, stride_vs,
    stride_cb, stride_cs, stride_cd,
    stride_sb, stride_ss, stride_sd,
    stride_mb, stride_mq, stride_mk,
    stride_fb,
    stride_ob, stride_os,
    qk_scale, H, GROUPS, NNB,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    NNB_P2: tl.constexpr, HAS_MASK: tl.constexpr,
):
    pid_bh = tl.program_id(0)
    mb = tl.num_programs(1) - 1 - tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    kvh = h // GROUPS

    HALF: tl.constexpr = HEAD_DIM // 2
    offs_m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_r = (offs_d + HALF) % HEAD_DIM

    # ---- load Q and apply rotary embedding (rounded to bf16 like the reference)
    q_base = Q + b * stride_qb + h * HEAD_DIM + offs_m[:, None] * stride_qs
    q = tl.load(q_base + offs_d[None, :]).to(tl.float32)
    qr = tl.load(q_base + offs_r[None, :]).to(tl.float32)
    c = tl.load(C + b * stride_cb + offs_m[:, None] * stride_cs + offs_d[None, :] * stride_cd).to(tl.float32)
    sn = tl.load(Sn + b * stride_sb + offs_m[:, None] * stride_ss + offs_d[None, :] * stride_sd).to(tl.float32)
    sign = tl.where(offs_d < HALF, -1.0, 1.0)
    q = (q * c + qr * sn * sign[None, :]).to(Q.dtype.element_ty)

    # ---- range of key blocks to visit
    if HAS_MASK:
        idx = tl.arange(0, NNB_P2)
        f = tl.load(FL + b * stride_fb + mb * NNB + idx, mask=idx < NNB, other=0)
        lo = tl.min(tl.where(f != 0, idx, NNB), axis=0)
        hi = tl.max(tl.where(f != 0, idx + 1, 0), axis=0)
    else:
        lo = 0
        hi = tl.cdiv((mb + 1) * BLOCK_M, BLOCK_N)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    k_base = K + b * stride_kb + kvh * HEAD_DIM + offs_n[:, None] * stride_ks + offs_d[None, :]
    v_base = V + b * stride_vb + kvh * HEAD_DIM + offs_n[:, None] * stride_vs + offs_d[None, :]
    m_base = M + b * stride_mb + offs_m[:, None] * stride_mq + offs_n[None, :] * stride_mk

    for nb in range(lo, hi):
        start_n = nb * BLOCK_N
        k = tl.load(k_base + start_n * stride_ks)
        qk = tl.dot(q, tl.trans(k)) * qk_scale
        if HAS_MASK:
            flag = tl.load(FL + b * stride_fb + mb * NNB + nb)
            if flag != 1:
                mk = tl.load(m_base + start_n * stride_mk)
                qk = tl.where(mk != 0, qk, float("-inf"))
        else:
            if start_n + BLOCK_N > mb * BLOCK_M:
                causal = offs_m[:, None] >= (start_n + offs_n)[None, :]
                qk = tl.where(causal, qk, float("-inf"))
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        m_safe = tl.where(m_ij == float("-inf"), 0.0, m_ij)
        p = tl.math.exp2(qk - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = tl.load(v_base + start_n * stride_vs)
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_ij

    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_safe[:, None]
    o_ptrs = O + b * stride_ob + offs_m[:, None] * stride_os + h * HEAD_DIM + offs_d[None, :]
    tl.store(o_ptrs, out.to(O.dtype.element_ty))


class ModelNew(nn.Module):
    def __init__(self, original):
        super().__init__()
        self.original = original
        self.head_dim = original.head_dim
        self.scaling = float(original.scaling)
        self.num_kv_groups = original.num_key_value_groups

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None,
                cache=None, **kwargs):
        orig = self.original
        B, S, _ = hidden_states.shape
        D = self.head_dim
        dev = hidden_states.device

        q = F.linear(hidden_states, orig.q_proj.weight, orig.q_proj.bias)
        k = F.linear(hidden_states, orig.k_proj.weight, orig.k_proj.bias)
        v = F.linear(hidden_states, orig.v_proj.weight, orig.v_proj.bias)

        H = q.shape[-1] // D
        KVH = k.shape[-1] // D
        groups = H // KVH

        cos, sin = position_embeddings
        scb = cos.stride(0) if cos.shape[0] > 1 else 0
        ssb = sin.stride(0) if sin.shape[0] > 1 else 0

        # ---- rotary on K
        k_rot = torch.empty((B, S, KVH * D), device=dev, dtype=k.dtype)
        n_rows = B * S * KVH
        BLOCK_R = 64
        _k_rope_kernel[(triton.cdiv(n_rows, BLOCK_R),)](
            k, cos, sin, k_rot,
            n_rows, KVH, S,
            k.stride(0), k.stride(1),
            scb, cos.stride(1), cos.stride(2),
            ssb, sin.stride(1), sin.stride(2),
            HEAD_DIM=D, BLOCK_R=BLOCK_R, num_warps=4,
        )

        BLOCK_M = 128
        BLOCK_N = 64
        NMB = S // BLOCK_M
        NNB = S // BLOCK_N
        NNB_P2 = triton.next_power_of_2(NNB)

        if attention_mask is not None:
            am = attention_mask
            if am.dtype == torch.bool:
                am = am.view(torch.uint8)
            Bm = am.shape[0]
            smb = am.stride(0) if Bm > 1 else 0
            smq = am.stride(2)
            smk = am.stride(3)
            flags = torch.empty((Bm, NMB, NNB), device=dev, dtype=torch.int32)
            sfb = NMB * NNB if Bm > 1 else 0
            _mask_flags_kernel[(NMB, NNB, Bm)](
                am, flags,
                smb, smq, smk,
                NMB * NNB, NNB,
                BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, num_warps=4,
            )
            has_mask = True
        else:
            am = q
            flags = q
            smb = smq = smk = 0
            sfb = 0
            has_mask = False

        attn = torch.empty((B, S, H * D), device=dev, dtype=q.dtype)
        qk_scale = self.scaling * 1.4426950408889634
        _attn_kernel[(B * H, NMB)](
            q, k_rot, v, cos, sin, am, flags, attn,
            q.stride(0), q.stride(1),
            k_rot.stride(0), k_rot.stride(1),
            v.stride(0), v.stride(1),
            scb, cos.stride(1), cos.stride(2),
            ssb, sin.stride(1), sin.stride(2),
            smb, smq, smk,
            sfb,
            attn.stride(0), attn.stride(1),
            qk_scale, H, groups, NNB,
            HEAD_DIM=D, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
            NNB_P2=NNB_P2, HAS_MASK=has_mask,
            num_warps=4, num_stages=3,
        )

        out = F.linear(attn, orig.o_proj.weight, orig.o_proj.bias)
        return out, None
