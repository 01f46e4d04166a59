"""ModelNew for 40_LayerNorm over normalized_shape = (64, 256, 256) (4M elements per row, 16 rows).

Launch 1: split each row into chunks; every program computes (mean, M2) of its chunk with shifted sums.
Launch 2: every program owns a block of features, loads weight/bias once, and for each row merges the chunk
          statistics (Chan's parallel formula), then normalizes and applies the affine transform.
"""

import math

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _ln_stats_kernel(
    x_ptr, mean_ptr, m2_ptr,
    N, x_row_stride, n_chunks,
    CHUNK: tl.constexpr, BLOCK: tl.constexpr, EVEN: tl.constexpr,
):
    pid = tl.program_id(0)
    row = pid // n_chunks
    chunk = pid % n_chunks
    start = chunk * CHUNK
    base = x_ptr + row.to(tl.int64) * x_row_stride + start
    offs = tl.arange(0, BLOCK)

    # Shift by the chunk's first element to keep sum / sum-of-squares well conditioned.
    shift = tl.load(base).to(tl.float32)
    s1 = tl.zeros([BLOCK], dtype=tl.float32)
    s2 = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(0, CHUNK, BLOCK):
        if EVEN:
            d = tl.load(base + i + offs).to(tl.float32) - shift
        else:
            mask = (start + i + offs) < N
            x = tl.load(base + i + offs, mask=mask, other=0.0).to(tl.float32)
            d = tl.where(mask, x - shift, 0.0)
        s1 += d
        s2 += d * d

    cnt = tl.minimum(N - start, CHUNK).to(tl.float32)
    t1 = tl.sum(s1, axis=0)
    t2 = tl.sum(s2, axis=0)
    mean_c = shift + t1 / cnt
    m2_c = tl.maximum(t2 - t1 * (t1 / cnt), 0.0)
    tl.store(mean_ptr + pid, mean_c)
    tl.store(m2_ptr + pid, m2_c)


@triton.jit
def _ln_apply_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, m2_ptr,
    n_rows, N, x_row_stride, y_row_stride, n_chunks, n_float, eps,
    CHUNK: tl.constexpr, CHUNKS_P2: tl.constexpr, ROWS_PER_PROG: tl.constexpr, BLOCK: tl.constexpr,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, EVEN: tl.constexpr,
):
    pid_f = tl.program_id(0)
    row_start = tl.program_id(1) * ROWS_PER_PROG
    row_end = tl.minimum(row_start + ROWS_PER_PROG, n_rows)

    cols = pid_f * BLOCK + tl.arange(0, BLOCK)
    cmask = cols < N
    if HAS_W:
        if EVEN:
            w = tl.load(w_ptr + cols).to(tl.float32)
        else:
            w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    if HAS_B:
        if EVEN:
            b = tl.load(b_ptr + cols).to(tl.float32)
        else:
            b = tl.load(b_ptr + cols, mask=cmask, other=0.0).to(tl.float32)

    c = tl.arange(0, CHUNKS_P2)
    c_valid = c < n_chunks
    c_cnt = tl.where(c_valid, tl.minimum(N - c * CHUNK, CHUNK), 0).to(tl.float32)

    for r in range(row_start, row_end):
        # Merge the per-chunk (count, mean, M2) of this row.
        mc = tl.load(mean_ptr + r * n_chunks + c, mask=c_valid, other=0.0)
        m2c = tl.load(m2_ptr + r * n_chunks + c, mask=c_valid, other=0.0)
        mean = tl.sum(c_cnt * mc, axis=0) / n_float
        dm = mc - mean
        var = (tl.sum(m2c, axis=0) + tl.sum(c_cnt * dm * dm, axis=0)) / n_float
        var = tl.maximum(var, 0.0)
        rstd = 1.0 / tl.sqrt(var + eps)

        x_row = x_ptr + r.to(tl.int64) * x_row_stride
        y_row = y_ptr + r.to(tl.int64) * y_row_stride
        if EVEN:
            x = tl.load(x_row + cols, eviction_policy="evict_first").to(tl.float32)
        else:
            x = tl.load(x_row + cols, mask=cmask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        y = (x - mean) * rstd
        if HAS_W:
            y = y * w
        if HAS_B:
            y = y + b
        if EVEN:
            tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty))
        else:
            tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=cmask)


_CONFIGS = {}


def _config(n_rows, n):
    key = (n_rows, n)
    cfg = _CONFIGS.get(key)
    if cfg is None:
        block1 = min(4096, triton.next_power_of_2(n))
        chunk = triton.next_power_of_2(triton.cdiv(n_rows * n, 1024))  # aim for ~1024 stats programs
        chunk = max(block1, min(chunk, triton.next_power_of_2(n)))
        n_chunks = triton.cdiv(n, chunk)
        while n_chunks > 4096:
            chunk *= 2
            n_chunks = triton.cdiv(n, chunk)
        chunks_p2 = triton.next_power_of_2(n_chunks)
        warps1 = 8 if block1 >= 2048 else 4
        block2 = min(2048, triton.next_power_of_2(n))
        warps2 = 8 if block2 >= 2048 else 4
        rows_per_prog = 16
        cfg = dict(
            block1=block1, chunk=chunk, n_chunks=n_chunks, chunks_p2=chunks_p2, warps1=warps1,
            even1=(n % chunk == 0), block2=block2, warps2=warps2, even2=(n % block2 == 0),
            rows_per_prog=rows_per_prog,
            grid1=(n_rows * n_chunks,),
            grid2=(triton.cdiv(n, block2), triton.cdiv(n_rows, rows_per_prog)),
        )
        _CONFIGS[key] = cfg
    return cfg


class ModelNew(nn.Module):
    def __init__(self, normalized_shape: tuple):
        super(ModelNew, self).__init__()
        self.ln = nn.LayerNorm(normalized_shape=normalized_shape)
        self._n = math.prod(self.ln.normalized_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not x.is_contiguous():
            raise ValueError("ModelNew LayerNorm kernel expects a contiguous input")
        n = self._n
        n_rows = x.numel() // n
        cfg = _config(n_rows, n)
        y = torch.empty_like(x)
        mean_part = torch.empty((n_rows * cfg["n_chunks"],), dtype=torch.float32, device=x.device)
        m2_part = torch.empty((n_rows * cfg["n_chunks"],), dtype=torch.float32, device=x.device)

        _ln_stats_kernel[cfg["grid1"]](
            x, mean_part, m2_part, n, n, cfg["n_chunks"],
            CHUNK=cfg["chunk"], BLOCK=cfg["block1"], EVEN=cfg["even1"], num_warps=cfg["warps1"],
        )
        w = self.ln.weight
        b = self.ln.bias
        _ln_apply_kernel[cfg["grid2"]](
            x, w if w is not None else x, b if b is not None else x, y, mean_part, m2_part,
            n_rows, n, n, n, cfg["n_chunks"], float(n), self.ln.eps,
            CHUNK=cfg["chunk"], CHUNKS_P2=cfg["chunks_p2"], ROWS_PER_PROG=cfg["rows_per_prog"],
            BLOCK=cfg["block2"], HAS_W=w is not None, HAS_B=b is not None, EVEN=cfg["even2"],
            num_warps=cfg["warps2"],
        )
        return y
