"""Samples of real calls and the tensor specs that describe them.

A `Sample` is one call's `(args, kwargs)`. A `TensorSpec` describes one tensor argument (shape, dtype, device,
strides, storage offset and a value range) and can draw a fresh random tensor with the same layout: a view at the
spec's storage offset into a buffer just large enough for it. Signatures (`signature_of`) are the hashable keys
used for de-duplication and by the runtime's signature guard: they include shape, dtype, device and strides of
every tensor, and the exact value (and type) of every other argument.

Where a tensor starts in memory is part of its key too: `x[1:]` of a larger buffer has the shape and
strides of a fresh tensor, and a kernel validated only on fresh tensors read it from the wrong place (error
0.06-0.1). A tensor key therefore carries `storage_offset() != 0` and `data_ptr() % 16` (the address's residue
modulo 16 bytes: Triton specialises pointers on 16-byte divisibility and vectorised CUDA loads need 4/8/16-byte
alignment, so an address that is aligned differently from every validated one is a layout the kernel never ran
on). A spec's residue is `storage_offset * itemsize % 16`, which is what a drawn or cloned tensor has (PyTorch
allocates storage 64-byte aligned on the CPU, 512 on CUDA); a live tensor on a misaligned storage (a NumPy slice,
`frombuffer`) therefore matches no spec and runs PyTorch. The exact offset is not in the key, only whether there
is one: an honest kernel reads through `data_ptr()`, which includes any offset, so offsets 4096 and 8192 behave
alike, while offset 0 vs not catches a kernel that reads its input's storage from the start. Cost, measured on the
2-core CI machine under load (old and new `signature_of` in one process, interleaved, best of 60 x 5000 calls):
+0.25-0.31 us for relu's one tensor (1.15-1.37 us before), +0.65-0.98 us for layer_norm's three; the two reads
(`storage_offset()`, `data_ptr()`) cost ~70 and ~80 ns each. Deriving the residue from the offset alone (no
`data_ptr()`) cost +0.06-0.28 us but misses storages that start misaligned (NumPy slices, `frombuffer`).

`torch.Size` and `tuple` arguments have the same key (PyTorch accepts either wherever a size is expected, e.g.
`F.layer_norm(x, x.shape[-1:])`), and `map_values` keeps a `torch.Size` a `torch.Size`, so a captured call and its
clone describe the same call. Samples and specs convert to and from JSON-safe dicts for prompts and plans.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from forge.text import clip

__all__ = [
    "Sample",
    "TensorSpec",
    "Widening",
    "clone_tensor",
    "clone_value",
    "draw_sample",
    "iter_leaves",
    "iter_tensors",
    "sample_from_json",
    "sample_to_json",
    "signature_from_json",
    "signature_miss",
    "signature_of",
    "spec_sample",
    "value_from_json",
    "value_to_json",
]

_ABSENT = object()


class Sample(NamedTuple):
    """One real call of a function: positional and keyword arguments."""

    args: tuple
    kwargs: dict

    def signature(self) -> Hashable:
        """Hashable key of this call (see `signature_of`)."""
        return signature_of(self.args, self.kwargs)

    def clone(self, *, device: str | torch.device | None = None) -> Sample:
        """The same call on copies of its tensors (same layout; containers rebuilt), optionally on `device`."""
        return Sample(clone_value(tuple(self.args), device=device), clone_value(dict(self.kwargs), device=device))

    def describe(self) -> str:
        """Short human-readable form, e.g. `(bf16[2,4096] s(4096,1), weight=bf16[4096], eps=1e-06)`."""
        parts = [_describe_value(a) for a in self.args]
        parts += [f"{k}={_describe_value(v)}" for k, v in self.kwargs.items()]
        return "(" + ", ".join(parts) + ")"


_DTYPE_SHORT = {
    torch.float32: "f32",
    torch.float64: "f64",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.int16: "i16",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.bool: "bool",
}


def dtype_name(dtype: torch.dtype) -> str:
    """`torch.float32` -> `"float32"`."""
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    """`"float32"` -> `torch.float32`; a clear error for anything else."""
    value = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"unknown torch dtype {name!r}; expected a name such as 'float32' or 'bfloat16'")
    return value


def _is_contiguous(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    expected = 1
    for size, st in zip(reversed(shape), reversed(stride), strict=True):
        if size != 1 and st != expected:
            return False
        expected *= size
    return True


@dataclass(frozen=True)
class Widening:
    """A wider draw than the captured distribution: floating tensors are drawn with
    `max(spread * std, min_std)` around the captured mean, and a random `outlier_fraction` of elements is moved
    `outlier_scale` times further from the mean (large activations); values stay within
    `min(finfo.max / 64, sqrt(finfo.max))`, so their squares stay finite (fp16: |x| <= 255).

    Why: fresh inputs drawn with the captured mean and spread let degenerate kernels pass wherever the captured data
    is degenerate (an all-zero gelu on bf16 activations of spread 4e-3, a constant softmax on logits of spread
    1e-4). `min_std` = 1 makes logits non-flat and activations unit-sized whatever was captured; the outliers put
    several orders of magnitude into one reduction (what breaks low-precision accumulation). Integer and bool tensors
    are drawn as before (indices stay valid)."""

    spread: float = 4.0
    min_std: float = 1.0
    outlier_fraction: float = 1 / 64
    outlier_scale: float = 8.0

    def __post_init__(self) -> None:
        for name in ("spread", "min_std", "outlier_fraction", "outlier_scale"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"Widening.{name} must be a finite number >= 0, got {value!r}")
        if self.outlier_fraction > 1:
            raise ValueError(f"Widening.outlier_fraction must be <= 1, got {self.outlier_fraction}")


# Tensors above this many elements get their statistics in pieces of this size (measured: the one-shot float64 copy
# of the finite values was 3.25x a 7.5 GB input); smaller ones keep the one-shot path, whose digits prompts show.
_STATS_CHUNK = 1 << 26


def _chunked_mean_std(t: torch.Tensor) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation of the finite values of a large floating tensor, two passes in pieces."""
    flat = t.reshape(-1)
    count, total = 0, 0.0
    for piece in flat.split(_STATS_CHUNK):
        finite = piece[torch.isfinite(piece)].to(torch.float64)
        count += finite.numel()
        total += float(finite.sum())
    if count == 0:
        return None, None
    mean = total / count
    if count == 1:
        return mean, 0.0
    squares = 0.0
    for piece in flat.split(_STATS_CHUNK):
        finite = piece[torch.isfinite(piece)].to(torch.float64)
        squares += float((finite - mean).square_().sum())
    return mean, math.sqrt(squares / (count - 1))


