"""`validate`: the harness-owned correctness oracle every candidate kernel must pass.

For each unique sample, the captured inputs and `fresh_inputs_per_sample` fresh random inputs drawn from the
sample's specs (seeded: `seed + sample index`; fewer for large inputs, see below) are each checked like this:

1. The reference runs on copies of the inputs, in float64 and natively (`forge.checking.expectation`); the
   expected numbers are sealed away before the candidate runs.
2. The candidate runs four times, each on fresh clones of the inputs, after poisoning the allocator:
   run 1 plain; runs 2 and 3 under `PoisonFreshAllocations` (NaN, then large values); run 4 plain again after
   poisoning the allocator with large values. Plain runs come first because a `torch.compile`d function first
   called under a dispatch mode stays uncompiled (and under a mode it runs eagerly); if a run raises only under
   the dispatch mode, it is retried plainly and the mode is dropped for this candidate. A candidate whose
   `allows_dispatch_poisoning` attribute is False (trusted compilers such as `CompiledFunctionProvider`) skips
   the dispatch-mode runs.
3. Every run is checked against the expectation as soon as it returns: structure (exact `torch.Tensor` type,
   shape, dtype, device), values within the allowance of `forge.checking.tolerance`, NaN/inf placement,
   integer/bool outputs exact, inputs untouched unless the reference mutates them (then they must match like
   outputs), and outputs that alias a mutated input in the reference must alias it in the candidate too.
4. Outputs of different runs must not share memory (a reused output buffer breaks callers that keep results).
   Earlier outputs are released once checked, so their memory may legitimately come back: an output is reused
   only if its storage is one an earlier run returned *and that storage is still alive* (a `StorageWeakRef`
   says so), i.e. something (the candidate's cache) kept it.
5. Runs of the same kind (plain vs plain, poisoned vs poisoned) must agree bitwise (NaN-aware) when
   `require_deterministic`, compared by `forge.checking.compare.fingerprint` (128 bits per piece of 1M-16M
   elements) instead of keeping the first run's output; else within the allowance, keeping the first output of
   each kind. Bitwise agreement is waived (each run still matched the float64 reference) for trusted compilers
   and where the reference itself gives different bits on identical calls (re-run up to 4 times, only when the
   runs disagree): measured on two H200s, torch.compile'd SDPA (GQA decode, bf16) gave one element of 131,072
   one ulp apart between two identical calls and failed by chance.

Memory (measured: GroupNorm over [112, 64, 512, 512] fp32, 7.5 GB per input, held 131 GB of references, copies, four run
outputs and poison and ran out of memory on a 141 GB H200). With I and O the bytes of the problem's inputs and outputs
(fp32), the oracle holds besides the caller's inputs: during the float64 run 2I + 2O (plus the reference's own float64
temporaries: a reference cannot be chunked generically, so it runs whole); while building the expectation 2O (float64
output, becoming the reference in place) + O (eager) + O (allowance, float32); while the candidate runs the expectation
(3O) + one clone of the inputs (I) + the allocator poison, then the output (O each, one after the other; on CUDA plus a
poison block of at most 1 GB); plus constant-size pieces of the comparisons (`forge.checking.compare.iter_pieces`: tens
of MB on the CPU, under 1 GB on CUDA). Stated bound: peak extra <= 3 x (I + O) + that constant, beyond the reference's
and the candidate's own temporaries. Measured (`forge.checking.footprint`, CPU, 512 MB fp32 inputs, anonymous resident
memory): GroupNorm 2.5x (10.4x before), RMSNorm 3.4x (10.4x before; its float64 reference alone peaks at 3x: the upcast
input, x * rsqrt and the output are all full-size float64 tensors). Expected on the H200 at [112, 64, 512, 512]: ~2.6x,
~46 GB in all. A fresh draw adds its own inputs (I) while the caller's sample stays alive.

Fresh rounds for large inputs: a sample whose tensor inputs exceed `LARGE_INPUT_BYTES` (1 GiB) gets at most
`LARGE_INPUT_FRESH_ROUNDS` (1) fresh draws. Each round costs a full float64 reference, four candidate runs and a
draw of the inputs on the host (about 10 s for 7.5 GB), while at that size one random draw already checks hundreds
of millions of elements on values the candidate cannot have special-cased; 1 GiB matches the evals' own limit for
module problems. The same cap applies, from its captured case on, to a sample whose inputs and outputs together
exceed `LARGE_INPUT_BYTES` (KernelBench's `63_conv_standard_2D` reads 1 GiB and writes 8.5 GB: with full rounds on
three seeds it spent 42 s validating on the H200, every case's expectation and comparisons walking 2.1G output
elements), and to one whose captured case took the reference more than `SLOW_REFERENCE_S` (2 s) to compute (the
float64 run, the native run and the allowance: harness time only, never the candidate's, so a kernel cannot buy
itself fewer checks by being slow; KernelBench's 3-D transposed convolutions spent 4 s per expectation on the H200
while cuDNN ran their float64 reference). `validate_report` returns a `ValidationReport` with the rounds used per
sample and the sizes; `validate` returns its issues only.

Errors are `forge.outcome.ValidationIssue`s (strings, so `list[str]` callers keep working, with typed fields):
they name the sample (index, captured or fresh, its description), the run, the output leaf and, for value
mismatches, the max abs and rel error, the worst index, the expected and actual values and the few worst elements;
`kind` is `mismatch`, or `runtime_error` when the candidate raised (its `SystemExit`, `GeneratorExit` and code-raised
`KeyboardInterrupt` included, via `forge.outcome.CandidateCall`).

Nothing the candidate does makes `validate` raise; bad arguments from the caller do (`TypeError`/`ValueError`), and
a failure of the harness raises `forge.outcome.HarnessError`, never charged to the candidate: the reference raising
on a captured sample (it ran there in the model, so the reference or the harness is broken), memory running out in
the reference on any input (a fresh draw the reference rejects for any other reason is skipped, as before), or our
own checks or input drawing failing.
"""

