"""What a `torch.nn.functional` function computes, in words a kernel writer can act on.

`signature_text(name)` gives the Python signature (introspected; for builtins such as `linear` whose signature is
not introspectable, a hand-written table, then the docstring's first line). `semantics_summary(name)` gives a short
hand-written summary of the numerics for the common ops (variance convention, where eps goes, default scales, mask
conventions...), else the first paragraph of the function's docstring. `parameter_names(name)` lists the
parameters in positional order, and `entry_signature(name)` is the `kernel_function(...)` line a generated file
must define (same parameters and defaults, no annotations).
"""

from __future__ import annotations

import inspect
import re

from forge.functional import original_function

__all__ = ["entry_signature", "parameter_names", "semantics_summary", "signature_text"]

# Signatures of builtins that `inspect.signature` cannot read (checked against torch's docstrings).
_BUILTIN_SIGNATURES: dict[str, str] = {
    "linear": "linear(input, weight, bias=None) -> Tensor",
    "bilinear": "bilinear(input1, input2, weight, bias=None) -> Tensor",
    "conv1d": "conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1) -> Tensor",
    "conv2d": "conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1) -> Tensor",
    "conv3d": "conv3d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1) -> Tensor",
    "conv_transpose1d": (
        "conv_transpose1d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1)"
        " -> Tensor"
    ),
    "conv_transpose2d": (
        "conv_transpose2d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1)"
        " -> Tensor"
    ),
    "conv_transpose3d": (
        "conv_transpose3d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1)"
        " -> Tensor"
    ),
    "scaled_dot_product_attention": (
        "scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, "
        "scale=None, enable_gqa=False) -> Tensor"
    ),
    "gelu": "gelu(input, approximate='none') -> Tensor",
    "avg_pool1d": "avg_pool1d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True)"
    " -> Tensor",
    "avg_pool2d": (
        "avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True, "
        "divisor_override=None) -> Tensor"
    ),
    "avg_pool3d": (
        "avg_pool3d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True, "
        "divisor_override=None) -> Tensor"
    ),
    "adaptive_avg_pool1d": "adaptive_avg_pool1d(input, output_size) -> Tensor",
    "softplus": "softplus(input, beta=1, threshold=20) -> Tensor",
    "logsigmoid": "logsigmoid(input) -> Tensor",
    "hardshrink": "hardshrink(input, lambd=0.5) -> Tensor",
    "softshrink": "softshrink(input, lambd=0.5) -> Tensor",
    "prelu": "prelu(input, weight) -> Tensor",
    "cosine_similarity": "cosine_similarity(x1, x2, dim=1, eps=1e-08) -> Tensor",
    "pairwise_distance": "pairwise_distance(x1, x2, p=2.0, eps=1e-06, keepdim=False) -> Tensor",
    "pdist": "pdist(input, p=2) -> Tensor",
    "one_hot": "one_hot(tensor, num_classes=-1) -> LongTensor",
    "pixel_shuffle": "pixel_shuffle(input, upscale_factor) -> Tensor",
    "pixel_unshuffle": "pixel_unshuffle(input, downscale_factor) -> Tensor",
    "channel_shuffle": "channel_shuffle(input, groups) -> Tensor",
    "relu_": "relu_(input) -> Tensor",
    "elu_": "elu_(input, alpha=1.0) -> Tensor",
    "selu_": "selu_(input) -> Tensor",
    "celu_": "celu_(input, alpha=1.0) -> Tensor",
    "leaky_relu_": "leaky_relu_(input, negative_slope=0.01) -> Tensor",
    "hardtanh_": "hardtanh_(input, min_val=-1.0, max_val=1.0) -> Tensor",
    "threshold_": "threshold_(input, threshold, value) -> Tensor",
}

