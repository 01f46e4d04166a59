"""Run a plan's providers inside one module's forward: eager, under CUDA-graph capture, and under `torch.compile`.

How a call reaches a provider:

- While any planned forward runs anywhere in the process, `torch.nn.functional.<name>` is a router (one per name,
  installed on the first such forward and removed after the last, reference-counted under a lock). The router
  looks up the calling thread's innermost active runtime for that name; with none it calls what was there before
  (normally stock PyTorch). So only the thread that runs the planned forward sees the plan: other threads, and code
  outside the model, get stock PyTorch even while a planned forward runs elsewhere, and two plans in two threads
  never leave a patch behind whatever order their forwards finish in.
- A forward wrapper (an instance attribute `forward`, removed by `deactivate`) pushes the runtime for its thread and
  pops it in a `finally`, so `KeyboardInterrupt`, `SystemExit` or any other exception restores everything (forward
  hooks cannot: `nn.Module` runs always-called hooks only for `Exception`). A wrapper, unlike hooks, also leaves
  `torch.cuda.make_graphed_callables` usable (it refuses modules with hooks).
- Signature guard (`_dispatch`): a call goes to the provider only when its signature (shapes, dtypes, strides,
  devices, whether each tensor starts at a storage offset and its address modulo 16, and the exact non-tensor
  arguments, a `torch.Size` counting as a tuple; see `forge.samples`) is one the provider was validated on, so
  `x[1:]` of a larger buffer never reaches a kernel validated only on fresh tensors, and no tensor argument needs
  grad or is a tensor subclass (fake, functional, distributed tensors: providers are validated on plain tensors);
  everything else goes to the next runtime out, or to PyTorch. A kernel specialised to profiled shapes never runs on
  inputs it was not checked on.
- Under `torch.compile` (`torch.compiler.is_compiling()`), a call is matched against each validated signature with
  plain comparisons that Dynamo turns into guards (`_matches`), and a match becomes one node of the provider's op
  (`forge.custom_ops`); anything else is traced as stock PyTorch. Storage offset and alignment are the exception:
  Dynamo can read neither without a graph break, so the op checks them when it runs (`_same_address_class`).
  Dynamo skips the forward wrapper's frame (`_skip_in_dynamo`), so it runs eagerly and the model's own forward is
  compiled, with no graph break (also with `fullgraph=True`; a compile that inlines the planned module's call from
  outside breaks the graph there once).
- CUDA graphs (`torch.cuda.graph`, `make_graphed_callables`, `mode="reduce-overhead"`): capture runs the eager path
  once per call; the runtime allocates nothing and never synchronises, so a capturable provider is captured and
  replays without any Python.

Cost, eager (`pytest -s tests/forge/test_runtime.py -k dispatch_overhead`): router + guard + eligibility cost
1.8-1.95 us per call over calling the provider directly on the 2-core CI machine, where the hook-based runtime this
replaces cost 1.35-1.5 us in the same runs (the thread-local lookup, `is_compiling()` and the subclass/grad check);
1.47 us on the H200 host's CPU (BENCHMARKS.md 0b; 1.9 us before). The storage-offset and
alignment terms of the key add 0.1-0.3 us per tensor. Keying storage offset and alignment added +0.25-0.31 us
per one-tensor call on the loaded CI machine (`forge.samples` docstring). The op is never used in eager mode: a
call through the dispatcher costs ~6 us more (~20 us with `torch.library.custom_op`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from forge.custom_ops import DispatchStats, PlanModeWarning, ProviderOp, module_op, provider_op
from forge.execution import Execution, parse_execution
from forge.functional import original_function
from forge.modules import MODULE_PREFIX, class_name
from forge.profiler.kernels import PLAN_LABEL
from forge.samples import Sample, TensorSpec, iter_leaves, signature_miss, signature_of

if TYPE_CHECKING:
    from forge.plan import KernelOptimizationPlan, PlanEntry
    from forge.provider import KernelProvider

__all__ = ["KernelProviderRuntime", "DispatchStats", "PlanModeWarning", "instance_forward", "patched_functions"]

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------------------
# Process-wide routers, thread-local dispatch tables
# ---------------------------------------------------------------------------------------------------------
# A thread's table maps a function name to its innermost active entry, a tuple
#   (keys, provider, stats, compiled, outer)
# = the runtime's validated signature keys, its provider, its counters, its traced path, and the entry it displaced
# (None: stock PyTorch), which a call falls back to. A tuple read by the router keeps the traced path free of
# per-runtime thread-local state (Dynamo 2.11 cannot guard on a threading.local's dict attributes it did not create).
Entry = tuple[frozenset, Callable[..., Any], DispatchStats, Callable[..., Any], "Entry | None"]
_KEYS, _PROVIDER, _STATS, _COMPILED, _OUTER = range(5)


class _ThreadTable(threading.local):
    """Per thread: function name -> innermost active entry. Instance attributes only (Dynamo guards on them)."""

    def __init__(self) -> None:
        self.table: dict[str, Entry] = {}


_THREAD = _ThreadTable()
_LOCK = threading.Lock()
_COUNTS: dict[str, int] = {}  # name -> planned forwards in flight (all threads) that use it
_PREVIOUS: dict[str, Callable] = {}  # name -> what torch.nn.functional held before the router
_ROUTERS: dict[str, Callable] = {}


def _router(name: str) -> Callable:
    """The router installed as `torch.nn.functional.<name>` (one per name, created once)."""
    with _LOCK:
        router = _ROUTERS.get(name)
        if router is None:
            router = _ROUTERS[name] = _make_router(name)
        return router


def _make_router(name: str) -> Callable:
    original = original_function(name)
    state = _THREAD
    previous = _PREVIOUS
    dispatch = _dispatch

    def route(*args: Any, **kwargs: Any) -> Any:
        entry = state.table.get(name)
        if entry is None:
            return previous.get(name, original)(*args, **kwargs)
        return dispatch(name, entry, args, kwargs)

    route.__name__ = route.__qualname__ = name
    route.__doc__ = f"kernel-forge router for torch.nn.functional.{name} (stock PyTorch outside planned forwards)"
    return route


def _prepare_dynamo() -> None:
    """Dynamo builds its table of torch functions once, from `torch.nn.functional`'s attributes at that moment.

    Were it built while a router is installed, Dynamo would take the router for a torch op and put it in the graph
    unread; building it before any router exists keeps routers ordinary Python that Dynamo inlines. Importing
    Dynamo costs 1-3 s once per process (registering a custom op imports it anyway).
    """
    from torch._dynamo import trace_rules

    trace_rules.get_torch_obj_rule_map()


def _warn_replaced(name: str) -> None:
    logger.warning("torch.nn.functional.%s was replaced by other code while a plan ran; leaving it", name)


def patched_functions() -> dict[str, int]:
    """Names currently routed (patched in `torch.nn.functional`) -> planned forwards in flight using them."""
    with _LOCK:
        return dict(_COUNTS)


def _active_stats(function: str, provider: KernelProvider) -> DispatchStats | None:
    """Counters of the calling thread's innermost runtime for `function`, when it runs `provider` (custom ops)."""
    entry = _THREAD.table.get(function)
    if entry is not None and entry[_PROVIDER] is provider:
        return entry[_STATS]
    return None