from __future__ import annotations

import logging
import math
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from forge.checking.compare import (
    as_real,
    bits_mismatch,
    fingerprint,
    fingerprint_mismatch,
    float_mismatch,
    iter_tensor_leaves,
    special_codes,
    structure_errors,
)
from forge.checking.expectation import (
    Expectation,
    LeafKind,
    ReferenceFailure,
    build_expectation,
    call_quietly,
    input_leaves,
    leaf_value_issues,
    storage_ptr,
    synchronize_devices,
    tensor_bytes,
)
from forge.checking.inputs import as_sample, materialise
from forge.checking.poison import POISON_LARGE, POISON_NAN, PoisonFreshAllocations, PoisonPattern, poison_allocator
from forge.checking.remote import remote_of
from forge.checking.tolerance import resolve_tolerances
from forge.outcome import (
    CandidateAbort,
    CandidateCall,
    HarnessError,
    Outcome,
    ValidationIssue,
    is_memory_exhaustion,
    watch_interrupts,
)
from forge.samples import Sample, TensorSpec, draw_sample, map_values
from forge.text import clip

__all__ = [
    "LARGE_INPUT_BYTES",
    "LARGE_INPUT_FRESH_ROUNDS",
    "SLOW_REFERENCE_S",
    "ValidationReport",
    "fresh_rounds_for",
    "sample_input_bytes",
    "validate",
    "validate_report",
]

logger = logging.getLogger(__name__)

_MAX_ERRORS_PER_CASE = 8
_MAX_ERRORS = 64
_MAX_MESSAGE_CHARS = 1000
# Samples whose tensor inputs exceed this many bytes get at most LARGE_INPUT_FRESH_ROUNDS fresh draws (see the
# module docstring for why).
LARGE_INPUT_BYTES = 1 << 30
LARGE_INPUT_FRESH_ROUNDS = 1
SLOW_REFERENCE_S = 2.0


@dataclass(frozen=True)
class _RunPlan:
    label: str
    pattern: PoisonPattern
    dispatch: bool


_RUN_PLANS = (
    _RunPlan("run 1 (plain call)", POISON_NAN, dispatch=False),
    _RunPlan("run 2 (fresh allocations filled with NaN)", POISON_NAN, dispatch=True),
    _RunPlan("run 3 (fresh allocations filled with large values)", POISON_LARGE, dispatch=True),
    _RunPlan("run 4 (plain call, allocator poisoned with large values)", POISON_LARGE, dispatch=False),
)


