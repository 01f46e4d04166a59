"""Plans that stack (issue 7 item 3): one plan applied under eager, CUDA graphs and `torch.compile`, on the H200.

A small residual softmax model (`Block`: linear -> x0.5 -> softmax -> linear -> +x, `--blocks` of them, bf16) gets a
plan whose softmax is a Triton row-softmax written here (`TritonSoftmax`, a `KernelProvider`). The script applies
the plan under

  (a) eager forwards;
  (b) `torch.cuda.graph` capture + replay;
  (c) `torch.cuda.make_graphed_callables`;
  (d) `torch.compile(model)` (default mode) and `mode="reduce-overhead"`;

and for each checks the output against stock eager, counts graph breaks and compiled frames (Dynamo's counters),
proves that the provider's kernel ran (its call counter in eager, the profiler's kernel names under graphs and
compile: `_kforge_softmax_kernel`), counts device kernels per forward (Inductor fuses the x0.5 and the +x around
the custom op), and times a forward (CUDA events, median of rounds; device time for graph replays). Then the
dispatch overhead per call, host side: `F.softmax` inside a planned forward (router + signature guard + provider)
vs the provider called directly vs ATen, on a tiny tensor so the host is the bottleneck.

    python3 benchmarks/stacking_gpu.py [--out $OUT/stacking.txt] [--blocks 4] [--tokens 256] [--dim 1024]
    python3 -m pytest -q -m cuda tests/forge/test_runtime_cuda.py     # the same paths as assertions

Without CUDA it runs eager and `torch.compile(backend="aot_eager")` on the CPU with `TRITON_INTERPRET=1` (a smoke
test; no timings worth reading).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import timeit
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch._dynamo  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from torch import nn  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from forge.plan import KernelOptimizationPlan, PlanEntry  # noqa: E402
from forge.provider import KernelProvider  # noqa: E402
from forge.runtime import patched_functions  # noqa: E402
from forge.samples import Sample  # noqa: E402

KERNEL_NAME = "_kforge_softmax_kernel"


@triton.jit
def _kforge_softmax_kernel(out_ptr, in_ptr, in_row_stride, out_row_stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offsets = tl.arange(0, BLOCK)
    mask = offsets < n_cols
    x = tl.load(in_ptr + row * in_row_stride + offsets, mask=mask, other=-float("inf")).to(tl.float32)
    x = x - tl.max(x, axis=0)
    num = tl.exp(x)
    out = num / tl.sum(num, axis=0)
    tl.store(out_ptr + row * out_row_stride + offsets, out.to(out_ptr.dtype.element_ty), mask=mask)


class TritonSoftmax(KernelProvider, type_name="bench_triton_softmax"):
    """Row softmax over the last dimension of a contiguous tensor, one program per row."""

    supported_function = "softmax"

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def _prepare(self, samples: list[Sample]) -> bool:
        return True

    def _call(self, input: torch.Tensor, dim: int | None = None, _stacklevel: int = 3,
              dtype: torch.dtype | None = None) -> torch.Tensor:
        self.calls += 1
        n = input.shape[-1]
        rows = input.numel() // n
        x = input.view(rows, n)
        out = torch.empty_like(x)
        _kforge_softmax_kernel[(rows,)](out, x, x.stride(0), out.stride(0), n, BLOCK=triton.next_power_of_2(n))
        return out.view(input.shape)

    def _to_dict(self) -> dict[str, Any]:
        return {}

    @classmethod
    def _from_dict(cls, state: dict[str, Any]) -> KernelProvider:
        return cls()


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, dim)
        self.fc2 = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.softmax(self.fc1(x) * 0.5, dim=-1)) + x


class Model(nn.Module):
    def __init__(self, blocks: int, dim: int) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*[Block(dim) for _ in range(blocks)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


class Report:
    """Lines printed and appended to the output file as they come (a run cut short keeps what it did)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("")

    def __call__(self, line: str = "") -> None:
        print(line, flush=True)
        if self.path is not None:
            with self.path.open("a") as f:
                f.write(line + "\n")