@dataclass(frozen=True)
class TensorSpec:
    """Layout and value range of one tensor; `draw()` makes a fresh random tensor that matches it.

    `low`/`high` are the observed value range for integer and bool tensors (draws stay inside it, so indices
    stay valid); `mean`/`std` summarise floating tensors (draws are normal with those moments; a constant
    tensor draws with unit spread so a kernel that ignores the argument cannot pass by luck).
    """

    shape: tuple[int, ...]
    dtype: torch.dtype
    device: str = "cpu"
    stride: tuple[int, ...] | None = None
    storage_offset: int = 0
    low: float | None = None
    high: float | None = None
    mean: float | None = None
    std: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        if self.stride is None:
            stride, acc = [], 1
            for size in reversed(self.shape):
                stride.append(acc)
                acc *= max(size, 1)
            object.__setattr__(self, "stride", tuple(reversed(stride)))
        else:
            object.__setattr__(self, "stride", tuple(int(s) for s in self.stride))
        if len(self.stride) != len(self.shape):
            raise ValueError(f"stride {self.stride} does not match shape {self.shape}")
        object.__setattr__(self, "device", str(torch.device(self.device)))

    # -- construction -------------------------------------------------------------------------------------
    @classmethod
    def of(cls, tensor: torch.Tensor, *, with_stats: bool = True) -> TensorSpec:
        """Describe `tensor` (layout always; value statistics unless `with_stats=False`)."""
        low = high = mean = std = None
        if with_stats and tensor.numel() > 0 and tensor.layout == torch.strided:
            with torch.no_grad():
                t = tensor.detach()
                if t.dtype == torch.bool or not (t.is_floating_point() or t.is_complex()):
                    low, high = float(t.min().item()), float(t.max().item())
                elif t.is_floating_point() and t.numel() > _STATS_CHUNK:
                    mean, std = _chunked_mean_std(t)
                elif t.is_floating_point():
                    finite = t[torch.isfinite(t)].to(torch.float64)
                    if finite.numel() > 0:
                        mean = float(finite.mean().item())
                        std = float(finite.std().item()) if finite.numel() > 1 else 0.0
        return cls(
            shape=tuple(tensor.shape),
            dtype=tensor.dtype,
            device=str(tensor.device),
            stride=tuple(tensor.stride()),
            storage_offset=int(tensor.storage_offset()),
            low=low,
            high=high,
            mean=mean,
            std=std,
        )

    # -- properties ---------------------------------------------------------------------------------------
    @property
    def is_contiguous(self) -> bool:
        return _is_contiguous(self.shape, self.stride)

    @property
    def is_dense(self) -> bool:
        """Whether the elements fill their storage span exactly once, in some dim order: contiguous memory or a
        permutation (transpose) of it; not a slice with gaps, nor an expanded (overlapping) view."""
        expected = 1
        for st, s in sorted((st, s) for s, st in zip(self.shape, self.stride, strict=True) if s > 1):
            if st != expected:
                return False
            expected *= s
        return True

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=self.dtype).element_size()

    def storage_size(self) -> int:
        """Elements of storage needed to hold this view (offset included)."""
        if any(s == 0 for s in self.shape):
            return self.storage_offset
        return self.storage_offset + 1 + sum((s - 1) * st for s, st in zip(self.shape, self.stride, strict=True))

    @property
    def address_residue(self) -> int:
        """`data_ptr() % 16` of a tensor drawn or cloned from this spec (its storage starts 16-byte aligned)."""
        return (self.storage_offset * self.dtype.itemsize) % _ALIGNMENT

    def signature(self) -> tuple:
        """The hashable part of the spec used in call signatures (layout only, no statistics)."""
        return (
            _TENSOR_TAG, torch.Size(self.shape), self.stride, self.dtype, torch.device(self.device),
            self.storage_offset != 0, self.address_residue,
        )

    def describe(self) -> str:
        text = f"{_DTYPE_SHORT.get(self.dtype, dtype_name(self.dtype))}[{','.join(map(str, self.shape))}]"
        if not self.is_contiguous:
            text += f" stride=({','.join(map(str, self.stride))})"
        if self.storage_offset:
            text += f" offset={self.storage_offset}"
        if torch.device(self.device).type != "cpu":
            text += f" {self.device}"
        return text

    # -- drawing ------------------------------------------------------------------------------------------
    def draw(
        self,
        generator: torch.Generator | None = None,
        *,
        device: str | torch.device | None = None,
        widen: Widening | None = None,
    ) -> torch.Tensor:
        """A fresh random tensor with this spec's shape, dtype, strides and storage offset.

        Values are drawn with `generator` on the CPU, then moved to `device` (default: the spec's device); for a
        CUDA target they are drawn on the device itself, with a CUDA generator seeded from one draw of
        `generator` (as reproducible for a seed and device; CPU draws then copies of KernelBench's 1.6G-element
        inputs took about 10 s each and made a problem's validation run past 4 minutes on an H200). `widen`: draw
        floating values wider than the captured distribution (see `Widening`).
        """
        target = torch.device(device if device is not None else self.device)
        size = max(self.storage_size(), 1)
        on = "cpu"
        if target.type == "cuda" and (generator is None or generator.device.type != "cuda"):
            seed = int(torch.randint(0, 2**62, (1,), generator=generator).item())
            generator, on = torch.Generator(device=target).manual_seed(seed), target
        elif generator is not None:
            on = generator.device
        if self.dtype == torch.bool:
            lo, hi = int(self.low if self.low is not None else 0), int(self.high if self.high is not None else 1)
            flat = torch.randint(lo, hi + 1, (size,), generator=generator, device=on).to(torch.bool)
        elif self.dtype.is_floating_point:
            mean = self.mean if self.mean is not None and math.isfinite(self.mean) else 0.0
            std = self.std if self.std is not None and math.isfinite(self.std) and self.std > 1e-12 else 1.0
            if widen is None:
                flat = (torch.randn((size,), generator=generator, dtype=torch.float32, device=on) * std
                        + mean).to(self.dtype)
            else:
                flat = _wide_values(size, mean, std, self.dtype, widen, generator, on)
        elif self.dtype.is_complex:
            flat = torch.randn((size,), generator=generator, dtype=self.dtype, device=on)
        else:
            info = torch.iinfo(self.dtype)
            lo = int(self.low) if self.low is not None else max(info.min, -100)
            hi = int(self.high) if self.high is not None else min(info.max, 100)
            flat = torch.randint(lo, hi + 1, (size,), generator=generator, dtype=torch.int64, device=on).to(self.dtype)
        flat = flat.to(target)
        return flat.as_strided(self.shape, self.stride, self.storage_offset)

    # -- JSON ---------------------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "shape": list(self.shape),
            "dtype": dtype_name(self.dtype),
            "device": self.device,
            "stride": list(self.stride),
        }
        if self.storage_offset:
            data["storage_offset"] = self.storage_offset
        for name in ("low", "high", "mean", "std"):
            value = getattr(self, name)
            if value is not None and math.isfinite(value):
                data[name] = value
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TensorSpec:
        try:
            return cls(
                shape=tuple(data["shape"]),
                dtype=dtype_from_name(data["dtype"]),
                device=data.get("device", "cpu"),
                stride=tuple(data["stride"]) if data.get("stride") is not None else None,
                storage_offset=_offset_from_json(data.get("storage_offset", 0)),
                low=data.get("low"),
                high=data.get("high"),
                mean=data.get("mean"),
                std=data.get("std"),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"invalid tensor spec {data!r}: {exc}") from exc


