"""Probes run after `validate` passes: call patterns a kernel cannot predict, so it cannot tell when it is judged.

WHY (kernels that tell judged calls from the others). `validate` makes a fixed, visible number of calls (captured + 2
fresh inputs x 4 runs = 12 per signature) on fresh clones: a kernel correct for 12 calls and wrong afterwards was
selected at 7.8x, a cache keyed by a sparse value fingerprint serving from the 5th sighting at 3.5x, a cache keyed by
`data_ptr` passed because no call followed an in-place update of an input, and on the H200 a background thread finished
its writes before `validate` compared. Each probe below returns `forge.outcome.ValidationIssue`s whose `run` is the
`Probe`:

- `wide inputs`: one call per sample on a wide draw (`forge.checking.distribution.wide_sample`): several times the
  captured spread, at least unit spread, outliers. Degenerate outputs (zeros, a constant softmax) fail there.
- `extra calls`: a random number of further calls (seeded from `os.urandom`, so no two runs share a pattern), each on
  new values of a random sample's shape (normal or wide draws) and each output checked against the reference.
- `in-place update`: the same tensor objects are passed a random number of times, then updated in place (one random
  element per floating input, moved far from its value; twice) and passed again: the output must follow (a cache
  keyed by address or by a sparse value fingerprint serves a stale result; two random elements slip past a
  fingerprint of every 61st element with probability 1/3721).
- `input dependence`: across the single-element update, the output must change wherever the reference's changes by
  more than a quarter of the allowance (and a few rounding units), even where both stay within tolerance.
- `offset view`: the same call on views at a non-zero storage offset (`x[1:]` of a larger buffer) with the captured
  16-byte alignment, the storage around them filled with NaN / extreme values: a kernel that rebuilds its input
  from the storage start or hard-codes the captured offset reads poison. Tensors captured as views move to another
  offset; for samples captured without offsets a candidate that raises on views is left alone (the signature guard
  never sends it one), one that returns wrong values is not.
- `quiescence`: a call must not return while a thread it started is still running, and every output, re-read after
  the devices are synchronised and `quiescence_wait_s` has passed (other threads ran meanwhile), must be bitwise what
  it was when the call returned.

Memory (measured: at KernelBench's [112, 64, 512, 512] fp32 the probes, not `validate`, held 15x the problem's
inputs + outputs on the CPU and ran the H200 out of memory). The in-place probe needs two expectations and two
outputs alive at once (before and after the update); everything else is one call at a time. Work on whole tensors
is done in pieces (`forge.checking.compare.iter_pieces`): the element moved by an update is found by a chunked
maximum, the dependence check walks the expectations piece by piece. A sample whose inputs exceed
`forge.checking.validation.LARGE_INPUT_BYTES` (1 GiB) gets one repeat before one update and at most one extra call
(each call there costs a float64 reference of several GB); the probe pattern is otherwise unchanged. The same scaled
pattern applies from the moment one expectation's inputs and outputs together exceed that size (a convolution that
writes 8.5 GB from 1 GiB) or it takes longer than `ProbeSettings.slow_reference_s` (1 s): KernelBench's transposed
2-D/3-D convolutions at shipped size spent 40-120 s in validation on the H200, most of it in the probes' 10-30
float64 references, while cuDNN ran them.

Cost: on CPU the defaults add 6-9 calls per sample (validate makes 12) and one 20 ms wait: measured on the loaded
2-core CI machine, +0.32 s for the interpreted Triton silu example (validate: 0.36 s) and +0.49 s for an interpreted
rms_norm (validate: 0.66 s). On CUDA more calls are drawn (4-16 extra, 2-8 repeats): a call costs microseconds.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import torch

from forge.checking.compare import (
    FINITE,
    bits_equal,
    iter_pieces,
    iter_tensor_leaves,
    structure_errors,
)
from forge.checking.distribution import wide_sample
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
)
from forge.checking.inputs import as_sample, materialise
from forge.checking.validation import LARGE_INPUT_BYTES, sample_input_bytes
from forge.outcome import CandidateAbort, HarnessError, Outcome, ValidationIssue, is_memory_exhaustion
from forge.samples import Sample, Widening, clone_value, draw_sample
from forge.text import clip

__all__ = ["Probe", "ProbeSettings", "compare_with_expectation", "run_probes"]

logger = logging.getLogger(__name__)

_MAX_ISSUES = 8
# Outputs kept (with their snapshots) for one quiescence re-read at the end; larger ones are re-read at once.
_HELD_BYTES = 256 << 20


class Probe(StrEnum):
    """Which probe found an issue (`ValidationIssue.run`)."""

    WIDE_INPUTS = "wide inputs"
    EXTRA_CALLS = "extra calls"
    IN_PLACE_UPDATE = "in-place update"
    INPUT_DEPENDENCE = "input dependence"
    OFFSET_VIEW = "offset view"
    QUIESCENCE = "quiescence"
    INTEGRITY = "integrity"


@dataclass(frozen=True)
class ProbeSettings:
    """How hard the probes push. Ranges are inclusive `(low, high)`, drawn per run; `seed` None draws the pattern
    from `os.urandom` (give a seed only to reproduce a run)."""

    enabled: bool = True
    extra_calls_cpu: tuple[int, int] = (1, 3)
    extra_calls_cuda: tuple[int, int] = (4, 16)
    repeats_before_update_cpu: tuple[int, int] = (1, 2)
    repeats_before_update_cuda: tuple[int, int] = (2, 8)
    sparse_updates: int = 2
    quiescence_wait_s: float = 0.02
    slow_reference_s: float = 1.0
    widening: Widening = field(default_factory=Widening)
    seed: int | None = None

    def __post_init__(self) -> None:
        for name in ("extra_calls_cpu", "extra_calls_cuda", "repeats_before_update_cpu", "repeats_before_update_cuda"):
            low, high = getattr(self, name)
            if not (isinstance(low, int) and isinstance(high, int) and 0 <= low <= high):
                raise ValueError(f"ProbeSettings.{name} must be (low, high) ints with 0 <= low <= high")
        if self.sparse_updates < 0 or not math.isfinite(self.quiescence_wait_s) or self.quiescence_wait_s < 0:
            raise ValueError("ProbeSettings: sparse_updates and quiescence_wait_s must be >= 0")
        if not self.slow_reference_s > 0:
            raise ValueError("ProbeSettings.slow_reference_s must be > 0")


_STARTING = threading.local()  # .collector: where the threads the current call starts go (see `_threads_started`)
_STARTING_PATCH = threading.Lock()
_original_start: Callable[[threading.Thread], None] = threading.Thread.start  # replaced by what `start` is at wrapping
_wrapped = False


def _collecting_start(thread: threading.Thread) -> None:
    """`threading.Thread.start` while any probe call ran in this process: a thread started by a thread that is in a
    call (or by a thread such a call started) is added to that call's list, and passes the list on to the threads it
    starts; any other thread starts as usual."""
    collector = getattr(_STARTING, "collector", None)
    if collector is not None:
        collector.append(thread)
        run = thread.run

        def tagged() -> None:
            _STARTING.collector = collector
            run()

        thread.run = tagged  # type: ignore[method-assign]
    _original_start(thread)


@contextlib.contextmanager
def _threads_started() -> Iterator[list[threading.Thread]]:
    """The threads started while the block runs by the thread that runs it, or by a thread it started (so a thread
    that starts another and ends is still seen); threads other code of the process starts meanwhile (the test
    runner's, a harness pool's) are not the call's. A false positive of the whole-process count failed an honest cache
    in CI under load once (an unrelated thread appeared during the call). `Thread.start` is wrapped once per process
    and left wrapped: a patch put on and taken off per call would be left behind stale when two threads probe at
    once (each restores what it found)."""
    global _original_start, _wrapped
    with _STARTING_PATCH:
        if not _wrapped:
            _original_start, _wrapped = threading.Thread.start, True
            threading.Thread.start = _collecting_start  # type: ignore[method-assign]
    started: list[threading.Thread] = []
    outer = getattr(_STARTING, "collector", None)
    _STARTING.collector = started
    try:
        yield started
    finally:
        _STARTING.collector = outer
        if outer is not None:  # a call inside a call: the inner call's threads are the outer's too
            outer.extend(started)


@dataclass
class _Held:
    """An output kept for the quiescence re-read: its leaves and their bits when the call returned."""

    label: str
    leaves: list[tuple[str, torch.Tensor, torch.Tensor]]


class _Failed(Exception):  # noqa: N818 - control flow: a probe found issues, stop probing
    def __init__(self, issues: list[ValidationIssue]) -> None:
        super().__init__(len(issues))
        self.issues = issues


@dataclass
class _Run:
    reference_fn: Callable[..., Any]
    candidate: Callable[..., Any]
    table: Mapping[torch.dtype, tuple[float, float]]
    error_factor: float
    settings: ProbeSettings
    rng: random.Random
    cuda: bool
    held: list[_Held] = field(default_factory=list)
    held_bytes: int = 0
    # Fewer calls (see the module docstring): some sample's inputs (or an expectation's inputs and outputs) exceed
    # LARGE_INPUT_BYTES, or an expectation took longer than settings.slow_reference_s.
    large: bool = False

    def range_for(self, cpu: tuple[int, int], cuda: tuple[int, int]) -> int:
        low, high = cuda if self.cuda else cpu
        return min(self.rng.randint(low, high), 1) if self.large else self.rng.randint(low, high)

    def generator(self) -> torch.Generator:
        return torch.Generator().manual_seed(self.rng.getrandbits(62))

    # -- one call -------------------------------------------------------------------------------------------
    def expect(self, inputs: Sample) -> Expectation | None:
        start = time.perf_counter()
        try:
            expectation = build_expectation(self.reference_fn, inputs, self.table, self.error_factor)
            elapsed = time.perf_counter() - start
            if not self.large and (elapsed > self.settings.slow_reference_s
                                   or sample_input_bytes(inputs) + expectation.output_bytes > LARGE_INPUT_BYTES):
                logger.debug("slow or large reference (%.1f s per expectation): scaled probe pattern", elapsed)
                self.large = True
            return expectation
        except ReferenceFailure as exc:
            cause = exc.__cause__ if exc.__cause__ is not None else exc
            if is_memory_exhaustion(cause):
                raise HarnessError(f"the reference ran out of memory on a probe input ({exc})",
                                   out_of_memory=True) from cause
            logger.debug("probe input skipped: the reference rejects it (%s)", exc)
            return None

    def call(self, probe: Probe, label: str, inputs: Sample) -> Any:
        """Call the candidate on `inputs` (the objects themselves); raise `_Failed` when it raises or leaves a thread
        running; keep the output for the quiescence re-read."""
        try:
            with _threads_started() as started:
                output = call_quietly(self.candidate, inputs)
            running = [t for t in started if t.is_alive()]
            synchronize_devices(inputs, output)
        except Exception as exc:  # noqa: BLE001 - the candidate's failure (CandidateAbort included)
            cause = exc.__cause__ if isinstance(exc, CandidateAbort) and exc.__cause__ is not None else exc
            raise _Failed([_issue(probe, label, f"candidate raised {type(cause).__name__}: {_clip(str(cause))}",
                                  kind=Outcome.RUNTIME_ERROR, exception_type=type(cause).__name__)]) from None
        if running:
            names = ", ".join(sorted(t.name for t in running))
            raise _Failed([_issue(Probe.QUIESCENCE, label, f"the call returned while a thread it started was still "
                                  f"running ({names}): work deferred to a background thread is neither timed nor "
                                  "finished when the caller reads the output")])
        inputs_storage = {storage_ptr(t) for _, t in input_leaves(inputs)}
        leaves = [(loc, t, t.detach().clone()) for loc, t in iter_tensor_leaves(output, "output")
                  if storage_ptr(t) not in inputs_storage]
        held = _Held(f"{probe.value}: {label}", leaves)
        size = sum(t.numel() * t.element_size() for _, t, _ in leaves)
        if self.held_bytes + size <= _HELD_BYTES:
            self.held.append(held)
            self.held_bytes += size
        else:  # large outputs (GBs at KernelBench sizes on the H200) are re-read now rather than kept until the end
            _reread(self.settings.quiescence_wait_s, [held])
        return output

    def checked_call(self, probe: Probe, label: str, inputs: Sample) -> tuple[Any, Expectation | None]:
        """Expectation of `inputs` (`build_expectation` runs the reference on its own copies), then the call, then
        the comparison; `_Failed` on any issue."""
        expectation = self.expect(inputs)
        output = self.call(probe, label, inputs)
        if expectation is not None:
            issues = compare_with_expectation(expectation, output, inputs)
            if issues:
                raise _Failed([_issue(probe, label, str(i), leaf=i.leaf, base=i) for i in issues])
        return output, expectation


# ---------------------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------------------
def run_probes(
    reference_fn: Callable[..., Any],
    candidate: Callable[..., Any],
    samples: Sequence[Sample],
    *,
    table: Mapping[torch.dtype, tuple[float, float]],
    error_factor: float = 4.0,
    settings: ProbeSettings | None = None,
    seed: int = 0,
) -> list[ValidationIssue]:
    """Issues found by the probes (see the module docstring); an empty list means every probe passed.

    `samples` are the unique samples `validate` judged (specs are drawn with `seed + index`, as `validate` does);
    `candidate` should already contain `BaseException`s (`forge.outcome.CandidateCall`). Raises `HarnessError` when
    the harness fails (the reference running out of memory, our own drawing failing)."""
    settings = settings if settings is not None else ProbeSettings()
    if not settings.enabled:
        return []
    unique = [as_sample(s, i) for i, s in enumerate(samples)]
    captured = [materialise(s, torch.Generator().manual_seed(seed + i)) for i, s in enumerate(unique)]
    pattern_seed = settings.seed if settings.seed is not None else int.from_bytes(os.urandom(8), "little")
    cuda = any(t.device.type == "cuda" for s in captured for _, t in input_leaves(s))
    run = _Run(reference_fn, candidate, table, float(error_factor), settings, random.Random(pattern_seed), cuda,
               large=any(sample_input_bytes(s) > LARGE_INPUT_BYTES for s in captured))
    logger.debug("probe pattern seed %d", pattern_seed)
    try:
        for index, sample in enumerate(captured):
            _wide_inputs(run, index, sample)
            _in_place_update(run, index, sample)
            _offset_view(run, index, sample)
        _extra_calls(run, captured)
        _quiescence(run)
    except _Failed as failed:
        issues = failed.issues
        if len(issues) > _MAX_ISSUES:
            issues = issues[:_MAX_ISSUES] + [ValidationIssue(f"... and {len(issues) - _MAX_ISSUES} more problems",
                                                             kind=issues[-1].kind, run=issues[-1].run)]
        return issues
    return []


# ---------------------------------------------------------------------------------------------------------
# The probes
# ---------------------------------------------------------------------------------------------------------
def _wide_inputs(run: _Run, index: int, sample: Sample) -> None:
    wide = wide_sample(sample, run.generator(), run.settings.widening)
    run.checked_call(Probe.WIDE_INPUTS, f"sample {index} {wide.describe()} drawn wider than captured", wide)


def _extra_calls(run: _Run, captured: list[Sample]) -> None:
    count = run.range_for(run.settings.extra_calls_cpu, run.settings.extra_calls_cuda)
    for call in range(count):
        index = run.rng.randrange(len(captured))
        wide = run.rng.random() < 0.5
        sample = captured[index]
        inputs = (wide_sample(sample, run.generator(), run.settings.widening) if wide
                  else draw_sample(sample, run.generator()))
        label = f"extra call {call + 1} of {count}, sample {index} with new {'wide ' if wide else ''}values"
        run.checked_call(Probe.EXTRA_CALLS, label, inputs)


def _in_place_update(run: _Run, index: int, sample: Sample) -> None:
    inputs = sample.clone()
    floating = [(loc, t) for loc, t in input_leaves(inputs) if t.is_floating_point() and t.numel() > 0]
    if not floating:
        return
    first = run.expect(inputs)
    if first is None or first.mutated_inputs:
        return  # an in-place reference changes its own inputs on every call: repeated calls are other calls
    repeats = run.range_for(run.settings.repeats_before_update_cpu, run.settings.repeats_before_update_cuda)
    output = None
    for repeat in range(max(repeats, 1)):
        output, _ = run.checked_call(Probe.IN_PLACE_UPDATE, f"sample {index}, same tensors, call {repeat + 1}", inputs)
    for _ in range(min(run.settings.sparse_updates, 1) if run.large else run.settings.sparse_updates):
        where = [(loc, _poke(t, run.rng)) for loc, t in floating]
        text = ", ".join(f"{loc} at {position}" for loc, position in where)
        label = f"sample {index}, same tensors updated in place ({text}) and passed again"
        before_expected = first.unseal()
        before = output
        output, first = run.checked_call(Probe.IN_PLACE_UPDATE, label, inputs)
        if first is None:
            return
        _check_dependence(label, first, before_expected, before, output)


def _poke(tensor: torch.Tensor, rng: random.Random) -> tuple[int, ...]:
    """Move one random element far from its value, in place; return its index."""
    index = tuple(rng.randrange(size) for size in tensor.shape)
    with torch.no_grad():
        spread = _finite_abs_max(tensor.detach())
        old = float(tensor[index])
        old = old if math.isfinite(old) else 0.0
        step = max(2.0 * spread, 1.0) * (1.0 if rng.random() < 0.5 else -1.0)
        limit = float(torch.finfo(tensor.dtype).max) / 64
        tensor[index] = max(-limit, min(limit, old + step))
    return index


def _finite_abs_max(tensor: torch.Tensor) -> float:
    """Largest finite |element| (1.0 when none is finite), computed in pieces (no full-size float64 copy)."""
    peaks = []
    for _, (piece,) in iter_pieces(tensor):
        values = piece.to(torch.float64).abs_()
        values = values[torch.isfinite(values)]
        if values.numel():
            peaks.append(values.max())
    return float(torch.stack(peaks).max()) if peaks else 1.0


def _check_dependence(
    label: str, now: Expectation, before_expected: dict[str, torch.Tensor], before: Any, after: Any
) -> None:
    """Where the reference moves by more than a quarter of the allowance (and 8 rounding units), the candidate's
    output must move too (counted piece by piece: no full-size temporaries)."""
    expected = now.unseal()
    got_before = dict(iter_tensor_leaves(before, "output"))
    got_after = dict(iter_tensor_leaves(after, "output"))
    issues = []
    for locator, kind in now.leaf_kinds.items():
        if kind != LeafKind.FLOAT or not locator.startswith("output") or locator not in got_after:
            continue
        ref_now, ref_before = expected[f"{locator}/reference"], before_expected.get(f"{locator}/reference")
        if ref_before is None or ref_before.shape != ref_now.shape:
            continue
        a, b = got_before[locator].detach(), got_after[locator].detach()
        if a.is_complex():
            a, b = torch.view_as_real(a), torch.view_as_real(b)
        eps = float(torch.finfo(_component(got_after[locator].dtype)).eps)
        count = total = 0
        for _, pieces in iter_pieces(ref_now, ref_before, expected[f"{locator}/allowed"],
                                     before_expected[f"{locator}/allowed"], expected.get(f"{locator}/special"),
                                     before_expected.get(f"{locator}/special"), a, b):
            unchanged, significant = _unchanged_where_moved(eps, *pieces)
            count, total = count + unchanged, total + significant
        if total and count > total // 100:
            issues.append(_issue(Probe.INPUT_DEPENDENCE, label,
                                 f"{locator}: {count} of {total} elements the reference changes (by more than a "
                                 "quarter of the allowance) kept their previous value: the output does not follow "
                                 "its input", leaf=locator))
    if issues:
        raise _Failed(issues)


def _unchanged_where_moved(eps: float, ref_now: torch.Tensor, ref_before: torch.Tensor, allowed_now: torch.Tensor,
                           allowed_before: torch.Tensor, special_now: torch.Tensor | None,
                           special_before: torch.Tensor | None, got_before: torch.Tensor,
                           got_after: torch.Tensor) -> tuple[int, int]:
    """One piece of `_check_dependence`: (elements that kept their value, elements the reference moved)."""
    ref_now, ref_before = ref_now.to(torch.float64), ref_before.to(torch.float64)
    moved = (ref_now - ref_before).abs_()
    allowed = torch.maximum(allowed_now, allowed_before).to(torch.float64)
    significant = (moved > allowed / 4) & (moved > 8 * eps * torch.maximum(ref_now.abs(), ref_before.abs()))
    for special in (special_now, special_before):
        if special is not None:
            significant &= special == FINITE
    unchanged = significant & (got_before.to(torch.float64) == got_after.to(torch.float64))
    return int(unchanged.sum()), int(significant.sum())


def _component(dtype: torch.dtype) -> torch.dtype:
    return {torch.complex64: torch.float32, torch.complex128: torch.float64}.get(dtype, dtype)


def _offset_view(run: _Run, index: int, sample: Sample) -> None:
    """The call on views at another storage offset; for a sample captured without offsets, a candidate that raises on
    views is left alone (the runtime guard never sends it one), one that reads the wrong place is not."""
    leaves = [t for _, t in input_leaves(sample) if t.layout == torch.strided and t.numel() > 0]
    if not leaves:
        return
    captured_views = any(t.storage_offset() != 0 for t in leaves)

    def rebase(value: Any) -> Any:
        if not isinstance(value, torch.Tensor) or value.layout != torch.strided or value.numel() == 0:
            return clone_value(value)
        if captured_views and value.storage_offset() == 0:
            return clone_value(value)
        return _at_other_offset(value)

    inputs = Sample(tuple(rebase(a) for a in sample.args), {k: rebase(v) for k, v in sample.kwargs.items()})
    label = f"sample {index} {inputs.describe()}: views at another storage offset, poison around them"
    try:
        run.checked_call(Probe.OFFSET_VIEW, label, inputs)
    except _Failed as failed:
        raised = all(i.kind == Outcome.RUNTIME_ERROR for i in failed.issues)
        if captured_views or not raised:
            raise
        logger.debug("candidate refuses views it was never given: %s", failed.issues[0])


def _at_other_offset(tensor: torch.Tensor) -> torch.Tensor:
    """The same values, shape and strides at a larger storage offset with the same address residue modulo 16 bytes;
    the rest of the storage holds NaN (floating), the dtype's maximum (integers) or True."""
    shift = 16 // math.gcd(16, tensor.element_size())
    offset = tensor.storage_offset() + shift
    span = 1 + sum((s - 1) * st for s, st in zip(tensor.shape, tensor.stride(), strict=True)) if tensor.numel() else 0
    size = offset + span + shift
    if tensor.is_floating_point() or tensor.is_complex():
        storage = torch.full((size,), float("nan"), dtype=tensor.dtype, device=tensor.device)
    elif tensor.dtype == torch.bool:
        storage = torch.ones((size,), dtype=torch.bool, device=tensor.device)
    else:
        storage = torch.full((size,), torch.iinfo(tensor.dtype).max, dtype=tensor.dtype, device=tensor.device)
    view = storage.as_strided(tuple(tensor.shape), tuple(tensor.stride()), offset)
    with torch.no_grad():
        view.copy_(tensor.detach())
    return view


