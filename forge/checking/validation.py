"""`validate`: the harness-owned correctness oracle every candidate kernel must pass.

For each unique sample, the captured inputs and `fresh_inputs_per_sample` fresh random inputs drawn from the
sample's specs (seeded: `seed + sample index`) are each checked like this:

1. The reference runs on clones of the inputs, natively and in float64 (`forge.checking.expectation`); the
   expected numbers are sealed away before the candidate runs.
2. The candidate runs four times, each on fresh clones of the inputs, after poisoning the allocator:
   run 1 plain; runs 2 and 3 under `PoisonFreshAllocations` (NaN, then large values); run 4 plain again after
   poisoning the allocator with large values. Plain runs come first because a `torch.compile`d function first
   called under a dispatch mode stays uncompiled (and under a mode it runs eagerly); if a run raises only under
   the dispatch mode, it is retried plainly and the mode is dropped for this candidate. A candidate whose
   `allows_dispatch_poisoning` attribute is False (trusted compilers such as `CompiledFunctionProvider`) skips
   the dispatch-mode runs.
3. Every run is checked against the expectation: structure (exact `torch.Tensor` type, shape, dtype, device),
   values within the allowance of `forge.checking.tolerance`, NaN/inf placement, integer/bool outputs exact,
   inputs untouched unless the reference mutates them (then they must match like outputs), and outputs that
   alias a mutated input in the reference must alias it in the candidate too.
4. Outputs of different runs must not share memory (a reused output buffer breaks callers that keep results).
5. Runs of the same kind (plain vs plain, poisoned vs poisoned) must agree bitwise (NaN-aware) when
   `require_deterministic`, else within the allowance.

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
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from forge.checking.compare import (
    FINITE,
    bits_mismatch,
    exact_mismatch_issue,
    float_mismatch,
    float_mismatch_issue,
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
    storage_ptr,
    synchronize_devices,
)
from forge.checking.inputs import as_sample, materialise
from forge.checking.poison import POISON_LARGE, POISON_NAN, PoisonFreshAllocations, PoisonPattern, poison_allocator
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
from forge.samples import Sample, clone_value, draw_sample

__all__ = ["validate"]

logger = logging.getLogger(__name__)

_MAX_ERRORS_PER_CASE = 8
_MAX_ERRORS = 64
_MAX_MESSAGE_CHARS = 1000


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
) -> list[ValidationIssue]:
    """Check `candidate` against `reference_fn` on `samples` plus fresh random inputs; an empty list means pass.

    Raises `HarnessError` when the harness (not the candidate) fails: see the module docstring.

    `samples` are unique `forge.samples.Sample`s (tensors or `TensorSpec`s; specs are drawn with the seed).
    `tolerances` overrides the per-dtype `(atol, rtol)` floors (`forge.checking.tolerance.DEFAULT_TOLERANCES`);
    `error_factor` scales eager PyTorch's own float64 error into the allowance.
    """
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
    state = _CandidateState(dispatch_usable=bool(getattr(candidate, "allows_dispatch_poisoning", True)))
    with watch_interrupts():  # a KeyboardInterrupt raised by the candidate is contained, the user's Ctrl-C is not
        return _validate_all(reference_fn, CandidateCall(candidate), unique, fresh_inputs_per_sample, seed, table,
                             float(error_factor), require_deterministic, state)


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
) -> list[ValidationIssue]:
    errors: list[ValidationIssue] = []
    for index, sample in enumerate(unique):
        generator = torch.Generator().manual_seed(seed + index)
        captured = _harness_step("drawing the inputs", lambda: materialise(sample, generator))  # noqa: B023
        cases = [("captured", captured)]
        cases += [(f"fresh #{j + 1}", None) for j in range(fresh_inputs_per_sample)]
        for label, case in cases:
            if case is None:
                case = _harness_step("drawing the inputs", lambda: draw_sample(sample, generator))  # noqa: B023
            prefix = f"sample {index} ({label}) {case.describe()}"
            case_errors = _validate_case(
                reference_fn, candidate, case, label == "captured", table, error_factor, require_deterministic, state,
            )
            if len(case_errors) > _MAX_ERRORS_PER_CASE:
                hidden = len(case_errors) - _MAX_ERRORS_PER_CASE
                more = ValidationIssue(f"... and {hidden} more problems", kind=case_errors[-1].kind)
                case_errors = case_errors[:_MAX_ERRORS_PER_CASE] + [more]
            errors += [e.derive(f"{prefix}: {e}", sample=index, case=label) for e in case_errors]
    if len(errors) > _MAX_ERRORS:
        hidden = len(errors) - _MAX_ERRORS
        more = ValidationIssue(f"... and {hidden} more errors not shown", kind=errors[-1].kind)
        errors = errors[:_MAX_ERRORS] + [more]
    return errors


def _harness_step(what: str, step: Callable[[], Any]) -> Any:
    """Run one of the harness's own steps; its failure is a `HarnessError`."""
    try:
        return step()
    except Exception as exc:  # noqa: BLE001 - our failure, never the candidate's
        raise HarnessError(f"the harness failed {what}: {type(exc).__name__}: {_clip(str(exc))}",
                           out_of_memory=is_memory_exhaustion(exc)) from exc


