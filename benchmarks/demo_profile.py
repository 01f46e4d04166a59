"""Profile the embedded demos (`forge.demos`): is each forward GPU-bound, and where does its device time go?

For each demo on the given device it prints the parameter count, the eager forward time (CUDA events around one
forward, median; host-inclusive) next to the host time to enqueue it, the CUDA-graph replay time (device time
without launch overhead), the kernel time per forward and the share per `torch.nn.functional` function from
`forge.profiler.ModuleFunctionKernelProfiler`, then `torch.compile(model)`: compile wall time, forward time and
the share of its kernels whose names carry group_norm / layer_norm. A forward is GPU-bound when the host time is
well below the eager time and the kernel time is close to it. Optionally (`--cli`) it runs
`kforge optimize --demo NAME --provider-threshold 100 --no-generate` in a subprocess and counts
Kineto console lines in it.

    python benchmarks/demo_profile.py --out $OUT/demos.txt [--demos llama,unet] [--unet-variants 2x64,2x128]
        [--cli unet] [--budget-s 200]

Each section is appended to the output file as soon as it is measured, so a run cut short keeps what it did.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from forge.demos import get_demo  # noqa: E402
from forge.demos.unet import UNetConfig, unet_config, unet_inputs, unet_model  # noqa: E402
from forge.profiler import ModuleFunctionKernelProfiler  # noqa: E402

KINETO_LINE = re.compile(r"^(USDT|STAGE|INFO|WARNING|ERROR):\d{4}-\d\d-\d\d ", re.MULTILINE)


class Report:
    """Lines printed and appended to the output file as they come."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")

    def __call__(self, text: str = "") -> None:
        print(text, flush=True)
        with self.path.open("a") as handle:
            handle.write(text + "\n")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_forward(fn: Callable[[], object], device: torch.device, iters: int, warmup: int = 3) -> tuple[float, float]:
    """(median ms of one synchronised call, median host ms to return from the call before syncing)."""
    for _ in range(warmup):
        fn()
    _sync(device)
    walls, hosts = [], []
    for _ in range(iters):
        if device.type == "cuda":
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            t0 = time.perf_counter()
            fn()
            hosts.append((time.perf_counter() - t0) * 1e3)
            stop.record()
            stop.synchronize()
            walls.append(start.elapsed_time(stop))
        else:
            t0 = time.perf_counter()
            fn()
            hosts.append((time.perf_counter() - t0) * 1e3)
            walls.append(hosts[-1])
    return statistics.median(walls), statistics.median(hosts)


def time_graph(model: torch.nn.Module, args: tuple, iters: int) -> float:
    """Median ms of one CUDA-graph replay of the forward (no host launch cost)."""
    static = tuple(a.clone() for a in args)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            model(*static)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        model(*static)
    wall, _ = time_forward(graph.replay, torch.device("cuda"), iters)
    return wall


