"""Demos built from real model libraries, with random weights from their configs: `hf-llama` (Hugging Face
`LlamaForCausalLM`), `timm-vit` (timm `vit_base_patch16_224`) and `diffusers-unet` (diffusers
`UNet2DConditionModel`).

Why: a plan that helps hand-written demos and not the models users run is not a result. These are the three
architectures of the product's own field test (H200: Llama-3.2-1B at 1 x 2048 tokens bf16, ViT-B/16 at batch 32
fp16, the SD-1.5 UNet at batch 2 x 4 x 64 x 64 fp16), built by their libraries' own classes, so the profile, the
oracle and the runtime meet the code those libraries ship: `ModelOutput`s, diffusers output dataclasses, fused
attention switches, `torch.nn.functional` calls inside `LlamaAttention` and so on. On the CPU each demo is a tiny
fp32 config of the same class that runs in seconds.

The libraries are optional (`pip install -e ".[models]"` for transformers and diffusers, `".[vision]"` for timm,
which needs a torchvision built for the installed torch): a demo whose library is missing fails with a one-line error
naming the package and the extra.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from forge.errors import UsageError
from forge.samples import Sample

__all__ = ["diffusers_unet", "diffusers_unet_inputs", "hf_llama", "hf_llama_inputs", "timm_vit", "timm_vit_inputs"]

Device = str | torch.device


_EXTRAS = {"timm": "vision"}


def _library(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        extra = _EXTRAS.get(name, "models")
        raise UsageError(f"this demo needs the {name!r} package: pip install -e \".[{extra}]\" "
                         f"(or pip install {name})") from None


def _gpu(device: Device) -> bool:
    return torch.device(device).type == "cuda"


def _seeded(build: Callable[[], nn.Module], device: Device, dtype: torch.dtype) -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = build()
    return model.to(device=device, dtype=dtype).eval()


# -- Hugging Face Llama --------------------------------------------------------------------------------------
def _llama_config(device: Device) -> Any:
    transformers = _library("transformers")
    if _gpu(device):  # Llama-3.2-1B
        sizes = dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=4096,
                     rope_theta=500000.0, tie_word_embeddings=True)
    else:
        sizes = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128)
    return transformers.LlamaConfig(**sizes, attn_implementation="sdpa", use_cache=False)


def hf_llama(device: Device) -> nn.Module:
    """`LlamaForCausalLM` at the Llama-3.2-1B config (bf16) on CUDA, a 2-layer fp32 one on the CPU."""
    transformers = _library("transformers")
    config = _llama_config(device)
    dtype = torch.bfloat16 if _gpu(device) else torch.float32
    return _seeded(lambda: transformers.LlamaForCausalLM(config), device, dtype)


def hf_llama_inputs(device: Device) -> list[Sample]:
    """One prefill: 1 x 2048 tokens on CUDA, 1 x 32 on the CPU."""
    config = _llama_config(device)
    tokens = 2048 if _gpu(device) else 32
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, config.vocab_size, (1, tokens), generator=generator).to(device)
    return [Sample((ids,), {})]


# -- timm ViT ------------------------------------------------------------------------------------------------
def timm_vit(device: Device) -> nn.Module:
    """`vit_base_patch16_224` (fp16) on CUDA; a 2-block, 64-wide ViT of the same class on the CPU."""
    timm = _library("timm")
    if _gpu(device):
        return _seeded(lambda: timm.create_model("vit_base_patch16_224", pretrained=False), device, torch.float16)
    return _seeded(lambda: timm.models.vision_transformer.VisionTransformer(
        img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, num_classes=10), device, torch.float32)


def timm_vit_inputs(device: Device) -> list[Sample]:
    """Batch 32 x 3 x 224 x 224 fp16 on CUDA, 2 x 3 x 32 x 32 fp32 on the CPU."""
    generator = torch.Generator().manual_seed(2)
    if _gpu(device):
        images = torch.randn(32, 3, 224, 224, generator=generator).to(device=device, dtype=torch.float16)
    else:
        images = torch.randn(2, 3, 32, 32, generator=generator).to(device)
    return [Sample((images,), {})]


# -- diffusers UNet ------------------------------------------------------------------------------------------
def _unet_config(device: Device) -> dict[str, Any]:
    if _gpu(device):  # Stable Diffusion 1.5
        return dict(sample_size=64, in_channels=4, out_channels=4, layers_per_block=2,
                    block_out_channels=(320, 640, 1280, 1280), cross_attention_dim=768, attention_head_dim=8,
                    down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D",
                                      "DownBlock2D"),
                    up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"))
    return dict(sample_size=16, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(32, 64),
                cross_attention_dim=32, attention_head_dim=4, norm_num_groups=8,
                down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"))


def diffusers_unet(device: Device) -> nn.Module:
    """`UNet2DConditionModel` at the SD-1.5 config (fp16) on CUDA, a two-level fp32 one on the CPU."""
    diffusers = _library("diffusers")
    config = _unet_config(device)
    dtype = torch.float16 if _gpu(device) else torch.float32
    logs = diffusers.utils.logging
    level = logs.get_verbosity()
    logs.set_verbosity_error()  # its note on casting with .to() instead of from_pretrained(torch_dtype=) is noise here
    try:
        return _seeded(lambda: diffusers.UNet2DConditionModel(**config), device, dtype)
    finally:
        logs.set_verbosity(level)


def diffusers_unet_inputs(device: Device) -> list[Sample]:
    """One denoising step with classifier-free guidance: latents 2 x 4 x 64 x 64, 77 text tokens (CUDA)."""
    config = _unet_config(device)
    dtype = torch.float16 if _gpu(device) else torch.float32
    side, tokens = config["sample_size"], 77 if _gpu(device) else 8
    generator = torch.Generator().manual_seed(3)
    latents = torch.randn(2, 4, side, side, generator=generator).to(device=device, dtype=dtype)
    text = torch.randn(2, tokens, config["cross_attention_dim"], generator=generator).to(device=device, dtype=dtype)
    timestep = torch.tensor(500, device=device)
    return [Sample((latents, timestep), {"encoder_hidden_states": text})]
