"""Typed outcomes of checking a candidate, shared by the oracle, the sandbox, the prompts, the optimizer and evals.

Why types: callers used to classify results by searching error text ("candidate raised" in e, "CUDA error" in
str(exc)), so a reworded message silently changed a verdict, and a failure of the harness itself (the reference
running out of memory, a broken reference, our own bug) reached the model as "your kernel crashed". Now:

- `Outcome` names every verdict, including `harness_error`: the harness failed, the candidate is not charged;
- `ValidationIssue` is one problem `validate` found, with its fields (sample, case, run, output leaf, counts, max
  errors, worst index, expected / got / allowed there, the worst elements as `MismatchRow`s). It is a `str` whose
  value is the readable message, so every `list[str]` caller (`"; ".join(errors)`, `errors == []`, a user's
  `KernelUtils.validate` override returning extra strings) keeps working; `issue_of` turns a plain string into an
  issue of kind `mismatch`;
- `HarnessError` is raised by `validate` when the harness, not the candidate, fails;
- `CandidateAbort` is what `SystemExit` / `KeyboardInterrupt` / `GeneratorExit` raised by candidate code become
  (`CandidateCall`, `candidate_code`), so `except Exception` around a candidate contains them, while a real Ctrl-C
  of the user (a SIGINT seen by `watch_interrupts`) or an interrupt raised by the harness itself still propagates.
"""

from __future__ import annotations

import math
import signal
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

from forge.errors import CandidateError, KernelForgeError

__all__ = [
    "CandidateAbort",
    "CandidateCall",
    "HarnessError",
    "MismatchRow",
    "Outcome",
    "ValidationIssue",
    "candidate_code",
    "is_memory_exhaustion",
    "issue_of",
    "outcome_of_issues",
    "watch_interrupts",
]


class Outcome(StrEnum):
    """The verdict on one candidate. `harness_error` is never the candidate's fault."""

    OK = "ok"
    COMPILE_ERROR = "compile_error"
    RUNTIME_ERROR = "runtime_error"
    MISMATCH = "mismatch"
    TIMEOUT = "timeout"
    CRASH = "crash"
    FORBIDDEN = "forbidden"
    HARNESS_ERROR = "harness_error"

    @property
    def blames_candidate(self) -> bool:
        """Whether the candidate is at fault (everything but `ok` and `harness_error`)."""
        return self not in (Outcome.OK, Outcome.HARNESS_ERROR)


