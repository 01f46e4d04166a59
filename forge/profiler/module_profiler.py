"""`ModuleFunctionKernelProfiler`: which `torch.nn.functional` calls a module makes, with what inputs, and how long.

`profile(function, data, module=...)` runs `function` over the data: first `warmup_iterations` plain passes,
then `profile_iterations` passes under `torch.profiler` with every replaceable functional intercepted inside the
module's forward only (see `forge.profiler.interception`), all under `torch.no_grad()`. Time is attributed per
function and per unique sample (see `forge.profiler.attribution`): kernel time when the work runs on CUDA, CPU
time otherwise, averaged over the profiling passes.

Kineto (torch.profiler's backend) prints `USDT: ... profiler_start` / `profiler_stop` lines (and `STAGE:` lines at
some levels) straight to the process's stderr for every session, which cluttered `kforge optimize`'s output. Its
log level is read from `KINETO_LOG_LEVEL` when Kineto first initialises, lazily at the first profiler session, and
those lines sit at the highest level (USDT = 5, above ERROR = 4), so the profiler sets it to 6 unless the user has
set it: Kineto's own errors go quiet too, and a session that records no CUDA time is still reported by the
warning below.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence

import pandas as pd
import torch
from torch import nn

from forge.functional import functional_names
from forge.profiler.attribution import LabelTimes, attribute_cpu_time, attribute_device_time
from forge.profiler.interception import CallRecorder, ModuleScopedInterception
from forge.profiler.result import FunctionProfile, ProfileResult
from forge.samples import Sample, iter_tensors

__all__ = ["ModuleFunctionKernelProfiler", "normalize_data", "prime_cuda_profiler"]

logger = logging.getLogger(__name__)

_cuda_profiler_primed = False
# torch's once-per-process UserWarning when a profiler starts; it does not apply to one-cycle sessions.
_CLEARS_EVENTS_NOTE = ".*Profiler clears events at the end of each cycle.*"
_KINETO_QUIET_LEVEL = "6"  # above USDT (5), Kineto's highest console level


def _quiet_kineto() -> None:
    """Keep Kineto's per-session console lines out of the output (before its first session; the user's value wins)."""
    os.environ.setdefault("KINETO_LOG_LEVEL", _KINETO_QUIET_LEVEL)


def prime_cuda_profiler() -> None:
    """Run one throwaway CPU+CUDA profiler session with a real kernel, once per process.

    Kineto's first session in a process can drop events; priming keeps them out of the measured session.
    """
    global _cuda_profiler_primed
    if _cuda_profiler_primed:
        return
    _quiet_kineto()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_CLEARS_EVENTS_NOTE)
        with torch.profiler.profile(activities=activities):
            scratch = torch.zeros(1, device="cuda")
            scratch.add_(1)
            torch.cuda.synchronize()
    _cuda_profiler_primed = True


def normalize_data(data: Sequence[Sample] | Sequence[tuple[tuple, dict]] | None) -> list[Sample] | None:
    """`data` as a list of `Sample`s (None stays None); a clear error for anything else."""
    if data is None:
        return None
    if isinstance(data, (str, bytes, Mapping, Sample)) or not isinstance(data, Sequence):
        raise TypeError(
            f"data must be a sequence (list/tuple) of forge.samples.Sample or (args, kwargs) pairs, or None to call "
            f"function() with no arguments; got {type(data).__name__}. Wrap one call as [Sample((x,), {{}})]"
        )
    if len(data) == 0:
        raise ValueError("data is empty: pass at least one sample, or data=None to call function() with no arguments")
    samples = []
    for index, item in enumerate(data):
        if isinstance(item, Sample):
            args, kwargs = item.args, item.kwargs
        elif isinstance(item, (tuple, list)) and len(item) == 2:
            args, kwargs = item
        else:
            raise TypeError(
                f"data[{index}] is {type(item).__name__}: expected forge.samples.Sample(args, kwargs) or an "
                f"(args: tuple, kwargs: dict) pair; wrap a single tensor x as Sample((x,), {{}})"
            )
        if not isinstance(args, (tuple, list)) or not isinstance(kwargs, Mapping):
            raise TypeError(
                f"data[{index}] must hold (args: tuple, kwargs: dict), got ({type(args).__name__}, "
                f"{type(kwargs).__name__}); wrap a single tensor x as Sample((x,), {{}})"
            )
        samples.append(Sample(tuple(args), dict(kwargs)))
    return samples


def _validate_function_names(function_names: Iterable[str] | None) -> frozenset[str]:
    known = functional_names()
    if function_names is None:
        return frozenset(known)
    if isinstance(function_names, str):
        raise TypeError(f"function_names must be a set of names, not a string; did you mean {{{function_names!r}}}?")
    names = frozenset(function_names)
    unknown = sorted(names - set(known))
    if unknown:
        raise ValueError(
            f"unknown torch.nn.functional function name(s) {unknown}; see forge.functional.functional_names()"
        )
    return names


def _check_count(name: str, value: int, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def _uses_cuda(module: nn.Module, samples: list[Sample] | None) -> bool:
    if not torch.cuda.is_available():
        return False
    tensors = [*module.parameters(), *module.buffers()]
    for sample in samples or ():
        tensors.extend(iter_tensors((sample.args, sample.kwargs)))
    return any(t.is_cuda for t in tensors)


def _resolve_module(function: Callable, module: nn.Module | None) -> nn.Module:
    if not callable(function):
        raise TypeError(f"function must be callable (a model or a function that calls it), got {type(function)!r}")
    if module is None:
        if isinstance(function, nn.Module):
            return function
        raise ValueError(
            "module must be given when function is not an nn.Module: pass make_plan(fn, data, module=model)"
        )
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    return module


class ModuleFunctionKernelProfiler:
    """Profiles the `torch.nn.functional` calls made inside a module's forward.

    `function_names`: the functions whose input samples are kept (None = every replaceable function, an empty set
    = none). Every replaceable function is intercepted, counted and timed regardless, so nested calls are
    attributed correctly and every function shows in the results.
    """

    def __init__(
        self,
        function_names: set[str] | None = None,
        *,
        warmup_iterations: int = 3,
        profile_iterations: int = 1,
    ) -> None:
        self.function_names = _validate_function_names(function_names)
        self.warmup_iterations = _check_count("warmup_iterations", warmup_iterations, 0)
        self.profile_iterations = _check_count("profile_iterations", profile_iterations, 1)
        self.last_result: ProfileResult | None = None

    def profile(
        self,
        function: Callable,
        data: Sequence[Sample] | Sequence[tuple[tuple, dict]] | None = None,
        *,
        module: nn.Module | None = None,
    ) -> ProfileResult:
        """Run `function` over `data` (or `function()` when data is None) and profile the calls inside `module`.

        `module` defaults to `function` when that is an `nn.Module`. The module must be called as `module(...)`
        (its hooks do not fire for `module.forward(...)`). Exceptions from `function` propagate after every patch
        and hook has been removed.
        """
        root = _resolve_module(function, module)
        samples = normalize_data(data)
        _quiet_kineto()
        on_cuda = _uses_cuda(root, samples)

        with torch.no_grad():
            for index in range(self.warmup_iterations):
                logger.info("profiling: warm-up %d/%d", index + 1, self.warmup_iterations)
                _run_pass(function, samples)
            if on_cuda:
                torch.cuda.synchronize()
                prime_cuda_profiler()

            recorder = CallRecorder(self.function_names)
            interception = ModuleScopedInterception(root, recorder, functional_names())
            activities = [torch.profiler.ProfilerActivity.CPU]
            if on_cuda:
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            with contextlib.ExitStack() as stack:
                with warnings.catch_warnings():  # torch's once-per-process note about clearing events
                    warnings.filterwarnings("ignore", message=_CLEARS_EVENTS_NOTE)
                    prof = stack.enter_context(torch.profiler.profile(activities=activities))
                stack.enter_context(interception)
                for index in range(self.profile_iterations):
                    logger.info("profiling pass %d/%d", index + 1, self.profile_iterations)
                    _run_pass(function, samples)
                if on_cuda:
                    torch.cuda.synchronize()

        if interception.module_calls == 0:
            raise RuntimeError(
                f"the module ({type(root).__name__}) was never called while profiling: function must call it as "
                "module(...) (hooks do not fire for module.forward(...)); pass the module that function really calls"
            )
        events = prof.events()
        times = attribute_device_time(events) if on_cuda else attribute_cpu_time(events)
        if on_cuda and times.module_us == 0.0:
            logger.warning("no CUDA kernel time was recorded for the module; is CUPTI available to torch.profiler?")
        result = _build_result(recorder, times, device="cuda" if on_cuda else "cpu", iterations=self.profile_iterations)
        self.last_result = result
        return result

    def summary(self, top_k: int | None = None) -> pd.DataFrame:
        """`summary()` of the last `profile()` result."""
        if self.last_result is None:
            raise RuntimeError("nothing profiled yet: call profile(function, data, module=...) first")
        return self.last_result.summary(top_k)


def _run_pass(function: Callable, samples: list[Sample] | None) -> None:
    if samples is None:
        function()
        return
    for sample in samples:
        function(*sample.args, **sample.kwargs)


def _per_pass(count: int, iterations: int) -> int:
    return max(1, round(count / iterations)) if count else 0


def _build_result(recorder: CallRecorder, times: LabelTimes, *, device: str, iterations: int) -> ProfileResult:
    total_ms = times.module_us / iterations / 1000.0
    profiles = []
    for name in recorder.function_names():
        counts = [_per_pass(c, iterations) for c in recorder.counts(name)]
        sample_ms = tuple(times.function_us.get((name, i), 0.0) / iterations / 1000.0 for i in range(len(counts)))
        function_ms = sum(sample_ms)
        collected = recorder.samples(name)
        profiles.append(
            FunctionProfile(
                name=name,
                calls=sum(counts),
                unique_samples=len(counts),
                total_time_ms=function_ms,
                time_spent_pct=100.0 * function_ms / total_ms if total_ms > 0 else 0.0,
                sample_times_ms=sample_ms,
                samples=list(zip(counts, collected, strict=False)) if collected else [],
            )
        )
    profiles.sort(key=lambda p: (-p.total_time_ms, -p.calls, p.name))
    return ProfileResult(
        functions={p.name: p for p in profiles}, total_time_ms=total_ms, device=device, profile_iterations=iterations
    )
