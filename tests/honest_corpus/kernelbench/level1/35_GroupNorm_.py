"""ModelNew for KernelBench 35_GroupNorm_: nn.GroupNorm forward with two Triton kernels.

  1. _gn_stats_kernel  : grid (N*G, SPLIT). Chunk-wise Welford (mean, M2, count) partials per group.
  2. _gn_apply_kernel  : grid (N*C, HW chunks). Merge the SPLIT partials (Chan's formula) -> mean, rstd;
                         y = x * (rstd * w[c]) + (b[c] - mean * rstd * w[c]).
All statistics are fp32; the input is read twice and the output written once (the minimum for groups that do not
fit on chip).
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _gn_stats_kernel(
    x_ptr, part_ptr, group_size, chunk_len,
    SPLIT: tl.constexpr, BLOCK: tl.constexpr, EVEN: tl.constexpr,
):
    grp = tl.program_id(0)
    s = tl.program_id(1)
    start = s * chunk_len
    length = tl.maximum(tl.minimum(chunk_len, group_size - start), 0)
    base = x_ptr + grp.to(tl.int64) * group_size + start
    offs = tl.arange(0, BLOCK)

    # Per-lane Welford; all lanes share the same count in the full-block loop, so 1/k is a scalar.
    mean = tl.zeros([BLOCK], dtype=tl.float32)
    m2 = tl.zeros([BLOCK], dtype=tl.float32)
    n_full = length // BLOCK
    for it in range(0, n_full):
        x = tl.load(base + it * BLOCK + offs).to(tl.float32)
        inv_k = 1.0 / (it + 1).to(tl.float32)
        delta = x - mean
        mean += delta * inv_k
        m2 += delta * (x - mean)
    cnt = tl.zeros([BLOCK], dtype=tl.float32) + n_full.to(tl.float32)

    if not EVEN:
        idx = n_full * BLOCK + offs
        tmask = idx < length
        x = tl.load(base + idx, mask=tmask, other=0.0).to(tl.float32)
        cnt_new = tl.where(tmask, cnt + 1.0, cnt)
        delta = x - mean
        mean_new = tl.where(tmask, mean + delta / tl.maximum(cnt_new, 1.0), mean)
        m2 = tl.where(tmask, m2 + delta * (x - mean_new), m2)
        mean = mean_new
        cnt = cnt_new

    # Merge lanes (Chan): M2 = sum(M2_l) + sum(n_l * (mean_l - mean)^2).
    n = tl.sum(cnt, 0)
    cmean = tl.sum(cnt * mean, 0) / tl.maximum(n, 1.0)
    dm = mean - cmean
    cm2 = tl.sum(m2, 0) + tl.sum(cnt * dm * dm, 0)
    p = part_ptr + (grp * SPLIT + s) * 3
    tl.store(p, cmean)
    tl.store(p + 1, cm2)
    tl.store(p + 2, n)


@triton.jit
def _gn_apply_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, part_ptr,
    C, HW, G, CPG, span, eps,
    SPLIT: tl.constexpr, BLOCK: tl.constexpr, EVEN: tl.constexpr,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr,
):
    nc = tl.program_id(0)
    j = tl.program_id(1)
    n = nc // C
    c = nc - n * C
    grp = n * G + c // CPG

    # Merge the SPLIT chunk partials of this group.
    sidx = tl.arange(0, SPLIT)
    pp = part_ptr + (grp * SPLIT + sidx) * 3
    pmean = tl.load(pp)
    pm2 = tl.load(pp + 1)
    pcnt = tl.load(pp + 2)
    tot = tl.sum(pcnt, 0)
    mean = tl.sum(pcnt * pmean, 0) / tot
    dm = pmean - mean
    var = (tl.sum(pm2, 0) + tl.sum(pcnt * dm * dm, 0)) / tot  # biased variance
    rstd = tl.rsqrt(var + eps)

    if HAS_W:
        w = tl.load(w_ptr + c).to(tl.float32)
    else:
        w = 1.0
    if HAS_B:
        b = tl.load(b_ptr + c).to(tl.float32)
    else:
        b = 0.0
    scale = rstd * w
    shift = b - mean * scale

    start = j * span
    base = nc.to(tl.int64) * HW + start
    xb = x_ptr + base
    yb = y_ptr + base
    offs = tl.arange(0, BLOCK)
    if EVEN:
        for i in range(0, span, BLOCK):
            x = tl.load(xb + i + offs).to(tl.float32)
            tl.store(yb + i + offs, (x * scale + shift).to(y_ptr.dtype.element_ty))
    else:
        length = tl.minimum(span, HW - start)
        for i in range(0, length, BLOCK):
            idx = i + offs
            m = idx < length
            x = tl.load(xb + idx, mask=m, other=0.0).to(tl.float32)
            tl.store(yb + idx, (x * scale + shift).to(y_ptr.dtype.element_ty), mask=m)


_STATS_BLOCK = 4096
_APPLY_BLOCK = 4096
_CONFIGS = {}


def _make_config(shape, num_groups):
    N, C = shape[0], shape[1]
    HW = 1
    for s in shape[2:]:
        HW *= s
    G = num_groups
    CPG = C // G
    GS = CPG * HW
    if GS >= 2**31 or HW >= 2**31:
        raise ValueError("group norm kernel: groups of 2**31 elements or more are not supported")

    sblock = min(_STATS_BLOCK, max(16, triton.next_power_of_2(GS)))
    split = 1
    while split < 32 and GS // (split * 2) >= 16 * sblock:
        split *= 2
    if GS % (split * sblock) == 0:
        chunk_len = GS // split
        even_stats = True
    else:
        chunk_len = triton.cdiv(triton.cdiv(GS, split), sblock) * sblock
        even_stats = False

    ablock = min(_APPLY_BLOCK, max(16, triton.next_power_of_2(HW)))
    span = min(HW, 8 * ablock)
    span = triton.cdiv(span, ablock) * ablock
    even_apply = (HW % span == 0)

    cfg = dict(
        NG=N * G, C=C, HW=HW, G=G, CPG=CPG, GS=GS,
        split=split, chunk_len=chunk_len,
        stats_grid=(N * G, split),
        stats_meta=dict(SPLIT=split, BLOCK=sblock, EVEN=even_stats, num_warps=8),
        span=span,
        apply_grid=(N * C, triton.cdiv(HW, span)),
        apply_meta=dict(SPLIT=split, BLOCK=ablock, EVEN=even_apply, num_warps=8),
    )
    return cfg


class ModelNew(nn.Module):
    """
    Group Normalization with Triton kernels (same parameters as the reference nn.GroupNorm).
    """

    def __init__(self, num_features: int, num_groups: int):
        super(ModelNew, self).__init__()
        self.gn = nn.GroupNorm(num_groups=num_groups, num_channels=num_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gn = self.gn
        if x.dim() < 2 or x.shape[1] != gn.num_channels:
            raise ValueError(f"group norm: expected input [N, {gn.num_channels}, *], got {tuple(x.shape)}")
        if not x.is_contiguous():
            raise ValueError(f"group norm kernel: expected a contiguous input, got stride {x.stride()}")
        key = (x.shape, gn.num_groups)
        cfg = _CONFIGS.get(key)
        if cfg is None:
            cfg = _make_config(x.shape, gn.num_groups)
            _CONFIGS[key] = cfg

        out = torch.empty_like(x)
        if x.numel() == 0:
            return out
        part = torch.empty((cfg["NG"] * cfg["split"] * 3,), dtype=torch.float32, device=x.device)

        weight = gn.weight
        bias = gn.bias
        has_w = weight is not None
        has_b = bias is not None

        _gn_stats_kernel[cfg["stats_grid"]](
            x, part, cfg["GS"], cfg["chunk_len"], **cfg["stats_meta"]
        )
        _gn_apply_kernel[cfg["apply_grid"]](
            x,
            weight if has_w else x,
            bias if has_b else x,
            out,
            part,
            cfg["C"], cfg["HW"], cfg["G"], cfg["CPG"], cfg["span"], gn.eps,
            HAS_W=has_w, HAS_B=has_b,
            **cfg["apply_meta"],
        )
        return out
