# adversarial: honest_silu_example
# function: silu
# samples: silu_f32
# mechanism: honest baseline: the agent's own example file (strided 2-D tiles, fp32 math)
# source: agent/examples/triton_example.py
# expect: accepted
import torch
import triton
import triton.language as tl


@triton.jit
def _silu_kernel(x_ptr, out_ptr, n_rows, n_cols, x_rs, x_cs, o_rs, o_cs,
                 BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)[:, None]
    cols = tl.program_id(1) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)[None, :]
    mask = (rows < n_rows) & (cols < n_cols)
    x = tl.load(x_ptr + rows * x_rs + cols * x_cs, mask=mask, other=0.0).to(tl.float32)
    y = x / (1.0 + tl.exp(-x))
    tl.store(out_ptr + rows * o_rs + cols * o_cs, y.to(out_ptr.dtype.element_ty), mask=mask)


def _as_rows_cols(t):
    if t.dim() == 1:
        return 1, t.shape[0], 0, t.stride(0)
    if t.dim() == 2:
        return t.shape[0], t.shape[1], t.stride(0), t.stride(1)
    if t.is_contiguous():
        n_cols = t.shape[-1]
        return t.numel() // max(n_cols, 1), n_cols, n_cols, 1
    raise ValueError(f"unsupported layout {tuple(t.shape)} {t.stride()}")


def kernel_function(input, inplace=False):
    out = input if inplace else torch.empty_like(input)
    n_rows, n_cols, x_rs, x_cs = _as_rows_cols(input)
    _, _, o_rs, o_cs = _as_rows_cols(out)
    if n_rows * n_cols == 0:
        return out
    block_cols = min(1024, triton.next_power_of_2(n_cols))
    block_rows = max(1, min(64, 4096 // block_cols, triton.next_power_of_2(n_rows)))
    grid = (triton.cdiv(n_rows, block_rows), triton.cdiv(n_cols, block_cols))
    _silu_kernel[grid](input, out, n_rows, n_cols, x_rs, x_cs, o_rs, o_cs,
                       BLOCK_ROWS=block_rows, BLOCK_COLS=block_cols)
    return out
