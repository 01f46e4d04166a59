"""Host cost per call of a generated Triton kernel against ATen, and why one silu timed 10 us and 76 us (issue 7).

Part A, host cost per call: N back-to-back calls, one device sync at the end, median over several batches (the
variants' batches interleaved, so drift of the shared host hits all alike), on a small tensor (the device finishes
each kernel before the host issues the next, so the figure is the host's) and at the demo's size (where the figure
is max(host, device)). Variants: `torch.empty_like`, `F.silu` (ATen), the generated silu's Triton kernel launched by
`kernel[grid]` through `JITFunction.run`, the same through `agent.languages.triton.launch`'s cached launcher, the
compiled kernel's launcher called directly (the floor), the generated `kernel_function` with and without the cache,
the `GeneratedKernelProvider`, and that provider through an applied plan on a one-layer module (vs the same module
in eager).

Part B, how the optimizer and the sandbox time the same call (`forge.checking.benchmark`, per pass, L2 flushed
before each pass): the demo's silu distribution as the optimizer builds it (profile -> `benchmark_distribution`),
per pass and per call, for the cassette's signature (bf16[4,512,2816], 8 calls per profiled pass on the H200 demo of
the time) and for today's demo profile; the sandbox's pass (the prompt's counts); the L2 flush's device time (the
window that hides a pass's host time); host-inclusive wall time per pass; and the same passes while every core runs
a busy process (as when sandbox children compile) and while another process runs 256 MB flushes on the same GPU (as
when sandbox children validate and time while the optimizer times).

Usage (the H200 host): `python3 benchmarks/launch_overhead.py [--quick]`; prints a table and writes it to
`$OUT/launch.txt` (or `--out`). Without CUDA it runs the CPU-meaningful rows at a small size, as a smoke test.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from agent.languages.triton.launch import cached_launchers, remove_cached_launchers  # noqa: E402
from agent.provider import GeneratedKernelProvider  # noqa: E402
from agent.replies import extract_code  # noqa: E402
from forge.checking import KernelUtils  # noqa: E402
from forge.plan import KernelOptimizationPlan, PlanEntry  # noqa: E402
from forge.samples import Sample  # noqa: E402

CASSETTE = ROOT / "evals" / "cassettes" / "demo_h200.jsonl"
DEMO_SHAPE = (4, 512, 2816)
SMALL_NUMEL = 8192  # two 4096-element blocks: the generated kernel's unmasked path, ~2 us on the device


@dataclass(frozen=True)
class Settings:
    calls: int
    batches: int
    device: torch.device


@dataclass(frozen=True)
class Row:
    section: str
    variant: str
    value: float | None
    unit: str
    note: str = ""


class SiluNet(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(x)


def cassette_silu_source() -> str:
    for line in CASSETTE.read_text().splitlines():
        record = json.loads(line)
        if record["tag"] == "silu":
            extracted = extract_code(record["response"]["text"])
            if extracted is None:
                raise SystemExit("the cassette's silu reply has no code block")
            return extracted.code
    raise SystemExit(f"no silu reply in {CASSETTE}")


def sync_for(device: torch.device) -> Callable[[], None]:
    return (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)


def per_call_us(fn: Callable[[], Any], settings: Settings) -> float:
    """Median over batches of (wall time of `calls` back-to-back calls + one sync) / calls, in microseconds."""
    return interleaved_per_call_us({"fn": Variant(fn)}, settings)["fn"]


@dataclass(frozen=True)
class Variant:
    fn: Callable[[], Any]
    context: Callable[[], Any] = contextlib.nullcontext
    note: str = ""


def interleaved_per_call_us(variants: dict[str, Variant], settings: Settings) -> dict[str, float]:
    """`per_call_us` for several variants, their batches interleaved (batch 1 of each, then batch 2...), so drift of
    a shared host (clock changes, other tenants) hits every variant alike."""
    sync = sync_for(settings.device)
    times: dict[str, list[float]] = {name: [] for name in variants}
    for variant in variants.values():
        with variant.context():
            for _ in range(min(50, settings.calls)):
                variant.fn()
    sync()
    for _ in range(settings.batches):
        for name, variant in variants.items():
            with variant.context():
                fn = variant.fn
                start = time.perf_counter()
                for _ in range(settings.calls):
                    fn()
                sync()
                times[name].append((time.perf_counter() - start) / settings.calls * 1e6)
    return {name: statistics.median(values) for name, values in times.items()}


def measured(section: str, variant: str, measure: Callable[[], float], unit: str, note: str = "") -> Row:
    """One row, printed at once (partial results survive a time-out); an exception becomes the row's note."""
    try:
        row = Row(section, variant, measure(), unit, note)
    except Exception as exc:  # noqa: BLE001 - a benchmark row, not a check: record and go on
        row = Row(section, variant, None, unit, f"error: {type(exc).__name__}: {str(exc)[:160]}")
    print(f"{section} | {variant} | {row.value if row.value is None else round(row.value, 2)} {unit} | {row.note}",
          flush=True)
    return row


