"""Honest nn.Module and kernel code passes the screen (issue: 0 of 8 honest KernelBench replies passed on the first
turn: all for `super(ModelNew, self).__init__()`, three for reading their own layers' parameters and settings), and
the nearest hostile variant of each relaxation stays refused.

The honest files are written the way models write KernelBench replies: `super(ModelNew, self).__init__()`, layers
built in `__init__`, `conv = self.conv` then `conv.weight` / `conv.stride`, a helper taking the layer, a Linear named
`self.matmul`, a `@dataclass` config, a Triton kernel launched in `forward`.
"""

from __future__ import annotations

import textwrap

import pytest

from agent.languages import TritonLanguage, get_language
from agent.languages.triton import module_function_internals, module_host_attributes, triton_function_internals
from agent.screening import format_violations, policy

_KERNEL = '''
@triton.jit
def _bias_act_kernel(x_ptr, b_ptr, y_ptr, n, C, HW, slope, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    c = (offs // HW) % C
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + c, mask=mask, other=0.0).to(tl.float32)
    y = x + b
    y = tl.where(y >= 0, y, y * slope)
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)
'''

_HEADER = '''
import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import triton
import triton.language as tl
'''


def module_file(body: str) -> str:
    return _HEADER + _KERNEL + "\n\n" + textwrap.dedent(body).strip("\n") + "\n"


def screen_module(source: str) -> list:
    return TritonLanguage().screen_module(source)


def assert_passes(source: str) -> None:
    violations = screen_module(source)
    assert violations == [], format_violations(violations)


def refused(source: str) -> list[str]:
    violations = screen_module(source)
    assert violations, "expected a refusal"
    return [v.construct for v in violations]


# ---------------------------------------------------------------------------------------------------------
# Realistic honest replies
# ---------------------------------------------------------------------------------------------------------
CONV_GROUPNORM = module_file('''
def _group_norm_params(gn):
    """The GroupNorm's settings, read from the layer the helper is given."""
    return gn.num_groups, gn.num_channels, gn.eps, gn.affine, gn.weight, gn.bias


class ModelNew(nn.Module):
    """Conv2d -> GroupNorm -> LeakyReLU, with the bias and the activation fused in a Triton kernel."""

    def __init__(self, in_channels, out_channels, kernel_size, num_groups, negative_slope=0.01):
        super(ModelNew, self).__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=1)
        self.gn = nn.GroupNorm(num_groups, out_channels)
        self.negative_slope = negative_slope

    def forward(self, x):
        conv = self.conv
        w = conv.weight
        b = conv.bias
        kh, kw = conv.kernel_size
        stride, padding, dilation = conv.stride, conv.padding, conv.dilation
        assert conv.groups == 1 and conv.padding_mode == "zeros"
        assert conv.in_channels == x.shape[1] and conv.out_channels == w.shape[0]
        gn = self.gn
        gw = self.gn.weight
        groups, channels, eps, affine, gamma, beta = _group_norm_params(gn)
        assert gw is gamma and self.gn.bias is beta and self.conv.weight.data.is_contiguous()
        assert gn.num_groups == groups and channels == w.shape[0] and affine and eps > 0
        n, _, h, wd = x.shape
        oh = (h + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
        ow = (wd + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
        y = torch.empty((n, channels, oh, ow), device=x.device, dtype=x.dtype)
        total = y.numel()
        BLOCK = 1024
        grid = (triton.cdiv(total, BLOCK),)
        _bias_act_kernel[grid](x, b, y, total, channels, oh * ow, self.negative_slope, BLOCK=BLOCK)
        return y
''')

GEMM_NAMED_LIKE_OPS = module_file('''
class ModelNew(nn.Module):
    """Gemm -> bias -> softmax-like epilogue; the submodules keep the reference Model's names (state_dict)."""

    def __init__(self, in_features, out_features, dropout_p=0.0):
        super(ModelNew, self).__init__()
        self.matmul = nn.Linear(in_features, out_features)
        self.gemm = nn.Linear(out_features, out_features, bias=True)
        self.softmax = nn.Softmax(dim=1)
        self.relu = nn.ReLU(inplace=True)
        self.dropout = nn.Dropout(p=dropout_p)
        self.bias = nn.Parameter(torch.randn(out_features) * 0.02)

    def forward(self, x):
        weight = self.matmul.weight
        bias = self.matmul.bias
        gemm_bias = self.gemm.bias
        dim = self.softmax.dim
        inplace = self.relu.inplace
        p = self.dropout.p
        assert dim == 1 and inplace and p == 0.0
        assert self.matmul.in_features == x.shape[1] and self.matmul.out_features == weight.shape[0]
        linear = self.matmul
        assert linear.weight.shape[1] == x.shape[1]
        y = torch.empty((x.shape[0], weight.shape[0]), device=x.device, dtype=x.dtype)
        n = y.numel()
        _bias_act_kernel[(triton.cdiv(n, 256),)](x, bias + 0 * gemm_bias, y, n, y.shape[1], 1, 1.0, BLOCK=256)
        return y
''')

