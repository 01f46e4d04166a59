"""Real Triton kernel files (as the LLM would reply them) used by the scripted-server tests.

They run under TRITON_INTERPRET=1 on CPU tensors. `fenced(code)` wraps one in a reply with some prose.
"""

SILU_OK = '''
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
    x = input.contiguous()
    out = x if inplace else torch.empty_like(x)
    n = x.numel()
    _silu[(triton.cdiv(n, 1024),)](x, out, n, BLOCK=1024)
    return out
'''

# Wrong result: a scaled silu.
SILU_WRONG = SILU_OK.replace("(x / (1.0 + tl.exp(-x)))", "(1.5 * x / (1.0 + tl.exp(-x)))")

# Triton compile error: tl.arange needs a power-of-two range.
SILU_COMPILE_ERROR = SILU_OK.replace("tl.arange(0, BLOCK)", "tl.arange(0, 1000)")

# Calls the reference op: rejected by screening before anything runs.
SILU_FORBIDDEN = SILU_OK.replace("    return out\n", "    return torch.nn.functional.silu(input)\n")

# Never returns.
SILU_HANG = SILU_OK.replace("    n = x.numel()\n", "    n = x.numel()\n    while True:\n        pass\n")

RMS_NORM_OK = '''
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
    _rms_norm[(rows,)](x, w, out, n_cols, eps, HAS_WEIGHT=weight is not None,
                       BLOCK=triton.next_power_of_2(n_cols))
    return out
'''


def fenced(code: str, prose: str = "Here is the kernel.") -> str:
    return f"{prose}\n\n```python\n{code.strip()}\n```\n\nIt launches one Triton kernel."
