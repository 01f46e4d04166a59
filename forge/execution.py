"""How a model runs in production (`Execution`) and which clock judges a kernel for it (`TimingMode`).

Real deployments run a model one of three ways, and each decides what a kernel's speed means:

- `eager`: plain Python forwards. The host pays every launch (ATen ~9 us per op, a Triton `@jit` launch ~21 us on
  the H200 host), so a kernel is timed host-inclusive: wall time of a pass with the device synchronised at the end.
- `cuda_graphs`: forwards captured once and replayed (`torch.cuda.graph`, `make_graphed_callables`, vLLM-style
  decode). Launch cost disappears; only device time counts.
- `compile`: `torch.compile(model)` (Inductor, usually with CUDA graphs in `reduce-overhead`). Kernels become
  custom ops inside the compiled graph; device time counts.

Measured on the H200: a generated rms_norm looked 2.45x faster in its sandbox (device-dominated timing) and 1.11x in the
eval (host-inclusive); the same call must get the same number whichever component times it, so every timing goes through
`forge.checking.benchmark(..., mode=...)` with the mode this module derives.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = ["DEVICE_BOUND_SHARE", "ClockChoice", "Execution", "TimingMode", "clock_for", "parse_execution",
           "parse_timing_mode"]


class TimingMode(StrEnum):
    """What a benchmark measures.

    `EAGER`: host-inclusive wall time of a pass (what an eager forward pays). `DEVICE`: kernel time only (one pass
    captured in a CUDA graph and replayed, so the host cannot hide anything nor add anything). On CPU both are wall
    time: there is no separate device.
    """

    EAGER = "eager"
    DEVICE = "device"


class Execution(StrEnum):
    """How the optimized model will run; decides the timing mode and how the end-to-end check runs."""

    EAGER = "eager"
    CUDA_GRAPHS = "cuda_graphs"
    COMPILE = "compile"

    @property
    def timing_mode(self) -> TimingMode:
        return TimingMode.EAGER if self is Execution.EAGER else TimingMode.DEVICE


def _parse(enum: type[StrEnum], value: object, what: str) -> StrEnum:
    if isinstance(value, enum):
        return value
    if isinstance(value, str):
        try:
            return enum(value.strip().lower().replace("-", "_"))
        except ValueError:
            pass
    choices = ", ".join(repr(member.value) for member in enum)
    raise ValueError(f"unknown {what} {value!r}; use one of {choices}")


def parse_execution(value: object) -> Execution:
    """An `Execution` from itself or its name (`"cuda-graphs"` is accepted too); ValueError names the choices."""
    return _parse(Execution, value, "execution mode")  # type: ignore[return-value]


def parse_timing_mode(value: object) -> TimingMode:
    """A `TimingMode` from itself or its name; ValueError names the choices."""
    return _parse(TimingMode, value, "timing mode")  # type: ignore[return-value]


# An eager forward whose kernels keep the device busy for at least this share of its wall time is device-bound: the
# host runs ahead and a kernel's launch cost hides behind queued work, so kernels are compared by device time.
DEVICE_BOUND_SHARE = 0.8


@dataclass(frozen=True)
class ClockChoice:
    """The clock kernels are selected by for one model, and the measurements behind it."""

    timing: TimingMode
    device_ms: float | None  # kernel time per pass (the profile)
    wall_ms: float | None  # host-inclusive time per pass (an eager forward, synchronised)
    reason: str


def clock_for(execution: Execution, device_ms: float | None, wall_ms: float | None,
              graphed_share: float = 0.0) -> ClockChoice:
    """Which clock predicts the model's own time in `execution`.

    CUDA graphs and compile: device time (no host launch cost survives a replay). Eager: device time when the model
    is device-bound (`device_ms >= DEVICE_BOUND_SHARE * wall_ms`: in the Llama-3.2-1B prefill 11.8 ms of kernels per
    forward keep the queue full, so a kernel's host overhead is hidden), host-inclusive time otherwise (the
    diffusers UNet at batch 2: 31.8 ms wall for 11.9 ms of kernels, where every microsecond of launch counts).
    Also device time in eager when blocks the plan tries replayed from CUDA graphs (`graphed_share`, of the kernel
    time) hold at least `DEVICE_BOUND_SHARE` of the kernel time: a kernel inside them is captured into its block's
    graph, where its launch cost is replayed away as under `cuda_graphs`, and on the host-inclusive clock a Triton
    kernel (21 us a launch on the H200 host, 9 us an ATen op) would lose a race it wins there.
    The end-to-end check, timed the way the model runs, has the last word either way."""
    if execution is not Execution.EAGER:
        return ClockChoice(TimingMode.DEVICE, device_ms, wall_ms, f"{execution.value}: launch cost is replayed away")
    if graphed_share >= DEVICE_BOUND_SHARE:
        return ClockChoice(TimingMode.DEVICE, device_ms, wall_ms,
                           f"eager, {graphed_share:.0%} of the kernel time in blocks tried replayed from CUDA graphs "
                           f"(>= {DEVICE_BOUND_SHARE:.0%}): their launch cost is replayed away")
    if device_ms is None or wall_ms is None or wall_ms <= 0:
        return ClockChoice(TimingMode.EAGER, device_ms, wall_ms, "eager: no device/wall measurement, host-inclusive")
    share = device_ms / wall_ms
    if share >= DEVICE_BOUND_SHARE:
        return ClockChoice(TimingMode.DEVICE, device_ms, wall_ms,
                           f"eager, device-bound: kernels {device_ms:.3g} ms of a {wall_ms:.3g} ms forward "
                           f"({share:.0%} >= {DEVICE_BOUND_SHARE:.0%})")
    return ClockChoice(TimingMode.EAGER, device_ms, wall_ms,
                       f"eager, host-bound: kernels {device_ms:.3g} ms of a {wall_ms:.3g} ms forward "
                       f"({share:.0%} < {DEVICE_BOUND_SHARE:.0%})")
