"""The `llama` demo: a Llama-style decoder stack written with plain `torch.nn`, at prefill size.

Embedding, RMSNorm (or LayerNorm), q/k/v/o projections, causal SDPA with grouped-query attention, a SwiGLU (SiLU)
or GELU MLP, a final norm, the LM head and a softmax over the vocabulary: the `torch.nn.functional` calls of a real
decoder.

Why these sizes: the first demo (62M parameters, bf16, batch 4 x 512 tokens) was launch-bound on an H200, about
1.25 ms of kernel time per forward against a 2 ms eager forward, so no kernel replacement could show in the
model's latency. The GPU config is a prefill step of a ~0.3B-parameter decoder (hidden 2048, 4 layers, 16 query /
4 KV heads of 128, SwiGLU 5632, vocab 32000) on 2 x 2048 tokens, ~2.2 TFLOP per forward. Measured on the H200
(torch 2.11, `benchmarks/demo_profile.py`): eager forward 4.05 ms, of which the host needs 1.18 ms to enqueue and
the kernels take 3.71 ms (92 %); a CUDA-graph replay takes 4.10 ms, so the forward is GPU-bound. The CPU config
is the first demo's small fp32 model (0.5M parameters, 2 x 32 tokens) that runs in milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from forge.samples import Sample

__all__ = ["DemoConfig", "DemoDecoder", "demo_config", "demo_inputs", "demo_model"]


@dataclass(frozen=True)
class DemoConfig:
    """The decoder's sizes; the defaults are the GPU demo (prefill of 2 x 2048 tokens)."""

    vocab_size: int = 32000
    hidden: int = 2048
    layers: int = 4
    heads: int = 16
    kv_heads: int = 4
    intermediate: int = 5632
    norm: str = "rms"  # "rms" | "layer"
    activation: str = "silu"  # "silu" (SwiGLU) | "gelu"
    batch: int = 2
    seq_len: int = 2048
    dtype: torch.dtype = torch.bfloat16

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def demo_config(device: str | torch.device) -> DemoConfig:
    """GPU: a ~0.3B-parameter bf16 decoder at prefill (2 x 2048 tokens); CPU: a small fp32 one (2 x 32)."""
    if torch.device(device).type == "cuda":
        return DemoConfig()
    return DemoConfig(
        vocab_size=512, hidden=128, layers=2, heads=4, kv_heads=2, intermediate=352, batch=2, seq_len=32,
        dtype=torch.float32,
    )


def _norm(config: DemoConfig) -> nn.Module:
    if config.norm == "rms":
        return nn.RMSNorm(config.hidden, eps=1e-5)
    if config.norm == "layer":
        return nn.LayerNorm(config.hidden, eps=1e-5)
    raise ValueError(f"unknown norm {config.norm!r}; use 'rms' or 'layer'")


class Attention(nn.Module):
    def __init__(self, config: DemoConfig) -> None:
        super().__init__()
        self.config = config
        d = config.head_dim
        self.q_proj = nn.Linear(config.hidden, config.heads * d, bias=False)
        self.k_proj = nn.Linear(config.hidden, config.kv_heads * d, bias=False)
        self.v_proj = nn.Linear(config.hidden, config.kv_heads * d, bias=False)
        self.o_proj = nn.Linear(config.heads * d, config.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        c = self.config
        q = self.q_proj(x).view(b, t, c.heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, c.kv_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, c.kv_heads, c.head_dim).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, c.heads * c.head_dim))


class MLP(nn.Module):
    def __init__(self, config: DemoConfig) -> None:
        super().__init__()
        self.activation = config.activation
        self.gate_proj = nn.Linear(config.hidden, config.intermediate, bias=False)
        self.up_proj = nn.Linear(config.hidden, config.intermediate, bias=False)
        self.down_proj = nn.Linear(config.intermediate, config.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.gate_proj(x)
        gate = F.silu(gate) if self.activation == "silu" else F.gelu(gate, approximate="tanh")
        return self.down_proj(gate * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: DemoConfig) -> None:
        super().__init__()
        self.input_norm = _norm(config)
        self.attention = Attention(config)
        self.post_attention_norm = _norm(config)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.input_norm(x))
        return x + self.mlp(self.post_attention_norm(x))


class DemoDecoder(nn.Module):
    """Token ids [batch, seq] -> next-token probabilities [batch, seq, vocab]."""

    def __init__(self, config: DemoConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.hidden)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.layers))
        self.norm = _norm(config)
        self.lm_head = nn.Linear(config.hidden, config.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return F.softmax(self.lm_head(self.norm(x)), dim=-1)


def demo_model(device: str | torch.device = "cpu", config: DemoConfig | None = None, seed: int = 0) -> DemoDecoder:
    """The demo decoder with seeded weights, in eval mode, on `device` in the config's dtype."""
    config = config or demo_config(device)
    torch.manual_seed(seed)
    model = DemoDecoder(config)
    for module in model.modules():
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=1.0)
    return model.to(device=device, dtype=config.dtype).eval()


def demo_inputs(device: str | torch.device = "cpu", config: DemoConfig | None = None, seed: int = 1) -> list[Sample]:
    """Two batches of random token ids (the profile sees the same shapes a serving loop would)."""
    config = config or demo_config(device)
    gen = torch.Generator().manual_seed(seed)
    return [
        Sample((torch.randint(0, config.vocab_size, (config.batch, config.seq_len), generator=gen).to(device),), {})
        for _ in range(2)
    ]