@dataclass
class _RunResult:
    plan: _RunPlan
    output: Any = None
    inputs: dict[str, torch.Tensor] = field(default_factory=dict)
    error: str | None = None
    exception_type: str | None = None


@dataclass
class _CandidateState:
    """What validate learns about the candidate across cases."""

    dispatch_usable: bool = True
    check_layout: bool = True


@dataclass(frozen=True)
class ValidationReport:
    """What `validate_report` found and how much it checked.

    `issues`: what `validate` returns (empty = correct). `fresh_rounds_requested`: `fresh_inputs_per_sample`;
    `fresh_rounds_used`: per unique sample, after the caps (see the module docstring). `cases_checked`:
    cases whose expectation was built and the candidate run (a case is one input: captured or a fresh draw);
    `cases_skipped`: fresh draws the reference rejected. `largest_input_bytes` / `largest_output_bytes`: of the
    largest case, the unit of the oracle's memory bound (see the module docstring)."""

    issues: tuple[ValidationIssue, ...]
    fresh_rounds_requested: int
    fresh_rounds_used: tuple[int, ...]
    cases_checked: int
    cases_skipped: int
    largest_input_bytes: int
    largest_output_bytes: int

    @property
    def passed(self) -> bool:
        return not self.issues

    @property
    def rounds_scaled_down(self) -> bool:
        """Whether some sample got fewer fresh rounds than requested (its inputs, or its inputs and outputs, exceed
        `LARGE_INPUT_BYTES`, or the reference took over `SLOW_REFERENCE_S` on its captured case)."""
        return any(used < self.fresh_rounds_requested for used in self.fresh_rounds_used)


@dataclass
class _Tally:
    """Counts `validate_report` keeps while it runs."""

    checked: int = 0
    skipped: int = 0
    input_bytes: int = 0
    output_bytes: int = 0
    reference_s: float = 0.0  # how long the last expectation took to build (the reference's time, not the candidate's)
    case_bytes: int = 0  # inputs + outputs of the last case checked

    def record(self, input_bytes: int, output_bytes: int) -> None:
        self.checked += 1
        self.case_bytes = input_bytes + output_bytes
        if input_bytes + output_bytes > self.input_bytes + self.output_bytes:
            self.input_bytes, self.output_bytes = input_bytes, output_bytes

    def scales_down(self) -> bool:
        """Whether the case just checked earns its sample the large-input cap: the reference took over
        `SLOW_REFERENCE_S`, or its inputs and outputs together exceed `LARGE_INPUT_BYTES`."""
        return self.reference_s > SLOW_REFERENCE_S or self.case_bytes > LARGE_INPUT_BYTES


def validate(
    reference_fn: Callable[..., Any],
    candidate: Callable[..., Any],
    samples: Sequence[Sample],
    *,
    fresh_inputs_per_sample: int = 2,
    seed: int = 0,
    tolerances: Mapping[torch.dtype, tuple[float, float]] | None = None,
    error_factor: float = 4.0,
    require_deterministic: bool = True,
    check_layout: bool = True,
) -> list[ValidationIssue]:
    """Check `candidate` against `reference_fn` on `samples` plus fresh random inputs; an empty list means pass.

    Raises `HarnessError` when the harness (not the candidate) fails: see the module docstring.

    `samples` are unique `forge.samples.Sample`s (tensors or `TensorSpec`s; specs are drawn with the seed).
    `tolerances` overrides the per-dtype `(atol, rtol)` floors (`forge.checking.tolerance.DEFAULT_TOLERANCES`);
    `error_factor` scales eager PyTorch's own float64 error into the allowance. `validate_report` also says how
    many fresh rounds were used. `check_layout`: an output must have the strides PyTorch's has
    (`forge.checking.compare.layout_error`; a kernel replacing a call inside a model), off for whole-problem
    outputs compared by value only (KernelBench modules).
    """
    return list(validate_report(
        reference_fn, candidate, samples, fresh_inputs_per_sample=fresh_inputs_per_sample, seed=seed,
        tolerances=tolerances, error_factor=error_factor, require_deterministic=require_deterministic,
        check_layout=check_layout,
    ).issues)


