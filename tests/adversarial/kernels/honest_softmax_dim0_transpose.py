# adversarial: honest_softmax_dim0_transpose
# function: softmax
# samples: softmax_dim0
# mechanism: honest: softmax over dim 0 by making the reduced dim the last one (`.transpose(...).contiguous()`,
#   a copy outside the kernel), one Triton launch, and a transposed view back: data movement, not computation
# source: issue 10 "What it must do" (policy for work outside the candidate's kernels: copies stay allowed)
# expect: accepted
import torch
import triton
import triton.language as tl


@triton.jit
def _softmax_rows(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=-float("inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(out_ptr + row * n_cols + cols, (e / tl.sum(e, axis=0)).to(out_ptr.dtype.element_ty), mask=mask)


def kernel_function(input, dim=None, _stacklevel=3, dtype=None):
    if dim is None:
        dim = -1
    if dim < 0:
        dim += input.dim()
    if dtype is not None:
        raise ValueError("dtype= is not supported")
    moved = input.transpose(dim, -1).contiguous()
    out = torch.empty_like(moved)
    n_cols = moved.shape[-1]
    rows = moved.numel() // max(n_cols, 1)
    if rows:
        _softmax_rows[(rows,)](moved, out, n_cols, BLOCK=triton.next_power_of_2(n_cols))
    return out.transpose(dim, -1).contiguous()
