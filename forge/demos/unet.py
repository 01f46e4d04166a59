"""The `unet` demo: a diffusion-UNet stack (SDXL's upper two levels) written with plain `torch.nn`.

A timestep embedding, ResBlocks (GroupNorm -> SiLU -> conv3x3, twice, with the time embedding added in between),
a strided-conv downsample, a nearest-neighbour upsample + conv, skip connections concatenated on the way up, and
spatial transformer blocks (GroupNorm, proj_in, LayerNorm -> self-attention through SDPA, LayerNorm -> GEGLU
feed-forward, proj_out) at the lower resolution only, as SDXL does. Cross-attention to a text encoder is left out:
it adds no new `torch.nn.functional` call.

Why this model: it is made of ops where PyTorch sits far from the H200's roofline. Eager `group_norm` at SD shapes
([2,320,64,64] fp16, 32 groups) runs at 4.7 % of its memory floor and `torch.compile`'s at 7.9 %, about as long as
a 3x3 conv of the same activation (0.053 vs 0.054 ms; ../shared/reference/h200_anchor_ops.md). Its statistics
kernel runs one block per (sample, group), so its time follows the elements per group, while a conv's follows
batch x channels: group_norm's share grows at low batch and high resolution.

Why these sizes (H200, torch 2.11, `benchmarks/demo_profile.py`): SD-1.5 latents (batch 2, 4 x 64 x 64) were
host-bound, 5.8 ms of host time per eager forward against 3.0 ms of kernels (group_norm 19 % of them). The GPU
config is one SDXL denoising step of a 1024-px image with classifier-free guidance (batch 2, 4 x 128 x 128
latents, fp16) through 320 channels at 128 x 128 and 640 at 64 x 64 with head_dim 64: four times the kernel time
of the 64 x 64 profile for the same launches, so the device, not the host, sets the pace of an eager forward.
The CPU config is a tiny fp32 one (0.35M parameters, 16 x 16) that runs in
milliseconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from forge.samples import Sample

__all__ = ["DemoUNet", "UNetConfig", "unet_config", "unet_inputs", "unet_model"]


@dataclass(frozen=True)
class UNetConfig:
    """The UNet's sizes; the defaults are the GPU demo (SDXL 1024-px with CFG: 2 x 4 x 128 x 128 fp16 latents)."""

    in_channels: int = 4
    channels: tuple[int, ...] = (320, 640)  # per resolution level, halving the spatial size each level
    attention: tuple[bool, ...] = (False, True)  # a transformer block after each ResBlock of that level
    layers_per_level: int = 1
    groups: int = 32
    head_dim: int = 64
    time_dim: int = 1280
    ff_mult: int = 4
    batch: int = 2
    size: int = 128
    dtype: torch.dtype = torch.float16

    def __post_init__(self) -> None:
        if len(self.channels) != len(self.attention) or not self.channels:
            raise ValueError("channels and attention need one entry per level")
        if any(c % self.groups for c in self.channels):
            raise ValueError(f"every channel count must be a multiple of groups={self.groups}")
        if any(c % self.head_dim for c, a in zip(self.channels, self.attention, strict=True) if a):
            raise ValueError(f"attention levels need channels divisible by head_dim={self.head_dim}")
        if self.size % 2 ** (len(self.channels) - 1):
            raise ValueError(f"size {self.size} cannot be halved {len(self.channels) - 1} time(s)")


def unet_config(device: str | torch.device) -> UNetConfig:
    """GPU: batch 2 of 4 x 128 x 128 fp16 latents, 320/640 channels; CPU: batch 1 of 4 x 16 x 16 fp32, 32/32.

    The CPU config keeps 32 channels on both levels: every distinct input shape costs one torch.compile per
    function in `kforge optimize`, and 32/64 channels gave group_norm 8 shapes instead of 5 (81 s vs 52 s for the
    whole command on a loaded 2-core machine).
    """
    if torch.device(device).type == "cuda":
        return UNetConfig()
    return UNetConfig(channels=(32, 32), groups=8, head_dim=32, time_dim=128, batch=1, size=16, dtype=torch.float32)


