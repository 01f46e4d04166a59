"""What a correct candidate must produce for one call, computed from the reference and sealed while candidates run.

`build_expectation` runs the reference twice on clones of the inputs: eagerly in the native dtypes, and on
float64-upcast copies of the floating inputs. From that it keeps, per tensor leaf of the output (and per input
the eager call mutated): the float64 reference, the per-element allowance (see `forge.checking.tolerance`) and
the NaN/inf placement of eager output; integer and bool leaves keep the eager values (exact match). It also keeps
the output structure, which inputs eager mutated and which outputs alias a mutated input.

The numbers are sealed into a bytes blob (`Expectation.seal`) and all reference tensors are released before the
candidate runs, so a candidate cannot find the expected output among live tensors (e.g. via `gc`); `unseal`
brings them back for the comparison.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from forge.checking.compare import (
    FINITE,
    ContainerNode,
    Skeleton,
    TensorMeta,
    ValueLeaf,
    as_real,
    bits_equal,
    iter_tensor_leaves,
    skeleton_of,
    special_codes,
    tensor_leaves_of_skeleton,
)
from forge.checking.tolerance import allowed_error
from forge.samples import Sample, clone_value, map_values

__all__ = [
    "Expectation",
    "LeafKind",
    "ReferenceFailure",
    "build_expectation",
    "call_quietly",
    "input_leaves",
    "storage_ptr",
    "synchronize_devices",
]

logger = logging.getLogger(__name__)

# Seal in memory only up to this size; bigger expectations stay as live tensors (copying GBs off the GPU per
# case would dominate validation time).
_SEAL_LIMIT_BYTES = 512 << 20


class ReferenceFailure(Exception):
    """The reference function raised on this input (the input is invalid for the function)."""


class LeafKind:
    FLOAT = "float"
    EXACT = "exact"


def input_leaves(sample: Sample) -> list[tuple[str, torch.Tensor]]:
    """`(locator, tensor)` for every tensor argument: `args[0]`, `kwargs["weight"]`, `args[1][0]`..."""
    leaves = list(iter_tensor_leaves(tuple(sample.args), "args"))
    leaves += list(iter_tensor_leaves(dict(sample.kwargs), "kwargs"))
    return leaves


def call_quietly(fn: Callable[..., Any], sample: Sample) -> Any:
    """`fn(*args, **kwargs)` under `torch.no_grad()`."""
    with torch.no_grad():
        return fn(*sample.args, **sample.kwargs)


def _upcast(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.detach().to(torch.float64)
    if isinstance(value, torch.Tensor) and value.is_complex():
        return value.detach().to(torch.complex128)
    return value


def _same_shapes(a: Skeleton, b: Skeleton) -> bool:
    """Same container structure and tensor shapes (dtypes may differ: that is the point of the upcast run)."""
    if isinstance(a, TensorMeta):
        return isinstance(b, TensorMeta) and a.shape == b.shape and a.device == b.device
    if isinstance(a, ContainerNode):
        if not isinstance(b, ContainerNode) or type(a.children) is not type(b.children):
            return False
        if isinstance(a.children, dict):
            return list(a.children) == list(b.children) and all(
                _same_shapes(a.children[k], b.children[k]) for k in a.children
            )
        return len(a.children) == len(b.children) and all(
            _same_shapes(x, y) for x, y in zip(a.children, b.children, strict=True)
        )
    return isinstance(b, ValueLeaf)


@dataclass
class Expectation:
    """The sealed expectation for one call (see the module docstring)."""

    skeleton: Skeleton
    leaf_kinds: dict[str, str]
    mutated_inputs: list[str]
    aliases: dict[str, str]
    float64_reference: bool
    _tensors: dict[str, torch.Tensor] | None = field(default=None, repr=False)
    _sealed: bytes | None = field(default=None, repr=False)
    _devices: dict[str, str] = field(default_factory=dict, repr=False)

    def output_metas(self) -> list[tuple[str, TensorMeta]]:
        return list(tensor_leaves_of_skeleton(self.skeleton, "output"))

    def seal(self) -> None:
        """Move the expected numbers into a bytes blob and drop the tensors (no-op for very large ones)."""
        if self._tensors is None:
            return
        nbytes = sum(t.numel() * t.element_size() for t in self._tensors.values())
        if nbytes > _SEAL_LIMIT_BYTES:
            logger.debug("expectation of %d bytes kept live (over the sealing limit)", nbytes)
            return
        self._devices = {k: str(t.device) for k, t in self._tensors.items()}
        buffer = io.BytesIO()
        torch.save({k: t.cpu() for k, t in self._tensors.items()}, buffer)
        self._sealed = buffer.getvalue()
        self._tensors = None

    def unseal(self) -> dict[str, torch.Tensor]:
        """The expected tensors (`<locator>/reference`, `/allowed`, `/special`, `/exact`), on their devices."""
        if self._tensors is not None:
            return self._tensors
        assert self._sealed is not None
        loaded = torch.load(io.BytesIO(self._sealed), weights_only=True)
        return {k: t.to(self._devices[k]) for k, t in loaded.items()}


def _leaf_expectation(
    locator: str,
    eager: torch.Tensor,
    reference: torch.Tensor | None,
    tolerances: Mapping[torch.dtype, tuple[float, float]],
    error_factor: float,
    out: dict[str, torch.Tensor],
) -> str:
    """Store the expected numbers of one leaf in `out`; return its kind."""
    if not (eager.is_floating_point() or eager.is_complex()):
        out[f"{locator}/exact"] = eager.detach().clone()
        return LeafKind.EXACT
    eager64 = as_real(eager.detach()).to(torch.float64)
    special = special_codes(eager64)
    finite = special == FINITE
    zero = torch.zeros((), dtype=torch.float64, device=eager64.device)
    usable = reference is not None and reference.shape == eager.shape and (
        reference.is_floating_point() or reference.is_complex()
    )
    if usable:
        ref64 = as_real(reference.detach()).to(torch.float64)
        good = finite & torch.isfinite(ref64)
        # Where the float64 run is not finite but eager is, eager output stands in (with no error of its own).
        expected = torch.where(good, ref64, torch.where(finite, eager64, zero))
        eager_error = torch.where(good, (eager64 - ref64).abs(), zero)
        allowed = allowed_error(expected, eager_error, eager.dtype, tolerances, error_factor)
    else:
        expected = torch.where(finite, eager64, zero)
        allowed = allowed_error(expected, None, eager.dtype, tolerances, error_factor)
    out[f"{locator}/reference"] = expected
    out[f"{locator}/allowed"] = allowed
    out[f"{locator}/special"] = special
    return LeafKind.FLOAT


def build_expectation(
    reference_fn: Callable[..., Any],
    sample: Sample,
    tolerances: Mapping[torch.dtype, tuple[float, float]],
    error_factor: float,
) -> Expectation:
    """Run the reference on clones of `sample` (native and float64) and return the sealed expectation.

    Raises `ReferenceFailure` when the reference raises on the native-dtype inputs.
    """
    eager_sample = Sample(clone_value(tuple(sample.args)), clone_value(dict(sample.kwargs)))
    try:
        eager_out = call_quietly(reference_fn, eager_sample)
        synchronize_devices(eager_out)
    except Exception as exc:  # noqa: BLE001 - any reference failure means "not a valid input"
        raise ReferenceFailure(f"{type(exc).__name__}: {exc}") from exc

    before = input_leaves(sample)
    after = input_leaves(eager_sample)
    mutated = [loc for (loc, b), (_, a) in zip(before, after, strict=True) if not bits_equal(b, a)]

    f64_sample = Sample(
        map_values(clone_value(tuple(sample.args)), _upcast), map_values(clone_value(dict(sample.kwargs)), _upcast)
    )
    f64_out: Any = None
    float64_reference = True
    try:
        f64_out = call_quietly(reference_fn, f64_sample)
        if not _same_shapes(skeleton_of(eager_out), skeleton_of(f64_out)):
            raise ValueError("the float64 run returned a differently shaped output")
    except Exception as exc:  # noqa: BLE001 - fall back to eager output as the reference
        logger.debug("float64 reference unavailable (%s: %s); using eager output", type(exc).__name__, exc)
        f64_out, float64_reference = None, False

    tensors: dict[str, torch.Tensor] = {}
    kinds: dict[str, str] = {}
    f64_leaves = dict(iter_tensor_leaves(f64_out, "output")) if float64_reference else {}
    for locator, eager_leaf in iter_tensor_leaves(eager_out, "output"):
        kinds[locator] = _leaf_expectation(
            locator, eager_leaf, f64_leaves.get(locator), tolerances, error_factor, tensors
        )
    f64_inputs = dict(input_leaves(f64_sample)) if float64_reference else {}
    eager_inputs = dict(after)
    for locator in mutated:
        kinds[locator] = _leaf_expectation(
            locator, eager_inputs[locator], f64_inputs.get(locator), tolerances, error_factor, tensors
        )

    aliases: dict[str, str] = {}
    storage_of_mutated = {storage_ptr(eager_inputs[loc]): loc for loc in mutated}
    storage_of_mutated.pop(0, None)  # empty storages share address 0
    for locator, eager_leaf in iter_tensor_leaves(eager_out, "output"):
        owner = storage_of_mutated.get(storage_ptr(eager_leaf))
        if owner is not None:
            aliases[locator] = owner

    expectation = Expectation(
        skeleton=skeleton_of(eager_out),
        leaf_kinds=kinds,
        mutated_inputs=mutated,
        aliases=aliases,
        float64_reference=float64_reference,
        _tensors=tensors,
    )
    expectation.seal()
    return expectation


def storage_ptr(tensor: torch.Tensor) -> int:
    """Address of the storage behind `tensor` (0 when it has none)."""
    try:
        return int(tensor.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError, TypeError):
        return 0


def synchronize_devices(*values: Any) -> None:
    """Wait for every CUDA device holding a tensor in `values` (so asynchronous errors surface here)."""
    devices = {t.device for value in values for _, t in iter_tensor_leaves(value, "") if t.device.type == "cuda"}
    for device in devices:
        torch.cuda.synchronize(device)
