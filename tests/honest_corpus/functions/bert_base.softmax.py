"""Triton implementation of `torch.nn.functional.softmax(input, dim=None, _stacklevel=3, dtype=None)`.

Hot path (BERT-base attention probabilities): f16[32, 12, 512, 512], dim=-1. Every row of 512 halves fits in
registers, so one program loads BLOCK_ROWS full rows, computes max / exp / sum in fp32 and writes the row once:
one read and one write of the tensor, one launch. Launch plans are cached per (shape, stride, dtype, dim, dtype=).
"""

import math

import torch
import triton
import triton.language as tl

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_MAX_SINGLE_PASS_COLS = 8192  # rows up to this length are held entirely in registers
_LOOP_BLOCK = 4096


@triton.jit
def _softmax_rows_kernel(
    x_ptr,
    out_ptr,
    n_rows,
    n_cols,
    x_row_stride,
    x_col_stride,
    out_row_stride,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_COLS: tl.constexpr,
    EVEN: tl.constexpr,
):
    # BLOCK_ROWS complete rows per program; the whole row lives in registers (single pass).
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.arange(0, BLOCK_COLS)
    rows64 = rows.to(tl.int64)
    x_ptrs = x_ptr + rows64[:, None] * x_row_stride + cols[None, :] * x_col_stride
    o_ptrs = out_ptr + rows64[:, None] * out_row_stride + cols[None, :]
    if EVEN:
        x = tl.load(x_ptrs, eviction_policy="evict_first")
    else:
        mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
        x = tl.load(x_ptrs, mask=mask, other=float("-inf"), eviction_policy="evict_first")
    # `dtype=` semantics: PyTorch casts the input to the output dtype first (no-op when they agree);
    # the arithmetic itself is always fp32.
    x = x.to(out_ptr.dtype.element_ty).to(tl.float32)
    row_max = tl.max(x, axis=1)
    e = tl.exp(x - row_max[:, None])
    denom = tl.sum(e, axis=1)
    y = (e / denom[:, None]).to(out_ptr.dtype.element_ty)
    if EVEN:
        tl.store(o_ptrs, y)
    else:
        tl.store(o_ptrs, y, mask=mask)