NORMS_EMBEDDINGS_ATTENTION = module_file('''
def _bn_state(bn):
    return bn.running_mean, bn.running_var, bn.momentum, bn.eps, bn.training, bn.track_running_stats, bn.num_features


class ModelNew(nn.Module):
    def __init__(self, vocab, dim, heads, channels):
        super(ModelNew, self).__init__()
        self.emb = nn.Embedding(vocab, dim, padding_idx=0)
        self.ln = nn.LayerNorm(dim, eps=1e-5, elementwise_affine=True)
        self.attn = nn.MultiheadAttention(dim, heads, dropout=0.0, batch_first=True)
        self.bn = nn.BatchNorm2d(channels)
        self.act = nn.LeakyReLU(negative_slope=0.2)
        self.gelu = nn.GELU(approximate="tanh")
        self.up = nn.ConvTranspose2d(channels, channels, 3, stride=2, padding=1, output_padding=1)

    def forward(self, tokens, image):
        emb = self.emb
        assert emb.embedding_dim == self.ln.normalized_shape[0] and emb.num_embeddings > 0 and emb.padding_idx == 0
        ln = self.ln
        assert ln.elementwise_affine and ln.eps > 0
        attn = self.attn
        head_dim = attn.head_dim
        assert attn.num_heads * head_dim == attn.embed_dim and attn.dropout == 0.0 and attn.batch_first
        qkv_weight = attn.in_proj_weight
        out_proj = attn.out_proj
        mean, var, momentum, eps, training, tracking, features = _bn_state(self.bn)
        assert features == image.shape[1] and tracking and momentum is not None and not training or self.training
        slope = self.act.negative_slope
        assert self.gelu.approximate == "tanh"
        up = self.up
        assert up.output_padding == (1, 1) and up.in_channels == up.out_channels and up.padding_mode == "zeros"
        y = torch.empty_like(image)
        n = y.numel()
        _bias_act_kernel[(triton.cdiv(n, 512),)](image, mean, y, n, features, image.shape[2] * image.shape[3], slope,
                                                 BLOCK=512)
        del qkv_weight, out_proj, var, eps
        return y
''')

HELPERS_AND_CONTAINERS = module_file('''
BLOCK_SIZE = 1024
_EPS = 1e-5


@dataclass(frozen=True)
class _LaunchConfig:
    BLOCK_M: int = 64
    num_warps: int = 4
    extra: dict = field(default_factory=dict)


class _Blocks(object):
    """Block sizes for a row length."""

    MAX_BLOCK = 4096

    def __init__(self, n_cols):
        self.block = min(triton.next_power_of_2(n_cols), self.MAX_BLOCK)
        self.warps = 4 if self.block <= 1024 else 8

    @staticmethod
    def grid(n, block):
        return (triton.cdiv(n, block),)

    @property
    def stages(self):
        return 2 if self.block > 256 else 1


_CONFIG = _LaunchConfig()


def _launch(x, bias, y, blocks, config):
    n = y.numel()
    _bias_act_kernel[blocks.grid(n, blocks.block)](x, bias, y, n, y.shape[1], 1, 1.0, BLOCK=blocks.block,
                                                   num_warps=config.num_warps)


class ModelNew(nn.Module):
    def __init__(self, features, num_layers=2):
        super(ModelNew, self).__init__()
        self.weight = nn.Parameter(torch.empty(features, features))
        self.bias = nn.Parameter(torch.zeros(features))
        self.register_buffer("running_scale", torch.ones(features))
        self.register_buffer("mask", torch.ones(features), persistent=False)
        self.layers = nn.ModuleList([nn.Linear(features, features) for _ in range(num_layers)])
        self.head = nn.Sequential(nn.Linear(features, features), nn.ReLU(), nn.Dropout(0.0))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        torch.nn.init.zeros_(self.bias)
        for layer in self.layers:
            nn.init.xavier_uniform_(layer.weight)
            nn.init.zeros_(layer.bias)
        self.config = _LaunchConfig(BLOCK_M=128)

    def extra_repr(self):
        return super(ModelNew, self).extra_repr() + f", layers={len(self.layers)}"

    def forward(self, x):
        if self.training:
            raise RuntimeError("inference only")
        for layer in self.layers:
            assert layer.in_features == layer.out_features == x.shape[-1]
        first = self.head[0]
        assert first.weight.shape == self.weight.shape and first.bias is not None
        blocks = _Blocks(x.shape[-1])
        assert blocks.stages >= 1 and _Blocks.MAX_BLOCK >= BLOCK_SIZE and _LaunchConfig.BLOCK_M == 64
        assert _Blocks.grid(4, 2) == (2,) and self.config.BLOCK_M == 128 and _CONFIG.BLOCK_M <= blocks.MAX_BLOCK
        y = torch.empty_like(x)
        _launch(x, self.bias, y, blocks, _CONFIG)
        return y
''')


