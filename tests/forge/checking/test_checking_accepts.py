"""The oracle accepts honest re-implementations: other reduction orders, fp32 accumulation, real Triton kernels,
torch.compile'd functions, non-contiguous inputs, nested outputs and in-place ops."""

from __future__ import annotations

import logging
import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import _get_current_dispatch_mode

from forge.checking import validate
from forge.samples import Sample, sample_from_json, sample_to_json

DTYPES = [torch.float32, torch.bfloat16]


def layer_norm_by_moments(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    dims = tuple(range(-len(normalized_shape), 0))
    xf = x.float()
    mean = xf.mean(dims, keepdim=True)
    var = (xf - mean).square().mean(dims, keepdim=True)
    y = (xf - mean) * torch.rsqrt(var + eps)
    if weight is not None:
        y = y * weight.float()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def softmax_by_exp(x, dim):
    xf = x.float()
    e = (xf - xf.amax(dim, keepdim=True)).exp()
    # PyTorch's softmax returns a fresh row-major tensor on CPU whatever the input's strides; so does this one.
    return (e / e.sum(dim, keepdim=True)).to(x.dtype).contiguous()


def gelu_by_erf(x):
    xf = x.float()
    return (0.5 * xf * (1.0 + torch.erf(xf / math.sqrt(2.0)))).to(x.dtype)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("dtype", DTYPES)
def test_accepts_layer_norm_from_mean_and_var(dtype):
    g = _gen(10)
    contiguous = torch.randn(8, 64, generator=g).to(dtype)
    strided = torch.randn(4, 128, generator=g).to(dtype)[:, ::2]  # non-contiguous rows
    assert not strided.is_contiguous()
    w, b = torch.randn(64, generator=g).to(dtype), torch.randn(64, generator=g).to(dtype)
    samples = [Sample((contiguous, (64,), w, b), {"eps": 1e-5}), Sample((strided, (64,)), {"eps": 1e-6})]
    assert validate(F.layer_norm, layer_norm_by_moments, samples) == []


@pytest.mark.parametrize("dtype", DTYPES)
def test_accepts_softmax_from_exp_and_sum(dtype):
    g = _gen(11)
    transposed = torch.randn(32, 6, generator=g).to(dtype).t()  # stride (1, 6)
    assert not transposed.is_contiguous()
    samples = [
        Sample((torch.randn(4, 100, generator=g).to(dtype),), {"dim": -1}),
        Sample((transposed,), {"dim": -1}),
        Sample((torch.randn(2, 3, 5, generator=g).to(dtype) * 10,), {"dim": 1}),
    ]
    assert validate(F.softmax, softmax_by_exp, samples) == []


@pytest.mark.parametrize("dtype", DTYPES)
def test_accepts_gelu_from_erf(dtype):
    g = _gen(12)
    samples = [
        Sample((torch.randn(256, generator=g).to(dtype) * 3,), {}),
        Sample((torch.randn(8, 16, generator=g).to(dtype).t(),), {}),
    ]
    assert validate(F.gelu, gelu_by_erf, samples) == []


def max_pool2d_by_unfold(x, kernel_size, return_indices=False):
    k = kernel_size
    n, c, h, w = x.shape
    windows = x.unfold(2, k, k).unfold(3, k, k)  # n, c, oh, ow, k, k
    oh, ow = windows.shape[2], windows.shape[3]
    values, local = windows.reshape(n, c, oh, ow, k * k).max(dim=-1)
    rows = torch.arange(oh).view(oh, 1) * k + local // k
    cols = torch.arange(ow).view(1, ow) * k + local % k
    indices = rows * w + cols
    return (values.contiguous(), indices) if return_indices else values.contiguous()


def test_accepts_max_pool2d_with_indices_as_nested_tuple_output():
    g = _gen(13)
    samples = [
        Sample((torch.randn(2, 3, 8, 8, generator=g), 2), {"return_indices": True}),
        Sample((torch.randn(1, 2, 12, 6, generator=g).transpose(2, 3), 3), {"return_indices": True}),
    ]
    assert validate(F.max_pool2d, max_pool2d_by_unfold, samples) == []


def test_accepts_nested_dict_and_tuple_outputs():
    def reference(x, scale):
        return {"scaled": x * scale, "stats": (x.sum(-1), (x.amax(-1), x.argmax(-1))), "n": x.shape[-1]}

    def candidate(x, scale):
        total = torch.zeros(x.shape[:-1])
        for i in range(x.shape[-1]):  # another summation order
            total += x[..., i]
        best, where = x.max(-1)
        return {"scaled": scale * x, "stats": (total, (best, where)), "n": x.shape[-1]}

    samples = [Sample((torch.randn(5, 7, generator=_gen(14)), 0.5), {})]
    assert validate(reference, candidate, samples) == []


def test_accepts_in_place_op_that_mutates_the_same_way():
    samples = [Sample((torch.randn(4, 8, generator=_gen(15)),), {"inplace": True})]
    assert validate(F.relu, lambda x, inplace: x.clamp_(min=0), samples) == []


def test_accepts_when_the_float64_reference_is_unavailable():
    def reference(x):
        if x.dtype == torch.float64:
            raise TypeError("no float64 kernel")
        return torch.tanh(x)

    samples = [Sample((torch.randn(64, generator=_gen(16)),), {})]
    assert validate(reference, lambda x: 1.0 - 2.0 / (torch.exp(2.0 * x) + 1.0), samples) == []
    assert validate(reference, lambda x: torch.tanh(x) * 1.01, samples)


def test_drawn_inputs_the_reference_rejects_are_skipped(caplog):
    captured = torch.randn(6, generator=_gen(17))

    def reference(x):
        if not torch.equal(x, captured):
            raise ValueError("only the captured input is valid")
        return x * 2

    with caplog.at_level(logging.DEBUG, logger="forge.checking.validation"):
        assert validate(reference, lambda x: x + x, [Sample((captured,), {})]) == []
    assert sum("skipping a drawn input" in r.getMessage() for r in caplog.records) == 2


def test_samples_holding_tensor_specs_are_drawn():
    sample = sample_from_json(sample_to_json(Sample((torch.randn(3, 9, generator=_gen(18)),), {"dim": -1})))
    assert validate(F.softmax, softmax_by_exp, [sample]) == []
    assert validate(F.softmax, lambda x, dim: F.softmax(x, dim=dim) * 1.01, [sample])


def test_tolerance_overrides_loosen_the_floor():
    samples = [Sample((torch.randn(64, generator=_gen(19)),), {})]
    candidate = lambda x: torch.sigmoid(x) * 1.001  # noqa: E731
    assert validate(torch.sigmoid, candidate, samples)
    assert validate(torch.sigmoid, candidate, samples, tolerances={torch.float32: (1e-2, 1e-2)}) == []
    with pytest.raises(TypeError, match="torch.dtype"):
        validate(torch.sigmoid, candidate, samples, tolerances={"float32": (1e-2, 1e-2)})
    with pytest.raises(ValueError, match="non-negative"):
        validate(torch.sigmoid, candidate, samples, tolerances={torch.float32: (-1.0, 0.0)})


def test_bad_harness_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="at least one sample"):
        validate(torch.relu, torch.relu, [])
    with pytest.raises(TypeError, match=r"samples\[0\] must be a forge.samples.Sample"):
        validate(torch.relu, torch.relu, [torch.randn(2)])
    with pytest.raises(ValueError, match="fresh_inputs_per_sample"):
        validate(torch.relu, torch.relu, [Sample((torch.randn(2),), {})], fresh_inputs_per_sample=-1)


