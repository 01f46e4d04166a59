"""Views of an attempt's outcome for the prompts: `Failure` (why a candidate failed) and `Performance` (how fast
a correct candidate is, against PyTorch, the roofline floor and the cost of an empty launch).

Both are built leniently from whatever the caller has (`Failure.of(obj)`, `Performance.of(obj)`): a mapping or an
object with the documented attributes, missing keys skipped. `worst_mismatches` turns a reference/candidate output
pair into the rows of the mismatch table the fix prompt shows.
"""

from __future__ import annotations

import math
import signal as signal_module
import traceback as traceback_module
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch

from agent.roofline import RooflineEstimate
from forge.outcome import ValidationIssue

__all__ = [
    "Failure",
    "Performance",
    "ViolationView",
    "excerpt",
    "format_time_ms",
    "worst_mismatches",
]

# Latency below this multiple of the empty-launch cost (per call) counts as launch/host bound.
LAUNCH_BOUND_RATIO = 1.5
LAUNCH_HEAVY_RATIO = 3.0
# Share of the roofline floor from which a kernel counts as close to the hardware limit.
NEAR_ROOFLINE_FRACTION = 0.7
FAR_ROOFLINE_FRACTION = 0.4


# ---------------------------------------------------------------------------------------------------------
# Formatting helpers
# ---------------------------------------------------------------------------------------------------------
def format_time_ms(ms: float) -> str:
    """`0.0421` -> `"42.1 us"`, `1.5` -> `"1.5 ms"` (3 significant digits)."""
    if ms is None or not math.isfinite(ms):
        return str(ms)
    if abs(ms) < 1.0:
        return f"{ms * 1e3:.3g} us"
    return f"{ms:.3g} ms"


def excerpt(text: str | None, head: int = 1500, tail: int = 3000) -> str | None:
    """The first `head` and last `tail` characters of `text`, with a marker for what was cut."""
    if text is None:
        return None
    text = str(text).strip("\n")
    if len(text) <= head + tail + 80:
        return text
    cut = len(text) - head - tail
    return f"{text[:head]}\n... [{cut} characters omitted] ...\n{text[-tail:]}"


def _tail_lines(text: str | None, lines: int = 40, chars: int = 4000) -> str | None:
    if text is None:
        return None
    kept = str(text).strip("\n").splitlines()[-lines:]
    out = "\n".join(kept)
    return out if len(out) <= chars else "..." + out[-chars:]


def _get(obj: Any, key: str) -> Any:
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return obj.get(key)
    return getattr(obj, key, None)


def _lookup(obj: Any, key: str) -> Any:
    """`key` from `obj.details` first, then from `obj` itself."""
    value = _get(_get(obj, "details"), key)
    return value if value is not None else _get(obj, key)


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, BaseException):
        return f"{type(value).__name__}: {value}"
    if isinstance(value, (list, tuple)):
        return "\n".join(str(v).rstrip("\n") for v in value)
    text = value if isinstance(value, str) else str(value)
    return text if text.strip() else None


# ---------------------------------------------------------------------------------------------------------
# Failure
# ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ViolationView:
    """One forbidden construct: what, where (1-based line, 0/None for the whole file), why, and the source line."""

    construct: str
    line: int | None
    message: str
    source_line: str | None = None

    def describe(self) -> str:
        where = f"line {self.line}" if self.line else "file"
        text = f"{where}: `{self.construct}`" if self.construct else where
        return f"{text} — {self.message}" if self.message else text


# A failure's kind comes from its status, a `forge.outcome.Outcome` value (the judge's verdict), or one of the
# generator's own reply statuses ("no_code", "truncated"); nothing is inferred from words in free text.
_STATUS_KINDS: dict[str, str] = {
    "compile_error": "compile", "runtime_error": "runtime", "mismatch": "mismatch", "timeout": "timeout",
    "crash": "crash", "forbidden": "forbidden", "harness_error": "harness", "ok": "other",
    "no_code": "no_code", "truncated": "truncated",
}