@pytest.mark.parametrize("source", [CONV_GROUPNORM, GEMM_NAMED_LIKE_OPS, NORMS_EMBEDDINGS_ATTENTION,
                                    HELPERS_AND_CONTAINERS],
                         ids=["conv_groupnorm", "gemm_named_like_ops", "norms_embeddings_attention",
                              "helpers_and_containers"])
def test_honest_kernelbench_replies_pass(source: str) -> None:
    assert_passes(source)


def test_super_with_the_enclosing_class_and_self_reaches_any_base_method() -> None:
    source = CONV_GROUPNORM.replace(
        "    def forward(self, x):\n",
        "    def train(self, mode=True):\n        return super(ModelNew, self).train(mode)\n\n"
        "    def forward(self, x):\n", 1)
    assert_passes(source)


def test_function_kernels_may_use_helper_classes_too() -> None:
    source = textwrap.dedent('''
        from dataclasses import dataclass

        import torch
        import triton
        import triton.language as tl


        @dataclass
        class _Config:
            BLOCK: int = 256
            num_warps: int = 4


        class _Plan:
            def __init__(self, n):
                self.n = n
                self.config = _Config()

            def grid(self):
                return (triton.cdiv(self.n, self.config.BLOCK),)


        class _Strict(_Plan):
            def __init__(self, n):
                super(_Strict, self).__init__(n)


        @triton.jit
        def _relu(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            m = offs < n
            tl.store(y_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=m), 0.0), mask=m)


        def _go(x, y, plan):
            _relu[plan.grid()](x, y, plan.n, BLOCK=plan.config.BLOCK, num_warps=plan.config.num_warps)


        def kernel_function(input, inplace=False):
            x = input.contiguous()
            y = torch.empty_like(x)
            _go(x, y, _Strict(x.numel()))
            return y
        ''')
    violations = get_language("triton").screen(source, "relu")
    assert violations == [], format_violations(violations)


def test_cuda_shares_the_python_screen_for_super_and_helper_classes() -> None:
    """The CUDA language screens its launcher with the same analyser: `super(C, self)` and own-class attributes
    pass there too (it has no module problems, so torch.nn layer names are not its concern)."""
    from pathlib import Path

    import agent.languages.cuda as cuda_package

    example = (Path(cuda_package.__file__).parent / "cuda_example.py").read_text()
    helper = textwrap.dedent('''
        class _Base:
            def __init__(self, block):
                self.block = block


        class _Launch(_Base):
            def __init__(self, block):
                super(_Launch, self).__init__(block)


        _LAUNCH = _Launch(256)
        ''')
    source = example.replace("\n\ndef kernel_function(", "\n" + helper + "\n\ndef kernel_function(", 1)
    source = source.replace("    block = 256\n", "    block = _LAUNCH.block\n")
    assert "_LAUNCH.block" in source
    cuda = get_language("cuda")
    assert cuda.screen(source, "silu") == []
    hostile = source.replace("super(_Launch, self).__init__(block)", "super(_Launch, torch.Tensor).__init__(block)")
    assert "super" in [v.construct for v in cuda.screen(hostile, "silu")]


# ---------------------------------------------------------------------------------------------------------
# The derived torch.nn attribute names
# ---------------------------------------------------------------------------------------------------------
_LAYER_NAMES = """weight bias kernel_size stride padding dilation groups num_groups num_channels affine eps momentum
    running_mean running_var normalized_shape elementwise_affine in_features out_features in_channels out_channels
    padding_mode training num_features track_running_stats embedding_dim num_embeddings padding_idx num_heads head_dim
    dropout p inplace negative_slope approximate dim output_padding in_proj_weight num_batches_tracked""".split()

_INTERNALS = """fn src get_capture_scope rewrite format format_map cache used_global_vals kernel_cache device_caches run
    warmup preload module jit_fn base_fn configs nargs f_back f_globals f_locals f_code tb_frame tb_next gi_frame
    gi_code cr_frame co_code func args keywords fget mro compile forward apply train set_submodule
    register_forward_hook""".split()


def test_layer_names_are_derived_from_torch() -> None:
    derived = policy.module_attributes()
    missing = [name for name in _LAYER_NAMES if name not in derived and name not in policy.HOST_ATTRIBUTES]
    assert not missing, f"not derived from torch.nn: {missing}"
    allowed = module_host_attributes() | policy.HOST_ATTRIBUTES
    assert set(_LAYER_NAMES) <= allowed


def test_no_function_internal_enters_the_derived_names() -> None:
    derived = module_host_attributes()
    assert not derived & set(_INTERNALS)
    assert not derived & policy.function_internals()
    assert not derived & triton_function_internals()
    assert not derived & module_function_internals()
    assert not any(name.startswith("_") for name in derived)
    assert not derived & policy.FRAME_ATTRIBUTES
    assert not derived & set(policy.BANNED_ATTRIBUTES)
    assert not derived & policy.forbidden_tensor_methods()


