"""Module kernels exported as a local `kernels` repository (`forge.hub_kernels`, `kforge plan export-kernels`): a
generated `ModelNew` for Hugging Face's `LlamaRMSNorm` (real Triton under the interpreter) in a tiny fp32
`LlamaForCausalLM`, swapped in by the real `kernels.kernelize` and by transformers' own `kernelize`, with the plan's
guard: judged instances and signatures only, the original forward for anything else, a tampered plan refused."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

kernels = pytest.importorskip("kernels")
transformers = pytest.importorskip("transformers")

from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRMSNorm  # noqa: E402

from agent.modules import GeneratedModuleProvider  # noqa: E402
from forge.hub_kernels import HubExport, HubExportError, _variant_digest, export_kernels  # noqa: E402
from forge.modules import (  # noqa: E402
    class_name,
    module_target_name,
    record_module_calls,
)
from forge.plan import KernelOptimizationPlan, PlanEntry, PlanLoadError  # noqa: E402
from forge.samples import Sample  # noqa: E402
from kforge.cli import main  # noqa: E402
from tests.agent.test_module_generation import RMS_CLASS, RMS_MODELNEW  # noqa: E402
from tests.forge.providers_for_tests import FastGeluProvider, KeyedModuleKernel  # noqa: E402

RMS = module_target_name(LlamaRMSNorm)
IDS = torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(1))


def _llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=4, vocab_size=128)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.uniform_(0.5, 1.5)
    return model


@pytest.fixture(scope="module")
def llama() -> LlamaForCausalLM:
    return _llama()


@pytest.fixture(scope="module")
def rms_plan(llama, tmp_path_factory) -> KernelOptimizationPlan:
    """A real plan entry: the generated RMSNorm file, prepared on the instances and calls the model makes."""
    with torch.no_grad(), record_module_calls(llama, {RMS}) as found:
        llama(IDS)
    key, group = next(iter(found[RMS].instances.items()))
    provider = GeneratedModuleProvider(RMS_CLASS, RMS_MODELNEW, language="triton",
                                       cache_dir=tmp_path_factory.mktemp("kernels"))
    assert provider.prepare_instances(group, found[RMS].samples[key])
    signatures = tuple(found[RMS].samples[key])
    return KernelOptimizationPlan(entries=(PlanEntry(provider=provider, signatures=signatures, source="generated"),))


def _kernelize(model: nn.Module, export: HubExport) -> None:
    with kernels.use_kernel_mapping(export.layer_repositories("cpu"), inherit_mapping=False):
        kernels.kernelize(model, mode=kernels.Mode.INFERENCE, device="cpu",
                          use_fallback=kernels.KernelizeFallback.NO_LAYER)  # Llama declares other layers too


def _stats(export: HubExport) -> dict[str, dict[str, int]]:
    frame = sys.modules[export.module_id].stats()
    return {row["function"]: {k: row[k] for k in ("provider_calls", "fallback_calls", "provider_errors")}
            for row in frame.to_dict("records")}


def test_kernelize_serves_the_judged_norms_and_falls_back_on_other_instances_and_calls(llama, rms_plan, tmp_path):
    export = export_kernels(rms_plan, tmp_path / "hub")
    assert export.mapping == {"RMSNorm": f"{(tmp_path / 'hub').resolve()}:RMSNorm"} and export.exported == (RMS,)
    assert json.loads((tmp_path / "hub" / "kernel_mapping.json").read_text()) == export.mapping
    model = copy.deepcopy(llama)
    model.model.norm.variance_epsilon = 1e-5  # another behaviour (instance_key): never judged, never served
    reference = copy.deepcopy(model)
    _kernelize(model, export)
    norms = [m for m in model.modules() if isinstance(m, LlamaRMSNorm)]
    assert all("forward" in vars(m) for m in norms)  # kernelize swapped every instance...
    with torch.no_grad():
        got, expected = model(IDS).logits, reference(IDS).logits
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    stats = _stats(export)
    # ...the judged four ran the kernel, the fifth (eps 1e-5) its original forward
    assert stats[RMS] == {"provider_calls": 4, "fallback_calls": 0, "provider_errors": 0}
    assert stats["RMSNorm: not served"]["fallback_calls"] == 1

    norm = model.model.layers[0].input_layernorm
    x = torch.randn(3, 5, 64)  # a signature the plan did not judge
    with torch.no_grad():
        torch.testing.assert_close(norm(x), LlamaRMSNorm.forward(norm, x))
        norm(hidden_states=torch.randn(2, 7, 64))  # a judged signature spelled by keyword: rearranged, served
    assert _stats(export)[RMS] == {"provider_calls": 5, "fallback_calls": 1, "provider_errors": 0}
    norm(torch.randn(2, 7, 64)).sum().backward()  # autograd would need the kernel's backward: the original runs
    assert norm.weight.grad is not None and _stats(export)[RMS]["fallback_calls"] == 2


def _metadata_path(export: HubExport) -> Path:
    return export.package.parent / "metadata.json"


def test_a_tampered_exported_plan_is_refused_when_kernelize_imports_it(llama, rms_plan, tmp_path):
    export = export_kernels(rms_plan, tmp_path / "hub")
    data = json.loads(export.plan_path.read_text())
    data["entries"][0]["description"] = "edited after signing"
    export.plan_path.write_text(json.dumps(data))
    # ...and the files' digest written again, so kernels' own check passes: the plan's signature still refuses it
    metadata = json.loads(_metadata_path(export).read_text())
    metadata["digest"] = _variant_digest(export.package.parent)
    _metadata_path(export).write_text(json.dumps(metadata))
    model = copy.deepcopy(llama)
    with pytest.raises(PlanLoadError, match="signature"):
        _kernelize(model, export)
    assert export.module_id not in sys.modules
    assert not any("forward" in vars(m) for m in model.modules())  # nothing half-applied


def test_an_edited_layer_file_is_refused_by_kernels_digest_check(llama, rms_plan, tmp_path):
    export = export_kernels(rms_plan, tmp_path / "hub")
    assert set(json.loads(_metadata_path(export).read_text())["digest"]["files"]) == {
        f"{export.package.name}/{file}" for file in ("__init__.py", "layers.py", "plan.json")}
    layers = export.package / "layers.py"
    layers.write_text(layers.read_text() + "\nprint('edited after the export')\n")
    model = copy.deepcopy(llama)
    with pytest.raises(RuntimeError, match="digest"):
        _kernelize(model, export)
    assert export.module_id not in sys.modules
    assert not any("forward" in vars(m) for m in model.modules())


def test_transformers_kernelize_with_a_kernel_config_loads_the_export(llama, rms_plan, tmp_path):
    from transformers import KernelConfig
    from transformers.integrations import hub_kernels

    export = export_kernels(rms_plan, tmp_path / "hub", name="my-norms")
    assert export.package.name == "my_norms"
    model = copy.deepcopy(llama)
    config = KernelConfig(use_local_kernel=True)  # its constructor refuses the CPU; the mapping it builds, set here
    config.kernel_mapping = {layer: {"cpu": {kernels.Mode.INFERENCE: repos["cpu"]}}
                             for layer, repos in export.layer_repositories("cpu").items()}
    hub_kernels.kernelize(model, mode=kernels.Mode.INFERENCE, kernel_config=config)
    with torch.no_grad():
        torch.testing.assert_close(model(IDS).logits, llama(IDS).logits, rtol=1e-4, atol=1e-4)
    assert _stats(export)[RMS]["provider_calls"] == 5


@pytest.mark.slow
def test_under_torch_compile_a_prepared_model_runs_each_served_norm_as_one_op(llama, rms_plan, tmp_path):
    from torch._dynamo.utils import counters

    export = export_kernels(rms_plan, tmp_path / "hub")
    model = copy.deepcopy(llama)
    with kernels.use_kernel_mapping(export.layer_repositories("cpu"), inherit_mapping=False):
        kernels.kernelize(model, mode=kernels.Mode.INFERENCE | kernels.Mode.TORCH_COMPILE, device="cpu",
                          use_fallback=kernels.KernelizeFallback.NO_LAYER)
    package = sys.modules[export.module_id]
    assert package.prepare(model) == 5
    counters.clear()
    with torch.no_grad(), pytest.warns(UserWarning, match="made for eager runs under compile"):
        got = torch.compile(model, backend="inductor", fullgraph=True)(IDS).logits
    torch.testing.assert_close(got, llama(IDS).logits, rtol=1e-4, atol=1e-4)
    assert not counters["graph_break"] and _stats(export)[RMS]["provider_calls"] == 5


# -- a layer with every kind of parameter, served by a plain-torch provider --------------------------------------
@kernels.use_kernel_forward_from_hub("GatedNorm")
class GatedNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.rand(dim) + 0.5)
        self.eps = eps

    def forward(self, x, gate=None, *, scale=1.0, **extra):
        y = self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * scale
        return y if gate is None else y * gate


class PlainNorm(nn.Module):
    """The same norm without a declared layer name: kernelize cannot swap it."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.rand(dim) + 0.5)
        self.eps = 1e-6

    forward = GatedNorm.forward


