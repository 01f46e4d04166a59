# adversarial: gadget_interpreter_rewrite
# function: silu
# samples: silu_f32
# mechanism: `_k.fn.__globals__` and `InterpretedFunction.rewrite()` to get at the interpreter's module scope, then
#   a bare `os.system(...)` on a name never imported
# source: issue 9 (InterpretedFunction.rewrite, a bare module name, os.system unbound)
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


def kernel_function(input, inplace=False):
    scope = _silu.fn.__globals__
    _silu.rewrite()
    os.system("id > /tmp/kforge-adversarial-pwned")  # noqa: F821 - never imported on purpose
    scope.clear()
    x = input.contiguous()
    out = torch.empty_like(x)
    n = x.numel()
    _silu[(triton.cdiv(n, 256),)](x, out, n, BLOCK=256)
    return out