# ---------------------------------------------------------------------------------------------------------
# The traced guard: a validated signature as a pattern, matched with comparisons Dynamo turns into guards
# ---------------------------------------------------------------------------------------------------------
class _TensorPattern(NamedTuple):
    dtype: torch.dtype
    device: torch.device
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: bool  # storage_offset() != 0
    residue: int  # data_ptr() % 16


class _ValuePattern(NamedTuple):
    kind: type  # exact type, as signature_of tags scalars (1, 1.0 and True differ)
    value: Any
    nan: bool


class _SeqPattern(NamedTuple):
    kind: type  # tuple, list, a namedtuple... (signature_of tells them apart; torch.Size counts as tuple)
    items: tuple


class _DictPattern(NamedTuple):
    keys: tuple
    items: tuple


class _CallPattern(NamedTuple):
    args: tuple
    kw_names: tuple[str, ...]
    kw_items: tuple


_NEVER = _SeqPattern(type(None), ())  # matches nothing: an argument signature_of only knows by repr
_SYMBOLIC_KIND = ((torch.SymBool, bool), (torch.SymInt, int), (torch.SymFloat, float))


def _pattern(template: Any) -> Any:
    """The pattern of one validated argument (a TensorSpec leaf, a constant, or a container of them)."""
    if isinstance(template, TensorSpec):
        return _TensorPattern(template.dtype, torch.device(template.device), template.shape, template.stride,
                              template.storage_offset != 0, template.address_residue)
    if isinstance(template, (tuple, list)):
        return _SeqPattern(_seq_kind(template), tuple(_pattern(t) for t in template))
    if isinstance(template, dict):
        return _DictPattern(tuple(template), tuple(_pattern(t) for t in template.values()))
    try:
        hash(template)
    except TypeError:
        return _NEVER
    return _ValuePattern(type(template), template, isinstance(template, float) and math.isnan(template))


