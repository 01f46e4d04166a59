"""The cassettes shipped with the demos: found by demo and device, still matching what the generator renders, and
used by `kforge optimize --demo` when no endpoint is configured."""

from __future__ import annotations

import argparse
import json

import pytest

from agent.cli_support import _demo_cassette_config, first_turn_requests
from agent.demo_cassettes import CASSETTE_DIR, demo_cassette, device_slug
from agent.generator import GeneratorOptions, LLMKernelGenerator
from agent.llm import LLMConfig
from forge.demos import get_demo
from forge.profiler import ModuleFunctionKernelProfiler


def test_every_demo_ships_a_cpu_cassette_and_the_h200_ones_exist() -> None:
    names = sorted(p.name for p in CASSETTE_DIR.glob("*.jsonl"))
    assert "demo-llama-cpu.jsonl" in names
    assert {"demo-llama-nvidia-h200.jsonl", "demo-unet-nvidia-h200.jsonl"} <= set(names)
    # The real-library demos: module conversations only, first requests rendered for the H200.
    for demo in ("hf-llama", "diffusers-unet", "timm-vit"):
        tags = {json.loads(line)["tag"] for line in (CASSETTE_DIR / f"demo-{demo}-nvidia-h200.jsonl").open()}
        assert tags and all(tag.startswith("module:") for tag in tags), (demo, tags)
    assert device_slug("cpu") == "cpu"
    shipped = demo_cassette("llama", "cpu", language="triton")
    assert shipped is not None and shipped.model == "frontier-standin"
    assert set(shipped.functions) == {"rms_norm", "silu", "softmax"}
    assert demo_cassette("no-such-demo", "cpu", language="triton") is None


def test_the_cpu_cassette_matches_what_the_generator_renders_today() -> None:
    """A prompt-template change would make every replay miss: re-record the cassettes when this fails
    (`agent.demo_prompts` renders them, a stand-in model answers)."""
    shipped = demo_cassette("llama", "cpu", language="triton")
    recorded = {}
    for line in shipped.path.read_text().splitlines():
        entry = json.loads(line)
        recorded[entry["tag"]] = entry["request"]
    demo = get_demo("llama")
    model, data = demo.model("cpu"), demo.inputs("cpu")
    generator = LLMKernelGenerator(LLMConfig(model=shipped.model),
                                   GeneratorOptions(functions=tuple(recorded), use_cache=False))
    profile = ModuleFunctionKernelProfiler(set(recorded)).profile(model, data)
    rendered = {r["function"]: r["request"] for r in first_turn_requests(generator, profile, list(recorded))}
    assert rendered.keys() == recorded.keys()
    for function, request in recorded.items():
        assert rendered[function] == request, f"the {function} prompt changed since the cassette was recorded"


def test_cuda_cassettes_are_found_by_language_and_match_what_the_generator_renders_today() -> None:
    """`demo-<name>-<device>-cuda.jsonl` holds CUDA conversations (issue 12: the H200 cassette run); rendered here
    for the H200 from meta tensors by `agent.demo_prompts.render`, they must still be byte-identical."""
    from agent.demo_prompts import recorded_requests, render

    for demo, function in (("llama", "rms_norm"), ("unet", "group_norm")):
        triton = CASSETTE_DIR / f"demo-{demo}-nvidia-h200.jsonl"
        cuda = CASSETTE_DIR / f"demo-{demo}-nvidia-h200-cuda.jsonl"
        assert cuda.is_file() and triton.is_file()
        assert demo_cassette(demo, "cpu", language="cuda") is None
        recorded = recorded_requests(cuda)
        assert list(recorded) == [function]
        rendered = render(demo, [function], "cuda", "NVIDIA H200", (9, 0), "frontier-standin", "cuda")
        assert rendered[0]["request"] == recorded[function], f"the CUDA {function} prompt changed since recording"
        assert "extern \"C\" __global__" in recorded[function]["messages"][0]["content"]


