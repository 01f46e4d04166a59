"""The real-library demos build their models with the libraries' own classes and run them (tiny configs on CPU)."""

from __future__ import annotations

import pytest
import torch

from forge.demos import get_demo
from forge.errors import UsageError
from forge.profiler import ModuleFunctionKernelProfiler

CASES = [("hf-llama", "transformers", "CausalLMOutputWithPast"), ("timm-vit", "timm", "Tensor"),
         ("diffusers-unet", "diffusers", "UNet2DConditionOutput")]


@pytest.mark.parametrize(("name", "library", "output"), CASES)
def test_library_demo_builds_runs_and_profiles(name, library, output):
    pytest.importorskip(library)
    demo = get_demo(name)
    model, data = demo.model("cpu"), demo.inputs("cpu")
    with torch.no_grad():
        result = model(*data[0].args, **data[0].kwargs)
    assert type(result).__name__ == output
    profile = ModuleFunctionKernelProfiler().profile(model, data)
    assert profile.functions and profile.total_time_ms > 0


def test_a_missing_library_is_one_clear_line(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "timm", None)  # `import timm` raises ImportError
    with pytest.raises(UsageError, match=r"needs the 'timm' package: pip install -e \"\.\[models\]\""):
        get_demo("timm-vit").model("cpu")