def call_pattern(template: Sample) -> _CallPattern:
    """The pattern of a validated call (built once, outside any tracer)."""
    return _CallPattern(
        tuple(_pattern(a) for a in template.args),
        tuple(template.kwargs),
        tuple(_pattern(v) for v in template.kwargs.values()),
    )


def _seq_kind(value: tuple | list) -> type:
    """The container type as signature_of keys it: torch.Size is a tuple (PyTorch takes either as a size)."""
    kind = type(value)
    return tuple if kind is torch.Size else kind


def _same_address_class(value: torch.Tensor, pattern: _TensorPattern) -> bool:
    """Storage offset (zero or not) and address modulo 16 as signature_of has them.

    Eager only: Dynamo cannot read `storage_offset()` or `data_ptr()` without a graph break (torch 2.13: "torch.*
    op returned non-Tensor") and does not guard on the offset (a graph traced on `b[:4]` is reused for `b[1:5]`), so
    under a tracer this part of the guard runs inside the custom op at call time (`ProviderOp`'s re-check with
    `signature_of`, which picks the validated signature of the right address class or runs PyTorch).
    """
    return (value.storage_offset() != 0) == pattern.offset and value.data_ptr() & 15 == pattern.residue


def _same_ints(values: Any, expected: tuple[int, ...]) -> bool:
    for i in range(len(expected)):
        if values[i] != expected[i]:
            return False
    return True


def _matches(value: Any, pattern: Any) -> bool:
    """True when `value` has the signature of `pattern`; conservative (False) where signature_of would compare reprs.

    Plain loops, indexing and comparisons only, so Dynamo traces it on every version we run (2.11 and 2.13) and on
    symbolic sizes: each comparison becomes a guard, and a size that does not match stays dynamic.
    """
    if type(pattern) is _TensorPattern:
        return (
            isinstance(value, torch.Tensor)
            and value.dtype == pattern.dtype
            and value.device == pattern.device
            and value.dim() == len(pattern.shape)
            and _same_ints(value.shape, pattern.shape)
            and _same_ints(value.stride(), pattern.stride)
            and (torch.compiler.is_compiling() or _same_address_class(value, pattern))
        )
    if isinstance(value, torch.Tensor):
        return False
    if type(pattern) is _ValuePattern:
        if type(value) is pattern.kind:
            return value != value if pattern.nan else bool(value == pattern.value)
        for symbolic, kind in _SYMBOLIC_KIND:
            if isinstance(value, symbolic):
                return kind is pattern.kind and bool(value == pattern.value)
        return False
    if type(pattern) is _SeqPattern:
        if _seq_kind(value) is not pattern.kind or len(value) != len(pattern.items):
            return False
        for i in range(len(pattern.items)):
            if not _matches(value[i], pattern.items[i]):
                return False
        return True
    if type(pattern) is _DictPattern:
        if not isinstance(value, dict) or len(value) != len(pattern.keys):
            return False
        names = list(value)
        for i in range(len(pattern.keys)):
            if names[i] != pattern.keys[i] or not _matches(value[names[i]], pattern.items[i]):
                return False
        return True
    return False


def _matches_call(args: tuple, kwargs: dict, pattern: _CallPattern) -> bool:
    if len(args) != len(pattern.args) or len(kwargs) != len(pattern.kw_names):
        return False
    for i in range(len(pattern.args)):
        if not _matches(args[i], pattern.args[i]):
            return False
    for i in range(len(pattern.kw_names)):
        name = pattern.kw_names[i]
        if name not in kwargs or not _matches(kwargs[name], pattern.kw_items[i]):
            return False
    return True


def _collect(value: Any, pattern: Any, found: list[torch.Tensor]) -> None:
    if type(pattern) is _TensorPattern:
        found.append(value)
    elif type(pattern) is _SeqPattern:
        for i in range(len(pattern.items)):
            _collect(value[i], pattern.items[i], found)
    elif type(pattern) is _DictPattern:
        for i in range(len(pattern.keys)):
            _collect(value[pattern.keys[i]], pattern.items[i], found)


