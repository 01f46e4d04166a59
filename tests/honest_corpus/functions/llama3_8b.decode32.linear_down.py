"""Triton implementation of `torch.nn.functional.linear` for the Llama-3-8B decode down projection.

Served call: input bf16[32, 14336] (contiguous), weight bf16[4096, 14336] (contiguous), bias None
-> bf16[32, 4096].

The op is memory bound (117 MB of weight, 3.8 GFLOP), so the design is about streaming the weight from HBM
once, at full bandwidth, with the small activation block resident in L2:

* Swap-AB: each program computes a [BLOCK_N, BLOCK_M] tile of out^T = W @ x^T, so the weight tile is the
  64-row A operand of the tensor-core MMA and the 32-row batch is the (small) N dimension of the MMA.
* Split-K inside one launch: 4096 / 64 = 64 output tiles are far too few for 132 SMs, so K is split
  SPLIT_K = 4 ways (256 programs, two resident per SM, each streaming a 64 x 3584 weight slab through a
  4-stage cp.async pipeline).  Every split stores its fp32 partial tile to a small workspace and draws a
  ticket from a per-tile atomic counter; the program holding the last ticket sums the partials in a fixed
  order (so results are deterministic), adds the bias, rounds to the output dtype once and resets the
  counter to zero, ready for the next call.
* Accumulation is fp32 throughout; fp32 operands (not used by the served call) use IEEE-precision dots.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _linear_swapab_splitk_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    out_ptr,
    ws_ptr,
    cnt_ptr,
    M,
    N,
    K,
    K_PER_SPLIT,
    stride_xm,
    stride_xk,
    stride_wn,
    stride_wk,
    stride_b,
    stride_om,
    stride_on,
    HAS_BIAS: tl.constexpr,
    SPLIT_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    IEEE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)

    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    n_mask = offs_n < N
    m_mask = offs_m < M
    # Rows past the end are clamped to row 0 so the K loop needs no row masks; their results are never stored.
    rn = tl.where(n_mask, offs_n, 0)
    rm = tl.where(m_mask, offs_m, 0)

    k_lo = pid_k * K_PER_SPLIT
    w_ptrs = w_ptr + rn[:, None] * stride_wn + (k_lo + offs_k)[None, :] * stride_wk
    x_ptrs = x_ptr + rm[:, None] * stride_xm + (k_lo + offs_k)[None, :] * stride_xk

    # acc[n, m] = sum_k W[n, k] * x[m, k]
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for kk in range(0, K_PER_SPLIT, BLOCK_K):
        if EVEN_K:
            w = tl.load(w_ptrs, eviction_policy="evict_first")
            x = tl.load(x_ptrs, eviction_policy="evict_last")
        else:
            k_ok = (k_lo + kk + offs_k) < K
            w = tl.load(w_ptrs, mask=k_ok[None, :], other=0.0, eviction_policy="evict_first")
            x = tl.load(x_ptrs, mask=k_ok[None, :], other=0.0, eviction_policy="evict_last")
        if IEEE:
            acc += tl.dot(w, tl.trans(x), input_precision="ieee")
        else:
            acc += tl.dot(w, tl.trans(x))
        w_ptrs += BLOCK_K * stride_wk
        x_ptrs += BLOCK_K * stride_xk

    out_ptrs = out_ptr + offs_m[None, :] * stride_om + offs_n[:, None] * stride_on
    out_mask = n_mask[:, None] & m_mask[None, :]

    if SPLIT_K == 1:
        y = acc
        if HAS_BIAS:
            bias = tl.load(b_ptr + offs_n * stride_b, mask=n_mask, other=0.0).to(tl.float32)
            y += bias[:, None]
        tl.store(out_ptrs, y.to(out_ptr.dtype.element_ty), mask=out_mask)
    else:
        # Workspace layout: ws[split, m, n] (fp32).
        MN = M * N
        ws_tile = offs_m[None, :] * N + offs_n[:, None]
        tl.store(ws_ptr + pid_k * MN + ws_tile, acc, mask=out_mask)
        # Every thread's partial stores are issued before the (release) ticket increment.
        tl.debug_barrier()
        tile_id = pid_m * tl.num_programs(0) + pid_n
        ticket = tl.atomic_add(cnt_ptr + tile_id, 1, sem="acq_rel", scope="gpu")
        if ticket == SPLIT_K - 1:
            # Last split for this tile: all partials are visible (acquire); read them from L2 (.cg) and
            # reduce in a fixed order so the result does not depend on which split finished last.
            y = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
            for s in tl.static_range(SPLIT_K):
                y += tl.load(ws_ptr + s * MN + ws_tile, mask=out_mask, other=0.0, cache_modifier=".cg")
            if HAS_BIAS:
                bias = tl.load(b_ptr + offs_n * stride_b, mask=n_mask, other=0.0).to(tl.float32)
                y += bias[:, None]
            tl.store(out_ptrs, y.to(out_ptr.dtype.element_ty), mask=out_mask)
            # Re-arm the counter for the next launch (kernels on a stream run in order).
            tl.atomic_xchg(cnt_ptr + tile_id, 0)


def _flatten_rows(t):
    """(M, row_stride, col_stride) of `t` seen as a 2-D [M, K] matrix, without copying."""
    if t.dim() == 1:
        return 1, 0, t.stride(0)
    m = 1
    for s in t.shape[:-1]:
        m *= s
    for i in range(t.dim() - 2):
        if t.shape[i] != 1 and t.stride(i) != t.stride(i + 1) * t.shape[i + 1]:
            raise ValueError(
                f"linear kernel: leading dims of input shape={tuple(t.shape)} stride={t.stride()} do not collapse"
            )
    return m, t.stride(-2), t.stride(-1)


_PLANS = {}


def _make_plan(input, weight, bias):
    if weight.dim() != 2:
        raise ValueError("linear kernel: weight must be 2-D")
    if input.dtype != weight.dtype or (bias is not None and bias.dtype != input.dtype):
        raise TypeError("linear kernel: input, weight and bias must share one dtype")
    if input.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"linear kernel: unsupported dtype {input.dtype}")
    K = input.shape[-1]
    N, Kw = weight.shape
    if Kw != K:
        raise ValueError(f"linear kernel: in_features mismatch ({K} vs {Kw})")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != N):
        raise ValueError("linear kernel: bias must have shape [out_features]")
    M, sxm, sxk = _flatten_rows(input)
    out_shape = tuple(input.shape[:-1]) + (N,)
    if M == 0 or N == 0:
        return (out_shape, None, None, None, None, None)

    ieee = input.dtype == torch.float32
    block_m = max(16, min(64, triton.next_power_of_2(M)))
    block_n = 64 if block_m <= 32 else 128
    block_k = 64 if ieee else 128
    n_tiles = triton.cdiv(N, block_n)
    m_tiles = triton.cdiv(M, block_m)
    tiles = n_tiles * m_tiles

    # Split K until there are about two programs per SM, keeping >= 8 K-iterations per split.
    sms = torch.cuda.get_device_properties(input.device).multi_processor_count
    split = 1
    max_split = max(1, K // (8 * block_k))
    while split * 2 <= max_split and tiles * split * 2 <= 2 * sms:
        split *= 2
    if K == 0:
        split, k_per_split = 1, 0
    else:
        k_per_split = triton.cdiv(triton.cdiv(K, split), block_k) * block_k
        split = triton.cdiv(K, k_per_split)
    even_k = split * k_per_split == K

    if split > 1:
        ws = torch.empty((split, M, N), dtype=torch.float32, device=input.device)
        cnt = torch.zeros((tiles,), dtype=torch.int32, device=input.device)  # kernels increment and re-arm it
    else:
        ws = cnt = None

    scalars = (
        M,
        N,
        K,
        k_per_split,
        sxm,
        sxk,
        weight.stride(0),
        weight.stride(1),
        bias.stride(0) if bias is not None else 0,
        N,  # output row stride (contiguous [M, N])
        1,
    )
    meta = dict(
        HAS_BIAS=bias is not None,
        SPLIT_K=split,
        EVEN_K=even_k,
        IEEE=ieee,
        BLOCK_N=block_n,
        BLOCK_M=block_m,
        BLOCK_K=block_k,
        num_warps=4,
        num_stages=3 if ieee else 4,
    )
    grid = (n_tiles, m_tiles, split)
    return (out_shape, grid, scalars, meta, ws, cnt)


def kernel_function(input, weight, bias=None):
    key = (
        input.shape,
        input.stride(),
        input.dtype,
        input.device,
        weight.shape,
        weight.stride(),
        weight.dtype,
        None if bias is None else (bias.shape, bias.stride(), bias.dtype),
    )
    plan = _PLANS.get(key)
    if plan is None:
        plan = _make_plan(input, weight, bias)
        _PLANS[key] = plan
    out_shape, grid, scalars, meta, ws, cnt = plan
    out = torch.empty(out_shape, dtype=input.dtype, device=input.device)
    if grid is None:
        return out
    _linear_swapab_splitk_kernel[grid](
        input,
        weight,
        bias if bias is not None else weight,
        out,
        ws if ws is not None else out,
        cnt if cnt is not None else out,
        *scalars,
        **meta,
    )
    return out
