"""One `torch.library` op per provider, so a planned call survives `torch.compile` as a single opaque node.

Why: when Dynamo traces a forward that calls a plan's provider it either inlines the provider's Python (a Triton
launcher, `torch.compile` inside `torch.compile`, host-side caches...) and breaks the graph at the first thing it
cannot trace, or it has to be told what the call returns. A custom op with a fake implementation is the supported
way to tell it: Dynamo records one node, AOTAutograd and Inductor see its output metadata, and Inductor fuses the
surrounding ops around it.

Design:

- Schema `(Tensor[] tensors, int index) -> Tensor[]`. For a validated signature every non-tensor argument is a
  constant (the runtime's guard matches it exactly), so the op takes only the tensors, in the order
  `samples.map_values` visits the signature (positional arguments, then keywords in the signature's order, nested
  containers depth first), and `index` names the signature; the implementation rebuilds the call from the signature's
  template. One op per provider object (cached weakly, so `plan.apply` twice registers nothing new); its signature
  table only grows.
- Output metadata comes from running the original PyTorch function on `meta` tensors of the signature (shape,
  strides, dtype), so the fake implementation says what PyTorch would return. The real implementation returns
  exactly that layout: an output with other strides, or one that aliases an input, is copied into a fresh tensor
  of the promised layout (Inductor indexes outputs by the strides the fake promised; a lie corrupts results).
- Signatures whose original mutates an input (`inplace=True`) or returns a view of one, or whose output is not a
  tensor or a tuple/list of tensors, get no op (`register` returns None): the runtime then lets Dynamo trace stock
  PyTorch for them, which is correct, just not replaced.
- The implementation re-checks the call's signature with `signature_of` (~1-2 us, paid only by compiled graphs that
  run Python per call, never by CUDA-graph replays): Inductor may hand a custom op inputs with other strides than
  traced, and a kernel must never see a layout it was not validated on. This re-check is also where storage offset
  and address alignment are guarded under a tracer (Dynamo can read neither without a graph break and does not
  guard on the offset, so one graph serves `x` and `x[1:]`): a call whose exact signature is another validated
  signature of this op with the same promised outputs (the same call at another address class) runs the provider
  too. Mismatches and provider errors run the original function.

Registering one op costs a few ms (measured on the 2-core CI machine); calling it ~6 us of dispatch over the Python
implementation, paid only where compiled code runs Python per call (not under CUDA graphs).
"""

from __future__ import annotations

import itertools
import logging
import threading
import warnings
import weakref
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from forge.functional import original_function
from forge.provider import KernelProvider
from forge.samples import Sample, TensorSpec, iter_leaves, map_values, signature_of

__all__ = ["NAMESPACE", "DispatchStats", "ModuleOp", "PlanModeWarning", "ProviderOp", "module_op", "provider_op"]

logger = logging.getLogger(__name__)

NAMESPACE = "kforge"
_SCHEMA = "(Tensor[] tensors, int index) -> Tensor[]"


class PlanModeWarning(UserWarning):
    """A plan runs in a way it was not made for (`KernelOptimizationPlan.execution`): its kernels were selected by
    that mode's clock and checked end to end in that mode only. On the H200 a plan made for CUDA graphs (timm ViT:
    1.18x there) ran the model at 0.60x eager and 0.45x under `torch.compile`."""


def warn_mode(made_for: str, running: str, function: str) -> None:
    message = (f"a kernel-forge plan made for {made_for} runs under {running} here ({function}): its kernels were "
               f"chosen and checked for {made_for} only and may make this model slower; make a plan for this mode "
               f"(make_plan(..., execution={running!r}) or `kforge optimize --execution {running}`)")
    logger.warning(message)
    warnings.warn(message, PlanModeWarning, stacklevel=3)