def _tensors(args: tuple, kwargs: dict, pattern: _CallPattern) -> list[torch.Tensor]:
    """A matched call's tensors in the custom op's order (`forge.custom_ops`: the order map_values visits)."""
    found: list[torch.Tensor] = []
    for i in range(len(pattern.args)):
        _collect(args[i], pattern.args[i], found)
    for i in range(len(pattern.kw_names)):
        _collect(kwargs[pattern.kw_names[i]], pattern.kw_items[i], found)
    return found


_PLAIN_TENSORS = (torch.Tensor, nn.Parameter)


def _eligible(args: tuple, kwargs: dict) -> bool:
    """No tensor argument needs grad (providers have no backward) or is a tensor subclass (fake, functional,
    distributed...: providers are validated on plain tensors). Top-level arguments only."""
    for a in args:
        if isinstance(a, torch.Tensor) and (
            type(a) not in _PLAIN_TENSORS or (a.requires_grad and torch.is_grad_enabled())
        ):
            return False
    for a in kwargs.values():
        if isinstance(a, torch.Tensor) and (
            type(a) not in _PLAIN_TENSORS or (a.requires_grad and torch.is_grad_enabled())
        ):
            return False
    return True


# ---------------------------------------------------------------------------------------------------------
# Per-runtime dispatch
# ---------------------------------------------------------------------------------------------------------


def _dispatch(
    name: str,
    entry: Entry,
    args: tuple,
    kwargs: dict,
    _compiling: Callable[[], bool] = torch.compiler.is_compiling,
    _key_of: Callable[[tuple, dict], Any] = signature_of,
    _tensor: type = torch.Tensor,
    _plain: tuple[type, ...] = _PLAIN_TENSORS,
    _grad_enabled: Callable[[], bool] = torch.is_grad_enabled,
    _profiling: Callable[[], bool] = torch._C._autograd._profiler_enabled,
) -> Any:
    """One planned call: the provider when the signature guard says yes, else the entry it displaced, else PyTorch.

    Hot path of eager forwards (measured in BENCHMARKS.md): one signature key, one set lookup, the eligibility
    loop (`_eligible`, inlined), the provider call; module globals are bound as defaults (local lookups). Under a
    tracer that sets `is_compiling()` it takes the traced path instead.
    """
    if _compiling():
        return entry[3](entry, args, kwargs)  # entry = (keys, provider, stats, compiled, outer)
    try:
        hit = _key_of(args, kwargs) in entry[0]
    except TypeError:  # unhashable symbolic sizes: a tracer that is not Dynamo (torch 2.11's AOT re-entry)
        hit = False
    if hit:
        for a in args:
            if isinstance(a, _tensor) and (type(a) not in _plain or (a.requires_grad and _grad_enabled())):
                hit = False
                break
        if kwargs and hit:
            hit = _eligible((), kwargs)
    stats = entry[2]
    if hit:
        stats.provider_calls += 1
        try:
            if _profiling():  # a profile ties the provider's kernels to the call (forge.profiler.kernels)
                with torch.profiler.record_function(PLAN_LABEL + name):
                    return entry[1](*args, **kwargs)
            return entry[1](*args, **kwargs)
        except Exception:
            _provider_failed(name, stats)
    stats.fallback_calls += 1
    return _fall_back(name, entry[4], args, kwargs)


def _provider_failed(name: str, stats: DispatchStats) -> None:
    """Count a provider that raised (the call then runs the fallback); log the first failure with its traceback."""
    stats.provider_errors += 1
    if stats.provider_errors == 1:
        logger.warning("provider for %s raised; falling back to PyTorch for this call", name, exc_info=True)


def _fall_back(name: str, outer: Entry | None, args: tuple, kwargs: dict) -> Any:
    if outer is None:
        return _PREVIOUS.get(name, original_function(name))(*args, **kwargs)
    return _dispatch(name, outer, args, kwargs)


