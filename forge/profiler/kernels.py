"""Where a model's device time goes, kernel by kernel, and what a plan changed: `profile_kernels` and `KernelDiff`.

Why: a plan's kernels are judged one call at a time, but what a user gets is the model's time. On the H200 a plan
that cut the ViT's kernel time per forward by 9.5% in a profile measured 0.94-0.99x under CUDA graphs, and nothing in
the report said where the difference went. This module profiles the same runner the end-to-end timing uses (eager,
a CUDA-graph replay, or the compiled model) and lists device time per pass by kernel name and by the
`torch.nn.functional` call that launched it, so the diff of the model with and without the plan shows what the plan
saved (the replaced calls) and what it cost (copies and other kernels it made later ops launch, longer kernels
elsewhere).

How kernels are tied to functions:
- eager: every stock `torch.nn.functional` call runs inside a `record_function("kforge.fn::<name>")` label while the
  profile runs, and every call the plan's runtime sends to a provider inside `"kforge.plan::<name>"`
  (`forge.runtime`); a device event goes to the nearest label of the runtime call that launched it (as in
  `forge.profiler.attribution`). Work under no label is `"(outside F calls)"`: the glue between calls.
- CUDA graphs: a replay launches every kernel from one `cudaGraphLaunch`, so kernels get the function the eager
  profile of the same variant gave that kernel name (`function_of`); names eager never launched are `"(graph)"`.
- compile: Inductor's fused kernels belong to no single call: `"(compiled)"`, except the plan's own kernels, which
  keep their eager function by name.
On CPU the "kernels" are ATen ops and their self CPU time (for tests and CPU deployments).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
import torch.nn.functional as F
from torch.autograd import DeviceType

from forge.functional import functional_names, original_function

__all__ = ["FUNCTION_LABEL", "PLAN_LABEL", "KernelDiff", "KernelProfile", "labelled_functions", "profile_kernels",
           "profiler_session"]

logger = logging.getLogger(__name__)

FUNCTION_LABEL = "kforge.fn::"
PLAN_LABEL = "kforge.plan::"
OUTSIDE = "(outside F calls)"
GRAPH = "(graph)"
COMPILED = "(compiled)"
KERNEL_COLUMNS = ["kernel", "function", "by_plan", "calls", "device_ms"]
_RUNTIME_CALL_PREFIXES = ("cu", "hip")


@dataclass(frozen=True)
class KernelProfile:
    """Device time per pass of one variant: `frame` has a row per (kernel, function) with calls and ms per pass."""

    frame: pd.DataFrame
    passes: int
    device: str

    @property
    def device_ms(self) -> float:
        return float(self.frame["device_ms"].sum()) if not self.frame.empty else 0.0

    def by_function(self) -> pd.DataFrame:
        if self.frame.empty:
            return pd.DataFrame(columns=["function", "calls", "device_ms"])
        grouped = self.frame.groupby("function", as_index=False)[["calls", "device_ms"]].sum()
        return grouped.sort_values("device_ms", ascending=False, ignore_index=True)

    def function_of(self) -> dict[str, str]:
        """Kernel name -> the function that launched most of its time (for a graph replay's kernels)."""
        owner: dict[str, tuple[float, str]] = {}
        for row in self.frame.itertuples():
            if row.function != OUTSIDE and row.device_ms > owner.get(row.kernel, (-1.0, ""))[0]:
                owner[row.kernel] = (row.device_ms, row.function)
        return {kernel: function for kernel, (_, function) in owner.items()}


@dataclass(frozen=True)
class KernelDiff:
    """The same model profiled without (`base`) and with (`planned`) a plan, in one execution mode."""

    execution: str
    base: KernelProfile
    planned: KernelProfile

    def _diff(self, left: pd.DataFrame, right: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
        merged = left.merge(right, on=keys, how="outer", suffixes=("_without", "_with")).fillna(
            {"calls_without": 0, "calls_with": 0, "device_ms_without": 0.0, "device_ms_with": 0.0})
        merged["delta_ms"] = merged["device_ms_with"] - merged["device_ms_without"]
        merged = merged.reindex(merged["delta_ms"].abs().sort_values(ascending=False).index).reset_index(drop=True)
        return merged[[*keys, "calls_without", "calls_with", "device_ms_without", "device_ms_with", "delta_ms"]]

    def by_function(self) -> pd.DataFrame:
        """Device ms per pass by function, without and with the plan, largest change first."""
        return self._diff(self.base.by_function(), self.planned.by_function(), ["function"])

    def by_kernel(self, top: int | None = 15) -> pd.DataFrame:
        """Device ms per pass by (kernel, function), largest change first; `top` rows (None: all)."""
        columns = ["kernel", "function", "calls", "device_ms"]
        frame = self._diff(self.base.frame[columns], self.planned.frame[columns], ["kernel", "function"])
        return frame if top is None else frame.head(top)

    def summary(self) -> dict[str, float]:
        saved = self.by_function()
        return {
            "device_ms_without": self.base.device_ms,
            "device_ms_with": self.planned.device_ms,
            "saved_ms": float(-saved.loc[saved["delta_ms"] < 0, "delta_ms"].sum()),
            "added_ms": float(saved.loc[saved["delta_ms"] > 0, "delta_ms"].sum()),
        }


# -- labelling ----------------------------------------------------------------------------------------------
def _labelled(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    label = FUNCTION_LABEL + name

    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        with torch.profiler.record_function(label):
            return original(*args, **kwargs)

    return call


@contextlib.contextmanager
def labelled_functions() -> Iterator[None]:
    """Every replaceable `torch.nn.functional` function runs inside its `kforge.fn::<name>` label (restored after,
    also on error). Installed before a planned forward starts, so the plan's routers fall back to these."""
    saved: dict[str, Any] = {}
    try:
        for name in functional_names():
            current = getattr(F, name, None)
            if current is None or current is not original_function(name):
                continue  # someone else's patch (or a router in flight): left alone
            saved[name] = current
            setattr(F, name, _labelled(name, current))
        yield
    finally:
        for name, current in saved.items():
            setattr(F, name, current)


# -- attribution --------------------------------------------------------------------------------------------
def _label_of(event: Any) -> str | None:
    """The nearest function label above `event`, except that a plan label anywhere above wins: a provider's own
    F calls (a GEMM through `F.linear` inside a conv2d provider) are the provider's time."""
    nearest = None
    current = event
    while current is not None:
        name = getattr(current, "name", None) or ""
        if name.startswith(PLAN_LABEL):
            return name
        if nearest is None and name.startswith(FUNCTION_LABEL):
            nearest = name
        current = getattr(current, "cpu_parent", None)
    return nearest


def launching_call(candidates: list[Any]) -> Any | None:
    calls = [e for e in candidates if not getattr(e, "is_user_annotation", False)
             and not (e.name or "").startswith((FUNCTION_LABEL, PLAN_LABEL))]
    for event in calls:
        if (event.name or "").startswith(_RUNTIME_CALL_PREFIXES):
            return event
    return calls[0] if calls else None


def _rows(events: list[Any], on_cuda: bool) -> list[tuple[str, str | None, float]]:
    """(kernel name, nearest label, µs) per device event (CUDA) or per ATen op's self time (CPU)."""
    if not on_cuda:
        return [(e.name, _label_of(e), float(e.self_cpu_time_total)) for e in events
                if getattr(e, "device_type", DeviceType.CPU) == DeviceType.CPU and (e.name or "").startswith("aten::")
                and not getattr(e, "is_async", False)]
    cpu_by_id: dict[int, list[Any]] = defaultdict(list)
    for event in events:
        if event.device_type == DeviceType.CPU and not getattr(event, "is_async", False):
            cpu_by_id[event.id].append(event)
    rows = []
    for event in events:
        if event.device_type == DeviceType.CPU or getattr(event, "is_user_annotation", False):
            continue
        if (event.name or "").startswith((FUNCTION_LABEL, PLAN_LABEL)):
            continue  # the GPU-side mirror of a label
        launcher = launching_call(cpu_by_id.get(event.id, []))
        label = _label_of(launcher) if launcher is not None else None
        rows.append((event.name, label, float(event.time_range.end - event.time_range.start)))
    return rows


@contextlib.contextmanager
def profiler_session(device: torch.device) -> Iterator[Any]:
    """One `torch.profiler` session over the CPU and, on CUDA, the device (Kineto quiet and primed, the device
    synchronised before and after), under `torch.no_grad()`; yields the profiler, whose `events()` are read after."""
    from forge.profiler.module_profiler import _quiet_kineto, prime_cuda_profiler

    _quiet_kineto()
    activities = [torch.profiler.ProfilerActivity.CPU]
    on_cuda = device.type == "cuda"
    if on_cuda:
        prime_cuda_profiler()
        activities.append(torch.profiler.ProfilerActivity.CUDA)
        torch.cuda.synchronize(device)
    with contextlib.ExitStack() as stack, torch.no_grad():
        with warnings.catch_warnings():  # torch's once-per-process note about clearing events
            warnings.filterwarnings("ignore", message=".*Profiler clears events.*")
            prof = stack.enter_context(torch.profiler.profile(activities=activities))
        yield prof
        if on_cuda:
            torch.cuda.synchronize(device)


def _function(label: str | None, kernel: str, fallback: str, names: Mapping[str, str]) -> tuple[str, bool]:
    if label is not None and label.startswith(PLAN_LABEL):
        return label[len(PLAN_LABEL):], True
    if label is not None:
        return label[len(FUNCTION_LABEL):], False
    return names.get(kernel, fallback), False


def profile_kernels(
    run: Callable[[], Any],
    *,
    device: torch.device,
    passes: int = 3,
    label: bool = True,
    unlabelled_as: str = OUTSIDE,
    function_of: Mapping[str, str] | None = None,
) -> KernelProfile:
    """Profile `passes` calls of `run` (already warmed up) and return device time per pass by kernel and function.

    `label`: tie kernels to functions with labels (eager runs; see the module docstring). `unlabelled_as`: the
    function of work under no label (`OUTSIDE` in eager, `GRAPH` or `COMPILED` otherwise), unless `function_of`
    (kernel name -> function, from an eager profile) names it."""
    if passes < 1:
        raise ValueError(f"passes must be >= 1, got {passes}")
    on_cuda = device.type == "cuda"
    with profiler_session(device) as prof, contextlib.ExitStack() as stack:
        if label:
            stack.enter_context(labelled_functions())
        for _ in range(passes):
            run()
    names = dict(function_of or {})
    totals: dict[tuple[str, str, bool], list[float]] = defaultdict(lambda: [0, 0.0])
    for kernel, found, us in _rows(list(prof.events()), on_cuda):
        function, by_plan = _function(found, kernel, unlabelled_as, names)
        total = totals[(kernel, function, by_plan)]
        total[0] += 1
        total[1] += us
    frame = pd.DataFrame(
        [{"kernel": k, "function": f, "by_plan": p, "calls": c / passes, "device_ms": us / passes / 1000.0}
         for (k, f, p), (c, us) in totals.items()],
        columns=KERNEL_COLUMNS,
    ).sort_values("device_ms", ascending=False, ignore_index=True)
    return KernelProfile(frame, passes, str(device))