def _offset_from_json(value: Any) -> int:
    """A serialised storage offset: a non-negative integer (plans written before offsets were recorded have none)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"storage_offset must be a non-negative integer, got {value!r}")
    return value


# ---------------------------------------------------------------------------------------------------------
# Signatures
# ---------------------------------------------------------------------------------------------------------
_TENSOR_TAG = "T"
_ALIGNMENT = 16  # bytes; see the module docstring


_Tensor = torch.Tensor
_Size = torch.Size
_SCALAR_TYPES = (int, float, bool, str, type(None))


def _value_key(value: Any) -> Hashable:
    # Hot path of the runtime's signature guard: keep the common cases first and cheap.
    if isinstance(value, _Tensor):
        try:
            return (
                _TENSOR_TAG, value.shape, value.stride(), value.dtype, value.device,
                value.storage_offset() != 0, value.data_ptr() & 15,  # 15 == _ALIGNMENT - 1
            )
        except RuntimeError:  # no data pointer (a functional or fake tensor on some torch versions)
            return _pointerless_tensor_key(value)
    if type(value) in _SCALAR_TYPES and value == value:  # NaN falls through to the tagged form below
        return (type(value), value)
    if isinstance(value, TensorSpec):
        return value.signature()
    if isinstance(value, (tuple, list)):
        kind = type(value)
        return ("tuple" if kind is _Size else kind.__name__, tuple(_value_key(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((k, _value_key(v)) for k, v in value.items()))
    if isinstance(value, float) and math.isnan(value):
        return (float, "nan")
    try:
        hash(value)
    except TypeError:
        return (type(value).__name__, repr(value))
    # Type-tag scalars so that 1, 1.0 and True are different signatures.
    return (type(value), value)


def _pointerless_tensor_key(value: torch.Tensor) -> Hashable:
    """Key of a tensor whose address cannot be read: its residue is None, which no validated signature has."""
    return (_TENSOR_TAG, value.shape, value.stride(), value.dtype, value.device, value.storage_offset() != 0, None)


def signature_of(args: tuple, kwargs: dict) -> Hashable:
    """Hashable key of a call: tensors by (shape, strides, dtype, device, offset != 0, address % 16), other values
    by type and value (`torch.Size` as a tuple).

    Keyword order does not matter; positional vs keyword spelling of the same argument does (the runtime
    guard then falls back, which is safe).
    """
    key = _value_key
    return (
        tuple([key(a) for a in args]),
        tuple(sorted([(k, key(v)) for k, v in kwargs.items()])) if kwargs else (),
    )


def signature_miss(validated: Iterable[Hashable], called: Hashable) -> str:
    """Why a call's `signature_of` key is not among the `validated` ones, in words: the arguments in which it differs
    from the nearest validated signature (the one differing in the fewest), e.g. "keyword position_embeddings:
    validated ('tuple', ...), called ('list', ...)". For the log of a plan entry that never served."""
    def arguments(key: Hashable) -> dict[str, Any]:
        positional, keywords = key  # type: ignore[misc]
        return {**{f"argument {i}": v for i, v in enumerate(positional)}, **{f"keyword {k}": v for k, v in keywords}}

    try:
        here = arguments(called)
    except (TypeError, ValueError):
        return "the call's signature could not be read"
    best: list[str] | None = None
    for key in validated:
        there = arguments(key)
        differs = [name for name in sorted(set(here) | set(there))
                   if here.get(name, _ABSENT) != there.get(name, _ABSENT)]
        if best is None or len(differs) < len(best):
            best, nearest = differs, there
    if best is None:
        return "no signature was validated"
    if not best:
        return "the signature is a validated one (the call was refused for another reason: a tensor needing grad "\
               "or a tensor subclass)"
    return "; ".join(f"{name}: validated {clip(str(nearest.get(name, 'absent')), 160)}, called "
                     f"{clip(str(here.get(name, 'absent')), 160)}" for name in best[:3])


