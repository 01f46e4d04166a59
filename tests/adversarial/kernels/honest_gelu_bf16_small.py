# adversarial: honest_gelu_bf16_small
# function: gelu
# samples: gelu_bf16_small
# mechanism: honest: exact (erf) gelu on small bf16 activations, computed in fp32 and rounded once
# source: issue 10 "Tests" (native bf16 math converted as required); counterpart of exploit_gelu_all_zero_bf16
# expect: accepted
import torch
import triton
import triton.language as tl


@triton.jit
def _gelu(x_ptr, out_ptr, n, TANH: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if TANH:
        inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        t = 2.0 / (1.0 + tl.exp(-2.0 * inner)) - 1.0
        y = 0.5 * x * (1.0 + t)
    else:
        y = 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def kernel_function(input, approximate="none"):
    x = input.contiguous()
    out = torch.empty_like(x)
    n = x.numel()
    if n:
        _gelu[(triton.cdiv(n, 512),)](x, out, n, TANH=approximate == "tanh", BLOCK=512)
    return out
