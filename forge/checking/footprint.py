"""The oracle's own memory: the peak it adds on top of a problem's inputs, measured on GroupNorm and RMSNorm.

Why: at KernelBench's [112, 64, 512, 512] fp32 (7.5 GB per input) an oracle that kept references, copies and poison
whole held 131 GB and ran out of memory on a 141 GB H200, blaming the kernel. `measure` validates an honest
candidate (the reference itself, so every issue found is the oracle's fault) and records the peak memory the
oracle adds as a multiple of inputs + outputs, with the wall time and the fresh-input rounds it used; the bound the
oracle is held to is stated in `forge.checking.validation`.

On CUDA the peak is `torch.cuda.max_memory_allocated` (reset before the problem) minus what was allocated before
`validate`. On the CPU the resident-set peak is per process, so `measure_in_child` runs each problem in a fresh
process, and the peak is the anonymous resident memory sampled every millisecond (`_AnonPeak`) minus its value
before `validate`; the record also keeps the kernel's high-water mark `VmHWM` (reset through
`/proc/self/clear_refs`), which counts libtorch's code pages too.

`benchmarks/oracle_memory.py` is the command line over this module; `tests/forge/checking/test_checking_memory.py`
holds the oracle to its bound with it.
"""

from __future__ import annotations

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

from forge.samples import Sample, iter_tensors

__all__ = ["GROUPS", "KERNELBENCH_SHAPE", "PROBLEMS", "SMALL_SHAPE", "make_problem", "measure", "measure_in_child"]

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


def measure(name: str, shape: tuple[int, ...], device: str, fresh: int | None = None,
            probes: bool = False) -> dict[str, Any]:
    """Validate the reference against itself on one problem; the record of peak memory and time.

    `fresh`: `fresh_inputs_per_sample` (None: the oracle's default). `probes`: measure `KernelUtils().validate`,
    the oracle plus `forge.checking.probes` (which keep two expectations and two outputs alive across an in-place
    update), as a candidate meets them, instead of `validate_report` alone."""
    from forge.checking import validation
    from forge.checking.kernel_utils import KernelUtils

    shape = tuple(shape)
    reference, sample = make_problem(name, shape, device)
    tiny_reference, tiny = make_problem(name, (2, GROUPS, 4, 4), device)
    validation.validate(tiny_reference, tiny_reference, [tiny])  # warm-up: lazy imports and one-time setup
    with torch.no_grad():
        output_bytes = _tensor_bytes(reference(*sample.args, **sample.kwargs))
    input_bytes = _tensor_bytes((sample.args, sample.kwargs))
    if probes:
        utils = KernelUtils() if fresh is None else KernelUtils(fresh_inputs_per_sample=fresh)

        def run(reference, candidate, samples):
            return utils.validate(reference, candidate, samples)
    else:
        options = {} if fresh is None else {"fresh_inputs_per_sample": fresh}

        def run(reference, candidate, samples):
            return validation.validate_report(reference, candidate, samples, **options)
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
        result = run(reference, reference, [sample])
        torch.cuda.synchronize()
    else:
        with sampler:
            result = run(reference, reference, [sample])
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


_CHILD = ("import json, sys\nfrom forge.checking.footprint import measure\n"
          "print(json.dumps(measure(*json.loads(sys.argv[1]))))\n")


def measure_in_child(name: str, shape: tuple[int, ...], fresh: int | None = None, probes: bool = False,
                     timeout: float | None = None) -> dict[str, Any]:
    """`measure` on the CPU in a fresh Python process (the resident-set peak is per process)."""
    root = Path(__file__).resolve().parents[2]  # the folder holding `forge`, for a child run from a checkout
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)}
    arguments = json.dumps([name, list(shape), "cpu", fresh, probes])
    done = subprocess.run([sys.executable, "-c", _CHILD, arguments], capture_output=True, text=True, env=env,
                          check=False, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"the child measuring {name} failed ({done.returncode}): {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
