"""ModelNew for `29_Matmul_Mish_Mish`: y = mish(mish(x @ W^T + b)).

One fused Triton kernel:
* tiled GEMM (BLOCK_M x BLOCK_N x BLOCK_K = 128 x 128 x 32) in true fp32 (tl.dot with input_precision="ieee"),
  with a grouped tile order so the 8 row-tiles sharing one weight column-block run together: the 256 MB
  weight streams from HBM about once and the 32 MB activation stays in L2;
* epilogue in registers: bias add, then Mish twice, using the closed form
      tanh(softplus(x)) = e(e + 2) / (e(e + 2) + 2),  e = exp(x)
  which is accurate for negative x (no log1p cancellation) and switches to the identity for x > 20, where
  tanh(softplus(x)) == 1 in fp32 (this also keeps exp from overflowing);
* a single store of the final fp32 result (no intermediate tensors).
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _mish(x):
    e = tl.exp(tl.minimum(x, 20.0))
    n = e * (e + 2.0)
    return tl.where(x > 20.0, x, x * (n / (n + 2.0)))


@triton.jit
def _linear_mish_mish_kernel(
    a_ptr,
    w_ptr,
    b_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_wn,
    stride_wk,
    stride_om,
    stride_on,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    # Grouped ordering: consecutive programs walk down GROUP_M row-tiles of the same column-tile.
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (pid % num_pid_in_group) % group_size_m
    pid_n = (pid % num_pid_in_group) // group_size_m

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    # Wrap out-of-range rows/cols back into range so the main loop needs no M/N masks (never stored).
    rm = offs_m % M
    rn = offs_n % N

    a_ptrs = a_ptr + rm[:, None] * stride_am + offs_k[None, :] * stride_ak  # [BLOCK_M, BLOCK_K]
    w_ptrs = w_ptr + rn[None, :] * stride_wn + offs_k[:, None] * stride_wk  # [BLOCK_K, BLOCK_N] = W^T tile

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(w_ptrs)
        else:
            k_rem = K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_rem, other=0.0)
            b = tl.load(w_ptrs, mask=offs_k[:, None] < k_rem, other=0.0)
        acc += tl.dot(a, b, input_precision="ieee")
        a_ptrs += BLOCK_K * stride_ak
        w_ptrs += BLOCK_K * stride_wk

    y = acc
    if HAS_BIAS:
        bias = tl.load(b_ptr + rn).to(tl.float32)
        y = y + bias[None, :]
    y = _mish(y)
    y = _mish(y)

    out_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(out_ptrs, y.to(out_ptr.dtype.element_ty), mask=mask)


class ModelNew(nn.Module):
    """
    Matrix multiplication followed by two Mish activations, fused into one Triton kernel.
    """

    BLOCK_M = 128
    BLOCK_N = 128
    BLOCK_K = 32
    GROUP_M = 8

    def __init__(self, in_features, out_features):
        super(ModelNew, self).__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        w = self.linear.weight
        b = self.linear.bias
        if x.dtype != torch.float32 or w.dtype != torch.float32:
            raise TypeError("this kernel serves float32 inputs and weights")
        K = x.shape[-1]
        N = w.shape[0]
        if x.dim() == 2:
            x2 = x
        elif x.is_contiguous():
            x2 = x.view(-1, K)
        else:
            raise ValueError("expected a 2-D input or a contiguous N-D input")
        M = x2.shape[0]
        out = torch.empty((M, N), dtype=x.dtype, device=x.device)
        if M > 0 and N > 0:
            grid = (triton.cdiv(M, self.BLOCK_M) * triton.cdiv(N, self.BLOCK_N),)
            _linear_mish_mish_kernel[grid](
                x2,
                w,
                b if b is not None else w,
                out,
                M,
                N,
                K,
                x2.stride(0),
                x2.stride(1),
                w.stride(0),
                w.stride(1),
                out.stride(0),
                out.stride(1),
                HAS_BIAS=b is not None,
                BLOCK_M=self.BLOCK_M,
                BLOCK_N=self.BLOCK_N,
                BLOCK_K=self.BLOCK_K,
                GROUP_M=self.GROUP_M,
                EVEN_K=K % self.BLOCK_K == 0,
                num_warps=8,
                num_stages=3,
            )
        return out.view(tuple(x.shape[:-1]) + (N,))
