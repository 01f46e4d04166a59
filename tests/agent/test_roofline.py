"""Roofline floors: bytes and FLOPs computed by hand from the shapes, device ceilings by name, meta outputs."""

from __future__ import annotations

import math

import pytest
import torch

from agent.roofline import DeviceCeilings, ceilings_for, estimate, meta_outputs
from forge.samples import Sample, TensorSpec

H200 = "NVIDIA H200"


def _size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def test_linear_bytes_flops_and_floor_from_the_shapes():
    m, k, n, dtype = 32, 4096, 14336, torch.bfloat16
    sample = Sample((TensorSpec((m, k), dtype), TensorSpec((n, k), dtype), TensorSpec((n,), dtype)), {})
    result = estimate("linear", [sample], H200)
    ceilings = ceilings_for(H200)

    expected_bytes = (m * k + n * k + n + m * n) * _size(dtype)
    expected_flops = 2 * m * n * k + m * n  # multiply-adds plus the bias add
    assert result.bytes_moved == expected_bytes
    assert result.flops == expected_flops
    memory_ms = expected_bytes / ceilings.copy_bandwidth * 1e3
    compute_ms = expected_flops / (ceilings.tensor_tflops * 1e12) * 1e3
    assert result.floor_ms == pytest.approx(max(memory_ms, compute_ms))
    assert result.bound == ("memory" if memory_ms >= compute_ms else "compute")
    assert result.per_sample[0].outputs == (((m, n), dtype),)
    assert result.per_sample[0].output_source == "meta"


def test_fp32_linear_uses_the_fp32_rate_not_tensor_cores():
    m = k = n = 2048
    sample = Sample((TensorSpec((m, k), torch.float32), TensorSpec((n, k), torch.float32)), {})
    result = estimate("linear", [sample], H200)
    ceilings = ceilings_for(H200)
    assert result.flops == 2 * m * n * k
    assert result.compute_ms == pytest.approx(2 * m * n * k / (ceilings.fp32_tflops * 1e12) * 1e3)
    assert result.bound == "compute"


def test_elementwise_op_is_memory_bound_with_read_plus_write_bytes():
    shape, dtype = (2048, 14336), torch.bfloat16
    result = estimate("silu", [Sample((TensorSpec(shape, dtype),), {})], H200)
    numel = math.prod(shape)
    expected_bytes = 2 * numel * _size(dtype)  # read the input once, write the output once
    assert result.bytes_moved == expected_bytes
    assert result.bound == "memory"
    assert result.floor_ms == pytest.approx(expected_bytes / ceilings_for(H200).copy_bandwidth * 1e3)
    assert numel <= result.flops <= 20 * numel  # "a few" FLOPs per element


def test_totals_sum_over_samples():
    a = Sample((TensorSpec((64, 256), torch.float32),), {})
    b = Sample((TensorSpec((8, 1024), torch.float16),), {})
    both = estimate("relu", [a, (3, b)], H200)
    single = [estimate("relu", [s], H200) for s in (a, b)]
    assert both.calls == 2
    assert both.bytes_moved == sum(r.bytes_moved for r in single)
    assert both.floor_ms == pytest.approx(sum(r.floor_ms for r in single))


