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


# ModelNew files for the module problem `tests.evals.test_runner.MLP` (Linear(16, 8) then ReLU on a 4x16 input), in
# the style of an honest reply: `super(ModelNew, self).__init__()`, the reference's submodule kept for its weights.
MLP_TRITON = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _linear_relu(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        rk = k0 + tl.arange(0, BK)
        a = tl.load(x_ptr + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        w = tl.load(w_ptr + rn[None, :] * K + rk[:, None], mask=(rn[None, :] < N) & (rk[:, None] < K), other=0.0)
        acc += tl.sum(a[:, :, None] * w[None, :, :], axis=1)
    bias = tl.load(b_ptr + rn, mask=rn < N, other=0.0)
    y = tl.maximum(acc + bias[None, :], 0.0)
    tl.store(y_ptr + rm[:, None] * N + rn[None, :], y, mask=(rm[:, None] < M) & (rn[None, :] < N))


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super(ModelNew, self).__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        linear = self.linear
        M, K = x.shape
        N = linear.out_features
        y = torch.empty((M, N), device=x.device, dtype=x.dtype)
        grid = (triton.cdiv(M, 16), triton.cdiv(N, 16))
        _linear_relu[grid](x, linear.weight, linear.bias, y, M, N, K, BM=16, BN=16, BK=16)
        return y
'''

# |linear(x)| instead of relu(linear(x)): wrong wherever the linear output is negative.
MLP_TRITON_WRONG = MLP_TRITON.replace("tl.maximum(acc + bias[None, :], 0.0)", "tl.abs(acc + bias[None, :])")
# Correct, but sleeps 20 ms per forward (needs screening off: `time` is refused).
MLP_TRITON_SLOW = MLP_TRITON.replace("import torch\n", "import time\n\nimport torch\n", 1).replace(
    "    def forward(self, x):\n", "    def forward(self, x):\n        time.sleep(0.02)\n")
# Segfaults in its forward (needs screening off: `ctypes` is refused).
MLP_TRITON_SEGFAULT = MLP_TRITON.replace("import torch\n", "import ctypes\n\nimport torch\n", 1).replace(
    "    def forward(self, x):\n", "    def forward(self, x):\n        ctypes.string_at(0)\n")