def test_the_internals_are_derived_from_the_installed_triton() -> None:
    internals = triton_function_internals()
    for name in ("fn", "src", "get_capture_scope", "run", "warmup", "used_global_vals", "cache_key", "rewrite",
                 "jit_fn", "configs", "do_bench"):
        assert name in internals, name
    python = policy.function_internals()
    for name in ("format", "format_map", "f_back", "gi_frame", "co_code", "tb_frame", "fget", "func", "mro"):
        assert name in python, name


# ---------------------------------------------------------------------------------------------------------
# Nearest hostile variants of each relaxation
# ---------------------------------------------------------------------------------------------------------
_SUPER_LINE = "        super(ModelNew, self).__init__()\n"


@pytest.mark.parametrize(("replacement", "construct"), [
    ("        super(Other, self).__init__()\n", "super"),
    ("        super(ModelNew, torch.Tensor).__init__()\n", "super"),
    ("        obj = self\n        super(ModelNew, obj).__init__()\n", "super"),
    ("        s = super\n        s(ModelNew, self).__init__()\n", "super"),
    ("        super(ModelNew, self, 1).__init__()\n", "super"),
    ("        super(ModelNew, self=self).__init__()\n", "super"),
])
def test_super_with_another_class_or_object_or_a_rebound_super_stays_refused(replacement: str,
                                                                             construct: str) -> None:
    source = CONV_GROUPNORM.replace(_SUPER_LINE, "        super().__init__()\n" + replacement)
    source = source.replace("class ModelNew(nn.Module):",
                            "class Other(nn.Module):\n    pass\n\n\nclass ModelNew(nn.Module):")
    assert construct in refused(source)


def test_super_at_module_level_rebinding_or_in_a_static_method_stays_refused() -> None:
    rebound = "super = super\n" + CONV_GROUPNORM
    assert "super" in refused(rebound)
    renamed = CONV_GROUPNORM + "\n\nModelNew = ModelNew\n"
    assert "super" in refused(renamed)
    static = CONV_GROUPNORM.replace("    def forward(self, x):\n", "    @staticmethod\n    def make(self):\n"
                                    "        return super(ModelNew, self).__init__()\n\n    def forward(self, x):\n")
    assert "super" in refused(static)


@pytest.mark.parametrize(("snippet", "construct"), [
    ("k = _bias_act_kernel\n        s = k.get_capture_scope()", ".get_capture_scope"),
    ("k = _bias_act_kernel\n        s = k.fn", ".fn"),
    ("k = _bias_act_kernel\n        s = k.src", ".src"),
    ("k = _bias_act_kernel\n        s = k.rewrite()", ".rewrite"),
    ("k = _bias_act_kernel\n        s = k.used_global_vals", ".used_global_vals"),
    ("k = _bias_act_kernel\n        s = k.cache", ".cache"),
    ("k = _bias_act_kernel\n        s = k.run", ".run"),
    ("s = _group_norm_params.__globals__", ".__globals__"),
    ("s = '{0.__globals__}'.format(_group_norm_params)", ".format"),
    ("s = self.conv.compile()", ".compile"),
    ("s = x.softmax(-1)", ".softmax"),
    ("s = self.conv.weight.exp()", ".exp"),
    ("s = self.buf.exp()", ".exp"),
    ("f = self.buf.exp\n        s = f()", ".exp"),
    ("f = self.conv.weight.exp\n        s = f()", ".exp"),
    ("s = self.softmax(x)", ".softmax"),
    ("s = self.matmul(x)", ".matmul"),
    ("s = [nn.Conv2d][0].train(torch.Tensor)", ".train"),
])
def test_internals_tensor_ops_and_compile_stay_refused_in_module_files(snippet: str, construct: str) -> None:
    source = CONV_GROUPNORM.replace("        conv = self.conv\n", f"        {snippet}\n        conv = self.conv\n")
    source = source.replace("        self.negative_slope = negative_slope\n",
                            "        self.negative_slope = negative_slope\n        self.softmax = nn.Softmax(1)\n"
                            "        self.matmul = nn.Linear(4, 4)\n"
                            "        self.register_buffer('buf', torch.zeros(4))\n")
    assert construct in refused(source)


@pytest.mark.parametrize("name", ["get_capture_scope", "fn", "src", "format", "used_global_vals", "run",
                                  "cache", "f_globals", "rewrite"])
def test_the_files_own_attribute_names_do_not_open_internals(name: str) -> None:
    """A class that defines the name (as an attribute or method) must not make it readable on a kernel or string."""
    header = f"class _Decoy:\n    {name} = 1\n\n    def __init__(self):\n        self.{name} = 2\n\n\n"
    source = CONV_GROUPNORM.replace("def _group_norm_params", header + "def _group_norm_params", 1)
    source = source.replace("        conv = self.conv\n", f"        leak = _bias_act_kernel.{name}\n"
                            "        conv = self.conv\n")
    assert f".{name}" in refused(source)