def validate_report(
    reference_fn: Callable[..., Any],
    candidate: Callable[..., Any],
    samples: Sequence[Sample],
    *,
    fresh_inputs_per_sample: int = 2,
    seed: int = 0,
    tolerances: Mapping[torch.dtype, tuple[float, float]] | None = None,
    error_factor: float = 4.0,
    require_deterministic: bool = True,
    check_layout: bool = True,
) -> ValidationReport:
    """`validate`, returning a `ValidationReport` (the issues, the fresh rounds used, the problem's size)."""
    if not callable(reference_fn) or not callable(candidate):
        raise TypeError("validate(reference_fn, candidate, samples): reference_fn and candidate must be callables")
    if isinstance(fresh_inputs_per_sample, bool) or not isinstance(fresh_inputs_per_sample, int):
        raise TypeError(f"fresh_inputs_per_sample must be an int >= 0, got {fresh_inputs_per_sample!r}")
    if fresh_inputs_per_sample < 0:
        raise ValueError(f"fresh_inputs_per_sample must be >= 0, got {fresh_inputs_per_sample}")
    if not (isinstance(error_factor, (int, float)) and math.isfinite(error_factor) and error_factor >= 0):
        raise ValueError(f"error_factor must be a finite number >= 0, got {error_factor!r}")
    table = resolve_tolerances(tolerances)
    unique = [as_sample(s, i) for i, s in enumerate(samples)]
    if not unique:
        raise ValueError("validate needs at least one sample; nothing would be checked")

    # Trusted compilers opt out of the dispatch-mode runs: a torch.compile'd function called under a
    # TorchDispatchMode is recompiled into a different (eager-like) graph, which would then be what gets
    # benchmarked. Such candidates still get the plain runs and, on CUDA, the poisoned allocator.
    trusted_compiler = not getattr(candidate, "allows_dispatch_poisoning", True)
    state = _CandidateState(dispatch_usable=not trusted_compiler, check_layout=bool(check_layout))
    # PyTorch's own kernels (torch.compile) are as deterministic as PyTorch: agreement within the allowance.
    require_deterministic = require_deterministic and not trusted_compiler
    with watch_interrupts():  # a KeyboardInterrupt raised by the candidate is contained, the user's Ctrl-C is not
        return _validate_all(reference_fn, CandidateCall(candidate), unique, fresh_inputs_per_sample, seed, table,
                             float(error_factor), require_deterministic, state)


