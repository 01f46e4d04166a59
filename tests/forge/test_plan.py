"""Plan JSON round trip, apply, and clear errors for bad plan files."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from forge.plan import PLAN_VERSION, KernelOptimizationPlan, PlanEntry, PlanLoadError
from forge.providers import CompiledFunctionProvider, TorchSDPAProvider
from forge.samples import Sample
from tests.forge.providers_for_tests import DoublingReluProvider, FastGeluProvider


def _gelu_plan() -> tuple[KernelOptimizationPlan, torch.Tensor]:
    x = torch.randn(4, 16)
    sample = Sample((x,), {"approximate": "none"})  # how nn.GELU calls F.gelu
    provider = FastGeluProvider()
    provider.prepare([sample])
    entry = PlanEntry(provider=provider, signatures=(sample,), latency_ms=0.5, baseline_ms=1.0)
    return KernelOptimizationPlan(entries=(entry,)), x


def test_round_trip_through_json_file(tmp_path) -> None:
    plan, x = _gelu_plan()
    path = plan.save(tmp_path / "plan.json")
    loaded = KernelOptimizationPlan.load(path)
    assert loaded.functions == ["gelu"]
    entry = loaded.entries[0]
    assert isinstance(entry.provider, FastGeluProvider) and entry.provider.is_ready
    assert entry.signature_keys == plan.entries[0].signature_keys
    assert entry.speedup == pytest.approx(2.0)
    module = nn.GELU()
    with loaded.apply(module) as runtime:
        out = module(x)
    assert runtime.stats["gelu"].provider_calls == 1
    torch.testing.assert_close(out, F.gelu(x))
    assert json.loads(path.read_text())["version"] == PLAN_VERSION


def test_static_providers_round_trip() -> None:
    q = torch.randn(1, 2, 8, 16)
    sdpa = TorchSDPAProvider("math")
    assert sdpa.prepare([Sample((q, q, q), {"is_causal": True})])
    compiled = CompiledFunctionProvider("relu")
    compiled._ready = True  # serialisation only; compiling is covered in test_providers
    plan = KernelOptimizationPlan(
        entries=(
            PlanEntry(sdpa, (Sample((q, q, q), {"is_causal": True}),)),
            PlanEntry(compiled, (Sample((q,), {}),)),
        )
    )
    restored = KernelOptimizationPlan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert [e.provider.name for e in restored.entries] == ["PyTorch SDPA MATH", "torch.compile(relu)"]


def test_corrupt_file_gives_clear_error_and_applies_nothing(tmp_path) -> None:
    plan, _ = _gelu_plan()
    path = plan.save(tmp_path / "plan.json")
    path.write_text(path.read_text()[:-40])
    before = dict(vars(F))
    with pytest.raises(PlanLoadError, match=r"not valid JSON .*line \d+"):
        KernelOptimizationPlan.load(path)
    assert all(vars(F)[k] is v for k, v in before.items())


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(version=99), "unsupported plan version 99"),
        (lambda d: d.update(format="other"), "not a kernel-forge plan"),
        (lambda d: d["entries"][0]["provider"].update(type="no_such_provider"), "unknown kernel provider type"),
        (lambda d: d["entries"][0].pop("signatures"), r"entries\[0\]: missing key 'signatures'"),
        (lambda d: d["entries"].append(dict(d["entries"][0])), "at most one provider per function"),
    ],
)
def test_invalid_plans_are_refused(tmp_path, mutate, message) -> None:
    plan, _ = _gelu_plan()
    data = plan.to_dict()
    mutate(data)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    with pytest.raises(PlanLoadError, match=message):
        KernelOptimizationPlan.load(path)


def test_missing_file_error(tmp_path) -> None:
    with pytest.raises(PlanLoadError, match="cannot read plan file"):
        KernelOptimizationPlan.load(tmp_path / "nope.json")


def test_environment_mismatch_warns_or_refuses(tmp_path, caplog) -> None:
    plan, _ = _gelu_plan()
    data = plan.to_dict()
    data["environment"]["torch"] = "0.0.1"
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    with caplog.at_level("WARNING"):
        KernelOptimizationPlan.load(path)
    assert "another environment" in caplog.text
    with pytest.raises(PlanLoadError, match="strict_environment"):
        KernelOptimizationPlan.load(path, strict_environment=True)


def test_verify_revalidates_on_fresh_inputs() -> None:
    plan, _ = _gelu_plan()
    assert plan.verify() == {"gelu": []}
    x = torch.randn(4, 16)
    wrong = DoublingReluProvider("gelu")  # relu posing as gelu
    wrong.prepare([Sample((x,), {})])
    bad = KernelOptimizationPlan(entries=(PlanEntry(wrong, (Sample((x,), {}),)),))
    assert bad.verify()["gelu"]


def test_duplicate_provider_type_name_is_an_error() -> None:
    with pytest.raises(ValueError, match="already registered"):

        class Clash(FastGeluProvider, type_name="test_fast_gelu"):
            pass


def test_builtin_provider_types_load_in_a_fresh_process(tmp_path) -> None:
    """A deploy-time load must not depend on the caller having imported the provider modules."""
    import subprocess
    import sys

    q = torch.randn(1, 2, 8, 16)
    sdpa = TorchSDPAProvider("math")
    assert sdpa.prepare([Sample((q, q, q), {})])
    path = KernelOptimizationPlan(entries=(PlanEntry(sdpa, (Sample((q, q, q), {}),)),)).save(tmp_path / "p.json")
    code = "import sys; from forge.plan import KernelOptimizationPlan as P; print(P.load(sys.argv[1]).providers)"
    result = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120,
                            cwd=str(__import__("pathlib").Path(__file__).resolve().parents[2]))
    assert result.returncode == 0, result.stderr
    assert "PyTorch SDPA MATH" in result.stdout
