# adversarial: gadget_format_globals
# function: silu
# samples: silu_f32
# mechanism: `'{0.__globals__}'.format(kernel_function)` and `"__glob" + "als__"` lookups to reach module globals
#   without writing a dunder attribute
# source: issue 9 (format gadgets passed the deny-list screen)
# expect: forbidden
import torch
import triton
import triton.language as tl


@triton.jit
def _silu(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, (x / (1.0 + tl.exp(-x))).to(out_ptr.dtype.element_ty), mask=mask)


_SEEN = []


def kernel_function(input, inplace=False):
    if not _SEEN:
        _SEEN.append("{0.__globals__}".format(kernel_function))  # noqa: UP030, UP032 - the gadget itself
        _SEEN.append(getattr(kernel_function, "__glob" + "als__"))
    x = input.contiguous()
    out = torch.empty_like(x)
    n = x.numel()
    _silu[(triton.cdiv(n, 256),)](x, out, n, BLOCK=256)
    return out
