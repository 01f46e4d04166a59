"""What the oracle's float64 reference costs for KernelBench module problems at their shipped sizes, with cuDNN and
with PyTorch's native kernels (issue 8: `68_conv_transposed_3D` spent about 4 s per float64 reference on the H200, so
its validation alone ran past the 30 s target).

For each problem: `Model` is built, moved to the device and copied to float64 as the oracle does
(`evals.sources.evaluation.ReferenceModel`); each variant runs twice on `get_inputs()` (the second call is timed, so
algorithm selection and workspace allocation are not counted) and the two float64 outputs are compared with each
other (max abs difference relative to the output's max magnitude).

    python3 benchmarks/float64_reference.py KERNELBENCH_LEVEL1_DIR [--problems 68,61] [--budget-s 240]
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import sys
import time
from pathlib import Path

import pandas as pd
import torch


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _timed(model: torch.nn.Module, inputs: list, cudnn: bool) -> tuple[torch.Tensor, float]:
    with torch.backends.cudnn.flags(enabled=cudnn), torch.no_grad():
        model(*inputs)
        torch.cuda.synchronize()
        started = time.perf_counter()
        out = model(*inputs)
        torch.cuda.synchronize()
    return out, time.perf_counter() - started


def measure(path: Path) -> dict:
    module = _load(path)
    torch.manual_seed(42)
    model = module.Model(*module.get_init_inputs()).cuda().eval()
    inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in module.get_inputs()]
    _, fp32_s = _timed(model, inputs, cudnn=True)
    model64 = copy.deepcopy(model).to(torch.float64)
    inputs64 = [x.to(torch.float64) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]
    out_cudnn, cudnn_s = _timed(model64, inputs64, cudnn=True)
    out_native, native_s = _timed(model64, inputs64, cudnn=False)
    scale = out_cudnn.abs().max().clamp_min(1e-300)
    agree = ((out_cudnn - out_native).abs().max() / scale).item()
    return {"problem": path.stem[:40], "fp32 ms": fp32_s * 1e3, "fp64 cudnn ms": cudnn_s * 1e3,
            "fp64 native ms": native_s * 1e3, "native speed-up": cudnn_s / native_s, "rel diff": agree}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("level1", type=Path)
    parser.add_argument("--problems", default="", help="comma-separated problem numbers; default: every conv problem")
    parser.add_argument("--budget-s", type=float, default=240.0)
    args = parser.parse_args()
    wanted = {p.strip() for p in args.problems.split(",") if p.strip()}
    paths = sorted(args.level1.glob("*.py"), key=lambda p: int(p.stem.split("_")[0]))
    if wanted:
        paths = [p for p in paths if p.stem.split("_")[0] in wanted]
    else:
        paths = [p for p in paths if "conv" in p.stem]
    rows, started = [], time.perf_counter()
    for path in paths:
        if time.perf_counter() - started > args.budget_s:
            print(f"budget spent; stopped before {path.stem}", flush=True)
            break
        try:
            rows.append(measure(path))
        except Exception as exc:  # noqa: BLE001 - report and go on
            rows.append({"problem": path.stem[:40], "error": f"{type(exc).__name__}: {exc}"[:120]})
        print(rows[-1], flush=True)
        torch.cuda.empty_cache()
    print(pd.DataFrame(rows).to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
