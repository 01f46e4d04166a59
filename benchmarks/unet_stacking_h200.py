"""The UNet demo's plan (group_norm + silu, generated) under every execution mode on the H200, with GPU clocks
sampled alongside, the device time of the compiled variants (captured in a CUDA graph) and torch.compile's
reduce-overhead mode: why a plan that wins in eager and in its end-to-end check shows bimodal or slower whole-model
figures under CUDA graphs and compile.

    python3 benchmarks/unet_stacking_h200.py PLAN.json   (run from the repo root on the GPU host)
"""

from __future__ import annotations

import subprocess
import sys
import time

import torch

from forge.demos import get_demo
from forge.end_to_end import ModelRunner, compare_end_to_end, time_model
from forge.plan import KernelOptimizationPlan


def main() -> int:
    plan = KernelOptimizationPlan.load(sys.argv[1])
    out = sys.argv[2] if len(sys.argv) > 2 else "clocks.csv"
    demo = get_demo("unet")
    model, data = demo.model("cuda"), demo.inputs("cuda")
    sampler = subprocess.Popen(
        ["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active",
         "--format=csv", "-lms", "250"], stdout=open(out, "w"), stderr=subprocess.DEVNULL)
    try:
        t0 = time.time()
        report = compare_end_to_end(model, data, plan, blocks=4)
        frame = report.frame()
        print(frame.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
        for row in report.rows:
            print(row.variant, "block medians:", [round(m, 2) for m in row.block_medians_ms])
        print(f"[{time.time() - t0:.0f} s]")
        device = torch.device("cuda")
        with torch.no_grad():
            for options in ({},):
                rows = []
                for planned in (None, plan):
                    runner = ModelRunner(model, data, execution="compile", plan=planned, compile_options=options)
                    runner()
                    host = time_model(runner, execution="compile", device=device, rounds=10)
                    dev = time_model(runner, execution="cuda_graphs", device=device, rounds=10)
                    rows.append((planned is not None, host.median_ms, dev.median_ms))
                    runner.close()
                for planned, host, dev in rows:
                    print(f"compile {options or 'default'} plan={planned}: host-inclusive {host:.3f} ms, "
                          f"device (graph replay) {dev:.3f} ms")
                print(f"[{time.time() - t0:.0f} s]")
            report = compare_end_to_end(model, data, plan, executions=["compile"], blocks=3,
                                        compile_options={"mode": "reduce-overhead"})
            print("reduce-overhead:")
            print(report.frame().to_string(index=False, float_format=lambda v: f"{v:.4g}"))
            print(f"[{time.time() - t0:.0f} s]")
    finally:
        sampler.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
