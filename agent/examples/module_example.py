"""Example of the expected file for a module problem: `ModelNew` for the scaled leaky ReLU reference.

Same constructor parameters as `Model`, and the parameters are created in the same order with the same modules, so
identical seeding gives identical weights. `forward` keeps the reference's semantics but runs its arithmetic in one
fused `@triton.jit` kernel; torch is used only to allocate the output.
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _scaled_leaky_relu_kernel(
    x_ptr, scale_ptr, out_ptr, n_rows, n_cols, x_row_stride, negative_slope, BLOCK_COLS: tl.constexpr
):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    s = tl.load(scale_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = x * s
    y = tl.where(y >= 0, y, y * negative_slope)
    tl.store(out_ptr + row * n_cols + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, features: int, negative_slope: float):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(features))
        self.negative_slope = negative_slope

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2 or x.stride(1) != 1:
            raise ValueError(f"expected a 2-D input with unit column stride, got stride {x.stride()}")
        n_rows, n_cols = x.shape
        out = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
        block_cols = min(1024, triton.next_power_of_2(n_cols))
        grid = (n_rows, triton.cdiv(n_cols, block_cols))
        _scaled_leaky_relu_kernel[grid](
            x, self.scale, out, n_rows, n_cols, x.stride(0), self.negative_slope, BLOCK_COLS=block_cols
        )
        return out