# ---------------------------------------------------------------------------------------------------------
# Stores on the layers the class made (the reference Model's own init code, copied into ModelNew)
# ---------------------------------------------------------------------------------------------------------
_BIAS_INIT = "        self.conv.bias = nn.Parameter(self.conv.bias + torch.ones_like(self.conv.bias) * 0.02)\n"
_OWNED = CONV_GROUPNORM.replace("        self.gn = nn.GroupNorm(num_groups, out_channels)\n",
                                "        self.gn = nn.GroupNorm(num_groups, out_channels)\n" + _BIAS_INIT)


def test_setting_a_parameter_of_a_layer_the_class_made_passes() -> None:
    assert _BIAS_INIT in _OWNED
    assert_passes(_OWNED)


@pytest.mark.parametrize("hostile", [
    # the attribute may hold another object than the layer
    _OWNED.replace(_BIAS_INIT, "        self.conv = torch.Tensor\n" + _BIAS_INIT),
    _OWNED + "\n\ndef _swap(model):\n    model.conv = torch.Tensor\n",
    _OWNED.replace(_BIAS_INIT, "        self._modules['conv'] = None\n" + _BIAS_INIT),
    _OWNED.replace("class ModelNew(nn.Module):\n", "class ModelNew(nn.Module):\n    conv = None\n\n"),
    # a tensor the class made: an instance attribute would shadow the methods the judge calls on an output
    _OWNED.replace(_BIAS_INIT, "        self.w = nn.Parameter(torch.zeros(3))\n        self.w.to = print\n"),
    # a shared class held by self
    _OWNED.replace(_BIAS_INIT, "        self.k = torch.Tensor\n        self.k.sum = print\n"),
])
def test_stores_through_self_on_objects_the_class_did_not_make_stay_refused(hostile: str) -> None:
    assert hostile != _OWNED
    constructs = refused(hostile)
    assert ".bias" in constructs or ".to" in constructs or ".sum" in constructs or ".conv" in constructs


RESNET_AND_MODULE_DICT = module_file('''
class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_channels, out_channels, stride=1):
        super(BasicBlock, self).__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)

    def forward(self, x):
        conv, bn = self.conv1, self.bn1
        y = torch.empty_like(x)
        n = y.numel()
        _bias_act_kernel[(triton.cdiv(n, 256),)](x, bn.bias, y, n, conv.out_channels, x.shape[2] * x.shape[3], 0.0,
                                                 BLOCK=256)
        return y


class ModelNew(nn.Module):
    def __init__(self, num_classes=10, width=64):
        super(ModelNew, self).__init__()
        self.in_channels = width
        self.layer1 = self._make_layer(BasicBlock, width, 2, stride=1)
        self.mlp = nn.ModuleDict(dict(c_fc=nn.Linear(width, 4 * width), c_proj=nn.Linear(4 * width, width),
                                      act=nn.GELU(), dropout=nn.Dropout(0.0)))
        self.fc = nn.Linear(width * BasicBlock.expansion, num_classes)

    def _make_layer(self, block, out_channels, blocks, stride=1):
        layers = [block(self.in_channels, out_channels, stride)]
        self.in_channels = out_channels * block.expansion
        for _ in range(1, blocks):
            layers.append(block(self.in_channels, out_channels))
        return nn.Sequential(*layers)

    def forward(self, x):
        m = self.mlp
        assert m.c_fc.out_features == m.c_proj.in_features and m.act.approximate == "none" and m.dropout.p == 0.0
        return self.layer1(x)
''')


def test_a_resnet_passing_its_block_class_and_a_module_dict_pass() -> None:
    assert_passes(RESNET_AND_MODULE_DICT)
    # the block class passed around as a value: its methods are readable on no untyped value
    hostile = RESNET_AND_MODULE_DICT.replace("        return nn.Sequential(*layers)\n",
                                             "        block.forward(torch.Tensor, None)\n"
                                             "        return nn.Sequential(*layers)\n")
    assert ".forward" in refused(hostile)


# ---------------------------------------------------------------------------------------------------------
# PyTorch ops building buffers in `__init__` (the reference Model's own init code: minGPT's causal mask)
# ---------------------------------------------------------------------------------------------------------
CAUSAL_MASK = module_file('''
class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, max_seqlen):
        super(CausalSelfAttention, self).__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.register_buffer("bias", torch.tril(torch.ones(max_seqlen, max_seqlen))
                             .view(1, 1, max_seqlen, max_seqlen))
        self.n_head = n_head

    def forward(self, x):
        y = torch.empty_like(x)
        n = y.numel()
        _bias_act_kernel[(triton.cdiv(n, 256),)](x, self.c_attn.bias, y, n, 1, 1, 1.0, BLOCK=256)
        return y


class ModelNew(nn.Module):
    def __init__(self, n_embd, n_head, max_seqlen, n_layer=2):
        super().__init__()
        self.blocks = nn.ModuleList([CausalSelfAttention(n_embd, n_head, max_seqlen) for _ in range(n_layer)])
        inv_freq = 1.0 / (10000 ** (torch.arange(0, n_embd, 2).float() / n_embd))
        freqs = torch.outer(torch.arange(max_seqlen).float(), inv_freq)
        self.register_buffer("cos", freqs.cos())
        self.register_buffer("mask", torch.ones(max_seqlen, max_seqlen, dtype=torch.bool).triu(1))
        self.proj = nn.Linear(n_embd, n_embd)
        with torch.no_grad():
            self.proj.weight.data.mul_(0.5)
        self.register_buffer("gram", torch.eye(n_embd) @ torch.eye(n_embd))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x
''')