@triton.jit
def _softmax_rows_looped_kernel(
    x_ptr,
    out_ptr,
    n_cols,
    x_row_stride,
    x_col_stride,
    out_row_stride,
    BLOCK: tl.constexpr,
):
    # One program per (long) row: pass 1 keeps a per-lane online (max, sum), pass 2 writes the output.
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    o_row = out_ptr + row * out_row_stride
    offs = tl.arange(0, BLOCK)
    m = tl.full([BLOCK], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + offs
        x = tl.load(x_row + cols * x_col_stride, mask=cols < n_cols, other=float("-inf"))
        x = x.to(out_ptr.dtype.element_ty).to(tl.float32)
        m_new = tl.maximum(m, x)
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # avoids (-inf) - (-inf)
        s = s * tl.exp(m - m_ref) + tl.exp(x - m_ref)
        m = m_new
    row_max = tl.max(m, axis=0)
    max_ref = tl.where(row_max == float("-inf"), 0.0, row_max)
    denom = tl.sum(s * tl.exp(m - max_ref), axis=0)
    for start in range(0, n_cols, BLOCK):
        cols = start + offs
        mask = cols < n_cols
        x = tl.load(x_row + cols * x_col_stride, mask=mask, other=float("-inf"))
        x = x.to(out_ptr.dtype.element_ty).to(tl.float32)
        y = tl.exp(x - row_max) / denom
        tl.store(o_row + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_inner_kernel(
    x_ptr,
    out_ptr,
    n,
    inner,
    BLOCK_N: tl.constexpr,
    BLOCK_INNER: tl.constexpr,
):
    # Softmax over a non-last dim of a contiguous tensor seen as (outer, n, inner): each program owns
    # BLOCK_INNER unit-stride columns of one outer slice and reduces over n.
    outer = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_INNER + tl.arange(0, BLOCK_INNER)
    cmask = cols < inner
    base = outer * n * inner
    rn = tl.arange(0, BLOCK_N)
    m = tl.full([BLOCK_N, BLOCK_INNER], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK_N, BLOCK_INNER], dtype=tl.float32)
    for start in range(0, n, BLOCK_N):
        r = start + rn
        mask = (r < n)[:, None] & cmask[None, :]
        offs = base + r[:, None] * inner + cols[None, :]
        x = tl.load(x_ptr + offs, mask=mask, other=float("-inf"))
        x = x.to(out_ptr.dtype.element_ty).to(tl.float32)
        m_new = tl.maximum(m, x)
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        s = s * tl.exp(m - m_ref) + tl.exp(x - m_ref)
        m = m_new
    col_max = tl.max(m, axis=0)
    max_ref = tl.where(col_max == float("-inf"), 0.0, col_max)
    denom = tl.sum(s * tl.exp(m - max_ref[None, :]), axis=0)
    for start in range(0, n, BLOCK_N):
        r = start + rn
        mask = (r < n)[:, None] & cmask[None, :]
        offs = base + r[:, None] * inner + cols[None, :]
        x = tl.load(x_ptr + offs, mask=mask, other=float("-inf"))
        x = x.to(out_ptr.dtype.element_ty).to(tl.float32)
        y = tl.exp(x - col_max[None, :]) / denom[None, :]
        tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def _leading_row_stride(shape, strides):
    """Stride between consecutive rows when all dims but the last flatten into one, else None."""
    lead = [(s, st) for s, st in zip(shape[:-1], strides[:-1]) if s != 1]
    if not lead:
        return 0
    for (_, st_outer), (s_inner, st_inner) in zip(lead[:-1], lead[1:]):
        if st_outer != st_inner * s_inner:
            return None
    return lead[-1][1]


def _rows_launcher(n_rows, n_cols, row_stride, col_stride):
    if n_cols <= _MAX_SINGLE_PASS_COLS:
        block_cols = triton.next_power_of_2(n_cols)
        block_rows = max(1, min(2048 // block_cols, triton.next_power_of_2(n_rows)))
        num_warps = max(1, min(16, (block_rows * block_cols) // 512))
        even = (n_rows % block_rows == 0) and (n_cols == block_cols)
        grid = (triton.cdiv(n_rows, block_rows),)
        kernel = _softmax_rows_kernel[grid]

        def launch(x, out):
            kernel(
                x, out, n_rows, n_cols, row_stride, col_stride, n_cols,
                BLOCK_ROWS=block_rows, BLOCK_COLS=block_cols, EVEN=even, num_warps=num_warps,
            )

        return launch

    grid = (n_rows,)
    kernel = _softmax_rows_looped_kernel[grid]

    def launch(x, out):
        kernel(x, out, n_cols, row_stride, col_stride, n_cols, BLOCK=_LOOP_BLOCK, num_warps=8)

    return launch


def _inner_launcher(outer, n, inner):
    block_inner = min(128, triton.next_power_of_2(inner))
    block_n = max(1, min(triton.next_power_of_2(n), 2048 // block_inner))
    grid = (outer, triton.cdiv(inner, block_inner))
    kernel = _softmax_inner_kernel[grid]

    def launch(x, out):
        kernel(x, out, n, inner, BLOCK_N=block_n, BLOCK_INNER=block_inner, num_warps=4)

    return launch


def _build_plan(input, dim, dtype):
    shape = tuple(input.shape)
    strides = tuple(input.stride())
    ndim = len(shape)
    if dim is None:  # legacy implicit dim, as torch.nn.functional._get_softmax_dim
        dim = 0 if ndim in (0, 1, 3) else 1
    rank = max(ndim, 1)
    if not -rank <= dim < rank:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-rank}, {rank - 1}], but got {dim})")
    dim %= rank
    out_dtype = input.dtype if dtype is None else dtype
    if input.dtype not in _FLOAT_DTYPES or out_dtype not in _FLOAT_DTYPES:
        raise TypeError(f"softmax kernel supports fp16/bf16/fp32, got {input.dtype} -> {out_dtype}")
    numel = math.prod(shape)
    if numel == 0:
        return out_dtype, None
    if ndim == 0:
        return out_dtype, _rows_launcher(1, 1, 0, 0)
    n = shape[dim]
    if dim == ndim - 1:
        row_stride = _leading_row_stride(shape, strides)
        if row_stride is not None:
            return out_dtype, _rows_launcher(numel // n, n, row_stride, strides[-1])
    elif input.is_contiguous():
        return out_dtype, _inner_launcher(math.prod(shape[:dim]), n, math.prod(shape[dim + 1:]))
    raise ValueError(f"softmax kernel: unsupported layout shape={shape} stride={strides} dim={dim}")


_PLANS = {}


def kernel_function(input, dim=None, _stacklevel=3, dtype=None):
    key = (input.shape, input.stride(), input.dtype, dim, dtype)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _build_plan(input, dim, dtype)
        _PLANS[key] = plan
    out_dtype, launch = plan
    out = torch.empty(input.shape, dtype=out_dtype, device=input.device)
    if launch is not None:
        launch(input, out)
    return out