class GatedNormKernel(KeyedModuleKernel, type_name="test_hub_gated_norm"):
    calls = 0

    def _bind(self, module):
        def forward(x, gate=None, *, scale=1.0, **extra):
            GatedNormKernel.calls += 1
            return GatedNorm.forward(module, x, gate, scale=scale, **extra)
        return forward

    def _prepare_instances(self, instances, samples, counts=None):
        return True



def _gated_plan(norm: nn.Module, *samples: Sample, kind: type = GatedNorm) -> KernelOptimizationPlan:
    provider = GatedNormKernel(class_name(kind))
    assert provider.prepare_instances([norm], list(samples))
    return KernelOptimizationPlan(entries=(PlanEntry(provider=provider, signatures=samples),))


def test_a_call_is_rearranged_into_the_spelling_it_was_judged_in_and_other_spellings_fall_back(tmp_path):
    norm = GatedNorm(8)
    x, gate = torch.randn(2, 8), torch.randn(2, 8)
    plan = _gated_plan(norm, Sample((x, gate), {"scale": 2.0}))  # judged as norm(x, gate, scale=2.0)
    export = export_kernels(plan, tmp_path / "hub")
    source = (export.package / "layers.py").read_text()
    assert "def forward(self, x, gate=_UNSET, *, scale=_UNSET, **extra):" in source
    model = nn.Sequential(norm)
    _kernelize(model, export)
    GatedNormKernel.calls = 0
    with torch.no_grad():
        for call in (lambda: norm(x, gate, scale=2.0), lambda: norm(x, gate=gate, scale=2.0),
                     lambda: norm(scale=2.0, gate=gate, x=x)):
            torch.testing.assert_close(call(), GatedNorm.forward(norm, x, gate, scale=2.0))
        norm(x, gate)  # scale left out: not the judged call
        norm(x, gate, scale=2.0, bias=None)  # an extra keyword: not the judged call
        norm(x, gate, scale=3.0)  # another value
    assert GatedNormKernel.calls == 3
    entry = _stats(export)[module_target_name(GatedNorm)]
    assert (entry["provider_calls"], entry["fallback_calls"]) == (3, 3)