def test_pytorch_ops_building_buffers_in_init_pass() -> None:
    assert "torch.tril(torch.ones(max_seqlen, max_seqlen))" in CAUSAL_MASK
    assert_passes(CAUSAL_MASK)


def test_the_construction_ops_are_derived_from_the_live_torch_and_leave_out_machinery() -> None:
    ops, methods = policy.construction_ops(), policy.construction_tensor_methods()
    for name in ("torch.tril", "torch.triu", "torch.outer", "torch.cos", "torch.einsum", "torch.cat", "torch.where"):
        assert name in ops, name
    for name in ("torch.compile", "torch.manual_seed", "torch.from_file", "torch.frombuffer", "torch.load",
                 "torch.save", "torch.cond", "torch.vmap", "torch.get_rng_state", "torch.set_default_device",
                 "torch.nn.functional.softmax", "torch.ops.aten.tril", "torch.cuda.synchronize", "torch.Generator"):
        assert name not in ops, name
    assert {"tril", "mul_", "masked_fill_", "repeat", "uniform_"} <= methods
    for name in ("apply_", "map_", "register_hook", "backward", "set_", "resize_", "untyped_storage",
                 "record_stream", "share_memory_", "numpy", "compile", "as_subclass"):
        assert name not in methods, name


_MASK_LINE = "        self.register_buffer(\"mask\", torch.ones(max_seqlen, max_seqlen, dtype=torch.bool).triu(1))\n"
_FORWARD_LINE = "        for block in self.blocks:\n"


@pytest.mark.parametrize(("replace", "by", "construct"), [
    # the same ops in forward (the op, and a tensor method op)
    (_FORWARD_LINE, "        x = torch.tril(x)\n" + _FORWARD_LINE, "torch.tril"),
    (_FORWARD_LINE, "        x = x.tril()\n" + _FORWARD_LINE, ".tril"),
    (_FORWARD_LINE, "        x = x @ self.gram\n" + _FORWARD_LINE, "@"),
    # in a helper called from __init__, at module level, in a lambda / nested function / generator in __init__
    ("    def forward(self, x):\n        for",
     "    def _build(self, n):\n        self.m = torch.tril(torch.ones(n, n))\n\n"
     "    def forward(self, x):\n        for",
     "torch.tril"),
    ("class ModelNew(nn.Module):\n", "_MASK = torch.tril(torch.ones(4, 4))\n\n\nclass ModelNew(nn.Module):\n",
     "torch.tril"),
    (_MASK_LINE, _MASK_LINE + "        self.act = lambda t: torch.tanh(t)\n", "torch.tanh"),
    (_MASK_LINE, _MASK_LINE + "        def act(t):\n            return t.tanh()\n\n        self.act = act\n",
     ".tanh"),
    (_MASK_LINE, _MASK_LINE + "        self.gen = (torch.exp(v) for v in self.mask)\n", "torch.exp"),
    (_MASK_LINE, _MASK_LINE + "        def act(t=torch.exp(torch.ones(1))):\n            return t\n\n"
     "        self.act = act\n", "torch.exp"),
    # an op kept as a value (called later, in forward), not called in __init__
    (_MASK_LINE, _MASK_LINE + "        self.act = torch.softmax\n", "torch.softmax"),
    (_MASK_LINE, _MASK_LINE + "        self.act = self.mask.exp\n", ".exp"),
    # machinery stays refused in __init__
    (_MASK_LINE, _MASK_LINE + "        self.fwd = torch.compile(self.forward)\n", "torch.compile"),
    (_MASK_LINE, _MASK_LINE + "        self.m2 = torch.ops.aten.tril(self.mask)\n", "torch.ops.aten.tril"),
    (_MASK_LINE, _MASK_LINE + "        torch.cuda.synchronize()\n", "torch.cuda.synchronize"),
    (_MASK_LINE, _MASK_LINE + "        torch.manual_seed(0)\n", "torch.manual_seed"),
    (_MASK_LINE, _MASK_LINE + "        self.m2 = torch.nn.functional.normalize(self.cos)\n",
     "torch.nn.functional.normalize"),
    (_MASK_LINE, _MASK_LINE + "        self.m2 = torch.nn.functional.torch.compile(self.forward)\n",
     "torch.nn.functional.torch.compile"),
    (_MASK_LINE, _MASK_LINE + "        self.m2 = torch.from_file('/etc/passwd')\n", "torch.from_file"),
    (_MASK_LINE, _MASK_LINE + "        self.cos.apply_(float)\n", ".apply_"),
    (_MASK_LINE, _MASK_LINE + "        self.cos.register_hook(float)\n", ".register_hook"),
    (_MASK_LINE, _MASK_LINE + "        self.cos.set_(self.mask)\n", ".set_"),
    (_MASK_LINE, _MASK_LINE + "        s = getattr(torch, 'softmax')\n", "getattr"),
    (_MASK_LINE, _MASK_LINE + "        import os\n", "import os"),
])
def test_pytorch_ops_outside_a_construction_only_init_stay_refused(replace: str, by: str, construct: str) -> None:
    assert replace in CAUSAL_MASK
    assert construct in refused(CAUSAL_MASK.replace(replace, by, 1))