def timestep_embedding(timesteps: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    """Sinusoidal embedding [batch, dim] of float timesteps [batch] (cos then sin, as in SD), in fp32."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, device=timesteps.device, dtype=torch.float32) / half)
    angles = timesteps.float()[:, None] * freqs[None, :]
    return torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)


class ResBlock(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, config: UNetConfig) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(config.groups, in_channels, eps=1e-5)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.time_proj = nn.Linear(config.time_dim, out_channels)
        self.norm2 = nn.GroupNorm(config.groups, out_channels, eps=1e-5)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1)
        self.skip = nn.Conv2d(in_channels, out_channels, 1) if in_channels != out_channels else nn.Identity()

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.time_proj(F.silu(temb))[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        return self.skip(x) + h


class SelfAttention(nn.Module):
    def __init__(self, channels: int, head_dim: int) -> None:
        super().__init__()
        self.heads = channels // head_dim
        self.to_q = nn.Linear(channels, channels, bias=False)
        self.to_k = nn.Linear(channels, channels, bias=False)
        self.to_v = nn.Linear(channels, channels, bias=False)
        self.to_out = nn.Linear(channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape

        def heads(y: torch.Tensor) -> torch.Tensor:
            return y.view(b, t, self.heads, c // self.heads).transpose(1, 2)

        out = F.scaled_dot_product_attention(heads(self.to_q(x)), heads(self.to_k(x)), heads(self.to_v(x)))
        return self.to_out(out.transpose(1, 2).reshape(b, t, c))


class GEGLU(nn.Module):
    def __init__(self, channels: int, mult: int) -> None:
        super().__init__()
        self.proj = nn.Linear(channels, 2 * mult * channels)
        self.out = nn.Linear(mult * channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        value, gate = self.proj(x).chunk(2, dim=-1)
        return self.out(value * F.gelu(gate))


class SpatialTransformer(nn.Module):
    """GroupNorm -> tokens -> proj_in -> (LayerNorm -> self-attention) -> (LayerNorm -> GEGLU) -> proj_out."""

    def __init__(self, channels: int, config: UNetConfig) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(config.groups, channels, eps=1e-6)
        self.proj_in = nn.Linear(channels, channels)
        self.norm1 = nn.LayerNorm(channels)
        self.attention = SelfAttention(channels, config.head_dim)
        self.norm2 = nn.LayerNorm(channels)
        self.feed_forward = GEGLU(channels, config.ff_mult)
        self.proj_out = nn.Linear(channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        tokens = self.proj_in(self.norm(x).permute(0, 2, 3, 1).reshape(b, h * w, c))
        tokens = tokens + self.attention(self.norm1(tokens))
        tokens = tokens + self.feed_forward(self.norm2(tokens))
        return self.proj_out(tokens).reshape(b, h, w, c).permute(0, 3, 1, 2).contiguous() + x


class Stage(nn.Module):
    """One ResBlock, then a transformer block on attention levels."""

    def __init__(self, in_channels: int, out_channels: int, attention: bool, config: UNetConfig) -> None:
        super().__init__()
        self.res = ResBlock(in_channels, out_channels, config)
        self.transformer = SpatialTransformer(out_channels, config) if attention else None

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        x = self.res(x, temb)
        return self.transformer(x) if self.transformer is not None else x


class Downsample(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, stride=2, padding=1)

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


class Upsample(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class DemoUNet(nn.Module):
    """(latents [batch, in_channels, size, size], timesteps [batch]) -> predicted noise, same shape as latents."""

    def __init__(self, config: UNetConfig) -> None:
        super().__init__()
        self.config = config
        first, last = config.channels[0], config.channels[-1]
        self.time_in = nn.Linear(first, config.time_dim)
        self.time_out = nn.Linear(config.time_dim, config.time_dim)
        self.conv_in = nn.Conv2d(config.in_channels, first, 3, padding=1)

        # Down: every block's output is kept as a skip for the up path.
        self.down = nn.ModuleList()
        skips, width = [first], first
        for level, (channels, attention) in enumerate(zip(config.channels, config.attention, strict=True)):
            for _ in range(config.layers_per_level):
                self.down.append(Stage(width, channels, attention, config))
                skips.append(width := channels)
            if level < len(config.channels) - 1:
                self.down.append(Downsample(width))
                skips.append(width)

        self.mid = nn.ModuleList([Stage(last, last, True, config), Stage(last, last, False, config)])

        # Up: each Stage concatenates one skip (last in, first out); an Upsample takes none.
        self.up = nn.ModuleList()
        for level in reversed(range(len(config.channels))):
            channels, attention = config.channels[level], config.attention[level]
            for _ in range(config.layers_per_level + 1):
                self.up.append(Stage(width + skips.pop(), channels, attention, config))
                width = channels
            if level > 0:
                self.up.append(Upsample(width))

        self.norm_out = nn.GroupNorm(config.groups, first, eps=1e-5)
        self.conv_out = nn.Conv2d(first, config.in_channels, 3, padding=1)

    def forward(self, latents: torch.Tensor, timesteps: torch.Tensor) -> torch.Tensor:
        temb = timestep_embedding(timesteps, self.time_in.in_features).to(self.time_in.weight.dtype)
        temb = self.time_out(F.silu(self.time_in(temb)))
        x = self.conv_in(latents)
        skips = [x]
        for block in self.down:
            x = block(x, temb)
            skips.append(x)
        for block in self.mid:
            x = block(x, temb)
        for block in self.up:
            x = block(torch.cat([x, skips.pop()], dim=1), temb) if isinstance(block, Stage) else block(x, temb)
        return self.conv_out(F.silu(self.norm_out(x)))


def unet_model(device: str | torch.device = "cpu", config: UNetConfig | None = None, seed: int = 0) -> DemoUNet:
    """The demo UNet with seeded (PyTorch default) weights, in eval mode, on `device` in the config's dtype."""
    config = config or unet_config(device)
    torch.manual_seed(seed)
    return DemoUNet(config).to(device=device, dtype=config.dtype).eval()


def unet_inputs(device: str | torch.device = "cpu", config: UNetConfig | None = None, seed: int = 1) -> list[Sample]:
    """Two denoising steps: random latents in the model's dtype and float32 timesteps in [0, 1000)."""
    config = config or unet_config(device)
    gen = torch.Generator().manual_seed(seed)
    samples = []
    for _ in range(2):
        latents = torch.randn(config.batch, config.in_channels, config.size, config.size, generator=gen)
        timesteps = torch.randint(0, 1000, (config.batch,), generator=gen).float()
        samples.append(Sample((latents.to(device=device, dtype=config.dtype), timesteps.to(device)), {}))
    return samples
