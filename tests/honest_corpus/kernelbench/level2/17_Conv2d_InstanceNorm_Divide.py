"""ModelNew for 17_Conv2d_InstanceNorm_Divide: conv2d(3x3, stride 1, no padding) -> InstanceNorm2d -> / divide_by.

Three launches per forward:
1. `_pack_weight_kernel` repacks the conv weight [C_out, C_in, KH, KW] into a GEMM matrix
   wp[(kh*KW + kw)*C_in + ci, co] (73,728 elements, microseconds), so weight tiles are unit-stride along C_out.
2. `_conv_fwd_stats_kernel`: implicit-GEMM convolution in exact fp32 (`tl.dot(..., input_precision="ieee")`).
   A program computes a tile of BLOCK_OH x BLOCK_OW output pixels (one full 126-pixel row padded to 128 here)
   of one image for BLOCK_N output channels, adds the bias, stores the conv output and, from the accumulator still
   in registers, writes the per-channel tile mean and centred sum of squares (M2).
3. `_instance_norm_div_kernel`: one program per (image, channel) merges its tile partials with Chan's parallel
   formula (exact, no E[x^2] - E[x]^2 cancellation), then normalises its plane in place and divides by divide_by.

InstanceNorm2d here has affine=False and track_running_stats=False, so it always uses per-instance statistics
(biased variance, eps inside the sqrt), in both training and eval mode.
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _pack_weight_kernel(
    w_ptr, wp_ptr, C_out, C_in, total, swo, swi, swh, sww, KW: tl.constexpr, BLOCK: tl.constexpr
):
    # wp[(kh * KW + kw) * C_in + ci, co] = w[co, ci, kh, kw]
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < total
    co = offs % C_out
    k = offs // C_out
    ci = k % C_in
    r = k // C_in
    kh = r // KW
    kw = r - kh * KW
    w = tl.load(w_ptr + co * swo + ci * swi + kh * swh + kw * sww, mask=mask, other=0.0)
    tl.store(wp_ptr + offs, w, mask=mask)


@triton.jit
def _conv_fwd_stats_kernel(
    x_ptr,
    wp_ptr,
    bias_ptr,
    y_ptr,
    pmean_ptr,
    pm2_ptr,
    C_in,
    C_out,
    H_out,
    W_out,
    n_tw,
    n_tiles,
    sxn,
    sxc,
    sxh,
    sxw,
    KH: tl.constexpr,
    KW: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_OH: tl.constexpr,
    BLOCK_OW: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_t = tl.program_id(0)
    n = tl.program_id(1)
    pid_n = tl.program_id(2)
    tile_h = pid_t // n_tw
    tile_w = pid_t - tile_h * n_tw

    # Output pixels of this tile: BLOCK_OH rows x BLOCK_OW columns (ow is unit-stride -> coalesced loads/stores).
    offs_m = tl.arange(0, BLOCK_M)
    oh = tile_h * BLOCK_OH + offs_m // BLOCK_OW
    ow = tile_w * BLOCK_OW + offs_m % BLOCK_OW
    m_mask = (oh < H_out) & (ow < W_out)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < C_out
    offs_k = tl.arange(0, BLOCK_K)

    x_img = x_ptr + n.to(tl.int64) * sxn
    pix = oh * sxh + ow * sxw
    K_total = C_in * KH * KW

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K_total, BLOCK_K):
        # Reduction index k = (kh * KW + kw) * C_in + ci (same order as the packed weight).
        k = k0 + offs_k
        k_mask = k < K_total
        ci = k % C_in
        r = k // C_in
        kh = r // KW
        kw = r - kh * KW
        a_off = ci * sxc + kh * sxh + kw * sxw
        a = tl.load(
            x_img + (pix[:, None] + a_off[None, :]),
            mask=m_mask[:, None] & k_mask[None, :],
            other=0.0,
        )
        b = tl.load(
            wp_ptr + k[:, None] * C_out + offs_n[None, :],
            mask=k_mask[:, None] & n_mask[None, :],
            other=0.0,
        )
        acc += tl.dot(a, b, input_precision="ieee")

    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0)
        acc = acc + bias[None, :]

    HW = H_out * W_out
    mask2 = m_mask[:, None] & n_mask[None, :]
    y_ptrs = y_ptr + n.to(tl.int64) * C_out * HW + offs_n[None, :] * HW + (oh * W_out + ow)[:, None]
    tl.store(y_ptrs, acc, mask=mask2)

    # Per-channel tile statistics (mean and M2 about the tile mean) from the registers.
    rows_valid = tl.minimum(H_out - tile_h * BLOCK_OH, BLOCK_OH)
    cols_valid = tl.minimum(W_out - tile_w * BLOCK_OW, BLOCK_OW)
    cnt = (rows_valid * cols_valid).to(tl.float32)
    t_mean = tl.sum(tl.where(mask2, acc, 0.0), axis=0) / cnt
    d = tl.where(mask2, acc - t_mean[None, :], 0.0)
    t_m2 = tl.sum(d * d, axis=0)
    p_idx = (n * C_out + offs_n) * n_tiles + pid_t
    tl.store(pmean_ptr + p_idx, t_mean, mask=n_mask)
    tl.store(pm2_ptr + p_idx, t_m2, mask=n_mask)


@triton.jit
def _instance_norm_div_kernel(
    y_ptr,
    pmean_ptr,
    pm2_ptr,
    HW,
    H_out,
    W_out,
    n_tw,
    n_tiles,
    eps,
    divide_by,
    BLOCK_OH: tl.constexpr,
    BLOCK_OW: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)  # n * C_out + c

    # Chan's merge of the per-tile (count, mean, M2) partials.
    t = tl.arange(0, BLOCK_T)
    t_mask = t < n_tiles
    th = t // n_tw
    tw = t - th * n_tw
    cnt = tl.minimum(H_out - th * BLOCK_OH, BLOCK_OH) * tl.minimum(W_out - tw * BLOCK_OW, BLOCK_OW)
    cnt = tl.where(t_mask, cnt, 0).to(tl.float32)
    pm = tl.load(pmean_ptr + pid * n_tiles + t, mask=t_mask, other=0.0)
    pq = tl.load(pm2_ptr + pid * n_tiles + t, mask=t_mask, other=0.0)
    total = tl.sum(cnt, axis=0)
    mean = tl.sum(cnt * pm, axis=0) / total
    dm = pm - mean
    var = (tl.sum(pq, axis=0) + tl.sum(cnt * dm * dm, axis=0)) / total
    rstd = 1.0 / tl.sqrt(var + eps)

    base = y_ptr + pid.to(tl.int64) * HW
    for start in range(0, HW, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < HW
        v = tl.load(base + offs, mask=mask, other=0.0)
        out = ((v - mean) * rstd) / divide_by
        tl.store(base + offs, out, mask=mask)


class ModelNew(nn.Module):
    """
    Convolution, Instance Normalization and division by a constant, computed with Triton kernels.
    """

    def __init__(self, in_channels, out_channels, kernel_size, divide_by):
        super(ModelNew, self).__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.instance_norm = nn.InstanceNorm2d(out_channels)
        self.divide_by = divide_by
        self._plans = {}

    def _make_plan(self, x):
        conv = self.conv
        if x.dim() != 4 or x.dtype != torch.float32:
            raise ValueError("expected a 4-D float32 input")
        if (
            tuple(conv.stride) != (1, 1)
            or tuple(conv.padding) != (0, 0)
            or tuple(conv.dilation) != (1, 1)
            or conv.groups != 1
        ):
            raise ValueError("kernel supports stride 1, no padding, dilation 1, groups 1")
        if self.instance_norm.affine or self.instance_norm.track_running_stats:
            raise ValueError("kernel supports InstanceNorm2d without affine / running stats")
        N, C_in, H, W = x.shape
        C_out, C_in_w, KH, KW = conv.weight.shape
        if C_in_w != C_in:
            raise ValueError("channel mismatch")
        H_out, W_out = H - KH + 1, W - KW + 1

        block_ow = min(128, triton.next_power_of_2(W_out))
        block_oh = max(1, 128 // block_ow)
        block_m = block_oh * block_ow
        n_th = triton.cdiv(H_out, block_oh)
        n_tw = triton.cdiv(W_out, block_ow)
        n_tiles = n_th * n_tw
        block_n = max(16, min(128, triton.next_power_of_2(C_out)))
        K_total = C_in * KH * KW
        block_k = 32 if K_total >= 32 else 16
        n_pack = K_total * C_out
        return dict(
            N=N,
            C_in=C_in,
            C_out=C_out,
            KH=KH,
            KW=KW,
            H_out=H_out,
            W_out=W_out,
            n_tw=n_tw,
            n_tiles=n_tiles,
            block_oh=block_oh,
            block_ow=block_ow,
            block_m=block_m,
            block_n=block_n,
            block_k=block_k,
            block_t=max(16, triton.next_power_of_2(n_tiles)),
            n_pack=n_pack,
            pack_grid=(triton.cdiv(n_pack, 1024),),
            conv_grid=(n_tiles, N, triton.cdiv(C_out, block_n)),
            norm_grid=(N * C_out,),
        )

    def forward(self, x):
        key = (x.shape, x.stride(), x.dtype)
        p = self._plans.get(key)
        if p is None:
            p = self._make_plan(x)
            self._plans[key] = p

        w = self.conv.weight
        b = self.conv.bias
        dev = x.device
        C_in, C_out, KW = p["C_in"], p["C_out"], p["KW"]
        H_out, W_out, n_tiles = p["H_out"], p["W_out"], p["n_tiles"]

        wp = torch.empty((p["n_pack"],), dtype=w.dtype, device=dev)
        sw = w.stride()
        _pack_weight_kernel[p["pack_grid"]](
            w, wp, C_out, C_in, p["n_pack"], sw[0], sw[1], sw[2], sw[3], KW=KW, BLOCK=1024, num_warps=4
        )

        y = torch.empty((p["N"], C_out, H_out, W_out), dtype=x.dtype, device=dev)
        pmean = torch.empty((p["N"] * C_out * n_tiles,), dtype=torch.float32, device=dev)
        pm2 = torch.empty((p["N"] * C_out * n_tiles,), dtype=torch.float32, device=dev)
        sx = x.stride()
        _conv_fwd_stats_kernel[p["conv_grid"]](
            x,
            wp,
            b if b is not None else wp,
            y,
            pmean,
            pm2,
            C_in,
            C_out,
            H_out,
            W_out,
            p["n_tw"],
            n_tiles,
            sx[0],
            sx[1],
            sx[2],
            sx[3],
            KH=p["KH"],
            KW=KW,
            HAS_BIAS=b is not None,
            BLOCK_OH=p["block_oh"],
            BLOCK_OW=p["block_ow"],
            BLOCK_M=p["block_m"],
            BLOCK_N=p["block_n"],
            BLOCK_K=p["block_k"],
            num_warps=8,
            num_stages=3,
        )

        _instance_norm_div_kernel[p["norm_grid"]](
            y,
            pmean,
            pm2,
            H_out * W_out,
            H_out,
            W_out,
            p["n_tw"],
            n_tiles,
            float(self.instance_norm.eps),
            float(self.divide_by),
            BLOCK_OH=p["block_oh"],
            BLOCK_OW=p["block_ow"],
            BLOCK_T=p["block_t"],
            BLOCK=4096,
            num_warps=8,
        )
        return y
