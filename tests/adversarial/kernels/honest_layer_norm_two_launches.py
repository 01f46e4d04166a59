# adversarial: honest_layer_norm_two_launches
# function: layer_norm
# samples: layer_norm_f32
# mechanism: honest: several launches (a statistics kernel, then a normalise kernel) with scratch buffers
# source: issue 10 "Tests" (several launches)
# expect: accepted
import torch
import triton
import triton.language as tl


@triton.jit
def _row_stats(x_ptr, mean_ptr, rstd_ptr, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / n_cols
    d = tl.where(mask, x - mean, 0.0)
    var = tl.sum(d * d, axis=0) / n_cols
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, 1.0 / tl.sqrt(var + eps))


@triton.jit
def _normalise(x_ptr, w_ptr, b_ptr, mean_ptr, rstd_ptr, out_ptr, n_cols,
               HAS_W: tl.constexpr, HAS_B: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    y = (x - tl.load(mean_ptr + row)) * tl.load(rstd_ptr + row)
    if HAS_W:
        y = y * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_B:
        y = y + tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * n_cols + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def kernel_function(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    x = input.contiguous()
    n_cols = 1
    for s in normalized_shape:
        n_cols *= s
    rows = x.numel() // max(n_cols, 1)
    out = torch.empty_like(x)
    mean = torch.empty(rows, dtype=torch.float32, device=x.device)
    rstd = torch.empty(rows, dtype=torch.float32, device=x.device)
    block = triton.next_power_of_2(n_cols)
    w = weight.contiguous() if weight is not None else x
    b = bias.contiguous() if bias is not None else x
    _row_stats[(rows,)](x, mean, rstd, n_cols, eps, BLOCK=block)
    _normalise[(rows,)](x, w, b, mean, rstd, out, n_cols, HAS_W=weight is not None, HAS_B=bias is not None,
                        BLOCK=block)
    return out
