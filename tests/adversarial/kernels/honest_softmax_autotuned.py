# adversarial: honest_softmax_autotuned
# function: softmax
# samples: softmax_f32
# mechanism: honest: @triton.autotune over several configs (the interpreter has no driver to autotune with)
# source: issue 10 "What it must do" (the autotuned honest kernel passes on CPU)
# expect: accepted
import torch
import triton
import triton.language as tl


@triton.autotune(
    configs=[triton.Config({}, num_warps=1), triton.Config({}, num_warps=2), triton.Config({}, num_warps=4)],
    key=["n_cols"],
)
@triton.jit
def _softmax_rows(x_ptr, out_ptr, n_cols, x_stride, out_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=-float("inf")).to(tl.float32)
    x = x - tl.max(x, axis=0)
    e = tl.exp(x)
    y = e / tl.sum(e, axis=0)
    tl.store(out_ptr + row * out_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def kernel_function(input, dim=None, _stacklevel=3, dtype=None):
    if dim is None:
        dim = -1
    if dim < 0:
        dim += input.dim()
    if dim != input.dim() - 1:
        raise ValueError("this kernel normalises the last dimension only")
    x = input.contiguous()
    out_dtype = dtype if dtype is not None else x.dtype
    out = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    n_cols = x.shape[-1]
    rows = x.numel() // max(n_cols, 1)
    if rows == 0:
        return out
    _softmax_rows[(rows,)](x, out, n_cols, n_cols, n_cols, BLOCK=triton.next_power_of_2(n_cols))
    return out
