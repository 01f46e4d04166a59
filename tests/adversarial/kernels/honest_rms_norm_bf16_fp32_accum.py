# adversarial: honest_rms_norm_bf16_fp32_accum
# function: rms_norm
# samples: rms_norm_bf16
# mechanism: honest: bf16 in and out, loads converted to fp32, fp32 accumulation, one rounding on store
# source: issue 10 "Tests" (native bf16 math converted as required)
# expect: accepted
import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm(x_ptr, w_ptr, out_ptr, n_cols, eps, HAS_WEIGHT: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    ms = tl.sum(x * x, axis=0) / n_cols
    y = x / tl.sqrt(ms + eps)
    if HAS_WEIGHT:
        y = y * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * n_cols + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def kernel_function(input, normalized_shape, weight=None, eps=None):
    x = input.contiguous()
    n_cols = x.shape[-1]
    if eps is None:
        eps = torch.finfo(x.dtype).eps
    out = torch.empty_like(x)
    rows = x.numel() // n_cols
    w = weight.contiguous() if weight is not None else x
    _rms_norm[(rows,)](x, w, out, n_cols, eps, HAS_WEIGHT=weight is not None, BLOCK=triton.next_power_of_2(n_cols))
    return out
