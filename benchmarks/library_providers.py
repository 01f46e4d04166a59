"""Kernel libraries (FlagGems, Liger-Kernel) through kernel-forge's own oracle and benchmark, on the built-in suite.

For each built-in problem of a function some registered library serves (layer_norm, rms_norm, group_norm, softmax,
gelu, silu) plus two power-of-two group_norm shapes (SD VAE), every library provider is prepared, validated with
`KernelUtils.validate` and timed with `KernelUtils.benchmark` between two eager baseline runs, exactly as
`KernelOptimizer` does; "wins" means it beats both baselines beyond the noise (the optimizer's rule). Then the
FlagGems group_norm investigation: the oracle's errors, the raw FlagGems kernel against a float64 reference on
random inputs and on inputs whose groups have different means, and a bitwise repeat.

    python3 benchmarks/library_providers.py [--out libs.txt] [--quick] [--problems ID,ID]

Needs CUDA and the libraries (`pip install -e ".[flaggems,liger]"`); a missing library is reported and skipped.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from evals.problems import FunctionProblem, Provenance, load_suite  # noqa: E402
from forge.checking import KernelUtils  # noqa: E402
from forge.functional import original_function  # noqa: E402
from forge.providers.libraries import FLAGGEMS, LibraryKernelProvider, LibraryUnavailable, kernel_libraries  # noqa: E402
from forge.samples import Sample, TensorSpec  # noqa: E402

_LINES: list[str] = []


def say(text: str = "") -> None:
    print(text, flush=True)
    _LINES.append(text)


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "-"


def _extra_problems() -> list[FunctionProblem]:
    """group_norm shapes whose channels per group are powers of two (SD VAE decoder: 512 and 256 channels, 32
    groups), where FlagGems' kernel is not affected by the group-boundary bug."""
    problems = []
    for shape in ((1, 512, 64, 64), (1, 256, 128, 128)):
        spec = TensorSpec(shape, torch.float16)
        weight = TensorSpec((shape[1],), torch.float16)
        sample = Sample((spec, 32, weight, TensorSpec((shape[1],), torch.float16), 1e-6), {})
        problems.append(FunctionProblem(
            id=f"sd_vae.group_norm.{shape[1]}x{shape[2]}", suite="extra", function="group_norm",
            calls=((1, sample),),
            provenance=Provenance("SD VAE decoder", "GroupNorm(32)", "synthetic shape, C // G a power of two")))
    return problems


def measure(problem: FunctionProblem, utils: KernelUtils, device: torch.device) -> list[str]:
    """One table row per library provider of `problem.function`; returns the provider names that won."""
    counted = problem.materialize(device, seed=0)
    samples = [s for _, s in counted]
    timed = utils.benchmark_distribution(counted)
    calls = len(timed)
    reference = original_function(problem.function)
    providers = [LibraryKernelProvider(lib.name, problem.function) for lib in kernel_libraries().values()
                 if problem.function in lib.function_names]
    ready: list[tuple[LibraryKernelProvider, Any]] = []
    for provider in providers:
        started = time.perf_counter()
        if not provider.prepare(samples):
            reason = provider.library.unavailable_reason() or provider.refusal(samples[0]) or "raised (see log)"
            say(f"| {problem.id} | {provider.name} | refused | - | - | - | {reason[:140]} |")
            continue
        errors = utils.validate(reference, provider, samples)
        if errors:
            say(f"| {problem.id} | {provider.name} | incorrect | - | - | - | {len(errors)} errors; first: "
                f"{errors[0][:300]} |")
            continue
        ready.append((provider, time.perf_counter() - started))
    if not ready:
        return []
    first = utils.benchmark(reference, timed)
    results = []
    for provider, _ in ready:
        try:
            results.append((provider, utils.benchmark(provider, timed)))
        except Exception as exc:  # noqa: BLE001 - e.g. not capturable in a CUDA graph (device timing)
            say(f"| {problem.id} | {provider.name} | benchmark error | - | - | - | {type(exc).__name__}: "
                f"{str(exc)[:200]} |")
    second = utils.benchmark(reference, timed)
    baseline = min((first, second), key=lambda b: b.median_ms)
    say(f"| {problem.id} | PyTorch (eager) | baseline | {baseline.median_ms / calls * 1e3:.1f} | "
        f"{baseline.spread:.2f} | 1.00 | first {first.median_ms / calls * 1e3:.1f}, second "
        f"{second.median_ms / calls * 1e3:.1f} us/call |")
    won = []
    for provider, result in results:
        wins = all(result.is_faster_than(b) for b in (first, second))
        status = "wins" if wins else ("slower" if result.median_ms >= baseline.median_ms else "not significant")
        if wins:
            won.append(provider.name)
        say(f"| {problem.id} | {provider.name} | {status} | {result.median_ms / calls * 1e3:.1f} | "
            f"{result.spread:.2f} | {baseline.median_ms / result.median_ms:.2f} | |")
    return won


