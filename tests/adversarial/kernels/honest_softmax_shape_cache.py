# adversarial: honest_softmax_shape_cache
# function: softmax
# samples: softmax_flat
# mechanism: honest: launch configuration (kernel, block, warps) chosen from a per-shape cache; flat logits
# source: issue 10 "Tests" (a kernel chosen from a per-shape cache); counterpart of exploit_softmax_constant_flat
# expect: accepted
import torch
import triton
import triton.language as tl


@triton.jit
def _softmax_one_block(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=-float("inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(out_ptr + row * n_cols + cols, (e / tl.sum(e, axis=0)).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_looped(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    m = -float("inf")
    s = 0.0
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * n_cols + cols, mask=cols < n_cols, other=-float("inf")).to(tl.float32)
        new_m = tl.maximum(m, tl.max(x, axis=0))
        s = s * tl.exp(m - new_m) + tl.sum(tl.exp(x - new_m), axis=0)
        m = new_m
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * n_cols + cols, mask=cols < n_cols, other=-float("inf")).to(tl.float32)
        y = tl.exp(x - m) / s
        tl.store(out_ptr + row * n_cols + cols, y.to(out_ptr.dtype.element_ty), mask=cols < n_cols)


_CONFIGS = {}


def _config(n_cols, dtype):
    key = (n_cols, dtype)
    cfg = _CONFIGS.get(key)
    if cfg is None:
        if n_cols <= 4096:
            cfg = (_softmax_one_block, triton.next_power_of_2(n_cols), 4)
        else:
            cfg = (_softmax_looped, 1024, 8)
        _CONFIGS[key] = cfg
    return cfg


def kernel_function(input, dim=None, _stacklevel=3, dtype=None):
    if dim is None:
        dim = -1
    if dim < 0:
        dim += input.dim()
    if dim != input.dim() - 1 or dtype is not None:
        raise ValueError("this kernel normalises the last dimension in the input dtype only")
    x = input.contiguous()
    out = torch.empty_like(x)
    n_cols = x.shape[-1]
    rows = x.numel() // max(n_cols, 1)
    if rows == 0:
        return out
    kern, block, warps = _config(n_cols, x.dtype)
    kern[(rows,)](x, out, n_cols, BLOCK=block, num_warps=warps)
    return out
