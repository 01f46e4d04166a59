"""Static providers: SDPA backends and per-signature torch.compile, on CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from forge.provider import KernelProvider
from forge.providers import CompiledFunctionProvider, TorchSDPAProvider
from forge.samples import Sample


def test_sdpa_math_backend_prepares_and_matches() -> None:
    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))
    provider = TorchSDPAProvider("math")
    assert provider.prepare([Sample((q, k, v), {"is_causal": True})])
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(provider(q, k, v, is_causal=True), expected)
    assert KernelProvider.from_dict(provider.to_dict()).name == "PyTorch SDPA MATH"


def test_sdpa_backend_that_rejects_the_samples_refuses() -> None:
    q = torch.randn(1, 2, 8, 16)
    # cuDNN attention does not exist on CPU tensors: prepare must say no, not raise.
    assert not TorchSDPAProvider("cudnn").prepare([Sample((q, q, q), {})])


def test_sdpa_backend_names_come_from_one_table() -> None:
    from torch.nn.attention import SDPBackend

    from forge.providers import SDPA_BACKENDS, default_providers, default_sdpa_backends, sdpa_backend_names

    assert sdpa_backend_names() == ("cudnn", "flash", "efficient", "math")
    assert default_sdpa_backends() == ("cudnn", "flash", "efficient")  # math, the unfused path, is not offered
    assert all(TorchSDPAProvider(name).backend is backend for name, backend in SDPA_BACKENDS.items())
    assert TorchSDPAProvider("mem_efficient").backend is SDPBackend.EFFICIENT_ATTENTION  # an alias
    with pytest.raises(ValueError, match="one of: cudnn, efficient, flash, math"):
        TorchSDPAProvider("warp-speed")
    assert not any(isinstance(p, TorchSDPAProvider) for p in default_providers("cpu"))


def test_unknown_backend_and_unknown_mode_errors() -> None:
    with pytest.raises(ValueError, match="unknown SDPA backend"):
        TorchSDPAProvider("warp-speed")
    with pytest.raises(ValueError, match="CUDA graphs"):
        CompiledFunctionProvider("gelu", mode="reduce-overhead")
    with pytest.raises(ValueError, match="not a replaceable"):
        CompiledFunctionProvider("no_such_function")


def test_compiled_provider_per_signature() -> None:
    a, b = torch.randn(4, 32), torch.randn(3, 16)
    provider = CompiledFunctionProvider("silu")
    assert provider.prepare([Sample((a,), {}), Sample((b,), {})])
    assert len(provider._compiled) == 2
    torch.testing.assert_close(provider(a), F.silu(a))
    restored = KernelProvider.from_dict(provider.to_dict())
    torch.testing.assert_close(restored(b), F.silu(b))  # compiles lazily after a load


def test_compiled_provider_passes_the_oracle_and_stays_compiled() -> None:
    from torch._dynamo.utils import counters

    from forge.checking import validate
    from forge.functional import original_function

    x = torch.randn(4, 64)
    provider = CompiledFunctionProvider("softmax")
    sample = Sample((x,), {"dim": -1})
    assert provider.prepare([sample])
    graphs = counters["stats"]["unique_graphs"]
    assert validate(original_function("softmax"), provider, [sample]) == []
    # validation must not make Dynamo recompile the provider into something else
    assert counters["stats"]["unique_graphs"] == graphs


# ---------------------------------------------------------------------------------------------------------
# PatchConvProvider
# ---------------------------------------------------------------------------------------------------------
def _patch_sample(batch=2, channels=3, side=32, patch=8, width=16, dtype=torch.float32, **conv):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(batch, channels, side, side, generator=g, dtype=dtype)
    w = torch.randn(width, channels, patch, patch, generator=g, dtype=dtype) * 0.1
    b = torch.randn(width, generator=g, dtype=dtype)
    return Sample((x, w, b), {"stride": (patch, patch), **conv})


def test_patch_conv_matches_conv2d_and_its_layout():
    from forge.checking import KernelUtils
    from forge.providers import PatchConvProvider

    samples = [_patch_sample(), _patch_sample(side=16, patch=4, dtype=torch.bfloat16)]
    channels_last = _patch_sample()
    channels_last = Sample((channels_last.args[0].contiguous(memory_format=torch.channels_last),
                            *channels_last.args[1:]), dict(channels_last.kwargs))
    samples.append(channels_last)
    provider = PatchConvProvider()
    assert provider.prepare(samples)
    assert KernelUtils(fresh_inputs_per_sample=1).validate(F.conv2d, provider, samples) == []


def test_patch_conv_refuses_what_is_not_a_patch_embedding():
    from forge.providers import PatchConvProvider

    provider = PatchConvProvider()
    assert not provider.prepare([_patch_sample(padding=1)])
    assert not provider.prepare([_patch_sample(groups=1, dilation=2)])
    x, w, b = _patch_sample().args
    assert not provider.prepare([Sample((x, w, b), {"stride": 4})])  # overlapping windows
    assert not provider.prepare([Sample((x[:, :, :30, :30], w, b), {"stride": 8})])  # not a whole number of patches
