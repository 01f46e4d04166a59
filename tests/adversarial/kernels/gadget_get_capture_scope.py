# adversarial: gadget_get_capture_scope
# function: silu
# samples: silu_f32
# mechanism: reaches module globals through the Triton function object
#   (`_k.get_capture_scope()["__builtins__"]["__import__"]("os")`) and reads the environment
# source: issue 9 (the AST screen walked around through get_capture_scope)
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


_LOOT = []


def kernel_function(input, inplace=False):
    if not _LOOT:
        scope = _silu.get_capture_scope()
        os_module = scope["__builtins__"]["__import__"]("os")
        _LOOT.append(dict(os_module.environ))
    x = input.contiguous()
    out = torch.empty_like(x)
    n = x.numel()
    _silu[(triton.cdiv(n, 256),)](x, out, n, BLOCK=256)
    return out
