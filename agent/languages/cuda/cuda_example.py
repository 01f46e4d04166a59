"""Example of the expected file: CUDA kernels for `torch.nn.functional.silu(input, inplace=False)`.

The device code is one string, `CUDA_SRC`, of `extern "C" __global__` kernels (templates stay in `__device__`
helpers); the harness compiles it for the target GPU through `load_cuda`. `kernel_function` has the PyTorch
function's parameters, defaults and return value: it checks layouts, allocates the output with torch and launches
one kernel as `kernels.<name>[grid, block](args...)` (tensors are passed as pointers, Python ints and floats as the
kernel's declared scalar types).
"""

import torch

from agent.languages.cuda.runtime import load_cuda

CUDA_SRC = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(__half* p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

// One thread per element of a (rows, cols) view, grid-stride; strides make any 2-D layout work without a copy.
template <typename T>
__device__ void silu_2d(const T* __restrict__ x, T* __restrict__ out, int64_t n_rows, int64_t n_cols,
                        int64_t x_rs, int64_t x_cs, int64_t o_rs, int64_t o_cs) {
  const int64_t n = n_rows * n_cols;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / n_cols, c = i - r * n_cols;
    const float v = to_f32(x[r * x_rs + c * x_cs]);  // compute in fp32, round once when storing
    store(out + r * o_rs + c * o_cs, v / (1.0f + expf(-v)));
  }
}

extern "C" __global__ void silu_f32(const float* x, float* out, int64_t n_rows, int64_t n_cols, int64_t x_rs,
                                    int64_t x_cs, int64_t o_rs, int64_t o_cs) {
  silu_2d(x, out, n_rows, n_cols, x_rs, x_cs, o_rs, o_cs);
}
extern "C" __global__ void silu_f16(const __half* x, __half* out, int64_t n_rows, int64_t n_cols, int64_t x_rs,
                                    int64_t x_cs, int64_t o_rs, int64_t o_cs) {
  silu_2d(x, out, n_rows, n_cols, x_rs, x_cs, o_rs, o_cs);
}
extern "C" __global__ void silu_bf16(const __nv_bfloat16* x, __nv_bfloat16* out, int64_t n_rows, int64_t n_cols,
                                     int64_t x_rs, int64_t x_cs, int64_t o_rs, int64_t o_cs) {
  silu_2d(x, out, n_rows, n_cols, x_rs, x_cs, o_rs, o_cs);
}
"""

kernels = load_cuda(CUDA_SRC)

# One kernel per dtype, looked up once per call (no per-call string formatting or getattr).
_BY_DTYPE = {torch.float32: kernels.silu_f32, torch.float16: kernels.silu_f16, torch.bfloat16: kernels.silu_bf16}


def _as_rows_cols(t):
    """(n_rows, n_cols, row_stride, col_stride) of a tensor seen as 2-D, without copying."""
    if t.dim() == 0:
        return 1, 1, 0, 0
    if t.dim() == 1:
        return 1, t.shape[0], 0, t.stride(0)
    if t.dim() == 2:
        return t.shape[0], t.shape[1], t.stride(0), t.stride(1)
    if t.is_contiguous():
        n_cols = t.shape[-1]
        return t.numel() // max(n_cols, 1), n_cols, n_cols, 1
    raise ValueError(f"silu kernel: unsupported layout shape={tuple(t.shape)} stride={t.stride()}")


def kernel_function(input, inplace=False):
    out = input if inplace else torch.empty_like(input)
    n_rows, n_cols, x_rs, x_cs = _as_rows_cols(input)
    _, _, o_rs, o_cs = _as_rows_cols(out)
    n = n_rows * n_cols
    if n == 0:
        return out
    block = 256
    grid = min((n + block - 1) // block, 132 * 16)  # enough blocks to fill the GPU; the kernel loops over the rest
    _BY_DTYPE[input.dtype][grid, block](input, out, n_rows, n_cols, x_rs, x_cs, o_rs, o_cs)
    return out
