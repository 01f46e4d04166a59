"""Integrity of the judge: a snapshot of what a kernel could patch to fool an in-process oracle or timer.

WHY (kernels that patch the judge). A candidate's Python runs in the process that judges and times it (the sandbox
child, and the optimizer that finally times a winner). In the adversarial corpus (`tests/adversarial`), `type(t).any =
lambda *a: False` blinded every comparison of `forge.checking.compare`; replacing `Tensor.softmax` made the reference
(`F.softmax` calls it) run the candidate and slowed the baseline (selected at 1,150x on the H200); `Tensor.is_complex`
told the kernel when the oracle was looking; `time.perf_counter` and `torch.cuda.Event.elapsed_time` were replaced
(selected at 1,600x). Screening refuses the spellings it knows, but attributes reached through objects are endless, so
the harness also checks the objects themselves: `Snapshot.take()` records the identity of every attribute the judge and
the timers resolve, `Snapshot.changes()` names each one that is now a different object (or was added to a class and now
shadows the inherited one), `Snapshot.check()` raises `IntegrityError` naming them, and `Snapshot.restore()` puts the
originals back so the rest of the run is judged by the real functions.

What is covered (`Group`): every attribute of `torch.Tensor` (its own `__dict__`, where a patch lands: the C base
`TensorBase` is immutable), the `torch` functions the oracle, the references and the timers call, `time`'s clocks,
`torch.cuda`'s synchronisation and `Event` (a Python class whose methods can be replaced), the builtins the
comparisons use, the module-level functions of `forge.checking`'s own modules, and the interpreter state a kernel
could use to intercept everything (torch function / dispatch mode stacks). `torch.nn.functional` and the oracle's
references (`forge.functional._ORIGINALS`) are in `Group.FUNCTIONAL`: forge itself routes `F.*` while profiling and
while a plan is applied, so that group is only compared within one candidate's validation (`KernelUtils.validate`
snapshots it when it starts), never against the import-time baseline.

Limits: this is defence in depth inside a process the kernel shares. A kernel that patches the checker itself
(`Snapshot.changes`) blinds it; such code has to name forge's own modules, which screening refuses, and the verdict
process (the comparison runs where the kernel's code never runs) is the boundary that does not depend on it.

`baseline()` is taken when `forge.checking` is first imported, i.e. before any candidate code is imported (the
sandbox child imports `forge.checking` before the kernel file; the optimizer imports it at start). Cost, measured on
the 2-core CI machine under load: `take()` and `changes()` ~4.5 ms each (about 1,400 identities), so it runs
around every validation and every benchmark. Importing `torch._dynamo`, `torch._inductor` and `triton`, running
`torch.compile` and the Triton interpreter leave every covered identity unchanged (`test_integrity.py` checks the
dynamo import and the interpreter). Python caches `__slotnames__` on classes it pickles (`torch.save` does): ignored.
"""

from __future__ import annotations

import builtins
import logging
import math
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812

from forge.errors import CandidateError

__all__ = ["STABLE_GROUPS", "Change", "ChangeKind", "Group", "IntegrityError", "Snapshot", "baseline",
           "extend_baseline", "verify_baseline"]

logger = logging.getLogger(__name__)

_ABSENT = object()


class Group(StrEnum):
    """What a snapshot covers."""

    TENSOR = "torch.Tensor"
    TORCH = "torch"
    TIMERS = "time"
    CUDA = "torch.cuda"
    BUILTINS = "builtins"
    HARNESS = "forge.checking"
    MODES = "torch modes"
    FUNCTIONAL = "torch.nn.functional"


# Groups nobody in forge patches on purpose: safe to compare against the import-time baseline.
STABLE_GROUPS = frozenset(Group) - {Group.FUNCTIONAL}

