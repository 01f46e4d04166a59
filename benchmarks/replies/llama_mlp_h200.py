import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _silu_mul_kernel(
    g_ptr, u_ptr, o_ptr, n_elements,
    BLOCK: tl.constexpr, EVEN: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    if EVEN:
        g = tl.load(g_ptr + offs).to(tl.float32)
        u = tl.load(u_ptr + offs).to(tl.float32)
    else:
        mask = offs < n_elements
        g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(u_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    # PyTorch: silu computed in fp32, rounded to bf16; then bf16*bf16 in fp32, rounded.
    s = g / (1.0 + tl.exp(-g))
    s = s.to(tl.bfloat16).to(tl.float32)
    out = (s * u).to(o_ptr.dtype.element_ty)
    if EVEN:
        tl.store(o_ptr + offs, out)
    else:
        tl.store(o_ptr + offs, out, mask=mask)


def _silu_mul_inplace(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    # gate and up are freshly produced, contiguous, same shape/dtype.
    n = gate.numel()
    BLOCK = 4096
    even = (n % BLOCK) == 0
    grid = (triton.cdiv(n, BLOCK),)
    _silu_mul_kernel[grid](gate, up, gate, n, BLOCK=BLOCK, EVEN=even, num_warps=8)
    return gate


class ModelNew(nn.Module):
    def __init__(self, original):
        super().__init__()
        self.original = original
        self.hidden_size = original.hidden_size
        self.intermediate_size = original.intermediate_size

    def forward(self, x):
        orig = self.original
        gp = orig.gate_proj
        upp = orig.up_proj
        dp = orig.down_proj

        # Products through cuBLAS (allowed library calls).
        gate = torch.nn.functional.linear(x, gp.weight, gp.bias)
        up = torch.nn.functional.linear(x, upp.weight, upp.bias)

        if not gate.is_contiguous():
            raise RuntimeError("unexpected non-contiguous gate output")
        if not up.is_contiguous():
            raise RuntimeError("unexpected non-contiguous up output")

        # Fused SiLU(gate) * up in our own Triton kernel (written in place into gate buffer).
        h = _silu_mul_inplace(gate, up)

        out = torch.nn.functional.linear(h, dp.weight, dp.bias)
        return out