def test_conv2d_flops_from_output_size():
    n, c_in, h, w, c_out, kh, kw, pad, stride, groups = 2, 32, 30, 30, 64, 3, 3, 1, 2, 2
    x = TensorSpec((n, c_in, h, w), torch.float16)
    weight = TensorSpec((c_out, c_in // groups, kh, kw), torch.float16)
    sample = Sample((x, weight), {"padding": pad, "stride": stride, "groups": groups})
    result = estimate("conv2d", [sample], H200)
    h_out = (h + 2 * pad - (kh - 1) - 1) // stride + 1
    w_out = (w + 2 * pad - (kw - 1) - 1) // stride + 1
    assert result.per_sample[0].outputs == (((n, c_out, h_out, w_out), torch.float16),)
    assert result.flops == 2 * n * c_out * h_out * w_out * (c_in // groups) * kh * kw


def test_sdpa_flops_gqa_and_causal_halving():
    b, hq, hk, lq, lk, d = 1, 8, 2, 128, 128, 64
    q = TensorSpec((b, hq, lq, d), torch.bfloat16)
    k = TensorSpec((b, hk, lk, d), torch.bfloat16)
    v = TensorSpec((b, hk, lk, d), torch.bfloat16)
    full = estimate("scaled_dot_product_attention", [Sample((q, k, v), {"enable_gqa": True})], H200)
    causal = estimate(
        "scaled_dot_product_attention", [Sample((q, k, v), {"enable_gqa": True, "is_causal": True})], H200
    )
    assert full.flops == 4 * b * hq * lq * lk * d
    assert causal.flops == full.flops // 2
    assert full.per_sample[0].outputs == (((b, hq, lq, d), torch.bfloat16),)


def test_broadcast_input_counts_its_distinct_elements_once():
    row = TensorSpec((1024, 512), torch.float32, stride=(0, 1))  # expanded row: 512 distinct elements
    dense = TensorSpec((1024, 512), torch.float32)
    result = estimate("relu", [Sample((row,), {})], H200)
    dense_result = estimate("relu", [Sample((dense,), {})], H200)
    assert result.bytes_moved == (512 + 1024 * 512) * 4
    assert dense_result.bytes_moved == 2 * 1024 * 512 * 4


def test_embedding_reads_only_the_looked_up_rows():
    idx = TensorSpec((4, 16), torch.int64, low=0, high=99)
    table = TensorSpec((50000, 256), torch.bfloat16)
    result = estimate("embedding", [Sample((idx, table), {})], H200)
    out_bytes = 4 * 16 * 256 * 2
    assert result.bytes_moved == 4 * 16 * 8 + out_bytes + out_bytes  # indices + gathered rows + output


def test_meta_outputs_and_fallback_when_meta_cannot_run():
    ce = Sample((TensorSpec((8, 100), torch.float32), TensorSpec((8,), torch.int64, low=0, high=99)), {})
    assert meta_outputs("cross_entropy", ce) == [((), torch.float32)]
    # one_hot with num_classes=-1 needs the data (the maximum index): no meta run, an assumed output instead.
    hot = Sample((TensorSpec((6,), torch.int64, low=0, high=3),), {})
    assert meta_outputs("one_hot", hot) is None
    result = estimate("one_hot", [hot], H200)
    assert result.per_sample[0].output_source.startswith("assumed")


def test_ceilings_by_device_name():
    assert ceilings_for("NVIDIA H200").name == "H200"
    assert ceilings_for("NVIDIA H100 PCIe").name == "H100 PCIe"
    assert ceilings_for("NVIDIA H100 80GB HBM3").name == "H100 SXM"
    assert ceilings_for("NVIDIA A100-SXM4-80GB").name == "A100 80GB"
    assert ceilings_for("NVIDIA A100-SXM4-40GB").name == "A100 40GB"
    assert ceilings_for("NVIDIA L40S").name == "L40S"
    assert ceilings_for("NVIDIA L4").name == "L4"
    assert ceilings_for("CPU (Triton interpreter)").name == "CPU"
    assert ceilings_for("Some Future Accelerator").name == "generic GPU"
    assert ceilings_for(None).name == "generic GPU"
    h200 = ceilings_for("NVIDIA H200")
    assert isinstance(h200, DeviceCeilings) and h200.approximate
    assert h200.copy_bandwidth == pytest.approx(4.2e12)
    assert h200.tensor_tflops == pytest.approx(790.0)
    assert "approximate" in h200.describe()


def test_device_defaults_to_the_samples_device_and_errors_are_clear():
    result = estimate("relu", [Sample((torch.randn(4, 4),), {})])
    assert result.ceilings.name == "CPU"
    with pytest.raises(ValueError, match="at least one sample"):
        estimate("relu", [], H200)
    with pytest.raises(TypeError, match="Sample"):
        estimate("relu", [torch.randn(3)], H200)
