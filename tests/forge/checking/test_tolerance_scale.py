"""Scale-relative tolerances (issue 10, mechanism 3): outputs much smaller than 1 no longer sit under the floors."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from forge.checking import validate
from forge.checking.tolerance import DEFAULT_TOLERANCES, allowed_error, output_scale
from forge.samples import Sample
from tests.agent import kernels as agent_kernels

REPO = Path(__file__).resolve().parents[3]


def _randn(shape: tuple[int, ...], seed: int, scale: float = 1.0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return (torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype)


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.kernel_function


def _load_source(source: str, name: str, tmp_path: Path):
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    return _load(path, name)


def test_floor_scales_with_small_outputs_only():
    small = torch.full((8,), 1e-3, dtype=torch.float64)
    no_error = torch.zeros(8, dtype=torch.float64)
    allowed = allowed_error(small, no_error, torch.float32, DEFAULT_TOLERANCES, 4.0)
    assert torch.allclose(allowed, torch.full((8,), 1e-5 * 1e-3 + 1e-5 * 1e-3, dtype=torch.float64))
    large = torch.full((8,), 50.0, dtype=torch.float64)
    assert torch.allclose(allowed_error(large, no_error, torch.float32, DEFAULT_TOLERANCES, 4.0),
                          torch.full((8,), 1e-5 + 1e-5 * 50, dtype=torch.float64))
    zeros = torch.zeros(8, dtype=torch.float64)  # an all-zero reference keeps a positive (tiny) floor
    assert float(output_scale(zeros, torch.bfloat16)) == torch.finfo(torch.bfloat16).tiny
    assert (allowed_error(zeros, no_error, torch.bfloat16, DEFAULT_TOLERANCES, 4.0) > 0).all()


def test_all_zero_gelu_on_small_bf16_activations_fails():
    x = _randn((16, 128), 1, scale=0.004, dtype=torch.bfloat16)
    assert float(F.gelu(x.float()).abs().max()) < DEFAULT_TOLERANCES[torch.bfloat16][0]  # under the old floor
    errors = validate(F.gelu, lambda t, approximate="none": torch.zeros_like(t), [Sample((x,), {})])
    assert errors and "outside tolerance" in errors[0]
    honest = lambda t, approximate="none": F.gelu(t.float()).to(t.dtype)  # noqa: E731 - fp32 math, one rounding
    assert validate(F.gelu, honest, [Sample((x,), {})]) == []


def test_constant_softmax_on_flat_logits_fails():
    logits = _randn((16, 64), 2, scale=1e-4)
    deviation = (F.softmax(logits.double(), dim=-1) - 1 / 64).abs().max()
    assert deviation < DEFAULT_TOLERANCES[torch.float32][0]  # the constant sat under fp32's old floor

    def constant(x, dim=None, _stacklevel=3, dtype=None):
        return torch.full_like(x, 1.0 / x.shape[-1])

    errors = validate(F.softmax, constant, [Sample((logits,), {"dim": -1})])
    assert errors and "outside tolerance" in errors[0]

    def by_exp(x, dim=None, _stacklevel=3, dtype=None):
        e = (x - x.amax(dim, keepdim=True)).exp()
        return e / e.sum(dim, keepdim=True)

    assert validate(F.softmax, by_exp, [Sample((logits,), {"dim": -1})]) == []


def _rms_norm_bf16_sum(x, normalized_shape, weight=None, eps=None):
    """fp32 rms_norm whose sum of squares is accumulated in bf16, 16 columns at a time (forbidden by the prompt)."""
    n = x.shape[-1]
    acc = torch.zeros(x.shape[:-1], dtype=torch.bfloat16)
    for start in range(0, n, 16):
        chunk = x[..., start:start + 16].to(torch.bfloat16)
        acc = (acc + (chunk * chunk).sum(-1)).to(torch.bfloat16)
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    y = x * torch.rsqrt(acc.float() / n + eps)[..., None]
    return y * weight if weight is not None else y


def test_bf16_accumulation_in_an_fp32_rms_norm_fails():
    x = _randn((8, 1024), 3)
    weight = _randn((1024,), 4, scale=2e-4)  # a small-gain layer: outputs ~2e-4, the old fp32 floor was 1e-5
    sample = Sample((x, (1024,), weight, 1e-6), {})
    error = (_rms_norm_bf16_sum(x, (1024,), weight, 1e-6).double() - F.rms_norm(x.double(), (1024,),
                                                                                weight.double(), 1e-6)).abs().max()
    assert error < DEFAULT_TOLERANCES[torch.float32][0]  # what let it pass before
    errors = validate(F.rms_norm, _rms_norm_bf16_sum, [sample])
    assert errors and "outside tolerance" in errors[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("scale", [0.004, 1.0])
def test_honest_triton_kernels_pass(dtype: torch.dtype, scale: float, tmp_path: Path):
    silu = _load(REPO / "agent" / "examples" / "triton_example.py", "triton_example_silu")
    rms_norm = _load_source(agent_kernels.RMS_NORM_OK, "rms_norm_ok", tmp_path)
    x = _randn((8, 256), 5, scale=scale, dtype=dtype)
    weight = (1 + _randn((256,), 6, scale=0.1)).to(dtype)
    assert validate(F.silu, silu, [Sample((x,), {})]) == []
    assert validate(F.rms_norm, rms_norm, [Sample((x, (256,), weight, 1e-6), {})]) == []