_SUMMARIES: dict[str, str] = {
    "linear": (
        "y = input @ weight.T + bias. input [*, in_features], weight [out_features, in_features], bias "
        "[out_features] or None; output [*, out_features] with the input's dtype. For fp16/bf16 accumulate in fp32 "
        "and round once at the end; fp32 inputs need true fp32 products (no TF32)."
    ),
    "bilinear": (
        "y[n, o] = sum_ij input1[n, i] * weight[o, i, j] * input2[n, j] + bias[o]. input1 [*, in1], input2 [*, in2], "
        "weight [out, in1, in2], bias [out] or None."
    ),
    "layer_norm": (
        "Normalise over the last len(normalized_shape) dims: (x - mean) / sqrt(var + eps) * weight + bias. var is "
        "the biased variance (divide by N, not N-1); eps is inside the sqrt. weight/bias have shape normalized_shape "
        "or are None (then 1 / 0). Compute mean and variance in fp32 for fp16/bf16 inputs; the output has the "
        "input's dtype."
    ),
    "rms_norm": (
        "Over the last len(normalized_shape) dims: x / sqrt(mean(x^2) + eps) * weight (weight None means 1). "
        "eps=None means torch.finfo(float32).eps = 1.1920929e-07 for fp32/fp16/bf16 inputs (the fp32 compute "
        "dtype's eps, not the input's). Accumulate in fp32; the output has the input's dtype."
    ),
    "group_norm": (
        "input [N, C, *]; C is split into num_groups groups of C/num_groups channels; mean and biased variance are "
        "taken per (sample, group) over its channels and all spatial positions; (x - mean) / sqrt(var + eps), then "
        "the per-channel affine weight[c], bias[c] (shape [C], or None). Statistics in fp32 for fp16/bf16."
    ),
    "batch_norm": (
        "Per channel (dim 1). training=False: (x - running_mean) / sqrt(running_var + eps) * weight + bias. "
        "training=True: normalise with the batch mean and biased variance over all dims except 1, AND update "
        "running_mean/running_var in place (momentum, unbiased variance) when they are given — that side effect "
        "is part of the semantics. weight/bias None mean 1 / 0."
    ),
    "instance_norm": (
        "input [N, C, *]: mean and biased variance per (sample, channel) over the spatial dims; (x - mean) / "
        "sqrt(var + eps), then optional per-channel weight/bias. use_input_stats=False uses running stats instead."
    ),
    "softmax": (
        "exp(x - max) / sum(exp(x - max)) along `dim` (subtract the row max for stability). If `dtype` is given the "
        "input is cast to it first and the output has that dtype; else the output has the input's dtype. For "
        "fp16/bf16 compute in fp32. dim=None is a legacy implicit choice (0 for 0-D/1-D/3-D input, else 1)."
    ),
    "log_softmax": (
        "x - max - log(sum(exp(x - max))) along `dim`. `dtype`, if given, casts the input first and sets the output "
        "dtype. Compute in fp32 for fp16/bf16."
    ),
    "gelu": (
        "approximate='none': 0.5 * x * (1 + erf(x / sqrt(2))). approximate='tanh': "
        "0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))). Compute in fp32 for fp16/bf16; output in the "
        "input's dtype."
    ),
    "silu": (
        "x * sigmoid(x) = x / (1 + exp(-x)). Compute in fp32 for fp16/bf16; output in the input's dtype. "
        "inplace=True writes the result into `input` and returns `input` itself."
    ),
    "relu": (
        "max(x, 0); NaN stays NaN (relu(NaN) = NaN), -0.0 maps to 0. inplace=True writes into `input` and returns it."
    ),
    "relu6": "min(max(x, 0), 6). inplace=True writes into `input` and returns it.",
    "leaky_relu": "x if x >= 0 else negative_slope * x. inplace=True writes into `input` and returns it.",
    "elu": "x if x > 0 else alpha * (exp(x) - 1). inplace=True writes into `input` and returns it.",
    "hardtanh": "clamp(x, min_val, max_val). inplace=True writes into `input` and returns it.",
    "hardswish": "x * relu6(x + 3) / 6.",
    "hardsigmoid": "relu6(x + 3) / 6.",
    "mish": "x * tanh(softplus(x)) with softplus(x) = log(1 + exp(x)).",
    "softplus": "log(1 + exp(beta * x)) / beta, and x itself where beta * x > threshold (linear region).",
    "sigmoid": "1 / (1 + exp(-x)), elementwise; compute in fp32 for fp16/bf16; output in the input's dtype.",
    "tanh": "tanh(x), elementwise; compute in fp32 for fp16/bf16; output in the input's dtype.",
    "embedding": (
        "out[...] = weight[input[...]]: input holds integer indices of any shape, weight is [num_embeddings, "
        "embedding_dim]; output shape input.shape + [embedding_dim], weight's dtype. padding_idx only affects "
        "gradients (forward is the same). max_norm (if not None) renormalises the looked-up rows of weight IN PLACE."
    ),
    "scaled_dot_product_attention": (
        "query [..., Hq, Lq, E], key [..., Hk, Lk, E], value [..., Hk, Lk, Ev] -> out [..., Hq, Lq, Ev] = "
        "softmax(query @ key^T * scale + M) @ value with M from the masks, scale default 1/sqrt(E). is_causal=True "
        "masks with the top-left aligned lower triangle: query i sees keys j <= i (even when Lq != Lk). attn_mask: "
        "bool means True = "
        "attend (False -> -inf); a float mask is added to the scores; it broadcasts to [..., Hq, Lq, Lk]. "
        "enable_gqa=True: Hq is a multiple of Hk and query head h uses kv head h // (Hq // Hk). dropout_p must be 0 "
        "to be checkable. Softmax and accumulation in fp32."
    ),
    "cross_entropy": (
        "input [N, C] (or [C], or [N, C, d1, ...]) of logits; target = class indices (int64, shape without C) or "
        "class probabilities (float, input's shape). Per element: -w[y] * log_softmax(x)[y]; targets equal to "
        "ignore_index (default -100) contribute 0 and are excluded. reduction='mean' divides by the summed weights "
        "of non-ignored targets (their count when weight is None); 'sum'; 'none' keeps per-element losses. "
        "label_smoothing e: (1 - e) * nll + e * mean over classes of -log p."
    ),
    "nll_loss": (
        "-w[y] * input[y] per element (input holds log-probabilities); ignore_index (default -100) targets are "
        "excluded; reduction='mean' divides by the summed weights of the non-ignored targets."
    ),
    "mse_loss": "mean (or sum / none per `reduction`) of (input - target)^2.",
    "conv1d": (
        "Cross-correlation (no kernel flip). input [N, Cin, L], weight [Cout, Cin/groups, k], bias [Cout] or None. "
        "L_out = floor((L + 2*padding - dilation*(k-1) - 1) / stride) + 1; padding may be 'valid' or 'same'. "
        "Accumulate in fp32; no TF32 for fp32."
    ),
    "conv2d": (
        "Cross-correlation (no kernel flip). input [N, Cin, H, W], weight [Cout, Cin/groups, kH, kW], bias [Cout] or "
        "None. H_out = floor((H + 2*padding - dilation*(kH-1) - 1) / stride) + 1 (same for W); stride/padding/"
        "dilation are ints or pairs, padding may be 'valid' or 'same'. Group g uses input channels "
        "[g*Cin/groups, (g+1)*Cin/groups). Accumulate in fp32; no TF32 for fp32."
    ),
    "conv3d": (
        "Cross-correlation over (D, H, W). input [N, Cin, D, H, W], weight [Cout, Cin/groups, kD, kH, kW]; output "
        "size per dim floor((size + 2*padding - dilation*(k-1) - 1) / stride) + 1. Accumulate in fp32."
    ),
    "dropout": (
        "training=False: the identity (PyTorch returns the input tensor itself). training=True zeroes each element "
        "with probability p and scales survivors by 1/(1-p) — random, so only training=False is checkable."
    ),
    "normalize": "x / max(||x||_p, eps), the p-norm taken along `dim` (keepdim). Output has the input's shape/dtype.",
    "pad": (
        "`pad` lists (left, right) amounts starting from the LAST dim and moving backwards: (l, r) pads the last "
        "dim, (l, r, t, b) the last two... mode 'constant' (fill `value`, default 0), 'reflect' (mirror without the "
        "edge), 'replicate' (repeat the edge), 'circular' (wrap). Negative amounts crop."
    ),
    "interpolate": (
        "Resize the spatial dims (after N, C) to `size` or by `scale_factor`. 'nearest': src = floor(dst * in/out) "
        "(1/scale_factor when scale_factor is given and recompute_scale_factor is not True); 'nearest-exact' uses "
        "floor((dst + 0.5) * in/out). Linear modes with align_corners=False: src = (dst + 0.5) * in/out - 0.5, "
        "clamped at 0; align_corners=True: src = dst * (in-1)/(out-1). antialias only matters when downsampling."
    ),
    "cosine_similarity": "sum(x1 * x2, dim) / max(||x1||_2 * ||x2||_2, eps), with broadcasting of x1 and x2.",
    "avg_pool2d": (
        "Mean over kernel_size windows moved by stride (default = kernel_size); padding adds zeros that count in "
        "the divisor when count_include_pad=True; ceil_mode rounds the output size up; divisor_override replaces "
        "the divisor."
    ),
    "max_pool2d": (
        "Max over kernel_size windows moved by stride (default = kernel_size); padding is -inf; dilation spaces the "
        "window; ceil_mode rounds the output size up; return_indices also returns flat argmax indices per plane."
    ),
    "adaptive_avg_pool2d": (
        "Output [N, C, oH, oW]; output cell i covers input rows floor(i*H/oH) to ceil((i+1)*H/oH) (exclusive), "
        "likewise for columns; the value is their mean."
    ),
}

