"""The oracle and the timer on a CUDA device (skipped without one): caching-allocator poisoning, real Triton and
torch.compile candidates, and side-stream work counted by the benchmark."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import _get_current_dispatch_mode

import forge.checking.validation as validation_module
from forge.checking import benchmark, empty_kernel_launch_us, validate
from forge.samples import Sample

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _samples(dtype=torch.float32, shape=(64, 1024)):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g).to(dtype).cuda()
    w = torch.randn(shape[-1], generator=g).to(dtype).cuda()
    return [Sample((x, (shape[-1],), w, None), {"eps": 1e-5})]


def layer_norm_by_moments(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    xf = x.float()
    mean = xf.mean(-1, keepdim=True)
    y = (xf - mean) * torch.rsqrt((xf - mean).square().mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.float()
    return y.to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_accepts_honest_and_rejects_scaled(dtype):
    assert validate(F.layer_norm, layer_norm_by_moments, _samples(dtype)) == []
    assert validate(F.layer_norm, lambda *a, **k: F.layer_norm(*a, **k) * 1.02, _samples(dtype))


def test_cuda_unwritten_output_is_rejected_without_the_dispatch_mode():
    def candidate(x, *args, **kwargs):
        if _get_current_dispatch_mode() is not None:
            raise RuntimeError("refuses dispatch modes")
        return torch.empty_like(x)  # on CUDA this may be the freed block that held the reference output

    errors = validate(F.layer_norm, candidate, _samples())
    assert errors


def test_cuda_allocator_poisoning_is_what_catches_stale_reference_memory(monkeypatch):
    def candidate(x, *args, **kwargs):
        if _get_current_dispatch_mode() is not None:
            raise RuntimeError("refuses dispatch modes")
        return torch.empty_like(x)

    monkeypatch.setattr(validation_module, "poison_allocator", lambda *a, **k: None)
    undefended = validate(F.layer_norm, candidate, _samples(), fresh_inputs_per_sample=0)
    print("without allocator poisoning:", undefended[:1] or "PASSED (stale reference memory was returned)")


def test_cuda_real_triton_kernel():
    triton = pytest.importorskip("triton")
    tl = pytest.importorskip("triton.language")

    @triton.jit
    def relu_kernel(x_ptr, out_ptr, n, limit, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offsets, mask=offsets < n)
        tl.store(out_ptr + offsets, tl.maximum(x, 0.0), mask=offsets < limit)

    def make(write_all):
        def candidate(x):
            source = x.contiguous()
            out = torch.empty_like(source)
            n = source.numel()
            relu_kernel[(triton.cdiv(n, 1024),)](source, out, n, n if write_all else n - 5, BLOCK=1024)
            return out

        return candidate

    samples = [Sample((torch.randn(4096, device="cuda"),), {}), Sample((torch.randn(33, 65, device="cuda").t(),), {})]
    assert validate(F.relu, make(True), samples) == []
    assert validate(F.relu, make(False), samples)


def test_cuda_torch_compile_candidate():
    torch._dynamo.reset()
    candidate = torch.compile(layer_norm_by_moments)
    assert validate(F.layer_norm, candidate, _samples(torch.bfloat16)) == []


def test_cuda_benchmark_counts_work_queued_on_other_streams():
    a = torch.randn(4096, 4096, device="cuda")
    side = torch.cuda.Stream()

    def on_current_stream(x):
        return x @ x

    def on_side_stream(x):
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            return x @ x  # never joined back: naive current-stream events would miss it

    samples = [Sample((a,), {})]
    main = benchmark(on_current_stream, samples, warmup=3, rounds=20, min_run_time_s=0.05)
    hidden = benchmark(on_side_stream, samples, warmup=3, rounds=20, min_run_time_s=0.05)
    print("current stream", main, "side stream", hidden)
    assert hidden.median_ms > 0.5 * main.median_ms


def test_cuda_empty_kernel_launch_cost():
    cost = empty_kernel_launch_us("cuda")
    print("empty kernel launch", cost, "us")
    assert 0 < cost < 1e4


def test_fresh_inputs_for_a_cuda_target_are_drawn_on_the_device_and_repeat_for_a_seed():
    from forge.samples import TensorSpec, Widening

    spec = TensorSpec.of(torch.randn(64, 1024))
    for widen in (None, Widening()):
        a = spec.draw(torch.Generator().manual_seed(1), device="cuda", widen=widen)
        b = spec.draw(torch.Generator().manual_seed(1), device="cuda", widen=widen)
        c = spec.draw(torch.Generator().manual_seed(2), device="cuda", widen=widen)
        assert a.is_cuda and torch.equal(a, b) and not torch.equal(a, c)