def test_the_demo_replays_the_cassette_of_its_first_language(monkeypatch) -> None:
    from agent import demo_cassettes

    seen = []

    def fake(demo, device, folder=CASSETTE_DIR, *, language):
        seen.append(language)
        return None

    monkeypatch.setattr(demo_cassettes, "demo_cassette", fake)
    _demo_cassette_config(_args(language=("cuda", "triton")), LLMConfig())
    _demo_cassette_config(_args(), LLMConfig())
    assert seen == ["cuda", "triton"]


def _args(**overrides) -> argparse.Namespace:
    values = {"demo": "llama", "device": "cpu", "candidates": 2, "attempts": 4, "optimize_rounds": 2,
              "generator_threshold": 10.0, "generate_functions": None}
    values.update(overrides)
    return argparse.Namespace(**values)


def test_demo_without_an_endpoint_replays_its_cassette_one_turn_per_function(capsys) -> None:
    args = _args()
    config = _demo_cassette_config(args, LLMConfig())
    assert config.is_configured and config.cassette_mode == "replay" and config.model == "frontier-standin"
    assert config.cassette == demo_cassette("llama", "cpu", language="triton").path
    assert (args.candidates, args.attempts, args.optimize_rounds, args.generator_threshold) == (1, 1, 0, 0.0)
    assert set(args.generate_functions.split(",")) == {"rms_norm", "silu", "softmax"}
    assert "replaying the demo's recorded generator conversations" in capsys.readouterr().out


@pytest.mark.parametrize("overrides", [{"demo": None}, {"demo": "unet"}])
def test_no_cassette_means_no_generation(overrides) -> None:
    """A target that is not a demo, or a demo with no cassette for this device, keeps generation off."""
    config = _demo_cassette_config(_args(**overrides), LLMConfig())
    assert not config.is_configured


def test_user_choices_win_over_the_demo_defaults() -> None:
    args = _args(candidates=3, generator_threshold=5.0, generate_functions="silu")
    _demo_cassette_config(args, LLMConfig())
    assert (args.candidates, args.generator_threshold, args.generate_functions) == (3, 5.0, "silu")


