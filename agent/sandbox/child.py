"""Sandbox child: `python -m agent.sandbox.child <run folder>` checks one candidate and writes `result.json`.

Steps: apply resource limits; load the job and the samples (moved to the job's device); bind the harness's
`validate`/`benchmark` and the original PyTorch function before any candidate code runs; import the candidate file
(a failure is a `compile_error`); run `validate` (wrong results: `mismatch`, with the oracle's structured issues
and the worst elements as `details["mismatches"]` rows for the fix prompt's table; the candidate raised:
`runtime_error`, or `compile_error` when the language says the exception is its compiler's); then, if asked,
benchmark the candidate and the original function on the same distribution; write the verdict atomically. A
failure of the harness itself (the reference raising or running out of memory: `forge.outcome.HarnessError`; any
other exception outside the candidate's code) is `harness_error`, never `crash`: the candidate is not blamed for it.
A signal or a hang is classified by the parent, which also owns the wall-clock limit.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.sandbox.protocol import INPUTS_FILE, JOB_FILE, MODULE_NAME, RESULT_FILE, read_json, write_json_atomic

__all__ = ["apply_limits", "is_device_fault", "main", "run_job"]

_TRACEBACK_CHARS = 4000
_MISMATCH_ROWS = 8
_LOG_CHARS = 4000
_MESSAGE_CHARS = 300


def _tail(text: str, limit: int) -> str:
    return text if len(text) <= limit else "...\n" + text[-limit:]


def _short(text: str, limit: int = _MESSAGE_CHARS) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def apply_limits(job: dict[str, Any]) -> None:
    """CPU seconds, file size, open files, memory (RLIMIT_DATA) and tasks (RLIMIT_NPROC) from the job; no core dumps.
    Never RLIMIT_AS (it breaks CUDA)."""
    import resource

    def cap(kind: int, soft: int, hard: int) -> None:
        _, current_hard = resource.getrlimit(kind)
        if current_hard != resource.RLIM_INFINITY:
            soft, hard = min(soft, current_hard), min(hard, current_hard)
        resource.setrlimit(kind, (soft, hard))

    cap(resource.RLIMIT_CORE, 0, 0)
    if job.get("cpu_limit_s"):
        cpu = int(job["cpu_limit_s"])
        cap(resource.RLIMIT_CPU, cpu, cpu + 2)
    if job.get("file_size_limit_bytes"):
        size = int(job["file_size_limit_bytes"])
        cap(resource.RLIMIT_FSIZE, size, size)
    if job.get("open_files_limit"):
        files = int(job["open_files_limit"])
        cap(resource.RLIMIT_NOFILE, files, files)
    if job.get("memory_limit_bytes"):  # RLIMIT_DATA: heap and private writable mappings (CUDA's reservations are not)
        memory = int(job["memory_limit_bytes"])
        cap(resource.RLIMIT_DATA, memory, memory)
    if job.get("process_limit"):  # per user namespace inside the boundary; root outside one is exempt
        tasks = int(job["process_limit"])
        cap(resource.RLIMIT_NPROC, tasks, tasks)


def _exception_details(exc: BaseException, tb_text: str | None = None) -> dict[str, Any]:
    text = tb_text if tb_text is not None else "".join(traceback.format_exception(exc))
    return {"type": f"{type(exc).__module__}.{type(exc).__qualname__}", "message": _short(str(exc), 2000),
            "traceback": _tail(text, _TRACEBACK_CHARS)}


_DEVICE_FAULT_TEXT = ("CUDA error", "HIP error", "illegal memory access", "illegal address", "device-side assert",
                      "misaligned address", "unspecified launch failure", "an illegal instruction")


def is_device_fault(exc: BaseException) -> bool:
    """Whether an exception reports a GPU fault (illegal address, device assert...) rather than a Python error."""
    text = f"{type(exc).__name__}: {exc}"
    return type(exc).__name__ == "AcceleratorError" or any(marker in text for marker in _DEVICE_FAULT_TEXT)


class _Recorder:
    """Wraps the candidate and remembers the first exception it raised (validate turns exceptions into errors)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.exception: BaseException | None = None
        self.traceback = ""
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self.fn(*args, **kwargs)
        except BaseException as exc:
            if self.exception is None:
                self.exception = exc
                tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None  # skip this frame
                self.traceback = "".join(traceback.format_exception(type(exc), exc, tb))
            raise


