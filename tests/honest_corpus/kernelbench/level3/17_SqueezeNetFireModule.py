"""ModelNew for 17_SqueezeNetFireModule with Triton kernels.

forward(x) = cat([relu(expand1x1(s)), relu(expand3x3(s))], 1) with s = relu(squeeze(x)).

Kernel 1 (_squeeze_kernel): s = relu(W_sq x + b_sq) for a block of pixels, all squeeze channels at once.
Kernel 2 (_expand_kernel): one program per (image, 128 flat pixels) computes all C1 + C3 output channels:
    3x3 branch: implicit GEMM  A3[p, k] = s[c, p + dh*W + dw]  (k = c*9 + tap, zero outside the image)
                               @ B3[k, co] = w3[co, c, kh, kw]
    1x1 branch: A1[p, c] = s[c, p] @ B1[c, co] = w1[co, c]
and writes both directly into their channel ranges of the concatenated output (no separate cat pass).
All dots are fp32 with input_precision="ieee".
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _squeeze_kernel(
    x_ptr, w_ptr, b_ptr, s_ptr,
    HW, W, n_pblk,
    sxn, sxc, sxh, sxw,
    C_IN: tl.constexpr, C_SQ: tl.constexpr, C_SQ_PAD: tl.constexpr,
    BLOCK: tl.constexpr, X_HW_CONTIG: tl.constexpr,
):
    pid = tl.program_id(0)
    n = pid // n_pblk
    pb = pid - n * n_pblk
    offs = pb * BLOCK + tl.arange(0, BLOCK)
    pmask = offs < HW
    if X_HW_CONTIG:
        sp = offs
    else:
        h = offs // W
        sp = h * sxh + (offs - h * W) * sxw
    x_base = x_ptr + n.to(tl.int64) * sxn
    c = tl.arange(0, C_SQ_PAD)
    cmask = c < C_SQ
    acc = tl.zeros([C_SQ_PAD, BLOCK], dtype=tl.float32)
    for ci in tl.static_range(C_IN):
        xv = tl.load(x_base + ci * sxc + sp, mask=pmask, other=0.0)
        wv = tl.load(w_ptr + c * C_IN + ci, mask=cmask, other=0.0)
        acc += wv[:, None] * xv[None, :]
    bias = tl.load(b_ptr + c, mask=cmask, other=0.0)
    s = tl.maximum(acc + bias[:, None], 0.0)
    s_base = s_ptr + n.to(tl.int64) * (C_SQ * HW)
    tl.store(s_base + c[:, None] * HW + offs[None, :], s, mask=cmask[:, None] & pmask[None, :])


@triton.jit
def _expand_kernel(
    s_ptr, w1_ptr, b1_ptr, w3_ptr, b3_ptr, out_ptr,
    H, W, HW, n_pblk,
    C_SQ: tl.constexpr, C1: tl.constexpr, C3: tl.constexpr,
    K1_PAD: tl.constexpr, K3_PAD: tl.constexpr, C1_PAD: tl.constexpr, C3_PAD: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    pid = tl.program_id(0)
    n = pid // n_pblk
    pb = pid - n * n_pblk
    offs_p = pb * BLOCK_P + tl.arange(0, BLOCK_P)
    p_mask = offs_p < HW
    h = offs_p // W
    w = offs_p - h * W
    s_base = s_ptr + n.to(tl.int64) * (C_SQ * HW)

    # ---- 3x3 branch: im2col of the squeezed activation (padding=1 -> masked zeros) ----
    k3 = tl.arange(0, K3_PAD)
    k3_mask = k3 < C_SQ * 9
    c_k = k3 // 9
    tap = k3 - c_k * 9
    dh = tap // 3 - 1
    dw = tap - (tap // 3) * 3 - 1
    hh = h[:, None] + dh[None, :]
    ww = w[:, None] + dw[None, :]
    valid = (p_mask[:, None] & k3_mask[None, :]
             & (hh >= 0) & (hh < H) & (ww >= 0) & (ww < W))
    # (h + dh) * W + (w + dw) == p + dh * W + dw, so the gather stays unit-stride along the pixel axis
    a3 = tl.load(s_base + offs_p[:, None] + (c_k * HW + dh * W + dw)[None, :], mask=valid, other=0.0)
    co3 = tl.arange(0, C3_PAD)
    co3_mask = co3 < C3
    b3w = tl.load(w3_ptr + co3[None, :] * (C_SQ * 9) + k3[:, None],
                  mask=k3_mask[:, None] & co3_mask[None, :], other=0.0)
    acc3 = tl.dot(a3, b3w, input_precision="ieee")

    # ---- 1x1 branch ----
    k1 = tl.arange(0, K1_PAD)
    k1_mask = k1 < C_SQ
    a1 = tl.load(s_base + k1[None, :] * HW + offs_p[:, None], mask=p_mask[:, None] & k1_mask[None, :], other=0.0)
    co1 = tl.arange(0, C1_PAD)
    co1_mask = co1 < C1
    b1w = tl.load(w1_ptr + co1[None, :] * C_SQ + k1[:, None], mask=k1_mask[:, None] & co1_mask[None, :], other=0.0)
    acc1 = tl.dot(a1, b1w, input_precision="ieee")

    # ---- bias + ReLU, write both halves of the concatenated output ----
    bias1 = tl.load(b1_ptr + co1, mask=co1_mask, other=0.0)
    bias3 = tl.load(b3_ptr + co3, mask=co3_mask, other=0.0)
    y1 = tl.maximum(acc1 + bias1[None, :], 0.0)
    y3 = tl.maximum(acc3 + bias3[None, :], 0.0)
    out_base = out_ptr + n.to(tl.int64) * ((C1 + C3) * HW)
    tl.store(out_base + co1[None, :] * HW + offs_p[:, None], y1, mask=p_mask[:, None] & co1_mask[None, :])
    tl.store(out_base + (C1 + co3)[None, :] * HW + offs_p[:, None], y3, mask=p_mask[:, None] & co3_mask[None, :])


class ModelNew(nn.Module):
    def __init__(self, in_channels, squeeze_channels, expand1x1_channels, expand3x3_channels):
        super(ModelNew, self).__init__()
        self.squeeze = nn.Conv2d(in_channels, squeeze_channels, kernel_size=1)
        self.squeeze_activation = nn.ReLU(inplace=True)
        self.expand1x1 = nn.Conv2d(squeeze_channels, expand1x1_channels, kernel_size=1)
        self.expand1x1_activation = nn.ReLU(inplace=True)
        self.expand3x3 = nn.Conv2d(squeeze_channels, expand3x3_channels, kernel_size=3, padding=1)
        self.expand3x3_activation = nn.ReLU(inplace=True)

    def forward(self, x):
        if x.dim() != 4 or x.dtype != torch.float32:
            raise ValueError("expected a 4-D float32 input")
        N, C_in, H, W = x.shape
        C_sq = self.squeeze.out_channels
        C1 = self.expand1x1.out_channels
        C3 = self.expand3x3.out_channels
        HW = H * W
        dev = x.device

        s = torch.empty((N, C_sq, H, W), device=dev, dtype=torch.float32)
        out = torch.empty((N, C1 + C3, H, W), device=dev, dtype=torch.float32)
        if N == 0 or HW == 0:
            return out

        sxn, sxc, sxh, sxw = x.stride()
        block_sq = 1024
        n_blk_sq = triton.cdiv(HW, block_sq)
        _squeeze_kernel[(N * n_blk_sq,)](
            x, self.squeeze.weight, self.squeeze.bias, s,
            HW, W, n_blk_sq, sxn, sxc, sxh, sxw,
            C_IN=C_in, C_SQ=C_sq, C_SQ_PAD=triton.next_power_of_2(C_sq),
            BLOCK=block_sq, X_HW_CONTIG=(sxw == 1 and sxh == W),
            num_warps=4,
        )

        block_p = 128
        n_pblk = triton.cdiv(HW, block_p)
        _expand_kernel[(N * n_pblk,)](
            s, self.expand1x1.weight, self.expand1x1.bias, self.expand3x3.weight, self.expand3x3.bias, out,
            H, W, HW, n_pblk,
            C_SQ=C_sq, C1=C1, C3=C3,
            K1_PAD=max(16, triton.next_power_of_2(C_sq)),
            K3_PAD=max(16, triton.next_power_of_2(C_sq * 9)),
            C1_PAD=max(16, triton.next_power_of_2(C1)),
            C3_PAD=max(16, triton.next_power_of_2(C3)),
            BLOCK_P=block_p,
            num_warps=8,
        )
        return out