_HELPER = '''
class Helper(nn.Module):
    def __init__(self, x=None):
        super().__init__()
        if x is not None:
            self.out = torch.softmax(x, -1)


'''


@pytest.mark.parametrize("hostile", [
    # the class built in forward: its __init__ would compute with the input
    "class ModelNew(nn.Module):\n    def forward(self, x):\n        return Helper(x).out\n",
    # a subclass built in forward runs the base's __init__
    "class Sub(Helper):\n    pass\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n"
    "        return Sub(x).out\n",
    # handed around as a value, then built anywhere
    "class ModelNew(nn.Module):\n    def __init__(self):\n        super().__init__()\n        self.make = Helper\n\n"
    "    def forward(self, x):\n        return self.make(x).out\n",
    # built by one of its static methods, called in forward
    "class ModelNew(nn.Module):\n    def forward(self, x):\n        return Helper.build(x).out\n",
    # __init__ run again in forward
    "class ModelNew(Helper):\n    def forward(self, x):\n        self.__init__(x)\n        return self.out\n",
    "class ModelNew(Helper):\n    def __init__(self):\n        super().__init__()\n\n    def forward(self, x):\n"
    "        super().__init__(x)\n        return self.out\n",
    "class ModelNew(Helper):\n    def forward(self, x):\n        super(ModelNew, self).__init__(x)\n"
    "        return self.out\n",
    # built in a lambda or a generator (run later)
    "class ModelNew(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
    "        self.make = lambda x: Helper(x)\n\n    def forward(self, x):\n        return self.make(x).out\n",
])
def test_an_init_that_can_run_after_construction_gets_no_pytorch_ops(hostile: str) -> None:
    helper = _HELPER.replace("    def __init__(self, x=None):",
                             "    @staticmethod\n    def build(x):\n        return Helper(x)\n\n"
                             "    def __init__(self, x=None):") if "Helper.build" in hostile else _HELPER
    source = module_file(helper + hostile)
    violations = screen_module(source)
    softmax = [v for v in violations if v.construct == "torch.softmax"]
    assert softmax, format_violations(violations)
    assert "built nowhere but at module level" in softmax[0].message


def test_a_helper_built_at_module_level_or_in_another_init_keeps_its_pytorch_ops() -> None:
    source = module_file(_HELPER + "_SHARED = Helper(torch.ones(4))\n\n\nclass ModelNew(nn.Module):\n"
                         "    def __init__(self, n):\n        super(ModelNew, self).__init__()\n"
                         "        self.h = Helper(torch.ones(n))\n        self.hs = nn.ModuleList([Helper() for _ in "
                         "range(2)])\n        assert isinstance(self.h, Helper)\n\n    def forward(self, x):\n"
                         "        y = torch.empty_like(x)\n        n = y.numel()\n"
                         "        _bias_act_kernel[(triton.cdiv(n, 256),)](x, x, y, n, 1, 1, 1.0, BLOCK=256)\n"
                         "        return y\n")
    assert_passes(source)


# ---------------------------------------------------------------------------------------------------------
# torch.nn.init: its own functions, not the modules it imported (`nn.init.torch` is torch itself)
# ---------------------------------------------------------------------------------------------------------
def test_nn_init_functions_pass_in_a_reset_parameters_copied_from_nn_linear() -> None:
    source = CONV_GROUPNORM.replace("        self.negative_slope = negative_slope\n", '''\
        self.negative_slope = negative_slope
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels))
        self.bias = nn.Parameter(torch.empty(out_channels))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        fan_in, _ = nn.init._calculate_fan_in_and_fan_out(self.weight)
        bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
        torch.nn.init.uniform_(self.bias, -bound, bound)
''')
    assert_passes(source)


