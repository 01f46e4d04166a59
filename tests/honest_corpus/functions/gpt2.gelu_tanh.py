"""Triton implementation of `torch.nn.functional.gelu(input, approximate='none'|'tanh')`.

Memory-bound elementwise op: one flat, vectorised streaming kernel over the contiguous buffer.
  * approximate='tanh':  0.5*x*(1+tanh(u)) == x * sigmoid(2u) == x / (1 + exp(-2u)),
                         u = sqrt(2/pi) * (x + 0.044715*x^3)   (exact identity, one exp, no cancellation)
  * approximate='none':  (x*0.5) * (1 + erf(x/sqrt(2)))          (same evaluation order as PyTorch)
Math is done in fp32 and rounded once to the input dtype on store.
"""

import torch
import triton
import triton.language as tl


_SQRT_2_OVER_PI = 0.7978845608028654  # sqrt(2/pi) == M_SQRT2 * M_2_SQRTPI * 0.5
_KAPPA = 0.044715
_SQRT1_2 = 0.7071067811865476


@triton.jit
def _gelu_kernel(
    x_ptr,
    y_ptr,
    n_elements,
    BLOCK: tl.constexpr,
    EVEN: tl.constexpr,
    USE_TANH: tl.constexpr,
    USE_INT64: tl.constexpr,
):
    pid = tl.program_id(0)
    if USE_INT64:
        start = pid.to(tl.int64) * BLOCK
    else:
        start = pid * BLOCK
    offs = start + tl.arange(0, BLOCK)

    if EVEN:
        x = tl.load(x_ptr + offs)
    else:
        mask = offs < n_elements
        x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    xf = x.to(tl.float32)

    if USE_TANH:
        x_cube = xf * xf * xf
        inner = 0.7978845608028654 * (xf + 0.044715 * x_cube)
        # 0.5 * (1 + tanh(inner)) == 1 / (1 + exp(-2 * inner)); saturates cleanly (exp -> inf gives 0, -> 0 gives x).
        y = xf / (1.0 + tl.exp(-2.0 * inner))
    else:
        y = (xf * 0.5) * (1.0 + tl.erf(xf * 0.7071067811865476))

    y = y.to(y_ptr.dtype.element_ty)
    if EVEN:
        tl.store(y_ptr + offs, y)
    else:
        tl.store(y_ptr + offs, y, mask=mask)


_BLOCK = 4096
_NUM_WARPS = 8
_CONFIGS = {}


def _make_config(n, approximate):
    if approximate == "tanh":
        use_tanh = True
    elif approximate == "none":
        use_tanh = False
    else:
        raise ValueError(f"approximate argument must be either none or tanh, got {approximate!r}")
    cfg = (
        (triton.cdiv(n, _BLOCK),),
        dict(
            BLOCK=_BLOCK,
            EVEN=(n % _BLOCK == 0),
            USE_TANH=use_tanh,
            USE_INT64=(n + _BLOCK >= 2**31),
            num_warps=_NUM_WARPS,
        ),
    )
    _CONFIGS[(n, approximate)] = cfg
    return cfg


def kernel_function(input, approximate='none'):
    if not input.is_contiguous():
        raise ValueError(
            f"gelu kernel: expected a contiguous input, got shape={tuple(input.shape)} stride={input.stride()}"
        )
    n = input.numel()
    cfg = _CONFIGS.get((n, approximate))
    if cfg is None:
        cfg = _make_config(n, approximate)
    out = torch.empty_like(input)
    if n == 0:
        return out
    grid, meta = cfg
    _gelu_kernel[grid](input, out, n, **meta)
    return out