class HarnessError(KernelForgeError):
    """`validate` could not judge the candidate because the harness failed: the reference raised on a captured
    sample or ran out of memory, or a check of ours broke. Never the candidate's fault. `reason` is one line;
    `out_of_memory` says whether memory ran out; the original exception is `__cause__`."""

    outcome = "harness_error"

    def __init__(self, reason: str, *, out_of_memory: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.out_of_memory = out_of_memory


class CandidateAbort(CandidateError):  # noqa: N818 - named for what happened, like SystemExit
    """Candidate code raised `SystemExit`, `KeyboardInterrupt` or `GeneratorExit` (kept as `__cause__`); an
    `Exception`, so the ordinary handlers around a candidate contain it."""

    outcome = "runtime_error"

    def __init__(self, original: BaseException) -> None:
        self.original_type = type(original).__name__
        detail = str(original)
        super().__init__(f"the candidate raised {self.original_type}" + (f"({detail})" if detail else ""))


# ---------------------------------------------------------------------------------------------------------
# Validation issues
# ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MismatchRow:
    """One wrong element: its index, the expected value (a number, or "NaN"/"+inf"/"-inf"), what the candidate
    gave, the absolute error and the allowed error (None where values must be equal or placement is wrong)."""

    index: tuple[int, ...]
    expected: float | str
    got: float | str
    abs_error: float | None = None
    allowed: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: _json_number(v) for k, v in asdict(self).items()} | {"index": list(self.index)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MismatchRow:
        return cls(index=tuple(int(i) for i in data.get("index") or ()), expected=_number(data.get("expected")),
                   got=_number(data.get("got")), abs_error=_optional(data.get("abs_error")),
                   allowed=_optional(data.get("allowed")))


def _json_number(value: Any) -> Any:
    """JSON has no NaN/inf: those become strings (read back by `_number`)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("+inf" if value > 0 else "-inf")
    return value


def _number(value: Any) -> float | str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return {"NaN": math.nan, "nan": math.nan, "+inf": math.inf, "inf": math.inf, "-inf": -math.inf}.get(
        str(value), str(value))


def _optional(value: Any) -> float | None:
    return None if value is None else float(_number(value))  # type: ignore[arg-type]


_ISSUE_FIELDS = ("kind", "sample", "case", "run", "leaf", "bad_elements", "elements", "max_abs_error",
                 "max_rel_error", "worst_index", "expected", "got", "allowed", "rows", "exception_type")


class ValidationIssue(str):
    """One problem found by `validate`; its string value is the readable message (see the module docstring).

    kind: `Outcome.MISMATCH` (wrong values, structure, aliasing, non-determinism), `Outcome.RUNTIME_ERROR` (the
    candidate raised; `exception_type` names it) or `Outcome.FORBIDDEN` (it did what a kernel may not, such as
    writing to the module instance it was handed). sample: index of the unique sample; case: `"captured"` or
    `"fresh #1"`...; run: which of the oracle's runs; leaf: the output (or mutated input) leaf, e.g. `output[0]`.
    bad_elements / elements, max_abs_error / max_rel_error, worst_index and expected / got / allowed there: for value
    mismatches. rows: the worst elements (`MismatchRow`), worst first.
    """

    kind: Outcome
    sample: int | None
    case: str | None
    run: str | None
    leaf: str | None
    bad_elements: int | None
    elements: int | None
    max_abs_error: float | None
    max_rel_error: float | None
    worst_index: tuple[int, ...] | None
    expected: float | str | None
    got: float | str | None
    allowed: float | None
    rows: tuple[MismatchRow, ...]
    exception_type: str | None

    def __new__(cls, message: str = "", *, kind: Outcome | str = Outcome.MISMATCH, **fields: Any) -> ValidationIssue:
        unknown = set(fields) - set(_ISSUE_FIELDS)
        if unknown:
            raise TypeError(f"ValidationIssue got unknown fields {sorted(unknown)}")
        issue = super().__new__(cls, message)
        values = {name: fields.get(name) for name in _ISSUE_FIELDS}
        values["kind"] = Outcome(kind)
        values["rows"] = tuple(fields.get("rows") or ())
        if values["worst_index"] is not None:
            values["worst_index"] = tuple(int(i) for i in values["worst_index"])
        issue.__dict__.update(values)
        return issue

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("ValidationIssue is immutable; use derive()")

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_issue, (str(self), self.fields()))

    @property
    def message(self) -> str:
        return str.__str__(self)

    def fields(self) -> dict[str, Any]:
        return {name: self.__dict__[name] for name in _ISSUE_FIELDS}

    def derive(self, message: str | None = None, **changes: Any) -> ValidationIssue:
        """A copy with a new message and/or fields."""
        return ValidationIssue(self.message if message is None else message, **{**self.fields(), **changes})

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form (the sandbox sends issues to its parent this way)."""
        data = {name: value for name, value in self.fields().items() if value not in (None, ())}
        data["kind"] = self.kind.value
        if self.worst_index is not None:
            data["worst_index"] = list(self.worst_index)
        for key in ("expected", "got", "allowed", "max_abs_error", "max_rel_error"):
            if key in data:
                data[key] = _json_number(data[key])
        data["rows"] = [row.to_dict() for row in self.rows]
        return {"message": self.message, **data}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ValidationIssue:
        fields = {k: v for k, v in data.items() if k in _ISSUE_FIELDS}
        fields["rows"] = tuple(MismatchRow.from_dict(r) for r in data.get("rows") or ())
        for key in ("expected", "got"):
            if fields.get(key) is not None:
                fields[key] = _number(fields[key])
        for key in ("allowed", "max_abs_error", "max_rel_error"):
            if fields.get(key) is not None:
                fields[key] = _optional(fields[key])
        return cls(str(data.get("message", "")), **fields)

    def table_rows(self) -> list[dict[str, Any]]:
        """The worst elements as rows for the fix prompt's mismatch table (sample, input case, output leaf, index,
        expected, actual, abs_diff, allowed), the columns of `agent.prompting.worst_mismatches` plus the allowance."""
        rows = []
        for row in self.rows:
            rows.append({"sample": self.sample if self.sample is not None else "", "input": self.case or "",
                         "output": self.leaf or "", "index": row.index, "expected": row.expected, "actual": row.got,
                         "abs_diff": row.abs_error if row.abs_error is not None else "",
                         "allowed": row.allowed if row.allowed is not None else ""})
        return rows


def _rebuild_issue(message: str, fields: dict[str, Any]) -> ValidationIssue:
    return ValidationIssue(message, **fields)


def issue_of(error: str) -> ValidationIssue:
    """`error` as a `ValidationIssue` (a plain string, e.g. from a `KernelUtils.validate` override, is a mismatch)."""
    return error if isinstance(error, ValidationIssue) else ValidationIssue(str(error), kind=Outcome.MISMATCH)


def outcome_of_issues(errors: Iterable[str]) -> Outcome:
    """`ok` for no issues; `forbidden` when the candidate did what a kernel may not; else `runtime_error` when it
    raised anywhere; else `mismatch`."""
    kinds = [issue_of(e).kind for e in errors]
    if not kinds:
        return Outcome.OK
    for kind in (Outcome.FORBIDDEN, Outcome.RUNTIME_ERROR):
        if kind in kinds:
            return kind
    return Outcome.MISMATCH


def outcome_of_exception(exc: BaseException) -> Outcome:
    """What an exception means for a candidate: its class's `outcome` (`forge.errors`); anything else a candidate
    raised is its `runtime_error`. The one place a status is derived from an exception."""
    value = getattr(type(exc), "outcome", None) if isinstance(exc, KernelForgeError) else None
    return Outcome(value) if value else Outcome.RUNTIME_ERROR


def is_memory_exhaustion(exc: BaseException) -> bool:
    """Whether a (third-party) exception reports that memory ran out: `torch.OutOfMemoryError`, `MemoryError`,
    or PyTorch's CPU allocator failure (a plain RuntimeError: "DefaultCPUAllocator: can't allocate memory")."""
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text.lower())