def _make_compiled(
    name: str, op: ProviderOp | None, calls: tuple[tuple[int, _CallPattern], ...]
) -> Callable[[Entry, tuple, dict], Any]:
    """The traced path: a call matching a validated signature becomes one custom-op node, the rest stock PyTorch
    (or the displaced entry's traced path)."""

    def compiled(entry: Entry, args: tuple, kwargs: dict) -> Any:
        if op is not None and _eligible(args, kwargs):
            for index, pattern in calls:
                if _matches_call(args, kwargs, pattern):
                    return op.call(index, _tensors(args, kwargs, pattern))
        return _fall_back(name, entry[_OUTER], args, kwargs)

    return compiled


def _op_calls(op: ProviderOp | None, entry: PlanEntry) -> tuple[tuple[int, _CallPattern], ...]:
    """The entry's validated signatures that `op` registered, as (op index, traced-guard pattern)."""
    if op is None:
        return ()
    calls = []
    for template in entry.signatures:
        index = op.register(template)
        if index is not None:
            calls.append((index, call_pattern(template)))
    return tuple(calls)


# The counters a module instance's custom op reports to: those of the runtime that patched it, while it does.
_MODULE_STATS: weakref.WeakKeyDictionary[nn.Module, DispatchStats] = weakref.WeakKeyDictionary()


def _module_traced_path(entry: PlanEntry, sub: nn.Module, replacement: Callable[..., Any],
                        original: Callable[..., Any]) -> Callable[[tuple, dict], Any]:
    """Under a tracer: the instance's custom op (`forge.custom_ops.module_op`, one node per call, no graph break) on
    a validated signature, the original forward otherwise (Dynamo traces and Inductor compiles it). A replacement
    that is itself `torch.compile` code gets no op: Inductor compiles the original forward into the same thing."""
    op = None
    if type(entry.provider).carries_code:
        held = weakref.ref(sub)
        op = module_op(entry.provider, sub, replacement, original,
                       lambda _function, _provider: _MODULE_STATS.get(held()) if held() is not None else None)
    calls = _op_calls(op, entry)

    def traced(args: tuple, kwargs: dict) -> Any:
        if calls and _eligible(args, kwargs):
            for index, pattern in calls:
                if _matches_call(args, kwargs, pattern):
                    return op.call(index, _tensors(args, kwargs, pattern))
        return original(*args, **kwargs)

    return traced


