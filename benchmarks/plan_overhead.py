"""What a plan costs a model per forward, apart from its kernels: the runtime's host work, the timers' view of it.

Why: on the H200 the patch-conv plan cut the ViT's device time per forward by 0.28 ms (9%) in every mode, yet the
six-variant report measured eager + plan and compile + plan slower than without. This tool times, interleaved in
the same rounds, one forward of the model (host-inclusive, synchronised):

- `stock`: no plan;
- `applied`: `plan.apply(model)` once, then plain forwards (what a user does);
- `per-call`: `runtime.applied()` entered around every forward (what `ModelRunner` does in eager);

and then a CUDA-graph replay of the stock and planned forward, back to back (N replays between two events) and one
at a time behind an L2 flush (what `forge.checking.benchmark` does in device mode), with the SM clock read before
and after; and a cProfile of planned forwards (the top host functions).

    python -m benchmarks.plan_overhead --model timm-vit --function conv2d [--rounds 30] [--out runs/overhead.json]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import torch

from forge.checking import KernelUtils
from forge.demos import get_demo
from forge.optimizer import KernelOptimizer
from forge.plan import KernelOptimizationPlan
from forge.providers import default_providers


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _forward(model: Any, data: list, device: torch.device) -> float:
    _sync(device)
    start = time.perf_counter()
    with torch.no_grad():
        for sample in data:
            model(*sample.args, **sample.kwargs)
    _sync(device)
    return (time.perf_counter() - start) * 1e3


def _clock() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu",
                               "--format=csv,noheader"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "n/a"


def _graph_times(model: Any, data: list, device: torch.device, replays: int) -> dict[str, float]:
    """Back-to-back replays (device time per forward) and single replays behind a 256 MB flush."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.no_grad():
        with torch.cuda.stream(side):
            for sample in data:
                model(*sample.args, **sample.kwargs)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for sample in data:
                model(*sample.args, **sample.kwargs)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    torch.cuda.synchronize(device)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    back_to_back = start.elapsed_time(end) / replays
    flush = torch.empty(256 << 20 >> 2, dtype=torch.int32, device=device)
    singles = []
    for _ in range(replays):
        flush.zero_()
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        singles.append(start.elapsed_time(end))
    return {"back_to_back_ms": back_to_back, "single_median_ms": statistics.median(singles),
            "single_min_ms": min(singles)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="timm-vit")
    parser.add_argument("--function", default="conv2d", help="the planned function (its selected candidate)")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, default=Path("runs/plan_overhead.json"))
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    demo = get_demo(args.model)
    model, data = demo.model(device), demo.inputs(device)
    optimizer = KernelOptimizer(kernel_providers=[p for p in default_providers(device)
                                                  if p.supported_function == args.function],
                                kernel_utils=KernelUtils(), end_to_end_check=False)
    optimizer.make_plan(model, data)
    entries = [e for e in optimizer.selected_entries if e.function == args.function]
    if not entries:
        raise SystemExit(f"no candidate selected for {args.function}: {optimizer.report.to_string()}")
    plan = KernelOptimizationPlan(entries=tuple(entries))
    result: dict[str, Any] = {"model": args.model, "function": args.function, "clock_before": _clock()}

    runtime = plan.runtime(model)
    variants = {
        "stock": lambda: _forward(model, data, device),
        "per-call": lambda: _with(runtime, model, data, device),
    }
    times: dict[str, list[float]] = {name: [] for name in [*variants, "applied"]}
    for name in variants:  # warm-up
        variants[name]()
    for _ in range(args.rounds):
        for name, run in variants.items():
            times[name].append(run())
        runtime.activate()
        try:
            times["applied"].append(_forward(model, data, device))
        finally:
            runtime.deactivate()
    result["host_inclusive_ms"] = {name: {"median": statistics.median(v), "min": min(v)} for name, v in times.items()}
    runtime.activate()
    try:
        result["cprofile_planned"] = _host_profile(model, data, device)
        if device.type == "cuda":
            result["graph_planned"] = _graph_times(model, data, device, args.replays)
    finally:
        runtime.deactivate()
    result["cprofile_stock"] = _host_profile(model, data, device)
    if device.type == "cuda":
        result["graph_stock"] = _graph_times(model, data, device, args.replays)
    if device.type == "cuda":
        result["harness_graphs"] = _harness_graphs(model, data, plan, device, args.rounds)
    result["clock_after"] = _clock()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if not k.startswith("cprofile")}, indent=1))
    return 0


def _host_profile(model: Any, data: list, device: torch.device, forwards: int = 5) -> str:
    """The top 25 host functions (own time) of `forwards` forwards, from cProfile."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(forwards):
        _forward(model, data, device)
    profiler.disable()
    stream = io.StringIO()
    pstats.Stats(profiler, stream=stream).sort_stats("tottime").print_stats(25)
    return stream.getvalue()


def _harness_graphs(model: Any, data: list, plan: KernelOptimizationPlan, device: torch.device,
                    rounds: int) -> dict[str, Any]:
    """The end-to-end report's own CUDA-graph timing (`forge.end_to_end.time_model`) of the same two variants,
    interleaved, next to the direct replays above: a difference is the harness's."""
    from forge.end_to_end import ModelRunner, time_model

    runners = {"stock": ModelRunner(model, data, execution="cuda_graphs"),
               "planned": ModelRunner(model, data, execution="cuda_graphs", plan=plan)}
    found: dict[str, list[float]] = {name: [] for name in runners}
    found.update({f"{name} (no flush)": [] for name in runners})
    with torch.no_grad():
        for _ in range(max(3, rounds // 5)):
            for name, run in runners.items():
                found[name].append(time_model(run, execution="cuda_graphs", device=device).median_ms)
                found[f"{name} (no flush)"].append(_time_model_no_flush(run, device))
    for run in runners.values():
        run.close()
    return {name: [round(v, 4) for v in values] for name, values in found.items()}


def _time_model_no_flush(run: Any, device: torch.device) -> float:
    from forge.checking.benchmarking import benchmark
    from forge.samples import Sample

    return benchmark(lambda: run(), [Sample((), {})], rounds=10, min_run_time_s=0.05, warmup=2, mode="device",
                     flush_l2=False).median_ms


def _with(runtime: Any, model: Any, data: list, device: torch.device) -> float:
    _sync(device)
    start = time.perf_counter()
    with runtime.applied():
        for sample in data:
            model(*sample.args, **sample.kwargs)
    _sync(device)
    return (time.perf_counter() - start) * 1e3


if __name__ == "__main__":
    raise SystemExit(main())
