"""Profiler labels, and how the events of a `torch.profiler` session are turned into time per label.

Every intercepted call runs inside `record_function("kforge::<function>::<sample id>")`; the module's forward
runs inside `"kforge::module"` and the profiler's own bookkeeping (signatures, sample clones) inside
`"kforge::overhead"`, which is counted nowhere. Time goes to the NEAREST enclosing label (walking `cpu_parent`),
so a functional called by another functional (e.g. `linear` inside `multi_head_attention_forward`) gets its own
time and the outer one keeps only the rest:

- CUDA: the duration of every device event (kernel, memcpy, memset) whose launching runtime call (same
  correlation id) sits under the label. Every launch counts, also those with no aten op around them (Triton);
  only the GPU-side mirrors of user annotations are skipped.
- CPU: the label's CPU time minus the CPU time of the labels directly nested in it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from torch.autograd import DeviceType

__all__ = [
    "LABEL_PREFIX",
    "MODULE_LABEL",
    "OVERHEAD_LABEL",
    "LabelTimes",
    "attribute_cpu_time",
    "attribute_device_time",
    "function_label",
    "nearest_label",
    "parse_function_label",
]

LABEL_PREFIX = "kforge::"
MODULE_LABEL = "kforge::module"
OVERHEAD_LABEL = "kforge::overhead"


def function_label(name: str, sample_id: int) -> str:
    """`"kforge::linear::0"`: the label of one call of `name` with its `sample_id`-th unique signature."""
    return f"{LABEL_PREFIX}{name}::{sample_id}"


def parse_function_label(label: str) -> tuple[str, int] | None:
    """`"kforge::linear::0"` -> `("linear", 0)`; None for the module/overhead labels and anything else."""
    if not label.startswith(LABEL_PREFIX):
        return None
    name, sep, sample_id = label[len(LABEL_PREFIX) :].rpartition("::")
    if not sep or not name or not sample_id.isdigit():
        return None
    return name, int(sample_id)


def nearest_label(event: Any) -> Any | None:
    """The event itself or its nearest `cpu_parent` whose name starts with `kforge::`; None when there is none."""
    current = event
    while current is not None:
        if (getattr(current, "name", None) or "").startswith(LABEL_PREFIX):
            return current
        current = getattr(current, "cpu_parent", None)
    return None


@dataclass(frozen=True)
class LabelTimes:
    """Time (µs, summed over the whole session) of the module and of each `(function, sample id)`."""

    module_us: float
    function_us: dict[tuple[str, int], float]


def _is_cpu_event(event: Any) -> bool:
    return getattr(event, "device_type", DeviceType.CPU) == DeviceType.CPU


def _collect(self_us: Iterable[tuple[str, float]]) -> LabelTimes:
    """Sum self times by label: function labels per `(name, id)`; module + function labels into the module total."""
    module_us = 0.0
    function_us: dict[tuple[str, int], float] = defaultdict(float)
    for label, us in self_us:
        if label == MODULE_LABEL:
            module_us += us
            continue
        parsed = parse_function_label(label)
        if parsed is None:  # overhead or a foreign label: counted nowhere
            continue
        function_us[parsed] += us
        module_us += us
    return LabelTimes(module_us=module_us, function_us=dict(function_us))


def _duration_us(event: Any) -> float:
    time_range = event.time_range
    return float(time_range.end - time_range.start)


def _is_label_or_annotation(event: Any) -> bool:
    return (event.name or "").startswith(LABEL_PREFIX) or bool(getattr(event, "is_user_annotation", False))


def _launching_event(candidates: list[Any]) -> Any | None:
    """Of the CPU events sharing a device event's correlation id, the runtime call that launched it."""
    calls = [e for e in candidates if not _is_label_or_annotation(e)]
    for event in calls:
        if (event.name or "").startswith(_RUNTIME_CALL_PREFIXES):
            return event
    return calls[0] if calls else None


_RUNTIME_CALL_PREFIXES = ("cu", "hip")


def attribute_device_time(events: Iterable[Any]) -> LabelTimes:
    """Device time per nearest label; work launched under no label (outside the module) is ignored.

    Every device event (kernel, memcpy, memset) is matched to the CPU runtime call that launched it
    (`cudaLaunchKernel`, `cuLaunchKernelEx`, `cudaMemcpyAsync`...: same correlation id), and that call's nearest
    label gets its duration. This also covers Triton launches, which no aten op encloses (torch links no kernel to
    any op for them), and never counts a kernel twice (torch copies an op's `kernels` onto lazy-loading events
    that share its id). GPU-side user-annotation spans (mirrors of labels) are not work and are skipped.
    """
    events = list(events)
    cpu_by_id: dict[int, list[Any]] = defaultdict(list)
    for event in events:
        if _is_cpu_event(event) and not getattr(event, "is_async", False):
            cpu_by_id[event.id].append(event)
    self_us: list[tuple[str, float]] = []
    for event in events:
        if _is_cpu_event(event) or _is_label_or_annotation(event):
            continue
        launcher = _launching_event(cpu_by_id.get(event.id, []))
        label = nearest_label(launcher) if launcher is not None else None
        if label is not None:
            self_us.append((label.name, _duration_us(event)))
    return _collect(self_us)


def attribute_cpu_time(events: Iterable[Any]) -> LabelTimes:
    """CPU time per label minus the CPU time of the labels directly nested in it."""
    labels = [
        e
        for e in events
        if _is_cpu_event(e) and not getattr(e, "is_async", False) and e.name.startswith(LABEL_PREFIX)
    ]
    nested_us: dict[int, float] = defaultdict(float)
    for event in labels:
        parent = nearest_label(getattr(event, "cpu_parent", None))
        if parent is not None:
            nested_us[id(parent)] += float(event.cpu_time_total)
    return _collect((e.name, max(float(e.cpu_time_total) - nested_us[id(e)], 0.0)) for e in labels)