def _module_forward(entry: PlanEntry, stats: DispatchStats, replacement: Callable[..., Any],
                    original: Callable[..., Any], traced: Callable[[tuple, dict], Any]) -> Callable[..., Any]:
    """An instance's forward under a module entry: the replacement on a judged call signature (no grad needed, no
    tensor subclass), the original forward otherwise; under a tracer `traced` (`_module_traced_path`)."""
    keys, name = entry.signature_keys, entry.function
    profiling = torch._C._autograd._profiler_enabled

    def forward(*args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():
            return traced(args, kwargs)
        try:
            key = signature_of(args, kwargs)
            hit = key in keys and _eligible(args, kwargs)
        except TypeError:
            key, hit = None, False
        if hit:
            stats.provider_calls += 1
            try:
                if profiling():
                    with torch.profiler.record_function(PLAN_LABEL + name):
                        return replacement(*args, **kwargs)
                return replacement(*args, **kwargs)
            except Exception:
                _provider_failed(name, stats)
        elif stats.first_miss is None and key is not None:
            stats.first_miss = key
        stats.fallback_calls += 1
        return original(*args, **kwargs)

    return forward


def instance_forward(entry: PlanEntry, sub: nn.Module, stats: DispatchStats, *,
                     replacement: Callable[..., Any] | None = None,
                     original: Callable[..., Any] | None = None) -> Callable[..., Any]:
    """The guarded forward of one instance a module entry serves (`entry.provider.serves(sub)`): the replacement on
    a judged call signature, `original` (default: `sub.forward` as it is now) otherwise, the instance's custom op
    under `torch.compile`; calls are counted in `stats`, which the instance's op reports to as well. The one code
    path of `plan.apply` and of module kernels exported to the `kernels` package (`forge.hub_kernels`).
    `replacement`: an already bound one (default: `entry.provider.bind(sub)`)."""
    if replacement is None:
        replacement = entry.provider.bind(sub)
    if original is None:
        original = sub.forward
    _MODULE_STATS[sub] = stats
    return _module_forward(entry, stats, replacement, original,
                           _module_traced_path(entry, sub, replacement, original))


class _RuntimeThreadState(threading.local):
    """Per thread and runtime (read only by the eager forward wrapper): nesting depth, and the entries this runtime
    displaced in the thread's table and the names it routed, for the pop."""

    def __init__(self) -> None:
        self.depth = 0
        self.saved: dict[str, Entry | None] = {}
        self.acquired: list[str] = []


def _skip_in_dynamo(fn: Callable) -> Callable:
    """`fn`'s frame runs eagerly under `torch.compile` while the frames it calls are compiled (also with
    `fullgraph=True`); a compile that inlines a call to it breaks the graph there.

    `torch._dynamo.decorators.skip` marks the code object itself as skipped. The public
    `torch.compiler.disable(fn, recursive=False)` is not enough: on torch 2.11-2.13 it wraps `fn` and skips only the
    wrapper's frame, so Dynamo evaluates `fn`'s frame on every call (disassembling it), fails on its lock and runs
    it eagerly without remembering that. Measured on the CI machine, a 4-block model with 4 planned calls per
    forward, `aot_eager`: 1062 us per forward with the public API, 636 us with this (stock: 222-340 us, noisy).
    """
    from torch._dynamo import decorators

    skip = getattr(decorators, "skip", None)
    if skip is None:
        return torch.compiler.disable(fn, recursive=False)
    return skip(fn)


class KernelProviderRuntime:
    """Applies a `KernelOptimizationPlan` to a module: its forwards run the plan's providers (see module doc)."""

    def __init__(self, module: nn.Module, plan: KernelOptimizationPlan, *, execution: Execution | str | None = None
                 ) -> None:
        """`execution`: how the caller will run the model, when it knows; a plan made for another mode warns
        (`PlanModeWarning`). Without it, the runtime warns when it sees the mismatch itself: an eager plan captured
        in a CUDA graph, or a plan not made for compile running inside `torch.compile` (an eager run of a CUDA-graph
        plan is the warm-up every capture needs, so it does not warn)."""
        if not isinstance(module, nn.Module):
            raise TypeError(f"a plan is applied to an nn.Module, got {type(module).__name__}")
        self.module = module
        self.plan = plan
        self._mode_watch = DispatchStats(plan.execution.value)
        if execution is not None:
            self._mode_watch.note_mode(parse_execution(execution).value, "applying it")
        self._watch_capture = plan.execution is Execution.EAGER and torch.cuda.is_available() and any(
            str(leaf.device).startswith("cuda") for entry in plan.entries for sample in entry.signatures
            for leaf in iter_leaves((tuple(sample.args), dict(sample.kwargs)))
            if isinstance(leaf, (TensorSpec, torch.Tensor)))
        self.stats: dict[str, DispatchStats] = {}
        self._dispatch: dict[str, tuple[frozenset, Callable, DispatchStats, Callable]] = {}
        self._local = _RuntimeThreadState()
        self._wrapper: Callable | None = None
        self._previous_forward: Any = None
        self._had_instance_forward = False
        # Resolve everything up front: an unknown function or a provider that cannot load fails here,
        # before anything is installed, so nothing is half-applied.
        if plan.entries:
            _prepare_dynamo()
        self._modules: list[tuple[PlanEntry, DispatchStats]] = []
        # (instance, entry, stats, the instance's replacement forward), found and bound at the first activation
        self._served: list[tuple[nn.Module, PlanEntry, DispatchStats, Callable[..., Any]]] | None = None
        self._patched: list[tuple[nn.Module, bool, Any, Callable]] = []
        # per served instance (its index in `_served`): the forwards it wrapped (the instance's own, None when it has
        # none, and its class's) and the wrapper, reused by later activations while both are unchanged
        self._wrappers: dict[int, tuple[tuple[Any, Any], Callable]] = {}
        for entry in plan.entries:
            name = entry.function
            if name.startswith(MODULE_PREFIX):  # a module class's forward (forge.modules), routed by instance
                entry.provider.load_runtime_dependencies()
                stats = DispatchStats(plan.execution.value)
                self.stats[name if name not in self.stats else f"{name}#{len(self._modules)}"] = stats
                self._modules.append((entry, stats))
                continue
            original_function(name)
            if not hasattr(F, name):
                raise ValueError(
                    f"torch.nn.functional has no attribute {name!r}; this plan needs another torch version"
                )
            entry.provider.load_runtime_dependencies()
            stats = DispatchStats(plan.execution.value)
            self.stats[name] = stats
            self._dispatch[name] = (entry.signature_keys, entry.provider, stats, self._compiled_path(entry))

    def silence_mode_warnings(self) -> None:
        """No `PlanModeWarning` from this runtime (a report that runs the plan in every mode on purpose)."""
        every = {e.value for e in Execution}
        self._mode_watch.modes_warned.update(every)
        for stats in self.stats.values():
            stats.modes_warned.update(every)

    @staticmethod
    def _compiled_path(entry: PlanEntry) -> Callable[[Entry, tuple, dict], Any]:
        op = provider_op(entry.provider, _active_stats)
        return _make_compiled(entry.function, op, _op_calls(op, entry))

    @property
    def entries(self) -> tuple[PlanEntry, ...]:
        return self.plan.entries

    @property
    def module_entries(self) -> tuple[PlanEntry, ...]:
        """The plan's module entries (routed by instance), in plan order."""
        return tuple(entry for entry, _ in self._modules)

    def unserved(self) -> list[tuple[PlanEntry, str]]:
        """The module entries that served nothing under this runtime, each with why in words: no instance of the
        model is one it was judged for, or its instances were called and every call fell back to the original
        forward (`forge.samples.signature_miss`: the arguments in which the model's calls differ from the validated
        signatures). An entry whose instances were not called yet is not listed. A plan entry that never serves
        only costs its routing."""
        served = {id(entry) for _, entry, _, _ in (self._served or [])}
        found = []
        for entry, stats in self._modules:
            if stats.provider_calls or stats.provider_errors:
                continue
            if self._served is not None and id(entry) not in served:
                found.append((entry, "no instance of the model is one it was judged for (instance_key)"))
            elif stats.fallback_calls:
                why = signature_miss(entry.signature_keys, stats.first_miss) if stats.first_miss is not None else \
                    "its calls could not be keyed"
                found.append((entry, f"every call fell back: {why}"))
        return found

    @property
    def is_active(self) -> bool:
        return self._wrapper is not None or bool(self._patched)

    # -- the forward wrapper ------------------------------------------------------------------------------
    def _make_forward(self, inner: Callable) -> Callable:
        """The wrapper that pushes this runtime for the calling thread around `inner` and pops it in `finally`.

        Its body calls only builtins (dict and lock methods, getattr/setattr): under `torch.compile` Dynamo skips
        this frame (see `_skip_in_dynamo`) but would try to compile any Python function it called, and one with
        a lock in it is a graph break. Routers are created here, before any forward runs.
        """
        local = self._local
        dispatches = tuple(self._dispatch.items())
        routers = tuple((name, _router(name)) for name, _ in dispatches)
        thread = _THREAD
        lock, counts, previous, functional = _LOCK, _COUNTS, _PREVIOUS, F
        routers_by_name = dict(routers)
        originals = {name: original_function(name) for name, _ in routers}
        warn = _warn_replaced
        watch_capture, watch = self._watch_capture, self._mode_watch
        capturing = torch.cuda.is_current_stream_capturing

        def forward(*args: Any, **kwargs: Any) -> Any:
            if self._wrapper is None:  # deactivated while another wrapper still calls this one
                return inner(*args, **kwargs)
            depth = local.depth
            try:
                local.depth = depth + 1
                if depth == 0:
                    # push: route each name process-wide (first user installs the router), then point this
                    # thread's table at this runtime, remembering what it displaced
                    table = thread.table
                    saved, acquired = local.saved, local.acquired
                    for name, router in routers:
                        with lock:
                            count = counts.get(name, 0)
                            if count == 0:
                                current = getattr(functional, name)
                                if current is not router:
                                    previous[name] = current
                                    setattr(functional, name, router)
                            counts[name] = count + 1
                        acquired.append(name)
                    for name, (keys, provider, stats, compiled) in dispatches:
                        displaced = table.get(name)
                        saved[name] = displaced
                        table[name] = (keys, provider, stats, compiled, displaced)
                    if watch_capture and capturing():
                        watch.note_mode(Execution.CUDA_GRAPHS.value, "a CUDA-graph capture")
                return inner(*args, **kwargs)
            finally:
                local.depth = depth
                if depth == 0:
                    # pop: whatever part of the push happened (an interrupt can land anywhere) is undone
                    table = thread.table
                    saved, acquired = local.saved, local.acquired
                    local.saved, local.acquired = {}, []
                    for name, displaced in saved.items():
                        if displaced is None:
                            table.pop(name, None)
                        else:
                            table[name] = displaced
                    for name in reversed(acquired):
                        with lock:
                            count = counts.get(name, 0) - 1
                            if count > 0:
                                counts[name] = count
                            else:
                                counts.pop(name, None)
                                restore = previous.pop(name, None) or originals[name]
                                if getattr(functional, name) is routers_by_name[name]:
                                    setattr(functional, name, restore)
                                else:
                                    warn(name)

        return forward

    # -- activation ---------------------------------------------------------------------------------------
    def activate(self) -> None:
        """Wrap the module's forward and, for module entries, the forwards of the instances they serve
        (idempotent). An empty plan installs nothing."""
        if not self._patched:
            self._patch_modules()
        if self._wrapper is not None or not self._dispatch:
            return
        module = self.module
        self._had_instance_forward = "forward" in module.__dict__
        self._previous_forward = module.__dict__.get("forward")
        wrapper = _skip_in_dynamo(self._make_forward(module.forward))
        self._wrapper = wrapper
        module.forward = wrapper

    def _served_instances(self) -> list[tuple[nn.Module, PlanEntry, DispatchStats, Callable[..., Any]]]:
        """The instances of the model each module entry serves, with their replacement forwards, found and bound once
        (an activation per forward, as the eager end-to-end timing does, then only swaps forwards: Llama-3.2-1B has 33
        RMSNorms among ~200 modules). Found at the first activation: a model changed after it (another dtype or device,
        new layers) needs a new runtime. Bound once per runtime: a replacement that holds state of its own (a
        CUDA-graph provider's captures of what this plan runs inside the block) lives as long as the runtime, not one
        activation."""
        if self._served is None:
            self._served = [(sub, entry, stats, entry.provider.bind(sub))
                            for entry, stats in self._modules for sub in self.module.modules()
                            if class_name(sub) == entry.provider.target_class and entry.provider.serves(sub)]
        return self._served

    def _patch_modules(self) -> None:
        """Install each served instance's guarded forward. The wrapper is built once per instance and the forward it
        falls back to, and reused while that forward stays the same: an eager run activates the plan once a pass, and
        building a wrapper registers the instance's signatures with its custom op (an activation of 33 served norms took
        0.36 ms on the CI machine rebuilding them, 0.10 ms reusing them; Llama-3.2-1B's plan serves 81 instances)."""
        for index, (sub, entry, stats, replacement) in enumerate(self._served_instances()):
            had = "forward" in sub.__dict__
            previous = sub.__dict__.get("forward")
            wrapped = (previous, type(sub).forward)
            built = self._wrappers.get(index)
            if built is not None and built[0][0] is wrapped[0] and built[0][1] is wrapped[1]:
                wrapper = built[1]
                _MODULE_STATS[sub] = stats
            else:
                wrapper = instance_forward(entry, sub, stats, replacement=replacement, original=sub.forward)
                self._wrappers[index] = (wrapped, wrapper)
            # Straight into the instance's __dict__: `nn.Module.__setattr__` (checks for parameters, buffers and
            # submodules, which a function never is) costs ~4 us a call, twice per instance per eager pass.
            sub.__dict__["forward"] = wrapper
            self._patched.append((sub, had, previous, wrapper))

    def _unpatch_modules(self) -> None:
        patched, self._patched = self._patched, []
        for sub, had, previous, wrapper in reversed(patched):
            _MODULE_STATS.pop(sub, None)
            if sub.__dict__.get("forward") is not wrapper:
                logger.info("%s.forward was replaced again while a plan ran; leaving it", type(sub).__name__)
            elif had:
                sub.__dict__["forward"] = previous
            else:
                del sub.__dict__["forward"]

    def deactivate(self) -> None:
        """Unwrap the module's forward (idempotent). Forwards in flight keep the plan until they return."""
        self._unpatch_modules()
        wrapper, self._wrapper = self._wrapper, None
        if wrapper is None:
            return
        module = self.module
        if module.__dict__.get("forward") is not wrapper:
            logger.info("%s.forward was wrapped again after the plan was applied; leaving a pass-through wrapper",
                        type(module).__name__)
        elif self._had_instance_forward:
            module.forward = self._previous_forward
        else:
            del module.forward
        self._previous_forward = None

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