def _validate_case(
    reference_fn: Callable[..., Any],
    candidate: Callable[..., Any],
    case: Sample,
    captured: bool,
    table: Mapping[torch.dtype, tuple[float, float]],
    error_factor: float,
    require_deterministic: bool,
    state: _CandidateState,
) -> list[ValidationIssue]:
    try:
        expectation = build_expectation(reference_fn, case, table, error_factor)
    except ReferenceFailure as exc:
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        out_of_memory = is_memory_exhaustion(cause)
        if captured or out_of_memory:
            what = "ran out of memory" if out_of_memory else "raised"
            kind = "captured sample" if captured else "fresh input"
            raise HarnessError(f"the reference {what} on a {kind} ({_clip(str(exc))}); the candidate cannot be "
                               "judged", out_of_memory=out_of_memory) from cause
        logger.debug("skipping a drawn input the reference rejects: %s", exc)
        return []
    except Exception as exc:  # noqa: BLE001 - the expectation is ours to build
        raise HarnessError(f"the harness failed building the expected results: {type(exc).__name__}: "
                           f"{_clip(str(exc))}", out_of_memory=is_memory_exhaustion(exc)) from exc

    metas = [(m.shape, m.dtype, m.device) for _, m in expectation.output_metas()]
    runs: list[_RunResult] = []
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
        if result.error is not None:
            on_run = "" if not runs else f" on {plan.label}"
            return [ValidationIssue(f"candidate raised {result.error}{on_run}", kind=Outcome.RUNTIME_ERROR,
                                    run=plan.label, exception_type=result.exception_type)]
        runs.append(result)

    try:
        return _check_runs(expectation, case, runs, require_deterministic)
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
    inputs = _harness_step("copying the inputs", lambda: Sample(clone_value(tuple(case.args)),
                                                                clone_value(dict(case.kwargs))))
    _harness_step("poisoning the allocator", lambda: poison_allocator(metas, plan.pattern))
    try:
        if plan.dispatch:
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
    text = text.strip()
    return text if len(text) <= _MAX_MESSAGE_CHARS else text[: _MAX_MESSAGE_CHARS - 3] + "..."


def _mismatch(message: str, **fields: Any) -> ValidationIssue:
    return ValidationIssue(message, kind=Outcome.MISMATCH, **fields)


def _check_runs(
    expectation: Expectation, case: Sample, runs: list[_RunResult], require_deterministic: bool
) -> list[ValidationIssue]:
    expected = expectation.unseal()
    per_run: list[list[ValidationIssue]] = []
    structurally_ok: list[_RunResult] = []
    for run in runs:
        structure = structure_errors(expectation.skeleton, run.output, "output")
        if structure:
            per_run.append([_mismatch(p, leaf=p.split(":", 1)[0]) for p in structure])
        else:
            per_run.append(_check_one_run(expectation, expected, case, run))
            structurally_ok.append(run)
    errors: list[ValidationIssue] = []
    failing = [i for i, problems in enumerate(per_run) if problems]
    if failing:
        first = failing[0]
        hint = ""
        if all(runs[i].plan.dispatch for i in failing):
            hint = (
                " (hint: the plain runs pass but runs with poisoned fresh allocations fail, so some output memory "
                "is never written)"
            )
        label = runs[first].plan.label
        errors += [p.derive(f"{label}: {p}", run=label) for p in per_run[first]]
        others = [runs[i].plan.label.split(" (")[0] for i in failing[1:]]
        suffix = (" (also wrong on " + ", ".join(others) + ")" if others else "") + hint
        errors[-1] = errors[-1].derive(errors[-1] + suffix)
    errors += _reused_output_memory(structurally_ok)
    for plain in (True, False):
        group = [run for run in structurally_ok if run.plan.dispatch != plain]
        for later in group[1:]:
            errors += _determinism_errors(expectation, expected, group[0], later, require_deterministic)
    return errors