class DispatchStats:
    """Counters of one runtime's function: calls sent to the provider, to PyTorch (the guard said no), failures.

    Compiled graphs count each call whose Python runs; CUDA-graph replays run no Python and are not counted. Plain
    `+=` under the GIL: exact in one thread, approximate when several threads dispatch at once. `execution`: the
    mode the plan was made for (a call seen in another mode warns once per mode: `note_mode`).
    """

    __slots__ = ("provider_calls", "fallback_calls", "provider_errors", "execution", "modes_warned", "first_miss",
                 "__weakref__")

    def __init__(self, execution: str | None = None) -> None:
        self.provider_calls = 0
        self.fallback_calls = 0
        self.provider_errors = 0
        self.execution = execution
        self.modes_warned: set[str] = set()
        # The signature key of the first call the guard refused (module entries), to say why an entry never served.
        self.first_miss: Hashable | None = None

    def note_mode(self, running: str, function: str) -> None:
        """Warn (once per mode) when `running` is not the mode the plan was made for."""
        if self.execution is not None and running != self.execution and running not in self.modes_warned:
            self.modes_warned.add(running)
            warn_mode(self.execution, running, function)

    def as_dict(self) -> dict[str, int]:
        return {
            "provider_calls": self.provider_calls,
            "fallback_calls": self.fallback_calls,
            "provider_errors": self.provider_errors,
        }


@dataclass(frozen=True)
class _OutputSpec:
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype


