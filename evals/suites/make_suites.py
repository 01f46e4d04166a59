"""Regenerate `builtin.json` and `smoke.json` from the model configurations below.

Run from the repository root: `python -m evals.suites.make_suites`. The JSON files are the source the loader
reads; this script is how they were written, so every shape can be traced to a model config. Calls mirror how
the `torch.nn` module (or the Hugging Face / diffusers code) calls the functional API: the same positional and
keyword arguments, tuples where `nn.Conv*`/`nn.LayerNorm` pass tuples, and the strides that
`view(...).transpose(1, 2)` gives attention inputs where the model does that. Linear and conv weights draw with
std 1/sqrt(fan_in) (as trained weights roughly have, keeping fp16/bf16 outputs in range); everything else draws
from a standard normal, and integer inputs stay within [low, high].
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from evals.problems import FunctionProblem, Provenance, write_suite_file
from forge.samples import Sample, TensorSpec

HERE = Path(__file__).resolve().parent

BF16, F16, F32, I64 = torch.bfloat16, torch.float16, torch.float32, torch.int64


def t(*shape: int, dtype: torch.dtype, std: float | None = None, stride: tuple[int, ...] | None = None,
      low: int | None = None, high: int | None = None) -> TensorSpec:
    return TensorSpec(shape=tuple(shape), dtype=dtype, stride=stride, low=low, high=high,
                      mean=0.0 if std is not None else None, std=std)


def weight(*shape: int, dtype: torch.dtype) -> TensorSpec:
    """A linear/conv weight: std 1/sqrt(fan_in), fan_in = every dimension but the first."""
    return t(*shape, dtype=dtype, std=round(1.0 / math.sqrt(math.prod(shape[1:])), 6))


def heads_view(batch: int, heads: int, seq: int, head_dim: int, dtype: torch.dtype) -> TensorSpec:
    """`x.view(batch, seq, heads, head_dim).transpose(1, 2)`: shape [batch, heads, seq, head_dim], not contiguous."""
    return t(batch, heads, seq, head_dim, dtype=dtype,
             stride=(seq * heads * head_dim, head_dim, heads * head_dim, 1))


def problem(pid: str, function: str, calls: list[tuple[int, Sample]], *, model: str, layer: str, source: str,
            description: str, suite: str) -> FunctionProblem:
    return FunctionProblem(id=pid, suite=suite, function=function, calls=tuple(calls),
                           provenance=Provenance(model, layer, source), description=description)


def call(*args, count: int = 1, **kwargs) -> tuple[int, Sample]:
    return count, Sample(tuple(args), kwargs)


# ---------------------------------------------------------------------------------------------------------
# Model configurations (from the published configs)
# ---------------------------------------------------------------------------------------------------------
LLAMA = ("Llama-3-8B config: hidden 4096, intermediate 14336, 32 heads, 8 KV heads, head dim 128, vocab 128256, "
         "32 layers, rms_norm_eps 1e-5, bf16")
MISTRAL = ("Mistral-7B-v0.1 config: hidden 4096, intermediate 14336, 32 heads, 8 KV heads, head dim 128, vocab "
           "32000, 32 layers, rms_norm_eps 1e-5, sliding window 4096, bf16")
BERT = ("BERT-base config: hidden 768, 12 heads, intermediate 3072, 12 layers, layer_norm_eps 1e-12, max seq 512; "
        "run in fp16 at batch 32 x seq 512")
VIT = ("ViT-B/16 (224px) config: 196 patches + CLS = 197 tokens, hidden 768, 12 heads (head dim 64), MLP 3072, "
       "12 layers, layer_norm_eps 1e-12 (HF ViTConfig); run in fp16 at batch 64")
GPT2 = ("GPT-2 (124M) config: n_embd 768, 12 heads, n_inner 3072, n_ctx 1024, 12 layers, layer_norm_epsilon 1e-5, "
        "tanh-approximated GELU; run in fp32 (its released dtype) at batch 8 x seq 1024")
SD = ("Stable Diffusion 1.5 UNet config: 512px image -> 64x64 latent, first block 320 channels, GroupNorm 32 groups "
      "eps 1e-5, attention 8 heads x 40 dims (4096 tokens at 64x64); fp16, batch 2 (classifier-free guidance)")
WHISPER = ("Whisper-tiny config: 80 mel bins, 30 s = 3000 frames, d_model 384, 6 heads, encoder FFN 1536, 4 encoder "
           "layers, conv1 k3 pad1, conv2 k3 stride2 pad1, exact GELU, layer_norm eps 1e-5; fp16 at batch 16")


def builtin_problems() -> list[FunctionProblem]:
    s = "builtin"
    h, ffn, vocab, kvh = 4096, 14336, 128256, 8
    out: list[FunctionProblem] = []
    add = out.append

    # -- Llama-3-8B ------------------------------------------------------------------------------------------
    llama = dict(model="Llama-3-8B", suite=s)
    for phase, tokens, note in (("prefill", 2048, "prefill batch 1 x seq 2048"),
                                ("decode32", 32, "decode batch 32 (one token each)")):
        add(problem(f"llama3_8b.{phase}.rms_norm", "rms_norm",
                    [call(t(tokens, h, dtype=BF16), (h,), t(h, dtype=BF16), 1e-5, count=65)],
                    layer="model.layers.*.input_layernorm / post_attention_layernorm, model.norm (RMSNorm)",
                    source=f"{LLAMA}; {note}", description=f"RMSNorm over hidden 4096, {note}, bf16", **llama))
        add(problem(f"llama3_8b.{phase}.silu", "silu", [call(t(tokens, ffn, dtype=BF16), inplace=False, count=32)],
                    layer="model.layers.*.mlp.act_fn (SiLU on gate_proj output)", source=f"{LLAMA}; {note}",
                    description=f"SiLU over the 14336-wide MLP gate, {note}, bf16", **llama))
        add(problem(f"llama3_8b.{phase}.linear_gate_up", "linear",
                    [call(t(tokens, h, dtype=BF16), weight(ffn, h, dtype=BF16), None, count=64)],
                    layer="model.layers.*.mlp.gate_proj / up_proj (4096 -> 14336, no bias)",
                    source=f"{LLAMA}; {note}", description=f"MLP up projection 4096->14336, {note}, bf16", **llama))
        add(problem(f"llama3_8b.{phase}.linear_down", "linear",
                    [call(t(tokens, ffn, dtype=BF16), weight(h, ffn, dtype=BF16), None, count=32)],
                    layer="model.layers.*.mlp.down_proj (14336 -> 4096, no bias)",
                    source=f"{LLAMA}; {note}", description=f"MLP down projection 14336->4096, {note}, bf16", **llama))
    add(problem("llama3_8b.decode32.lm_head", "linear",
                [call(t(32, h, dtype=BF16), weight(vocab, h, dtype=BF16), None)],
                layer="lm_head (4096 -> 128256, no bias)", source=f"{LLAMA}; decode batch 32",
                description="LM head over the 128256-token vocabulary, decode batch 32, bf16", **llama))
    add(problem("llama3_8b.prefill.sdpa", "scaled_dot_product_attention",
                [call(t(1, 32, 2048, 128, dtype=BF16), t(1, kvh, 2048, 128, dtype=BF16),
                      t(1, kvh, 2048, 128, dtype=BF16), is_causal=True, enable_gqa=True, count=32)],
                layer="model.layers.*.self_attn (causal GQA, 32 query / 8 KV heads, head dim 128)",
                source=f"{LLAMA}; prefill batch 1 x seq 2048",
                description="Causal grouped-query attention, 32 q / 8 kv heads, seq 2048, d128, bf16", **llama))
    add(problem("llama3_8b.decode32.sdpa", "scaled_dot_product_attention",
                [call(t(32, 32, 1, 128, dtype=BF16), t(32, kvh, 2048, 128, dtype=BF16),
                      t(32, kvh, 2048, 128, dtype=BF16), is_causal=False, enable_gqa=True, count=32)],
                layer="model.layers.*.self_attn (one new token against a 2048-token KV cache)",
                source=f"{LLAMA}; decode batch 32, KV cache length 2048",
                description="Decode attention: 1 query token vs 2048 cached keys, GQA 32/8 heads, d128, bf16",
                **llama))
    add(problem("llama3_8b.prefill_b32.embedding", "embedding",
                [call(t(32, 2048, dtype=I64, low=0, high=vocab - 1), t(vocab, h, dtype=BF16), None, None, 2.0,
                      False, False)],
                layer="model.embed_tokens (128256 x 4096)", source=f"{LLAMA}; prompt batch 32 x seq 2048",
                description="Token embedding lookup 128256x4096 for 32x2048 token ids, bf16 table", **llama))
    add(problem("llama3_8b.prefill.cross_entropy", "cross_entropy",
                [call(t(2048, vocab, dtype=F32), t(2048, dtype=I64, low=0, high=vocab - 1), ignore_index=-100,
                      reduction="mean")],
                layer="loss (ForCausalLMLoss: logits upcast to float32, shifted labels)",
                source=f"{LLAMA}; evaluation loss over 2048 tokens",
                description="Cross-entropy over the 128256-token vocabulary for 2048 tokens, fp32 logits", **llama))

    # -- Mistral-7B ------------------------------------------------------------------------------------------
    mistral = dict(model="Mistral-7B-v0.1", suite=s)
    note = "prefill batch 1 x seq 4096 (= the sliding window, so attention is plain causal)"
    add(problem("mistral_7b.prefill4k.rms_norm", "rms_norm",
                [call(t(4096, h, dtype=BF16), (h,), t(h, dtype=BF16), 1e-5, count=65)],
                layer="model.layers.*.input_layernorm / post_attention_layernorm, model.norm (RMSNorm)",
                source=f"{MISTRAL}; {note}", description="RMSNorm over hidden 4096 for 4096 tokens, bf16", **mistral))
    add(problem("mistral_7b.prefill4k.silu", "silu", [call(t(4096, ffn, dtype=BF16), inplace=False, count=32)],
                layer="model.layers.*.mlp.act_fn (SiLU)", source=f"{MISTRAL}; {note}",
                description="SiLU over the 14336-wide MLP gate for 4096 tokens, bf16", **mistral))
    add(problem("mistral_7b.prefill4k.linear_kv_proj", "linear",
                [call(t(4096, h, dtype=BF16), weight(1024, h, dtype=BF16), None, count=64)],
                layer="model.layers.*.self_attn.k_proj / v_proj (4096 -> 8 x 128 = 1024, no bias)",
                source=f"{MISTRAL}; {note}", description="K/V projection 4096->1024 for 4096 tokens, bf16", **mistral))
    add(problem("mistral_7b.prefill4k.sdpa", "scaled_dot_product_attention",
                [call(t(1, 32, 4096, 128, dtype=BF16), t(1, kvh, 4096, 128, dtype=BF16),
                      t(1, kvh, 4096, 128, dtype=BF16), is_causal=True, enable_gqa=True, count=32)],
                layer="model.layers.*.self_attn (causal GQA; the 4096 sliding window is not an F argument)",
                source=f"{MISTRAL}; {note}",
                description="Causal GQA attention, 32 q / 8 kv heads, seq 4096, d128, bf16", **mistral))
    add(problem("mistral_7b.decode32.lm_head", "linear",
                [call(t(32, h, dtype=BF16), weight(32000, h, dtype=BF16), None)],
                layer="lm_head (4096 -> 32000, no bias)", source=f"{MISTRAL}; decode batch 32",
                description="LM head over the 32000-token vocabulary, decode batch 32, bf16", **mistral))

    # -- BERT-base -------------------------------------------------------------------------------------------
    bert = dict(model="BERT-base-uncased", suite=s, source=BERT)
    add(problem("bert_base.layer_norm", "layer_norm",
                [call(t(32, 512, 768, dtype=F16), (768,), t(768, dtype=F16), t(768, dtype=F16), 1e-12, count=25)],
                layer="embeddings.LayerNorm, encoder.layer.*.attention.output.LayerNorm / output.LayerNorm",
                description="LayerNorm over hidden 768, batch 32 x seq 512, fp16", **bert))
    add(problem("bert_base.gelu", "gelu", [call(t(32, 512, 3072, dtype=F16), count=12)],
                layer="encoder.layer.*.intermediate.intermediate_act_fn (exact GELU)",
                description="Exact (erf) GELU over the 3072-wide FFN, batch 32 x seq 512, fp16", **bert))
    add(problem("bert_base.softmax", "softmax", [call(t(32, 12, 512, 512, dtype=F16), dim=-1, count=12)],
                layer="encoder.layer.*.attention.self (eager attention probabilities)",
                description="Softmax over attention scores [32,12,512,512] along the key axis, fp16", **bert))
    add(problem("bert_base.linear_ffn_up", "linear",
                [call(t(32, 512, 768, dtype=F16), weight(3072, 768, dtype=F16), t(3072, dtype=F16), count=12)],
                layer="encoder.layer.*.intermediate.dense (768 -> 3072, with bias)",
                description="FFN up projection 768->3072 with bias, batch 32 x seq 512, fp16", **bert))

    # -- ViT-B/16 --------------------------------------------------------------------------------------------
    vit = dict(model="ViT-B/16", suite=s, source=VIT)
    add(problem("vit_b16.layer_norm", "layer_norm",
                [call(t(64, 197, 768, dtype=F16), (768,), t(768, dtype=F16), t(768, dtype=F16), 1e-12, count=25)],
                layer="encoder.layer.*.layernorm_before / layernorm_after, final layernorm",
                description="LayerNorm over hidden 768, batch 64 x 197 tokens, fp16", **vit))
    add(problem("vit_b16.gelu", "gelu", [call(t(64, 197, 3072, dtype=F16), count=12)],
                layer="encoder.layer.*.intermediate.intermediate_act_fn (exact GELU)",
                description="Exact GELU over the 3072-wide MLP, batch 64 x 197 tokens, fp16", **vit))
    add(problem("vit_b16.sdpa", "scaled_dot_product_attention",
                [call(heads_view(64, 12, 197, 64, F16), heads_view(64, 12, 197, 64, F16),
                      heads_view(64, 12, 197, 64, F16), is_causal=False, count=12)],
                layer="encoder.layer.*.attention (non-causal, 12 heads x 64, q/k/v transposed views)",
                description="Non-causal attention, 12 heads, seq 197, d64, strided q/k/v, fp16", **vit))

    # -- GPT-2 -----------------------------------------------------------------------------------------------
    gpt2 = dict(model="GPT-2 (124M)", suite=s, source=GPT2)
    add(problem("gpt2.gelu_tanh", "gelu", [call(t(8, 1024, 3072, dtype=F32), approximate="tanh", count=12)],
                layer="h.*.mlp.act (gelu_new = tanh-approximated GELU)",
                description="Tanh-approximated GELU over the 3072-wide MLP, batch 8 x seq 1024, fp32", **gpt2))
    add(problem("gpt2.layer_norm", "layer_norm",
                [call(t(8, 1024, 768, dtype=F32), (768,), t(768, dtype=F32), t(768, dtype=F32), 1e-5, count=25)],
                layer="h.*.ln_1 / ln_2, ln_f", description="LayerNorm over 768, batch 8 x seq 1024, fp32", **gpt2))
    add(problem("gpt2.softmax", "softmax", [call(t(8, 12, 1024, 1024, dtype=F32), dim=-1, count=12)],
                layer="h.*.attn (eager attention probabilities after the causal mask)",
                description="Softmax over attention scores [8,12,1024,1024] along the key axis, fp32", **gpt2))

    # -- Stable Diffusion 1.5 UNet ---------------------------------------------------------------------------
    sd = dict(model="Stable Diffusion 1.5 UNet", suite=s, source=SD)
    act = t(2, 320, 64, 64, dtype=F16)
    add(problem("sd15_unet.group_norm", "group_norm",
                [call(act, 32, t(320, dtype=F16), t(320, dtype=F16), 1e-5, count=13)],
                layer="down_blocks.0 / up_blocks.3 resnets' norm1/norm2, attentions' norm, conv_norm_out",
                description="GroupNorm, 32 groups over 320 channels at 64x64, batch 2, fp16", **sd))
    add(problem("sd15_unet.silu", "silu", [call(act, inplace=False, count=10)],
                layer="down_blocks.0 / up_blocks.3 resnets' nonlinearity (SiLU after GroupNorm)",
                description="SiLU over [2,320,64,64], fp16", **sd))
    add(problem("sd15_unet.conv2d_3x3", "conv2d",
                [call(act, weight(320, 320, 3, 3, dtype=F16), t(320, dtype=F16), (1, 1), (1, 1), (1, 1), 1, count=7)],
                layer="down_blocks.0 / up_blocks.3 resnets' conv1/conv2 (3x3, 320 -> 320, padding 1)",
                description="3x3 convolution 320->320 with padding 1 at 64x64, batch 2, fp16", **sd))
    add(problem("sd15_unet.sdpa", "scaled_dot_product_attention",
                [call(heads_view(2, 8, 4096, 40, F16), heads_view(2, 8, 4096, 40, F16),
                      heads_view(2, 8, 4096, 40, F16), is_causal=False, count=5)],
                layer="down_blocks.0 / up_blocks.3 transformer blocks' attn1 (self-attention over 64x64 tokens)",
                description="Self-attention, 8 heads x d40 over 4096 tokens, strided q/k/v, batch 2, fp16", **sd))

    # -- Whisper-tiny ----------------------------------------------------------------------------------------
    whisper = dict(model="Whisper-tiny", suite=s, source=WHISPER)
    add(problem("whisper_tiny.encoder.conv1d", "conv1d",
                [call(t(16, 80, 3000, dtype=F16), weight(384, 80, 3, dtype=F16), t(384, dtype=F16), (1,), (1,),
                      (1,), 1),
                 call(t(16, 384, 3000, dtype=F16), weight(384, 384, 3, dtype=F16), t(384, dtype=F16), (2,), (1,),
                      (1,), 1)],
                layer="model.encoder.conv1 (80 -> 384, k3, pad 1) and conv2 (384 -> 384, k3, stride 2, pad 1)",
                description="The encoder's two stem convolutions over 3000 mel frames, batch 16, fp16", **whisper))
    add(problem("whisper_tiny.encoder.gelu", "gelu",
                [call(t(16, 384, 3000, dtype=F16)), call(t(16, 384, 1500, dtype=F16)),
                 call(t(16, 1500, 1536, dtype=F16), count=4)],
                layer="GELU after conv1 and conv2, and model.encoder.layers.*.activation_fn (FFN 1536)",
                description="Exact GELU after both stem convolutions and in the encoder FFN, batch 16, fp16",
                **whisper))
    add(problem("whisper_tiny.encoder.layer_norm", "layer_norm",
                [call(t(16, 1500, 384, dtype=F16), (384,), t(384, dtype=F16), t(384, dtype=F16), 1e-5, count=9)],
                layer="model.encoder.layers.*.self_attn_layer_norm / final_layer_norm, model.encoder.layer_norm",
                description="LayerNorm over d_model 384 for 1500 encoder positions, batch 16, fp16", **whisper))
    return out


def smoke_problems() -> list[FunctionProblem]:
    s = "smoke"
    toy = dict(model="toy MLP (smoke test)", suite=s,
               source="synthetic tiny shapes so the suite runs on CPU under the Triton interpreter in seconds")
    return [
        problem("smoke.relu", "relu", [call(t(8, 64, dtype=F32))], layer="hidden activation (ReLU)",
                description="ReLU over [8,64], fp32", **toy),
        problem("smoke.silu", "silu", [call(t(8, 64, dtype=F32), inplace=False)], layer="gate activation (SiLU)",
                description="SiLU over [8,64], fp32", **toy),
        problem("smoke.softmax", "softmax", [call(t(4, 32, dtype=F32), dim=-1)], layer="output probabilities",
                description="Softmax over the last axis of [4,32], fp32", **toy),
        problem("smoke.layer_norm", "layer_norm",
                [call(t(4, 64, dtype=F32), (64,), t(64, dtype=F32), t(64, dtype=F32), 1e-5)],
                layer="LayerNorm with weight and bias", description="LayerNorm over [4,64], fp32", **toy),
        problem("smoke.rms_norm", "rms_norm", [call(t(4, 64, dtype=F32), (64,), t(64, dtype=F32), 1e-6)],
                layer="RMSNorm with weight", description="RMSNorm over [4,64], fp32", **toy),
        problem("smoke.cross_entropy", "cross_entropy",
                [call(t(4, 16, dtype=F32), t(4, dtype=I64, low=0, high=15), reduction="mean")],
                layer="classification loss (int64 targets)",
                description="Cross-entropy of [4,16] logits against int64 class targets, fp32", **toy),
    ]


BUILTIN_DESCRIPTION = ("Real-model shapes for torch.nn.functional calls: Llama-3-8B, Mistral-7B, BERT-base, ViT-B/16, "
                       "GPT-2, Stable Diffusion 1.5 UNet and Whisper-tiny, in the dtypes those models run in.")
SMOKE_DESCRIPTION = "Tiny fp32 problems that run on CPU under the Triton interpreter in seconds."


def main() -> None:
    write_suite_file(builtin_problems(), HERE / "builtin.json", suite="builtin", description=BUILTIN_DESCRIPTION)
    write_suite_file(smoke_problems(), HERE / "smoke.json", suite="smoke", description=SMOKE_DESCRIPTION)
    print(f"wrote {HERE / 'builtin.json'} and {HERE / 'smoke.json'}")


if __name__ == "__main__":
    main()