def _failure(language: Any, exc: BaseException, tb_text: str | None, phase: str, **extra: Any) -> dict[str, Any]:
    """A compile_error or runtime_error verdict for an exception the candidate raised."""
    kind = language.classify_exception(exc)
    details: dict[str, Any] = {"phase": phase, "exception": _exception_details(exc, tb_text), **extra}
    if kind == "compile_error":
        details["compile_log"] = _tail(language.compile_log(exc), _LOG_CHARS)
        message = f"{language.name} compile error: {_short(str(exc))}"
    else:
        message = f"{type(exc).__name__} during {phase}: {_short(str(exc))}"
    return {"status": kind, "message": message, "details": details}


def _mismatch_rows(issues: list[Any]) -> list[dict[str, Any]]:
    """The worst elements of the first value mismatches, as JSON-safe table rows (sample, input, output, index,
    expected, actual, abs_diff, allowed)."""
    rows: list[dict[str, Any]] = []
    for issue in issues:
        for row in issue.table_rows():
            if len(rows) >= _MISMATCH_ROWS:
                return rows
            rows.append({k: (list(v) if isinstance(v, tuple) else _json_value(v)) for k, v in row.items()})
    return rows


def _json_value(value: Any) -> Any:
    if isinstance(value, float) and value != value:
        return "NaN"
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return "+inf" if value > 0 else "-inf"
    return value


