"""`CompiledFunctionProvider`: `torch.compile` of one functional, specialised to each sampled signature.

Every validated call signature gets its own compiled callable (a fresh code object, `dynamic=False`), so Dynamo's
per-code-object recompile limit never silently drops a signature back to eager, and no signature's guards slow the
others down. A plan restored on another process compiles lazily on the first call of each signature.

`fullgraph` defaults to False on purpose: one functional is one graph anyway, and with `fullgraph=True` a single
call under a `TorchDispatchMode` (the oracle's poisoned-allocation runs) makes Dynamo refuse that frame for good.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable
from typing import Any

import torch

from forge.functional import original_function
from forge.provider import KernelProvider
from forge.samples import Sample, clone_value, signature_of

__all__ = ["CompiledFunctionProvider"]

logger = logging.getLogger(__name__)

# Modes whose CUDA graphs reuse output buffers across calls: an output would be overwritten by the next call.
_CUDAGRAPH_MODES = {"reduce-overhead", "max-autotune"}
_MODES = {None, "default", "max-autotune-no-cudagraphs"}


def _fresh_caller(target: Callable) -> Callable:
    """A new function object with its own code object that forwards to `target`."""
    namespace: dict[str, Any] = {"_target": target}
    exec("def kforge_compiled_call(*args, **kwargs):\n    return _target(*args, **kwargs)\n", namespace)  # noqa: S102
    return namespace["kforge_compiled_call"]


class CompiledFunctionProvider(KernelProvider, type_name="torch_compile"):
    """`torch.compile(torch.nn.functional.<function_name>, dynamic=False)` per call signature."""

    # Inductor is trusted PyTorch code; a call under the oracle's TorchDispatchMode would make Dynamo recompile
    # this frame into an eager-like graph (so the benchmark would no longer time Inductor's kernels).
    allows_dispatch_poisoning = False

    def __init__(self, function_name: str, mode: str | None = None, *, fullgraph: bool = False) -> None:
        super().__init__()
        if mode in _CUDAGRAPH_MODES:
            raise ValueError(
                f"torch.compile mode {mode!r} uses CUDA graphs, whose outputs are overwritten by the next call of "
                "the same graph; use mode='max-autotune-no-cudagraphs' or the default mode"
            )
        if mode not in _MODES:
            choices = sorted(m for m in _MODES if m)
            raise ValueError(f"unknown torch.compile mode {mode!r}; use one of {choices} or None")
        self.function_name = function_name
        self._target = original_function(function_name)
        self.mode = None if mode == "default" else mode
        self.fullgraph = fullgraph
        self._compiled: dict[Hashable, Callable] = {}
        self._lock = threading.Lock()

    @property
    def supported_function(self) -> str:
        return self.function_name

    @property
    def name(self) -> str:
        return f"torch.compile({self.function_name}{', mode=' + self.mode if self.mode else ''})"

    def _compile(self, key: Hashable) -> Callable:
        with self._lock:
            fn = self._compiled.get(key)
            if fn is None:
                fn = torch.compile(_fresh_caller(self._target), mode=self.mode, dynamic=False, fullgraph=self.fullgraph)
                self._compiled[key] = fn
            return fn

    def _prepare(self, samples: list[Sample]) -> bool:
        for index, sample in enumerate(samples):
            args, kwargs = clone_value(tuple(sample.args)), clone_value(dict(sample.kwargs))
            try:
                with torch.no_grad():
                    self._compile(signature_of(args, kwargs))(*args, **kwargs)
            except Exception as exc:
                logger.info("%s failed to compile sample %d %s: %s", self.name, index, sample.describe(), exc)
                return False
        return True

    def _call(self, *args: Any, **kwargs: Any) -> Any:
        key = signature_of(args, kwargs)
        fn = self._compiled.get(key)
        if fn is None:
            fn = self._compile(key)
        return fn(*args, **kwargs)

    def _to_dict(self) -> dict[str, Any]:
        return {"function_name": self.function_name, "mode": self.mode, "fullgraph": self.fullgraph}

    @classmethod
    def _from_dict(cls, state: dict[str, Any]) -> CompiledFunctionProvider:
        return cls(state["function_name"], state.get("mode"), fullgraph=bool(state.get("fullgraph", False)))