def iter_leaves(value: Any) -> Iterator[Any]:
    """Every leaf (anything that is not a tuple, list or dict) inside nested tuples, lists and dicts."""
    if isinstance(value, (tuple, list)):
        for v in value:
            yield from iter_leaves(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from iter_leaves(v)
    else:
        yield value


def iter_tensors(value: Any) -> Iterator[torch.Tensor]:
    """Every tensor leaf inside nested tuples, lists and dicts."""
    return (leaf for leaf in iter_leaves(value) if isinstance(leaf, torch.Tensor))


def map_values(value: Any, fn: Callable[[Any], Any]) -> Any:
    """Apply `fn` to every leaf of nested tuples, lists and dicts, keeping the structure and the container types
    (a `torch.Size` stays a `torch.Size`; namedtuples are leaves)."""
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        items = [map_values(v, fn) for v in value]
        return tuple(items) if type(value) is tuple else _same_tuple_type(value, items)
    if isinstance(value, list):
        return [map_values(v, fn) for v in value]
    if isinstance(value, dict):
        return {k: map_values(v, fn) for k, v in value.items()}
    return fn(value)


def _same_tuple_type(value: tuple, items: list) -> tuple:
    """`items` in `value`'s tuple subclass (`torch.Size`, a structseq), or a plain tuple when it cannot be rebuilt."""
    try:
        return type(value)(items)
    except (TypeError, ValueError):
        return tuple(items)


# ---------------------------------------------------------------------------------------------------------
# Cloning and drawing
# ---------------------------------------------------------------------------------------------------------
def clone_tensor(tensor: torch.Tensor, *, device: str | torch.device | None = None) -> torch.Tensor:
    """A detached copy with the same shape, strides and storage offset (also for views and expanded tensors)."""
    src = tensor.detach()
    target = torch.device(device) if device is not None else src.device
    if src.layout != torch.strided:
        return src.clone().to(target)
    spec = TensorSpec.of(src, with_stats=False)
    size = max(spec.storage_size(), 1)
    storage = torch.empty(size, dtype=src.dtype, device=target)
    out = storage.as_strided(spec.shape, spec.stride, spec.storage_offset)
    if src.numel():
        # Expanded (overlapping) tensors cannot be written elementwise: copy the distinct elements only.
        if _is_non_overlapping(spec):
            out.copy_(src)
        else:
            unique = _dense_source(src, spec)
            storage[spec.storage_offset : spec.storage_offset + unique.numel()].copy_(unique)
    return out


def _is_non_overlapping(spec: TensorSpec) -> bool:
    dims = sorted((st, s) for s, st in zip(spec.shape, spec.stride, strict=True) if s > 1)
    reach = 1
    for st, s in dims:
        if st < reach:
            return False
        reach = st * s
    return True


def _dense_source(src: torch.Tensor, spec: TensorSpec) -> torch.Tensor:
    """The storage elements an overlapping view reads, read back through the original view's storage."""
    n = spec.storage_size() - spec.storage_offset
    return src.as_strided((n,), (1,), src.storage_offset()).clone()


def clone_value(value: Any, *, device: str | torch.device | None = None) -> Any:
    """Deep copy of nested call arguments; tensors keep their layout (see `clone_tensor`)."""
    return map_values(value, lambda v: clone_tensor(v, device=device) if isinstance(v, torch.Tensor) else v)


def spec_sample(sample: Sample, *, with_stats: bool = True) -> Sample:
    """The same call with every tensor replaced by its `TensorSpec`."""
    fn = lambda v: TensorSpec.of(v, with_stats=with_stats) if isinstance(v, torch.Tensor) else v  # noqa: E731
    return Sample(map_values(tuple(sample.args), fn), map_values(dict(sample.kwargs), fn))


def draw_sample(
    sample: Sample, generator: torch.Generator | None = None, *, device: Any = None, widen: Widening | None = None
) -> Sample:
    """A fresh call with every tensor (or `TensorSpec`) replaced by a random tensor of the same spec (drawn wider
    than the captured values with `widen`, see `Widening`)."""

    def fn(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return TensorSpec.of(value).draw(generator, device=device, widen=widen)
        if isinstance(value, TensorSpec):
            return value.draw(generator, device=device, widen=widen)
        return value

    return Sample(map_values(tuple(sample.args), fn), map_values(dict(sample.kwargs), fn))


def _wide_values(
    size: int, mean: float, std: float, dtype: torch.dtype, widen: Widening, generator: torch.Generator | None,
    device: Any = "cpu",
) -> torch.Tensor:
    """`size` floating values drawn per `widen` (see `Widening`) on `device`, in float64 then cast to `dtype`."""
    wide_std = max(std * widen.spread, widen.min_std)
    deviation = torch.randn((size,), generator=generator, dtype=torch.float64, device=device) * wide_std
    if widen.outlier_fraction > 0 and widen.outlier_scale != 1:
        outliers = torch.rand((size,), generator=generator, dtype=torch.float64, device=device) < widen.outlier_fraction
        deviation = torch.where(outliers, deviation * widen.outlier_scale, deviation)
    largest = float(torch.finfo(dtype).max)
    limit = min(largest / 64, math.sqrt(largest))  # squares stay finite (fp16: |x| <= 255)
    return (deviation + mean).clamp(-limit, limit).to(dtype)


# ---------------------------------------------------------------------------------------------------------
# JSON
# ---------------------------------------------------------------------------------------------------------
def value_to_json(value: Any) -> Any:
    """JSON-safe form of one argument value; tensors become their spec (`{"tensor": {...}}`)."""
    if isinstance(value, torch.Tensor):
        return {"tensor": TensorSpec.of(value).to_json()}
    if isinstance(value, TensorSpec):
        return {"tensor": value.to_json()}
    if isinstance(value, torch.dtype):
        return {"dtype": dtype_name(value)}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, torch.Size):
        return {"size": list(value)}
    if isinstance(value, tuple):
        return {"tuple": [value_to_json(v) for v in value]}
    if isinstance(value, list):
        return [value_to_json(v) for v in value]
    if isinstance(value, dict):
        return {"dict": {str(k): value_to_json(v) for k, v in value.items()}}
    if isinstance(value, float) and not math.isfinite(value):
        return {"float": repr(value)}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"cannot serialise argument of type {type(value).__name__}: {value!r}")