# ------------------------------------------------------------------------------------------------------------
# group_norm investigation
# ------------------------------------------------------------------------------------------------------------
def _errors_vs_float64(fn: Callable[..., torch.Tensor], x: torch.Tensor, groups: int, w: torch.Tensor,
                       b: torch.Tensor, eps: float) -> tuple[float, float, tuple[int, ...]]:
    reference = torch.nn.functional.group_norm(x.double(), groups, w.double(), b.double(), eps)
    out = fn(x, groups, w, b, eps).double()
    diff = (out - reference).abs()
    worst = tuple(int(i) for i in torch.unravel_index(diff.argmax(), diff.shape))
    return float(diff.max()), float(diff.mean()), worst


def investigate_group_norm(utils: KernelUtils, device: torch.device) -> None:
    say("\n## FlagGems group_norm investigation\n")
    try:
        flag_gems = FLAGGEMS.load()
    except LibraryUnavailable as exc:
        say(f"skipped: {exc}")
        return
    eager = original_function("group_norm")

    def raw(x, groups, w, b, eps):  # the library kernel itself, no adapter and no supports check
        n, c = x.shape[:2]
        return flag_gems.group_norm(x, w, b, n, c, x.numel() // (n * c), groups, eps)[0]

    gen = torch.Generator(device="cpu").manual_seed(0)
    for shape in ((2, 320, 64, 64), (1, 512, 64, 64)):
        c = shape[1]
        w = (torch.rand(c, generator=gen) + 0.5).half().to(device)
        b = (torch.randn(c, generator=gen) * 0.1).half().to(device)
        plain = torch.randn(shape, generator=gen).half().to(device)
        # Each group gets its own offset and scale: a kernel that mixes groups' statistics is far off.
        group_of_channel = torch.arange(c) // (c // 32)
        offsets = (group_of_channel.float() * 0.25).view(1, c, 1, 1)
        scales = (1.0 + group_of_channel.float() * 0.1).view(1, c, 1, 1)
        structured = (torch.randn(shape, generator=gen) * scales + offsets).half().to(device)
        say(f"shape {list(shape)} fp16, 32 groups ({c // 32} channels per group), eps 1e-5:")
        for label, x in (("N(0,1) input", plain), ("per-group mean/scale input", structured)):
            for name, fn in (("eager fp16", eager), ("FlagGems raw kernel", raw)):
                max_err, mean_err, worst = _errors_vs_float64(fn, x, 32, w, b, 1e-5)
                say(f"  {label:28s} {name:20s} max |err| vs fp64 {max_err:.3e}  mean {mean_err:.3e}  worst at "
                    f"{list(worst)} (channel {worst[1]}, group {worst[1] // (c // 32)})")
        runs = [raw(structured, 32, w, b, 1e-5) for _ in range(20)]
        same = all(torch.equal(runs[0], r) for r in runs[1:])
        say(f"  20 repeated FlagGems runs bitwise identical: {same}")
        sample = Sample((plain, 32, w, b, 1e-5), {})
        errors = utils.validate(eager, raw, [sample])
        say(f"  oracle on the raw kernel: {'PASS' if not errors else f'{len(errors)} errors'}")
        for line in errors[:4]:
            say(f"    {line[:400]}")


# ------------------------------------------------------------------------------------------------------------
# The optimizer with library providers: a small post-norm transformer-style block (GPT-2 shapes)
# ------------------------------------------------------------------------------------------------------------
class _NormBlock(torch.nn.Module):
    def __init__(self, width: int = 768) -> None:
        super().__init__()
        self.norm1, self.norm2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.proj = torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        scores = torch.softmax(h[..., :256] @ h[..., :256].transpose(-1, -2) / 16.0, dim=-1)
        return self.norm2(x + self.proj(scores @ h))


def plan_with_libraries(utils: KernelUtils, device: torch.device, out_dir: Path | None) -> None:
    """`KernelOptimizer` with every library provider: what the plan picks, and a save / load round trip."""
    import tempfile

    from forge import KernelOptimizationPlan, KernelOptimizer
    from forge.providers import library_providers

    say("\n## make_plan with library providers (GPT-2-like block, fp32 [8,1024,768])\n")
    names = [lib.name for lib in kernel_libraries().values() if lib.unavailable_reason() is None]
    providers = library_providers(device, names)
    model = _NormBlock().to(device).eval()
    data = [Sample((torch.randn(8, 1024, 768, device=device),), {})]
    optimizer = KernelOptimizer(kernel_providers=providers, kernel_utils=utils)
    with torch.no_grad():
        plan = optimizer.make_plan(model, data)
    columns = [c for c in ("function", "candidate", "status", "latency_ms", "spread", "speedup", "error")
               if c in optimizer.report.columns]
    say(optimizer.report[columns].to_string(index=False))
    say(f"\nplan: {[(e.function, e.provider.name, round(e.speedup or 0, 2)) for e in plan.entries]}")
    folder = Path(tempfile.mkdtemp())
    loaded = KernelOptimizationPlan.load(plan.save(folder / "libs.plan.json"))
    x = data[0].args[0]
    with torch.no_grad():
        expected = model(x)
        with loaded.apply(model) as runtime:
            got = model(x)
    say(f"reloaded plan: {[e.provider.name for e in loaded.entries]}; max |diff| vs eager "
        f"{float((got - expected).abs().max()):.2e}; provider / fallback calls "
        f"{ {k: (v.provider_calls, v.fallback_calls) for k, v in runtime.stats.items()} }")
    if out_dir is not None:
        (out_dir / "libs.plan.json").write_text((folder / "libs.plan.json").read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="also write the report here")
    parser.add_argument("--quick", action="store_true", help="fewer timing rounds")
    parser.add_argument("--timing", default="eager", choices=("eager", "device"),
                        help="eager: host-inclusive (default, what an eager forward pays); device: CUDA-graph replay")
    parser.add_argument("--no-investigation", action="store_true", help="skip the group_norm investigation")
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu for a dry run of the script")
    parser.add_argument("--problems", default=None, help="comma-separated problem ids (default: all served)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("needs CUDA (or --device cpu for a dry run)", file=sys.stderr)
        return 2
    utils = KernelUtils()
    if args.quick:
        utils = dataclasses.replace(utils, rounds=15, min_run_time_s=0.1)
    utils = dataclasses.replace(utils, timing=args.timing)
    title = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    say(f"# Kernel libraries through kernel-forge's oracle ({title}, timing {utils.timing})\n")
    say(f"torch {torch.__version__}, triton {_version('triton')}, flag-gems {_version('flag-gems')}, "
        f"liger-kernel {_version('liger-kernel')}")
    for library in kernel_libraries().values():
        started = time.perf_counter()
        reason = library.unavailable_reason()
        say(f"{library.title}: {'import ok' if reason is None else reason} ({time.perf_counter() - started:.1f} s)")
    served = {f for lib in kernel_libraries().values() for f in lib.function_names}
    problems = [p for p in load_suite("builtin") if isinstance(p, FunctionProblem) and p.function in served]
    problems += _extra_problems()
    if args.problems:
        wanted = set(args.problems.split(","))
        problems = [p for p in problems if p.id in wanted]
    say("\nPer call, one pass over the problem's call distribution, median; speedup vs the faster eager run.\n")
    say("| problem | candidate | status | us/call | spread | speedup | note |")
    say("|---|---|---|---:|---:|---:|---|")
    winners: dict[str, list[str]] = {}
    for problem in problems:
        try:
            winners[problem.id] = measure(problem, utils, device)
        except Exception as exc:  # noqa: BLE001 - report and go on with the next problem
            say(f"| {problem.id} | - | harness error | - | - | - | {type(exc).__name__}: {str(exc)[:200]} |")
        if device.type == "cuda":
            torch.cuda.empty_cache()
    say("\nWinners (beat both eager runs beyond noise): "
        + "; ".join(f"{k}: {', '.join(v)}" for k, v in winners.items() if v))
    if not args.no_investigation:
        investigate_group_norm(utils, device)
    if device.type == "cuda":
        try:
            plan_with_libraries(utils, device, Path(args.out).parent if args.out else None)
        except Exception as exc:  # noqa: BLE001
            import traceback

            say(f"make_plan with library providers failed: {type(exc).__name__}: {exc}")
            say(traceback.format_exc()[-1500:])
    if args.out:
        Path(args.out).write_text("\n".join(_LINES) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