def sample_input_bytes(sample: Sample) -> int:
    """Bytes of a sample's tensor inputs (tensors and `TensorSpec`s, as laid out: numel times element size)."""
    sizes: list[int] = []

    def visit(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            sizes.append(value.numel() * value.element_size())
        elif isinstance(value, TensorSpec):
            sizes.append(math.prod(value.shape) * torch.empty((), dtype=value.dtype).element_size())
        return value

    map_values((tuple(sample.args), dict(sample.kwargs)), visit)
    return sum(sizes)


def fresh_rounds_for(requested: int, input_bytes: int) -> int:
    """Fresh draws for a sample with `input_bytes` of inputs: `requested`, capped at `LARGE_INPUT_FRESH_ROUNDS`
    above `LARGE_INPUT_BYTES` (see the module docstring)."""
    return min(requested, LARGE_INPUT_FRESH_ROUNDS) if input_bytes > LARGE_INPUT_BYTES else requested


def _validate_all(
    reference_fn: Callable[..., Any],
    candidate: Callable[..., Any],
    unique: list[Sample],
    fresh_inputs_per_sample: int,
    seed: int,
    table: Mapping[torch.dtype, tuple[float, float]],
    error_factor: float,
    require_deterministic: bool,
    state: _CandidateState,
) -> ValidationReport:
    errors: list[ValidationIssue] = []
    rounds_used: list[int] = []
    tally = _Tally()
    for index, sample in enumerate(unique):
        generator = torch.Generator().manual_seed(seed + index)
        rounds = fresh_rounds_for(fresh_inputs_per_sample, sample_input_bytes(sample))
        if rounds < fresh_inputs_per_sample:
            logger.info("sample %d: inputs over %d bytes, %d fresh round(s) instead of %d", index, LARGE_INPUT_BYTES,
                        rounds, fresh_inputs_per_sample)
        round_index = 0
        while round_index <= rounds:
            label = "captured" if round_index == 0 else f"fresh #{round_index}"
            draw = materialise if round_index == 0 else draw_sample
            case = _harness_step("drawing the inputs", lambda: draw(sample, generator))  # noqa: B023
            prefix = f"sample {index} ({label}) {case.describe()}"
            case_errors = _validate_case(
                reference_fn, candidate, case, round_index == 0, table, error_factor, require_deterministic, state,
                tally,
            )
            del case  # a drawn case is released before the next one is drawn
            if len(case_errors) > _MAX_ERRORS_PER_CASE:
                hidden = len(case_errors) - _MAX_ERRORS_PER_CASE
                more = ValidationIssue(f"... and {hidden} more problems", kind=case_errors[-1].kind)
                case_errors = case_errors[:_MAX_ERRORS_PER_CASE] + [more]
            errors += [e.derive(f"{prefix}: {e}", sample=index, case=label) for e in case_errors]
            if round_index == 0 and rounds > LARGE_INPUT_FRESH_ROUNDS and tally.scales_down():
                logger.info("sample %d: the reference took %.1f s for %d bytes of inputs and outputs, %d fresh "
                            "round(s) instead of %d", index, tally.reference_s, tally.case_bytes,
                            LARGE_INPUT_FRESH_ROUNDS, rounds)
                rounds = LARGE_INPUT_FRESH_ROUNDS
            round_index += 1
        rounds_used.append(rounds)
    if len(errors) > _MAX_ERRORS:
        hidden = len(errors) - _MAX_ERRORS
        more = ValidationIssue(f"... and {hidden} more errors not shown", kind=errors[-1].kind)
        errors = errors[:_MAX_ERRORS] + [more]
    return ValidationReport(tuple(errors), fresh_inputs_per_sample, tuple(rounds_used), tally.checked, tally.skipped,
                            tally.input_bytes, tally.output_bytes)


def _harness_step(what: str, step: Callable[[], Any]) -> Any:
    """Run one of the harness's own steps; its failure is a `HarnessError`."""
    try:
        return step()
    except Exception as exc:  # noqa: BLE001 - our failure, never the candidate's
        raise HarnessError(f"the harness failed {what}: {type(exc).__name__}: {_clip(str(exc))}",
                           out_of_memory=is_memory_exhaustion(exc)) from exc


def _build_expectation(reference_fn: Callable[..., Any], case: Sample, captured: bool,
                       table: Mapping[torch.dtype, tuple[float, float]], error_factor: float) -> Expectation | None:
    """The case's expectation; None for a fresh draw the reference rejects; `HarnessError` for our failures."""
    try:
        return build_expectation(reference_fn, case, table, error_factor)
    except ReferenceFailure as exc:
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        out_of_memory = is_memory_exhaustion(cause)
        if captured or out_of_memory:
            what = "ran out of memory" if out_of_memory else "raised"
            kind = "captured sample" if captured else "fresh input"
            raise HarnessError(f"the reference {what} on a {kind} ({_clip(str(exc))}); the candidate cannot be "
                               "judged", out_of_memory=out_of_memory) from cause
        logger.debug("skipping a drawn input the reference rejects: %s", exc)
        return None
    except Exception as exc:  # noqa: BLE001 - the expectation is ours to build
        raise HarnessError(f"the harness failed building the expected results: {type(exc).__name__}: "
                           f"{_clip(str(exc))}", out_of_memory=is_memory_exhaustion(exc)) from exc


def _validate_case(
    reference_fn: Callable[..., Any],
    candidate: Callable[..., Any],
    case: Sample,
    captured: bool,
    table: Mapping[torch.dtype, tuple[float, float]],
    error_factor: float,
    require_deterministic: bool,
    state: _CandidateState,
    tally: _Tally,
) -> list[ValidationIssue]:
    started = time.perf_counter()
    expectation = _build_expectation(reference_fn, case, captured, table, error_factor)  # synchronises the devices
    tally.reference_s = time.perf_counter() - started
    if expectation is None:
        tally.skipped += 1
        return []
    tally.record(tensor_bytes((tuple(case.args), dict(case.kwargs))), expectation.output_bytes)
    metas = [(m.shape, m.dtype, m.device) for _, m in expectation.output_metas()]
    checker = _RunChecker(expectation, case, require_deterministic,
                          reference_varies=lambda: _reference_varies(reference_fn, case),
                          check_layout=state.check_layout)
    for plan in _RUN_PLANS:
        if plan.dispatch and not state.dispatch_usable:
            continue
        result = _run_candidate(candidate, case, plan, metas)
        if result.error is not None and plan.dispatch:
            retry_label = f"{plan.label.split(' (')[0]} (retried without the poisoning mode)"
            retry_plan = _RunPlan(retry_label, plan.pattern, dispatch=False)
            retry = _run_candidate(candidate, case, retry_plan, metas)
            if retry.error is None:
                logger.debug(
                    "candidate fails only under the poisoning dispatch mode (%s); using allocator poisoning only",
                    result.error,
                )
                state.dispatch_usable = False
                result = retry
            del retry
        if result.error is not None:
            on_run = "" if not checker.runs else f" on {plan.label}"
            return [ValidationIssue(f"candidate raised {result.error}{on_run}", kind=Outcome.RUNTIME_ERROR,
                                    run=plan.label, exception_type=result.exception_type)]
        _checking(checker.check, result)
        del result  # the output and the input clones go before the next run (see _RunChecker for what stays)
    return _checking(checker.issues)


def _checking(step: Callable[..., Any], *args: Any) -> Any:
    """Run one of our checks of a structurally matching result; its failure is a `HarnessError`."""
    try:
        return step(*args)
    except Exception as exc:  # noqa: BLE001 - the structure matched, so a failing check is ours
        logger.warning("could not check a candidate result", exc_info=True)
        raise HarnessError(f"the harness failed checking the candidate's result: {type(exc).__name__}: "
                           f"{_clip(str(exc))}", out_of_memory=is_memory_exhaustion(exc)) from exc


def _run_candidate(
    candidate: Callable[..., Any],
    case: Sample,
    plan: _RunPlan,
    metas: list[tuple[tuple[int, ...], torch.dtype, torch.device]],
) -> _RunResult:
    inputs = _harness_step("copying the inputs", case.clone)
    remote = remote_of(candidate)  # runs in another process, which poisons its own allocator (forge.checking.remote)
    if remote is None:
        _harness_step("poisoning the allocator", lambda: poison_allocator(metas, plan.pattern))
    try:
        if remote is not None:
            output = remote.call(inputs, plan.pattern, plan.dispatch, metas)
        elif plan.dispatch:
            with PoisonFreshAllocations(plan.pattern):
                output = call_quietly(candidate, inputs)
        else:
            output = call_quietly(candidate, inputs)
        synchronize_devices(inputs, output)
    except Exception as exc:  # noqa: BLE001 - the candidate's failure becomes an issue (CandidateAbort included)
        cause = exc.__cause__ if isinstance(exc, CandidateAbort) and exc.__cause__ is not None else exc
        return _RunResult(plan, error=_describe_exception(cause), exception_type=type(cause).__name__)
    return _RunResult(plan, output=output, inputs=dict(input_leaves(inputs)))


def _describe_exception(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {_clip(str(exc))}"
    frames = traceback.extract_tb(exc.__traceback__)
    if frames:
        last = frames[-1]
        text += f" (at {last.filename}:{last.lineno} in {last.name})"
    return text


def _clip(text: str) -> str:
    return clip(text, _MAX_MESSAGE_CHARS, collapse=False)


def _mismatch(message: str, **fields: Any) -> ValidationIssue:
    return ValidationIssue(message, kind=Outcome.MISMATCH, **fields)


def _run_name(plan: _RunPlan) -> str:
    return plan.label.split(" (")[0]


class _StrongRef:
    """Stands in for `StorageWeakRef` where torch lacks it: keeps the storage alive (the old, costlier check)."""

    def __init__(self, storage: Any) -> None:
        self.storage = storage

    def expired(self) -> bool:
        return False


def _storage_ref(tensor: torch.Tensor) -> Any:
    try:
        from torch.multiprocessing.reductions import StorageWeakRef
    except ImportError:  # pragma: no cover - present in every torch this project supports
        return _StrongRef(tensor.untyped_storage())
    return StorageWeakRef(tensor.untyped_storage())


@dataclass(frozen=True)
class _Owner:
    """An output storage an earlier run returned: the run, the leaf, and a weak reference to the storage."""

    run_name: str
    locator: str
    ref: Any

    def alive(self) -> bool:
        return not self.ref.expired()


@dataclass
class _FirstRun:
    """The first structurally correct run of a kind: its fingerprints, or (non-deterministic mode) the run."""

    plan: _RunPlan
    fingerprints: dict[str, torch.Tensor] = field(default_factory=dict)
    run: _RunResult | None = None


class _RunChecker:
    """Checks each run of one case as soon as it finishes, keeping only what later runs are compared with: weak
    references to earlier output storages, the fingerprints of the first run of each kind (or, when
    `require_deterministic` is off, that run itself), and the problems found, composed by `issues()` at the end."""

    def __init__(self, expectation: Expectation, case: Sample, require_deterministic: bool,
                 reference_varies: Callable[[], bool] = lambda: False, check_layout: bool = True) -> None:
        self.expectation = expectation
        self.check_layout = check_layout
        self.case = case
        self.require_deterministic = require_deterministic
        self.reference_varies = reference_varies
        self.runs = 0
        self.checked: list[tuple[_RunPlan, list[ValidationIssue]]] = []
        self.reused: list[ValidationIssue] = []
        self.nondeterministic: dict[bool, list[ValidationIssue]] = {False: [], True: []}
        self._owners: dict[int, _Owner] = {}
        self._firsts: dict[bool, _FirstRun] = {}

    def check(self, run: _RunResult) -> None:
        self.runs += 1
        structure = structure_errors(self.expectation.skeleton, run.output, "output", strides=self.check_layout)
        if structure:
            self.checked.append((run.plan, [_mismatch(p, leaf=p.split(":", 1)[0]) for p in structure]))
            return
        expected = self.expectation.unseal()
        self.checked.append((run.plan, _check_one_run(self.expectation, expected, self.case, run)))
        self.reused += self._reused_output_memory(run)
        self.nondeterministic[run.plan.dispatch] += self._determinism_errors(expected, run)

    def issues(self) -> list[ValidationIssue]:
        errors: list[ValidationIssue] = []
        failing = [(plan, problems) for plan, problems in self.checked if problems]
        if failing:
            first_plan, first_problems = failing[0]
            hint = ""
            if all(plan.dispatch for plan, _ in failing):
                hint = (
                    " (hint: the plain runs pass but runs with poisoned fresh allocations fail, so some output "
                    "memory is never written)"
                )
            label = first_plan.label
            errors += [p.derive(f"{label}: {p}", run=label) for p in first_problems]
            others = [_run_name(plan) for plan, _ in failing[1:]]
            suffix = (" (also wrong on " + ", ".join(others) + ")" if others else "") + hint
            errors[-1] = errors[-1].derive(errors[-1] + suffix)
        nondeterministic = self.nondeterministic[False] + self.nondeterministic[True]
        if nondeterministic and not errors and self.reference_varies():
            # PyTorch itself gives different bits on identical calls here (atomics, split reductions): every run
            # already matched the float64 reference within the allowance, so bitwise agreement is not required.
            logger.info("runs differ bitwise but so does the reference on the same inputs; not held against the "
                        "candidate: %s", nondeterministic[0])
            nondeterministic = []
        return errors + self.reused + nondeterministic

    def _reused_output_memory(self, run: _RunResult) -> list[ValidationIssue]:
        """Outputs of different calls must not share memory: a caller keeps earlier results while calling again.
        A storage an earlier run returned that is still alive (we released ours) is held by the candidate."""
        run_name = _run_name(run.plan)
        errors: list[ValidationIssue] = []
        for locator, tensor in iter_tensor_leaves(run.output, "output"):
            pointer = storage_ptr(tensor) if tensor.numel() else 0
            if not pointer:
                continue
            owner = self._owners.get(pointer)
            if owner is not None and owner.run_name != run_name and owner.alive():
                errors.append(_mismatch(
                    f"{locator}: {run_name} returned the same memory as {owner.run_name} ({owner.locator}): the "
                    "candidate reuses an output buffer across calls, so a later call overwrites a result the caller "
                    "still holds", leaf=locator, run=run.plan.label,
                ))
                break
            if owner is None or not owner.alive():
                self._owners[pointer] = _Owner(run_name, locator, _storage_ref(tensor))
        return errors

    def _determinism_errors(self, expected: dict[str, torch.Tensor], run: _RunResult) -> list[ValidationIssue]:
        kind = run.plan.dispatch
        first = self._firsts.get(kind)
        if self.require_deterministic:
            prints = {name: fingerprint(t) for name, t in _compared_leaves(self.expectation, run)}
            if first is None:
                self._firsts[kind] = _FirstRun(run.plan, fingerprints=prints)
                return []
            shapes = {name: tuple(as_real(t).shape) for name, t in _compared_leaves(self.expectation, run)}
            names = (_run_name(first.plan), _run_name(run.plan))
            problems = [(name, fingerprint_mismatch(first.fingerprints[name], prints[name], shapes[name], names))
                        for name in prints]
        else:
            if first is None:
                self._firsts[kind] = _FirstRun(run.plan, run=run)
                return []
            assert first.run is not None
            problems = _within_allowance(self.expectation, expected, first.run, run)
        return [
            _mismatch(f"{run.plan.label} vs {first.plan.label}: {name}: identical calls gave different results "
                      f"(non-deterministic or stateful kernel): {problem}", leaf=name.removeprefix("input "),
                      run=run.plan.label)
            for name, problem in problems if problem
        ]


def _reference_varies(reference_fn: Callable[..., Any], case: Sample, calls: int = 4) -> bool:
    """Whether the reference itself returns different bits on identical calls with these inputs (up to `calls`
    calls, each on fresh clones); asked only when a candidate's runs disagree."""
    first: list[torch.Tensor] | None = None
    for _ in range(calls):
        inputs = case.clone()
        try:
            output = call_quietly(reference_fn, inputs)
            synchronize_devices(inputs, output)
        except Exception:  # noqa: BLE001 - a reference that fails here was judged elsewhere; no waiver
            return False
        prints = [fingerprint(t) for _, t in iter_tensor_leaves(output, "output")]
        if first is None:
            first = prints
        elif any(not torch.equal(a, b) for a, b in zip(first, prints, strict=True)):
            return True
    return False


def _compared_leaves(expectation: Expectation, run: _RunResult) -> list[tuple[str, torch.Tensor]]:
    """What runs of one kind must agree on: the output leaves and the inputs the reference mutates."""
    leaves = list(iter_tensor_leaves(run.output, "output"))
    return leaves + [(f"input {loc}", run.inputs[loc]) for loc in expectation.mutated_inputs]


def _within_allowance(
    expectation: Expectation, expected: dict[str, torch.Tensor], first: _RunResult, later: _RunResult
) -> list[tuple[str, str | None]]:
    """Non-deterministic mode: floating leaves within the allowance of the first run, others bitwise."""
    firsts = dict(_compared_leaves(expectation, first))
    problems: list[tuple[str, str | None]] = []
    for name, b in _compared_leaves(expectation, later):
        a = firsts[name]
        locator = name.removeprefix("input ")
        if expectation.leaf_kinds.get(locator) != LeafKind.FLOAT:
            problems.append((name, bits_mismatch(a, b, (_run_name(first.plan), _run_name(later.plan)))))
            continue
        a_real = as_real(a.detach())
        problems.append((name, float_mismatch(b, a_real, expected[f"{locator}/allowed"], special_codes(a_real))))
    return problems


def _check_one_run(
    expectation: Expectation, expected: dict[str, torch.Tensor], case: Sample, run: _RunResult
) -> list[ValidationIssue]:
    """Value, input and aliasing problems of one structurally correct run."""
    got = dict(iter_tensor_leaves(run.output, "output"))
    errors = leaf_value_issues(expectation, expected, {**run.inputs, **got})
    for locator, before in input_leaves(case):
        if locator in expectation.mutated_inputs:
            continue
        problem = bits_mismatch(before, run.inputs[locator], ("before", "after"))
        if problem:
            errors.append(_mismatch(
                f"input {locator}: the candidate modified an input the reference leaves unchanged: {problem}",
                leaf=locator))
    for out_locator, in_locator in expectation.aliases.items():
        if storage_ptr(got[out_locator]) != storage_ptr(run.inputs[in_locator]):
            errors.append(_mismatch(
                f"{out_locator}: the reference updates input {in_locator} in place and returns it, but the "
                "candidate's output does not share that input's memory", leaf=out_locator))
    return errors
