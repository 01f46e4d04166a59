import torch
import torch.nn as nn
import triton
import triton.language as tl


# ----------------------------------------------------------------------------------------------
# Per-channel statistics (mean, M2) of a NCHW tensor, optionally fused with the time-embedding
# projection: t[n, c] = conv_bias[c] + proj_bias[c] + dot(silu(temb[n, :]), W[c, :]).
# The stored mean already includes the per-channel shift t (M2 is shift invariant).
# ----------------------------------------------------------------------------------------------
@triton.jit
def _chan_stats_kernel(
    x_ptr, stats_ptr, t_ptr,
    temb_ptr, w_ptr, tb_ptr, cb_ptr,
    C, HW, K, stride_temb_n, stride_w_c,
    BLOCK: tl.constexpr, BLOCK_K: tl.constexpr,
    HAS_TEMB: tl.constexpr, HAS_CB: tl.constexpr,
):
    pid = tl.program_id(0)  # n * C + c
    n = pid // C
    c = pid % C

    base = x_ptr + pid.to(tl.int64) * HW
    offs = tl.arange(0, BLOCK)
    s = tl.zeros([BLOCK], dtype=tl.float32)
    q = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, HW, BLOCK):
        idx = start + offs
        m = idx < HW
        v = tl.load(base + idx, mask=m, other=0.0).to(tl.float32)
        s += v
        q += v * v
    tot = tl.sum(s, axis=0)
    totq = tl.sum(q, axis=0)
    mean = tot / HW
    m2 = totq - tot * mean
    m2 = tl.maximum(m2, 0.0)

    t = tot * 0.0
    if HAS_CB:
        t += tl.load(cb_ptr + c).to(tl.float32)
    if HAS_TEMB:
        koffs = tl.arange(0, BLOCK_K)
        acc = tl.zeros([BLOCK_K], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + koffs
            km = kk < K
            tv = tl.load(temb_ptr + n * stride_temb_n + kk, mask=km, other=0.0).to(tl.float32)
            sv = tv * tl.sigmoid(tv)
            # the reference rounds silu(temb) to the activation dtype before the linear layer
            sv = sv.to(temb_ptr.dtype.element_ty).to(tl.float32)
            wv = tl.load(w_ptr + c * stride_w_c + kk, mask=km, other=0.0).to(tl.float32)
            acc += sv * wv
        t += tl.sum(acc, axis=0) + tl.load(tb_ptr + c).to(tl.float32)

    tl.store(t_ptr + pid, t)
    tl.store(stats_ptr + pid * 2, mean + t)
    tl.store(stats_ptr + pid * 2 + 1, m2)


# ----------------------------------------------------------------------------------------------
# GroupNorm apply (+ optional per-(n,c) additive shift before the norm) + SiLU.
# ----------------------------------------------------------------------------------------------
@triton.jit
def _gn_silu_kernel(
    x_ptr, stats_ptr, t_ptr, w_ptr, b_ptr, y_ptr,
    C, HW, CPG, eps, inv_cnt,
    BLOCK: tl.constexpr, GB: tl.constexpr, HAS_ADD: tl.constexpr,
):
    row = tl.program_id(0)  # n * C + c
    chunk = tl.program_id(1)
    c = row % C
    g0 = row - (c % CPG)

    goffs = tl.arange(0, GB)
    gm = goffs < CPG
    means = tl.load(stats_ptr + (g0 + goffs) * 2, mask=gm, other=0.0)
    m2s = tl.load(stats_ptr + (g0 + goffs) * 2 + 1, mask=gm, other=0.0)
    gmean = tl.sum(means, axis=0) / CPG
    d = tl.where(gm, means - gmean, 0.0)
    m2 = tl.sum(m2s, axis=0) + HW * tl.sum(d * d, axis=0)
    var = m2 * inv_cnt
    rstd = 1.0 / tl.sqrt(var + eps)

    gamma = tl.load(w_ptr + c).to(tl.float32)
    beta = tl.load(b_ptr + c).to(tl.float32)
    scale = gamma * rstd
    shift = beta - gmean * scale
    if HAS_ADD:
        shift += tl.load(t_ptr + row) * scale

    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    m = offs < HW
    base = row.to(tl.int64) * HW
    x = tl.load(x_ptr + base + offs, mask=m, other=0.0).to(tl.float32)
    y = x * scale + shift
    y = y * tl.sigmoid(y)
    tl.store(y_ptr + base + offs, y.to(y_ptr.dtype.element_ty), mask=m)


# ----------------------------------------------------------------------------------------------
# out = (residual + conv_out + bias[c]) / output_scale_factor
# ----------------------------------------------------------------------------------------------
@triton.jit
def _residual_kernel(
    x_ptr, h_ptr, b_ptr, out_ptr, C, HW, osf,
    BLOCK: tl.constexpr, HAS_BIAS: tl.constexpr,
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    c = row % C
    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    m = offs < HW
    base = row.to(tl.int64) * HW
    x = tl.load(x_ptr + base + offs, mask=m, other=0.0).to(tl.float32)
    h = tl.load(h_ptr + base + offs, mask=m, other=0.0).to(tl.float32)
    if HAS_BIAS:
        h += tl.load(b_ptr + c).to(tl.float32)
    y = (x + h) / osf
    tl.store(out_ptr + base + offs, y.to(out_ptr.dtype.element_ty), mask=m)


def _np2(v):
    return triton.next_power_of_2(int(v))


class ModelNew(nn.Module):
    def __init__(self, original):
        super().__init__()
        self.original = original
        assert original.upsample is None and original.downsample is None
        assert original.conv_shortcut is None
        assert original.time_embedding_norm == "default"

    def _stats(self, x, stats, tbuf, C, HW, temb=None, w=None, tb=None, cb=None):
        N = x.shape[0]
        BLOCK = min(4096, _np2(HW))
        has_temb = temb is not None
        has_cb = cb is not None
        K = w.shape[1] if has_temb else 1
        _chan_stats_kernel[(N * C,)](
            x, stats, tbuf,
            temb if has_temb else x,
            w if has_temb else x,
            tb if has_temb else x,
            cb if has_cb else x,
            C, HW, K,
            temb.stride(0) if has_temb else 0,
            w.stride(0) if has_temb else 0,
            BLOCK=BLOCK, BLOCK_K=512,
            HAS_TEMB=has_temb, HAS_CB=has_cb,
            num_warps=8,
        )

    def _gn_silu(self, x, stats, tbuf, norm, C, HW, has_add):
        N = x.shape[0]
        G = norm.num_groups
        CPG = C // G
        y = torch.empty_like(x)
        BLOCK = min(2048, _np2(HW))
        grid = (N * C, triton.cdiv(HW, BLOCK))
        _gn_silu_kernel[grid](
            x, stats, tbuf, norm.weight, norm.bias, y,
            C, HW, CPG, float(norm.eps), 1.0 / float(CPG * HW),
            BLOCK=BLOCK, GB=max(2, _np2(CPG)), HAS_ADD=has_add,
            num_warps=4,
        )
        return y

    def forward(self, input_tensor, temb, *args, **kwargs):
        o = self.original
        x = input_tensor
        if not x.is_contiguous():
            x = x.contiguous()
        N, C, H, W = x.shape
        HW = H * W
        dev = x.device

        # ---- norm1 + SiLU ----
        stats1 = torch.empty((N * C * 2,), device=dev, dtype=torch.float32)
        t1 = torch.empty((N * C,), device=dev, dtype=torch.float32)
        self._stats(x, stats1, t1, C, HW)
        h1 = self._gn_silu(x, stats1, t1, o.norm1, C, HW, False)

        # ---- conv1 (cuDNN, bias folded into our next kernels) ----
        c1 = torch.nn.functional.conv2d(
            h1, o.conv1.weight, None, o.conv1.stride, o.conv1.padding, o.conv1.dilation, o.conv1.groups
        )
        if not c1.is_contiguous():
            c1 = c1.contiguous()
        Co = c1.shape[1]
        HW1 = c1.shape[2] * c1.shape[3]

        # ---- temb projection + conv1 bias + norm2 stats ----
        stats2 = torch.empty((N * Co * 2,), device=dev, dtype=torch.float32)
        t2 = torch.empty((N * Co,), device=dev, dtype=torch.float32)
        use_temb = (o.time_emb_proj is not None) and (temb is not None)
        if use_temb:
            tmb = temb
            if tmb.stride(1) != 1:
                tmb = tmb.contiguous()
            self._stats(
                c1, stats2, t2, Co, HW1,
                temb=tmb, w=o.time_emb_proj.weight, tb=o.time_emb_proj.bias, cb=o.conv1.bias,
            )
        else:
            self._stats(c1, stats2, t2, Co, HW1, cb=o.conv1.bias)

        # ---- norm2 + SiLU (dropout is identity in eval) ----
        h2 = self._gn_silu(c1, stats2, t2, o.norm2, Co, HW1, True)

        # ---- conv2 (cuDNN) ----
        c2 = torch.nn.functional.conv2d(
            h2, o.conv2.weight, None, o.conv2.stride, o.conv2.padding, o.conv2.dilation, o.conv2.groups
        )
        if not c2.is_contiguous():
            c2 = c2.contiguous()
        C2 = c2.shape[1]
        HW2 = c2.shape[2] * c2.shape[3]

        # ---- residual + bias + scale ----
        out = torch.empty_like(c2)
        BLOCK = min(2048, _np2(HW2))
        grid = (N * C2, triton.cdiv(HW2, BLOCK))
        has_b2 = o.conv2.bias is not None
        _residual_kernel[grid](
            x, c2, o.conv2.bias if has_b2 else c2, out, C2, HW2, float(o.output_scale_factor),
            BLOCK=BLOCK, HAS_BIAS=has_b2, num_warps=4,
        )
        return out