_RST_ROLE = re.compile(r":(?:math|class|func|attr|meth|ref|mod|obj):`~?([^`]*)`")


def _builtin_doc_signature(function_name: str) -> str | None:
    """The signature written on the first line(s) of a builtin's docstring, e.g. `linear(input, ...) -> Tensor`."""
    doc = inspect.getdoc(original_function(function_name)) or ""
    lines = doc.strip().splitlines()
    if not lines or not lines[0].startswith(function_name + "("):
        return None
    text = ""
    for line in lines[:4]:
        text += (" " if text else "") + line.strip()
        if ")" in line:
            break
    return re.sub(r"\s+", " ", text).rstrip(":")


def signature_text(function_name: str) -> str:
    """`name(params...) -> ret` for `torch.nn.functional.<function_name>` (introspected, table, or docstring)."""
    fn = original_function(function_name)
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        pass
    else:
        # Annotations are left out on purpose: their spelling changes between torch releases (`Optional[int]` vs
        # `int | None`), and a prompt must be identical across stacks for cassettes and the kernel cache to match.
        bare = signature.replace(
            parameters=[p.replace(annotation=inspect.Parameter.empty) for p in signature.parameters.values()],
            return_annotation=inspect.Signature.empty,
        )
        return f"{function_name}{bare}"
    if function_name in _BUILTIN_SIGNATURES:
        return _BUILTIN_SIGNATURES[function_name]
    from_doc = _builtin_doc_signature(function_name)
    if from_doc is not None:
        return from_doc
    return f"{function_name}(*args, **kwargs)"