@dataclass(frozen=True)
class _SignatureCall:
    """How to rebuild one validated call from its tensors, and what it must return."""

    template: Sample  # the validated call, tensors as TensorSpecs
    key: Hashable  # signature_of(template)
    outputs: tuple[_OutputSpec, ...]
    container: type | None  # None: a bare tensor; tuple or list: that container of `outputs`
    slots: tuple[tuple[int, ...], tuple[str, ...]] | None  # where the tensors go when all are top-level arguments

    def rebuild(self, tensors: list[torch.Tensor]) -> tuple[tuple, dict]:
        if self.slots is not None:  # the common case, without a walk over the template
            positions, names = self.slots
            args = list(self.template.args)
            for i, position in enumerate(positions):
                args[position] = tensors[i]
            kwargs = dict(self.template.kwargs)
            for i, name in enumerate(names, len(positions)):
                kwargs[name] = tensors[i]
            return tuple(args), kwargs
        feed = iter(tensors)
        put = lambda v: next(feed) if isinstance(v, TensorSpec) else v  # noqa: E731
        return map_values(tuple(self.template.args), put), map_values(dict(self.template.kwargs), put)

    def conform(self, out: Any, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """The outputs as a list, each with the promised layout and not aliasing an input."""
        leaves = [out] if self.container is None else list(out)
        if len(leaves) != len(self.outputs):
            raise RuntimeError(f"expected {len(self.outputs)} outputs, got {len(leaves)}")
        return [_conform_one(t, spec, inputs) for t, spec in zip(leaves, self.outputs, strict=True)]


def _conform_one(tensor: Any, spec: _OutputSpec, inputs: list[torch.Tensor]) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != spec.shape or tensor.dtype != spec.dtype:
        got = f"{tuple(tensor.shape)} {tensor.dtype}" if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise RuntimeError(f"output does not match the signature's: expected {spec.shape} {spec.dtype}, got {got}")
    if tensor.stride() == spec.stride and not _aliases_any(tensor, inputs):
        return tensor
    fresh = torch.empty_strided(spec.shape, spec.stride, dtype=spec.dtype, device=tensor.device)
    fresh.copy_(tensor)
    return fresh


def _aliases_any(tensor: torch.Tensor, inputs: list[torch.Tensor]) -> bool:
    if tensor.numel() == 0:
        return False
    ptr = tensor.untyped_storage().data_ptr()
    return any(t.numel() and t.untyped_storage().data_ptr() == ptr for t in inputs)


def _top_level_slots(template: Sample) -> tuple[tuple[int, ...], tuple[str, ...]] | None:
    """Positions of the tensor arguments and names of the tensor keywords, or None when a tensor is nested."""
    for leaf in (*template.args, *template.kwargs.values()):
        if isinstance(leaf, (tuple, list, dict)) and any(isinstance(v, TensorSpec) for v in iter_leaves(leaf)):
            return None
    positions = tuple(i for i, a in enumerate(template.args) if isinstance(a, TensorSpec))
    names = tuple(k for k, v in template.kwargs.items() if isinstance(v, TensorSpec))
    return positions, names


def _meta_call(function: str, template: Sample) -> tuple[tuple[_OutputSpec, ...], type | None] | None:
    """Run the original function on meta tensors: the outputs' layout, or None when the call cannot be an op."""
    return _layout_of(original_function(function), function, template, lambda v: torch.empty_strided(
        v.shape, v.stride, dtype=v.dtype, device="meta"))


def _fake_call(original: Callable[..., Any], name: str,
               template: Sample) -> tuple[tuple[_OutputSpec, ...], type | None] | None:
    """Run a module's original forward on fake tensors (its parameters are real: `allow_non_fake_inputs`): the
    outputs' layout, or None when the call cannot be an op."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True):
        return _layout_of(original, name, template, lambda v: torch.empty_strided(
            v.shape, v.stride, dtype=v.dtype, device=torch.device(v.device)))


def _layout_of(original: Callable[..., Any], name: str, template: Sample,
               make: Callable[[TensorSpec], torch.Tensor]) -> tuple[tuple[_OutputSpec, ...], type | None] | None:
    inputs: list[torch.Tensor] = []

    def meta(value: Any) -> Any:
        if isinstance(value, TensorSpec):
            t = make(value)
            inputs.append(t)
            return t
        return value

    args, kwargs = map_values(tuple(template.args), meta), map_values(dict(template.kwargs), meta)
    if not inputs:
        return None
    versions = [t._version for t in inputs]
    function = name
    try:
        with torch.no_grad():
            out = original(*args, **kwargs)
    except Exception as exc:  # no meta kernel, data-dependent output...
        logger.debug("no custom op for %s%s: meta run failed: %s", function, template.describe(), exc)
        return None
    if [t._version for t in inputs] != versions:
        logger.debug("no custom op for %s%s: it mutates an input", function, template.describe())
        return None
    if isinstance(out, torch.Tensor):
        leaves, container = [out], None
    elif isinstance(out, (tuple, list)) and out and all(isinstance(o, torch.Tensor) for o in out):
        leaves, container = list(out), (list if isinstance(out, list) else tuple)
    else:
        logger.debug("no custom op for %s%s: output is a %s", function, template.describe(), type(out).__name__)
        return None
    if any(torch._C._is_alias_of(o, t) for o in leaves for t in inputs):
        logger.debug("no custom op for %s%s: output is a view of an input", function, template.describe())
        return None
    return tuple(_OutputSpec(tuple(o.shape), tuple(o.stride()), o.dtype) for o in leaves), container


def _op_tags() -> tuple[torch.Tag, ...]:
    """Ask Inductor to pass inputs with exactly the traced strides (torch >= 2.7 knows the tag)."""
    tag = getattr(torch.Tag, "needs_exact_strides", None)
    return () if tag is None else (tag,)


class ProviderOp:
    """The custom op `kforge::<function>_<n>` of one provider, with its table of validated signatures."""

    def __init__(self, provider: KernelProvider, name: str, stats_of: StatsResolver | None = None) -> None:
        self.function = provider.supported_function
        self.qualname = f"{NAMESPACE}::{name}"
        self.stats = DispatchStats()  # calls no runtime claims
        self._stats_of = stats_of
        self._provider = weakref.ref(provider)
        self._original = self._original_call()
        self._calls: list[_SignatureCall] = []
        self._index: dict[Hashable, int] = {}
        self._not_ops: set[Hashable] = set()  # signatures whose call cannot be an op (`_output_layout` gave None)
        self._lock = threading.Lock()
        self._warned = False
        # torch.library.Library rather than torch.library.custom_op: the same op for Dynamo and Inductor, but a call
        # costs ~6 us of dispatch instead of ~20 us (custom_op adds an autograd.Function and Dynamo-disable
        # wrappers), measured on the CI machine. No autograd formula: the runtime only calls it without grad.
        self._lib = torch.library.Library(NAMESPACE, "FRAGMENT")
        self._lib.define(name + _SCHEMA, tags=_op_tags())
        self._lib.impl(name, self._impl, "CompositeExplicitAutograd")
        torch.library.register_fake(self.qualname, self._fake, lib=self._lib)
        self.op: Callable[[list[torch.Tensor], int], list[torch.Tensor]] = getattr(
            getattr(torch.ops, NAMESPACE), name
        ).default

    # -- what differs for a module entry (ModuleOp) ---------------------------------------------------------
    def _original_call(self) -> Callable[..., Any]:
        return original_function(self.function)

    def _output_layout(self, template: Sample) -> tuple[tuple[_OutputSpec, ...], type | None] | None:
        return _meta_call(self.function, template)

    def _serve(self, provider: KernelProvider, args: tuple, kwargs: dict) -> Any:
        return provider(*args, **kwargs)

    # -- table --------------------------------------------------------------------------------------------
    def register(self, template: Sample) -> int | None:
        """The index of a validated signature (added on first use), or None when it cannot be an op."""
        key = signature_of(template.args, template.kwargs)
        with self._lock:
            if key in self._index:
                return self._index[key]
            if key in self._not_ops:
                return None
            meta = self._output_layout(template)
            if meta is None:
                # Remembered: the runtime registers an entry's signatures at every activation (once a pass in eager
                # timing), and the layout run is the whole forward on fake tensors (~5 ms for LlamaAttention).
                self._not_ops.add(key)
                return None
            self._calls.append(_SignatureCall(template, key, *meta, _top_level_slots(template)))
            self._index[key] = len(self._calls) - 1
            return self._index[key]

    def call(self, index: int, tensors: list[torch.Tensor]) -> Any:
        """Traced side: one op node, its outputs rebuilt into the structure PyTorch returns."""
        outs = self.op(tensors, index)
        container = self._calls[index].container
        if container is None:
            return outs[0]
        return container(outs)

    # -- implementations ----------------------------------------------------------------------------------
    def _impl(self, tensors: list[torch.Tensor], index: int) -> list[torch.Tensor]:
        call = self._calls[index]
        args, kwargs = call.rebuild(tensors)
        provider = self._provider()
        stats = self._stats(provider)
        if stats.execution is not None and stats.execution != "compile":
            stats.note_mode("compile", self.function)
        if provider is not None and self._validated(call, signature_of(args, kwargs)):
            try:
                out = call.conform(self._serve(provider, args, kwargs), tensors)
            except Exception:
                stats.provider_errors += 1
                if not self._warned:
                    self._warned = True
                    logger.warning("provider for %s raised inside %s; running PyTorch for this call",
                                   self.function, self.qualname, exc_info=True)
            else:
                stats.provider_calls += 1
                return out
        stats.fallback_calls += 1
        return call.conform(self._original(*args, **kwargs), tensors)

    def _validated(self, call: _SignatureCall, key: Hashable) -> bool:
        """Whether a call traced as `call` and run with signature `key` may go to the provider: `key` is `call`'s,
        or another validated signature of this op that promises the same outputs (e.g. `call` at a storage offset,
        which the traced guard cannot tell apart)."""
        if key == call.key:
            return True
        other = self._index.get(key)
        if other is None:
            return False
        found = self._calls[other]
        return found.outputs == call.outputs and found.container is call.container

    def _stats(self, provider: KernelProvider | None) -> DispatchStats:
        if provider is not None and self._stats_of is not None:
            stats = self._stats_of(self.function, provider)
            if stats is not None:
                return stats
        return self.stats

    def _fake(self, tensors: list[torch.Tensor], index: int) -> list[torch.Tensor]:
        call = self._calls[index]
        device = tensors[0].device
        return [torch.empty_strided(o.shape, o.stride, dtype=o.dtype, device=device) for o in call.outputs]


class ModuleOp(ProviderOp):
    """The custom op of one module instance served by a module entry (`forge.modules`): the same table of validated
    signatures as a function's op, the instance's replacement forward as the implementation, its original forward
    as the fallback, and the output layout from the original forward run on fake tensors. One op per instance (the
    replacement holds the instance's parameters), so Dynamo records one node per replaced call."""

    def __init__(self, provider: KernelProvider, name: str, replacement: Callable[..., Any],
                 original: Callable[..., Any], stats_of: StatsResolver | None = None) -> None:
        self._replacement = replacement
        self._module_original = original
        super().__init__(provider, name, stats_of)

    def _original_call(self) -> Callable[..., Any]:
        return self._module_original

    def _output_layout(self, template: Sample) -> tuple[tuple[_OutputSpec, ...], type | None] | None:
        return _fake_call(self._module_original, self.function, template)

    def _serve(self, provider: KernelProvider, args: tuple, kwargs: dict) -> Any:
        return self._replacement(*args, **kwargs)


# Per provider (a plan entry's), the op of each instance it serves: they live as long as the provider, which already
# holds each instance's replacement (`ModuleKernelProvider.bind`).
_MODULE_OPS: weakref.WeakKeyDictionary[KernelProvider, weakref.WeakKeyDictionary[Any, ModuleOp | None]] = \
    weakref.WeakKeyDictionary()


def module_op(provider: KernelProvider, instance: Any, replacement: Callable[..., Any],
              original: Callable[..., Any], stats_of: StatsResolver | None = None) -> ModuleOp | None:
    """The op of `instance` under `provider` (registered once per pair); None when torch cannot register one."""
    with _OPS_LOCK:
        ops = _MODULE_OPS.setdefault(provider, weakref.WeakKeyDictionary())
        if instance in ops:  # (keyed by the instance itself: a new one at a collected one's address gets its own)
            return ops[instance]
        short = provider.supported_function.rsplit(".", 1)[-1]
        name = f"module_{_op_name(short)}_{next(_SERIAL)}"
        try:
            op: ModuleOp | None = ModuleOp(provider, name, replacement, original, stats_of)
        except Exception as exc:  # an old torch without torch.library.register_fake, a name clash...
            logger.warning("cannot register custom op %s::%s (%s); under torch.compile this module kernel is not used",
                           NAMESPACE, name, exc)
            op = None
        ops[instance] = op
        return op


def _op_name(text: str) -> str:
    """`text` as the identifier part of an op name."""
    return "".join(c if c.isalnum() else "_" for c in text)


_OPS: weakref.WeakKeyDictionary[KernelProvider, ProviderOp | None] = weakref.WeakKeyDictionary()
_OPS_LOCK = threading.Lock()
_SERIAL: Iterator[int] = itertools.count()

StatsResolver = Callable[[str, KernelProvider], "DispatchStats | None"]


def provider_op(provider: KernelProvider, stats_of: StatsResolver | None = None) -> ProviderOp | None:
    """The provider's op (registered once per provider object); None when torch cannot register one.

    `stats_of(function, provider)` names the counters a call should go to (the runtime passes the active runtime's
    for the calling thread); the op's own `stats` take the calls it returns None for. Only the first caller's
    resolver is kept.
    """
    with _OPS_LOCK:
        if provider in _OPS:
            return _OPS[provider]
        name = f"{provider.supported_function}_{next(_SERIAL)}"
        try:
            op: ProviderOp | None = ProviderOp(provider, name, stats_of)
        except Exception as exc:  # an old torch without torch.library.register_fake, a name clash...
            logger.warning("cannot register custom op %s::%s (%s); under torch.compile this provider is not used",
                           NAMESPACE, name, exc)
            op = None
        _OPS[provider] = op
        return op