def value_from_json(data: Any) -> Any:
    """Inverse of `value_to_json`; tensors come back as `TensorSpec`s."""
    if isinstance(data, list):
        return [value_from_json(v) for v in data]
    if isinstance(data, dict):
        if len(data) != 1:
            raise ValueError(f"invalid serialised argument {data!r}")
        (tag, payload), = data.items()
        if tag == "tensor":
            return TensorSpec.from_json(payload)
        if tag == "dtype":
            return dtype_from_name(payload)
        if tag == "device":
            return torch.device(payload)
        if tag == "size":
            return torch.Size(payload)
        if tag == "tuple":
            return tuple(value_from_json(v) for v in payload)
        if tag == "dict":
            return {k: value_from_json(v) for k, v in payload.items()}
        if tag == "float":
            return float(payload)
        raise ValueError(f"unknown serialised argument tag {tag!r}")
    return data


def sample_to_json(sample: Sample) -> dict[str, Any]:
    """`{"args": [...], "kwargs": {...}}` with tensors as specs."""
    return {
        "args": [value_to_json(a) for a in sample.args],
        "kwargs": {k: value_to_json(v) for k, v in sample.kwargs.items()},
    }


def sample_from_json(data: dict[str, Any]) -> Sample:
    """Inverse of `sample_to_json`: a `Sample` whose tensors are `TensorSpec`s (use `draw_sample` for tensors)."""
    try:
        args, kwargs = data["args"], data.get("kwargs", {})
    except (KeyError, TypeError) as exc:
        raise ValueError(f"invalid serialised sample {data!r}: expected keys 'args' and 'kwargs'") from exc
    return Sample(tuple(value_from_json(a) for a in args), {k: value_from_json(v) for k, v in kwargs.items()})


