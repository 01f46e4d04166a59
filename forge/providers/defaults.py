"""The static providers `kforge optimize` tries by default on a given device."""

from __future__ import annotations

import torch

from forge.provider import KernelProvider
from forge.providers.compiled_function import CompiledFunctionProvider
from forge.providers.patch_conv import PatchConvProvider
from forge.providers.torch_sdpa import TorchSDPAProvider, default_sdpa_backends

__all__ = ["default_providers", "COMPILED_FUNCTIONS"]

# Functions where a per-function torch.compile (Inductor-generated Triton) can beat eager: norms, activations,
# softmax and losses. linear/conv stay on cuBLAS/cuDNN under the default mode, so they are not listed.
COMPILED_FUNCTIONS = (
    "layer_norm",
    "rms_norm",
    "group_norm",
    "gelu",
    "silu",
    "softmax",
    "log_softmax",
    "cross_entropy",
)


def default_providers(device: str | torch.device = "cpu") -> list[KernelProvider]:
    """SDPA backends (on CUDA: `default_sdpa_backends()`), per-function `torch.compile` for the functions in
    `COMPILED_FUNCTIONS`, patch convolutions as one GEMM (`PatchConvProvider`) and, on CUDA, the measured-to-win
    functions of every installed kernel library (`forge.providers.libraries`)."""
    from forge.providers.libraries import installed_library_providers

    providers: list[KernelProvider] = []
    cuda = torch.device(device).type == "cuda"
    if cuda:
        providers += [TorchSDPAProvider(b) for b in default_sdpa_backends()]
    providers += [CompiledFunctionProvider(name) for name in COMPILED_FUNCTIONS]
    providers.append(PatchConvProvider())
    if cuda:
        providers += installed_library_providers(device)
    return providers