# ---------------------------------------------------------------------------------------------------------
# Containing BaseExceptions raised by candidate code
# ---------------------------------------------------------------------------------------------------------
_ABORTS = (SystemExit, KeyboardInterrupt, GeneratorExit)
_sigints = 0
_watchers = 0
_watch_lock = threading.Lock()


def _interrupt_is_real(exc: BaseException, sigints_before: int) -> bool:
    """Whether a `KeyboardInterrupt` may be the user's Ctrl-C (then it must propagate).

    Signals are only delivered to the main thread, so elsewhere it was raised by code. In the main thread it is
    real when a SIGINT arrived meanwhile (seen by `watch_interrupts`), and assumed real when nothing watches."""
    if not isinstance(exc, KeyboardInterrupt):
        return False
    if threading.current_thread() is not threading.main_thread():
        return False
    return _watchers == 0 or _sigints != sigints_before


@contextmanager
def watch_interrupts() -> Iterator[None]:
    """Count SIGINTs while the block runs (main thread only; the previous handler still runs), so a
    `KeyboardInterrupt` raised by candidate code can be told from the user's Ctrl-C."""
    global _watchers
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if not callable(previous):  # SIG_IGN / SIG_DFL: a SIGINT never becomes a KeyboardInterrupt here, so every
        with _watch_lock:       # KeyboardInterrupt is code's (pytest-xdist's workers ignore SIGINT, for one)
            _watchers += 1
        try:
            yield
        finally:
            with _watch_lock:
                _watchers -= 1
        return

    def counting(signum: int, frame: Any) -> Any:
        global _sigints
        _sigints += 1
        return previous(signum, frame)

    signal.signal(signal.SIGINT, counting)
    with _watch_lock:
        _watchers += 1
    try:
        yield
    finally:
        with _watch_lock:
            _watchers -= 1
        signal.signal(signal.SIGINT, previous)


class CandidateCall:
    """Calls `fn` (candidate code) and turns `SystemExit` / `GeneratorExit` / a code-raised `KeyboardInterrupt`
    into `CandidateAbort`; attributes are read through to `fn` (e.g. `allows_dispatch_poisoning`). Costs one
    Python frame per call."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn.fn if isinstance(fn, CandidateCall) else fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        before = _sigints
        try:
            return self.fn(*args, **kwargs)
        except _ABORTS as exc:
            if _interrupt_is_real(exc, before):
                raise
            raise CandidateAbort(exc) from exc

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["fn"], name)

    def __repr__(self) -> str:
        return f"CandidateCall({self.fn!r})"


class candidate_code:  # noqa: N801 - used like a function: `with candidate_code(): provider.prepare(...)`
    """A block that runs only candidate code (a provider's `prepare`, a generated module's import): the
    BaseExceptions of `CandidateCall` become `CandidateAbort`."""

    def __enter__(self) -> None:
        self._before = _sigints

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> bool:
        if exc is not None and isinstance(exc, _ABORTS) and not _interrupt_is_real(exc, self._before):
            raise CandidateAbort(exc) from exc
        return False
