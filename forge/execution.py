"""How a model runs in production (`Execution`) and which clock judges a kernel for it (`TimingMode`).

Real deployments run a model one of three ways, and each decides what a kernel's speed means:

- `eager`: plain Python forwards. The host pays every launch (ATen ~9 us per op, a Triton `@jit` launch ~21 us on
  the H200 host), so a kernel is timed host-inclusive: wall time of a pass with the device synchronised at the end.
- `cuda_graphs`: forwards captured once and replayed (`torch.cuda.graph`, `make_graphed_callables`, vLLM-style
  decode). Launch cost disappears; only device time counts.
- `compile`: `torch.compile(model)` (Inductor, usually with CUDA graphs in `reduce-overhead`). Kernels become
  custom ops inside the compiled graph; device time counts.

Measured on the H200 (issue 7): a generated rms_norm looked 2.45x faster in its sandbox (device-dominated timing)
and 1.11x in the eval (host-inclusive); the same call must get the same number whichever component times it, so
every timing goes through `forge.checking.benchmark(..., mode=...)` with the mode this module derives.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["Execution", "TimingMode", "parse_execution", "parse_timing_mode"]


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
