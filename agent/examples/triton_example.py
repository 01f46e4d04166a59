"""Example of the expected file: a Triton kernel for `torch.nn.functional.silu(input, inplace=False)`.

The file defines one entry point, `kernel_function`, with the same parameters, defaults and return value as the
PyTorch function. All arithmetic runs inside `@triton.jit` kernels; the Python wrapper only checks layouts,
allocates the output with torch and launches one kernel.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _silu_kernel(
    x_ptr,
    out_ptr,
    n_rows,
    n_cols,
    x_row_stride,
    x_col_stride,
    out_row_stride,
    out_col_stride,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_COLS: tl.constexpr,
):
    # One program handles a BLOCK_ROWS x BLOCK_COLS tile of a 2-D (rows, cols) view; strides make any row/column
    # layout work, so strided inputs need no .contiguous() copy.
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)[:, None]
    cols = tl.program_id(1) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)[None, :]
    mask = (rows < n_rows) & (cols < n_cols)
    x = tl.load(x_ptr + rows * x_row_stride + cols * x_col_stride, mask=mask, other=0.0)
    xf = x.to(tl.float32)  # compute in fp32, round once when storing
    y = xf / (1.0 + tl.exp(-xf))
    tl.store(out_ptr + rows * out_row_stride + cols * out_col_stride, y.to(out_ptr.dtype.element_ty), mask=mask)


def _as_rows_cols(t):
    """(n_rows, n_cols, row_stride, col_stride) of a tensor seen as 2-D, without copying."""
    if t.dim() == 0:
        return 1, 1, 0, 0
    if t.dim() == 1:
        return 1, t.shape[0], 0, t.stride(0)
    if t.dim() == 2:
        return t.shape[0], t.shape[1], t.stride(0), t.stride(1)
    if t.is_contiguous():
        n_cols = t.shape[-1]
        return t.numel() // max(n_cols, 1), n_cols, n_cols, 1
    raise ValueError(f"silu kernel: unsupported layout shape={tuple(t.shape)} stride={t.stride()}")


def kernel_function(input, inplace=False):
    out = input if inplace else torch.empty_like(input)
    n_rows, n_cols, x_rs, x_cs = _as_rows_cols(input)
    _, _, o_rs, o_cs = _as_rows_cols(out)
    if n_rows * n_cols == 0:
        return out
    # Block sizes are chosen per shape on the host (constexpr, so each choice compiles once).
    block_cols = min(1024, triton.next_power_of_2(n_cols))
    block_rows = max(1, min(64, 4096 // block_cols, triton.next_power_of_2(n_rows)))
    grid = (triton.cdiv(n_rows, block_rows), triton.cdiv(n_cols, block_cols))
    _silu_kernel[grid](
        input, out, n_rows, n_cols, x_rs, x_cs, o_rs, o_cs, BLOCK_ROWS=block_rows, BLOCK_COLS=block_cols
    )
    return out
