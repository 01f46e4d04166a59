"""The LLM generator's first request per hot function of a demo, rendered for a target GPU from a machine without
that GPU (meta tensors: no memory, no compute), and the cassettes built from such requests.

Why: the GPU host has no network and its time is scarce, while the demo cassettes (`agent.demo_cassettes`) key on
the exact request. The request depends only on shapes, dtypes, strides, arguments, call order, the device's name
and compute capability (the roofline table is looked up by name), so it can be rendered anywhere: `render` does,
and rendering the CPU demo this way gives byte for byte what `kforge prompts --demo` writes on the CPU, which
proves the method. A stand-in model answers each rendered request (a separate session given only the request, no
tools) and `cassette_lines` pairs requests and replies into a replay cassette (`agent/cassettes/`).

`benchmarks/render_demo_prompts.py` is the command line over this module.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any
from unittest import mock

import torch

from agent.cli_support import first_turn_requests
from agent.generator import GeneratorOptions, LLMKernelGenerator
from agent.languages import DEFAULT_LANGUAGE
from agent.llm import LLMConfig
from forge.demos import get_demo
from forge.samples import Sample, TensorSpec, map_values

__all__ = ["cassette_lines", "capture", "recorded_requests", "render", "render_instances"]


def capture(demo: str, device_kind: str, functions: list[str]):
    """The profile's unique samples per function, in first-call order, from a meta-device forward of `demo` built
    with its configuration for `device_kind` (`cpu` or `cuda`)."""
    from forge.functional import functional_names
    from forge.profiler.interception import CallRecorder, ModuleScopedInterception

    model, data = _meta_demo(demo, device_kind)
    recorder = CallRecorder(set(functions))
    interception = ModuleScopedInterception(model, recorder, functional_names())
    with torch.no_grad(), interception:
        for sample in data:
            model(*sample.args, **sample.kwargs)
    return recorder


def render(demo: str, functions: list[str], device_kind: str, device_name: str, capability, model: str,
           language: str = DEFAULT_LANGUAGE) -> list[dict[str, Any]]:
    """First-turn requests, as `kforge prompts --demo` renders them on a `device_kind` machine named `device_name`
    (compute capability `capability`, None on the CPU): `[{"function": name, "request": request}, ...]`."""
    from types import SimpleNamespace

    recorder = capture(demo, device_kind, functions)
    target = "cuda:0" if device_kind == "cuda" else "cpu"
    profile = SimpleNamespace(functions={
        name: SimpleNamespace(samples=[
            (count, _sample_on(s, target))
            for count, s in zip(recorder.counts(name), recorder.samples(name), strict=True)])
        for name in recorder.function_names() if recorder.samples(name)
    })
    config = LLMConfig.from_env(model=model)
    generator = LLMKernelGenerator(config, GeneratorOptions(functions=tuple(functions), languages=(language,),
                                                           use_cache=False))
    order = [n for n in recorder.function_names() if n in functions]
    # The device's name and capability are all the prompt reads from the device; this process has no such device.
    with mock.patch("agent.prompting.task.device_description", lambda device: (device_name, capability)):
        return first_turn_requests(generator, profile, order)


def _meta_demo(demo: str, device_kind: str) -> tuple[torch.nn.Module, list[Sample]]:
    """`demo` built on the meta device at its size for `device_kind`, and its inputs on meta. The library demos
    (`forge.demos.libraries`) size themselves from the device they are built for: they are told it is a GPU."""
    spec = get_demo(demo)
    if spec.model.__module__ == "forge.demos.libraries":
        with mock.patch("forge.demos.libraries._gpu", lambda device: device_kind == "cuda"), torch.device("meta"):
            return spec.model(torch.device("meta")), spec.inputs(torch.device("meta"))
    module = __import__(spec.model.__module__, fromlist=["x"])
    config_fn = next(getattr(module, n) for n in dir(module) if n.endswith("_config") and callable(getattr(module, n)))
    config = config_fn(device_kind)
    with torch.device("meta"):
        model = spec.model("meta", config=config)
    data = spec.inputs("cpu", config=config)
    meta = [Sample(tuple(a.to("meta") if isinstance(a, torch.Tensor) else a for a in s.args),
                   {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in s.kwargs.items()})
            for s in data]
    return model, meta


def render_instances(demo: str, classes: list[str], device_kind: str, device_name: str, capability, model: str,
                     language: str = DEFAULT_LANGUAGE, *, on_device: bool = False) -> list[dict[str, Any]]:
    """First-turn requests of the module conversations (`agent.modules`) for the hot classes `classes` (qualified
    names) of `demo`, one per behaviour group, as a `device_kind` machine named `device_name` renders them:
    `[{"function": "module:<class>", "request": request}, ...]`. The model runs on meta tensors and the prompt's
    device strings are the target's; a model whose forward reads tensor values (Hugging Face's causal mask) cannot
    run on meta: render it `on_device` (on the target itself: `device_name` and `capability` are then its own)."""
    from agent.llm.cassette import canonical_request
    from agent.modules import instance_task
    from agent.prompting import PromptRenderer
    from agent.roofline import device_description
    from forge.modules import MODULE_PREFIX, record_module_calls

    if on_device:
        spec = get_demo(demo)
        net, data = spec.model(torch.device(device_kind)), spec.inputs(torch.device(device_kind))
        device_name, capability = device_description(torch.device(device_kind))
    else:
        net, data = _meta_demo(demo, device_kind)
    target = "cuda:0" if device_kind == "cuda" else "cpu"
    names = {MODULE_PREFIX + c for c in classes}
    with torch.no_grad(), record_module_calls(net, names) as found:
        for sample in data:
            net(*sample.args, **sample.kwargs)
    config = LLMConfig.from_env(model=model)
    renderer = PromptRenderer()
    requests = []
    with mock.patch("agent.prompting.task.device_description", lambda device: (device_name, capability)):
        for name in sorted(found, key=lambda n: [MODULE_PREFIX + c for c in classes].index(n)):
            calls = found[name]
            for key, group in calls.instances.items():
                task = instance_task(group[0], calls.samples[key], calls.counts[key], language)
                if not on_device:
                    task = _on_target(task, target)
                messages = [{"role": "system", "content": renderer.system(task)},
                            {"role": "user", "content": renderer.generate_instance(task)}]
                requests.append({"function": name,
                                 "request": canonical_request(model, messages, config.generation_parameters())})
    return requests


def _sample_on(sample: Sample, target: str) -> Sample:
    """`sample` (meta tensors) with each tensor as a spec on `target`, as the prompt describes a call there."""

    def on_target(value):
        if isinstance(value, torch.Tensor):
            return dataclasses.replace(TensorSpec.of(value, with_stats=False), device=target)
        return value

    return Sample(map_values(tuple(sample.args), on_target), map_values(dict(sample.kwargs), on_target))


def _on_target(task, target: str):
    """`task` (built from meta tensors) as the target device would describe it: its parameters and its sampled
    calls' tensors on `target` (`cuda:0`)."""
    samples = tuple(dataclasses.replace(e, sample=_sample_on(e.sample, target)) for e in task.samples)
    tensors = tuple((n, line.replace("on meta", f"on {target}")) for n, line in task.tensors)
    return dataclasses.replace(task, tensors=tensors, samples=samples)


