"""Swap `torch.nn.functional` functions for a plan's providers while a module's forward runs.

A forward pre-hook installs one dispatch function per planned function and a forward hook (`always_call=True`, so
it also runs when forward raises) puts back exactly what was there before. Re-entrant forwards of the same module
are counted, not re-patched; nested runtimes on nested modules restore in LIFO order.

Signature guard: the dispatch function sends a call to the provider only when the call's signature (shapes,
dtypes, strides, devices and the exact non-tensor arguments) is one the provider was validated on, and grad is not
needed; everything else goes to the function that was in place before, so a kernel specialised to profiled shapes
never runs on inputs it was not checked on. Not thread-safe: `torch.nn.functional` is process-global, so do not run
other threads' forwards through the same functions while a planned forward runs.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Hashable, Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from forge.functional import original_function
from forge.samples import signature_of

if TYPE_CHECKING:
    from forge.plan import KernelOptimizationPlan, PlanEntry

__all__ = ["KernelProviderRuntime", "DispatchStats"]

logger = logging.getLogger(__name__)


class DispatchStats:
    """Per-function counters of calls sent to the provider, to the fallback, and provider failures."""

    __slots__ = ("provider_calls", "fallback_calls", "provider_errors")

    def __init__(self) -> None:
        self.provider_calls = 0
        self.fallback_calls = 0
        self.provider_errors = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "provider_calls": self.provider_calls,
            "fallback_calls": self.fallback_calls,
            "provider_errors": self.provider_errors,
        }


def _make_dispatch(
    name: str, provider: Callable, keys: frozenset[Hashable], previous: Callable[[], Callable], stats: DispatchStats
) -> Callable:
    """A plain function named like the torch function (tracers see a FunctionType, not the provider object)."""
    key_of = signature_of
    grad_enabled = torch.is_grad_enabled
    Tensor = torch.Tensor

    def dispatch(*args: Any, **kwargs: Any) -> Any:
        if key_of(args, kwargs) in keys and not (
            grad_enabled() and any(isinstance(a, Tensor) and a.requires_grad for a in args)
        ):
            stats.provider_calls += 1
            try:
                return provider(*args, **kwargs)
            except Exception:
                stats.provider_errors += 1
                if stats.provider_errors == 1:
                    logger.warning("provider for %s raised; falling back to PyTorch for this call", name, exc_info=True)
        stats.fallback_calls += 1
        return previous()(*args, **kwargs)

    dispatch.__name__ = name
    dispatch.__qualname__ = name
    dispatch.__doc__ = f"kernel-forge dispatch for torch.nn.functional.{name} (guarded by validated signatures)"
    return dispatch


class KernelProviderRuntime:
    """Applies a `KernelOptimizationPlan` to a module through forward hooks."""

    def __init__(self, module: nn.Module, plan: KernelOptimizationPlan) -> None:
        if not isinstance(module, nn.Module):
            raise TypeError(f"a plan is applied to an nn.Module, got {type(module).__name__}")
        self.module = module
        self.plan = plan
        self._handles: list[Any] = []
        self._depth = 0
        self._saved: dict[str, Callable] = {}
        self.stats: dict[str, DispatchStats] = {}
        self._dispatch: dict[str, Callable] = {}
        # Resolve everything up front: an unknown function or a provider that cannot load fails here,
        # before any hook is registered, so nothing is half-applied.
        for entry in plan.entries:
            name = entry.function
            original_function(name)
            if not hasattr(F, name):
                raise ValueError(
                    f"torch.nn.functional has no attribute {name!r}; this plan needs another torch version"
                )
            entry.provider.load_runtime_dependencies()
            stats = DispatchStats()
            self.stats[name] = stats
            self._dispatch[name] = _make_dispatch(
                name, entry.provider, entry.signature_keys, self._previous_getter(name), stats
            )

    def _previous_getter(self, name: str) -> Callable[[], Callable]:
        saved = self._saved

        def previous() -> Callable:
            fn = saved.get(name)
            return fn if fn is not None else original_function(name)

        return previous

    @property
    def entries(self) -> tuple[PlanEntry, ...]:
        return self.plan.entries

    @property
    def is_active(self) -> bool:
        return bool(self._handles)

    # -- hooks --------------------------------------------------------------------------------------------
    def _install(self) -> None:
        done: list[str] = []
        try:
            for name, dispatch in self._dispatch.items():
                self._saved[name] = getattr(F, name)
                setattr(F, name, dispatch)
                done.append(name)
        except BaseException:
            for name in reversed(done):
                setattr(F, name, self._saved.pop(name))
            raise

    def _restore(self) -> None:
        for name in reversed(list(self._saved)):
            setattr(F, name, self._saved.pop(name))

    def _pre_hook(self, module: nn.Module, args: Any) -> None:
        if self._depth == 0:
            self._install()
        self._depth += 1

    def _post_hook(self, module: nn.Module, args: Any, output: Any) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._restore()

    # -- activation ---------------------------------------------------------------------------------------
    def activate(self) -> None:
        """Register the hooks (idempotent). An empty plan registers nothing."""
        if self._handles or not self._dispatch:
            return
        try:
            self._handles.append(self.module.register_forward_pre_hook(self._pre_hook))
            self._handles.append(self.module.register_forward_hook(self._post_hook, always_call=True))
        except BaseException:
            self.deactivate()
            raise

    def deactivate(self) -> None:
        """Remove the hooks and put back anything still patched (idempotent)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self._saved:
            self._restore()
        self._depth = 0

    @contextlib.contextmanager
    def applied(self) -> Iterator[KernelProviderRuntime]:
        """Active inside the block (under `torch.no_grad()`); a runtime that was already active stays active."""
        was_active = self.is_active
        self.activate()
        try:
            with torch.no_grad():
                yield self
        finally:
            if not was_active:
                self.deactivate()

    def stats_frame(self) -> Any:
        """Dispatch counters per function as a pandas DataFrame."""
        import pandas as pd

        return pd.DataFrame([{"function": name, **s.as_dict()} for name, s in self.stats.items()])
