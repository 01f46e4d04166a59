"""What the agent is asked to build: `KernelTask` (one functional op, its sampled calls, the target device),
`ModuleTask` (a KernelBench-format module problem) and `InstanceTask` (a hot module of a user's model, rewritten
as a `ModelNew(original)` that shares its parameters).

All are frozen; they hold the samples as given (live tensors or `TensorSpec`s) and never compare them (eq=False),
since tensors do not compare to a bool. `signature_key()` is a stable hash of what a kernel must serve (function,
call signatures, device, language), suitable as part of a kernel-cache key.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import textwrap
import types
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from agent.languages import language_names
from agent.roofline import device_description, samples_device
from forge.functional import original_function
from forge.samples import (
    Sample,
    TensorSpec,
    clone_value,
    dtype_name,
    map_values,
    sample_to_json,
    spec_sample,
    value_to_json,
)

__all__ = ["InstanceTask", "KernelTask", "ModuleTask", "SampleEntry"]


@dataclass(frozen=True, eq=False)
class SampleEntry:
    """One distinct call signature: the sample, how often it was called and its share of the function's time."""

    sample: Sample
    count: int | None = None
    time_share: float | None = None  # fraction in [0, 1] of the function's measured time

    def __post_init__(self) -> None:
        if not isinstance(self.sample, Sample):
            raise TypeError(
                f"SampleEntry.sample must be a forge.samples.Sample, got {type(self.sample).__name__}"
            )
        if self.count is not None and (not isinstance(self.count, int) or self.count < 0):
            raise ValueError(f"call count must be a non-negative int, got {self.count!r}")
        if self.time_share is not None and not (
            isinstance(self.time_share, (int, float)) and math.isfinite(self.time_share) and 0 <= self.time_share <= 1
        ):
            raise ValueError(
                f"time_share must be a fraction in [0, 1] (e.g. 0.25 for 25%), got {self.time_share!r}"
            )


def _entry(item: Any) -> SampleEntry:
    if isinstance(item, SampleEntry):
        return item
    if isinstance(item, Sample):
        return SampleEntry(item)
    if isinstance(item, tuple) and len(item) in (2, 3) and isinstance(item[1], Sample):
        count, sample = item[0], item[1]
        share = item[2] if len(item) == 3 else None
        return SampleEntry(sample, count=count, time_share=share)
    raise TypeError(
        f"expected a Sample, a (count, Sample) or (count, Sample, time_share) tuple, or a SampleEntry; got "
        f"{type(item).__name__}"
    )


def _check_language(language: str) -> None:
    """A registered `agent.languages` language (each brings its own prompt fragments)."""
    if language not in language_names():
        raise ValueError(f"unsupported kernel language {language!r}; registered languages: "
                         f"{', '.join(language_names())}")


def _check_capability(capability: Any) -> tuple[int, int] | None:
    if capability is None:
        return None
    try:
        major, minor = capability
        return int(major), int(minor)
    except (TypeError, ValueError):
        raise ValueError(
            f"compute capability must be a (major, minor) pair such as (9, 0), got {capability!r}"
        ) from None


def _key_json(value: Any) -> Any:
    """JSON of a value by layout only (tensors without value statistics)."""
    return value_to_json(map_values(value, lambda v: TensorSpec.of(v, with_stats=False) if isinstance(
        v, torch.Tensor) else v))