def _quiescence(run: _Run) -> None:
    """Outputs must not change after the call returned: wait (other threads run), synchronise, re-read."""
    _reread(run.settings.quiescence_wait_s, run.held)


def _reread(wait_s: float, held: list[_Held]) -> None:
    if not held:
        return
    time.sleep(wait_s)
    for device in {t.device for h in held for _, t, _ in h.leaves if t.device.type == "cuda"}:
        torch.cuda.synchronize(device)
    issues = []
    for h in held:
        for locator, tensor, snapshot in h.leaves:
            if not bits_equal(tensor, snapshot):
                issues.append(_issue(Probe.QUIESCENCE, h.label,
                                     f"{locator} changed after the call returned and the devices were synchronised "
                                     "(work still running in the background: a thread or an unsynchronised stream, "
                                     "or an output buffer reused by a later call)", leaf=locator))
                break
    if issues:
        raise _Failed(issues)


# ---------------------------------------------------------------------------------------------------------
# Comparison
# ---------------------------------------------------------------------------------------------------------
def compare_with_expectation(expectation: Expectation, output: Any, inputs: Sample) -> list[ValidationIssue]:
    """Issues of one call's `output` (and inputs the reference mutated) against `expectation`: structure, exact
    leaves, floating leaves within the allowance (shared with `forge.checking.spot_check`)."""
    structure = structure_errors(expectation.skeleton, output, "output")
    if structure:
        return [ValidationIssue(p, kind=Outcome.MISMATCH, leaf=p.split(":", 1)[0]) for p in structure]
    got = dict(iter_tensor_leaves(output, "output"))
    got.update(dict(input_leaves(inputs)))
    return leaf_value_issues(expectation, expectation.unseal(), got)


def _issue(probe: Probe, label: str, message: str, *, kind: Outcome = Outcome.MISMATCH,
           base: ValidationIssue | None = None, **fields: Any) -> ValidationIssue:
    text = f"probe {probe.value}: {label}: {message}"
    if base is not None:
        return base.derive(text, run=probe.value, case=probe.value, **fields)
    return ValidationIssue(text, kind=kind, run=probe.value, case=probe.value, **fields)


def _clip(text: str, limit: int = 600) -> str:
    return clip(text, limit, collapse=False)
