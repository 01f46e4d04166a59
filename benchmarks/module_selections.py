"""Time a demo model with module entries built straight from kept `ModelNew(original)` files and with blocks
replayed from CUDA graphs, one selection of them at a time, interleaved against the model without a plan: what each
entry, and each combination, is worth inside the model.

Why a tool: make_plan judges every candidate before its end-to-end check (minutes for Llama's 16 attention groups),
and when the check finds a plan slower, the question is which entry costs what in the model. On an H100 the check of
Llama's eager plan took 7-10 s a block and dropped entries; this tool found in 40 s that the attention entry alone
made a 14 ms pass 102 ms (a per-activation cost in the runtime, fixed; BENCHMARKS.md K11).

The files are loaded in this process and NOT judged: use files the judge has passed (`benchmarks.judge_module_file`,
or a make_plan run). Entries serve the calls recorded from the demo's inputs (inside a capture for
`--execution cuda_graphs`, as make_plan records them). Each block times the model without a plan, then every
selection (`forge.end_to_end.time_model`: host-inclusive passes in eager, a captured pass replayed under CUDA graphs);
a row reports the median of its block medians and of its per-block ratios against that block's baseline.

    python -m benchmarks.module_selections --demo hf-llama --execution eager \\
        --module-file LlamaRMSNorm=benchmarks/replies/llama_rmsnorm_h200.py \\
                      LlamaAttention=benchmarks/replies/llama_attention_h200.py \\
        --graph LlamaDecoderLayer [--select LlamaRMSNorm LlamaDecoderLayer+LlamaRMSNorm all] \\
        [--blocks 8] [--out DIR]

`--select`: selections as class names joined by '+', or `all`; default: each class alone, then all together.
`--out DIR` writes `selections.csv`. Exit status 0, or 2 for a usage error.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from agent.modules import GeneratedModuleProvider
from benchmarks.judge_module_file import module_source, target_name
from forge.demos import get_demo
from forge.end_to_end import ModelRunner, PairedComparison, time_model
from forge.execution import Execution, parse_execution
from forge.modules import MODULE_PREFIX, ModuleKernelProvider, recorded_calls
from forge.plan import KernelOptimizationPlan, PlanEntry
from forge.providers import GraphedModuleProvider

COLUMNS = ["selection", "median_ms", "speedup", "blocks_won", "p_value", "provider_calls", "fallback_calls"]


def build_entries(model: torch.nn.Module, data: list[Any], execution: Execution, files: dict[str, Path],
                  graphs: list[str], language: str = "triton") -> dict[str, list[PlanEntry]]:
    """Plan entries per class name given: one per behaviour group of the class's instances, on its recorded calls.
    A file or a graphed block that cannot be prepared for a group exits with the reason."""
    names = {target_name(model, name): name for name in [*files, *graphs]}

    def run() -> None:
        for sample in data:
            model(*sample.args, **sample.kwargs)

    found = recorded_calls(run, model, set(names), captured=execution is Execution.CUDA_GRAPHS)
    sources = {name: module_source(path) for name, path in files.items()}
    entries: dict[str, list[PlanEntry]] = {}
    for target, name in names.items():
        calls = found.get(target)
        if calls is None:
            raise SystemExit(f"module_selections: no call of {name} was recorded")
        qualified = target[len(MODULE_PREFIX):]
        for key, instances in calls.instances.items():
            samples = list(calls.samples[key])
            provider: ModuleKernelProvider = (
                GeneratedModuleProvider(qualified, sources[name], language=language) if name in sources
                else GraphedModuleProvider(qualified))
            if not provider.prepare_instances(instances, samples):
                raise SystemExit(f"module_selections: {name} cannot serve a group of {len(instances)} instance(s): "
                                 f"{getattr(provider, 'error', None) or 'prepare refused'}")
            entries.setdefault(name, []).append(PlanEntry(provider=provider, signatures=tuple(samples)))
    return entries


def compare_selections(model: torch.nn.Module, data: list[Any], execution: Execution,
                       entries: dict[str, list[PlanEntry]], selections: list[list[str]], blocks: int
                       ) -> pd.DataFrame:
    """Interleaved blocks: the model without a plan, then each selection; one row per selection."""
    device = next(model.parameters()).device
    baseline = ModelRunner(model, data, execution=execution)
    runners = {"+".join(selection): ModelRunner(model, data, execution=execution, plan=KernelOptimizationPlan(
        entries=tuple(e for name in selection for e in entries[name]), execution=execution))
        for selection in selections}
    base_ms: list[float] = []
    plan_ms: dict[str, list[float]] = {label: [] for label in runners}
    try:
        for block in range(blocks):
            print(f"· block {block + 1}/{blocks}", file=sys.stderr, flush=True)
            base_ms.append(time_model(baseline, execution=execution, device=device).median_ms)
            for label, runner in runners.items():
                plan_ms[label].append(time_model(runner, execution=execution, device=device).median_ms)
        rows = [{"selection": "(no plan)", "median_ms": statistics.median(base_ms)}]
        for label, runner in runners.items():
            paired = PairedComparison(tuple(base_ms), tuple(plan_ms[label]))
            stats = runner.runtime.stats.values() if runner.runtime is not None else []
            rows.append({"selection": label, "median_ms": statistics.median(plan_ms[label]),
                         "speedup": paired.speedup, "blocks_won": f"{paired.wins}/{paired.blocks}",
                         "p_value": paired.p_value, "provider_calls": sum(s.provider_calls for s in stats),
                         "fallback_calls": sum(s.fallback_calls for s in stats)})
    finally:
        for runner in (baseline, *runners.values()):
            runner.close()
    return pd.DataFrame(rows, columns=COLUMNS)


def _file_spec(spec: str) -> tuple[str, Path]:
    name, sep, path = spec.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"{spec!r}: expected CLASS=PATH")
    if not Path(path).is_file():
        raise argparse.ArgumentTypeError(f"{path}: no such file")
    return name, Path(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--demo", required=True, help="a demo of forge.demos (hf-llama, timm-vit, diffusers-unet...)")
    parser.add_argument("--execution", default="eager", choices=["eager", "cuda_graphs"])
    parser.add_argument("--module-file", nargs="*", default=[], type=_file_spec, metavar="CLASS=PATH",
                        help="a judged ModelNew(original) file (or a reply holding one) for a module class")
    parser.add_argument("--graph", nargs="*", default=[], metavar="CLASS",
                        help="module classes replayed from CUDA graphs (CUDA only)")
    parser.add_argument("--select", nargs="*", default=None, metavar="A+B",
                        help="selections: class names joined by '+', or 'all' (default: each alone, then all)")
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--language", default="triton")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    files = dict(args.module_file)
    classes = [*files, *args.graph]
    if not classes:
        parser.error("give at least one --module-file or --graph")
    if args.blocks < 1:
        parser.error("--blocks must be >= 1")
    selections = [[*classes] if s == "all" else s.split("+") for s in (args.select or [*classes, "all"])]
    for selection in selections:
        unknown = sorted(set(selection) - set(classes))
        if unknown:
            parser.error(f"--select names {', '.join(unknown)}, which no --module-file or --graph gives")
    execution, device = parse_execution(args.execution), torch.device(args.device)
    demo = get_demo(args.demo)
    model, data = demo.model(device), demo.inputs(device)
    entries = build_entries(model, data, execution, files, args.graph, args.language)
    frame = compare_selections(model, data, execution, entries, selections, args.blocks)
    print(frame.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        frame.to_csv(args.out / "selections.csv", index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