# The compile headline names the language's compiler (`KernelLanguage.title`; Triton's text is the one below).
_COMPILE_HEADLINE = "the file did not compile (Python import or {title} compilation failed)"

HEADLINES: dict[str, str] = {
    "compile": _COMPILE_HEADLINE.format(title="Triton"),
    "runtime": "the file raised an exception while running",
    "mismatch": "the results do not match PyTorch",
    "timeout": "the run did not finish in time",
    "crash": "the process running your kernel crashed",
    "forbidden": "the file uses forbidden constructs and was rejected before running",
    "harness": "the harness failed while checking (not a fault of your kernel)",
    "no_code": "your reply contained no ```python code block",
    "truncated": "your reply was cut off before the code block was complete",
    "other": "the attempt failed",
}

_SIGNAL_HINTS = {
    "SIGSEGV": "an invalid memory access: check masks, pointer offsets, strides and int32 overflow of offsets",
    "SIGBUS": "an invalid memory access: check masks, pointer offsets and alignment",
    "SIGABRT": "an abort, often a failed device-side assertion or an illegal memory access reported by the driver",
    "SIGKILL": "the process was killed, usually for using too much memory or running too long",
    "SIGFPE": "an arithmetic fault (integer division by zero?)",
    "SIGILL": "an illegal instruction",
}


def _classify(status: str) -> str:
    """The kind of a failure's status (see `_STATUS_KINDS`); "other" for a status outside the vocabulary."""
    return _STATUS_KINDS.get(str(status), "other")


def _signal_text(value: Any) -> str | None:
    if value is None:
        return None
    name = None
    number = None
    if isinstance(value, int) or (isinstance(value, str) and value.lstrip("-").isdigit()):
        number = abs(int(value))
        try:
            name = signal_module.Signals(number).name
        except ValueError:
            name = None
    elif isinstance(value, signal_module.Signals):
        number, name = int(value), value.name
    else:
        name = str(value).upper()
        if not name.startswith("SIG"):
            name = "SIG" + name
    label = f"signal {number} ({name})" if number is not None and name else (name or f"signal {number}")
    hint = _SIGNAL_HINTS.get(name or "")
    return f"killed by {label}" + (f": {hint}" if hint else "")


