"""Kernel time by module class: which `nn.Module` classes of a model hold its time, and how much of it is not a
`torch.nn.functional` call.

Why: kernel-forge replaces F calls, and on real models much of the time is not one. On the H200 a third of the
Hugging Face Llama's kernel time was outside F calls: `LlamaRMSNorm` (pow, mean, rsqrt and casts, no F call at all)
held 15%, and the rotary embedding, residual adds, the SwiGLU multiply and dtype casts sat in non-leaf forwards.
This profile names those classes, so a user (and the generator) sees what a module-level kernel could take.

How: every submodule's forward runs inside a `record_function("kforge.mod::<qualified class>")` range (forward
pre-hook and an always-called forward hook), and every F call inside its `kforge.fn::<name>` label
(`forge.profiler.kernels.labelled_functions`). A kernel (CUDA) or an ATen op's self time (CPU) then belongs to:
- `self`: the innermost module whose forward launched it (for a leaf class, everything it does);
- `inclusive`: every distinct class on the way up (a decoder layer includes its attention and MLP);
- `in_f` / `outside_f`: the part of `self` launched inside an F call, and the rest (the glue written in the module's
  own forward: residual adds, casts, elementwise math).
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
from torch import nn
from torch.autograd import DeviceType

from forge.profiler.kernels import FUNCTION_LABEL, PLAN_LABEL, labelled_functions, launching_call, profiler_session

__all__ = ["MODULE_LABEL", "MODULE_COLUMNS", "ModuleProfile", "Reach", "module_labels", "profile_modules"]

MODULE_LABEL = "kforge.mod::"
MODULE_COLUMNS = ["module_class", "leaf", "instances", "calls", "self_ms", "in_f_ms", "outside_f_ms",
                  "inclusive_ms", "self_pct", "outside_f_pct"]


def _class_name(module: nn.Module) -> str:
    kind = type(module)
    return f"{kind.__module__}.{kind.__qualname__}"


@contextlib.contextmanager
def module_labels(root: nn.Module) -> Iterator[dict[str, tuple[bool, int]]]:
    """Every submodule of `root` (itself included) runs inside its class's label while the block runs; yields the
    classes seen: qualified name -> (leaf, instances). Hooks are removed after, also on error."""
    classes: dict[str, tuple[bool, int]] = {}
    handles = []
    stacks: dict[int, list[Any]] = defaultdict(list)
    for module in root.modules():
        name = _class_name(module)
        leaf = next(module.children(), None) is None
        seen_leaf, count = classes.get(name, (True, 0))
        classes[name] = (seen_leaf and leaf, count + 1)
        label = MODULE_LABEL + name

        def enter(mod: nn.Module, args: Any, _label: str = label) -> None:
            scope = torch.profiler.record_function(_label)
            scope.__enter__()
            stacks[id(mod)].append(scope)

        def leave(mod: nn.Module, args: Any, output: Any) -> None:
            stack = stacks.get(id(mod))
            if stack:
                stack.pop().__exit__(None, None, None)

        handles.append(module.register_forward_pre_hook(enter))
        handles.append(module.register_forward_hook(leave, always_call=True))
    try:
        yield classes
    finally:
        for handle in handles:
            handle.remove()


@dataclass(frozen=True)
class ModuleProfile:
    """Per module class: device ms per pass (`frame`, largest self time first) and the model's total."""

    frame: pd.DataFrame
    total_ms: float
    passes: int

    def hot(self, top: int = 10) -> pd.DataFrame:
        """The classes holding the most self time (what a module kernel would replace)."""
        return self.frame.head(top)

    def reach(self, targets: Iterable[str]) -> Reach:
        """How much of the kernel time a plan can reach: every kernel launched inside an F call, plus the glue of
        the module classes in `targets` (qualified names; a module kernel replaces their whole forward)."""
        wanted = set(targets)
        total = self.total_ms
        in_f = float(self.frame["in_f_ms"].sum())
        targeted = self.frame[self.frame["module_class"].isin(wanted)]
        glue = float(targeted["outside_f_ms"].sum())
        rest = self.frame[~self.frame["module_class"].isin(wanted) & (self.frame["outside_f_ms"] > 0)]
        rest = rest.sort_values("outside_f_ms", ascending=False)
        share = (lambda ms: 100.0 * ms / total) if total else (lambda ms: 0.0)
        return Reach(in_f_pct=share(in_f), targets_pct=share(glue), total_ms=total,
                     unreached=tuple((row.module_class, share(row.outside_f_ms)) for row in rest.itertuples()))

    def outermost_blocks(self, model: nn.Module, min_share_percent: float = 1.0,
                         backbone_share: float = 0.5) -> list[str]:
        """The model's outermost blocks (qualified class names, model order): walking down from `model`, the first
        classes that were called and hold at least `min_share_percent` of the kernel time (inclusive), below the
        model itself, containers that are never called (`nn.ModuleList`) and a backbone called once per pass that
        holds more than `backbone_share` of it (Llama's `LlamaDecoderLayer`s inside `LlamaModel`, the ViT's
        `Block`s). A class with instances inside those blocks too is not one (Llama's final `LlamaRMSNorm`: its 32
        siblings are inside the layers, and a plan serves a class's instances alike)."""
        rows = {row.module_class: row for row in self.frame.itertuples()}
        total, outermost = self.total_ms, []

        def walk(parent: nn.Module) -> None:
            for child in parent.children():
                row = rows.get(_class_name(child))
                if row is None or row.calls == 0 or (row.calls <= 1 and row.inclusive_ms > backbone_share * total):
                    walk(child)  # never called (a container), or the backbone: the blocks are below
                elif total > 0 and row.inclusive_ms >= min_share_percent / 100 * total:
                    outermost.append(child)

        walk(model)
        inside = {_class_name(m) for block in outermost for m in block.modules() if m is not block}
        found: list[str] = []
        for block in outermost:
            name = _class_name(block)
            if name not in inside and name not in found:
                found.append(name)
        return found