def signature_from_json(data: dict[str, Any]) -> Hashable:
    """The call signature of a serialised sample (equal to `signature_of` of the live call it came from)."""
    sample = sample_from_json(data)
    return signature_of(sample.args, sample.kwargs)


def _describe_value(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return TensorSpec.of(value, with_stats=False).describe()
    if isinstance(value, TensorSpec):
        return value.describe()
    if isinstance(value, (tuple, list)):
        inner = ", ".join(_describe_value(v) for v in value)
        if isinstance(value, tuple):
            return f"({inner},)" if len(value) == 1 else f"({inner})"
        return f"[{inner}]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_describe_value(v)}" for k, v in value.items()) + "}"
    return repr(value)


@dataclass
class SampleCounter:
    """Unique samples of one function in first-seen order, with how often each signature was called."""

    samples: dict[Hashable, Sample] = field(default_factory=dict)
    counts: dict[Hashable, int] = field(default_factory=dict)

    def add(self, args: tuple, kwargs: dict, *, clone: bool = True) -> Hashable:
        key = signature_of(args, kwargs)
        if key in self.counts:
            self.counts[key] += 1
        else:
            self.counts[key] = 1
            self.samples[key] = Sample(clone_value(tuple(args)), clone_value(dict(kwargs))) if clone else Sample(
                tuple(args), dict(kwargs)
            )
        return key

    def items(self) -> list[tuple[int, Sample]]:
        return [(self.counts[k], s) for k, s in self.samples.items()]