def kernel_shares(fn: Callable[[], object], patterns: tuple[str, ...]) -> tuple[float, dict[str, float], list]:
    """Device time of one call under torch.profiler: total ms, ms per name pattern, top kernels [(name, ms)]."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    per_kernel: dict[str, float] = defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            per_kernel[event.name] += event.device_time / 1e3
    total = sum(per_kernel.values())
    by_pattern = {p: sum(ms for name, ms in per_kernel.items() if p in name) for p in patterns}
    top = sorted(per_kernel.items(), key=lambda item: -item[1])[:12]
    return total, by_pattern, top


def profile_demo(name: str, device: torch.device, report: Report, iters: int, unet: UNetConfig | None = None) -> tuple:
    """Eager, CUDA-graph and profiler numbers of one demo (`unet`: a UNet config other than the demo's)."""
    demo = get_demo(name)
    if unet is None:
        model, data = demo.model(device), demo.inputs(device)
    else:
        model, data = unet_model(device, unet), unet_inputs(device, unet)
    config = getattr(model, "config", None)
    params = sum(p.numel() for p in model.parameters())
    report(f"\n=== demo {name}{'' if unet is None else ' (variant)'}: {demo.description}")
    report(f"config: {config}")
    report(f"parameters: {params / 1e6:.1f}M; inputs: {len(data)} sample(s), "
           + ", ".join(f"{tuple(a.shape)} {a.dtype}" for a in data[0].args))
    args = data[0].args
    with torch.no_grad():
        out = model(*args)
        report(f"output {tuple(out.shape)} {out.dtype}, finite: {bool(torch.isfinite(out).all())}")
        eager_ms, host_ms = time_forward(lambda: model(*args), device, iters)
        report(f"eager forward: {eager_ms:.3f} ms (CUDA events, median of {iters}); host time to enqueue: "
               f"{host_ms:.3f} ms")
        if device.type == "cuda":
            graph_ms = time_graph(model, args, iters)
            report(f"CUDA graph replay: {graph_ms:.3f} ms (eager / graph = {eager_ms / graph_ms:.2f})")
    profiler = ModuleFunctionKernelProfiler(set(), warmup_iterations=2, profile_iterations=3)
    result = profiler.profile(model, data)
    per_forward = result.total_time_ms / len(data)
    named = sum(p.total_time_ms for p in result.functions.values()) / len(data)
    report(f"profiler ({result.device}): {per_forward:.3f} ms of {'kernel' if device.type == 'cuda' else 'CPU'} "
           f"time per forward = {100 * per_forward / eager_ms:.0f}% of the eager forward; "
           f"{100 * (per_forward - named) / per_forward:.1f}% outside any functional (adds, cat, copies)")
    report(result.summary().to_string(index=False))
    return model, args, eager_ms


def compile_demo(name: str, model: torch.nn.Module, args: tuple, eager_ms: float, device: torch.device,
                 report: Report, iters: int) -> None:
    compiled = torch.compile(model)
    with torch.no_grad():
        t0 = time.perf_counter()
        out = compiled(*args)
        _sync(device)
        compile_s = time.perf_counter() - t0
        error = (out.float() - model(*args).float()).abs().max().item()
        compiled_ms, host_ms = time_forward(lambda: compiled(*args), device, iters)
        report(f"\n--- {name}: torch.compile(model): first call {compile_s:.1f} s; forward {compiled_ms:.3f} ms "
               f"(host {host_ms:.3f} ms); eager / compile = {eager_ms / compiled_ms:.2f}; max |diff| {error:.3g}")
        if device.type == "cuda":
            total, shares, top = kernel_shares(lambda: compiled(*args), ("group_norm", "layer_norm", "silu"))
            report(f"compiled kernel time {total:.3f} ms; kernels named with: "
                   + ", ".join(f"{p} {ms:.3f} ms ({100 * ms / total:.1f}%)" for p, ms in shares.items()))
            for kernel, ms in top:
                report(f"  {ms:8.3f} ms  {kernel[:110]}")


def run_cli(name: str, report: Report, timeout_s: float) -> None:
    # Static providers over a threshold no function reaches: the profile runs, no candidate is tried.
    command = [sys.executable, "-m", "kforge.cli", "optimize", "--demo", name, "--provider-threshold", "100",
               "--no-generate"]
    t0 = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=timeout_s)
    output = done.stdout + done.stderr
    report(f"\n--- `{' '.join(command[2:])}`: rc {done.returncode}, {time.perf_counter() - t0:.1f} s, "
           f"Kineto console lines: {len(KINETO_LINE.findall(output))}")
    report(output[-6000:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="demo_profile.txt")
    parser.add_argument("--demos", default="llama,unet")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--unet-variants", default="", metavar="BxS,...",
                        help="also profile the UNet at these batch x latent sizes, e.g. 2x64,2x128 (no compile)")
    parser.add_argument("--cli", default="", help="comma-separated demos to run through `kforge optimize` at the end")
    parser.add_argument("--budget-s", type=float, default=200.0, help="skip later steps once this much time is used")
    args = parser.parse_args()
    start = time.perf_counter()
    device = torch.device(args.device)
    report = Report(Path(args.out))
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    report(f"torch {torch.__version__}, device {gpu}")
    measured = {name: profile_demo(name, device, report, args.iters) for name in args.demos.split(",")}
    for name in sorted(measured, key=lambda n: n != "unet"):  # the UNet's compiled numbers matter most
        if args.no_compile or time.perf_counter() - start > args.budget_s * 0.6:
            report(f"\n--- {name}: torch.compile skipped ({'--no-compile' if args.no_compile else 'time budget'})")
            continue
        compile_demo(name, *measured[name], device, report, args.iters)
    for variant in filter(None, args.unet_variants.split(",")):
        if time.perf_counter() - start > args.budget_s * 0.8:
            report(f"\n--- UNet variant {variant} skipped (time budget)")
            continue
        batch, size = (int(v) for v in variant.split("x"))
        config = dataclasses.replace(unet_config(device), batch=batch, size=size)
        profile_demo("unet", device, report, args.iters, unet=config)
    for name in filter(None, args.cli.split(",")):
        left = args.budget_s - (time.perf_counter() - start)
        if left < 30:
            report(f"\n--- CLI run of {name} skipped (time budget)")
            continue
        try:
            run_cli(name, report, left)
        except subprocess.TimeoutExpired:
            report(f"\n--- CLI run of {name} timed out")
    report(f"\ntotal {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
