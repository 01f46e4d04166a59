"""ModelNew for 23_Softmax: torch.softmax(x, dim=1) on a (4096, 393216) float32 tensor with Triton kernels.

Long rows (> 8192): split-row softmax.
  _chunk_stats_kernel:     program = (row, chunk of BLOCK cols) -> chunk max m_j and s_j = sum(exp(x - m_j))
  _chunk_normalize_kernel: program = (row, chunk): M = max_j m_j, S = sum_j s_j * exp(m_j - M),
                           out = exp(x - M) / S
Short rows: one program holds whole rows in registers (single pass).
All arithmetic in fp32.
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl

_SINGLE_PASS_MAX_COLS = 8192
_CHUNK = 16384


@triton.jit
def _softmax_rows_kernel(
    x_ptr, out_ptr, n_rows, n_cols, x_row_stride, x_col_stride, out_row_stride,
    BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.arange(0, BLOCK_COLS)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    rows64 = rows.to(tl.int64)
    x = tl.load(x_ptr + rows64[:, None] * x_row_stride + cols[None, :] * x_col_stride,
                mask=mask, other=float("-inf")).to(tl.float32)
    row_max = tl.max(x, axis=1)
    e = tl.exp(x - row_max[:, None])
    y = e / tl.sum(e, axis=1)[:, None]
    tl.store(out_ptr + rows64[:, None] * out_row_stride + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _chunk_stats_kernel(
    x_ptr, pmax_ptr, psum_ptr, n_cols, n_chunks, x_row_stride, x_col_stride,
    BLOCK: tl.constexpr, EVEN: tl.constexpr,
):
    pid = tl.program_id(0)
    row = pid // n_chunks
    chunk = pid - row * n_chunks
    cols = chunk * BLOCK + tl.arange(0, BLOCK)
    ptrs = x_ptr + row.to(tl.int64) * x_row_stride + cols * x_col_stride
    if EVEN:
        x = tl.load(ptrs)
    else:
        x = tl.load(ptrs, mask=cols < n_cols, other=float("-inf"))
    x = x.to(tl.float32)
    m = tl.max(x, axis=0)
    m_ref = tl.where(m == float("-inf"), 0.0, m)  # an all -inf chunk contributes s = 0, not NaN
    s = tl.sum(tl.exp(x - m_ref), axis=0)
    tl.store(pmax_ptr + pid, m)
    tl.store(psum_ptr + pid, s)


@triton.jit
def _chunk_normalize_kernel(
    x_ptr, out_ptr, pmax_ptr, psum_ptr, n_cols, n_chunks, n_programs,
    x_row_stride, x_col_stride, out_row_stride,
    BLOCK: tl.constexpr, CHUNKS_PAD: tl.constexpr, EVEN: tl.constexpr,
):
    # Reverse order: the first programs re-read what the stats pass read last (still in L2).
    pid = n_programs - 1 - tl.program_id(0)
    row = pid // n_chunks
    chunk = pid - row * n_chunks

    j = tl.arange(0, CHUNKS_PAD)
    jmask = j < n_chunks
    pbase = row * n_chunks
    pm = tl.load(pmax_ptr + pbase + j, mask=jmask, other=float("-inf"))
    ps = tl.load(psum_ptr + pbase + j, mask=jmask, other=0.0)
    row_max = tl.max(pm, axis=0)
    max_ref = tl.where(row_max == float("-inf"), 0.0, row_max)
    denom = tl.sum(ps * tl.exp(pm - max_ref), axis=0)

    cols = chunk * BLOCK + tl.arange(0, BLOCK)
    row64 = row.to(tl.int64)
    x_ptrs = x_ptr + row64 * x_row_stride + cols * x_col_stride
    o_ptrs = out_ptr + row64 * out_row_stride + cols
    if EVEN:
        x = tl.load(x_ptrs, eviction_policy="evict_first").to(tl.float32)
        y = tl.exp(x - row_max) / denom
        tl.store(o_ptrs, y.to(out_ptr.dtype.element_ty))
    else:
        cmask = cols < n_cols
        x = tl.load(x_ptrs, mask=cmask, other=float("-inf"), eviction_policy="evict_first").to(tl.float32)
        y = tl.exp(x - row_max) / denom
        tl.store(o_ptrs, y.to(out_ptr.dtype.element_ty), mask=cmask)


_PLANS = {}


def _build_plan(n_rows, n_cols, row_stride, col_stride):
    if n_cols <= _SINGLE_PASS_MAX_COLS:
        block_cols = triton.next_power_of_2(n_cols)
        block_rows = max(1, min(2048 // block_cols, triton.next_power_of_2(n_rows)))
        num_warps = max(1, min(16, (block_rows * block_cols) // 512))
        grid = (triton.cdiv(n_rows, block_rows),)
        kernel = _softmax_rows_kernel[grid]

        def launch(x, out):
            kernel(x, out, n_rows, n_cols, row_stride, col_stride, n_cols,
                   BLOCK_ROWS=block_rows, BLOCK_COLS=block_cols, num_warps=num_warps)

        return launch

    n_chunks = triton.cdiv(n_cols, _CHUNK)
    n_programs = n_rows * n_chunks
    even = n_cols % _CHUNK == 0
    chunks_pad = triton.next_power_of_2(n_chunks)
    stats_kernel = _chunk_stats_kernel[(n_programs,)]
    norm_kernel = _chunk_normalize_kernel[(n_programs,)]

    def launch(x, out):
        pmax = torch.empty((n_programs,), device=x.device, dtype=torch.float32)
        psum = torch.empty((n_programs,), device=x.device, dtype=torch.float32)
        stats_kernel(x, pmax, psum, n_cols, n_chunks, row_stride, col_stride,
                     BLOCK=_CHUNK, EVEN=even, num_warps=8)
        norm_kernel(x, out, pmax, psum, n_cols, n_chunks, n_programs, row_stride, col_stride, n_cols,
                    BLOCK=_CHUNK, CHUNKS_PAD=chunks_pad, EVEN=even, num_warps=8)

    return launch


class ModelNew(nn.Module):
    """Softmax over dim=1 of a 2-D tensor, computed by Triton kernels."""

    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2:
            raise ValueError(f"expected a 2-D input, got shape {tuple(x.shape)}")
        if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise TypeError(f"unsupported dtype {x.dtype}")
        key = (x.shape, x.stride(), x.dtype)
        launch = _PLANS.get(key)
        if launch is None:
            n_rows, n_cols = x.shape
            launch = _build_plan(n_rows, n_cols, x.stride(0), x.stride(1)) if x.numel() > 0 else None
            _PLANS[key] = launch
        out = torch.empty(x.shape, device=x.device, dtype=x.dtype)
        if launch is not None:
            launch(x, out)
        return out
