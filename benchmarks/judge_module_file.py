"""Judge one `ModelNew(original)` file against the live instances of a demo's module class, group by group, and
print each verdict: the oracle's own words when it refuses, the sandbox's timing when it passes.

Why a tool: when a model's file for a real module fails (on the H200, the kept `LlamaAttention` first failed by a
handful of elements, then on the oracle's wide-input probe), the question is which check and by how much, without a
whole `make_plan` around it. This is the judge `make_plan` uses (`forge.judging.Judge.judge_source`: screened, run in
the sandbox, the verdict computed here), on the instances and call signatures the model really has.

    python -m benchmarks.judge_module_file --demo hf-llama --module LlamaAttention \\
        --file benchmarks/replies/llama_attention_h200.py [--groups 1] [--language triton]

`--module` is the class's qualified, bare or declared layer name; `--groups N` judges the first N behaviour groups
(default 1; 0: all).
Exit status 0 when every judged group is `ok`, 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from agent.languages import get_language
from agent.replies import extract_code
from forge.checking import KernelUtils
from forge.demos import get_demo
from forge.judging import InstanceTarget, Judge
from forge.modules import MODULE_PREFIX, class_aliases, module_target_name, record_module_calls


def module_source(path: Path) -> str:
    """The `ModelNew(original)` file at `path`, or the code block of a model's reply kept there."""
    text = path.read_text()
    extracted = extract_code(text)
    return extracted.code if extracted is not None else text


def target_name(model: torch.nn.Module, module: str) -> str:
    """The module target (`module:<qualified class>`) of the model's class named `module` (`class_aliases`)."""
    for child in model.modules():
        name = module_target_name(child)
        if module in class_aliases(name[len(MODULE_PREFIX):]):
            return name
    raise SystemExit(f"the demo's model has no module of class {module!r} (name it qualified, bare or by its "
                     "declared layer name)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--demo", required=True, help="a demo of forge.demos (hf-llama, diffusers-unet, timm-vit...)")
    parser.add_argument("--module", required=True, help="its module class (qualified, bare or declared layer name)")
    parser.add_argument("--file", required=True, type=Path,
                        help="the ModelNew(original) file, or a model's reply holding it in a fenced block")
    parser.add_argument("--groups", type=int, default=1, help="behaviour groups to judge (0: all; default 1)")
    parser.add_argument("--language", default="triton")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    if not args.file.is_file():
        parser.error(f"--file {args.file}: no such file")
    source, language, device = module_source(args.file), get_language(args.language), torch.device(args.device)
    demo = get_demo(args.demo)
    model, data = demo.model(device), demo.inputs(device)
    name = target_name(model, args.module)
    with torch.no_grad(), record_module_calls(model, {name}) as found:
        for sample in data:
            model(*sample.args, **sample.kwargs)
    calls = found[name]
    groups = list(calls.instances.items())
    judge = Judge(KernelUtils())
    failed = 0
    try:
        for index, (key, instances) in enumerate(groups[:args.groups or None], start=1):
            target = InstanceTarget.of(instances[0], calls.samples[key], calls.counts[key])
            verdict = judge.judge_source(source, target, language)
            failed += not verdict.ok
            print(f"group {index} of {len(groups)} ({len(instances)} instance(s)): {verdict.status.value}: "
                  f"{verdict.message} [{verdict.wall_s:.1f} s]", flush=True)
            phases = verdict.details.get("phase_s") or {}
            if phases:
                print("  seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in phases.items()), flush=True)
            for error in (verdict.details.get("errors") or [])[1:5]:
                print(f"  {error}", flush=True)
    finally:
        judge.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