@dataclass(frozen=True, eq=False)
class KernelTask:
    """One `torch.nn.functional` function to implement for the given calls on one device, in `language` (a
    registered `agent.languages` name; keyword-only and required: the generator decides it)."""

    function: str
    samples: tuple[SampleEntry, ...]
    device_name: str = "CPU (Triton interpreter)"
    compute_capability: tuple[int, int] | None = None
    language: str = field(kw_only=True)

    def __post_init__(self) -> None:
        original_function(self.function)  # clear error for names that are not replaceable functions
        entries = tuple(_entry(item) for item in self.samples)
        if not entries:
            raise ValueError(f"a kernel task for {self.function!r} needs at least one sample")
        object.__setattr__(self, "samples", entries)
        object.__setattr__(self, "compute_capability", _check_capability(self.compute_capability))
        _check_language(self.language)

    @classmethod
    def from_samples(
        cls,
        function: str,
        samples: Iterable[Any],
        device: str | torch.device | None = None,
        *,
        time_shares: Sequence[float] | None = None,
        language: str,
    ) -> KernelTask:
        """A task whose device name and capability come from `device` (default: the samples' first tensor device).

        `samples`: Samples, (count, Sample) pairs (as `SampleCounter.items()` gives), (count, Sample, time_share)
        triples or SampleEntry objects. `time_shares`, if given, sets each entry's share (same order).
        """
        entries = [_entry(item) for item in samples]
        if time_shares is not None:
            if len(time_shares) != len(entries):
                raise ValueError(f"got {len(time_shares)} time shares for {len(entries)} samples; give one per sample")
            entries = [SampleEntry(e.sample, e.count, share) for e, share in zip(entries, time_shares, strict=True)]
        target = torch.device(device) if device is not None else samples_device(e.sample for e in entries)
        name, capability = device_description(target)
        return cls(function, tuple(entries), name, capability, language=language)

    @property
    def sample_list(self) -> list[Sample]:
        return [e.sample for e in self.samples]

    @property
    def qualified_name(self) -> str:
        return f"torch.nn.functional.{self.function}"

    @property
    def is_interpreter(self) -> bool:
        return self.device_name.startswith("CPU")

    def signature_key(self) -> str:
        """sha256 of the function, every call signature (layouts and argument values), device and language."""
        payload = {
            "function": self.function,
            "samples": [sample_to_json(spec_sample(s, with_stats=False)) for s in self.sample_list],
            "device": self.device_name,
            "capability": list(self.compute_capability) if self.compute_capability else None,
            "language": self.language,
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True, eq=False)
class ModuleTask:
    """A KernelBench-format problem: the reference source (`Model`, `get_inputs`, `get_init_inputs`) and its inputs.

    `inputs` are the forward arguments (tensors, `TensorSpec`s or plain values), `init_inputs` the constructor
    arguments. `dtype`, when set, is the precision the harness casts the model and floating inputs to. `language`:
    the registered `agent.languages` name `ModelNew` is written in (keyword-only and required).
    """

    source: str
    inputs: tuple
    init_inputs: tuple = ()
    name: str = "Model"
    device_name: str = "CPU (Triton interpreter)"
    compute_capability: tuple[int, int] | None = None
    dtype: torch.dtype | None = None
    language: str = field(kw_only=True)

    def __post_init__(self) -> None:
        if "class Model" not in self.source:
            raise ValueError("a module problem's source must define `class Model(nn.Module)` (KernelBench format)")
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "init_inputs", tuple(self.init_inputs))
        object.__setattr__(self, "compute_capability", _check_capability(self.compute_capability))
        if self.dtype is not None and not isinstance(self.dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype such as torch.bfloat16, got {self.dtype!r}")
        _check_language(self.language)

    @classmethod
    def from_source(
        cls,
        source: str,
        *,
        name: str = "Model",
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        language: str,
    ) -> ModuleTask:
        """Run the (trusted) problem's `get_inputs()` / `get_init_inputs()` on the meta device to learn the inputs.

        Meta tensors cost no memory, so multi-GiB benchmark inputs are fine. Tensor inputs become `TensorSpec`s.
        """
        if "class Model" not in source:
            raise ValueError("a module problem's source must define `class Model(nn.Module)` (KernelBench format)")
        namespace: dict[str, Any] = {"__name__": f"kernel_forge_problem_{name}"}
        try:
            exec(compile(source, f"<problem {name}>", "exec"), namespace)  # noqa: S102 - trusted benchmark source
        except Exception as exc:
            raise ValueError(f"could not load problem {name!r}: {type(exc).__name__}: {exc}") from exc
        if not callable(namespace.get("get_inputs")):
            raise ValueError(f"problem {name!r} does not define get_inputs() (KernelBench format)")
        try:
            with torch.device("meta"):
                inputs = list(namespace["get_inputs"]())
                init_inputs = list(namespace["get_init_inputs"]()) if "get_init_inputs" in namespace else []
        except Exception as exc:
            raise ValueError(f"could not evaluate the inputs of problem {name!r}: {type(exc).__name__}: {exc}") from exc

        def spec(value: Any) -> Any:
            if not isinstance(value, torch.Tensor):
                return value
            target = dtype if dtype is not None and value.dtype.is_floating_point else value.dtype
            return TensorSpec(tuple(value.shape), target, "cpu", tuple(value.stride()), int(value.storage_offset()))

        device_name, capability = device_description(torch.device(device) if device is not None else None)
        return cls(
            source=source,
            inputs=tuple(map_values(inputs, spec)),
            init_inputs=tuple(map_values(init_inputs, spec)),
            name=name,
            device_name=device_name,
            compute_capability=capability,
            dtype=dtype,
            language=language,
        )

    @property
    def is_interpreter(self) -> bool:
        return self.device_name.startswith("CPU")

    def signature_key(self) -> str:
        """sha256 of the source, input layouts, init inputs, dtype, device and language."""
        payload = {
            "source": self.source,
            "inputs": [_key_json(v) for v in self.inputs],
            "init_inputs": [_key_json(v) for v in self.init_inputs],
            "dtype": str(self.dtype) if self.dtype is not None else None,
            "device": self.device_name,
            "capability": list(self.compute_capability) if self.compute_capability else None,
            "language": self.language,
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


# Source shown per function or class of a module target (a long forward is rare; a whole modeling file is not).
_SOURCE_CHARS = 6000
_HELPER_DEPTH = 2


def _source_of(obj: Any) -> str | None:
    try:
        text = inspect.getsource(obj)
    except (OSError, TypeError):
        return None
    text = textwrap.dedent(text)
    return text if len(text) <= _SOURCE_CHARS else text[:_SOURCE_CHARS] + "\n# ... (cut)\n"


def _code_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def _helpers(function: Any) -> list[tuple[str, str]]:
    """The functions and classes of the forward's own module that it calls (`rotate_half`, `apply_rotary_pos_emb`),
    and theirs, two levels deep: what a reader of the forward needs to see."""
    found: dict[str, str] = {}
    frontier = [getattr(function, "__func__", function)]
    for _ in range(_HELPER_DEPTH):
        following = []
        for fn in frontier:
            code, namespace = getattr(fn, "__code__", None), getattr(fn, "__globals__", {})
            if code is None:
                continue
            for name in sorted(_code_names(code)):
                value = namespace.get(name)
                if name in found or not (inspect.isfunction(value) or inspect.isclass(value)):
                    continue
                if getattr(value, "__module__", None) != fn.__module__:
                    continue  # torch, the standard library: the model knows them
                source = _source_of(value)
                if source is not None:
                    found[name] = source
                    if inspect.isfunction(value):
                        following.append(value)
        frontier = following
    return list(found.items())


def _tensor_line(kind: str, tensor: torch.Tensor) -> str:
    return f"{kind}, shape {tuple(tensor.shape)}, {dtype_name(tensor.dtype)}, on {tensor.device}"


@dataclass(frozen=True, eq=False)
class InstanceTask:
    """A hot module of a user's model to rewrite as a `ModelNew(original)`: what the prompt shows of it.

    `class_name`: its qualified class; `forward_source`, `init_source` and `helpers` ((name, source): the functions
    and classes of its module that the forward calls) come from `inspect`; `attributes` the plain attributes that
    define its behaviour (`eps`, `hidden_size`), `tensors` its parameters and buffers (name, description) and
    `submodules` its children (name, class); `samples` every call it got in the model (with counts and time shares),
    `outputs` what the original returned for each (descriptions). Build one with `from_instance`."""

    class_name: str
    forward_source: str
    samples: tuple[SampleEntry, ...]
    init_source: str | None = None
    helpers: tuple[tuple[str, str], ...] = ()
    attributes: tuple[tuple[str, str], ...] = ()
    tensors: tuple[tuple[str, str], ...] = ()
    submodules: tuple[tuple[str, str], ...] = ()
    outputs: tuple[str, ...] = ()
    forward_parameters: tuple[str, ...] = ()
    device_name: str = "CPU (Triton interpreter)"
    compute_capability: tuple[int, int] | None = None
    language: str = ""

    def __post_init__(self) -> None:
        entries = tuple(_entry(item) for item in self.samples)
        if not entries:
            raise ValueError(f"a module task for {self.class_name} needs at least one sampled call")
        object.__setattr__(self, "samples", entries)
        object.__setattr__(self, "compute_capability", _check_capability(self.compute_capability))
        _check_language(self.language)

    @classmethod
    def from_instance(cls, module: torch.nn.Module, samples: Iterable[Any], *, language: str,
                      device: str | torch.device | None = None) -> InstanceTask:
        """Describe `module` (a live instance) called on `samples` (Samples, (count, Sample) pairs or
        SampleEntry objects). The original forward runs once per sample (no grad) to describe its outputs."""
        from forge.modules import class_name, plain_attributes

        kind = type(module)
        entries = [_entry(item) for item in samples]
        forward = kind.forward
        outputs = []
        for entry in entries:
            try:
                with torch.no_grad():
                    out = module(*clone_value(tuple(entry.sample.args)), **clone_value(dict(entry.sample.kwargs)))
                outputs.append(_describe_output(out))
            except Exception as exc:  # noqa: BLE001 - a description only
                outputs.append(f"(not run here: {type(exc).__name__})")
        try:
            parameters = tuple(n for n in inspect.signature(forward).parameters if n != "self")
        except (TypeError, ValueError):
            parameters = ()
        target = torch.device(device) if device is not None else samples_device(e.sample for e in entries)
        name, capability = device_description(target)
        return cls(
            class_name=class_name(module),
            forward_source=_source_of(forward) or f"# the source of {kind.__qualname__}.forward is not available\n",
            init_source=_source_of(kind.__init__) if "__init__" in vars(kind) else None,
            samples=tuple(entries),
            helpers=tuple(_helpers(forward)),
            attributes=tuple((k, repr(v)) for k, v in [*plain_attributes(module), *_read_settings(module, forward)]),
            tensors=tuple([(n, _tensor_line("parameter", t)) for n, t in module.named_parameters()]
                          + [(n, _tensor_line("buffer", t)) for n, t in module.named_buffers()]),
            submodules=tuple((n, f"{type(m).__module__}.{type(m).__qualname__}") for n, m in module.named_children()),
            outputs=tuple(outputs),
            forward_parameters=parameters,
            device_name=name,
            compute_capability=capability,
            language=language,
        )

    @property
    def name(self) -> str:
        return self.class_name.rsplit(".", 1)[-1]

    @property
    def sample_list(self) -> list[Sample]:
        return [e.sample for e in self.samples]

    @property
    def is_interpreter(self) -> bool:
        return self.device_name.startswith("CPU")

    def signature_key(self) -> str:
        """sha256 of the class, its sources, attributes, tensors, call signatures, device and language."""
        payload = {
            "class": self.class_name, "forward": self.forward_source, "helpers": list(self.helpers),
            "attributes": list(self.attributes), "tensors": list(self.tensors),
            "samples": [sample_to_json(spec_sample(s, with_stats=False)) for s in self.sample_list],
            "device": self.device_name,
            "capability": list(self.compute_capability) if self.compute_capability else None,
            "language": self.language,
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def _read_settings(module: torch.nn.Module, forward: Any) -> list[tuple[str, Any]]:
    """Plain settings the forward reads through an object that is not a module or tensor, e.g.
    `self.config._attn_implementation` in transformers' attention forwards (which attention function runs): named
    `config._attn_implementation`, sorted."""
    import re

    from forge.modules import _plain

    source = _source_of(forward) or ""
    found = {}
    for owner, name in re.findall(r"\bself\.(\w+)\.(\w+)\b", source):
        holder = getattr(module, owner, None)
        if holder is None or isinstance(holder, (torch.nn.Module, torch.Tensor)) or callable(holder):
            continue
        value = getattr(holder, name, None)
        if not callable(value) and _plain(value):
            found[f"{owner}.{name}"] = tuple(value) if isinstance(value, list) else value
    return sorted(found.items())


def _describe_output(out: Any) -> str:
    if isinstance(out, torch.Tensor):
        return f"tensor {dtype_name(out.dtype)}, shape {tuple(out.shape)}, stride {tuple(out.stride())}"
    if isinstance(out, (tuple, list)):
        inner = ", ".join(_describe_output(o) for o in out)
        return f"{type(out).__name__} of ({inner})"
    if out is None:
        return "None"
    return type(out).__name__
