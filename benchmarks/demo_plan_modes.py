"""A demo's saved plan under every execution mode, with GPU clocks sampled alongside, the device time of the compiled
variants (captured in a CUDA graph) and torch.compile's reduce-overhead mode.

Why: a plan that won in eager and in its end-to-end check showed bimodal or slower whole-model figures under CUDA
graphs and compile (the UNet demo's group_norm + silu plan, BENCHMARKS.md 0a); this separates host from device time
and shows whether the GPU's clocks moved during the run.

    python3 benchmarks/demo_plan_modes.py PLAN.json [--demo unet] [--blocks 4] [--clocks clocks.csv]

(from the repository root on the GPU host). Prints the six-variant report and each variant's block medians, then,
per compiled variant (without and with the plan), its host-inclusive and its graph-replay time, then the report of
`torch.compile(mode="reduce-overhead")`. `nvidia-smi` samples SM clock, power, temperature and throttle reasons
every `--clock-ms` into `--clocks` while it runs.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import torch

from forge.demos import get_demo
from forge.end_to_end import ModelRunner, compare_end_to_end, time_model
from forge.plan import KernelOptimizationPlan


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("plan", help="a plan saved by `kforge optimize --demo NAME --out PLAN.json`")
    parser.add_argument("--demo", default="unet", help="the demo the plan was made for (default: unet)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--blocks", type=int, default=4, help="interleaved blocks of the six-variant report")
    parser.add_argument("--reduce-overhead-blocks", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=10, help="timed forwards per compiled variant")
    parser.add_argument("--clocks", default="clocks.csv", help="where nvidia-smi's samples go")
    parser.add_argument("--clock-ms", type=int, default=250)
    args = parser.parse_args(argv)
    plan = KernelOptimizationPlan.load(args.plan)
    demo = get_demo(args.demo)
    model, data = demo.model(args.device), demo.inputs(args.device)
    sampler = subprocess.Popen(
        ["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active",
         "--format=csv", "-lms", str(args.clock_ms)], stdout=open(args.clocks, "w"), stderr=subprocess.DEVNULL)
    try:
        t0 = time.time()
        report = compare_end_to_end(model, data, plan, blocks=args.blocks)
        print(report.frame().to_string(index=False, float_format=lambda v: f"{v:.4g}"))
        for row in report.rows:
            print(row.variant, "block medians:", [round(m, 2) for m in row.block_medians_ms])
        print(f"[{time.time() - t0:.0f} s]")
        device = torch.device(args.device)
        with torch.no_grad():
            rows = []
            for planned in (None, plan):
                runner = ModelRunner(model, data, execution="compile", plan=planned, compile_options={})
                runner()
                host = time_model(runner, execution="compile", device=device, rounds=args.rounds)
                dev = time_model(runner, execution="cuda_graphs", device=device, rounds=args.rounds)
                rows.append((planned is not None, host.median_ms, dev.median_ms))
                runner.close()
            for planned, host, dev in rows:
                print(f"compile default plan={planned}: host-inclusive {host:.3f} ms, "
                      f"device (graph replay) {dev:.3f} ms")
            print(f"[{time.time() - t0:.0f} s]")
            report = compare_end_to_end(model, data, plan, executions=["compile"], blocks=args.reduce_overhead_blocks,
                                        compile_options={"mode": "reduce-overhead"})
            print("reduce-overhead:")
            print(report.frame().to_string(index=False, float_format=lambda v: f"{v:.4g}"))
            print(f"[{time.time() - t0:.0f} s]")
    finally:
        sampler.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
