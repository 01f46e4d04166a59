"""Module kernels: replacements for the forward of a module class (`LlamaRMSNorm`, `LlamaMLP`...), not an F call.

Why: on real models much of the time is not a `torch.nn.functional` call (BENCHMARKS K; `forge.profiler.modules`):
`LlamaRMSNorm` is pow, mean, rsqrt, a multiply and casts, eight kernels where one would do, and the glue between calls
sits in forwards of their own. A module entry replaces a class's forward, for the instances and call signatures it
was judged on.

- A module target is named `"module:<qualified class name>"` (`module_target_name`); a plan entry for it holds a
  `ModuleKernelProvider`, whose `bind(instance)` returns the replacement forward of that instance, sharing its
  parameters (nothing copied), and whose `instance_keys` are the instances it was judged on: the class, the plain
  attributes that define its behaviour (`eps`, `normalized_shape`, `hidden_size`...) and its parameters' and buffers'
  names, shapes and dtypes (`instance_key`). The runtime (`forge.runtime`) routes an instance's forward to the
  replacement only when its key and the call's signature were judged, and otherwise calls the original forward.
- `CompiledModuleProvider` is the static source: `torch.compile` of the class's own forward, which fuses the glue
  Inductor can see. One compiled function serves every instance of a behaviour group, called with the instance as
  its first argument: Dynamo inlines a module argument with its parameters as graph inputs, so the instances share
  one graph (twelve `LlamaRMSNorm`s: one graph on the CPU). Compiling per instance did not scale: on the H200
  (torch 2.11) `torch.compile` wraps every function in one shared frame guarded on the function's code object, so
  only 8 instances (`recompile_limit`) got a graph and the other 25 of Llama's 33 norms ran PyTorch's kernels
  (BENCHMARKS K4). Under `torch.compile(model)` the runtime leaves such a module's forward to Inductor, which
  compiles the original anyway; a replacement that carries its own code (a generated `ModelNew`) runs there as one
  custom op per call (`forge.custom_ops.module_op`).
- `record_module_calls` collects, while a model runs, every instance of the wanted classes with the calls it got.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import threading
import weakref
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from forge.execution import TimingMode
from forge.provider import KernelProvider
from forge.samples import Sample, clone_value, signature_of
from forge.text import parse_python

__all__ = ["MODULE_PREFIX", "CompiledModuleProvider", "ModuleCalls", "ModuleKernelProvider", "attribute_names",
           "class_aliases", "class_name", "declared_layer", "instance_key", "module_target_name", "plain_attributes",
           "record_module_calls", "recorded_calls", "resolve_class"]

logger = logging.getLogger(__name__)

MODULE_PREFIX = "module:"
_PLAIN = (bool, int, float, str, type(None))


def class_name(module: nn.Module | type) -> str:
    kind = module if isinstance(module, type) else type(module)
    return f"{kind.__module__}.{kind.__qualname__}"


def module_target_name(module: nn.Module | type) -> str:
    """`"module:<qualified class name>"`: the plan's and the report's name for a module target."""
    return MODULE_PREFIX + class_name(module)


@functools.cache
def class_aliases(target_class: str) -> frozenset[str]:
    """The names a user may give a class by (`--modules`, `--module-file CLASS=...`): its qualified name, its bare
    name and the layer name its library declares (`declared_layer`), e.g. `LlamaRMSNorm` or `RMSNorm`."""
    layer = declared_layer(target_class)
    return frozenset(n for n in (target_class, target_class.rsplit(".", 1)[-1], layer) if n)


def resolve_class(target_class: str) -> type | None:
    """The class a qualified class name (`class_name`) names, imported; None when it cannot be imported."""
    import importlib

    kind: Any = None
    parts = target_class.split(".")
    for split in range(len(parts) - 1, 0, -1):  # nested qualnames: try the longest module first
        try:
            kind = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attribute in parts[split:]:
            kind = getattr(kind, attribute, None)
        break
    return kind if isinstance(kind, type) else None


def declared_layer(target_class: str) -> str | None:
    """The layer name a model library declares for a swappable class, e.g. "RMSNorm" for transformers'
    `@use_kernel_forward_from_hub("RMSNorm") class LlamaRMSNorm` (the seam the `kernels` package swaps forwards
    through): `kernel_layer_name` on the class when `kernels` is installed, else the decorator in the class's source.
    `target_class` is a qualified class name; None when it declares none (or cannot be imported)."""
    import ast
    import inspect
    import textwrap

    kind = resolve_class(target_class)
    if kind is None:
        return None
    named = getattr(kind, "kernel_layer_name", None)
    if isinstance(named, str):
        return named
    try:
        tree = parse_python(textwrap.dedent(inspect.getsource(kind)))
    except (OSError, TypeError, SyntaxError):
        return None
    node = tree.body[0] if tree.body else None
    for decorator in getattr(node, "decorator_list", []):
        func = decorator.func if isinstance(decorator, ast.Call) else None
        called = getattr(func, "id", None) or getattr(func, "attr", None)
        if called == "use_kernel_forward_from_hub" and decorator.args and isinstance(decorator.args[0], ast.Constant):
            return str(decorator.args[0].value)
    return None


def _plain(value: Any) -> bool:
    """A literal `ast.literal_eval` reads back (no inf or nan)."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, _PLAIN):
        return True
    return isinstance(value, (tuple, list)) and all(_plain(v) and not isinstance(v, (tuple, list)) for v in value)


