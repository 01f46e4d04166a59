"""Module-scoped interception of `torch.nn.functional`: count, sample and label the calls made inside one module.

`ModuleScopedInterception` is a context manager. On entry it registers a forward pre-hook and an always-called
forward hook on the root module (they keep a depth counter and open/close the `kforge::module` label) and
replaces each `torch.nn.functional.<name>` attribute with a wrapper. Outside the module's forward a wrapper just
calls the original; inside it records the call in a `CallRecorder` and runs the ORIGINAL function (from
`forge.functional.original_function`, never whatever is patched into `F` at the time) inside the label
`kforge::<name>::<sample id>`. On exit (also after an error, and after a failure half-way through entering)
every attribute is put back exactly as found and every hook is removed.

Patching is process-global: do not run other inference on the same process while it is active.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from forge.functional import original_function
from forge.profiler.attribution import MODULE_LABEL, OVERHEAD_LABEL, function_label
from forge.samples import Sample, clone_value, signature_of

__all__ = ["CallRecorder", "ModuleScopedInterception"]


class CallRecorder:
    """Calls per function and per unique signature; first-seen samples are cloned for the collected functions.

    Signatures come from `forge.samples.signature_of` (shape, dtype, device and strides of every tensor; type and
    value of everything else). A sample id is the index of its signature in first-seen order, per function.
    """

    def __init__(self, collected: Iterable[str]) -> None:
        self._collected = frozenset(collected)
        self._ids: dict[str, dict[Hashable, int]] = {}
        self._counts: dict[str, list[int]] = {}
        self._samples: dict[str, list[Sample]] = {}

    def record(self, name: str, args: tuple, kwargs: dict) -> int:
        """Count one call of `name`; returns its sample id (cloning the inputs the first time a signature shows)."""
        ids = self._ids.setdefault(name, {})
        key = signature_of(args, kwargs)
        sample_id = ids.get(key)
        if sample_id is None:
            sample_id = ids[key] = len(ids)
            self._counts.setdefault(name, []).append(0)
            if name in self._collected:
                sample = Sample(clone_value(tuple(args)), clone_value(dict(kwargs)))
                self._samples.setdefault(name, []).append(sample)
        self._counts[name][sample_id] += 1
        return sample_id

    def function_names(self) -> list[str]:
        """Functions called at least once, in first-call order."""
        return list(self._counts)

    def counts(self, name: str) -> list[int]:
        """Calls per sample id of `name`."""
        return list(self._counts.get(name, ()))

    def samples(self, name: str) -> list[Sample]:
        """Cloned first-seen samples of `name` per sample id (empty when `name` is not collected)."""
        return list(self._samples.get(name, ()))


class ModuleScopedInterception:
    """Intercepts `torch.nn.functional.<names>` while inside `module`'s forward (see the module docstring)."""

    def __init__(self, module: nn.Module, recorder: CallRecorder, names: Iterable[str]) -> None:
        self.module = module
        self.recorder = recorder
        self.names = list(names)
        self.depth = 0
        self.module_calls = 0
        self._module_label: Any = None
        self._saved: dict[str, Any] = {}
        self._handles: list[Any] = []

    # -- hooks --------------------------------------------------------------------------------------------
    def _enter_module(self, module: nn.Module, args: Any) -> None:
        if self.depth == 0:
            label = torch.profiler.record_function(MODULE_LABEL)
            label.__enter__()
            self._module_label = label
            self.module_calls += 1
        self.depth += 1

    def _leave_module(self, module: nn.Module, args: Any, output: Any) -> None:
        if self.depth <= 0:
            return
        self.depth -= 1
        if self.depth == 0:
            self._close_module_label()

    def _close_module_label(self) -> None:
        label, self._module_label = self._module_label, None
        if label is not None:
            label.__exit__(None, None, None)

    # -- wrappers -----------------------------------------------------------------------------------------
    def _make_wrapper(self, name: str, original: Callable) -> Callable:
        record_function = torch.profiler.record_function

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if self.depth <= 0:
                return original(*args, **kwargs)
            with record_function(OVERHEAD_LABEL):
                sample_id = self.recorder.record(name, args, kwargs)
            with record_function(function_label(name, sample_id)):
                return original(*args, **kwargs)

        wrapper.__kforge_profiler_wrapper__ = True  # type: ignore[attr-defined]
        return wrapper

    # -- context manager ----------------------------------------------------------------------------------
    def __enter__(self) -> ModuleScopedInterception:
        self.depth = 0
        self.module_calls = 0
        try:
            self._handles.append(self.module.register_forward_pre_hook(self._enter_module))
            self._handles.append(self.module.register_forward_hook(self._leave_module, always_call=True))
            for name in self.names:
                wrapper = self._make_wrapper(name, original_function(name))
                self._saved[name] = getattr(F, name)
                setattr(F, name, wrapper)
        except BaseException:
            self._restore()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._restore()

    def _restore(self) -> None:
        for name, value in self._saved.items():
            setattr(F, name, value)
        self._saved.clear()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._close_module_label()
        self.depth = 0
