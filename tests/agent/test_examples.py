"""The example files shown in the prompts are complete, correct kernels: run them (Triton interpreter on CPU) against
PyTorch with the harness oracle, and show that the same check fails for a broken copy."""

from __future__ import annotations

import importlib.util
import sys
import uuid
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from agent.examples import EXAMPLES_DIR
from forge.checking import validate
from forge.samples import Sample

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _load(path: Path):
    """Import a kernel file as a fresh module (registered in sys.modules, as the sandbox does)."""
    name = f"example_under_test_{uuid.uuid4().hex}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _load_source(tmp_path: Path, source: str):
    path = tmp_path / f"example_variant_{uuid.uuid4().hex}.py"
    path.write_text(source)
    return _load(path)


def _silu_samples() -> list[Sample]:
    g = torch.Generator().manual_seed(0)
    base = torch.randn(48, 80, generator=g)
    return [
        Sample((torch.randn(33, 70, generator=g).to(DEVICE),), {}),
        Sample((torch.randn(3, 5, 40, generator=g).to(torch.bfloat16).to(DEVICE),), {}),
        Sample((base.to(DEVICE)[:, 5:60],), {}),  # row-strided slice with a storage offset
        Sample((torch.randn(40, 24, generator=g).to(DEVICE).t(),), {}),  # transposed
        Sample((torch.randn(77, generator=g).to(DEVICE),), {"inplace": False}),
    ]


def test_silu_example_matches_pytorch():
    module = _load(EXAMPLES_DIR / "triton_example.py")
    errors = validate(F.silu, module.kernel_function, _silu_samples())
    assert errors == []


def test_silu_example_inplace_writes_into_the_input():
    module = _load(EXAMPLES_DIR / "triton_example.py")
    x = torch.randn(6, 50, device=DEVICE)
    expected = F.silu(x)
    result = module.kernel_function(x, inplace=True)
    assert result is x
    torch.testing.assert_close(x, expected)


def test_oracle_rejects_a_broken_copy_of_the_silu_example(tmp_path):
    source = (EXAMPLES_DIR / "triton_example.py").read_text()
    broken = source.replace("tl.exp(-xf)", "tl.exp(xf)")
    assert broken != source
    module = _load_source(tmp_path, broken)
    errors = validate(F.silu, module.kernel_function, _silu_samples()[:1])
    assert errors, "a kernel computing x * sigmoid(-x) must fail the oracle"


def _module_pair(candidate_source: str | None, tmp_path: Path):
    reference = _load(EXAMPLES_DIR / "module_example_reference.py")
    if candidate_source is None:
        candidate = _load(EXAMPLES_DIR / "module_example.py")
    else:
        candidate = _load_source(tmp_path, candidate_source)
    init = reference.get_init_inputs()
    torch.manual_seed(7)
    model = reference.Model(*init).to(DEVICE)
    torch.manual_seed(7)
    model_new = candidate.ModelNew(*init).to(DEVICE)
    return reference, model, model_new


def test_module_example_matches_its_reference(tmp_path):
    reference, model, model_new = _module_pair(None, tmp_path)
    torch.testing.assert_close(model_new.scale, model.scale)  # same parameters from the same seed
    for seed in (0, 1):
        torch.manual_seed(seed)
        inputs = [t.to(DEVICE) for t in reference.get_inputs()]
        with torch.no_grad():
            torch.testing.assert_close(model_new(*inputs), model(*inputs))


def test_module_check_rejects_a_broken_module_example(tmp_path):
    source = (EXAMPLES_DIR / "module_example.py").read_text()
    broken = source.replace("y * negative_slope", "y * 0.0")
    assert broken != source
    reference, model, model_new = _module_pair(broken, tmp_path)
    torch.manual_seed(0)
    inputs = [t.to(DEVICE) for t in reference.get_inputs()]
    with torch.no_grad(), pytest.raises(AssertionError):
        torch.testing.assert_close(model_new(*inputs), model(*inputs))
