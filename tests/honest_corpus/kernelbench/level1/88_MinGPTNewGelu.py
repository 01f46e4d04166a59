"""ModelNew for 88_MinGPTNewGelu: y = 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))).

Design:
- One flat streaming kernel over the contiguous input (67M fp32 elements, ~537 MB moved, memory-bound).
  Each program handles 4096 elements (16 per thread, 16-byte vector accesses); 67,108,864 is a multiple of 4096,
  so the mask-free EVEN path is used.
- Exact identity: 0.5 * x * (1 + tanh(u)) = x * sigmoid(2u) = x / (1 + exp(-2u)). This needs one exp,
  has no cancellation in (1 + tanh(u)) for negative u, and saturates correctly (exp overflow -> x / inf = -0,
  matching 0.5 * x * 0 from the reference).
- Computed in fp32 and stored in the input dtype.
- A strided 2-D kernel covers non-contiguous 2-D inputs without a copy.
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl


_SQRT_2_OVER_PI = 0.7978845608028654  # math.sqrt(2.0 / math.pi)


@triton.jit
def _gelu_tanh_math(x):
    xf = x.to(tl.float32)
    u = 0.7978845608028654 * (xf + 0.044715 * (xf * xf * xf))
    return xf / (1.0 + tl.exp(-2.0 * u))


@triton.jit
def _gelu_tanh_flat_kernel(x_ptr, y_ptr, n_elements, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    if EVEN:
        x = tl.load(x_ptr + offs, eviction_policy="evict_first")
        tl.store(y_ptr + offs, _gelu_tanh_math(x).to(y_ptr.dtype.element_ty))
    else:
        mask = offs < n_elements
        x = tl.load(x_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_first")
        tl.store(y_ptr + offs, _gelu_tanh_math(x).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gelu_tanh_2d_kernel(
    x_ptr,
    y_ptr,
    n_rows,
    n_cols,
    x_row_stride,
    x_col_stride,
    y_row_stride,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_COLS: tl.constexpr,
):
    rows = (tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)[:, None]).to(tl.int64)
    cols = (tl.program_id(1) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)[None, :]).to(tl.int64)
    mask = (rows < n_rows) & (cols < n_cols)
    x = tl.load(x_ptr + rows * x_row_stride + cols * x_col_stride, mask=mask, other=0.0)
    tl.store(y_ptr + rows * y_row_stride + cols, _gelu_tanh_math(x).to(y_ptr.dtype.element_ty), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()
        self._flat_cfg = {}

    def _flat_config(self, n):
        cfg = self._flat_cfg.get(n)
        if cfg is None:
            if n >= (1 << 22):
                block, num_warps = 4096, 8
            else:
                block, num_warps = 1024, 4
            cfg = ((triton.cdiv(n, block),), block, n % block == 0, num_warps)
            self._flat_cfg[n] = cfg
        return cfg

    def forward(self, x):
        n = x.numel()
        if x.is_contiguous():
            out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
            if n == 0:
                return out
            grid, block, even, num_warps = self._flat_config(n)
            _gelu_tanh_flat_kernel[grid](x, out, n, BLOCK=block, EVEN=even, num_warps=num_warps)
            return out

        if x.dim() != 2:
            raise ValueError(f"gelu kernel: unsupported layout shape={tuple(x.shape)} stride={x.stride()}")
        n_rows, n_cols = x.shape
        out = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
        if n == 0:
            return out
        block_cols = min(1024, triton.next_power_of_2(n_cols))
        block_rows = max(1, min(64, 4096 // block_cols, triton.next_power_of_2(n_rows)))
        grid = (triton.cdiv(n_rows, block_rows), triton.cdiv(n_cols, block_cols))
        _gelu_tanh_2d_kernel[grid](
            x,
            out,
            n_rows,
            n_cols,
            x.stride(0),
            x.stride(1),
            n_cols,
            BLOCK_ROWS=block_rows,
            BLOCK_COLS=block_cols,
            num_warps=4,
        )
        return out
