"""Peak memory and wall time of the oracle (`forge.checking.validate`) on GroupNorm and RMSNorm at KernelBench size.

At [112, 64, 512, 512] fp32 (7.5 GB per input) an oracle that kept its references, copies and poison whole held
131 GB and ran out of memory on a 141 GB H200, blaming the kernel. This validates an honest candidate (the
reference itself, so every issue found would be the oracle's fault) and prints the peak memory the oracle adds on
top of the problem's own inputs, as a multiple of inputs + outputs, plus the wall time and the fresh-input rounds
the oracle used. The measurement is `forge.checking.footprint` (how the peak is read on CUDA and on the CPU).

    python -m benchmarks.oracle_memory                     # CUDA: [112, 64, 512, 512] fp32
    python -m benchmarks.oracle_memory --small             # any device: [8, 64, 64, 64] fp32
    python -m benchmarks.oracle_memory --shape 32,64,256,256 --fresh 0   # a chosen size (CPU: 512 MB per input)
    python -m benchmarks.oracle_memory --probes            # what a candidate meets: validate, then the probes

`--probes` measures `KernelUtils().validate` (the oracle plus `forge.checking.probes`, which keep two expectations
and two outputs alive across an in-place update) instead of `validate_report` alone. On the CPU each problem runs
in a child process (the resident-set peak is per process). With `--out FILE` (default `$OUT/oracle_memory.json`
when `$OUT` is set) the records are also written as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

from forge.checking.footprint import KERNELBENCH_SHAPE, PROBLEMS, SMALL_SHAPE, measure, measure_in_child


def _print(record: dict[str, Any]) -> None:
    gib = 1 << 30
    name = record["problem"] + (" +probes" if record.get("with_probes") else "")
    print(f"{name:>10} {record['shape']} on {record['device']}: inputs {record['input_bytes'] / gib:.2f} "
          f"GiB + outputs {record['output_bytes'] / gib:.2f} GiB; oracle peak extra "
          f"{record['peak_extra_bytes'] / gib:.2f} GiB = {record['multiple_of_inputs_plus_outputs']:.2f}x "
          f"(inputs+outputs); {record['wall_s']:.1f} s; fresh rounds {record['fresh_rounds_used']}; "
          f"issues {len(record['issues'])}" + (f": {record['issues'][0][:300]}" if record["issues"] else ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help=f"use {SMALL_SHAPE} instead of {KERNELBENCH_SHAPE}")
    parser.add_argument("--shape", help="comma-separated input shape (overrides --small)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--problems", default=",".join(PROBLEMS))
    parser.add_argument("--fresh", type=int, default=None, help="fresh_inputs_per_sample (default: validate's)")
    parser.add_argument("--out", default=None, help="JSON output file (default $OUT/oracle_memory.json)")
    parser.add_argument("--probes", action="store_true", help="measure KernelUtils().validate: the oracle + probes")
    args = parser.parse_args(argv)
    shape = tuple(int(s) for s in args.shape.split(",")) if args.shape else (
        SMALL_SHAPE if args.small else KERNELBENCH_SHAPE)
    if not args.device.startswith("cuda") and not args.small and not args.shape:
        parser.error("the KernelBench size needs CUDA; use --small or --shape on the CPU")
    records = []
    for name in args.problems.split(","):
        record = (measure(name, shape, args.device, args.fresh, args.probes) if args.device.startswith("cuda")
                  else measure_in_child(name, shape, args.fresh, args.probes))
        _print(record)
        records.append(record)
    out = args.out or (str(Path(os.environ["OUT"]) / "oracle_memory.json") if os.environ.get("OUT") else None)
    if out:
        Path(out).write_text(json.dumps(records, indent=2))
    return 1 if any(r["issues"] for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
