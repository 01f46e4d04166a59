"""Harness-owned hooks on Triton's runtime (installed once per process, before a candidate is imported).

1. Launch counting for the run-time launch check (`forge.checking.launch_check`), installed by
   `TritonLanguage.launch_monitor()` (the processes that judge candidates), never by a plain `load` (production keeps
   Triton's own launch path: a pass-through wrapper costs 0.5-1.4 us a call on the 2-core CI machine, measured with
   `timeit`, against a 4.4-5.7 us cached launch). `JITFunction.run`, `InterpretedFunction.run` (the CPU
   interpreter), `Autotuner.run`, `Heuristics.run` and the runners returned by `CompiledKernel.__getitem__` (a launch
   of the compiled kernel a launch returned) count one launch per outermost call while a watch is active (warm-ups do
   not count); the cached launcher of `agent.languages.triton.launch` counts its own hits, which bypass
   `JITFunction.run`, and its JIT fallback is re-bound to the counting `JITFunction.run` when the hooks arrive after
   the candidate was loaded. A launch inside another (an autotuner benchmarking its configs, a heuristics wrapper's
   inner call) is part of it.
2. One config on the interpreter, installed by `TritonLanguage.load` when `TRITON_INTERPRET` is on: there is no
   device to time, and `Autotuner.run` with several configs fails ("0 active drivers": an honest
   autotuned softmax was rejected on CPU). An autotuner whose kernel is interpreted runs its first config instead
   (what a one-config autotuner does); on a GPU nothing is patched.

The candidate runs in the same process, so a kernel file could in principle tamper with these hooks; the static
screen forbids the constructs needed (attribute assignment outside `self`, reflection, `sys`, Triton internals).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from typing import Any

from forge.checking.launch_check import counting

__all__ = ["install_interpreter_autotune", "install_triton_hooks", "interpreting", "kernel_name", "remove_triton_hooks"]

logger = logging.getLogger(__name__)


def kernel_name(kernel: Any) -> str:
    """The Python name of a Triton kernel object (JIT, interpreted, autotuned, heuristics or compiled)."""
    seen = 0
    value = kernel
    while hasattr(value, "fn") and seen < 8:
        value, seen = value.fn, seen + 1
    name = getattr(value, "__name__", None) or getattr(kernel, "name", None)
    return str(name) if name else type(kernel).__name__


def _is_warmup(kwargs: dict[str, Any]) -> bool:
    return bool(kwargs.get("warmup"))


def _interpreted(autotuner: Any) -> bool:
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:  # pragma: no cover - every supported Triton has the interpreter
        return False
    value, depth = autotuner.fn, 0
    while not isinstance(value, InterpretedFunction) and hasattr(value, "fn") and depth < 8:
        value, depth = value.fn, depth + 1
    return isinstance(value, InterpretedFunction)


def _first_config_when_interpreted(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        configs = self.configs
        if len(configs) <= 1:
            return original(self, *args, **kwargs)
        interpreted = self.__dict__.get("_kforge_interpreted")
        if interpreted is None:  # fixed at decoration time; cached so a GPU launch pays one dict read
            interpreted = self.__dict__["_kforge_interpreted"] = _interpreted(self)
        if not interpreted:
            return original(self, *args, **kwargs)
        self.configs = configs[:1]
        try:
            return original(self, *args, **kwargs)
        finally:
            self.configs = configs

    return run


def _counted_runners(original: Callable[..., Any]) -> Callable[..., Any]:
    """`CompiledKernel.__getitem__(grid)` returns a runner; make each runner call count as a launch."""

    @functools.wraps(original)
    def getitem(self: Any, grid: Any) -> Any:
        runner = original(self, grid)
        return functools.partial(_COUNTED_RUN, self, runner)

    return getitem


def _run_runner(kernel: Any, runner: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return runner(*args, **kwargs)


_COUNTED_RUN = counting(_run_runner, kernel_name)


_ORIGINALS: dict[tuple[type, str, str], Callable[..., Any]] = {}


def _wrap(cls: type, attribute: str, tag: str, wrapper: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Wrap `cls.attribute` once per `tag` (hooks of different tags stack)."""
    key = (cls, attribute, tag)
    original = vars(cls).get(attribute)
    if key in _ORIGINALS or original is None:
        return
    _ORIGINALS[key] = original
    setattr(cls, attribute, wrapper(original))


def _triton_classes() -> dict[str, type] | None:
    try:
        from triton.runtime.autotuner import Autotuner, Heuristics
        from triton.runtime.interpreter import InterpretedFunction
        from triton.runtime.jit import JITFunction
    except ImportError:
        return None
    classes = {"JITFunction": JITFunction, "InterpretedFunction": InterpretedFunction, "Autotuner": Autotuner,
               "Heuristics": Heuristics}
    try:
        from triton.compiler.compiler import CompiledKernel
    except ImportError:  # pragma: no cover
        return classes
    return classes | {"CompiledKernel": CompiledKernel}


def _count(original: Callable[..., Any]) -> Callable[..., Any]:
    return counting(original, kernel_name, _is_warmup)


def install_triton_hooks() -> None:
    """Install the launch-counting hooks (idempotent); without Triton this does nothing."""
    classes = _triton_classes()
    if classes is None:
        return
    for name in ("JITFunction", "InterpretedFunction", "Heuristics", "Autotuner"):
        _wrap(classes[name], "run", "count", _count)
    if "CompiledKernel" in classes:
        _wrap(classes["CompiledKernel"], "__getitem__", "count", _counted_runners)
    from agent.languages.triton.launch import refresh_slow_paths

    refreshed = refresh_slow_paths()
    logger.debug("Triton launch-counting hooks installed (%d cached launchers re-bound)", refreshed)


def interpreting() -> bool:
    """Whether `triton.jit` makes interpreted kernels now (`TRITON_INTERPRET`)."""
    try:
        from triton import knobs

        return bool(knobs.runtime.interpret)
    except (ImportError, AttributeError):  # pragma: no cover - older Triton: the environment variable
        return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")


def install_interpreter_autotune() -> None:
    """Make autotuners of interpreted kernels run their first config (idempotent; only call when interpreting)."""
    classes = _triton_classes()
    if classes is not None:
        _wrap(classes["Autotuner"], "run", "first_config", _first_config_when_interpreted)


def remove_triton_hooks() -> None:
    """Restore Triton's own methods (tests)."""
    for (cls, attribute, _tag), original in reversed(list(_ORIGINALS.items())):
        setattr(cls, attribute, original)
    _ORIGINALS.clear()
    from agent.languages.triton.launch import refresh_slow_paths

    refresh_slow_paths()
