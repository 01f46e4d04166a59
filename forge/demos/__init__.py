"""The embedded demo models of `kforge optimize --demo [NAME]`: name -> model factory, inputs factory, description.

Two demos, chosen so that kernel replacement can show in the whole model's latency on an H200 (the first demo, a
62M-parameter decoder at 4 x 512 tokens, was launch-bound: 1.25 ms of kernels in a 2 ms forward):

- `llama` (default): a Llama-style decoder at prefill size, GPU-bound (see `forge.demos.llama`);
- `unet`: a diffusion-UNet stack of conv, group_norm, silu, attention and layer_norm, ops where eager PyTorch and
  Inductor sit far from the roofline (group_norm at 5-8 %; see `forge.demos.unet`);
- `hf-llama`, `timm-vit`, `diffusers-unet`: the models users run, built by their own libraries with random weights
  (`forge.demos.libraries`; optional `[models]` extra).

Each factory takes the device and picks its config from it: full size on CUDA, a tiny fp32 model on the CPU so the
CLI demo finishes in seconds there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from forge.demos.libraries import (
    diffusers_unet,
    diffusers_unet_inputs,
    hf_llama,
    hf_llama_inputs,
    timm_vit,
    timm_vit_inputs,
)
from forge.demos.llama import demo_inputs, demo_model
from forge.demos.unet import unet_inputs, unet_model
from forge.errors import KernelForgeError
from forge.samples import Sample

__all__ = ["DEFAULT_DEMO", "DEMOS", "Demo", "UnknownDemoError", "demo_names", "get_demo"]

Device = str | torch.device


@dataclass(frozen=True)
class Demo:
    """One embedded demo: `model(device)` and `inputs(device)` build it; `description` is shown by the CLI."""

    name: str
    model: Callable[[Device], nn.Module]
    inputs: Callable[[Device], list[Sample]]
    description: str


class UnknownDemoError(KernelForgeError, ValueError):
    """A demo name that is not in `DEMOS`; the message names the choices."""


DEFAULT_DEMO = "llama"

DEMOS: dict[str, Demo] = {
    demo.name: demo
    for demo in (
        Demo("llama", demo_model, demo_inputs,
             "Llama-style decoder at prefill (GQA SDPA, RMSNorm, SwiGLU, vocab softmax)"),
        Demo("unet", unet_model, unet_inputs,
             "diffusion UNet (ResBlocks of GroupNorm/SiLU/conv3x3, self-attention with LayerNorm)"),
        Demo("hf-llama", hf_llama, hf_llama_inputs,
             "Hugging Face LlamaForCausalLM, Llama-3.2-1B config, random weights (needs the [models] extra)"),
        Demo("timm-vit", timm_vit, timm_vit_inputs,
             "timm vit_base_patch16_224, random weights (needs the [vision] extra)"),
        Demo("diffusers-unet", diffusers_unet, diffusers_unet_inputs,
             "diffusers UNet2DConditionModel, SD-1.5 config, random weights (needs the [models] extra)"),
    )
}


def demo_names() -> list[str]:
    """The registered demo names, default first."""
    return [DEFAULT_DEMO, *sorted(n for n in DEMOS if n != DEFAULT_DEMO)]


def get_demo(name: str | None = None) -> Demo:
    """The demo called `name` (None: the default); `UnknownDemoError` naming the choices otherwise."""
    name = DEFAULT_DEMO if name is None else name
    try:
        return DEMOS[name]
    except KeyError:
        raise UnknownDemoError(f"unknown demo {name!r}; choose one of: {', '.join(demo_names())}") from None