# `torch` functions used by the oracle (compare, expectation, tolerance, poison, probes), the benchmark and common
# references. Not all of `torch`: importing torch._dynamo rewraps e.g. `torch.manual_seed` on purpose.
_TORCH_NAMES = (
    "abs", "all", "allclose", "any", "as_strided", "cat", "clone", "empty", "empty_like", "empty_strided", "equal",
    "exp", "full", "full_like", "isclose", "isfinite", "isinf", "isnan", "isneginf", "isposinf", "layer_norm",
    "group_norm", "rms_norm", "load", "save", "log_softmax", "matmul", "max", "maximum", "mean", "min", "minimum",
    "nonzero", "ones", "ones_like", "rand", "randint", "randn", "softmax", "sqrt", "rsqrt", "stack", "sum", "tanh",
    "topk", "view_as_real", "where", "zeros", "zeros_like", "no_grad", "Generator", "Tensor", "finfo", "iinfo",
)
_TIME_NAMES = ("perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "time", "time_ns", "process_time",
               "sleep")
_CUDA_NAMES = ("synchronize", "current_stream", "Event", "Stream", "CUDAGraph", "graph")
_BUILTIN_NAMES = ("abs", "all", "any", "bool", "float", "int", "isinstance", "len", "max", "min", "round", "sorted",
                  "sum", "type", "getattr", "hasattr", "id", "repr", "str", "tuple", "list", "dict", "zip", "range")
_HARNESS_MODULES = ("forge.checking.compare", "forge.checking.expectation", "forge.checking.tolerance",
                    "forge.checking.validation", "forge.checking.poison", "forge.checking.benchmarking",
                    "forge.checking.probes", "forge.checking.inputs", "forge.checking.distribution",
                    "forge.checking.kernel_utils", "forge.checking.integrity", "forge.samples", "forge.outcome")


# Attributes Python itself caches on classes: `copyreg` adds `__slotnames__` the first time an instance is pickled
# (`torch.save` in the sealed expectation does).
_CACHED_BY_PYTHON = frozenset({"__slotnames__"})


class ChangeKind(StrEnum):
    REPLACED = "replaced"
    ADDED = "added"  # set on a class where it was inherited before: it now shadows the original
    REMOVED = "removed"
    STATE = "changed"


@dataclass(frozen=True)
class Change:
    """One attribute (or piece of interpreter state) that is not what it was when the snapshot was taken."""

    name: str
    kind: ChangeKind
    group: Group

    def describe(self) -> str:
        return f"{self.name} was {self.kind.value}"


class IntegrityError(CandidateError, RuntimeError):
    """What judges or times a candidate was changed (monkey-patched) while untrusted code could run; `changes`
    names each attribute. The snapshot's originals have been put back when `restored` is True."""

    outcome = "mismatch"  # as the integrity probe reports a patch during validation

    def __init__(self, changes: Iterable[Change], *, when: str = "", restored: bool = False) -> None:
        self.changes = tuple(changes)
        self.restored = restored
        self.when = when
        listed = ", ".join(c.describe() for c in self.changes[:8])
        more = f" and {len(self.changes) - 8} more" if len(self.changes) > 8 else ""
        where = f" {when}" if when else ""
        super().__init__(f"integrity check failed{where}: what judges the kernel was monkey-patched: {listed}{more}")


@dataclass(frozen=True)
class _Slot:
    """One attribute: `owner.attr`, its value when taken (`_ABSENT` when it was not in the owner's own dict)."""

    name: str
    group: Group
    owner: Any
    attr: str
    value: Any
    in_dict: bool  # a class attribute read from the class's own __dict__ (so inherited ones are `_ABSENT`)

    def current(self) -> Any:
        if self.in_dict:
            return vars(self.owner).get(self.attr, _ABSENT)
        return getattr(self.owner, self.attr, _ABSENT)