def plain_attributes(module: nn.Module) -> list[tuple[str, Any]]:
    """The public attributes of an instance that are literals (numbers, strings, tuples of them: `eps`,
    `normalized_shape`, `hidden_size`), sorted by name; lists as tuples."""
    return sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in vars(module).items()
                  if not k.startswith("_") and _plain(v))


def attribute_names(module: nn.Module) -> frozenset[str]:
    """The public names a replacement may read on the instance and below it (`original.gate_proj.weight`): its
    submodules', parameters' and buffers' names and the plain attributes of every submodule. The static screen of a
    `ModelNew` written for this instance allows them as attribute reads (`agent.screening`): they come from the
    user's model, not from the candidate."""
    names: set[str] = set()
    for path, sub in module.named_modules():
        names.update(part for part in path.split(".") if part)
        names.update(name for name, _ in plain_attributes(sub))
        names.update(name for name, _ in sub.named_parameters(recurse=False))
        names.update(name for name, _ in sub.named_buffers(recurse=False))
    return frozenset(n for n in names if n.isidentifier() and not n.startswith("_"))


def instance_key(module: nn.Module) -> Hashable:
    """What makes two instances of a class behave alike for a kernel: the class, its plain attributes (numbers,
    strings, tuples of them: `eps`, `normalized_shape`, `training`...) and its own parameters' and buffers' names,
    shapes, dtypes and devices. Values of parameters are not part of it (the oracle draws its own inputs)."""
    attributes = tuple(plain_attributes(module))
    tensors = tuple((name, tuple(t.shape), str(t.dtype), str(t.device))
                    for name, t in [*module.named_parameters(recurse=True), *module.named_buffers(recurse=True)])
    return (class_name(module), bool(module.training), attributes, tensors)


@dataclass
class ModuleCalls:
    """The instances of one class seen in a model run, grouped by `instance_key`, with their unique calls."""

    name: str
    instances: dict[Hashable, list[nn.Module]] = field(default_factory=dict)
    samples: dict[Hashable, list[Sample]] = field(default_factory=dict)
    counts: dict[Hashable, list[int]] = field(default_factory=dict)
    _seen: dict[Hashable, dict[Hashable, int]] = field(default_factory=dict)

    def record(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        key = instance_key(module)
        group = self.instances.setdefault(key, [])
        if not any(m is module for m in group):
            group.append(module)
        seen = self._seen.setdefault(key, {})
        signature = signature_of(args, kwargs)
        if signature in seen:
            self.counts[key][seen[signature]] += 1
            return
        seen[signature] = len(self.samples.setdefault(key, []))
        self.samples[key].append(Sample(clone_value(tuple(args)), clone_value(dict(kwargs))))
        self.counts.setdefault(key, []).append(1)


@contextlib.contextmanager
def record_module_calls(root: nn.Module, names: set[str]) -> Iterator[dict[str, ModuleCalls]]:
    """While the block runs, every call of a module of `root` whose class's target name is in `names` is recorded
    (inputs cloned once per unique signature); hooks are removed after, also on error."""
    found: dict[str, ModuleCalls] = {}
    handles = []
    for module in root.modules():
        name = module_target_name(module)
        if name not in names:
            continue
        calls = found.setdefault(name, ModuleCalls(name))

        def hook(mod: nn.Module, args: tuple, kwargs: dict, _calls: ModuleCalls = calls) -> None:
            with torch.no_grad():
                _calls.record(mod, args, kwargs)

        handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))
    try:
        yield found
    finally:
        for handle in handles:
            handle.remove()


