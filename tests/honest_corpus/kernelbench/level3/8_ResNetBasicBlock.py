"""ModelNew for 8_ResNetBasicBlock (stride 1, training-mode BatchNorm semantics) with Triton kernels.

out = relu( bn2(conv2(relu(bn1(conv1(x))))) + bn_d(conv_d(x)) )

  _pack_w3x3_kernel       : conv2 weight [co, ci, 3, 3] -> [tap, ci, co] (unit-stride GEMM B tiles)
  _conv1_ds_kernel        : conv1 (3x3) and 1x1 downsample from the same x loads; stores conv1 output and
                            per-tile (mean, M2) partials of conv1 and of the downsample output
  _bn_finalize_kernel     : Chan merge of the partials -> (mean, gamma * invstd); running-stat update
                            (momentum, unbiased variance, num_batches_tracked) as nn.BatchNorm2d does
  _conv3x3_bnrelu_kernel  : conv2 as implicit GEMM (fp32 IEEE tl.dot); bn1 + ReLU applied while loading;
                            stores conv2 output + bn2 partials
  _residual_kernel        : relu(bn2(conv2) + bn_d(conv_d(x))), downsample recomputed from x (3 channels),
                            written in place over the conv2 buffer
In eval mode the finalize kernel reads the running statistics instead of batch statistics.
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _pack_w3x3_kernel(w_ptr, wp_ptr, C_OUT, C_IN, BLOCK: tl.constexpr):
    # wp[tap, ci, co] = w[co, ci, tap]
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < 9 * C_IN * C_OUT
    co = offs % C_OUT
    t = offs // C_OUT
    ci = t % C_IN
    tap = t // C_IN
    v = tl.load(w_ptr + (co * C_IN + ci) * 9 + tap, mask=mask, other=0.0)
    tl.store(wp_ptr + offs, v, mask=mask)


@triton.jit
def _tile_channel_stats(v, p_mask, cnt):
    # per-channel mean and M2 = sum((v - mean)^2) over the valid pixels (rows) of a [BLOCK_P, C] tile
    mean = tl.sum(tl.where(p_mask[:, None], v, 0.0), axis=0) / cnt
    d = tl.where(p_mask[:, None], v - mean[None, :], 0.0)
    return mean, tl.sum(d * d, axis=0)


@triton.jit
def _conv1_ds_kernel(
    x_ptr, w1_ptr, wd_ptr, c1_ptr, part_ptr,
    H, W, HW, n_pblk, P,
    sxn, sxc, sxh, sxw,
    C_IN: tl.constexpr, C_OUT: tl.constexpr, BLOCK_P: tl.constexpr, COMPUTE_STATS: tl.constexpr,
):
    pid = tl.program_id(0)
    n = pid // n_pblk
    pb = pid - n * n_pblk
    offs_p = pb * BLOCK_P + tl.arange(0, BLOCK_P)
    p_mask = offs_p < HW
    h = offs_p // W
    w = offs_p - h * W
    co = tl.arange(0, C_OUT)
    x_base = x_ptr + n.to(tl.int64) * sxn

    acc = tl.zeros([BLOCK_P, C_OUT], dtype=tl.float32)
    acc_ds = tl.zeros([BLOCK_P, C_OUT], dtype=tl.float32)
    for ci in tl.static_range(C_IN):
        for kh in tl.static_range(3):
            hh = h + (kh - 1)
            h_ok = p_mask & (hh >= 0) & (hh < H)
            for kw in tl.static_range(3):
                ww = w + (kw - 1)
                valid = h_ok & (ww >= 0) & (ww < W)
                xv = tl.load(x_base + ci * sxc + hh * sxh + ww * sxw, mask=valid, other=0.0)
                wv = tl.load(w1_ptr + co * (C_IN * 9) + (ci * 9 + kh * 3 + kw))
                acc += xv[:, None] * wv[None, :]
                if kh == 1:
                    if kw == 1:
                        wd = tl.load(wd_ptr + co * C_IN + ci)
                        acc_ds += xv[:, None] * wd[None, :]

    c_off = n.to(tl.int64) * (C_OUT * HW) + co[None, :] * HW + offs_p[:, None]
    tl.store(c1_ptr + c_off, acc, mask=p_mask[:, None])
    if COMPUTE_STATS:
        cnt = tl.minimum(HW - pb * BLOCK_P, BLOCK_P).to(tl.float32)
        mean1, m2_1 = _tile_channel_stats(acc, p_mask, cnt)
        mean_d, m2_d = _tile_channel_stats(acc_ds, p_mask, cnt)
        CP = C_OUT * P
        tl.store(part_ptr + co * P + pid, mean1)
        tl.store(part_ptr + CP + co * P + pid, m2_1)
        tl.store(part_ptr + 2 * CP + co * P + pid, mean_d)
        tl.store(part_ptr + 3 * CP + co * P + pid, m2_d)


@triton.jit
def _bn_finalize_kernel(
    part_ptr, gamma_ptr, rmean_ptr, rvar_ptr, nbt_ptr, stats_ptr,
    part_off, stat_off, P, HW, n_pblk, C,
    inv_count, unbias, eps, momentum,
    TILE: tl.constexpr, PB: tl.constexpr, BATCH_STATS: tl.constexpr, UPDATE: tl.constexpr,
):
    c = tl.program_id(0)
    if BATCH_STATS:
        # lane-wise Chan merge of the per-tile (count, mean, M2) partials, then a merge across lanes
        offs = tl.arange(0, PB)
        n_v = tl.zeros([PB], dtype=tl.float32)
        mean_v = tl.zeros([PB], dtype=tl.float32)
        m2_v = tl.zeros([PB], dtype=tl.float32)
        mean_base = part_ptr + part_off + c * P
        m2_base = part_ptr + part_off + C * P + c * P
        for start in range(0, P, PB):
            i = start + offs
            imask = i < P
            tile = i % n_pblk
            cnt = tl.where(imask, tl.minimum(HW - tile * TILE, TILE), 0).to(tl.float32)
            mu = tl.load(mean_base + i, mask=imask, other=0.0)
            m2_i = tl.load(m2_base + i, mask=imask, other=0.0)
            n_new = n_v + cnt
            frac = tl.where(n_new > 0, cnt / tl.maximum(n_new, 1.0), 0.0)
            delta = mu - mean_v
            mean_v = mean_v + delta * frac
            m2_v = m2_v + m2_i + delta * delta * n_v * frac
            n_v = n_new
        total = tl.sum(n_v, axis=0)
        mean = tl.sum(n_v * mean_v, axis=0) / total
        dv = mean_v - mean
        m2 = tl.sum(m2_v + n_v * dv * dv, axis=0)
        var = m2 * inv_count  # biased variance, used for normalisation
    else:
        mean = tl.load(rmean_ptr + c)
        var = tl.load(rvar_ptr + c)
    invstd = 1.0 / tl.sqrt(var + eps)
    a = invstd * tl.load(gamma_ptr + c)
    tl.store(stats_ptr + stat_off + c, mean)
    tl.store(stats_ptr + stat_off + C + c, a)
    if UPDATE:
        rm = tl.load(rmean_ptr + c)
        rv = tl.load(rvar_ptr + c)
        tl.store(rmean_ptr + c, (1.0 - momentum) * rm + momentum * mean)
        tl.store(rvar_ptr + c, (1.0 - momentum) * rv + momentum * (var * unbias))
        if c == 0:
            tl.store(nbt_ptr, tl.load(nbt_ptr) + 1)


@triton.jit
def _conv3x3_bnrelu_kernel(
    in_ptr, stats_ptr, beta_ptr, wp_ptr, out_ptr, part_ptr,
    H, W, HW, n_pblk, P, part_off,
    C_IN: tl.constexpr, C_OUT: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_K: tl.constexpr,
    NUM_KB: tl.constexpr, COMPUTE_STATS: tl.constexpr,
):
    # out[n, co, p] = sum_{tap, ci} relu(bn1(in))[n, ci, p + shift(tap)] * w[co, ci, tap]   (padding = 0)
    pid = tl.program_id(0)
    n = pid // n_pblk
    pb = pid - n * n_pblk
    offs_p = pb * BLOCK_P + tl.arange(0, BLOCK_P)
    p_mask = offs_p < HW
    h = offs_p // W
    w = offs_p - h * W
    offs_k = tl.arange(0, BLOCK_K)
    co = tl.arange(0, C_OUT)
    in_base = in_ptr + n.to(tl.int64) * (C_IN * HW)

    acc = tl.zeros([BLOCK_P, C_OUT], dtype=tl.float32)
    for kk in range(0, 9 * NUM_KB):
        tap = kk // NUM_KB
        ci = (kk - tap * NUM_KB) * BLOCK_K + offs_k
        kh = tap // 3
        dh = kh - 1
        dw = tap - kh * 3 - 1
        hh = h + dh
        ww = w + dw
        valid = p_mask & (hh >= 0) & (hh < H) & (ww >= 0) & (ww < W)
        # (h + dh) * W + (w + dw) == p + dh * W + dw: unit stride along the pixel axis
        v = tl.load(in_base + ci[None, :] * HW + (offs_p + (dh * W + dw))[:, None], mask=valid[:, None], other=0.0)
        mu = tl.load(stats_ptr + ci)
        sc = tl.load(stats_ptr + C_IN + ci)
        bt = tl.load(beta_ptr + ci)
        act = tl.maximum((v - mu[None, :]) * sc[None, :] + bt[None, :], 0.0)
        act = tl.where(valid[:, None], act, 0.0)
        wt = tl.load(wp_ptr + (tap * C_IN + ci)[:, None] * C_OUT + co[None, :])
        acc = tl.dot(act, wt, acc=acc, input_precision="ieee")

    c_off = n.to(tl.int64) * (C_OUT * HW) + co[None, :] * HW + offs_p[:, None]
    tl.store(out_ptr + c_off, acc, mask=p_mask[:, None])
    if COMPUTE_STATS:
        cnt = tl.minimum(HW - pb * BLOCK_P, BLOCK_P).to(tl.float32)
        mean, m2 = _tile_channel_stats(acc, p_mask, cnt)
        tl.store(part_ptr + part_off + co * P + pid, mean)
        tl.store(part_ptr + part_off + C_OUT * P + co * P + pid, m2)


@triton.jit
def _residual_kernel(
    c2_ptr, x_ptr, wd_ptr, stats_ptr, beta2_ptr, betad_ptr, out_ptr,
    W, HW, n_pblk,
    sxn, sxc, sxh, sxw,
    C_IN: tl.constexpr, C_OUT: tl.constexpr, BLOCK_P: tl.constexpr,
):
    pid = tl.program_id(0)
    n = pid // n_pblk
    pb = pid - n * n_pblk
    offs_p = pb * BLOCK_P + tl.arange(0, BLOCK_P)
    p_mask = offs_p < HW
    h = offs_p // W
    w = offs_p - h * W
    co = tl.arange(0, C_OUT)

    # downsample 1x1 conv recomputed from x (same accumulation order as in _conv1_ds_kernel)
    x_base = x_ptr + n.to(tl.int64) * sxn
    sp = h * sxh + w * sxw
    ds = tl.zeros([BLOCK_P, C_OUT], dtype=tl.float32)
    for ci in tl.static_range(C_IN):
        xv = tl.load(x_base + ci * sxc + sp, mask=p_mask, other=0.0)
        wd = tl.load(wd_ptr + co * C_IN + ci)
        ds += xv[:, None] * wd[None, :]

    # stats layout: [bn1 | bn_d | bn2], each (mean[C], gamma * invstd[C])
    mean_d = tl.load(stats_ptr + 2 * C_OUT + co)
    a_d = tl.load(stats_ptr + 3 * C_OUT + co)
    mean_2 = tl.load(stats_ptr + 4 * C_OUT + co)
    a_2 = tl.load(stats_ptr + 5 * C_OUT + co)
    b_d = tl.load(betad_ptr + co)
    b_2 = tl.load(beta2_ptr + co)

    c_off = n.to(tl.int64) * (C_OUT * HW) + co[None, :] * HW + offs_p[:, None]
    v = tl.load(c2_ptr + c_off, mask=p_mask[:, None], other=0.0)
    main = (v - mean_2[None, :]) * a_2[None, :] + b_2[None, :]
    identity = (ds - mean_d[None, :]) * a_d[None, :] + b_d[None, :]
    y = tl.maximum(main + identity, 0.0)
    tl.store(out_ptr + c_off, y, mask=p_mask[:, None])


class ModelNew(nn.Module):
    expansion = 1

    def __init__(self, in_channels, out_channels, stride=1):
        super(ModelNew, self).__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(out_channels, out_channels, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.downsample = nn.Sequential(
            nn.Conv2d(in_channels, out_channels * self.expansion, kernel_size=1, stride=stride, bias=False),
            nn.BatchNorm2d(out_channels * self.expansion),
        )
        self.stride = stride

    @staticmethod
    def _finalize(bn, part, part_off, stats, stat_off, P, HW, n_pblk, count, tile):
        batch_stats = bn.training or bn.running_mean is None
        update = bn.training and bn.running_mean is not None
        if update and bn.momentum is None:
            raise NotImplementedError("cumulative moving average (momentum=None) is not implemented")
        if bn.weight is None:
            raise NotImplementedError("affine=False BatchNorm is not implemented")
        rmean = bn.running_mean if bn.running_mean is not None else stats
        rvar = bn.running_var if bn.running_var is not None else stats
        nbt = bn.num_batches_tracked if update else stats
        C = bn.num_features
        _bn_finalize_kernel[(C,)](
            part, bn.weight, rmean, rvar, nbt, stats,
            part_off, stat_off, P, HW, n_pblk, C,
            1.0 / count, count / max(count - 1, 1), bn.eps, float(bn.momentum) if update else 0.0,
            TILE=tile, PB=min(1024, triton.next_power_of_2(P)), BATCH_STATS=batch_stats, UPDATE=update,
            num_warps=4,
        )

    def forward(self, x):
        if x.dim() != 4 or x.dtype != torch.float32:
            raise ValueError("expected a 4-D float32 input")
        if self.stride != 1:
            raise NotImplementedError("only stride=1 is implemented")
        N, C_in, H, W = x.shape
        C = self.conv1.out_channels
        if C & (C - 1) != 0 or not 16 <= C <= 128:
            raise NotImplementedError("out_channels must be a power of two in [16, 128]")
        HW = H * W
        dev = x.device
        bn1, bn_d, bn2 = self.bn1, self.downsample[1], self.bn2
        bns = (bn1, bn_d, bn2)
        need_stats = any(bn.training or bn.running_mean is None for bn in bns)
        count = N * HW
        if need_stats and count <= 1:
            raise ValueError("Expected more than 1 value per channel when training")

        block_p = 128 if C <= 64 else 64
        n_pblk = triton.cdiv(HW, block_p)
        P = N * n_pblk
        sxn, sxc, sxh, sxw = x.stride()

        c1 = torch.empty((N, C, H, W), device=dev, dtype=torch.float32)
        out = torch.empty((N, C, H, W), device=dev, dtype=torch.float32)  # conv2 output, then final result
        wp = torch.empty((9 * C * C,), device=dev, dtype=torch.float32)
        stats = torch.empty((6 * C,), device=dev, dtype=torch.float32)  # [bn1 | bn_d | bn2] x (mean, a)
        part = torch.empty((6 * C * P,), device=dev, dtype=torch.float32) if need_stats else stats
        if P == 0:
            return out

        _pack_w3x3_kernel[(triton.cdiv(9 * C * C, 1024),)](self.conv2.weight, wp, C, C, BLOCK=1024, num_warps=4)

        _conv1_ds_kernel[(P,)](
            x, self.conv1.weight, self.downsample[0].weight, c1, part,
            H, W, HW, n_pblk, P, sxn, sxc, sxh, sxw,
            C_IN=C_in, C_OUT=C, BLOCK_P=block_p, COMPUTE_STATS=need_stats,
            num_warps=8,
        )
        CP = C * P
        self._finalize(bn1, part, 0, stats, 0, P, HW, n_pblk, count, block_p)
        self._finalize(bn_d, part, 2 * CP, stats, 2 * C, P, HW, n_pblk, count, block_p)

        block_k = min(32, C)
        _conv3x3_bnrelu_kernel[(P,)](
            c1, stats, bn1.bias, wp, out, part,
            H, W, HW, n_pblk, P, 4 * CP,
            C_IN=C, C_OUT=C, BLOCK_P=block_p, BLOCK_K=block_k, NUM_KB=C // block_k,
            COMPUTE_STATS=need_stats,
            num_warps=4, num_stages=2,
        )
        self._finalize(bn2, part, 4 * CP, stats, 4 * C, P, HW, n_pblk, count, block_p)

        _residual_kernel[(P,)](
            out, x, self.downsample[0].weight, stats, bn2.bias, bn_d.bias, out,
            W, HW, n_pblk, sxn, sxc, sxh, sxw,
            C_IN=C_in, C_OUT=C, BLOCK_P=block_p,
            num_warps=8,
        )
        return out