class Snapshot:
    """Identities of everything in `groups` at the time of `take()` (see the module docstring)."""

    def __init__(self, slots: list[_Slot], states: dict[str, tuple[Group, Callable[[], Any], Any]]) -> None:
        self._slots = slots
        self._states = states

    @classmethod
    def take(cls, groups: Iterable[Group] = tuple(Group)) -> Snapshot:
        wanted = set(groups)
        slots: list[_Slot] = []
        for group in wanted:
            for name, owner, attr, in_dict in _targets(group):
                value = vars(owner).get(attr, _ABSENT) if in_dict else getattr(owner, attr, _ABSENT)
                slots.append(_Slot(name, group, owner, attr, value, in_dict))
        states = {name: (group, read, read()) for name, (group, read) in _STATES.items() if group in wanted}
        return cls(slots, states)

    @property
    def groups(self) -> frozenset[Group]:
        return frozenset(s.group for s in self._slots) | frozenset(g for g, _, _ in self._states.values())

    def restricted(self, groups: Iterable[Group]) -> Snapshot:
        """The same snapshot limited to `groups`."""
        keep = set(groups)
        return Snapshot([s for s in self._slots if s.group in keep],
                        {k: v for k, v in self._states.items() if v[0] in keep})

    def changes(self) -> list[Change]:
        """Every covered attribute that is now another object, and class attributes added since (they shadow)."""
        found: list[Change] = []
        for slot in self._slots:
            now = slot.current()
            if now is slot.value:
                continue
            kind = (ChangeKind.ADDED if slot.value is _ABSENT else
                    ChangeKind.REMOVED if now is _ABSENT else ChangeKind.REPLACED)
            found.append(Change(slot.name, kind, slot.group))
        found += self._added_class_attributes()
        for name, (group, read, before) in self._states.items():
            try:
                now = read()
            except Exception:  # noqa: BLE001 - unreadable state counts as changed
                now = _ABSENT
            if now != before:
                found.append(Change(name, ChangeKind.STATE, group))
        return found

    def check(self, when: str = "", *, restore: bool = True) -> None:
        """Raise `IntegrityError` naming every change (after putting the originals back when `restore`)."""
        changes = self.changes()
        if not changes:
            return
        if restore:
            self.restore()
        raise IntegrityError(changes, when=when, restored=restore)

    def restore(self) -> None:
        """Put every covered attribute back to its snapshot value (and delete class attributes added since)."""
        for slot in self._slots:
            if slot.current() is slot.value:
                continue
            try:
                if slot.value is _ABSENT:
                    delattr(slot.owner, slot.attr)
                else:
                    setattr(slot.owner, slot.attr, slot.value)
            except (AttributeError, TypeError) as exc:
                logger.warning("could not restore %s: %s", slot.name, exc)
        for change in self._added_class_attributes():
            owner, attr = self._class_of(change.name)
            try:
                delattr(owner, attr)
            except (AttributeError, TypeError) as exc:
                logger.warning("could not remove %s: %s", change.name, exc)

    # -- class attributes added after the snapshot --------------------------------------------------------
    def _class_slots(self) -> dict[str, tuple[Any, set[str]]]:
        classes: dict[str, tuple[Any, set[str]]] = {}
        for slot in self._slots:
            if slot.in_dict:
                label = slot.name[: -len(slot.attr) - 1]
                classes.setdefault(label, (slot.owner, set()))[1].add(slot.attr)
        return classes

    def _added_class_attributes(self) -> list[Change]:
        found = []
        for label, (owner, known) in self._class_slots().items():
            group = next(s.group for s in self._slots if s.owner is owner)
            for attr in vars(owner):
                if attr not in known and attr not in _CACHED_BY_PYTHON:
                    found.append(Change(f"{label}.{attr}", ChangeKind.ADDED, group))
        return found

    def _class_of(self, name: str) -> tuple[Any, str]:
        label, _, attr = name.rpartition(".")
        return self._class_slots()[label][0], attr


# ---------------------------------------------------------------------------------------------------------
# What each group covers
# ---------------------------------------------------------------------------------------------------------
def _class_targets(label: str, cls: type, group: Group) -> list[tuple[str, Any, str, bool]]:
    """Every name of the class's own __dict__ plus every inherited public name (absent from the dict now: a patch
    that sets it on the class is an addition)."""
    names = set(vars(cls))
    names |= {n for n in dir(cls) if not n.startswith("_") or (n.startswith("__") and n.endswith("__"))}
    names -= _CACHED_BY_PYTHON
    return [(f"{label}.{n}", cls, n, True) for n in sorted(names)]