@dataclass(frozen=True)
class Failure:
    """Why one attempt failed, with the details the fix prompt shows (every detail optional)."""

    status: str
    message: str = ""
    compile_log: str | None = None
    exception: str | None = None
    traceback: str | None = None
    errors: tuple[str, ...] = ()
    mismatches: tuple[Mapping[str, Any], ...] = ()
    signal: Any = None
    timeout_s: float | None = None
    violations: tuple[ViolationView, ...] = ()
    reply: str | None = None  # the raw reply (for "no code" / "truncated")
    stderr: str | None = None  # the process's error output (shown for crashes and timeouts)
    kind: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not self.kind:
            object.__setattr__(self, "kind", _classify(self.status))

    @classmethod
    def of(cls, value: Any, previous_code: str | None = None) -> Failure:
        """Build from a Failure, a mapping or an object with `status`, `message` and `details` (lenient).

        Details (looked up in `details`, then on the object): compile_log, exception (text or exception object),
        traceback (text, list of lines, or taken from the exception), errors (list[str]), mismatches (list of row
        mappings, see `worst_mismatches`; else built from `issues`, the oracle's `forge.outcome.ValidationIssue`s
        or their dicts, as the sandbox sends them), signal (number or name; signal_number), timeout_s, violations
        (objects or dicts with construct, line, message), reply, stderr_tail (or the object's `stderr`). The judge's
        `forge.judging.Verdict` (exception as {"type", "message", "traceback"}) is read as is; its status (an
        `Outcome`) decides the kind. `previous_code` adds the
        offending source line to each violation.
        """
        if isinstance(value, Failure) and previous_code is None:
            return value
        if isinstance(value, str):
            value = {"status": value}
        status = _text(_get(value, "status")) or "failed"
        exception = _lookup(value, "exception")
        trace = _lookup(value, "traceback")
        if trace is None and isinstance(exception, BaseException) and exception.__traceback__ is not None:
            trace = "".join(traceback_module.format_exception(type(exception), exception, exception.__traceback__))
        if isinstance(exception, Mapping):  # the sandbox's {"type", "message", "traceback"}
            trace = trace if trace is not None else exception.get("traceback")
            kind_name = str(exception.get("type") or "Exception").rsplit(".", 1)[-1]
            exception = f"{kind_name}: {exception.get('message', '')}"
        signal = _lookup(value, "signal")
        number = _lookup(value, "signal_number")
        if number is not None and not isinstance(signal, int):
            signal = int(number)
        stderr = _lookup(value, "stderr_tail") or _get(value, "stderr")
        errors = _lookup(value, "errors") or ()
        if isinstance(errors, str):
            errors = (errors,)
        timeout = _lookup(value, "timeout_s")
        mismatches = _lookup(value, "mismatches") or _issue_rows(_lookup(value, "issues"))
        return cls(
            status=status,
            message=_text(_get(value, "message")) or "",
            compile_log=_text(_lookup(value, "compile_log")),
            exception=_text(exception),
            traceback=_text(trace),
            errors=tuple(str(e) for e in errors),
            mismatches=tuple(_table_row(row) for row in mismatches),
            signal=signal,
            timeout_s=float(timeout) if timeout is not None else None,
            violations=tuple(_violation(v, previous_code) for v in (_lookup(value, "violations") or ())),
            reply=_text(_lookup(value, "reply")),
            stderr=_text(stderr),
        )

    @property
    def blames_candidate(self) -> bool:
        """False for a harness failure: that is never sent to the model as its fault."""
        return self.kind != "harness"

    @property
    def headline(self) -> str:
        return HEADLINES.get(self.kind, HEADLINES["other"])

    def headline_in(self, language: Any = None) -> str:
        """The headline in the words of `language` (a name or `KernelLanguage`; None: the default headline): a
        compile failure names that language's compiler ("... or CUDA C++ compilation failed")."""
        if self.kind != "compile" or language is None:
            return self.headline
        from agent.languages import get_language

        return _COMPILE_HEADLINE.format(title=get_language(language).title)

    def template_context(self, *, max_errors: int = 6, max_error_chars: int = 1500,
                         language: Any = None) -> dict[str, Any]:
        """Pre-formatted fields for the templates (`language`: whose words the headline uses, see `headline_in`)."""
        errors = [e if len(e) <= max_error_chars else e[:max_error_chars] + " ..." for e in self.errors[:max_errors]]
        return {
            "status": self.status,
            "kind": self.kind,
            "headline": self.headline_in(language),
            "message": self.message,
            "compile_log": excerpt(self.compile_log),
            "exception": excerpt(self.exception, 800, 1200),
            "traceback": _tail_lines(self.traceback),
            "errors": errors,
            "errors_omitted": max(0, len(self.errors) - max_errors),
            "mismatch_table": _markdown_table(self.mismatches[:10]) if self.mismatches else None,
            "signal": _signal_text(self.signal),
            "timeout_s": f"{self.timeout_s:g}" if self.timeout_s is not None else None,
            "violations": [v.describe() for v in self.violations],
            "violation_lines": [v.source_line for v in self.violations],
            "reply": excerpt(self.reply, 600, 1200),
            "stderr": _tail_lines(self.stderr, 30, 2000) if self.kind in ("crash", "timeout") else None,
        }


_TABLE_ROWS = 8


def _issue_rows(issues: Any) -> list[dict[str, Any]]:
    """Mismatch-table rows from the oracle's structured issues (`forge.outcome.ValidationIssue`s or their dicts)."""
    rows: list[dict[str, Any]] = []
    for issue in issues or ():
        if not isinstance(issue, ValidationIssue):
            issue = ValidationIssue.from_dict(issue) if isinstance(issue, Mapping) else None
        if issue is not None:
            rows += issue.table_rows()
    return rows[:_TABLE_ROWS]


