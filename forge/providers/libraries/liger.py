"""Liger-Kernel (`liger-kernel`, pure Triton, written for training) as a kernel library: F adapters and limits.

Measured on one H200 through kernel-forge's oracle and benchmark (`benchmarks/library_providers.py`, BENCHMARKS.md;
Liger-Kernel 0.8.5, torch 2.11, triton 3.6), per call vs eager on the built-in suite's shapes. Device timing
(CUDA-graph replay): layer_norm 1.63-1.84x, rms_norm 1.12-2.11x, softmax 1.04-1.06x, group_norm 0.16x on SD-UNet
(and wrong on SD-VAE shapes with 8 or 16 channels per group: max abs error 10.7, rejected by the oracle).
Host-inclusive timing (eager forwards): all but softmax lose (0.14-0.41x; layer_norm costs 100-150 us per call
against 17-22 us of kernel: the Python side of each autograd-Function launch). So `default_functions` are
layer_norm, rms_norm and softmax.

F-equivalence: rms_norm runs in casting mode "gemma" (normalise and scale in fp32, cast once at the end), which is
what `F.rms_norm` computes; the default "llama" mode casts before the weight multiply. `in_place=False` keeps the
inputs untouched. layer_norm and group_norm need both weight and bias; softmax works over the last dimension only;
group_norm views the input as (N, G, -1), so the input must be contiguous.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

import torch

from forge.providers.libraries.base import KernelLibrary, LibraryFunction
from forge.providers.libraries.checks import all_of, floating_input, last_dim_only, normalized_over_last_dim, requires

__all__ = ["LIGER"]

# Liger's row kernels use one block of next_power_of_2(columns) and raise above this.
_MAX_COLUMNS = 65536


def _columns_fit(arguments: Mapping[str, Any]) -> str | None:
    columns = arguments["input"].shape[-1] if arguments["input"].ndim else 1
    return f"{columns} columns is more than Liger's {_MAX_COLUMNS}" if columns > _MAX_COLUMNS else None


def _layer_norm(lf: ModuleType) -> Callable[..., Any]:
    op = lf.liger_layer_norm

    def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):  # noqa: A002 - F's names
        return op(input, weight, bias, eps)

    return layer_norm


def _rms_norm(lf: ModuleType) -> Callable[..., Any]:
    op = lf.liger_rms_norm

    def rms_norm(input, normalized_shape, weight=None, eps=None):  # noqa: A002 - F's names
        eps = torch.finfo(input.dtype).eps if eps is None else eps
        return op(input, weight, eps, offset=0.0, casting_mode="gemma", in_place=False)

    return rms_norm


def _contiguous_groups(arguments: Mapping[str, Any]) -> str | None:
    tensor, groups = arguments["input"], arguments["num_groups"]
    if tensor.ndim < 2 or groups < 1 or tensor.shape[1] % groups:
        return f"num_groups={groups} does not divide the channels of {list(tensor.shape)}"
    return None if tensor.is_contiguous() else "the input must be contiguous"


def _group_norm(lf: ModuleType) -> Callable[..., Any]:
    op = lf.liger_group_norm

    def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):  # noqa: A002 - F's names
        return op(input, weight, bias, input.shape[1], num_groups, eps)

    return group_norm


def _softmax(lf: ModuleType) -> Callable[..., Any]:
    op = lf.liger_softmax

    def softmax(input, dim=None, _stacklevel=3, dtype=None):  # noqa: A002 - F's names
        return op(input)

    return softmax


LIGER = KernelLibrary(
    name="liger",
    title="Liger-Kernel",
    module="liger_kernel.transformers.functional",
    install_hint='pip install -e ".[liger]"',
    functions=(
        LibraryFunction("layer_norm", _layer_norm,
                        all_of(floating_input, requires("weight", "bias"), normalized_over_last_dim, _columns_fit)),
        LibraryFunction("rms_norm", _rms_norm,
                        all_of(floating_input, requires("weight"), normalized_over_last_dim, _columns_fit)),
        LibraryFunction("group_norm", _group_norm, all_of(floating_input, requires("weight", "bias"),
                                                          _contiguous_groups)),
        LibraryFunction("softmax", _softmax, all_of(floating_input, last_dim_only, _columns_fit)),
    ),
    default_functions=("layer_norm", "rms_norm", "softmax"),
)
