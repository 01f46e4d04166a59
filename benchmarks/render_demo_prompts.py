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

On the GPU host, before replaying, the requests `kforge prompts --demo` renders there are compared with the
shipped cassette (no rendering; exit status 1 when one differs or is missing):

    python benchmarks/render_demo_prompts.py --compare prompts.jsonl agent/cassettes/demo-unet-nvidia-h200.jsonl

The rendering itself is `agent.demo_prompts`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from agent.demo_prompts import cassette_lines, recorded_requests, render, render_instances


def _compare(rendered: dict[str, dict], reference: str, what: str) -> int:
    expected = recorded_requests(reference)
    different = 0
    for function, request in rendered.items():
        same = expected.get(function) == request
        different += not same
        print(f"{function}: {'identical' if same else 'DIFFERENT'} to {what}")
    return 1 if different else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--demo", default="llama")
    parser.add_argument("--functions", default="", help="comma-separated functions to render")
    parser.add_argument("--modules", default="", help="comma-separated qualified module classes whose module "
                        "conversations to render (agent.modules)")
    parser.add_argument("--on-device", action="store_true", help="render the module requests on this machine's GPU "
                        "(for models whose forward cannot run on meta tensors, such as Hugging Face Llama)")
    parser.add_argument("--device-name", default="NVIDIA H200")
    parser.add_argument("--capability", default="9,0")
    parser.add_argument("--model", default="frontier-standin")
    parser.add_argument("--language", default="triton", help="kernel language the requests ask for (triton, cuda)")
    parser.add_argument("--check-cpu", metavar="PROMPTS_JSONL",
                        help="render the CPU demo and compare with this `kforge prompts --demo` output")
    parser.add_argument("--compare", nargs=2, metavar=("PROMPTS_JSONL", "CASSETTE"),
                        help="only compare a `kforge prompts` output with a cassette's requests")
    parser.add_argument("--out", help="JSONL file of the rendered requests (required unless --compare)")
    parser.add_argument("--replies", metavar="DIR", help="folder of stand-in replies <prefix>_<function>.md")
    parser.add_argument("--prefix", default="", help="file-name prefix of the replies (e.g. unet_h200)")
    parser.add_argument("--cassette", metavar="FILE", help="write a replay cassette of requests + replies")
    args = parser.parse_args(argv)
    if args.compare:
        prompts, cassette = args.compare
        return _compare(recorded_requests(prompts), cassette, f"the cassette {cassette}")
    if not (args.functions or args.modules) or not args.out:
        parser.error("--functions or --modules, and --out, are required to render")
    if args.cassette and not args.replies:
        parser.error("--cassette needs --replies")
    functions = [f for f in args.functions.split(",") if f]
    classes = [c for c in args.modules.split(",") if c]
    requests = []
    if args.check_cpu:
        if functions:
            requests = render(args.demo, functions, "cpu", "CPU (Triton interpreter)", None, args.model)
        if classes:
            requests += render_instances(args.demo, classes, "cpu", "CPU (Triton interpreter)", None, args.model)
    else:
        capability = tuple(int(x) for x in args.capability.split(","))
        if functions:
            requests = render(args.demo, functions, "cuda", args.device_name, capability, args.model, args.language)
        if classes:
            requests += render_instances(args.demo, classes, "cuda", args.device_name, capability, args.model,
                                         args.language, on_device=args.on_device)
    with open(args.out, "w") as handle:
        for item in requests:
            handle.write(json.dumps(item) + "\n")
    print(f"wrote {len(requests)} request(s): {', '.join(r['function'] for r in requests)}")
    if args.cassette:
        lines, missing = cassette_lines(requests, args.replies, args.prefix)
        for function in dict.fromkeys(missing):
            print(f"{function}: {missing.count(function)} request(s) with no reply (a reply "
                  f"{Path(args.replies) / f'{args.prefix}_{function}.md'} answers the first only); left out")
        Path(args.cassette).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        print(f"wrote {len(lines)} cassette line(s) to {args.cassette}")
    if args.check_cpu:
        return _compare({r["function"]: r["request"] for r in requests}, args.check_cpu, "kforge prompts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