def _split_top_level(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in text:
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    if current.strip():
        parts.append(current.strip())
    return parts


def _parameter_list(function_name: str) -> list[tuple[str, str | None]]:
    """(name, default source or None) per parameter, in order; `*`/`/` markers kept as names."""
    fn = original_function(function_name)
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        sig = None
    if sig is not None:
        params: list[tuple[str, str | None]] = []
        kw_only_started = False
        for p in sig.parameters.values():
            if p.kind is p.VAR_POSITIONAL:
                params.append(("*" + p.name, None))
                kw_only_started = True
                continue
            if p.kind is p.VAR_KEYWORD:
                params.append(("**" + p.name, None))
                continue
            if p.kind is p.KEYWORD_ONLY and not kw_only_started:
                params.append(("*", None))
                kw_only_started = True
            default = None if p.default is inspect.Parameter.empty else repr(p.default)
            params.append((p.name, default))
        return params
    text = signature_text(function_name)
    inner = text[text.find("(") + 1 : text.rfind(")")]
    params = []
    for part in _split_top_level(inner):
        name, _, default = part.partition("=")
        name = name.split(":")[0].strip()
        params.append((name, default.strip() or None))
    return params


def parameter_names(function_name: str) -> list[str]:
    """Parameter names in positional order (no `*`, `/` markers or variadic parameters)."""
    return [n for n, _ in _parameter_list(function_name) if n not in ("*", "/") and not n.startswith("*")]


def entry_signature(function_name: str) -> str:
    """`kernel_function(input, weight, bias=None)`: the entry point's parameters, same names and defaults."""
    parts = [name if default is None else f"{name}={default}" for name, default in _parameter_list(function_name)]
    return f"kernel_function({', '.join(parts)})"


def _docstring_summary(function_name: str) -> str:
    doc = inspect.getdoc(original_function(function_name)) or ""
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", doc) if p.strip()]
    # Builtins start with their signature line; skip it.
    paragraphs = [p for p in paragraphs if not p.startswith(function_name + "(")]
    if not paragraphs:
        return f"See the PyTorch documentation of torch.nn.functional.{function_name}."
    text = _RST_ROLE.sub(r"\1", paragraphs[0])
    text = re.sub(r"\s+", " ", text).replace("``", "`").strip()
    return text if len(text) <= 500 else text[:497].rstrip() + "..."


def semantics_summary(function_name: str) -> str:
    """A 1-4 line summary of what the function computes and its numerics conventions."""
    original_function(function_name)  # clear error for unknown names
    if function_name in _SUMMARIES:
        return _SUMMARIES[function_name]
    base = function_name.rstrip("_")
    if function_name.endswith("_") and base in _SUMMARIES:
        return _SUMMARIES[base] + f" `{function_name}` is the in-place form: it writes into `input` and returns it."
    return _docstring_summary(function_name)
