"""What a candidate is judged against: a `torch.nn.functional` function on its sampled calls (`FunctionTarget`), or a
KernelBench-format reference `Model` (`ModuleTarget`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from forge.judging.modules import ModuleSource
from forge.samples import Sample

__all__ = ["MODULE_SEEDS", "FunctionTarget", "InstanceTarget", "ModuleTarget", "Target"]

MODULE_SEEDS: tuple[int, ...] = (42, 43, 44)


@dataclass(frozen=True, eq=False)
class FunctionTarget:
    """`torch.nn.functional.<function>` on `samples` (unique calls: tensors or `TensorSpec`s, all on one device),
    each called `counts[i]` times per model pass (None: once each). `reference` defaults to PyTorch's function; a
    module class's forward (`"module:<class>"`, `forge.modules`) gives its instance's forward as the reference."""

    function: str
    samples: tuple[Sample, ...]
    counts: tuple[int, ...] | None = None
    reference: Callable[..., Any] | None = None

    kind = "function"

    def __post_init__(self) -> None:
        from forge.functional import original_function

        if self.reference is None:  # a module class's forward (forge.modules) names its own reference
            original_function(self.function)  # a clear error for a name that is not a replaceable function
        samples = _check_samples(self.samples)
        object.__setattr__(self, "samples", samples)
        if self.counts is not None:
            counts = tuple(self.counts)
            if len(counts) != len(samples) or any(isinstance(c, bool) or not isinstance(c, int) or c < 1
                                                  for c in counts):
                raise ValueError(f"counts must hold one int >= 1 per sample ({len(samples)}), got {list(counts)!r}")
            object.__setattr__(self, "counts", counts)

    @property
    def reference_fn(self) -> Callable[..., Any]:
        from forge.functional import original_function

        return self.reference if self.reference is not None else original_function(self.function)

    @property
    def label(self) -> str:
        return self.function


@dataclass(frozen=True, eq=False)
class ModuleTarget:
    """A KernelBench-format problem (`source`: `Model`, `get_inputs`, `get_init_inputs`; trusted) on `device`,
    checked on `seeds` (the first is the one timed); `dtype` casts the models and floating inputs."""

    source: ModuleSource
    device: str = "cpu"
    seeds: tuple[int, ...] = MODULE_SEEDS
    dtype: torch.dtype | None = None

    kind = "module"

    def __post_init__(self) -> None:
        if not isinstance(self.source, ModuleSource):
            raise TypeError(f"ModuleTarget.source must be a forge.judging.modules.ModuleSource, got "
                            f"{type(self.source).__name__}")
        if not self.seeds:
            raise ValueError("a module target needs at least one seed")
        object.__setattr__(self, "seeds", tuple(int(s) for s in self.seeds))
        device = torch.device(self.device)
        if device.type == "cuda" and device.index is None:  # the child needs the very device the parent uses
            device = torch.device("cuda", torch.cuda.current_device())
        object.__setattr__(self, "device", str(device))

    @property
    def label(self) -> str:
        return self.source.name


@dataclass(frozen=True, eq=False)
class InstanceTarget(FunctionTarget):
    """One live module instance of a user's model (a hot `LlamaRMSNorm`), called on `samples` (the calls it got in
    the model, each `counts[i]` times per pass). A candidate is a `ModelNew` whose constructor takes the original
    instance and keeps its parameters; it is judged like a function kernel (the oracle on the samples, probes, the
    launch check's module policy) against the instance's own forward, float64 on an upcast copy (`ReferenceModel`).
    The sandbox child gets a pickled copy of the instance (`torch.save`), so its class must be importable there by
    its qualified name (a library's class, or one in an installed package: not `__main__`)."""

    module: torch.nn.Module | None = None

    kind = "instance"

    def __post_init__(self) -> None:
        from forge.judging.modules import ReferenceModel
        from forge.modules import module_target_name

        if not isinstance(self.module, torch.nn.Module):
            raise TypeError(f"InstanceTarget.module must be the nn.Module instance, got {type(self.module).__name__}")
        if self.function != module_target_name(self.module):
            raise ValueError(f"InstanceTarget.function must be {module_target_name(self.module)!r} (the instance's "
                             f"class), got {self.function!r}")
        if self.reference is None:
            object.__setattr__(self, "reference", ReferenceModel(self.module))
        super().__post_init__()

    @classmethod
    def of(cls, module: torch.nn.Module, samples: Sequence[Sample], counts: Sequence[int] | None = None
           ) -> InstanceTarget:
        from forge.modules import module_target_name

        return cls(module_target_name(module), tuple(samples), tuple(counts) if counts is not None else None,
                   module=module)


Target = FunctionTarget | ModuleTarget | InstanceTarget


def _check_samples(samples: Sequence[Sample]) -> tuple[Sample, ...]:
    if isinstance(samples, Sample) or not isinstance(samples, Sequence):
        raise TypeError("samples must be a sequence of forge.samples.Sample")
    out = []
    for i, sample in enumerate(samples):
        if not isinstance(sample, tuple) or len(sample) != 2 or not isinstance(sample[1], dict):
            raise TypeError(f"samples[{i}] must be a forge.samples.Sample (args, kwargs), got {type(sample).__name__}")
        out.append(Sample(tuple(sample[0]), dict(sample[1])))
    if not out:
        raise ValueError("a function target needs at least one sample")
    return tuple(out)
