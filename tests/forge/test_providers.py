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
