"""Peak memory and wall time of the oracle (`forge.checking.validate`) on GroupNorm and RMSNorm at KernelBench size.

Issue 8: on [112, 64, 512, 512] fp32 (7.5 GB per input) the oracle held 131 GB of references, copies and poison
and ran out of memory on a 141 GB H200, blaming the kernel. This script validates an honest candidate (the
reference itself, so every issue found would be the oracle's fault) and prints the peak memory the oracle adds on
top of the problem's own inputs, as a multiple of inputs + outputs, plus the wall time and the fresh-input rounds
the oracle used.

    python -m benchmarks.oracle_memory                     # CUDA: [112, 64, 512, 512] fp32
    python -m benchmarks.oracle_memory --small             # any device: [8, 64, 64, 64] fp32
    python -m benchmarks.oracle_memory --shape 32,64,256,256 --fresh 0   # a chosen size (CPU: 512 MB per input)
    python -m benchmarks.oracle_memory --probes            # what a candidate meets: validate, then the probes

`--probes` measures `KernelUtils().validate` (the oracle plus `forge.checking.probes`, which keep two expectations
and two outputs alive across an in-place update) instead of `validate_report` alone.

On CUDA the peak is `torch.cuda.max_memory_allocated` (reset before each problem) minus what was allocated before
`validate`; on the CPU each problem runs in a child process and the peak is the anonymous resident memory, sampled
every millisecond (`_AnonPeak`), minus its value before `validate` (the record also keeps the kernel's high-water
mark `VmHWM`, reset through `/proc/self/clear_refs`, which counts libtorch code pages too). With
`--out FILE` (default `$OUT/oracle_memory.json` when `$OUT` is set) the records are also written as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from forge.samples import Sample

KERNELBENCH_SHAPE = (112, 64, 512, 512)
SMALL_SHAPE = (8, 64, 64, 64)
GROUPS = 8  # KernelBench level1/35_GroupNorm_: 8 groups over 64 features
PROBLEMS = ("group_norm", "rms_norm")


def make_problem(name: str, shape: tuple[int, ...], device: str) -> tuple[Any, Sample]:
    """`(reference, sample)` of one problem; the inputs are drawn on `device` directly (no host copy)."""
    generator = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(shape, generator=generator, device=device)
    if name == "group_norm":
        weight = torch.randn(shape[1], generator=generator, device=device)
        bias = torch.randn(shape[1], generator=generator, device=device)
        return F.group_norm, Sample((x, GROUPS, weight, bias), {"eps": 1e-5})
    if name == "rms_norm":
        weight = torch.randn(shape[-1], generator=generator, device=device)
        return F.rms_norm, Sample((x, (shape[-1],), weight), {"eps": 1e-5})
    raise ValueError(f"unknown problem {name!r}; known: {', '.join(PROBLEMS)}")


def _tensor_bytes(values: Any) -> int:
    from forge.samples import iter_tensors

    return sum(t.numel() * t.element_size() for t in iter_tensors(values))


def _rss_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


class _AnonPeak:
    """Samples the process's anonymous resident memory (`/proc/self/statm`: resident minus file-backed pages) every
    millisecond on a thread: the high-water mark `VmHWM` also counts pages of libtorch's code faulted in by kernels
    first run during the measurement (hundreds of MB, varying from run to run), which are not the oracle's."""

    def __init__(self) -> None:
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.peak = self.now()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def now(self) -> int:
        fields = Path("/proc/self/statm").read_text().split()
        return (int(fields[1]) - int(fields[2])) * self.page

    def _run(self) -> None:
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, self.now())

    def __enter__(self) -> _AnonPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.now())


def _reset_rss_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def measure(name: str, shape: tuple[int, ...], device: str, fresh: int | None,
            probes: bool = False) -> dict[str, Any]:
    """Validate the reference against itself on one problem; the record of peak memory and time."""
    from forge.checking import validation
    from forge.checking.kernel_utils import KernelUtils

    reference, sample = make_problem(name, shape, device)
    tiny_reference, tiny = make_problem(name, (2, GROUPS, 4, 4), device)
    validation.validate(tiny_reference, tiny_reference, [tiny])  # warm-up: lazy imports and one-time setup
    with torch.no_grad():
        output_bytes = _tensor_bytes(reference(*sample.args, **sample.kwargs))
    input_bytes = _tensor_bytes((sample.args, sample.kwargs))
    kwargs = {} if fresh is None else {"fresh_inputs_per_sample": fresh}
    run = getattr(validation, "validate_report", None) or validation.validate  # validate: before issue 8
    if probes:
        utils = KernelUtils() if fresh is None else KernelUtils(fresh_inputs_per_sample=fresh)
        kwargs = {}

        def run(reference, candidate, samples):  # noqa: F811 - the oracle and the probes, as candidates meet them
            return utils.validate(reference, candidate, samples)
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        reset = _reset_rss_peak()
        rss_before = _rss_bytes("VmRSS")
        sampler = _AnonPeak()
        before = sampler.peak
    start = time.perf_counter()
    if cuda:
        result = run(reference, reference, [sample], **kwargs)
        torch.cuda.synchronize()
    else:
        with sampler:
            result = run(reference, reference, [sample], **kwargs)
    wall_s = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() if cuda else sampler.peak
    issues = list(getattr(result, "issues", result))
    record = {
        "problem": name, "shape": list(shape), "with_probes": probes,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "input_bytes": input_bytes, "output_bytes": output_bytes, "peak_extra_bytes": peak - before,
        "multiple_of_inputs_plus_outputs": round((peak - before) / (input_bytes + output_bytes), 3),
        "wall_s": round(wall_s, 2), "issues": [str(i) for i in issues],
        "fresh_rounds_used": list(getattr(result, "fresh_rounds_used", ())) or None,
        "peak_source": "torch.cuda.max_memory_allocated" if cuda else "anonymous resident memory, sampled each ms",
    }
    if not cuda:  # the kernel's own high-water mark, file-backed pages included (an upper bound)
        record["rss_hwm_extra_bytes"] = _rss_bytes("VmHWM") - rss_before if reset else None
    return record


def _child(name: str, shape: tuple[int, ...], fresh: int | None, probes: bool = False) -> dict[str, Any]:
    """Run `measure` on the CPU in a fresh process (the resident-set peak is per process)."""
    command = [sys.executable, "-m", "benchmarks.oracle_memory", "--child", name, "--device", "cpu",
               "--shape", ",".join(map(str, shape))] + (["--probes"] if probes else [])
    if fresh is not None:
        command += ["--fresh", str(fresh)]
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run(command, capture_output=True, text=True, cwd=root, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"child for {name} failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


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
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    shape = tuple(int(s) for s in args.shape.split(",")) if args.shape else (
        SMALL_SHAPE if args.small else KERNELBENCH_SHAPE)
    if args.child:
        print(json.dumps(measure(args.child, shape, "cpu", args.fresh, args.probes)))
        return 0
    if not args.device.startswith("cuda") and not args.small and not args.shape:
        parser.error("the KernelBench size needs CUDA; use --small or --shape on the CPU")
    records = []
    for name in args.problems.split(","):
        record = (measure(name, shape, args.device, args.fresh, args.probes) if args.device.startswith("cuda")
                  else _child(name, shape, args.fresh, args.probes))
        _print(record)
        records.append(record)
    out = args.out or (str(Path(os.environ["OUT"]) / "oracle_memory.json") if os.environ.get("OUT") else None)
    if out:
        Path(out).write_text(json.dumps(records, indent=2))
    return 1 if any(r["issues"] for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