def _module_targets(label: str, module: Any, names: Iterable[str]) -> list[tuple[str, Any, str, bool]]:
    return [(f"{label}.{n}", module, n, False) for n in names if hasattr(module, n)]


def _targets(group: Group) -> list[tuple[str, Any, str, bool]]:
    if group is Group.TENSOR:
        return _class_targets("torch.Tensor", torch.Tensor, group)
    if group is Group.TORCH:
        return _module_targets("torch", torch, _TORCH_NAMES)
    if group is Group.TIMERS:
        return _module_targets("time", time, _TIME_NAMES)
    if group is Group.CUDA:
        found = _module_targets("torch.cuda", torch.cuda, _CUDA_NAMES)
        event = getattr(torch.cuda, "Event", None)
        if isinstance(event, type):
            found += [t for t in _class_targets("torch.cuda.Event", event, group)
                      if not t[2].startswith("__") or t[2] in vars(event)]
        return found
    if group is Group.BUILTINS:
        return _module_targets("builtins", builtins, _BUILTIN_NAMES) + _module_targets(
            "math", math, [n for n in vars(math) if not n.startswith("_")])
    if group is Group.HARNESS:
        found = []
        for module_name in _HARNESS_MODULES:
            module = sys.modules.get(module_name)
            if isinstance(module, ModuleType):
                names = [n for n, v in vars(module).items() if not n.startswith("__") and callable(v)]
                found += _module_targets(module_name, module, names)
        for cls in (Snapshot, _Slot):  # the checker itself: a patched `changes` would report nothing
            found += [t for t in _class_targets(f"forge.checking.integrity.{cls.__name__}", cls, group)
                      if t[2] in vars(cls)]
        return found
    if group is Group.FUNCTIONAL:
        found = _module_targets("torch.nn.functional", F, [n for n in vars(F) if not n.startswith("_")])
        originals = _originals()
        if originals is not None:
            found += [(f"forge.functional._ORIGINALS[{n!r}]", _DictView(originals), n, False) for n in originals]
        return found
    return []


class _DictView:
    """A dict's items as attributes (so `_ORIGINALS["gelu"]` is checked and restored like an attribute)."""

    def __init__(self, data: dict[str, Any]) -> None:
        object.__setattr__(self, "_data", data)

    def __getattr__(self, name: str) -> Any:
        try:
            return self._data[name]
        except KeyError as exc:
            raise AttributeError(name) from exc

    def __setattr__(self, name: str, value: Any) -> None:
        self._data[name] = value

    def __delattr__(self, name: str) -> None:
        self._data.pop(name, None)


def _originals() -> dict[str, Any] | None:
    module = sys.modules.get("forge.functional")
    value = getattr(module, "_ORIGINALS", None) if module is not None else None
    return value if isinstance(value, dict) else None


def _function_mode_depth() -> int:
    return int(torch._C._len_torch_function_stack())


def _dispatch_mode_depth() -> int:
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    return len(_get_current_dispatch_mode_stack())


_STATES: dict[str, tuple[Group, Callable[[], Any]]] = {
    "the torch function mode stack": (Group.MODES, _function_mode_depth),
    "the torch dispatch mode stack": (Group.MODES, _dispatch_mode_depth),
}


# Taken when `forge.checking` is first imported (before candidate code); `forge.checking.__init__` adds the
# harness's own modules once they are loaded (`extend_baseline`).
_BASELINE: Snapshot = Snapshot.take(STABLE_GROUPS - {Group.HARNESS})


def baseline() -> Snapshot:
    """The import-time snapshot of the stable groups (everything but `Group.FUNCTIONAL`)."""
    return _BASELINE


def extend_baseline() -> None:
    """Add the harness modules (loaded after this one) to the baseline; called once by `forge.checking`."""
    global _BASELINE
    if Group.HARNESS not in _BASELINE.groups:
        harness = Snapshot.take([Group.HARNESS])
        _BASELINE = Snapshot(_BASELINE._slots + harness._slots, dict(_BASELINE._states))


def verify_baseline(when: str = "") -> None:
    """Raise `IntegrityError` (originals restored) when a stable group changed since `forge.checking` was imported."""
    _BASELINE.check(when)
