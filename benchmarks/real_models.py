"""Plans on real models, in every way they run: the product's own path (`make_plan` with the static providers, its
end-to-end check in the plan's mode) and then the six-variant report with kernel profiles (where the time went).

Why a tool: "a plan never makes a real model slower" is a claim about Hugging Face, timm and diffusers models on a
GPU, and it has to be re-measured whenever the check, the runtime or a provider changes. Each run writes one JSON
file per model (the candidate report, the end-to-end check with its verdicts, the six-variant table, per-mode
kernel summaries and the by-function / by-kernel diffs) so that runs on a noisy host can be compared.

    python -m benchmarks.real_models --models timm-vit diffusers-unet hf-llama --out runs/real \\
        [--execution eager] [--force conv2d] [--blocks 6] [--e2e-blocks 8]

`--force NAME`: besides the checked plan, report a plan holding the selected candidate for NAME even if the
end-to-end check dropped it (to see in the profile diff where its time went). Models come from
`forge.demos.libraries` (full size on CUDA, tiny on the CPU); providers are `forge.providers.default_providers`.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from forge.checking import KernelUtils
from forge.demos import get_demo
from forge.end_to_end import compare_end_to_end
from forge.modules import class_aliases
from forge.optimizer import MODULE_MIN_SHARE_PERCENT, KernelOptimizer
from forge.plan import KernelOptimizationPlan
from forge.providers import CompiledModuleProvider, default_providers


def _records(frame: Any) -> list[dict[str, Any]]:
    if frame is None:
        return []
    return json.loads(frame.to_json(orient="records", default_handler=str))


def _report(name: str, plan: KernelOptimizationPlan, model: Any, data: Any, blocks: int,
            modes: list[str] | None = None) -> dict[str, Any]:
    started = time.monotonic()
    phase_start = time.time()
    report = compare_end_to_end(model, data, plan, blocks=blocks, profile=True, executions=modes)
    phase_end = time.time()
    modes = {}
    for execution in ("eager", "cuda_graphs", "compile"):
        diff = report.kernel_diff(execution)
        if diff is not None:
            modes[execution] = {"summary": diff.summary(), "by_function": _records(diff.by_function()),
                                "by_kernel": _records(diff.by_kernel(40))}
    blocks = {row.variant: list(row.block_medians_ms) for row in report.rows}
    return {"plan": name, "functions": plan.functions, "six_variants": _records(report.frame()), "blocks": blocks,
            "kernels": _records(report.kernel_summary()), "modes": modes, "seconds": time.monotonic() - started,
            "wall_clock": [phase_start, phase_end]}


class _FileSource:
    """A module source serving one `ModelNew(original)` file (e.g. a model's reply kept from a conversation), for
    the class it names (`CLASS=PATH`, bare or qualified class name) or for every class (`PATH`); the optimizer judges
    it like any generated module kernel (the sandbox, then here)."""

    def __init__(self, spec: str) -> None:
        target, _, path = spec.rpartition("=")
        self.target, self.path = target or None, Path(path)
        self.source = self.path.read_text()

    def serves_class(self, qualified: str) -> bool:
        return self.target is None or self.target in class_aliases(qualified)

    def __call__(self, target_class: str) -> Any:
        from agent.modules import GeneratedModuleProvider

        return GeneratedModuleProvider(target_class, self.source, language="triton",
                                       metadata={"file": str(self.path)})

    def __repr__(self) -> str:
        return f"file {self.path}"


def run_model(demo_name: str, device: torch.device, execution: str, force: list[str], blocks: int,
              e2e_blocks: int, modes: list[str] | None = None, modules: bool = True,
              module_files: list[str] | None = None, module_classes: list[str] | None = None,
              module_threshold: float = MODULE_MIN_SHARE_PERCENT, providers: bool = True,
              graphs: bool = True, checkpoint: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """make_plan on one demo model, then the six-variant report of its plan. `checkpoint` gets the result as soon as
    the plan is made (before the report, which a time limit may cut)."""
    demo = get_demo(demo_name)
    model, data = demo.model(device), demo.inputs(device)
    started = time.monotonic()
    sources = ([CompiledModuleProvider] if modules else []) + [_FileSource(spec) for spec in module_files or []]
    optimizer = KernelOptimizer(kernel_providers=default_providers(device) if providers else [],
                                kernel_utils=KernelUtils(), end_to_end_blocks=e2e_blocks, module_sources=sources,
                                module_classes=module_classes, module_min_time_share_percent=module_threshold,
                                graph_blocks=graphs)
    plan = optimizer.make_plan(model, data, execution=execution)
    result: dict[str, Any] = {
        "model": demo_name, "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "execution": execution, "plan_seconds": time.monotonic() - started,
        "profile": _records(optimizer.profile_summary), "candidates": _records(optimizer.report),
        "modules": _records(optimizer.module_profile.hot(15)) if optimizer.module_profile is not None else [],
        "module_targets": list(optimizer.module_targets), "graph_blocks": list(optimizer.last_result.graph_blocks),
        "reach": None if optimizer.last_result.reach is None else optimizer.last_result.reach.describe(8),
        "end_to_end_check": _records(optimizer.end_to_end), "plan_functions": plan.functions, "reports": [],
        "clock": None if optimizer.clock is None else {"timing": optimizer.clock.timing.value,
                                                       "device_ms": optimizer.clock.device_ms,
                                                       "wall_ms": optimizer.clock.wall_ms,
                                                       "reason": optimizer.clock.reason},
    }
    if checkpoint is not None:
        checkpoint(result)
    if len(plan):
        result["reports"].append(_report("checked plan", plan, model, data, blocks, modes))
    # Several module entries can serve one class (one per source that won): the report keeps the first of each.
    forced, seen = [], set()
    for entry in optimizer.selected_entries:
        if entry.function in force and entry.function not in seen:
            forced.append(entry)
            seen.add(entry.function)
    if forced and {e.function for e in forced} != set(plan.functions):
        result["reports"].append(_report(f"forced: {', '.join(e.function for e in forced)}",
                                         KernelOptimizationPlan(entries=tuple(forced), execution=execution),
                                         model, data, blocks, modes))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["timm-vit", "diffusers-unet", "hf-llama"])
    parser.add_argument("--execution", default="eager", choices=["eager", "cuda_graphs", "compile"])
    parser.add_argument("--force", nargs="*", default=[], help="functions to report even when the check drops them")
    parser.add_argument("--blocks", type=int, default=6, help="interleaved blocks of the six-variant report")
    parser.add_argument("--e2e-blocks", type=int, default=8, help="blocks of make_plan's end-to-end check")
    parser.add_argument("--out", type=Path, default=Path("runs/real_models"))
    parser.add_argument("--report-modes", nargs="+", default=None, choices=["eager", "cuda_graphs", "compile"],
                        help="modes of the six-variant report (default: all three)")
    parser.add_argument("--no-modules", action="store_true", help="no module kernels (torch.compile of forwards)")
    parser.add_argument("--module-file", nargs="*", default=[], metavar="[CLASS=]PATH",
                        help="ModelNew(original) files to judge as module kernels (a model's kept replies), each for "
                             "the class named before '=' (bare or qualified) or for every module target")
    parser.add_argument("--module-threshold", type=float, default=MODULE_MIN_SHARE_PERCENT, metavar="PCT",
                        help="share of the kernel time outside F calls that makes a class a module target")
    parser.add_argument("--modules", nargs="+", default=None, help="only these module classes (bare names)")
    parser.add_argument("--no-providers", action="store_true", help="no static F-call providers")
    parser.add_argument("--no-graphs", action="store_true",
                        help="no blocks replayed from CUDA graphs (tried in eager execution on CUDA)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("forge.progress").setLevel(logging.INFO)
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    clocks = _clock_log(args.out / "clocks.csv") if device.type == "cuda" else None
    for name in args.models:
        print(f"== {name} ({args.execution}) ==", flush=True)
        path = args.out / f"{name}-{args.execution}.json"
        made: dict[str, Any] = {}  # the plan's result once made: kept if the report fails

        def checkpoint(partial: dict[str, Any], path: Path = path, made: dict[str, Any] = made) -> None:
            made.update(partial)
            path.write_text(json.dumps(partial, indent=1, default=str))
            print(json.dumps({"plan_functions": partial["plan_functions"],
                              "end_to_end_check": partial["end_to_end_check"]}, default=str), flush=True)

        try:
            result = run_model(name, device, args.execution, args.force, args.blocks, args.e2e_blocks,
                               args.report_modes, not args.no_modules, args.module_file, args.modules,
                               args.module_threshold, not args.no_providers, not args.no_graphs, checkpoint)
        except Exception as exc:  # noqa: BLE001 - one model failing must not lose the others
            logging.exception("%s failed", name)
            result = {**made, "model": name, "error": f"{type(exc).__name__}: {exc}"}
        path.write_text(json.dumps(result, indent=1, default=str))
        print(json.dumps({k: result.get(k) for k in ("model", "plan_functions", "plan_seconds", "reach", "error")}),
              flush=True)
        for report in result.get("reports", []):
            print(report["plan"], json.dumps(report["kernels"]), flush=True)
            for row in report["six_variants"]:
                print(f"  {row['variant']:22} {row['median_ms']}  same-mode {row['speedup_vs_same_mode']} "
                      f"won {row['blocks_won']}  {row['note']}", flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if clocks is not None:
        clocks.terminate()
    return 0


def _clock_log(path: Path) -> Any:
    """`nvidia-smi` sampling SM clock and load every 200 ms into `path` (the GPU idles at 345 MHz on the H200
    host and ramps to 1980 under load: timings taken while it ramps are slower)."""
    import subprocess

    try:
        return subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,utilization.gpu,power.draw",
                                 "--format=csv,noheader", "-lms", "200"], stdout=path.open("w"),
                                stderr=subprocess.DEVNULL)
    except OSError:
        return None


if __name__ == "__main__":
    raise SystemExit(main())
