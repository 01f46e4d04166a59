"""Triton kernel for `torch.nn.functional.gelu(input, approximate='none')`.

GELU is elementwise and memory-bound: a single flat 1-D kernel streams the contiguous storage once (read + write),
computes in fp32 and rounds once to the input dtype on store. Launch parameters are cached per (numel, approximate)
so the Python wrapper is just an allocation and one launch.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _gelu_kernel(
    x_ptr,
    out_ptr,
    n_elements,
    BLOCK: tl.constexpr,
    APPROX_TANH: tl.constexpr,
    EVEN: tl.constexpr,
    USE_INT64: tl.constexpr,
):
    pid = tl.program_id(0)
    if USE_INT64:
        start = pid.to(tl.int64) * BLOCK
    else:
        start = pid * BLOCK
    offs = start + tl.arange(0, BLOCK)

    if EVEN:
        x = tl.load(x_ptr + offs, eviction_policy="evict_first")
    else:
        mask = offs < n_elements
        x = tl.load(x_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_first")

    xf = x.to(tl.float32)
    if APPROX_TANH:
        # 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))
        inner = 0.7978845608028654 * (xf + 0.044715 * xf * xf * xf)
        # tanh(u) = 1 - 2 / (exp(2u) + 1): saturates correctly to +-1 for large |u| (exp -> inf or 0).
        t = 1.0 - 2.0 / (tl.exp(2.0 * inner) + 1.0)
        y = 0.5 * xf * (1.0 + t)
    else:
        # 0.5 * x * (1 + erf(x / sqrt(2)))  (same formula as PyTorch's CUDA kernel)
        y = 0.5 * xf * (1.0 + tl.math.erf(xf * 0.7071067811865476))
    y = y.to(out_ptr.dtype.element_ty)

    if EVEN:
        tl.store(out_ptr + offs, y, eviction_policy="evict_first")
    else:
        tl.store(out_ptr + offs, y, mask=mask, eviction_policy="evict_first")


_BLOCK = 4096
_NUM_WARPS = 4
_META = {}


def _get_meta(numel, approximate):
    key = (numel, approximate)
    meta = _META.get(key)
    if meta is None:
        if approximate not in ("none", "tanh"):
            raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
        grid = (triton.cdiv(numel, _BLOCK),)
        meta = (grid, approximate == "tanh", numel % _BLOCK == 0, numel + _BLOCK >= 2**31)
        _META[key] = meta
    return meta


def kernel_function(input, approximate='none'):
    if not input.is_contiguous():
        raise ValueError(
            f"gelu kernel: expected a contiguous input, got shape={tuple(input.shape)} stride={input.stride()}"
        )
    out = torch.empty_like(input)
    numel = input.numel()
    if numel == 0:
        return out
    grid, approx_tanh, even, use_int64 = _get_meta(numel, approximate)
    _gelu_kernel[grid](
        input,
        out,
        numel,
        BLOCK=_BLOCK,
        APPROX_TANH=approx_tanh,
        EVEN=even,
        USE_INT64=use_int64,
        num_warps=_NUM_WARPS,
    )
    return out