def _table_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row as given, with a JSON list index shown as a tuple."""
    return {k: (tuple(v) if k == "index" and isinstance(v, list) else v) for k, v in row.items()}


def _violation(value: Any, previous_code: str | None) -> ViolationView:
    if isinstance(value, str):
        return ViolationView(construct="", line=None, message=value)
    line = _get(value, "line")
    line = int(line) if isinstance(line, (int, float)) or (isinstance(line, str) and line.isdigit()) else None
    source_line = None
    if previous_code is not None and line and line > 0:
        lines = previous_code.splitlines()
        if line <= len(lines):
            source_line = lines[line - 1].strip()
    return ViolationView(
        construct=str(_get(value, "construct") or ""),
        line=line,
        message=str(_get(value, "message") or ""),
        source_line=source_line,
    )


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, tuple):
        return "(" + ", ".join(str(v) for v in value) + ")"
    return str(value).replace("|", "\\|").replace("\n", " ")


def _markdown_table(rows: Sequence[Mapping[str, Any]]) -> str:
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(row.get(c, "")) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def worst_mismatches(
    expected: torch.Tensor, actual: torch.Tensor, limit: int = 8, **labels: Any
) -> list[dict[str, Any]]:
    """The `limit` elements where `actual` is furthest from `expected` (NaN/inf mismatches first).

    Rows: any `labels` given (e.g. `sample=2, output="output[0]"`), then index, expected, actual, abs_diff,
    rel_diff. Shapes must match (a shape mismatch is an error message, not a table).
    """
    if tuple(expected.shape) != tuple(actual.shape):
        raise ValueError(
            f"cannot tabulate mismatches of different shapes {tuple(expected.shape)} and {tuple(actual.shape)}"
        )
    exp = expected.detach().to("cpu", torch.float64)
    act = actual.detach().to("cpu", torch.float64)
    diff = (exp - act).abs()
    both_nan = exp.isnan() & act.isnan()
    same_inf = exp.isinf() & act.isinf() & (exp == act)
    diff = torch.where(both_nan | same_inf, torch.zeros_like(diff), diff)
    diff = torch.where(diff.isnan(), torch.full_like(diff, math.inf), diff)
    flat = diff.reshape(-1)
    count = min(limit, int((flat > 0).sum()))
    if count == 0:
        return []
    values, positions = flat.topk(count)
    rows = []
    for value, pos in zip(values.tolist(), positions.tolist(), strict=True):
        index = tuple(int(i) for i in torch.unravel_index(torch.tensor(pos), tuple(exp.shape))) if exp.dim() else ()
        e, a = exp.reshape(-1)[pos].item(), act.reshape(-1)[pos].item()
        rel = value / abs(e) if e not in (0.0,) and math.isfinite(e) else math.inf
        rows.append({**labels, "index": index, "expected": e, "actual": a, "abs_diff": value, "rel_diff": rel})
    return rows


# ---------------------------------------------------------------------------------------------------------
# Performance
# ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Performance:
    """Measured speed of a correct candidate for one pass over the task's calls (each distinct call once).

    latency_ms: the candidate; baseline_ms: PyTorch eager for the same pass, on the same clock; timing: that clock
    (`"eager"`: host-inclusive wall time, what an eager forward pays; `"device"`: kernel time from a CUDA-graph
    replay, what CUDA graphs and compiled models pay); device_latency_ms: the candidate's device time when the main
    clock is host-inclusive (the sandbox measures both on CUDA); launch_overhead_us: the measured host cost of one
    empty Triton kernel launch (per call); roofline: `agent.roofline.estimate` for the same calls; calls: how many
    `kernel_function` calls the pass makes (default: the task's number of signatures).

    Comparisons are like with like: device time against the device roofline, host-inclusive time against the host
    launch cost (only in eager timing: under CUDA graphs there is no per-call launch cost to compare with).
    """

    latency_ms: float
    baseline_ms: float | None = None
    launch_overhead_us: float | None = None
    roofline: RooflineEstimate | None = None
    calls: int | None = None
    timing: str = "eager"
    device_latency_ms: float | None = None

    def __post_init__(self) -> None:
        if self.timing not in ("eager", "device"):
            raise ValueError(f"Performance.timing must be 'eager' or 'device', got {self.timing!r}")
        for name in ("latency_ms", "baseline_ms", "launch_overhead_us", "device_latency_ms"):
            value = getattr(self, name)
            if value is None and name != "latency_ms":
                continue
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"Performance.{name} must be a positive number of {name.rsplit('_', 1)[1]}, "
                                 f"got {value!r}")
        if self.roofline is not None and not isinstance(self.roofline, RooflineEstimate):
            raise TypeError(f"Performance.roofline must be an agent.roofline.RooflineEstimate, got "
                            f"{type(self.roofline).__name__}")

    @classmethod
    def of(cls, value: Any) -> Performance:
        """Build from a Performance, a mapping or an object with the same attribute names.

        `latency_ms` / `baseline_ms` may also be benchmark results (a `forge.checking.BenchmarkResult` or its dict,
        as in the sandbox's result): their `median_ms` is used.
        """
        if isinstance(value, Performance):
            return value
        latency = _milliseconds(_get(value, "latency_ms"))
        if latency is None:
            raise ValueError("a performance record needs latency_ms (the candidate's measured time in ms)")
        return cls(
            latency_ms=latency,
            baseline_ms=_milliseconds(_get(value, "baseline_ms")),
            launch_overhead_us=_float_or_none(_get(value, "launch_overhead_us")),
            roofline=_get(value, "roofline"),
            calls=_get(value, "calls"),
            timing=str(_get(value, "timing") or _get(_get(value, "latency_ms"), "mode") or "eager"),
            device_latency_ms=_milliseconds(_get(value, "device_latency_ms")),
        )

    @property
    def speedup(self) -> float | None:
        return self.baseline_ms / self.latency_ms if self.baseline_ms else None

    @property
    def kernel_ms(self) -> float:
        """The candidate's device time: the device-clock measurement when there is one, else the single clock (on
        CPU both clocks are wall time)."""
        return self.device_latency_ms if self.device_latency_ms is not None else self.latency_ms

    @property
    def roofline_fraction(self) -> float | None:
        """Roofline floor / device time: 1.0 means at the hardware limit."""
        return self.roofline.floor_ms / self.kernel_ms if self.roofline is not None else None

    def launch_ratio(self, calls: int) -> float | None:
        """Host-inclusive latency per call divided by the host cost of one empty launch (eager timing only)."""
        if not self.launch_overhead_us or self.timing != "eager":
            return None
        return self.latency_ms * 1e3 / max(calls, 1) / self.launch_overhead_us

    def interpretation(self, calls: int, language: Any = None) -> list[str]:
        """Short diagnoses of where the time goes, most important first (advice in `language`'s terms: a name or
        `KernelLanguage`; None: advice that names no language's tools, `KernelLanguage.compute_bound_hint`)."""
        notes: list[str] = []
        ratio = self.launch_ratio(calls)
        fraction = self.roofline_fraction
        launch_floor_ms = (self.launch_overhead_us * max(calls, 1) / 1e3
                           if self.launch_overhead_us and self.timing == "eager" else None)
        if ratio is not None and ratio < LAUNCH_BOUND_RATIO:
            notes.append(
                f"latency is {ratio:.1f}x the cost of launching an empty kernel: host-side Python overhead and launch "
                "latency dominate, not GPU work — cut wrapper work (no torch calls, no .contiguous()/.to() copies, no "
                "per-call recomputation: cache grid/meta/block-size choices per shape), and launch exactly one kernel "
                "per call; device-side tuning will not help here"
            )
        elif ratio is not None and ratio < LAUNCH_HEAVY_RATIO:
            notes.append(
                f"latency is {ratio:.1f}x the cost of an empty launch: launch and wrapper overhead are a large part of "
                "the time — trim the Python wrapper and avoid extra kernels or copies before tuning the kernel body"
            )
        if self.roofline is not None and launch_floor_ms is not None and self.roofline.floor_ms < launch_floor_ms:
            note = (
                f"the roofline floor ({format_time_ms(self.roofline.floor_ms)}) is below the launch cost "
                f"({format_time_ms(launch_floor_ms)}): at these sizes the practical limit is one kernel launch per "
                "call, so the wrapper's overhead decides the speed"
            )
            if ratio is not None and ratio >= LAUNCH_BOUND_RATIO:
                extra = self.latency_ms - launch_floor_ms
                note += (
                    f"; the {format_time_ms(extra)} above one launch per call is wrapper work or extra kernels — "
                    "remove them"
                )
            notes.append(note)
        elif fraction is not None:
            percent = _percent(fraction)
            if fraction >= NEAR_ROOFLINE_FRACTION:
                notes.append(
                    f"at {percent} of the roofline floor: close to the hardware limit; remaining gains can only come "
                    "from moving fewer bytes (read each input once, no intermediate buffers) or less host overhead"
                )
            elif self.roofline.bound == "memory":
                notes.append(
                    f"at {percent} of the bandwidth floor: memory-bound — improve coalescing (unit-stride inner "
                    "dimension across the block), vectorise (wide contiguous loads), use larger blocks / more work "
                    "per program, read each input exactly once and avoid extra passes"
                    + (" (far from the floor: look for a second pass or an uncoalesced access first)"
                       if fraction < FAR_ROOFLINE_FRACTION else "")
                )
            else:
                from agent.languages import KernelLanguage, get_language

                hint = (get_language(language) if language is not None else KernelLanguage).compute_bound_hint
                notes.append(f"at {percent} of the FLOP floor: compute-bound — {hint}")
        speedup = self.speedup
        if speedup is not None:
            if speedup < 1:
                notes.append(f"slower than PyTorch eager ({speedup:.2f}x): it must beat PyTorch to be used at all")
            else:
                notes.append(f"{speedup:.2f}x faster than PyTorch eager")
        return notes

    def template_context(self, calls: int, language: Any = None) -> dict[str, Any]:
        calls = self.calls or calls
        ratio = self.launch_ratio(calls)
        roofline = self.roofline
        return {
            "calls": calls,
            "latency": format_time_ms(self.latency_ms),
            "latency_ms": f"{self.latency_ms:.4g}",
            "baseline": format_time_ms(self.baseline_ms) if self.baseline_ms else None,
            "speedup": f"{self.speedup:.2f}x" if self.speedup is not None else None,
            "clock": ("device time (CUDA-graph replay)" if self.timing == "device"
                      else "host-inclusive (what an eager forward pays)"),
            "device_latency": (format_time_ms(self.device_latency_ms) if self.device_latency_ms is not None
                               and self.timing == "eager" else None),
            "launch_overhead": (f"{self.launch_overhead_us:.3g} us"
                                if self.launch_overhead_us and self.timing == "eager" else None),
            "launch_floor": (format_time_ms(self.launch_overhead_us * calls / 1e3)
                             if self.launch_overhead_us and self.timing == "eager" else None),
            "launch_ratio": f"{ratio:.1f}x" if ratio is not None else None,
            "roofline_floor": format_time_ms(roofline.floor_ms) if roofline is not None else None,
            "roofline_percent": _percent(self.roofline_fraction) if roofline is not None else None,
            "roofline_bound": roofline.bound if roofline is not None else None,
            "roofline_bytes": f"{roofline.bytes_moved / 1e6:.3g} MB" if roofline is not None else None,
            "roofline_flops": f"{roofline.flops / 1e9:.3g} GFLOP" if roofline is not None else None,
            "ceilings": roofline.ceilings.describe() if roofline is not None else None,
            "interpretation": self.interpretation(calls, language),
        }


def _percent(fraction: float) -> str:
    """`0.35` -> `"35%"`, `0.0002` -> `"0.02%"`."""
    value = fraction * 100
    return f"{value:.0f}%" if value >= 10 else f"{value:.2g}%"


def _milliseconds(value: Any) -> float | None:
    """A number of ms, or the `median_ms` of a benchmark result (object or dict)."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    median = _get(value, "median_ms")
    if median is None:
        raise ValueError(f"expected a time in ms or a benchmark result with median_ms, got {value!r}")
    return float(median)


def _float_or_none(value: Any) -> float | None:
    return float(value) if value is not None else None
