"""Triton implementation of `torch.nn.functional.cross_entropy` for class-index targets.

Launch 1 (`_ce_row_kernel`): one program per row streams the logits once with a per-lane online log-sum-exp
(one exponential per element, no cross-lane reductions inside the loop), merges the lanes, gathers x[target] and
writes the per-row loss  w[y] * (logsumexp(x) - x[y])  (0 for ignored targets) plus the per-row weight.
Launch 2 (`_ce_reduce_kernel`): one program reduces the per-row values deterministically ('sum' / 'mean').
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _ce_row_kernel(
    x_ptr,
    tgt_ptr,
    w_ptr,
    loss_ptr,
    wsum_ptr,
    C,
    x_row_stride,
    x_col_stride,
    tgt_stride,
    ignore_index,
    HAS_WEIGHT: tl.constexpr,
    STORE_WSUM: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    row_ptr = x_ptr + row * x_row_stride
    offs = tl.arange(0, BLOCK)

    # Per-lane online logsumexp state: m = running max, s = sum of exp(x - m).
    m = tl.full([BLOCK], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK], dtype=tl.float32)

    n_full = C // BLOCK
    for i in range(0, n_full):
        cols = i * BLOCK + offs
        x = tl.load(row_ptr + cols * x_col_stride, eviction_policy="evict_first").to(tl.float32)
        d = x - m
        # exactly one of exp(m - x), exp(x - m) is needed: e = exp(-|x - m|)
        e = tl.exp2(-tl.abs(d) * 1.4426950408889634)
        s = tl.where(d > 0, s * e + 1.0, s + e)
        m = tl.maximum(m, x)

    tail = n_full * BLOCK
    if tail < C:
        cols = tail + offs
        mask = cols < C
        x = tl.load(
            row_ptr + cols * x_col_stride, mask=mask, other=float("-inf"), eviction_policy="evict_first"
        ).to(tl.float32)
        d = x - m
        e = tl.exp2(-tl.abs(d) * 1.4426950408889634)
        s = tl.where(mask, tl.where(d > 0, s * e + 1.0, s + e), s)
        m = tl.where(mask, tl.maximum(m, x), m)

    # Merge lanes (lanes that never saw an element have m = -inf, s = 0 and contribute 0).
    row_max = tl.max(m, axis=0)
    row_sum = tl.sum(s * tl.exp2((m - row_max) * 1.4426950408889634), axis=0)

    t = tl.load(tgt_ptr + row * tgt_stride)
    valid = t != ignore_index
    t_safe = tl.where(valid, t, 0)
    x_t = tl.load(row_ptr + t_safe * x_col_stride).to(tl.float32)
    nll = (row_max - x_t) + tl.log(row_sum)  # = logsumexp(x) - x[t] = -log_softmax(x)[t]

    if HAS_WEIGHT:
        w = tl.load(w_ptr + t_safe).to(tl.float32)
        w = tl.where(valid, w, 0.0)
        loss = tl.where(valid, nll * w, 0.0)
    else:
        w = tl.where(valid, 1.0, 0.0)
        loss = tl.where(valid, nll, 0.0)

    tl.store(loss_ptr + row, loss.to(loss_ptr.dtype.element_ty))
    if STORE_WSUM:
        tl.store(wsum_ptr + row, w)


@triton.jit
def _ce_reduce_kernel(loss_ptr, wsum_ptr, out_ptr, N, MEAN: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    wacc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, N, BLOCK):
        idx = start + offs
        mask = idx < N
        acc += tl.load(loss_ptr + idx, mask=mask, other=0.0)
        if MEAN:
            wacc += tl.load(wsum_ptr + idx, mask=mask, other=0.0)
    total = tl.sum(acc, axis=0)
    if MEAN:
        total = total / tl.sum(wacc, axis=0)  # 0/0 -> nan when every target is ignored, as in PyTorch
    tl.store(out_ptr, total.to(out_ptr.dtype.element_ty))


_CONFIGS = {}


def _config(n_rows, n_cols):
    key = (n_rows, n_cols)
    cfg = _CONFIGS.get(key)
    if cfg is None:
        block = min(4096, max(128, triton.next_power_of_2(n_cols)))
        warps = 8 if block >= 2048 else 4
        rblock = min(4096, max(128, triton.next_power_of_2(max(n_rows, 1))))
        cfg = (block, warps, rblock)
        _CONFIGS[key] = cfg
    return cfg


def _legacy_reduction(size_average, reduce):
    size_average = True if size_average is None else size_average
    reduce = True if reduce is None else reduce
    if size_average and reduce:
        return "mean"
    if reduce:
        return "sum"
    return "none"


def kernel_function(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                    reduction='mean', label_smoothing=0.0):
    if size_average is not None or reduce is not None:
        reduction = _legacy_reduction(size_average, reduce)
    if label_smoothing != 0.0:
        raise NotImplementedError("cross_entropy kernel: label_smoothing is not supported")
    if target.dtype.is_floating_point:
        raise NotImplementedError("cross_entropy kernel: probability targets are not supported")

    if input.dim() == 2:
        n_rows, n_cols = input.shape
        x_rs, x_cs = input.stride()
        t_s = target.stride(0)
    elif input.dim() == 1:
        n_rows, n_cols = 1, input.shape[0]
        x_rs, x_cs = 0, input.stride(0)
        t_s = 0
    else:
        raise NotImplementedError("cross_entropy kernel: only [N, C] and [C] inputs are supported")

    block, warps, rblock = _config(n_rows, n_cols)
    has_weight = weight is not None
    w_arg = weight if has_weight else input
    dev = input.device

    if reduction == "none":
        out = torch.empty(target.shape, dtype=input.dtype, device=dev)
        _ce_row_kernel[(n_rows,)](
            input, target, w_arg, out, out, n_cols, x_rs, x_cs, t_s, ignore_index,
            HAS_WEIGHT=has_weight, STORE_WSUM=False, BLOCK=block, num_warps=warps,
        )
        return out

    mean = reduction == "mean"
    if not mean and reduction != "sum":
        raise ValueError(f"{reduction} is not a valid value for reduction")

    loss_rows = torch.empty((n_rows,), dtype=torch.float32, device=dev)
    wsum_rows = torch.empty((n_rows,), dtype=torch.float32, device=dev) if mean else loss_rows
    _ce_row_kernel[(n_rows,)](
        input, target, w_arg, loss_rows, wsum_rows, n_cols, x_rs, x_cs, t_s, ignore_index,
        HAS_WEIGHT=has_weight, STORE_WSUM=mean, BLOCK=block, num_warps=warps,
    )
    out = torch.empty((), dtype=input.dtype, device=dev)
    _ce_reduce_kernel[(1,)](loss_rows, wsum_rows, out, n_rows, MEAN=mean, BLOCK=rblock, num_warps=4)
    return out
