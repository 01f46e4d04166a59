"""`benchmark`: time one pass over a sample distribution, with the defences that keep timings honest.

Two clocks (`forge.execution.TimingMode`), one function for every component (sandbox feedback, optimizer selection,
evals, end-to-end), so the same call gets the same number whichever component measures it:

- `eager` (host-inclusive): what an eager forward pays, host launch and wrapper costs included (below).
- `device` (kernel time): on CUDA one pass is captured once in a CUDA graph and replayed; each timed replay runs
  after an L2 flush whose kernel is still running when the replay is queued, so the host cannot add time (no launch
  or wrapper cost) nor hide any (every kernel of the pass is in the graph). Fresh input values are copied into the
  captured input buffers before every replay, outside the timed region. Python code of the timed callable runs only
  during capture, so host-side tricks (result caches keyed by address or value) do not exist in this mode. A
  callable that cannot be captured (it synchronises, reads device values on the host, or allocates in a way CUDA
  graphs refuse) raises `NotCapturableError`: it could not run under CUDA graphs or `torch.compile`'s
  reduce-overhead either. On CPU there is no separate device and both modes take wall time.

Host-inclusive mode in detail:

A pass calls `fn` once per sample, in order (samples may repeat). Inputs (a kernel that can tell timed calls from judged
ones can skip its work only when timed, so nothing about the calls may tell a kernel it is timed rather than judged):
two input sets laid out like the samples (shape, strides, storage offset) are allocated up front; before every pass,
warm-up or timed, a random one of them is refilled in place with new values, outside the timed region. The values are a
re-arrangement of the samples' own: for each floating, finite, non-overlapping tensor of more than one element, a random
rotation of its elements (in logical order) of one of two variants, the samples or (inputs up to 64 MB) a reversed copy
made once up front; integer and bool tensors, additive masks (infinities) and expanded tensors keep their values. So the
distribution, and the timing, stay those of the captured call, while values never repeat between passes (a rotation
repeats with probability 1/numel): before, every pass re-cloned the same values, so a cache keyed by a value fingerprint
paid off (selected at 3.5x) and a kernel wrong on recycled inputs was timed as doing nothing. Addresses now recur at
random, as activations' do in a model (the caching allocator), so a cache keyed by `data_ptr` serves stale values, which
the spot check catches. Memory: two input sets, as the rotation for inputs over 64 MB was (below 64 MB the previous
design held up to three fresh clones), plus the reversed copy up to 64 MB. Warm-up uses each set once (its first touch,
page faults included, is not timed). Refilling costs one copy per pass, as the clone it replaces did.

Spot checks (`spot_check=SpotCheck(reference)`, `forge.checking.spot_check`): the outputs of 2-3 random timed
passes (one in device mode on CUDA: one replay's output buffers copied out) are kept and, after the loop and the
integrity check, compared with the reference on the same (rebuilt) inputs with `validate`'s tolerances;
`SpotCheckError` names the pass, the call and the worst error. Measured on the loaded 2-core CPU machine, F.silu
with `KernelUtils` defaults: one fp32 [8, 64] sample, +3 ms on a 0.25 s benchmark; one fp32 [64, 4096] sample,
+0.3 s on 0.3-0.4 s (a checked call costs what one `validate` case's expectation does: float64 and native reference
runs and the allowance; `validate` of that sample took 1.2-3.4 s). On CUDA the reference runs on the device.

On CUDA: CUDA events around the pass, an L2 flush (zeroing a 256 MB buffer) before each timed pass and a sync after
it (so the pass's host work starts on an idle device and counts), and a
device-wide `torch.cuda.synchronize()` followed by a second end event, so work the candidate queued on other
streams is counted: a pass takes `max(current-stream time, all-streams time - calibrated sync overhead)`. On CPU:
`time.perf_counter` around each pass. Everything runs under `torch.no_grad()`. Results keep every pass's time, so
`is_faster_than` can test the difference (Mann-Whitney U) rather than eyeball quartiles. Timed passes continue until at
least `rounds` ran and `min_run_time_s` of wall time was spent in the timing loop (at most 10,000 passes).

Integrity (a kernel replaced `time.perf_counter` and `torch.cuda.Event.elapsed_time` and was selected at
1,600x): `benchmark` checks `forge.checking.integrity`'s import-time snapshot (taken before any candidate code is
imported) before and after timing, and the clocks and CUDA events after every timed pass (outside the timed region;
~30 identities); a change raises `IntegrityError` naming what changed, after putting the originals back, so the
benchmark never returns a number measured with a patched clock or a patched `torch.Tensor`.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from forge.checking import integrity
from forge.checking.inputs import as_sample, materialise
from forge.checking.integrity import Group, IntegrityError
from forge.checking.spot_check import SpotCheck, SpotCheckError, SpotRecorder
from forge.errors import CandidateError
from forge.execution import TimingMode, parse_timing_mode
from forge.samples import Sample, TensorSpec, clone_tensor, clone_value, iter_tensors, map_values

__all__ = [
    "BenchmarkResult", "Bracket", "IntegrityError", "NotCapturableError", "SpotCheck", "SpotCheckError", "benchmark",
    "samples_device",
]

_SMALL_INPUT_BYTES = 64 << 20
_L2_FLUSH_BYTES = 256 << 20
_MAX_ROUNDS = 10_000
# What a timed pass hands back when the spot check keeps it: its outputs and its inputs after the calls.
_Kept = tuple[list[Any], list[Sample]] | None


@dataclass(frozen=True)
class BenchmarkResult:
    """Per-pass time statistics in milliseconds."""

    median_ms: float
    q25_ms: float
    q75_ms: float
    min_ms: float
    runs: int
    device: str
    times_ms: tuple[float, ...] = field(default=(), repr=False, compare=False)
    mode: str = TimingMode.EAGER.value

    @property
    def spread(self) -> float:
        """Relative inter-quartile range, `(q75 - q25) / median`."""
        iqr = self.q75_ms - self.q25_ms
        if self.median_ms > 0:
            return iqr / self.median_ms
        return 0.0 if iqr == 0 else math.inf

    def speedup_over(self, other: BenchmarkResult) -> float:
        """`other.median / self.median` (> 1 means self is faster)."""
        self._check_comparable(other)
        if self.median_ms <= 0:
            return math.inf if other.median_ms > 0 else 1.0
        return other.median_ms / self.median_ms

    def is_faster_than(self, other: BenchmarkResult, min_gain: float = 0.03, alpha: float = 0.01) -> bool:
        """True only when the gain is beyond the noise.

        The median speedup must exceed `1 + min_gain`, and the per-pass times must show that self is faster: a
        one-sided Mann-Whitney U test at level `alpha` when both results carry at least 8 timings (robust to the
        skewed, sometimes bimodal timings of a busy GPU host), else the quartile rule `self.q75 < other.q25`.
        """
        if min_gain < 0:
            raise ValueError(f"min_gain must be >= 0, got {min_gain}")
        self._check_comparable(other)
        if self.speedup_over(other) <= 1.0 + min_gain:
            return False
        if len(self.times_ms) >= 8 and len(other.times_ms) >= 8:
            return mann_whitney_p_less(self.times_ms, other.times_ms) < alpha
        return self.q75_ms < other.q25_ms

    def to_dict(self) -> dict[str, Any]:
        return {
            "median_ms": self.median_ms, "q25_ms": self.q25_ms, "q75_ms": self.q75_ms, "min_ms": self.min_ms,
            "runs": self.runs, "device": self.device, "spread": self.spread, "mode": self.mode,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BenchmarkResult:
        try:
            return cls(
                median_ms=float(data["median_ms"]),
                q25_ms=float(data["q25_ms"]),
                q75_ms=float(data["q75_ms"]),
                min_ms=float(data["min_ms"]),
                runs=int(data["runs"]),
                device=str(data["device"]),
                mode=parse_timing_mode(data.get("mode", TimingMode.EAGER.value)).value,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"invalid benchmark result {data!r}: {exc}") from exc

    def _check_comparable(self, other: BenchmarkResult) -> None:
        if not isinstance(other, BenchmarkResult):
            raise TypeError(f"expected a BenchmarkResult, got {type(other).__name__}")
        if self.device != other.device:
            raise ValueError(f"cannot compare timings from different devices ({self.device} vs {other.device})")
        if self.mode != other.mode:
            raise ValueError(f"cannot compare {self.mode} timing with {other.mode} timing: time both with one mode")


@dataclass(frozen=True)
class Bracket:
    """A baseline timed before and after its candidates, the order every speed judgement uses (the optimizer's
    selection and the sandbox's feedback to the model alike), so the two report the same speedup for the same kernel
    within noise: the baseline is the faster of the two runs, and a candidate wins only when it beats both beyond
    the noise (`BenchmarkResult.is_faster_than`). Timing the baseline once, after the candidate, let a GPU that
    warmed up or a neighbour's load tilt the ratio one way: the sandbox told a model 0.93x for an attention kernel
    the optimizer timed at 1.06x."""

    first: BenchmarkResult
    second: BenchmarkResult

    @property
    def baseline(self) -> BenchmarkResult:
        return min((self.first, self.second), key=lambda b: b.median_ms)

    def beaten_by(self, result: BenchmarkResult) -> bool:
        """Whether `result` is faster than both baseline runs beyond the measured noise."""
        return all(result.is_faster_than(b) for b in (self.first, self.second))


def mann_whitney_p_less(a: Sequence[float], b: Sequence[float]) -> float:
    """One-sided p-value that samples `a` are NOT stochastically smaller than `b` (Mann-Whitney U, normal
    approximation with tie correction). Small values mean `a` is reliably smaller."""
    n1, n2 = len(a), len(b)
    if n1 == 0 or n2 == 0:
        raise ValueError("mann_whitney_p_less needs two non-empty samples")
    pooled = sorted([(value, 0) for value in a] + [(value, 1) for value in b])
    ranks = [0.0] * len(pooled)
    tie_term = 0.0
    i = 0
    while i < len(pooled):
        j = i
        while j + 1 < len(pooled) and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        rank = (i + j) / 2.0 + 1.0
        for k in range(i, j + 1):
            ranks[k] = rank
        size = j - i + 1
        tie_term += size**3 - size
        i = j + 1
    rank_sum_a = sum(rank for rank, (_, group) in zip(ranks, pooled, strict=True) if group == 0)
    u_a = rank_sum_a - n1 * (n1 + 1) / 2.0  # large when a tends to be larger
    n = n1 + n2
    variance = n1 * n2 / 12.0 * ((n + 1) - tie_term / (n * (n - 1))) if n > 1 else 0.0
    if variance <= 0:
        return 1.0
    z = (u_a - n1 * n2 / 2.0 + 0.5) / math.sqrt(variance)  # continuity-corrected
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


def _quantile(ordered: list[float], q: float) -> float:
    position = (len(ordered) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize(times_ms: Sequence[float], device: str, mode: TimingMode | str = TimingMode.EAGER) -> BenchmarkResult:
    """Statistics of per-pass times."""
    if not times_ms:
        raise ValueError("no timings to summarise")
    ordered = sorted(times_ms)
    return BenchmarkResult(
        median_ms=_quantile(ordered, 0.5),
        q25_ms=_quantile(ordered, 0.25),
        q75_ms=_quantile(ordered, 0.75),
        min_ms=ordered[0],
        runs=len(ordered),
        device=device,
        times_ms=tuple(float(t) for t in times_ms),
        mode=parse_timing_mode(mode).value,
    )


def _materialise(samples: Sequence[Sample]) -> list[Sample]:
    generator = torch.Generator().manual_seed(0)
    return [materialise(as_sample(sample, index), generator) for index, sample in enumerate(samples)]


def samples_device(samples: Sequence[Sample]) -> torch.device:
    """The device a pass over `samples` runs on: the first CUDA tensor's, else the first tensor's, else the CPU."""
    devices = [t.device for s in samples for t in iter_tensors((s.args, s.kwargs))]
    for device in devices:
        if device.type == "cuda":
            return device
    return devices[0] if devices else torch.device("cpu")


@dataclass(frozen=True)
class _Draw:
    """How one pass's input values were made: a value variant and the seed of its per-tensor rolls."""

    variant: int
    seed: int


def _rollable(tensor: torch.Tensor) -> bool:
    """Floating, finite, more than one element, no overlapping elements: its values may be re-arranged. Integer and
    bool tensors (indices, targets, masks), additive masks (infinities) and expanded tensors keep their values."""
    return (tensor.is_floating_point() and tensor.numel() > 1 and tensor.layout == torch.strided
            and torch._debug_has_internal_overlap(tensor) == 0 and bool(torch.isfinite(tensor).all()))


def _empty_same_layout(src: torch.Tensor) -> torch.Tensor:
    """An uninitialised tensor with `src`'s shape, strides and storage offset (as `clone_tensor` lays it out)."""
    spec = TensorSpec.of(src, with_stats=False)
    storage = torch.empty(max(spec.storage_size(), 1), dtype=src.dtype, device=src.device)
    return storage.as_strided(spec.shape, spec.stride, spec.storage_offset)


def _write_rolled(out: torch.Tensor, src: torch.Tensor, shift: int) -> torch.Tensor:
    """`out` = `src`'s elements (in logical order) rotated by `shift`: one copy, no temporary when contiguous."""
    n = src.numel()
    if src.is_contiguous() and out.is_contiguous():
        flat_out, flat_src = out.view(-1), src.view(-1)
        flat_out[shift:].copy_(flat_src[: n - shift])
        flat_out[:shift].copy_(flat_src[n - shift:])
    else:
        out.copy_(src.reshape(-1).roll(shift).view(src.shape))
    return out


def _reversed_copy(src: torch.Tensor) -> torch.Tensor:
    out = _empty_same_layout(src)
    out.copy_(src.reshape(-1).flip(0).view(src.shape))
    return out


class _InputSource:
    """The inputs of each pass: two sets of tensors laid out like the samples, refilled in place with new values
    before every pass (outside the timed region).

    Values: `variants` (the samples and, for inputs up to 64 MB, a copy with every re-arrangeable tensor's elements
    reversed, made once up front) and per pass a random variant whose re-arrangeable tensors (`_rollable`) are each
    rotated by a random number of elements: one copy per pass, as the clone it replaces was. Addresses: each pass
    uses one of the two sets at random, so addresses recur as they do in a model (the caching allocator hands an
    activation the same memory every forward), while the values never do. `next(index)` picks the set (warm-up
    uses each once); `build(draw)` rebuilds a pass's values in new tensors (for the spot check)."""

    sets = 2

    @torch.no_grad()
    def __init__(self, samples: list[Sample], rng: random.Random) -> None:
        self._rng = rng
        tensors = [t for s in samples for t in iter_tensors((s.args, s.kwargs))]
        self.small = sum(t.untyped_storage().nbytes() for t in tensors) <= _SMALL_INPUT_BYTES
        self._rollable = [_rollable(t) for t in tensors]
        self._variants = [samples]
        if self.small and any(self._rollable):
            self._variants.append(self._map(samples, lambda t, roll: _reversed_copy(t) if roll else t))
        self._sets = [self._clone() for _ in range(self.sets)]
        self.last: _Draw | None = None

    def _map(self, samples: list[Sample], fn: Callable[[torch.Tensor, bool], torch.Tensor]) -> list[Sample]:
        flags = iter(self._rollable)
        visit = lambda v: fn(v, next(flags)) if isinstance(v, torch.Tensor) else v  # noqa: E731
        return [Sample(map_values(tuple(s.args), visit), map_values(dict(s.kwargs), visit)) for s in samples]

    def _clone(self) -> list[Sample]:
        return _clone_samples(self._variants[0])

    def _shifts(self, draw: _Draw) -> list[int]:
        rng = random.Random(draw.seed)
        tensors = [t for s in self._variants[0] for t in iter_tensors((s.args, s.kwargs))]
        return [rng.randrange(1, t.numel()) if roll else 0 for t, roll in zip(tensors, self._rollable, strict=True)]

    @torch.no_grad()
    def build(self, draw: _Draw) -> list[Sample]:
        """New tensors holding the values of `draw`."""
        shifts = iter(self._shifts(draw))

        def make(t: torch.Tensor, roll: bool) -> torch.Tensor:
            shift = next(shifts)
            return _write_rolled(_empty_same_layout(t), t, shift) if roll else clone_tensor(t)

        return self._map(self._variants[draw.variant], make)

    @torch.no_grad()
    def next(self, index: int | None = None) -> list[Sample]:
        """A set (`index`, else a random one) refilled with a new draw; `last` says which draw."""
        self.last = draw = _Draw(self._rng.randrange(len(self._variants)), self._rng.getrandbits(62))
        target = self._sets[self._rng.randrange(self.sets) if index is None else index % self.sets]
        sources = [t for s in self._variants[draw.variant] for t in iter_tensors((s.args, s.kwargs))]
        targets = [t for s in target for t in iter_tensors((s.args, s.kwargs))]
        for out, src, shift in zip(targets, sources, self._shifts(draw), strict=True):
            if shift:
                _write_rolled(out, src, shift)
            elif torch._debug_has_internal_overlap(out) == 0:
                out.copy_(src)  # undo what an in-place kernel did to the values that are not re-arranged
        return target


def _run_pass(fn: Callable[..., Any], inputs: list[Sample], keep: bool = False) -> list[Any] | None:
    if not keep:
        for sample in inputs:
            fn(*sample.args, **sample.kwargs)
        return None
    return [fn(*sample.args, **sample.kwargs) for sample in inputs]


class _CudaTimer:
    def __init__(self, device: torch.device, flush_l2: bool) -> None:
        self.device = device
        self.flush = torch.empty(_L2_FLUSH_BYTES // 4, dtype=torch.int32, device=device) if flush_l2 else None
        self.start = torch.cuda.Event(enable_timing=True)
        self.end_stream = torch.cuda.Event(enable_timing=True)
        self.end_all = torch.cuda.Event(enable_timing=True)
        self.sync_overhead_ms = self._calibrate()

    def _events(self) -> tuple[float, float]:
        torch.cuda.synchronize(self.device)
        self.end_all.record()
        self.end_all.synchronize()
        return self.start.elapsed_time(self.end_stream), self.start.elapsed_time(self.end_all)

    def _calibrate(self) -> float:
        overheads = []
        for _ in range(21):
            self.start.record()
            self.end_stream.record()
            stream_ms, all_ms = self._events()
            overheads.append(all_ms - stream_ms)
        return sorted(overheads)[len(overheads) // 2]

    def time_pass(self, fn: Callable[..., Any], inputs: list[Sample], keep: bool = False) -> tuple[float, _Kept]:
        if self.flush is not None:
            self.flush.zero_()
            # Host-inclusive: wait for the flush, or the pass's host work (launches, wrapper code) would hide behind
            # its 67 us on the H200 and a pass shorter than that would measure device time only.
            torch.cuda.synchronize(self.device)
        self.start.record()
        outputs = _run_pass(fn, inputs, keep)
        self.end_stream.record()
        stream_ms, all_ms = self._events()
        return max(stream_ms, all_ms - self.sync_overhead_ms), None if outputs is None else (outputs, inputs)


class NotCapturableError(CandidateError, RuntimeError):
    """The timed callable cannot be captured in a CUDA graph, so it has no device-mode timing (and could not run
    under CUDA graphs or `torch.compile(mode="reduce-overhead")` either)."""

    outcome = "runtime_error"


class _GraphTimer:
    """Device mode on CUDA: one pass captured in a CUDA graph, replayed after an L2 flush, fresh values copied in."""

    def __init__(self, device: torch.device, flush_l2: bool) -> None:
        self.device = device
        # The flush kernel is still running when the replay is queued, so the replay's host-side launch is hidden and
        # the events bracket device work only; without an L2 flush a sleep kernel plays that role.
        self.flush = torch.empty(_L2_FLUSH_BYTES // 4, dtype=torch.int32, device=device) if flush_l2 else None
        self.start = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static: list[Sample] = []
        self.outputs: list[Any] = []  # the captured pass's output buffers, rewritten by every replay

    def capture(self, fn: Callable[..., Any], inputs: list[Sample]) -> None:
        self.static = inputs
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.current_stream(self.device)
        try:
            with torch.cuda.graph(graph):
                self.outputs = _run_pass(fn, inputs, keep=True) or []
        except Exception as exc:
            _recover_from_failed_capture(stream)
            raise NotCapturableError(
                f"cannot capture {getattr(fn, '__name__', type(fn).__name__)} in a CUDA graph "
                f"({type(exc).__name__}: {exc}); device-mode timing needs a callable that does not synchronise, read "
                "device values on the host or change its launches between calls"
            ) from exc
        self.graph = graph

    def load(self, inputs: list[Sample]) -> None:
        """Copy a fresh pass's input values into the captured buffers (outside the timed region)."""
        for static, fresh in zip(self.static, inputs, strict=True):
            pairs = zip(iter_tensors((static.args, static.kwargs)), iter_tensors((fresh.args, fresh.kwargs)),
                        strict=True)
            for target, source in pairs:
                if target.data_ptr() != source.data_ptr():
                    target.copy_(source)

    def time_pass(self, fn: Callable[..., Any], inputs: list[Sample], keep: bool = False) -> tuple[float, _Kept]:
        assert self.graph is not None
        self.load(inputs)
        if self.flush is not None:
            self.flush.zero_()
        else:
            torch.cuda._sleep(100_000)  # ~50 us: keeps the stream busy while the replay is queued
        self.start.record()
        self.graph.replay()
        self.end.record()
        self.end.synchronize()
        # A kept replay: its output buffers (and inputs, which an in-place kernel updates) are copied out now,
        # outside the timed region, before the next replay rewrites them.
        kept = (clone_value(list(self.outputs)), _clone_samples(self.static)) if keep else None
        return self.start.elapsed_time(self.end), kept


def _recover_from_failed_capture(stream: torch.cuda.Stream) -> None:
    """Leave the process usable after a capture that failed inside `torch.cuda.graph`.

    When the captured code invalidates the capture (a host synchronisation, say), `capture_end` raises before it
    restores the current stream and before the CUDA generator leaves capture mode: every later random op would then
    fail with "Offset increment outside graph capture". An empty capture completes the generator's cycle."""
    torch.cuda.set_stream(stream)
    try:
        torch.cuda.synchronize(stream.device)
    except RuntimeError:  # the failed capture's error surfaces here on some versions
        pass
    empty = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(empty):
            pass
    finally:
        torch.cuda.set_stream(stream)


def record_inside_capture(run: Callable[[], Any], recording: contextlib.AbstractContextManager[Any]) -> Any:
    """Run `run` once eagerly (the warm-up every CUDA-graph deployment does), then once inside a CUDA-graph capture
    with `recording` entered around it, and replay the graph once, so that tensors the recording cloned inside the
    capture (they live in the graph's pool) hold that pass's values; returns what `recording` entered as. The caller
    clones what it keeps out of the pool. Why: a library may call its modules and functions otherwise when it sees a
    capture (transformers up to 5.17 passes attention an explicit causal mask then), and a plan made for CUDA graphs
    is judged on the calls it will get. After a failed capture the stream and the CUDA generator are put back, and
    the error propagates."""
    stream = torch.cuda.current_stream()
    with torch.no_grad():
        run()
        torch.cuda.synchronize()
        try:
            graph = torch.cuda.CUDAGraph()
            # thread_local: a judging or generation thread's CUDA calls do not invalidate this capture
            with recording as recorded, torch.cuda.graph(graph, capture_error_mode="thread_local"):
                run()
            graph.replay()
            torch.cuda.synchronize()
        except Exception:
            _recover_from_failed_capture(stream)
            raise
    return recorded


def benchmark(
    fn: Callable[..., Any],
    samples: Sequence[Sample],
    *,
    warmup: int = 5,
    rounds: int = 30,
    min_run_time_s: float = 0.25,
    flush_l2: bool = True,
    mode: TimingMode | str = TimingMode.EAGER,
    spot_check: SpotCheck | None = None,
    device: torch.device | str | None = None,
) -> BenchmarkResult:
    """Time passes of `fn` over `samples` in `mode` (see the module docstring); exceptions from `fn` propagate, and
    in device mode on CUDA a callable that cannot be captured raises `NotCapturableError`. With `spot_check`, the
    outputs of a few random timed passes are compared with its reference after timing: `SpotCheckError` when one
    differs (`forge.checking.spot_check`). `device`: where `fn` runs, when its samples do not say (a whole model
    timed as `fn()` with no arguments); default: the samples' device (`samples_device`).

    Why `device` exists: whole-model timings pass no tensors, and deriving the device from the samples made them
    CPU timings of a CUDA model: the host's launch time, never synchronised, and never a CUDA-graph replay. On the
    H200 that reported the timm ViT at 6.2 ms eager and 7.1 ms "under CUDA graphs" for a 3.25 ms replay, and a plan
    that cut 0.28 ms of device time as 0.95x."""
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if warmup < 0 or rounds < 1 or min_run_time_s < 0:
        raise ValueError(
            f"need warmup >= 0, rounds >= 1 and min_run_time_s >= 0 (got {warmup}, {rounds}, {min_run_time_s})"
        )
    if spot_check is not None and not isinstance(spot_check, SpotCheck):
        raise TypeError(f"spot_check must be a SpotCheck, got {type(spot_check).__name__}")
    timing = parse_timing_mode(mode)
    integrity.verify_baseline("before timing")
    materialised = _materialise(samples)
    if not materialised:
        raise ValueError("benchmark needs at least one sample")
    device = samples_device(materialised) if device is None else torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"cannot time on {device}: CUDA is not available in this process")
    source = _InputSource(materialised, random.Random(int.from_bytes(os.urandom(8), "little")))
    graphed = device.type == "cuda" and timing is TimingMode.DEVICE
    spot = None
    if spot_check is not None:
        spot = SpotRecorder(spot_check, max_passes=None if source.small and not graphed else 1)
    with torch.no_grad():
        if device.type == "cuda":
            with torch.cuda.device(device):
                if graphed:
                    graph_timer = _GraphTimer(device, flush_l2)
                    _warm_up(fn, source, max(warmup, 1), device)  # compile and autotune before capture
                    graph_timer.capture(fn, source.next())
                    times = _timing_loop(fn, source, graph_timer.time_pass, 1, rounds, min_run_time_s, device,
                                         warm=lambda _fn, inputs: graph_timer.graph.replay(), spot=spot,
                                         copied=True)
                else:
                    timer = _CudaTimer(device, flush_l2)
                    times = _timing_loop(fn, source, timer.time_pass, warmup, rounds, min_run_time_s, device,
                                         spot=spot)
        else:
            times = _timing_loop(fn, source, _time_cpu_pass, warmup, rounds, min_run_time_s, device, spot=spot)
    integrity.verify_baseline("after timing")
    if spot is not None:  # after the clocks and torch.Tensor were found unchanged; nothing here is timed
        with torch.no_grad(), _on(device):
            spot.verify(source.build)
    return summarize(times, str(device), timing)


def _on(device: torch.device) -> Any:
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _clone_samples(samples: list[Sample]) -> list[Sample]:
    return [s.clone() for s in samples]


def _warm_passes(warmup: int) -> int:
    """Warm-up passes: `warmup`, but each input set at least once when there is a warm-up (its first touch, page
    faults included, is not timed)."""
    return max(warmup, _InputSource.sets) if warmup else 0


def _warm_up(fn: Callable[..., Any], source: _InputSource, passes: int, device: torch.device) -> None:
    for index in range(_warm_passes(passes)):
        _run_pass(fn, source.next(index))
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_cpu_pass(fn: Callable[..., Any], inputs: list[Sample], keep: bool = False) -> tuple[float, _Kept]:
    start = time.perf_counter()
    outputs = _run_pass(fn, inputs, keep)
    elapsed_ms = (time.perf_counter() - start) * 1e3
    return elapsed_ms, None if outputs is None else (outputs, inputs)


def _timing_loop(
    fn: Callable[..., Any],
    source: _InputSource,
    time_pass: Callable[[Callable[..., Any], list[Sample], bool], tuple[float, _Kept]],
    warmup: int,
    rounds: int,
    min_run_time_s: float,
    device: torch.device,
    warm: Callable[[Callable[..., Any], list[Sample]], Any] = _run_pass,
    spot: SpotRecorder | None = None,
    copied: bool = False,
) -> list[float]:
    """Warm-up, then timed passes; a pass `spot` chooses hands back its outputs and inputs, copied (unless `copied`
    says the timer copied them) because later passes refill the input sets and may reuse the output memory."""
    for index in range(_warm_passes(warmup)):
        warm(fn, source.next(index))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    times: list[float] = []
    clocks = integrity.baseline().restricted({Group.TIMERS, Group.CUDA})
    loop_start = time.perf_counter()
    while len(times) < rounds or (time.perf_counter() - loop_start < min_run_time_s and len(times) < _MAX_ROUNDS):
        inputs = source.next()
        keep = spot is not None and spot.wants_next()
        elapsed_ms, kept = time_pass(fn, inputs, keep)
        times.append(elapsed_ms)
        clocks.check("during timing")
        if spot is not None and kept is not None:
            outputs, after = kept
            if not copied:  # the next passes refill these input sets
                outputs, after = clone_value(outputs), _clone_samples(after)
            spot.keep(source.last, outputs, after)
    return times
