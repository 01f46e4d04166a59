"""Triton LayerNorm forward for `torch.nn.functional.layer_norm`.

Target call (BERT-base): fp16 [32, 512, 768], normalized_shape=(768,), fp16 weight/bias, eps=1e-12.

Design:
- The input is seen as [n_rows, n_cols] (no copy). One program normalises BLOCK_ROWS full rows held in registers
  ([4, 1024] tile for n_cols=768, masked to 768 columns), so every byte is read once and written once.
- Statistics are computed in fp32 with the two-pass formula on the register tile: mean first, then the sum of
  squared deviations. This is as accurate as PyTorch's Welford and costs no extra memory traffic.
- y = (x - mean) * rstd * w + b is evaluated in fp32 and rounded once to the output dtype.
- Launch parameters are cached per (shape, strides, normalized_shape, dtype, affine flags), so the wrapper does
  one dict lookup, one allocation and one launch.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _layer_norm_fwd_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    n_rows,
    n_cols,
    x_row_stride,
    y_row_stride,
    eps,
    HAS_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.arange(0, BLOCK_N)
    row_mask = rows < n_rows
    col_mask = cols < n_cols
    mask = row_mask[:, None] & col_mask[None, :]
    rows64 = rows.to(tl.int64)

    x = tl.load(x_ptr + rows64[:, None] * x_row_stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)

    # fp32 statistics, biased variance, eps inside the sqrt.
    mean = tl.sum(x, axis=1) / n_cols
    xc = tl.where(mask, x - mean[:, None], 0.0)
    var = tl.sum(xc * xc, axis=1) / n_cols
    rstd = 1.0 / tl.sqrt(var + eps)

    y = xc * rstd[:, None]
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
        y = y * w[None, :]
    if HAS_BIAS:
        b = tl.load(b_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
        y = y + b[None, :]

    tl.store(y_ptr + rows64[:, None] * y_row_stride + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


_CONFIGS = {}

_MAX_BLOCK_N = 32768


def _collapse_rows(x, n_norm_dims, n_cols):
    """(n_rows, row_stride) of `x` seen as [n_rows, n_cols] with dense, unit-stride rows, without copying."""
    if x.is_contiguous():
        return x.numel() // n_cols, n_cols
    shape, stride = x.shape, x.stride()
    lead = x.dim() - n_norm_dims
    # The normalised dims must form one dense, unit-stride block.
    expected = 1
    for i in range(x.dim() - 1, lead - 1, -1):
        if shape[i] != 1 and stride[i] != expected:
            raise ValueError(
                f"layer_norm kernel: normalised dims must be dense, got shape={tuple(shape)} stride={tuple(stride)}"
            )
        expected *= shape[i]
    # The leading dims must collapse into a single row stride.
    n_rows = 1
    row_stride = n_cols
    outer_expected = None
    for i in range(lead - 1, -1, -1):
        if shape[i] == 1:
            continue
        if outer_expected is None:
            row_stride = stride[i]
        elif stride[i] != outer_expected:
            raise ValueError(
                f"layer_norm kernel: leading dims do not collapse, shape={tuple(shape)} stride={tuple(stride)}"
            )
        n_rows *= shape[i]
        outer_expected = stride[i] * shape[i]
    return n_rows, row_stride


def _build_config(input, normalized_shape, weight, bias):
    n_norm = len(normalized_shape)
    if n_norm == 0 or n_norm > input.dim() or tuple(input.shape[input.dim() - n_norm:]) != normalized_shape:
        raise ValueError(
            f"layer_norm: normalized_shape {normalized_shape} does not match input shape {tuple(input.shape)}"
        )
    n_cols = 1
    for s in normalized_shape:
        n_cols *= s
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and (t.numel() != n_cols or not t.is_contiguous()):
            raise ValueError(f"layer_norm kernel: {name} must be contiguous with {n_cols} elements")
    if input.numel() == 0:
        return None
    n_rows, row_stride = _collapse_rows(input, n_norm, n_cols)

    block_n = triton.next_power_of_2(n_cols)
    if block_n > _MAX_BLOCK_N:
        raise ValueError(f"layer_norm kernel: rows of {n_cols} elements are not supported")
    # Aim for ~4096-element tiles: 4 rows x 1024 columns for n_cols=768.
    block_rows = max(1, min(16, 4096 // block_n, triton.next_power_of_2(n_rows)))
    tile = block_rows * block_n
    if tile <= 2048:
        num_warps = 4
    elif tile <= 8192:
        num_warps = 8
    else:
        num_warps = 16
    grid = (triton.cdiv(n_rows, block_rows),)
    return (n_rows, n_cols, row_stride, block_rows, block_n, num_warps, grid)


def kernel_function(input, normalized_shape, weight=None, bias=None, eps=1e-05):
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    elif not isinstance(normalized_shape, tuple):
        normalized_shape = tuple(normalized_shape)
    has_w = weight is not None
    has_b = bias is not None
    key = (input.shape, input.stride(), normalized_shape, input.dtype, has_w, has_b)
    cfg = _CONFIGS.get(key, False)
    if cfg is False:
        cfg = _build_config(input, normalized_shape, weight, bias)
        _CONFIGS[key] = cfg

    out = torch.empty(input.shape, dtype=input.dtype, device=input.device)
    if cfg is None:  # empty input
        return out
    n_rows, n_cols, row_stride, block_rows, block_n, num_warps, grid = cfg
    _layer_norm_fwd_kernel[grid](
        input,
        weight if has_w else input,
        bias if has_b else input,
        out,
        n_rows,
        n_cols,
        row_stride,
        n_cols,
        eps,
        HAS_WEIGHT=has_w,
        HAS_BIAS=has_b,
        BLOCK_ROWS=block_rows,
        BLOCK_N=block_n,
        num_warps=num_warps,
    )
    return out