# ---------------------------------------------------------------------------------------------------------
# Measurements
# ---------------------------------------------------------------------------------------------------------
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_ms(fn: Callable[[], Any], device: torch.device, rounds: int = 15, per_round: int = 10) -> float:
    """Median over rounds of the mean time of one call (CUDA events on GPU, perf_counter on CPU)."""
    for _ in range(3):
        fn()
    sync(device)
    times = []
    for _ in range(rounds):
        if device.type == "cuda":
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(per_round):
                fn()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop) / per_round)
        else:
            t0 = time.perf_counter()
            for _ in range(per_round):
                fn()
            times.append((time.perf_counter() - t0) * 1e3 / per_round)
    return statistics.median(times)


def kernel_names(fn: Callable[[], Any], device: torch.device, calls: int = 2) -> dict[str, float] | None:
    """Device kernels launched per call of `fn` (name -> count per call), from the profiler; None on CPU."""
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    fn()
    sync(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        sync(device)
    names: dict[str, float] = {}
    for event in prof.events():
        if getattr(event, "device_type", None) == torch.autograd.DeviceType.CUDA:
            names[event.name] = names.get(event.name, 0) + 1 / calls
    return names


def dynamo_counts() -> tuple[int, int]:
    """(graph breaks, compiled frames with a graph) since the last `counters.clear()`."""
    breaks = sum(counters["graph_break"].values())
    graphs = counters["stats"].get("unique_graphs", 0)
    return breaks, graphs


# ---------------------------------------------------------------------------------------------------------
# Variants
# ---------------------------------------------------------------------------------------------------------
class Bench:
    def __init__(self, args: argparse.Namespace, report: Report) -> None:
        self.args = args
        self.report = report
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        torch.manual_seed(0)
        self.model = Model(args.blocks, args.dim).to(self.device, self.dtype).eval().requires_grad_(False)
        self.x = torch.randn(args.tokens, args.dim, device=self.device, dtype=self.dtype)
        self.provider = TritonSoftmax()
        sample = Sample((torch.empty(args.tokens, args.dim, device=self.device, dtype=self.dtype),), {"dim": -1})
        self.provider.prepare([sample])
        self.plan = KernelOptimizationPlan(entries=(PlanEntry(provider=self.provider, signatures=(sample,)),))
        with torch.no_grad():
            self.reference = self.model(self.x).float()
        self.rows: list[dict[str, Any]] = []

    def error(self, out: torch.Tensor) -> float:
        return float((out.float() - self.reference).abs().max())

    def row(self, variant: str, out: torch.Tensor | None, ms: float | None, *, provider: str, kernels: Any = None,
            breaks: int | str = "-", frames: int | str = "-", note: str = "") -> None:
        kern = "-"
        if isinstance(kernels, dict):
            total = sum(kernels.values())
            ours = sum(c for n, c in kernels.items() if KERNEL_NAME in n)
            kern = f"{total:.0f} ({ours:.0f} ours)"
        record = {
            "variant": variant,
            "max_abs_err": "-" if out is None else f"{self.error(out):.3g}",
            "provider_ran": provider,
            "kernels/fwd": kern,
            "graph_breaks": breaks,
            "frames": frames,
            "fwd_ms": "-" if ms is None else f"{ms:.4f}",
            "note": note,
        }
        self.rows.append(record)
        self.report("  " + " | ".join(f"{k}={v}" for k, v in record.items()))

    def run(self, name: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception as exc:  # keep going: one broken path must not hide the others
            self.report(f"  {name} FAILED: {type(exc).__name__}: {exc}")
            self.report("".join(traceback.format_exc(limit=6)))
            self.rows.append({"variant": name, "max_abs_err": "-", "provider_ran": "FAILED", "kernels/fwd": "-",
                              "graph_breaks": "-", "frames": "-", "fwd_ms": "-", "note": type(exc).__name__})

    # (a) eager ------------------------------------------------------------------------------------------
    def eager(self) -> None:
        model, x = self.model, self.x
        with torch.no_grad():
            ms = time_ms(lambda: model(x), self.device)
            self.row("eager (stock)", model(x), ms, provider="no", kernels=kernel_names(lambda: model(x), self.device))
        before = self.provider.calls
        with self.plan.apply(model) as runtime:
            out = model(x)
            ran = self.provider.calls - before
            ms = time_ms(lambda: model(x), self.device)
            kernels = kernel_names(lambda: model(x), self.device)
        self.row("eager + plan", out, ms, provider=f"yes ({ran} calls/fwd, counter)", kernels=kernels,
                 note=str(runtime.stats["softmax"].as_dict()))

    # (b) torch.cuda.graph -------------------------------------------------------------------------------
    def cuda_graph(self) -> None:
        model = self.model
        static_x = self.x.clone()
        graph = torch.cuda.CUDAGraph()
        with self.plan.apply(model):
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    model(static_x)
            torch.cuda.current_stream().wait_stream(stream)
            with torch.cuda.graph(graph):
                static_out = model(static_x)
        assert patched_functions() == {}
        calls = self.provider.calls
        graph.replay()
        out = static_out.clone()
        kernels = kernel_names(graph.replay, self.device)
        ms = time_ms(graph.replay, self.device)
        assert self.provider.calls == calls, "a replay ran Python"
        self.row("torch.cuda.graph + plan", out, ms, provider=_ran(kernels), kernels=kernels,
                 note="replayed after the plan was deactivated")
        with torch.no_grad():
            stock = torch.cuda.CUDAGraph()
            with torch.cuda.graph(stock):
                stock_out = model(static_x)
            stock.replay()
            ms = time_ms(stock.replay, self.device)
            self.row("torch.cuda.graph (stock)", stock_out.clone(), ms, provider="no",
                     kernels=kernel_names(stock.replay, self.device))

    # (c) make_graphed_callables -------------------------------------------------------------------------
    def graphed_callables(self) -> None:
        import copy

        model = copy.deepcopy(self.model)
        with self.plan.apply(model):
            graphed = torch.cuda.make_graphed_callables(model, (self.x.clone(),))
            out = graphed(self.x)
            kernels = kernel_names(lambda: graphed(self.x), self.device)
            ms = time_ms(lambda: graphed(self.x), self.device)
        self.row("make_graphed_callables + plan", out, ms, provider=_ran(kernels), kernels=kernels)

    # (d) torch.compile ----------------------------------------------------------------------------------
    def compiled(self, mode: str | None) -> None:
        label = f"torch.compile({'' if mode is None else 'mode=' + repr(mode)})"
        options: dict[str, Any] = {} if mode is None else {"mode": mode}
        if self.device.type != "cuda":
            options = {"backend": "aot_eager"}
        for planned in (False, True):
            torch._dynamo.reset()
            counters.clear()
            model = Model(self.args.blocks, self.args.dim).to(self.device, self.dtype).eval().requires_grad_(False)
            model.load_state_dict(self.model.state_dict())
            compiled = torch.compile(model, **options)
            t0 = time.perf_counter()
            context = self.plan.apply(model) if planned else torch.no_grad()
            before = self.provider.calls
            with context:
                for _ in range(3):  # reduce-overhead: warm-up, record, replay
                    out = compiled(self.x)
                compile_s = time.perf_counter() - t0
                out = out.clone()
                call = lambda fn=compiled: fn(self.x)  # noqa: E731
                kernels = kernel_names(call, self.device)
                ms = time_ms(call, self.device)
            breaks, frames = dynamo_counts()
            for reason, count in counters["graph_break"].items():
                self.report(f"    graph break x{count}: {' '.join(str(reason).split())[:300]}")
            ran = _ran(kernels) if kernels is not None else f"yes ({self.provider.calls - before} calls, counter)"
            self.row(f"{label}{' + plan' if planned else ' (stock)'}", out, ms, provider=ran if planned else "no",
                     kernels=kernels, breaks=breaks, frames=frames, note=f"first 3 calls {compile_s:.1f} s")
        torch._dynamo.reset()

    # dispatch overhead ----------------------------------------------------------------------------------
    def dispatch_overhead(self) -> None:
        x = torch.randn(4, 128, device=self.device, dtype=self.dtype)
        provider = TritonSoftmax()
        sample = Sample((x,), {"dim": -1})
        provider.prepare([sample])
        plan = KernelOptimizationPlan(entries=(PlanEntry(provider=provider, signatures=(sample,)),))
        n = 2000 if self.device.type == "cuda" else 50
        result: dict[str, float] = {}

        def per_call(fn: Callable[[], Any]) -> float:
            fn()
            sync(self.device)
            best = min(timeit.repeat(fn, number=n, repeat=7)) / n
            sync(self.device)
            return best * 1e6

        class Timed(nn.Module):
            def forward(self, t: torch.Tensor) -> torch.Tensor:
                softmax = F.softmax  # the router, as model code sees it inside a planned forward
                result["planned F.softmax (router+guard+provider)"] = per_call(lambda: softmax(t, dim=-1))
                result["provider called directly"] = per_call(lambda: provider(t, dim=-1))
                result["guard miss -> ATen (other shape)"] = per_call(lambda: softmax(t[:2], dim=-1))
                return t

        with plan.apply(Timed()) as runtime:
            runtime.module(x)
        result["ATen F.softmax (no plan)"] = per_call(lambda: F.softmax(x, dim=-1))
        result["ATen on t[:2] (no plan)"] = per_call(lambda: F.softmax(x[:2], dim=-1))
        for name, us in result.items():
            self.report(f"  {name:45s} {us:8.2f} us/call (host)")
        overhead = result["planned F.softmax (router+guard+provider)"] - result["provider called directly"]
        miss = result["guard miss -> ATen (other shape)"] - result["ATen on t[:2] (no plan)"]
        self.report(f"  dispatch overhead (guard + routing) on a hit: {overhead:.2f} us/call; on a miss: {miss:.2f}")


def _ran(kernels: dict[str, float] | None) -> str:
    if kernels is None:
        return "?"
    count = sum(c for n, c in kernels.items() if KERNEL_NAME in n)
    return f"yes ({count:.0f}/fwd, profiler)" if count else "NO"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--skip-compile", action="store_true")
    args = parser.parse_args()
    out = args.out or (Path(os.environ["OUT"]) / "stacking.txt" if os.environ.get("OUT") else None)
    report = Report(out)
    bench = Bench(args, report)
    device = bench.device
    report(f"# stacking_gpu: torch {torch.__version__}, triton {triton.__version__}, device "
           f"{torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}; model {args.blocks} blocks, "
           f"x {args.tokens}x{args.dim} {bench.dtype}")
    report("## variants")
    bench.run("eager", bench.eager)
    if device.type == "cuda":
        bench.run("torch.cuda.graph", bench.cuda_graph)
        bench.run("make_graphed_callables", bench.graphed_callables)
    if not args.skip_compile:
        bench.run("torch.compile", lambda: bench.compiled(None))
        if device.type == "cuda":
            bench.run("torch.compile reduce-overhead", lambda: bench.compiled("reduce-overhead"))
    report("## dispatch overhead")
    bench.run("dispatch overhead", bench.dispatch_overhead)
    report()
    report("## table")
    columns = ["variant", "max_abs_err", "provider_ran", "kernels/fwd", "graph_breaks", "frames", "fwd_ms", "note"]
    report("| " + " | ".join(columns) + " |")
    report("|" + "---|" * len(columns))
    for row in bench.rows:
        report("| " + " | ".join(str(row.get(c, "")) for c in columns) + " |")
    report(f"patched after the run: {patched_functions() or 'nothing'}")


if __name__ == "__main__":
    main()