def test_candidate_refusing_the_dispatch_mode_falls_back_without_failing(caplog):
    def candidate(x, dim):
        if _get_current_dispatch_mode() is not None:
            raise RuntimeError("cannot run under a dispatch mode")
        return softmax_by_exp(x, dim)

    samples = [Sample((torch.randn(4, 16, generator=_gen(20)),), {"dim": -1})]
    with caplog.at_level(logging.DEBUG, logger="forge.checking.validation"):
        assert validate(F.softmax, candidate, samples) == []
    assert any("only under the poisoning dispatch mode" in r.getMessage() for r in caplog.records)


def test_fallback_still_rejects_an_unwritten_output():
    def candidate(x, dim):
        if _get_current_dispatch_mode() is not None:
            raise RuntimeError("cannot run under a dispatch mode")
        return torch.empty_like(x)

    samples = [Sample((torch.randn(4, 16, generator=_gen(21)),), {"dim": -1})]
    assert validate(F.softmax, candidate, samples)


def test_accepts_torch_compiled_candidate_and_keeps_it_compiled():
    compiled_graphs = []

    def counting_backend(graph_module, example_inputs):
        compiled_graphs.append(graph_module)
        return graph_module.forward

    torch._dynamo.reset()
    candidate = torch.compile(softmax_by_exp, backend=counting_backend)
    samples = [Sample((torch.randn(4, 16, generator=_gen(22)),), {"dim": -1})]
    assert validate(F.softmax, candidate, samples) == []
    # The first call ran outside the poisoning mode, so dynamo compiled the frame instead of skipping it.
    assert compiled_graphs
    assert validate(F.softmax, torch.compile(lambda x, dim: F.softmax(x, dim=dim) * 1.01, backend="eager"), samples)