def _reused_output_memory(runs: list[_RunResult]) -> list[ValidationIssue]:
    """Outputs of different calls must not share memory: a caller keeps earlier results while calling again."""
    owners: dict[int, tuple[str, str]] = {}
    errors: list[ValidationIssue] = []
    for run in runs:
        run_name = run.plan.label.split(" (")[0]
        for locator, tensor in iter_tensor_leaves(run.output, "output"):
            pointer = storage_ptr(tensor) if tensor.numel() else 0
            if not pointer:
                continue
            owner = owners.get(pointer)
            if owner is not None and owner[0] != run_name:
                errors.append(_mismatch(
                    f"{locator}: {run_name} returned the same memory as {owner[0]} ({owner[1]}): the candidate reuses "
                    "an output buffer across calls, so a later call overwrites a result the caller still holds",
                    leaf=locator, run=run.plan.label,
                ))
                break
            owners.setdefault(pointer, (run_name, locator))
    return errors


def _check_one_run(
    expectation: Expectation, expected: dict[str, torch.Tensor], case: Sample, run: _RunResult
) -> list[ValidationIssue]:
    """Value, input and aliasing problems of one structurally correct run."""
    got = dict(iter_tensor_leaves(run.output, "output"))
    errors: list[ValidationIssue] = []
    for locator, kind in expectation.leaf_kinds.items():
        is_output = locator.startswith("output")
        value = got[locator] if is_output else run.inputs[locator]
        if kind == LeafKind.EXACT:
            problem = exact_mismatch_issue(value, expected[f"{locator}/exact"])
        else:
            problem = float_mismatch_issue(
                value, expected[f"{locator}/reference"], expected[f"{locator}/allowed"], expected[f"{locator}/special"]
            )
        if problem:
            name = locator if is_output else f"input {locator} (updated in place by the reference)"
            errors.append(problem.derive(f"{name}: {problem}", leaf=locator))
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


def _determinism_errors(
    expectation: Expectation,
    expected: dict[str, torch.Tensor],
    first: _RunResult,
    later: _RunResult,
    require_deterministic: bool,
) -> list[ValidationIssue]:
    first_got = dict(iter_tensor_leaves(first.output, "output"))
    later_got = dict(iter_tensor_leaves(later.output, "output"))
    leaves = [(loc, first_got[loc], later_got[loc]) for loc in first_got]
    leaves += [(f"input {loc}", first.inputs[loc], later.inputs[loc]) for loc in expectation.mutated_inputs]
    errors: list[ValidationIssue] = []
    for name, a, b in leaves:
        locator = name.removeprefix("input ")
        if require_deterministic or expectation.leaf_kinds.get(locator) != LeafKind.FLOAT:
            problem = bits_mismatch(a, b, (first.plan.label.split(" (")[0], later.plan.label.split(" (")[0]))
        else:
            a64 = a.detach().to(torch.float64) if not a.is_complex() else torch.view_as_real(a).to(torch.float64)
            special = special_codes(a64)
            problem = float_mismatch(
                b, torch.where(special == FINITE, a64, torch.zeros_like(a64)), expected[f"{locator}/allowed"], special
            )
        if problem:
            errors.append(_mismatch(
                f"{later.plan.label} vs {first.plan.label}: {name}: identical calls gave different results "
                f"(non-deterministic or stateful kernel): {problem}", leaf=locator, run=later.plan.label))
    return errors
