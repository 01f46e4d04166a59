"""Triton kernels for `torch.nn.functional.rms_norm(input, normalized_shape, weight=None, eps=None)`.

y = x * rsqrt(mean(x^2) + eps) * weight over the trailing `normalized_shape` dims. Statistics and the scaling are
computed in fp32 and rounded once to the output dtype. For rows that fit in registers (the llama3 case: 4096 bf16
columns) one program handles one row in a single pass over memory; wider rows use a looped two-pass kernel.
"""

import torch
import triton
import triton.language as tl

_FP32_EPS = 1.1920928955078125e-07  # torch.finfo(torch.float32).eps
_MAX_SINGLE_BLOCK = 16384


@triton.jit
def _rms_norm_row_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    n_cols,
    x_row_stride,
    out_row_stride,
    eps,
    BLOCK_N: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    EVEN_N: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    x_row = x_ptr + row * x_row_stride
    o_row = out_ptr + row * out_row_stride

    if EVEN_N:
        x = tl.load(x_row + cols, eviction_policy="evict_first").to(tl.float32)
    else:
        mask = cols < n_cols
        x = tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)

    ms = tl.sum(x * x, axis=0) / n_cols
    rstd = tl.math.rsqrt(ms + eps)
    y = x * rstd
    if HAS_WEIGHT:
        if EVEN_N:
            w = tl.load(w_ptr + cols, eviction_policy="evict_last").to(tl.float32)
        else:
            w = tl.load(w_ptr + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        y = y * w
    y = y.to(out_ptr.dtype.element_ty)

    if EVEN_N:
        tl.store(o_row + cols, y)
    else:
        tl.store(o_row + cols, y, mask=mask)


@triton.jit
def _rms_norm_looped_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    n_cols,
    x_row_stride,
    out_row_stride,
    eps,
    BLOCK_N: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    o_row = out_ptr + row * out_row_stride
    offs = tl.arange(0, BLOCK_N)

    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + offs
        mask = cols < n_cols
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        acc += x * x
    rstd = tl.math.rsqrt(tl.sum(acc, axis=0) / n_cols + eps)

    for start in range(0, n_cols, BLOCK_N):
        cols = start + offs
        mask = cols < n_cols
        x = tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        y = x * rstd
        if HAS_WEIGHT:
            w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
            y = y * w
        tl.store(o_row + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


_META = {}


def _build_meta(input, normalized_shape, weight):
    nd = len(normalized_shape)
    if nd == 0 or input.dim() < nd or tuple(input.shape[input.dim() - nd:]) != normalized_shape:
        raise ValueError(
            f"rms_norm: normalized_shape {normalized_shape} does not match input shape {tuple(input.shape)}"
        )
    n_cols = 1
    for s in normalized_shape:
        n_cols *= s
    n_rows = input.numel() // n_cols if n_cols > 0 else 0

    if input.is_contiguous():
        x_row_stride = n_cols
    elif input.dim() == 2 and nd == 1 and input.stride(1) == 1:
        x_row_stride = input.stride(0)
    else:
        raise ValueError(f"rms_norm: unsupported layout shape={tuple(input.shape)} stride={input.stride()}")

    if weight is not None:
        if tuple(weight.shape) != normalized_shape or not weight.is_contiguous():
            raise ValueError("rms_norm: weight must be contiguous with shape == normalized_shape")
        out_dtype = torch.promote_types(input.dtype, weight.dtype)
    else:
        out_dtype = input.dtype

    block_n = triton.next_power_of_2(max(n_cols, 1))
    if block_n <= _MAX_SINGLE_BLOCK:
        single = True
        # ~8 elements (16 bytes of bf16/fp16) per thread per load.
        num_warps = max(1, min(16, block_n // 512))
    else:
        single = False
        block_n = 4096
        num_warps = 8
    return (n_rows, n_cols, x_row_stride, out_dtype, block_n, num_warps, single, n_cols == block_n)


def kernel_function(input, normalized_shape, weight=None, eps=None):
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    else:
        normalized_shape = tuple(normalized_shape)
    key = (
        input.shape,
        input.stride(),
        input.dtype,
        normalized_shape,
        None if weight is None else (weight.shape, weight.stride(), weight.dtype),
    )
    meta = _META.get(key)
    if meta is None:
        meta = _build_meta(input, normalized_shape, weight)
        _META[key] = meta
    n_rows, n_cols, x_row_stride, out_dtype, block_n, num_warps, single, even_n = meta

    out = torch.empty(input.shape, dtype=out_dtype, device=input.device)
    if n_rows == 0 or n_cols == 0:
        return out
    eps_val = _FP32_EPS if eps is None else float(eps)
    has_weight = weight is not None
    w_arg = weight if has_weight else input  # dummy pointer, never read when HAS_WEIGHT=False

    if single:
        _rms_norm_row_kernel[(n_rows,)](
            input,
            w_arg,
            out,
            n_cols,
            x_row_stride,
            n_cols,
            eps_val,
            BLOCK_N=block_n,
            HAS_WEIGHT=has_weight,
            EVEN_N=even_n,
            num_warps=num_warps,
        )
    else:
        _rms_norm_looped_kernel[(n_rows,)](
            input,
            w_arg,
            out,
            n_cols,
            x_row_stride,
            n_cols,
            eps_val,
            BLOCK_N=block_n,
            HAS_WEIGHT=has_weight,
            num_warps=num_warps,
        )
    return out