def recorded_calls(run: Callable[[], Any], root: nn.Module, names: set[str], *, captured: bool = False
                   ) -> dict[str, ModuleCalls]:
    """The calls of `root`'s instances of the classes named (target names) in one pass of `run`, recorded as the model
    will run: with `captured`, inside a CUDA-graph capture (after a warm-up pass), replayed once so that the recorded
    copies hold the values. Why: a library may call its modules otherwise when it sees a capture, and a module kernel
    is judged on the calls it will get. transformers 5.17 (`masking_utils._ignore_causal_mask_sdpa`, through
    `is_tracing`) builds an explicit causal mask inside a capture and passes `LlamaAttention` `attention_mask=None`
    outside one, so an entry judged on the eager calls never served under CUDA graphs (BENCHMARKS.md K9); 5.18-5.25
    still do for a model run without a cache (the packed-sequence check on `position_ids` cannot read them inside a
    capture, K11). A model that cannot be captured is recorded eagerly (logged)."""
    if captured:
        from forge.checking.benchmarking import record_inside_capture

        try:
            found = record_inside_capture(run, record_module_calls(root, names))
        except Exception as exc:  # noqa: BLE001 - recorded eagerly then
            logger.warning("the model cannot be captured in a CUDA graph (%s: %s); its module calls are recorded "
                           "eagerly", type(exc).__name__, exc)
        else:
            for calls in found.values():  # out of the graph's memory pool
                calls.samples = {key: [s.clone() for s in samples] for key, samples in calls.samples.items()}
            return found
    with torch.no_grad(), record_module_calls(root, names) as found:
        run()
    return found


class ModuleKernelProvider(KernelProvider):
    """A replacement forward for instances of one module class (see the module docstring).

    Subclasses implement `_bind(instance) -> callable(*args, **kwargs)` and `_prepare_instances(instances, samples)`;
    `prepare(samples)` of a plain provider is not how a module provider is prepared: call `prepare_instances`. Calling
    the provider itself is an error (it has no instance)."""

    # The clock this source is timed on whatever the plan's selection clock (None: the plan's). A source whose gain is
    # host time by construction sets it (`GraphedModuleProvider`: the same kernels, fewer launches, no device time
    # saved), so a plan selecting on device time does not refuse it for the copies it adds.
    timed_on: ClassVar[TimingMode | None] = None

    def __init__(self, target_class: str) -> None:
        super().__init__()
        self.target_class = target_class
        self.instance_keys: frozenset[Hashable] = frozenset()
        self._bound: weakref.WeakKeyDictionary[nn.Module, Callable[..., Any]] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    @property
    def supported_function(self) -> str:
        return MODULE_PREFIX + self.target_class

    def prepare_instances(self, instances: Sequence[nn.Module], samples: Sequence[Sample],
                          counts: Sequence[int] | None = None) -> bool:
        """Get ready for `instances` (one behaviour class, `instance_key`) called on `samples` (`counts[i]` times
        per model pass, when known); True when it can serve them. The keys of prepared instances are what the
        runtime routes."""
        if not instances or any(class_name(m) != self.target_class for m in instances):
            return False
        ready = self._prepare_instances(list(instances), list(samples), list(counts) if counts is not None else None)
        if ready:
            self.instance_keys = self.instance_keys | {instance_key(m) for m in instances}
            self._ready = True
        return bool(ready)

    def serves(self, module: nn.Module) -> bool:
        return instance_key(module) in self.instance_keys

    def bind(self, module: nn.Module) -> Callable[..., Any]:
        """The replacement forward of `module` (cached per instance, held no longer than the instance)."""
        with self._lock:
            bound = self._bound.get(module)
            if bound is None:
                bound = self._bound[module] = self._bind(module)
            return bound

    @property
    def rewrites(self) -> bool:
        """Whether asking this provider's source again can give other code (a generator writes a new file; a kept
        file, or `torch.compile` of the same forward, gives the same)."""
        return False

    @property
    def writes_on_prepare(self) -> bool:
        """Whether `prepare_instances` will write the code first (a conversation, bounded by the optimizer's
        generation timeout through `cancel`)."""
        return False

    def cancel(self) -> None:
        """Abandon a preparation in progress (a conversation writing the code), from another thread: the optimizer
        calls it when its generation time is up. Nothing to abandon by default."""

    def sibling(self) -> ModuleKernelProvider | None:
        """A fresh provider of this one's code for another behaviour group of the class, without the work that
        wrote it (a generated file: no second conversation), to be prepared and judged on that group; None when
        the source should be asked again (the default)."""
        return None

    def _prepare(self, samples: list[Sample]) -> bool:
        raise TypeError(f"{type(self).__name__} is prepared with prepare_instances(instances, samples)")

    def _call(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"{type(self).__name__} serves a module instance: call bind(instance)(...)")

    def _bind(self, module: nn.Module) -> Callable[..., Any]:
        raise NotImplementedError

    def _prepare_instances(self, instances: list[nn.Module], samples: list[Sample],
                           counts: list[int] | None = None) -> bool:
        raise NotImplementedError


