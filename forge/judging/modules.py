"""Module problems in the KernelBench file format: how a reference `Model` and a candidate `ModelNew` are built and
fed, in the judging process and in the sandbox child alike.

A problem file defines `class Model(nn.Module)`, `get_inputs()` (forward arguments) and `get_init_inputs()`
(constructor arguments); a candidate file defines `ModelNew` with the same constructor. `ModuleSource` builds either
class under a seed, each time in a fresh module, so a candidate that creates the same layers in the same order gets
the same weights (KernelBench's convention). The judge builds `Model` in its own process and `ModelNew` in the
sandbox child with this same code, so both sides agree on weights and inputs. Unlike the upstream harness, integer
and bool inputs keep their dtype (a `dtype` cast applies to floating tensors only), and `make_inputs(fresh=True)`
re-draws inputs from a normal distribution so negative branches get checked too (upstream inputs are `torch.rand`,
all in [0, 1)).
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from types import ModuleType
from typing import Any

import torch

from forge.checking.expectation import tensor_bytes
from forge.checking.validation import LARGE_INPUT_BYTES
from forge.outcome import Outcome, ValidationIssue, issue_of, outcome_of_issues
from forge.samples import Sample, TensorSpec, iter_tensors, map_values
from forge.source_files import load_source_text

__all__ = ["LARGE_MODULE_INPUT_BYTES", "SLOW_MODULE_SEED_S", "ModelCall", "ModuleCheck", "ModuleSource",
           "ReferenceModel", "ScaledCheck", "WeightGuard", "changed_tensors", "check_module", "restored_if_written",
           "seeded", "tensor_digest"]


@contextmanager
def seeded(seed: int, device: Any = None) -> Iterator[None]:
    """Seed torch's RNGs for the block and restore the CPU generator's state, and the current CUDA device's when CUDA
    is in use (`torch.manual_seed` seeds every device; a model built under a seed must not leave the caller's CUDA
    stream of random numbers changed)."""
    target = torch.device(device) if device is not None else None
    if target is not None and target.type == "cuda":
        cuda = [target.index if target.index is not None else torch.cuda.current_device()]
    elif torch.cuda.is_available() and torch.cuda.is_initialized():
        cuda = [torch.cuda.current_device()]
    else:
        cuda = []
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed(int(seed))
        yield


@contextmanager
def _allocating_on(device: Any) -> Iterator[None]:
    """New tensors default to `device` inside the block, so a file's `torch.rand(...)` draws on the GPU directly:
    at KernelBench's shipped sizes CPU draws then copies took 3-10 s of a problem's 15-30 s of harness time on an
    H200 (BENCHMARKS H2). Values then differ from a CPU draw but are as deterministic for a seed and device."""
    if device is None or torch.device(device).type == "cpu":
        yield
        return
    with torch.device(torch.device(device)):
        yield


def _redraw(value: Any, generator: torch.Generator) -> Any:
    if not isinstance(value, torch.Tensor) or value.layout != torch.strided:
        return value
    spec = TensorSpec.of(value)
    if value.is_floating_point():
        spec = dataclasses.replace(spec, mean=None, std=None)  # TensorSpec draws N(0, 1) without moments
    return spec.draw(generator, device=value.device)


@dataclass(frozen=True)
class ModuleSource:
    """A KernelBench-format problem file (`source`, trusted: the user's own problem) and how to build from it."""

    source: str
    name: str = "problem"

    def load(self) -> ModuleType:
        """Execute the problem file in a fresh module and return that module."""
        return load_source_text(self.source, name=self.name)

    def instantiate(self, device: str | torch.device = "cpu", seed: int = 42, *,
                    dtype: torch.dtype | None = None) -> tuple[torch.nn.Module, list[Any]]:
        """`(model, inputs)`: `Model(*get_init_inputs())` built right after `torch.manual_seed(seed)` and moved to
        `device` (floating parameters cast to `dtype` when given), and `make_inputs(seed)` on the same device. The
        model is left in the mode its constructor sets (training mode, as upstream KernelBench does)."""
        module = self.load()
        model = self.construct(module.Model, self.init_inputs(module, seed), device, seed, dtype)
        return model, self._inputs(module, seed, fresh=False, device=device, dtype=dtype)

    def build(self, cls: type, device: str | torch.device = "cpu", seed: int = 42, *,
              dtype: torch.dtype | None = None) -> torch.nn.Module:
        """`cls(*get_init_inputs())` (a candidate's `ModelNew`) built under the same seed as `instantiate` builds
        `Model`; constructor arguments come from the problem file."""
        return self.construct(cls, self.init_inputs(self.load(), seed), device, seed, dtype)

    def make_inputs(self, seed: int = 42, fresh: bool = False, *, device: str | torch.device | None = None,
                    dtype: torch.dtype | None = None) -> list[Any]:
        """Forward arguments: the file's `get_inputs()` under `torch.manual_seed(seed)`. With `fresh=True` every
        tensor is then re-drawn with the same shape, dtype and strides: floating tensors from a standard normal,
        integer and bool tensors uniformly within the [min, max] the original showed (so indices and class targets
        stay valid). Non-tensor items pass through. Tensors are moved to `device` when given; `dtype` casts floating
        tensors only."""
        return self._inputs(self.load(), seed, fresh=fresh, device=device, dtype=dtype)

    @staticmethod
    def init_inputs(module: ModuleType, seed: int) -> list[Any]:
        """`get_init_inputs()` of a loaded problem module, under `seed`."""
        with seeded(seed):
            return list(module.get_init_inputs())

    @staticmethod
    def construct(cls: type, init_inputs: list[Any], device: Any, seed: int,
                  dtype: torch.dtype | None) -> torch.nn.Module:
        """`cls(*init_inputs)` under `seed`, moved to `device` (and `dtype` for floating parameters and buffers)."""
        with seeded(seed):
            model = cls(*init_inputs)
        model = model.to(device=torch.device(device))
        if dtype is not None:
            model = model.to(dtype=dtype)  # nn.Module.to(dtype) casts floating parameters and buffers only
        return model

    def _inputs(self, module: ModuleType, seed: int, *, fresh: bool, device: Any,
                dtype: torch.dtype | None) -> list[Any]:
        with seeded(seed, device), _allocating_on(device):
            inputs = list(module.get_inputs())
        if fresh:
            generator = torch.Generator().manual_seed(int(seed))
            inputs = [map_values(v, lambda t: _redraw(t, generator)) for v in inputs]

        def place(value: Any) -> Any:
            if not isinstance(value, torch.Tensor):
                return value
            if device is not None:
                value = value.to(device=torch.device(device))
            if dtype is not None and value.is_floating_point():
                value = value.to(dtype=dtype)
            return value

        return [map_values(v, place) for v in inputs]


# ---------------------------------------------------------------------------------------------------------
# Checking a candidate module against the reference on several seeds
# ---------------------------------------------------------------------------------------------------------
# Module problems whose forward inputs are larger than this get one seed and no extra normal re-draw (see
# `check_module`): the oracle's own threshold for scaling down fresh rounds (1 GiB).
LARGE_MODULE_INPUT_BYTES = LARGE_INPUT_BYTES
# ...and so do those whose reference took longer than this in all on the first seed (the float64 reference of a 3-D
# transposed convolution has no fast kernel: KernelBench's spent 40-120 s validating three seeds on the H200). The
# reference's time only: a slow candidate gains nothing.
SLOW_MODULE_SEED_S = 8.0


class ScaledCheck(StrEnum):
    """Why a module check stopped after its first seed (see `check_module`)."""

    LARGE_INPUTS = "large inputs"
    SLOW_REFERENCE = "slow reference"
    LARGE_OUTPUTS = "large outputs"

    def note(self, seed: int) -> str:
        """The record's note for a check scaled down for this reason."""
        size = f"{LARGE_MODULE_INPUT_BYTES >> 30} GiB"
        return {ScaledCheck.LARGE_INPUTS: f"inputs over {size}: checked on seed {seed} only, without the extra normal "
                                          "re-draw",
                ScaledCheck.SLOW_REFERENCE: f"the reference is slow (over {SLOW_MODULE_SEED_S:g} s of reference time "
                                            f"on seed {seed}): checked on seed {seed} only",
                ScaledCheck.LARGE_OUTPUTS: f"inputs and outputs over {size}: checked on seed {seed} only"}[self]


def _has_float64(value: Any) -> bool:
    return any(t.dtype == torch.float64 for t in iter_tensors(value))


class ReferenceModel:
    """`Model.forward` for the oracle: float64 inputs (the oracle's upcast run) go to a float64 copy of the model.
    `seconds` adds up the time its calls took (device work included): the reference's share of a check, which a
    candidate cannot inflate. `output_bytes`: the largest output of a native (not float64) call."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self._float64: torch.nn.Module | None = None
        self._native_float64 = any(t.dtype == torch.float64 for t in [*model.parameters(), *model.buffers()])
        self.seconds = 0.0
        self.output_bytes = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            if not self._native_float64 and _has_float64((args, kwargs)):
                if self._float64 is None:
                    self._float64 = copy.deepcopy(self.model).to(torch.float64)
                out = self._float64(*args, **kwargs)
            else:
                out = self.model(*args, **kwargs)
                self.output_bytes = max(self.output_bytes, tensor_bytes(out))
            if any(t.is_cuda for t in iter_tensors((args, kwargs))):
                torch.cuda.synchronize()
            return out
        finally:
            self.seconds += time.perf_counter() - started


def tensor_digest(module: torch.nn.Module) -> dict[str, str]:
    """A digest of the bytes of every parameter and buffer of `module` (name -> blake2b hex), to tell whether code
    that was handed the live instance (a module kernel's `ModelNew(original)`) wrote to them. Reads each tensor once
    (a device-to-host copy on a GPU)."""
    import hashlib

    found = {}
    for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
        data = tensor.detach()
        if data.layout != torch.strided or data.device.type == "meta":
            continue
        raw = data.contiguous().reshape(-1).view(torch.uint8) if data.numel() else data.reshape(-1)
        found[name] = hashlib.blake2b(raw.cpu().numpy().tobytes(), digest_size=16).hexdigest()
    return found


def changed_tensors(before: dict[str, str], module: torch.nn.Module) -> list[str]:
    """The names whose digest differs from `before` (`tensor_digest`)."""
    after = tensor_digest(module)
    return sorted(name for name in before.keys() | after.keys() if before.get(name) != after.get(name))


class WeightGuard:
    """What `restored_if_written` yields: `changed()` names the parameters and buffers written since it began."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self.before = tensor_digest(module)

    def changed(self) -> list[str]:
        return changed_tensors(self.before, self.module)


@contextmanager
def restored_if_written(module: torch.nn.Module, *, restore: bool = True) -> Iterator[WeightGuard]:
    """For the block, watch `module`'s parameters and buffers (`WeightGuard.changed`) and, with `restore`, copy them
    aside (to host memory) and write back any that code in the block changed (a generated module kernel handed the
    live instance): judging a candidate never leaves the user's model altered. What it wrote is still the
    candidate's verdict."""
    import logging

    tensors = dict([*module.named_parameters(), *module.named_buffers()])
    saved = ({name: t.detach().to("cpu", copy=True) for name, t in tensors.items() if t.layout == torch.strided}
             if restore else {})
    guard = WeightGuard(module)
    try:
        yield guard
    finally:
        written = guard.changed() if restore else []
        if written:
            logging.getLogger(__name__).warning("a candidate wrote to %s of %s; restored", ", ".join(written[:5]),
                                                type(module).__name__)
            with torch.no_grad():
                for name in written:
                    if name in saved and name in tensors:
                        tensors[name].copy_(saved[name])


class ModelCall:
    """A model's forward as a plain callable (the oracle and the benchmark call functions)."""

    def __init__(self, model: Callable[..., Any], *, trusted: bool = False) -> None:
        self.model = model
        self.allows_dispatch_poisoning = not trusted

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.model(*args, **kwargs)


@dataclass
class ModuleCheck:
    """Outcome of `check_module`: `errors` (empty = correct), the typed `outcome`, whether the candidate was built,
    the exception building it raised (`build_error`), why only the first seed ran (`scaled`), and the first seed's
    reference and inputs (for timing)."""

    errors: list[ValidationIssue]
    outcome: Outcome = Outcome.OK
    built: bool = True
    build_error: BaseException | None = None
    scaled: ScaledCheck | None = None
    reference: ReferenceModel | None = None
    inputs: list[Any] | None = None
    seeds_checked: int = 0

    @property
    def ok(self) -> bool:
        return not self.errors


def check_module(source: ModuleSource, build: Callable[[int], Callable[..., Any]], validate: Callable[..., Any],
                 device: torch.device | str, *, seeds: Sequence[int], dtype: torch.dtype | None = None,
                 keep_first: bool = False) -> ModuleCheck:
    """Check a candidate module with the oracle (`validate(reference, candidate, samples)`, a `KernelUtils.validate`)
    on every seed; stops at the first seed with errors. `build(seed)` returns the candidate's forward as a callable
    (built in this process for a trusted candidate, in the sandbox child otherwise); an exception it raises is the
    candidate's compile error. `HarnessError` (the reference failed) propagates.

    Per seed both `Model` and the candidate are built right after `torch.manual_seed(seed)`, and the oracle compares
    their forward passes on the file's `get_inputs()`, on a normal re-draw of them (`make_inputs(fresh=True)`) and on
    its own fresh draws. A problem whose inputs exceed `LARGE_MODULE_INPUT_BYTES` is checked on its first seed only,
    without the normal re-draw (at KernelBench's shipped sizes, 6-7.5 GB per input, three seeds of two samples held
    130 GB on an H200); so is one whose reference took longer than `SLOW_MODULE_SEED_S` on the first seed, or whose
    inputs and outputs together exceed that size (`63_conv_standard_2D` writes 8.5 GB from 1 GiB). `keep_first`
    keeps the first seed's reference and inputs for timing. Callers pass a `validate` that compares values, not
    strides (`KernelUtils(check_layout=False)`): a problem's output is the end of the computation, nothing reads it
    after."""
    target = torch.device(device)
    check = ModuleCheck([])
    for position, seed in enumerate(seeds):
        reference_model, inputs = source.instantiate(target, seed, dtype=dtype)
        large = tensor_bytes(inputs) > LARGE_MODULE_INPUT_BYTES
        try:
            candidate = build(seed)
        except Exception as exc:  # noqa: BLE001 - the candidate could not be built
            message = f"seed {seed}: building ModelNew raised {type(exc).__name__}: {exc}"
            issue = ValidationIssue(message, kind=Outcome.COMPILE_ERROR, exception_type=type(exc).__name__)
            return ModuleCheck([issue], Outcome.COMPILE_ERROR, built=False, build_error=exc, seeds_checked=position)
        reference = ReferenceModel(reference_model)
        samples = [Sample(tuple(inputs), {})]
        if not large:
            samples.append(Sample(tuple(source.make_inputs(seed, fresh=True, device=target, dtype=dtype)), {}))
        errors = validate(reference, candidate, samples)  # HarnessError: the harness failed
        del samples
        check.seeds_checked = position + 1
        if errors:
            issues = [issue_of(e) for e in errors]
            return ModuleCheck([e.derive(f"seed {seed}: {e}") for e in issues], outcome_of_issues(issues),
                               seeds_checked=position + 1)
        slow = reference.seconds > SLOW_MODULE_SEED_S
        large_outputs = tensor_bytes(inputs) + reference.output_bytes > LARGE_MODULE_INPUT_BYTES
        if keep_first and check.reference is None:
            check.reference, check.inputs = reference, list(inputs)
        del reference, candidate, reference_model, inputs
        if (large or slow or large_outputs) and position + 1 < len(seeds):
            check.scaled = (ScaledCheck.LARGE_INPUTS if large else ScaledCheck.SLOW_REFERENCE if slow
                            else ScaledCheck.LARGE_OUTPUTS)
            break
    return check