def _triton_relu(monkeypatch, *, write_all: bool):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    triton = pytest.importorskip("triton")
    tl = pytest.importorskip("triton.language")

    @triton.jit
    def relu_kernel(x_ptr, out_ptr, n, limit, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offsets, mask=offsets < n)
        tl.store(out_ptr + offsets, tl.maximum(x, 0.0), mask=offsets < limit)

    def candidate(x):
        source = x.contiguous()
        out = torch.empty_like(source)
        n = source.numel()
        relu_kernel[(triton.cdiv(n, 64),)](source, out, n, n if write_all else n - 3, BLOCK=64)
        return out

    return candidate


def test_accepts_real_triton_kernel(monkeypatch):
    candidate = _triton_relu(monkeypatch, write_all=True)
    samples = [Sample((torch.randn(200, generator=_gen(23)),), {}), Sample((torch.randn(9, 7).t(),), {})]
    assert validate(F.relu, candidate, samples, fresh_inputs_per_sample=1) == []


def test_rejects_triton_kernel_that_leaves_output_unwritten(monkeypatch):
    candidate = _triton_relu(monkeypatch, write_all=False)
    samples = [Sample((torch.randn(200, generator=_gen(24)),), {})]
    errors = validate(F.relu, candidate, samples, fresh_inputs_per_sample=0)
    assert errors and "output: " in errors[0]


def _self_check_cases(dtype: torch.dtype) -> dict:
    g = _gen(30)

    def r(*shape):
        return torch.randn(*shape, generator=g).to(dtype)

    return {
        "sdpa": (F.scaled_dot_product_attention, Sample((r(1, 2, 8, 16), r(1, 2, 8, 16), r(1, 2, 8, 16)), {})),
        "linear": (F.linear, Sample((r(8, 64), r(32, 64), r(32)), {})),
        "conv2d": (F.conv2d, Sample((r(1, 3, 8, 8), r(4, 3, 3, 3)), {"padding": 1})),
        "group_norm": (F.group_norm, Sample((r(2, 8, 4, 4), 4), {})),
        "embedding": (F.embedding, Sample((torch.randint(0, 10, (4, 7), generator=g), r(10, 16)), {})),
        "interpolate": (F.interpolate, Sample((r(1, 3, 8, 8),), {"scale_factor": 2.0, "mode": "bilinear"})),
        "cross_entropy": (F.cross_entropy, Sample((r(8, 10), torch.randint(0, 10, (8,), generator=g)), {})),
        "dropout_eval": (F.dropout, Sample((r(16),), {"training": False})),
        "silu_inplace": (F.silu, Sample((r(16),), {"inplace": True})),
        "topk": (torch.topk, Sample((r(4, 20), 3), {})),
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_every_reference_passes_against_itself(dtype):
    failures = {}
    for name, (fn, sample) in _self_check_cases(dtype).items():
        errors = validate(fn, fn, [sample], fresh_inputs_per_sample=1)
        if errors:
            failures[name] = errors[0]
    assert failures == {}


def test_accepts_other_strides_on_size_one_dimensions():
    """Strides of dimensions of size 1 address nothing else: a kernel may set them as it likes."""
    x = torch.randn(4, 1, 8, generator=_gen(12))

    def relu_with_odd_unit_stride(t):
        return torch.relu(t).as_strided(t.shape, (8, 1234, 1))

    assert validate(F.relu, relu_with_odd_unit_stride, [Sample((x,), {})]) == []


def test_accepts_a_row_major_output_where_pytorch_keeps_the_input_layout():
    """relu of a transpose keeps the transpose in PyTorch; a kernel that makes its input contiguous returns row-major,
    which every later op (and `view`) takes."""
    x = torch.randn(9, 7, generator=_gen(13)).t()

    def relu_row_major(t):
        return torch.relu(t.contiguous())

    assert validate(F.relu, relu_row_major, [Sample((x,), {})]) == []