def run_job(folder: Path, job: dict[str, Any]) -> dict[str, Any]:
    """Everything after the limits; returns the verdict dict written to result.json."""
    import torch

    from agent.languages import get_language
    from forge.checking import KernelUtils
    from forge.checking.benchmarking import NotCapturableError
    from forge.execution import TimingMode
    from forge.functional import original_function
    from forge.outcome import HarnessError, Outcome, issue_of
    from forge.samples import Sample, clone_value

    phase_s: dict[str, float] = {}
    start = time.perf_counter()
    language = get_language(job["language"])
    reference = original_function(job["function_name"])
    device = job["device"]
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    inputs = torch.load(folder / INPUTS_FILE, weights_only=False)
    utils = inputs.get("kernel_utils") or KernelUtils()
    validate, benchmark = utils.validate, utils.benchmark  # bound before any candidate code runs
    # Eager (host-inclusive) feedback also gets the kernel's device time, so the prompt can compare device time with
    # the device roofline and host time with the host launch cost (like with like).
    device_benchmark = (dataclasses.replace(utils, timing=TimingMode.DEVICE).benchmark
                        if utils.timing is TimingMode.EAGER and device.startswith("cuda") else None)
    samples = [Sample(clone_value(tuple(a), device=device), clone_value(dict(k), device=device))
               for a, k in inputs["samples"]]
    counts = inputs.get("counts")
    phase_s["setup"] = time.perf_counter() - start

    # -- import -------------------------------------------------------------------------------------------
    start = time.perf_counter()
    source_path = folder / job["source_file"]
    try:
        entry = language.load(source_path, MODULE_NAME)
    except BaseException as exc:  # noqa: BLE001 - anything at import is the candidate's compile failure
        verdict = _failure(language, exc, None, "import")
        verdict["status"] = "compile_error"
        verdict["message"] = f"import failed: {type(exc).__name__}: {_short(str(exc))}"
        verdict["details"]["phase_s"] = phase_s
        return verdict
    phase_s["import"] = time.perf_counter() - start

    # -- validate -----------------------------------------------------------------------------------------
    start = time.perf_counter()
    candidate = _Recorder(entry)
    try:
        errors = list(validate(reference, candidate, samples))
    except HarnessError as exc:
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        if is_device_fault(cause):  # asynchronous kernel faults surface at the harness's next synchronisation
            verdict = {"status": Outcome.RUNTIME_ERROR.value,
                       "message": f"device fault after the candidate's kernels ran: {_short(str(cause))}",
                       "details": {"phase": "validation", "device_fault": True,
                                   "exception": _exception_details(cause)}}
        else:
            verdict = {"status": Outcome.HARNESS_ERROR.value, "message": f"harness error: {_short(exc.reason)}",
                       "details": {"phase": "validation", "out_of_memory": exc.out_of_memory,
                                   "harness_error": _exception_details(cause)}}
        verdict["details"]["phase_s"] = phase_s
        return verdict
    except BaseException as exc:  # noqa: BLE001 - validate raises only on harness problems or BaseException
        if candidate.exception is not None:
            verdict = _failure(language, candidate.exception, candidate.traceback, "validation")
        elif is_device_fault(exc):
            # Kernel faults are asynchronous: they surface at the harness's next synchronisation.
            verdict = {"status": "runtime_error",
                       "message": f"device fault after the candidate's kernels ran: {_short(str(exc))}",
                       "details": {"phase": "validation", "device_fault": True,
                                   "exception": _exception_details(exc)}}
        else:
            raise RuntimeError(f"validate failed: {type(exc).__name__}: {exc}") from exc
        verdict["details"]["phase_s"] = phase_s
        return verdict
    phase_s["validate"] = time.perf_counter() - start
    if errors:
        issues = [issue_of(e) for e in errors]
        found = {"errors": [str(e) for e in errors], "issues": [i.to_dict() for i in issues],
                 "mismatches": _mismatch_rows(issues)}
        if candidate.exception is not None:
            verdict = _failure(language, candidate.exception, candidate.traceback, "validation", **found)
        else:
            first = _short(errors[0], 200)
            verdict = {"status": Outcome.MISMATCH.value,
                       "message": f"{len(errors)} validation error(s); first: {first}",
                       "details": {"phase": "validation", **found}}
        verdict["details"]["phase_s"] = phase_s
        return verdict

    # -- benchmark ----------------------------------------------------------------------------------------
    verdict: dict[str, Any] = {"status": "ok", "message": "correct on every sample", "details": {}}
    if job.get("benchmark"):
        start = time.perf_counter()
        pass_samples = (utils.benchmark_distribution(list(zip(counts, samples, strict=True))) if counts
                        else samples)
        timed = _Recorder(entry)
        try:
            latency = benchmark(timed, pass_samples)
        except NotCapturableError as exc:
            verdict = {"status": "runtime_error",
                       "message": f"not capturable in a CUDA graph (the model runs under CUDA graphs or compile): "
                                  f"{_short(str(exc.__cause__ or exc))}",
                       "details": {"phase": "benchmark", "not_capturable": True, "exception": _exception_details(exc),
                                   "phase_s": phase_s}}
            return verdict
        except BaseException as exc:  # noqa: BLE001
            verdict = _failure(language, timed.exception or exc, timed.traceback or None, "benchmark")
            verdict["details"]["phase_s"] = phase_s
            return verdict
        verdict["latency_ms"] = latency.to_dict()
        if device_benchmark is not None:
            try:
                verdict["details"]["device_latency_ms"] = device_benchmark(timed, pass_samples).to_dict()
            except Exception as exc:  # noqa: BLE001 - device time is extra feedback; the verdict stands without it
                verdict["details"]["device_latency_error"] = _short(f"{type(exc).__name__}: {exc}")
        try:
            verdict["baseline_ms"] = benchmark(reference, pass_samples).to_dict()
        except Exception as exc:  # noqa: BLE001 - not the candidate's fault: report, keep the verdict
            verdict["details"]["baseline_error"] = _exception_details(exc)
        phase_s["benchmark"] = time.perf_counter() - start
        speed = ""
        if verdict.get("baseline_ms"):
            speed = (f"; {verdict['latency_ms']['median_ms']:.4g} ms vs PyTorch "
                     f"{verdict['baseline_ms']['median_ms']:.4g} ms")
        verdict["message"] = f"correct on every sample{speed}"
    verdict["details"]["phase_s"] = phase_s
    return verdict


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m agent.sandbox.child <run folder>", file=sys.stderr)
        return 2
    folder = Path(argv[0]).resolve()
    job = read_json(folder / JOB_FILE)
    apply_limits(job)
    try:
        verdict = run_job(folder, job)
    except BaseException as exc:  # noqa: BLE001 - a harness failure must still produce a verdict
        from forge.outcome import Outcome, is_memory_exhaustion

        verdict = {"status": Outcome.HARNESS_ERROR.value,
                   "message": f"sandbox harness error: {type(exc).__name__}: {_short(str(exc))}",
                   "details": {"harness_error": _exception_details(exc),
                               "out_of_memory": is_memory_exhaustion(exc)}}
    write_json_atomic(folder / RESULT_FILE, verdict)
    return 0


if __name__ == "__main__":
    sys.exit(main())
