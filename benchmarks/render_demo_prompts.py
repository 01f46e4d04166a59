"""Render the LLM generator's first request per hot function of a demo, as it would be rendered on a target GPU,
from a machine without that GPU (meta tensors: no memory, no compute).

Why: the GPU host has no network and its time is scarce; the demo cassettes key on the exact request, and the
request depends only on shapes, dtypes, strides, arguments, call order, the device's name and compute capability
(the roofline table is looked up by name). `--check-cpu` renders the CPU demo this way and compares it byte for byte
with `kforge prompts --demo` on the CPU, which proves the method; the GPU run re-renders with `kforge prompts` and
compares before replaying.

    python benchmarks/render_demo_prompts.py --demo unet --functions group_norm,silu,layer_norm \
        --device-name "NVIDIA H200" --capability 9,0 --model frontier-standin --out prompts.jsonl

`--replies DIR --cassette FILE` then pairs each request with the stand-in's reply `DIR/<prefix>_<function>.md`
(a separate session given only the request, no tools) and writes a replay cassette (`agent/cassettes/`). Token
counts in the cassette are estimated (4 characters per token), as the client does for replies without usage.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from unittest import mock

import torch

from agent.cli_support import first_turn_requests
from agent.generator import LLMKernelGenerator
from agent.llm import LLMConfig
from forge.demos import get_demo
from forge.samples import Sample, TensorSpec, map_values


def _capture(demo: str, device_kind: str, functions: list[str]):
    """The profile's unique samples per function, in first-call order, from a meta-device forward."""
    from forge.functional import functional_names
    from forge.profiler.interception import CallRecorder, ModuleScopedInterception

    spec = get_demo(demo)
    module = __import__(spec.model.__module__, fromlist=["x"])
    config_fn = next(getattr(module, n) for n in dir(module) if n.endswith("_config") and callable(getattr(module, n)))
    config = config_fn(device_kind)
    with torch.device("meta"):
        model = spec.model("meta", config=config)
    data = spec.inputs("cpu", config=config)
    data = [Sample(tuple(a.to("meta") if isinstance(a, torch.Tensor) else a for a in s.args), dict(s.kwargs))
            for s in data]
    recorder = CallRecorder(set(functions))
    interception = ModuleScopedInterception(model, recorder, functional_names())
    with torch.no_grad(), interception:
        for sample in data:
            model(*sample.args, **sample.kwargs)
    return recorder


def render(demo: str, functions: list[str], device_kind: str, device_name: str, capability, model: str,
           language: str = "triton"):
    """First-turn requests, as `kforge prompts --demo` renders them on a `device_kind` machine named `device_name`."""
    from types import SimpleNamespace

    recorder = _capture(demo, device_kind, functions)
    target = "cuda:0" if device_kind == "cuda" else "cpu"

    def on_target(value):
        if isinstance(value, torch.Tensor):
            return dataclasses.replace(TensorSpec.of(value, with_stats=False), device=target)
        return value

    profile = SimpleNamespace(functions={
        name: SimpleNamespace(samples=[
            (count, Sample(map_values(tuple(s.args), on_target), map_values(dict(s.kwargs), on_target)))
            for count, s in zip(recorder.counts(name), recorder.samples(name), strict=True)])
        for name in recorder.function_names() if recorder.samples(name)
    })
    config = LLMConfig.from_env(model=model)
    generator = LLMKernelGenerator(config, functions=functions, language=language, use_cache=False)
    order = [n for n in recorder.function_names() if n in functions]
    with mock.patch("agent.prompting.task.device_description", lambda device: (device_name, capability)):
        return first_turn_requests(generator, profile, order)


def _write_cassette(requests: list[dict], replies: str, prefix: str, out: str) -> None:
    from pathlib import Path

    lines = []
    for item in requests:
        reply = Path(replies) / f"{prefix}_{item['function']}.md"
        if not reply.is_file():
            print(f"{item['function']}: no reply at {reply}; left out of the cassette")
            continue
        text = reply.read_text(encoding="utf-8").strip() + "\n"
        prompt_chars = sum(len(m["content"]) for m in item["request"]["messages"])
        usage = {"prompt_tokens": prompt_chars // 4, "completion_tokens": len(text) // 4}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        response = {"text": text, "finish_reason": "stop", "model": item["request"]["model"], "usage": usage}
        lines.append(json.dumps({"tag": item["function"], "request": item["request"], "response": response}))
    Path(out).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    print(f"wrote {len(lines)} cassette line(s) to {out}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--demo", default="llama")
    parser.add_argument("--functions", required=True)
    parser.add_argument("--device-name", default="NVIDIA H200")
    parser.add_argument("--capability", default="9,0")
    parser.add_argument("--model", default="frontier-standin")
    parser.add_argument("--language", default="triton", help="kernel language the requests ask for (triton, cuda)")
    parser.add_argument("--check-cpu", metavar="PROMPTS_JSONL",
                        help="render the CPU demo and compare with this `kforge prompts --demo` output")
    parser.add_argument("--out", required=True)
    parser.add_argument("--replies", metavar="DIR", help="folder of stand-in replies <prefix>_<function>.md")
    parser.add_argument("--prefix", default="", help="file-name prefix of the replies (e.g. unet_h200)")
    parser.add_argument("--cassette", metavar="FILE", help="write a replay cassette of requests + replies")
    args = parser.parse_args(argv)
    functions = args.functions.split(",")
    if args.check_cpu:
        requests = render(args.demo, functions, "cpu", "CPU (Triton interpreter)", None, args.model)
    else:
        capability = tuple(int(x) for x in args.capability.split(","))
        requests = render(args.demo, functions, "cuda", args.device_name, capability, args.model, args.language)
    with open(args.out, "w") as handle:
        for item in requests:
            handle.write(json.dumps(item) + "\n")
    print(f"wrote {len(requests)} request(s): {', '.join(r['function'] for r in requests)}")
    if args.cassette:
        _write_cassette(requests, args.replies, args.prefix, args.cassette)
    if args.check_cpu:
        reference = {json.loads(line)["function"]: json.loads(line)["request"] for line in open(args.check_cpu)}
        for item in requests:
            same = reference.get(item["function"]) == item["request"]
            print(f"{item['function']}: {'identical' if same else 'DIFFERENT'} to kforge prompts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
