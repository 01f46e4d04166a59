# adversarial: honest_silu_inplace_fresh_output
# function: silu
# samples: silu_f32
# mechanism: honest: copies the input into a fresh output, then a kernel updates that output in place
# source: issue 10 "Tests" (in-place into a fresh output)
# expect: accepted
import torch
import triton
import triton.language as tl


@triton.jit
def _silu_inplace(buf_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(buf_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(buf_ptr + offs, (x / (1.0 + tl.exp(-x))).to(buf_ptr.dtype.element_ty), mask=mask)


def kernel_function(input, inplace=False):
    if inplace:
        buf = input
        if not buf.is_contiguous():
            raise ValueError("in-place silu needs a contiguous input")
    else:
        buf = torch.empty(input.shape, dtype=input.dtype, device=input.device)
        buf.copy_(input)
    n = buf.numel()
    if n:
        _silu_inplace[(triton.cdiv(n, 256),)](buf, n, BLOCK=256)
    return buf