@pytest.mark.slow
def test_the_readme_demo_runs_the_agent_loop_from_its_cassette_on_cpu(tmp_path) -> None:
    """`kforge optimize --demo` with no endpoint: the shipped cassette's kernels are parsed, screened, run in the
    sandbox, validated and timed (interpreted Triton on the CPU is never faster, so the plan stays empty)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith(("KFORGE_", "OPENAI_"))}
    env.update(KFORGE_CACHE_DIR=str(tmp_path / "cache"), CUDA_VISIBLE_DEVICES="")
    done = subprocess.run([sys.executable, "-m", "kforge.cli", "optimize", "--demo", "--no-static", "--device", "cpu",
                           "--out", str(tmp_path / "demo.plan.json")], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "replaying the demo's recorded generator conversations" in done.stdout
    for function in ("rms_norm", "silu", "softmax"):
        rows = [line for line in done.stdout.splitlines() if f"generated triton {function}" in line]
        assert rows, f"no candidate row for the generated {function}"
        # timed against PyTorch: it passed screening, the sandbox and the oracle
        assert any(status in rows[0] for status in ("slower", "selected", "not significant")), rows[0]
    assert "Traceback" not in done.stderr
    assert (tmp_path / "demo.plan.json").is_file()


def test_cassette_lines_pair_each_request_with_its_reply_and_name_the_missing(tmp_path) -> None:
    from agent.demo_prompts import cassette_lines, recorded_requests

    request = {"model": "frontier-standin", "messages": [{"role": "user", "content": "x" * 400}]}
    (tmp_path / "h200_silu.md").write_text("```python\npass\n```\n")
    later = {"model": "frontier-standin", "messages": [{"role": "user", "content": "y" * 400}]}
    lines, missing = cassette_lines([{"function": "silu", "request": request},
                                     {"function": "softmax", "request": request},
                                     {"function": "silu", "request": later}], tmp_path, "h200")
    assert missing == ["softmax", "silu"]  # the reply answers silu's first request, not a later group's
    (entry,) = [json.loads(line) for line in lines]
    assert entry["tag"] == "silu" and entry["request"] == request
    assert entry["response"]["usage"]["prompt_tokens"] == 100 and entry["response"]["text"].endswith("```\n")
    cassette = tmp_path / "cassette.jsonl"
    cassette.write_text("\n".join(lines) + "\n")
    assert recorded_requests(cassette) == {"silu": request}


def test_a_cassette_of_module_conversations_targets_those_classes_and_no_function(monkeypatch) -> None:
    """The hf-llama H200 cassette holds module conversations only (`LlamaRMSNorm`, `LlamaAttention`, `LlamaMLP`):
    replaying it limits module kernels to those classes and writes no function kernel (an empty function list, not
    every function)."""
    from agent import cli_support, demo_cassettes

    shipped = demo_cassettes.demo_cassette("hf-llama", "cpu", folder=CASSETTE_DIR, language="triton")
    assert shipped is None  # rendered on the H200 only
    path = CASSETTE_DIR / "demo-hf-llama-nvidia-h200.jsonl"
    monkeypatch.setattr(demo_cassettes, "device_slug", lambda device: "nvidia-h200")
    args = _args(demo="hf-llama", modules=None)
    config = _demo_cassette_config(args, LLMConfig())
    assert config.cassette == path and config.cassette_mode == "replay"
    assert args.modules == [f"transformers.models.llama.modeling_llama.{name}"
                            for name in ("LlamaRMSNorm", "LlamaAttention", "LlamaMLP")]
    assert args.replay_functions == () and cli_support._generated_functions(args) == ()
    request = json.loads(path.read_text().splitlines()[0])["request"]
    prompt = request["messages"][1]["content"]
    assert "NVIDIA H200" in prompt and "ModelNew(original)" in prompt


def test_module_requests_rendered_from_meta_tensors_equal_those_rendered_on_the_device() -> None:
    """A UNet cassette is rendered for the H200 from meta tensors (`render_demo_prompts --modules`): every tensor the
    request names, the sampled calls' as well as the parameters', must read as the device would write it. Here the
    device is the CPU (the tiny config), so both renderings run."""
    pytest.importorskip("diffusers")
    from agent.demo_prompts import render_instances

    classes = ["diffusers.models.resnet.ResnetBlock2D"]
    on_meta = render_instances("diffusers-unet", classes, "cpu", "CPU (Triton interpreter)", None, "standin")
    on_device = render_instances("diffusers-unet", classes, "cpu", "", None, "standin", on_device=True)
    assert len(on_meta) == len(on_device) > 1
    assert [r["request"] for r in on_meta] == [r["request"] for r in on_device]
    assert "meta" not in json.dumps([r["request"]["messages"][1]["content"] for r in on_meta]).replace("metadata", "")


def test_the_unet_h200_cassette_matches_what_the_generator_renders_today() -> None:
    """`demo-diffusers-unet-nvidia-h200.jsonl` holds the first requests of the `ResnetBlock2D` and
    `BasicTransformerBlock` conversations as rendered for the H200 from meta tensors: still byte-identical."""
    pytest.importorskip("diffusers")
    from agent.demo_prompts import recorded_requests, render_instances

    path = CASSETTE_DIR / "demo-diffusers-unet-nvidia-h200.jsonl"
    recorded = recorded_requests(path)
    classes = [tag.removeprefix("module:") for tag in recorded]
    rendered = render_instances("diffusers-unet", classes, "cuda", "NVIDIA H200", (9, 0), "frontier-standin")
    first = {}
    for item in rendered:
        first.setdefault(item["function"], item["request"])
    assert first == recorded, (
        "a UNet module prompt changed since the cassette was recorded (the prompt, or diffusers' source of the class): "
        "render it again (the render_demo_prompts tool: --demo diffusers-unet --modules ... --replies DIR --cassette "
        "FILE), and have a stand-in answer any request that changed")