# -- part A -----------------------------------------------------------------------------------------------------
def launch_rows(size: str, x: torch.Tensor, built: dict[str, Any], settings: Settings) -> list[Row]:
    plain, cached = built["plain_module"], built["cached_module"]
    net = SiluNet()
    variants: dict[str, Variant] = {
        "torch.empty_like": Variant(lambda: torch.empty_like(x)),
        "F.silu (ATen)": Variant(lambda: F.silu(x)),
        "module calling F.silu, eager": Variant(lambda: net(x), torch.no_grad),
    }
    if x.device.type == "cuda":
        out = torch.empty_like(x)
        n = x.numel()
        grid = (-(-n // 4096),)
        even = n % 4096 == 0
        launcher = cached_launchers(cached)["_silu_kernel"]
        entry = next(iter(launcher._entries.values()))  # noqa: SLF001 - the floor: the cached pieces themselves
        stream = torch.cuda.current_stream(x.device).cuda_stream
        runner = entry.kernel[(grid[0], 1, 1)]
        variants |= {
            "Triton kernel[grid], JITFunction.run": Variant(
                lambda: plain._silu_kernel[grid](x, out, n, BLOCK=4096, EVEN=even, num_warps=8)),
            "Triton kernel[grid], cached launcher": Variant(
                lambda: cached._silu_kernel[grid](x, out, n, BLOCK=4096, EVEN=even, num_warps=8)),
            "CompiledKernel.run direct (floor)": Variant(
                lambda: entry.launch(grid[0], 1, 1, stream, entry.function, entry.packed_metadata, None, None, None,
                                     x, out, n, 4096, even), note="the launcher alone"),
            "CompiledKernel[grid](...)": Variant(lambda: runner(x, out, n, 4096, even),
                                                 note="builds launch metadata each call"),
            "generated kernel_function, JIT path": Variant(lambda: plain.kernel_function(x)),
            "generated kernel_function, cached": Variant(lambda: cached.kernel_function(x)),
            "GeneratedKernelProvider, JIT path": Variant(lambda: built["plain"](x)),
        }
    variants |= {
        "GeneratedKernelProvider, cached": Variant(
            lambda: built["cached"](x), note="" if x.device.type == "cuda" else "interpreter"),
        "plan.apply(module): module(x)": Variant(lambda: net(x), lambda: built["plan"].apply(net),
                                                 "signature guard + cached provider"),
    }
    section = f"A host us/call, {size} (interleaved batches)"
    try:
        results = interleaved_per_call_us(variants, settings)
    except Exception as exc:  # noqa: BLE001 - one broken variant: measure them one by one
        print(f"interleaved timing failed ({type(exc).__name__}: {exc}); timing variants one by one", flush=True)
        return [measured(section, name, lambda v=v: per_call_us(v.fn, settings), "us", v.note)
                for name, v in variants.items()]
    rows = []
    for name, value in results.items():
        rows.append(measured(section, name, lambda value=value: value, "us", variants[name].note))
    return rows


# -- part B -----------------------------------------------------------------------------------------------------
def demo_silu_distribution(device: torch.device) -> tuple[list[tuple[int, Sample]], str]:
    """The silu samples and counts the optimizer profiles on the demo (on CUDA), else one synthetic sample."""
    if device.type != "cuda":
        return [(8, Sample((torch.randn(8, 256, dtype=torch.bfloat16),), {}))], "synthetic (no CUDA)"
    from forge.demo import demo_inputs, demo_model
    from forge.profiler import ModuleFunctionKernelProfiler

    model = demo_model(device)
    profile = ModuleFunctionKernelProfiler(function_names={"silu"}).profile(model, demo_inputs(device), module=model)
    counted = profile.functions["silu"].samples
    return counted, "profiled on the demo"


def flush_us(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    buffer = torch.empty((256 << 20) // 4, dtype=torch.int32, device=device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(11):
        start.record()
        buffer.zero_()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def wall_per_pass_us(fn: Callable[..., Any], samples: list[Sample], device: torch.device, passes: int = 200) -> float:
    """Host-inclusive: sync, start the clock, one pass, sync, stop (what an eager forward pays for the pass)."""
    sync = sync_for(device)
    inputs = [(tuple(s.args), dict(s.kwargs)) for s in samples]
    times = []
    for index in range(passes + 10):
        sync()
        start = time.perf_counter()
        for args, kwargs in inputs:
            fn(*args, **kwargs)
        sync()
        if index >= 10:
            times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times)


def _busy(stop: Any) -> None:
    while not stop.is_set():
        sum(i * i for i in range(20000))


def timing_rows(counted: list[tuple[int, Sample]], origin: str, providers: dict[str, Callable[..., Any]],
                sandbox_entries: dict[str, Callable[..., Any]], small: torch.Tensor, settings: Settings,
                quick: bool, contention: bool) -> list[Row]:
    rows: list[Row] = []
    device = settings.device
    utils = KernelUtils(min_run_time_s=0.1 if quick else 0.25)
    dist = utils.benchmark_distribution(counted)
    calls = len(dist)
    counts = [count for count, _ in counted]
    shapes = ", ".join(f"{tuple(s.args[0].shape)}" for _, s in counted)
    section = f"B forge.checking.benchmark, silu {shapes}"
    rows.append(Row(section, "optimizer's silu pass", calls, "calls/pass",
                    f"{origin}: calls per profiled pass {counts}, GCD-reduced"))
    sandbox_pass = [s for _, s in counted]  # the prompt lists each signature with its reduced count (1 here)
    rows.append(Row(section, "sandbox's silu pass", len(sandbox_pass), "calls/pass", "prompt's reduced counts"))
    flush = flush_us(device)
    if flush is not None:
        rows.append(Row(section, "L2 flush (256 MB zero_) device time", flush, "us",
                        "host time of a pass hides behind this"))
    modes = _benchmark_modes()

    def timed(label: str, fn: Callable[..., Any], samples: list[Sample]) -> None:
        for mode, flush_l2 in modes:
            kwargs: dict[str, Any] = {"flush_l2": flush_l2}
            if mode:
                kwargs["mode"] = mode
            suffix = f" [{mode or 'benchmark'}{'' if flush_l2 else ', no L2 flush'}]"
            spread: list[float] = []

            def measure(fn: Callable[..., Any] = fn, kwargs: dict[str, Any] = kwargs,
                        spread: list[float] = spread) -> float:
                result = _benchmark(utils, fn, samples, kwargs)
                spread.append(result.spread)
                return result.median_ms * 1e3

            row = measured(section, f"{label}{suffix}", measure, "us/pass")
            if row.value is not None:
                row = Row(row.section, row.variant, row.value, row.unit,
                          f"{row.value / len(samples):.2f} us/call; spread {spread[0]:.2f}")
            rows.append(row)

    timed("F.silu, optimizer pass", F.silu, dist)
    for name, fn in providers.items():
        timed(f"{name}, optimizer pass", fn, dist)
    for name, entry in sandbox_entries.items():
        timed(f"{name}, sandbox pass", entry, sandbox_pass)
    wall = f"C host-inclusive wall per pass (sync, pass, sync), silu {shapes}"
    for name, fn in {"F.silu": F.silu, **providers}.items():
        rows.append(measured(wall, name, lambda fn=fn: wall_per_pass_us(fn, dist, device), "us/pass"))
    if device.type == "cuda" and contention and not quick:
        rows.extend(contention_rows(providers, dist, small, utils, settings))
        rows.extend(gpu_contention_rows(providers, dist, utils))
    return rows


def _gpu_busy(stop: Any, ready: Any) -> None:
    """Another process on the same GPU doing what a sandbox child's benchmark does between passes: 256 MB flushes."""
    import torch

    buffer = torch.empty((256 << 20) // 4, dtype=torch.int32, device="cuda")
    ready.set()
    while not stop.is_set():
        for _ in range(20):
            buffer.zero_()
        torch.cuda.synchronize()


def gpu_contention_rows(providers: dict[str, Callable[..., Any]], dist: list[Sample], utils: KernelUtils) -> list[Row]:
    """The optimizer's passes while another process keeps the same GPU busy (the first demo_h200 replay timed its
    candidates while sandbox children were still validating and timing on the GPU)."""
    section = "D2 optimizer pass while another process runs 256 MB flushes on the GPU"
    context = multiprocessing.get_context("spawn")
    stop, ready = context.Event(), context.Event()
    worker = context.Process(target=_gpu_busy, args=(stop, ready), daemon=True)
    worker.start()
    rows = []
    try:
        if not ready.wait(timeout=60):
            return [Row(section, "GPU worker", None, "", "did not start within 60 s")]
        time.sleep(0.5)
        for name, fn in {"F.silu": F.silu, **providers}.items():
            rows.append(measured(section, f"{name}, optimizer pass [eager]",
                                 lambda fn=fn: _benchmark(utils, fn, dist, _EAGER).median_ms * 1e3, "us/pass"))
    finally:
        stop.set()
        worker.join(timeout=10)
        if worker.is_alive():
            worker.terminate()
    return rows


def contention_rows(providers: dict[str, Callable[..., Any]], dist: list[Sample], small: torch.Tensor,
                    utils: KernelUtils, settings: Settings) -> list[Row]:
    """The optimizer's passes and the small-size host cost while every core runs a busy Python process."""
    section = f"D under CPU contention: {os.cpu_count()} busy processes"
    context = multiprocessing.get_context("fork")  # the children never touch CUDA
    stop = context.Event()
    workers = [context.Process(target=_busy, args=(stop,), daemon=True) for _ in range(os.cpu_count() or 1)]
    for worker in workers:
        worker.start()
    rows = []
    try:
        time.sleep(1.0)
        for name, fn in {"F.silu": F.silu, **providers}.items():
            rows.append(measured(section, f"{name}, optimizer pass [eager]",
                                 lambda fn=fn: _benchmark(utils, fn, dist, _EAGER).median_ms * 1e3, "us/pass"))
            rows.append(measured(section, f"{name}, host us/call small",
                                 lambda fn=fn: per_call_us(lambda: fn(small), settings), "us"))
    finally:
        stop.set()
        for worker in workers:
            worker.join(timeout=5)
            if worker.is_alive():
                worker.terminate()
    return rows


def _benchmark_modes() -> list[tuple[str | None, bool]]:
    """`forge.checking.benchmark`'s timing modes when it has them (issue 7 adds `mode=`), else its one mode; and the
    host-inclusive one without the L2 flush (nothing then hides a pass's host time)."""
    from forge.checking import benchmark

    if "mode" in inspect.signature(benchmark).parameters:
        return [("device", True), ("eager", True), ("eager", False)]
    return [(None, True), (None, False)]


_EAGER: dict[str, Any] = {}


def _benchmark(utils: KernelUtils, fn: Callable[..., Any], samples: list[Sample], kwargs: dict[str, Any]) -> Any:
    from forge.checking import benchmark

    options = {"flush_l2": utils.flush_l2, **kwargs}
    if "mode" in inspect.signature(benchmark).parameters and kwargs is _EAGER:
        options["mode"] = "eager"
    return benchmark(fn, samples, warmup=utils.warmup, rounds=utils.rounds, min_run_time_s=utils.min_run_time_s,
                     **options)


# -- driver ---------------------------------------------------------------------------------------------------
def build(source: str, device: torch.device, samples: list[Sample], folder: Path) -> dict[str, Any]:
    cached_provider = GeneratedKernelProvider("silu", source, language="triton", cache_dir=folder)
    if not cached_provider.prepare(samples):
        raise SystemExit("the generated silu did not load")
    plain_provider = GeneratedKernelProvider("silu", source + "\n# JIT path\n", language="triton", cache_dir=folder)
    plain_provider.prepare(samples)
    plain_module = sys.modules[plain_provider._module_name]  # noqa: SLF001
    remove_cached_launchers(plain_module)
    cached_module = sys.modules[cached_provider._module_name]  # noqa: SLF001
    plan = KernelOptimizationPlan(entries=(PlanEntry(provider=cached_provider, signatures=tuple(samples)),))
    return {"cached": cached_provider, "plain": plain_provider, "cached_module": cached_module,
            "plain_module": plain_module, "plan": plan}


def render(rows: list[Row], header: str) -> str:
    lines = [header, ""]
    section = None
    for row in rows:
        if row.section != section:
            section = row.section
            lines += ["", f"## {section}", "", f"| {'variant':<48} | {'value':>10} | unit       | note",
                      f"|{'-' * 50}|{'-' * 12}|------------|------"]
        value = "-" if row.value is None else (f"{row.value:.2f}" if isinstance(row.value, float) else str(row.value))
        lines.append(f"| {row.variant:<48} | {value:>10} | {row.unit:<10} | {row.note}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls and batches (a smoke run)")
    parser.add_argument("--out", type=Path, default=None, help="also write the table here (default $OUT/launch.txt)")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    settings = Settings(calls=200 if args.quick or not cuda else 2000, batches=3 if args.quick else 5, device=device)
    if not cuda:
        settings = Settings(calls=5, batches=3, device=device)

    import triton

    header = (f"# launch overhead: torch {torch.__version__}, triton {triton.__version__}, "
              f"{torch.cuda.get_device_name(device) if cuda else 'CPU (Triton interpreter)'}, "
              f"{settings.calls} calls x {settings.batches} batches, median")
    source = cassette_silu_source()
    small = torch.randn(SMALL_NUMEL, device=device, dtype=torch.bfloat16)
    sizes = {"small bf16[8192]": small}
    if cuda:
        sizes["cassette bf16[4,512,2816]"] = torch.randn(DEMO_SHAPE, device=device, dtype=torch.bfloat16)
    samples = [Sample((x,), {}) for x in sizes.values()]
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as folder:
        built = build(source, device, samples, Path(folder))
        for x in sizes.values():  # first launches compile; keep them out of the timings
            built["cached"](x)
            built["plain"](x)
        for size, x in sizes.items():
            rows += launch_rows(size, x, built, settings)
        providers = {"GeneratedKernelProvider, cached": built["cached"],
                     "GeneratedKernelProvider, JIT path": built["plain"]}
        sandbox_entries = {"kernel_function, JIT path": built["plain_module"].kernel_function,
                           "kernel_function, cached": built["cached_module"].kernel_function}
        cassette_call = [(8, Sample((sizes["cassette bf16[4,512,2816]"] if cuda else small,), {}))]
        rows += timing_rows(cassette_call, "the cassette's signature (the H200 demo then: 4 layers x 2 batches)",
                            providers, sandbox_entries, small, settings, args.quick, contention=True)
        if cuda:
            counted, origin = demo_silu_distribution(device)
            rows += timing_rows(counted, origin, providers, sandbox_entries, small, settings, args.quick,
                                contention=False)
        rows.append(Row("E launch cache", "cached provider stats", None, "",
                        "; ".join(f"{k}: {v}" for k, v in built["cached"].launch_stats().items()) or "none"))
    text = render(rows, header)
    print(text)
    out = args.out or (Path(os.environ["OUT"]) / "launch.txt" if os.environ.get("OUT") else None)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