@pytest.mark.parametrize(("snippet", "construct"), [
    ("s = nn.init.torch.compile(self.forward)", "torch.nn.init.torch.compile"),
    ("s = nn.init.torch.softmax(x, -1)", "torch.nn.init.torch.softmax"),
    ("s = torch.nn.init.torch.nn.functional.relu(x)", "torch.nn.init.torch.nn.functional.relu"),
    ("s = nn.init.torch.ops.aten.softmax(x, -1)", "torch.nn.init.torch.ops.aten.softmax"),
    ("s = nn.init.torch.sys._getframe(0)", "torch.nn.init.torch.sys._getframe"),
    ("s = nn.init.torch.os.environ", "torch.nn.init.torch.os.environ"),
    ("s = nn.init.warnings.warn", "torch.nn.init.warnings.warn"),
    ("s = nn.init.Tensor", "torch.nn.init.Tensor"),
    ("s = nn.init._make_deprecate(print)", "torch.nn.init._make_deprecate"),
    ("t = nn.init.torch\n        s = t.compile(self.forward)", "torch.nn.init.torch.compile"),
])
def test_what_nn_init_imported_stays_refused(snippet: str, construct: str) -> None:
    source = CONV_GROUPNORM.replace("        conv = self.conv\n", f"        {snippet}\n        conv = self.conv\n")
    assert construct in refused(source)


# ---------------------------------------------------------------------------------------------------------
# Recurrent layers' weights, and nn.Module calls bound to a layer the class made itself
# ---------------------------------------------------------------------------------------------------------
RNN_WEIGHTS = module_file('''
class ModelNew(nn.Module):
    def __init__(self, input_size, hidden_size, num_layers):
        super(ModelNew, self).__init__()
        self.lstm = nn.LSTM(input_size, hidden_size, num_layers, batch_first=True)
        self.gru = nn.GRU(input_size, hidden_size, num_layers, bidirectional=True)
        self.fc = nn.Linear(hidden_size, 4)

    def forward(self, x):
        lstm = self.lstm
        w_ih, w_hh, b_ih, b_hh = lstm.weight_ih_l0, lstm.weight_hh_l0, lstm.bias_ih_l0, lstm.bias_hh_l0
        w_last = self.lstm.weight_hh_l1 if lstm.num_layers > 1 else w_hh
        back = self.gru.weight_ih_l0_reverse
        flat = self.gru.all_weights
        params = list(self.lstm.parameters())
        named = dict(self.gru.named_parameters())
        assert len(params) == 4 * lstm.num_layers and back is named["weight_ih_l0_reverse"]
        assert flat and w_last is not None
        y = torch.empty_like(x)
        n = y.numel()
        _bias_act_kernel[(triton.cdiv(n, 256),)](x, b_ih + 0 * (w_ih.sum() + w_hh.sum() + b_hh.sum()), y, n, 1, 1, 1.0,
                                                 BLOCK=256)
        return self.fc.forward(y)
''')


def test_rnn_weights_and_bound_module_calls_on_owned_layers_pass() -> None:
    violations = screen_module(RNN_WEIGHTS)
    # `.sum()` is a PyTorch op in forward (the one thing refused here): the rest passes
    assert {v.construct for v in violations} == {".sum"}, format_violations(violations)
    assert_passes(RNN_WEIGHTS.replace("0 * (w_ih.sum() + w_hh.sum() + b_hh.sum())", "0"))


@pytest.mark.parametrize(("replace", "by", "construct"), [
    # a layer class, not a layer: `forward` would come unbound
    ("        self.fc = nn.Linear(hidden_size, 4)\n", "        self.fc = nn.Linear\n", ".forward"),
    # the attribute is set elsewhere too: it may hold another object
    ("        self.fc = nn.Linear(hidden_size, 4)\n",
     "        self.fc = nn.Linear(hidden_size, 4)\n        self.fc = torch.Tensor\n", ".forward"),
    # through a local or a container the object is untyped
    ("        return self.fc.forward(y)\n", "        fc = self.fc\n        return fc.forward(y)\n", ".forward"),
    ("        return self.fc.forward(y)\n", "        return [self.fc][0].forward(y)\n", ".forward"),
    ("        return self.fc.forward(y)\n", "        return [nn.Linear][0].forward(self, y)\n", ".forward"),
    # other nn.Module methods stay refused on layers
    ("        return self.fc.forward(y)\n", "        self.fc.apply(print)\n        return y\n", ".apply"),
    ("        return self.fc.forward(y)\n", "        self.fc.register_forward_hook(print)\n        return y\n",
     ".register_forward_hook"),
    # an initialiser's result is a tensor, not a layer the class made: no attribute stores on it
    ("        self.fc = nn.Linear(hidden_size, 4)\n",
     "        self.fc = nn.Linear(hidden_size, 4)\n        self.w = nn.init.normal_(torch.empty(3))\n"
     "        self.w.to = print\n", ".to"),
])
def test_module_calls_on_what_the_class_did_not_make_stay_refused(replace: str, by: str, construct: str) -> None:
    assert replace in RNN_WEIGHTS
    assert construct in refused(RNN_WEIGHTS.replace(replace, by, 1))


def test_rnn_parameter_names_are_derived_from_the_live_torch() -> None:
    names = module_host_attributes()
    for name in ("weight_ih_l0", "weight_hh_l3", "bias_ih_l0_reverse", "weight_hr_l1", "all_weights"):
        assert name in names, name
    assert not {"weight_ih_l0", "all_weights"} & (triton_function_internals() | policy.function_internals())