def test_only_module_entries_of_declared_layers_are_exported_and_a_plan_without_any_is_an_error(tmp_path):
    gelu = PlanEntry(provider=FastGeluProvider(), signatures=(Sample((torch.randn(4),), {}),))
    plain = _gated_plan(PlainNorm(8), Sample((torch.randn(2, 8),), {}), kind=PlainNorm).entries[0]
    with pytest.raises(HubExportError, match=r"nothing to export: .*gelu: an F call.*PlainNorm declares no hub layer"):
        export_kernels(KernelOptimizationPlan(entries=(gelu, plain)), tmp_path / "none")
    assert not (tmp_path / "none").exists()

    served = _gated_plan(GatedNorm(8), Sample((torch.randn(2, 8),), {})).entries[0]
    export = export_kernels(KernelOptimizationPlan(entries=(gelu, plain, served)), tmp_path / "some")
    assert export.exported == (module_target_name(GatedNorm),)
    assert [function for function, _ in export.skipped] == ["gelu", module_target_name(PlainNorm)]
    assert KernelOptimizationPlan.load(export.plan_path).functions == [module_target_name(GatedNorm)]


def test_the_output_folder_is_replaced_only_when_it_is_a_previous_export_or_overwrite_is_given(tmp_path,
                                                                                                monkeypatch):
    plan = _gated_plan(GatedNorm(8), Sample((torch.randn(2, 8),), {}))
    first = export_kernels(plan, tmp_path / "hub")
    second = export_kernels(plan, tmp_path / "hub")  # a previous export: replaced, under a new module id
    assert second.module_id != first.module_id and second.plan_path.is_file()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(HubExportError, match="not a kernel-forge export.*overwrite=True"):
        export_kernels(plan, tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"
    export_kernels(plan, tmp_path / "mine", overwrite=True)
    assert not (tmp_path / "mine" / "notes.txt").exists()
    monkeypatch.chdir(tmp_path / "mine")
    with pytest.raises(HubExportError, match="refusing to replace"):
        export_kernels(plan, tmp_path, overwrite=True)  # the folder it works in, or one above
    with pytest.raises(HubExportError, match="invalid package name"):
        export_kernels(plan, tmp_path / "other", name="Bad_Name")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hub", "mine"]  # nothing left behind


def test_cli_export_kernels_writes_the_repository_and_prints_the_mapping(tmp_path, capsys):
    plan_path = _gated_plan(GatedNorm(8), Sample((torch.randn(2, 8),), {})).save(tmp_path / "plan.json")
    out = (tmp_path / "hub").resolve()
    assert main(["plan", "export-kernels", str(plan_path), "--out", str(out), "--name", "gated"]) == 0
    printed = capsys.readouterr().out
    mapping = json.loads((out / "kernel_mapping.json").read_text())
    assert mapping == {"GatedNorm": f"{out}:GatedNorm"}
    assert f'"GatedNorm": "{out}:GatedNorm"' in printed and "use_local_kernel=True" in printed
    assert (out / "build" / "torch-universal" / "gated" / "layers.py").is_file()
    assert main(["plan", "export-kernels", str(plan_path), "--out", str(Path(tmp_path, "no", "such"))]) == 2