@dataclass(frozen=True)
class Reach:
    """The share of a model's kernel time a plan can reach (`ModuleProfile.reach`): inside F calls, in the glue of
    targeted module classes, and the glue left out, per class (largest first)."""

    in_f_pct: float
    targets_pct: float
    total_ms: float
    unreached: tuple[tuple[str, float], ...]

    @property
    def reachable_pct(self) -> float:
        return self.in_f_pct + self.targets_pct

    def describe(self, top: int = 3) -> str:
        """One line: "reachable: 97.3% of 11.66 ms (68.5% in F calls, 28.8% in module targets); not: ..."."""
        line = (f"reachable: {self.reachable_pct:.1f}% of {self.total_ms:.3f} ms of kernel time "
                f"({self.in_f_pct:.1f}% in F calls, {self.targets_pct:.1f}% in module targets)")
        left = [f"{name.rsplit('.', 1)[-1]} {pct:.1f}%" for name, pct in self.unreached[:top] if pct >= 0.05]
        return line + (f"; not reached: {', '.join(left)}" if left else "")


def _chain(event: Any) -> tuple[list[str], bool]:
    """Module classes from the innermost outwards, and whether the innermost module's part is inside an F call."""
    modules: list[str] = []
    in_f = False
    current = event
    while current is not None:
        name = getattr(current, "name", None) or ""
        if name.startswith(MODULE_LABEL):
            modules.append(name[len(MODULE_LABEL):])
        elif not modules and name.startswith((FUNCTION_LABEL, PLAN_LABEL)):
            in_f = True
        current = getattr(current, "cpu_parent", None)
    return modules, in_f


def _timed_events(events: list[Any], on_cuda: bool) -> Iterator[tuple[Any, float]]:
    """(the CPU event to attribute, µs) per device kernel (CUDA) or per ATen op's self time (CPU)."""
    if not on_cuda:
        for event in events:
            if event.device_type == DeviceType.CPU and (event.name or "").startswith("aten::") \
                    and not getattr(event, "is_async", False):
                yield event, float(event.self_cpu_time_total)
        return
    cpu_by_id: dict[int, list[Any]] = defaultdict(list)
    for event in events:
        if event.device_type == DeviceType.CPU and not getattr(event, "is_async", False):
            cpu_by_id[event.id].append(event)
    for event in events:
        if event.device_type == DeviceType.CPU or getattr(event, "is_user_annotation", False):
            continue
        if (event.name or "").startswith((MODULE_LABEL, FUNCTION_LABEL, PLAN_LABEL)):
            continue
        launcher = launching_call(cpu_by_id.get(event.id, []))
        if launcher is not None:
            yield launcher, float(event.time_range.end - event.time_range.start)


def profile_modules(run: Callable[[], Any], model: nn.Module, *, device: torch.device, passes: int = 1
                    ) -> ModuleProfile:
    """Profile `passes` calls of `run` (which calls `model`; already warmed up) and attribute device time to
    module classes (see the module docstring)."""
    if passes < 1:
        raise ValueError(f"passes must be >= 1, got {passes}")
    on_cuda = device.type == "cuda"
    with profiler_session(device) as prof, contextlib.ExitStack() as stack:
        classes = stack.enter_context(module_labels(model))
        stack.enter_context(labelled_functions())
        for _ in range(passes):
            run()
    events = list(prof.events())
    calls = defaultdict(int)
    for event in events:
        if event.device_type == DeviceType.CPU and (event.name or "").startswith(MODULE_LABEL):
            calls[event.name[len(MODULE_LABEL):]] += 1
    self_us, in_f_us, inclusive_us = defaultdict(float), defaultdict(float), defaultdict(float)
    total = 0.0
    for event, us in _timed_events(events, on_cuda):
        modules, in_f = _chain(event)
        if not modules:
            continue  # outside the model
        total += us
        self_us[modules[0]] += us
        if in_f:
            in_f_us[modules[0]] += us
        for name in set(modules):
            inclusive_us[name] += us
    rows = []
    for name, (leaf, instances) in classes.items():
        own = self_us.get(name, 0.0) / passes / 1000.0
        inside = in_f_us.get(name, 0.0) / passes / 1000.0
        rows.append({"module_class": name, "leaf": leaf, "instances": instances, "calls": calls.get(name, 0) / passes,
                     "self_ms": own, "in_f_ms": inside, "outside_f_ms": own - inside,
                     "inclusive_ms": inclusive_us.get(name, 0.0) / passes / 1000.0,
                     "self_pct": 100.0 * own * passes * 1000.0 / total if total else 0.0,
                     "outside_f_pct": 100.0 * (own - inside) * passes * 1000.0 / total if total else 0.0})
    frame = pd.DataFrame(rows, columns=MODULE_COLUMNS).sort_values("self_ms", ascending=False, ignore_index=True)
    return ModuleProfile(frame, total / passes / 1000.0, passes)
