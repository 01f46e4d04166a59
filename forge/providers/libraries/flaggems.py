"""FlagGems (`flag-gems`, pure Triton aten-level kernels) as a kernel library: F adapters and their limits.

Measured on one H200 through kernel-forge's oracle and benchmark (`benchmarks/library_providers.py`, BENCHMARKS.md;
FlagGems 5.0.2, torch 2.11, triton 3.6), per call vs eager on the built-in suite's shapes. Device timing (CUDA-graph
replay, what `cuda_graphs` / `compile` deployments pay): layer_norm 1.62-1.84x (GPT-2 fp32, BERT, ViT, Whisper
fp16), rms_norm 1.06-1.71x (Llama / Mistral bf16), softmax 1.04-1.07x, group_norm 0.97-1.01x (SD-VAE, power-of-two
groups), gelu / silu 0.46-1.00x. Host-inclusive timing (eager forwards): all but softmax (1.02-1.06x) lose
(0.05-0.50x): a layer_norm call costs 80-95 us host-inclusive against 17-23 us of kernel, the rest is Python launch
overhead (`libentry`). So `default_functions` are layer_norm, rms_norm and softmax, and the optimizer keeps them
only where they beat eager under the timing mode of the deployment.

group_norm: FlagGems 5.0.2's `group_norm_kernel` tiles a group's channels with `next_power_of_2(C // G)` rows and
masks them with `channel < C` instead of `channel < this group's end`. When C // G is not a power of two (SD-UNet:
320 / 32 = 10) every program but the last one of a sample reads the next group's channels into its mean and
variance and writes normalised values over them, racing the program that owns them. On the H200, fp16
[2,320,64,64], 32 groups: max |error| vs float64 1.39 (eager: 4.1e-3), 3.65 when groups have different means, and
20 identical calls are not bitwise identical; with 16 channels per group: 1.95e-3 and the oracle passes it. So the
kernel is wrong, not kernel-forge's tolerance; the adapter refuses C // G that is not a power of two.

FlagGems needs a GPU to be imported at all ("No device were detected" on a CPU-only machine) and pins numpy,
PyYAML, packaging and sqlalchemy exactly; `pip install -e ".[flaggems]"` installs it, `--no-deps` plus sqlalchemy
avoids the pins on an image that has newer numpy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

import torch

from forge.providers.libraries.base import KernelLibrary, LibraryFunction
from forge.providers.libraries.checks import (
    all_of,
    floating_input,
    rejects_true,
    requires,
)

__all__ = ["FLAGGEMS", "group_norm_refusal"]


def _layer_norm(fg: ModuleType) -> Callable[..., Any]:
    op = fg.layer_norm

    def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):  # noqa: A002 - F's names
        return op(input, normalized_shape, weight, bias, eps)[0]

    return layer_norm


def _normalized_trailing(arguments: Mapping[str, Any]) -> str | None:
    shape, tensor = tuple(arguments.get("normalized_shape") or ()), arguments["input"]
    if not shape or tuple(tensor.shape[-len(shape):]) != shape:
        return f"normalized_shape {list(shape)} is not the input's trailing shape"
    return None


def _rms_norm(fg: ModuleType) -> Callable[..., Any]:
    op = fg.rms_norm

    def rms_norm(input, normalized_shape, weight=None, eps=None):  # noqa: A002 - F's names
        return op(input, normalized_shape, weight, torch.finfo(input.dtype).eps if eps is None else eps)

    return rms_norm


def group_norm_refusal(arguments: Mapping[str, Any]) -> str | None:
    """FlagGems group_norm is only right when channels per group is a power of two (see the module docstring)."""
    tensor, groups = arguments["input"], arguments["num_groups"]
    if tensor.ndim < 2 or groups < 1 or tensor.shape[1] % groups:
        return f"num_groups={groups} does not divide the channels of {list(tensor.shape)}"
    per_group = tensor.shape[1] // groups
    if per_group & (per_group - 1):
        return (f"{per_group} channels per group is not a power of two: FlagGems 5.0.2's group_norm kernel then "
                "reads and writes the next group's channels")
    return None


def _group_norm(fg: ModuleType) -> Callable[..., Any]:
    op = fg.group_norm

    def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):  # noqa: A002 - F's names
        n, c = input.shape[0], input.shape[1]
        return op(input, weight, bias, n, c, input.numel() // (n * c), num_groups, eps)[0]

    return group_norm


def _softmax(fg: ModuleType) -> Callable[..., Any]:
    op = fg.softmax

    def softmax(input, dim=None, _stacklevel=3, dtype=None):  # noqa: A002 - F's names
        if dtype is not None:
            input = input.to(dtype)
        return op(input, dim, False)

    return softmax


def _softmax_dim_given(arguments: Mapping[str, Any]) -> str | None:
    return "softmax without dim (legacy implicit dim) is not supported" if arguments.get("dim") is None else None


def _gelu(fg: ModuleType) -> Callable[..., Any]:
    op = fg.gelu

    def gelu(input, approximate="none"):  # noqa: A002 - F's names
        return op(input, approximate=approximate)

    return gelu


def _silu(fg: ModuleType) -> Callable[..., Any]:
    op = fg.silu

    def silu(input, inplace=False):  # noqa: A002 - F's names
        return op(input)

    return silu


FLAGGEMS = KernelLibrary(
    name="flaggems",
    title="FlagGems",
    module="flag_gems",
    install_hint='pip install -e ".[flaggems]"',
    functions=(
        LibraryFunction("layer_norm", _layer_norm, all_of(floating_input, _normalized_trailing)),
        LibraryFunction("rms_norm", _rms_norm, all_of(floating_input, requires("weight"), _normalized_trailing)),
        LibraryFunction("group_norm", _group_norm, all_of(floating_input, group_norm_refusal)),
        LibraryFunction("softmax", _softmax, all_of(floating_input, _softmax_dim_given)),
        LibraryFunction("gelu", _gelu, floating_input),
        LibraryFunction("silu", _silu, all_of(floating_input, rejects_true("inplace"))),
    ),
    default_functions=("layer_norm", "rms_norm", "softmax"),
)