class CompiledModuleProvider(ModuleKernelProvider, type_name="torch_compile_module"):
    """`torch.compile` of a module class's own forward, per instance (`dynamic=False`): Inductor fuses the glue of
    the forward (a norm's pow/mean/rsqrt/mul/casts into one kernel) and calls cuBLAS/cuDNN/flash for the rest."""

    # Inductor is trusted PyTorch code (see CompiledFunctionProvider): no dispatch-mode runs in the oracle.
    allows_dispatch_poisoning = False

    def __init__(self, target_class: str, mode: str | None = None) -> None:
        super().__init__(target_class)
        self.mode = mode
        self._compiled: Callable[..., Any] | None = None  # one graph for every instance it serves (one class)

    @property
    def name(self) -> str:
        return f"torch.compile({self.target_class.rsplit('.', 1)[-1]}.forward)"

    def _bind(self, module: nn.Module) -> Callable[..., Any]:
        if self._compiled is None:
            self._compiled = torch.compile(type(module).forward, mode=self.mode, dynamic=False)
        return functools.partial(self._compiled, module)

    def _prepare_instances(self, instances: list[nn.Module], samples: list[Sample],
                           counts: list[int] | None = None) -> bool:
        # The group's graph is built here, on the judged calls, and each instance runs it once (its guards checked),
        # so nothing compiles later on a first call that may fall inside a CUDA-graph capture.
        for module in instances:
            forward = self.bind(module)
            for sample in samples:
                try:
                    with torch.no_grad():
                        forward(*clone_value(tuple(sample.args)), **clone_value(dict(sample.kwargs)))
                except Exception as exc:  # noqa: BLE001 - this class cannot be compiled alone
                    logger.info("%s failed to compile for %s: %s", self.name, sample.describe(), exc)
                    return False
        return True

    def _to_dict(self) -> dict[str, Any]:
        return {"target_class": self.target_class, "mode": self.mode,
                "instance_keys": [repr(k) for k in sorted(self.instance_keys, key=repr)]}

    @classmethod
    def _from_dict(cls, state: dict[str, Any]) -> CompiledModuleProvider:
        provider = cls(state["target_class"], state.get("mode"))
        provider.instance_keys = frozenset(_key_from_repr(k) for k in state.get("instance_keys", []))
        provider._ready = True
        return provider


def _key_from_repr(text: str) -> Hashable:
    """An `instance_key` read back from a saved plan (literals only: `ast.literal_eval`)."""
    import ast

    return _tuples(ast.literal_eval(text))


def _tuples(value: Any) -> Any:
    return tuple(_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value
