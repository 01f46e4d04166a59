"""The embedded demos (`forge.demos`): the registry, both models at CPU and GPU sizes, `kforge ... --demo [NAME]`,
and a CLI output free of Kineto's console lines."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from forge.demos import DEFAULT_DEMO, DEMOS, UnknownDemoError, demo_names, get_demo
from forge.demos.llama import DemoConfig, DemoDecoder
from forge.demos.unet import DemoUNet, UNetConfig, unet_config
from forge.profiler import ModuleFunctionKernelProfiler
from kforge.cli import main

REPO = Path(__file__).resolve().parents[2]
KINETO_LINE = re.compile(r"^(USDT|STAGE):\d{4}-\d\d-\d\d ", re.MULTILINE)


def test_registry_names_the_default_first_and_rejects_unknown_names() -> None:
    assert DEFAULT_DEMO == "llama" and demo_names() == ["llama", "diffusers-unet", "hf-llama", "timm-vit", "unet"]
    assert get_demo() is DEMOS["llama"] and get_demo("unet").name == "unet"
    choices = "llama, diffusers-unet, hf-llama, timm-vit, unet"
    with pytest.raises(UnknownDemoError, match=f"'resnet'; choose one of: {choices}"):
        get_demo("resnet")


def test_the_old_import_path_is_the_llama_demo() -> None:
    from forge.demo import DemoConfig as OldConfig
    from forge.demo import demo_inputs, demo_model

    assert OldConfig is DemoConfig and demo_model is DEMOS["llama"].model and demo_inputs is DEMOS["llama"].inputs


@pytest.mark.parametrize("name", ["llama", "unet"])
def test_cpu_demo_runs_on_its_inputs_with_seeded_weights(name: str) -> None:
    demo = get_demo(name)
    model, data = demo.model("cpu"), demo.inputs("cpu")
    assert len(data) == 2 and all(p.dtype == torch.float32 for p in model.parameters())
    with torch.no_grad():
        outputs = [model(*sample.args, **sample.kwargs) for sample in data]
        again = demo.model("cpu")(*data[0].args)
    assert all(torch.isfinite(out).all() for out in outputs)
    assert torch.equal(outputs[0], again)  # same seed, same weights
    assert not torch.equal(outputs[0], outputs[1])  # the two samples differ
    if name == "llama":
        assert torch.allclose(outputs[0].sum(-1), torch.ones(()), atol=1e-4)  # next-token probabilities
    else:
        assert outputs[0].shape == data[0].args[0].shape  # noise prediction, shaped like the latents


def test_gpu_configs_build_and_run_at_full_size_on_the_meta_device() -> None:
    """The H200 sizes are consistent (shapes only, no compute): SDXL-sized fp16 UNet, prefill-sized bf16 decoder."""
    config = unet_config("cuda")
    assert config.dtype == torch.float16 and config.channels == (320, 640) and config.size == 128
    llama = DemoConfig()
    with torch.device("meta"):
        unet = DemoUNet(config).to(config.dtype)
        latents = torch.empty(config.batch, config.in_channels, config.size, config.size, dtype=config.dtype)
        noise = unet(latents, torch.empty(config.batch))
        decoder = DemoDecoder(llama).to(llama.dtype)
        probs = decoder(torch.empty(llama.batch, llama.seq_len, dtype=torch.long))
    assert noise.shape == latents.shape and noise.dtype == torch.float16
    assert probs.shape == (llama.batch, llama.seq_len, llama.vocab_size) and probs.dtype == torch.bfloat16
    assert llama.batch * llama.seq_len >= 2048


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"channels": (320, 650)}, "multiple of groups"),
        ({"attention": (False,)}, "one entry per level"),
        ({"head_dim": 48}, "divisible by head_dim"),
        ({"size": 63}, "cannot be halved"),
    ],
)
def test_unet_config_rejects_inconsistent_sizes(changes: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        UNetConfig(**changes)


def test_unet_profile_shows_the_functionals_of_a_diffusion_unet() -> None:
    demo = get_demo("unet")
    result = ModuleFunctionKernelProfiler(set(), warmup_iterations=0).profile(demo.model("cpu"), demo.inputs("cpu"))
    expected = {"conv2d", "group_norm", "silu", "linear", "layer_norm", "scaled_dot_product_attention", "gelu",
                "interpolate"}
    assert expected <= set(result.functions)
    # Two GroupNorms per ResBlock (8), one per transformer (4) and the output norm, for each of the 2 samples.
    assert result.functions["group_norm"].calls == 2 * (2 * 8 + 4 + 1)


def test_cli_demo_argument_takes_a_name_defaults_to_llama_and_rejects_unknown_names(tmp_path, capsys) -> None:
    for command in (["optimize", "--demo", "resnet", "--device", "cpu"],
                    ["prompts", "--demo", "resnet", "--device", "cpu", "--out", str(tmp_path / "p.jsonl")]):
        with pytest.raises(SystemExit) as raised:
            main(command)
        assert str(raised.value) == ("kforge: unknown demo 'resnet'; choose one of: "
                                     "llama, diffusers-unet, hf-llama, timm-vit, unet")
    out = tmp_path / "prompts.jsonl"
    assert main(["prompts", "--demo", "--device", "cpu", "--functions", "rms_norm", "--out", str(out)]) == 0
    assert "rms_norm" in capsys.readouterr().out and out.read_text().count("\n") == 1


def _cli(args: list[str], env_changes: dict[str, str | None]) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    for key, value in env_changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=REPO, env=env, timeout=300)


def test_kforge_optimize_demo_unet_prints_its_profile_without_kineto_lines() -> None:
    # This process may already hold the profiler's KINETO_LOG_LEVEL; the child must start without it. No targets: which
    # module classes pass the threshold depends on the profile's noise, and a ResBlock target under torch.compile
    # compiles once per shape, minutes on a loaded CPU (it ran past 300 s in a CI run).
    done = _cli(["-m", "kforge.cli", "optimize", "--demo", "unet", "--device", "cpu", "--provider-threshold", "100",
                 "--module-threshold", "100", "--no-generate"], {"KINETO_LOG_LEVEL": None})
    assert done.returncode == 0, done.stderr
    assert "demo unet" in done.stdout and "group_norm" in done.stdout
    assert not KINETO_LINE.findall(done.stdout + done.stderr), done.stderr


def test_a_kineto_level_set_by_the_user_is_kept() -> None:
    """The check above can fail: with the user's KINETO_LOG_LEVEL=0 Kineto prints its lines again."""
    script = ("import torch; from forge.profiler import ModuleFunctionKernelProfiler as P; "
              "P(warmup_iterations=0).profile(torch.nn.Linear(4, 4), [((torch.randn(2, 4),), {})])")
    done = _cli(["-c", script], {"KINETO_LOG_LEVEL": "0"})
    assert done.returncode == 0, done.stderr
    assert KINETO_LINE.findall(done.stdout + done.stderr)