def recorded_requests(path: str | Path) -> dict[str, dict[str, Any]]:
    """The requests of a JSONL file by function: a `kforge prompts` output (`function` keys) or a cassette (`tag`)."""
    found = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.strip():
            entry = json.loads(line)
            found[entry.get("function") or entry.get("tag")] = entry["request"]
    return found


def cassette_lines(requests: list[dict[str, Any]], replies: str | Path,
                   prefix: str = "") -> tuple[list[str], list[str]]:
    """Replay-cassette lines pairing each request with the stand-in's reply `replies/<prefix>_<function>.md`, and the
    requests left out for want of a reply (their functions). A reply answers the first request of its function only:
    a module class's later behaviour groups (`render_instances`) were not shown to the stand-in. Token counts are
    estimated (4 characters per token), as the client does for replies without usage."""
    lines, missing, answered = [], [], set()
    for item in requests:
        reply = Path(replies) / f"{prefix}_{item['function']}.md"
        if item["function"] in answered or not reply.is_file():
            missing.append(item["function"])
            continue
        answered.add(item["function"])
        text = reply.read_text(encoding="utf-8").strip() + "\n"
        prompt_chars = sum(len(m["content"]) for m in item["request"]["messages"])
        usage = {"prompt_tokens": prompt_chars // 4, "completion_tokens": len(text) // 4}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        response = {"text": text, "finish_reason": "stop", "model": item["request"]["model"], "usage": usage}
        lines.append(json.dumps({"tag": item["function"], "request": item["request"], "response": response}))
    return lines, missing
