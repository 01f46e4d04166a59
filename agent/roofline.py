"""Roofline floors for one function's sampled calls on one device: the fastest any kernel could possibly be.

For each call, bytes moved = tensor inputs read + outputs written (outputs found by running the original function
on `meta` tensors, which costs no memory or compute), and FLOPs from a formula per op family (matmul-like:
linear, bilinear, convolutions, attention; everything else a few FLOPs per element). The floor is the larger of
bytes / copy bandwidth and FLOPs / peak rate, using a table of device ceilings keyed by device-name substring.
The ceilings are approximate (only the H200 copy bandwidth is measured, see h200_anchor_ops.md); use them to say
"how far from the hardware limit", never as a pass/fail threshold.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from forge.functional import original_function
from forge.samples import Sample, TensorSpec, iter_tensors, map_values

__all__ = [
    "DeviceCeilings",
    "RooflineEstimate",
    "SampleRoofline",
    "ceilings_for",
    "device_description",
    "estimate",
    "meta_outputs",
    "samples_device",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeviceCeilings:
    """Peak rates of one device kind. `copy_bandwidth` counts bytes read + written per second."""

    name: str
    copy_bandwidth: float  # bytes/s, read + write (what a device-to-device copy achieves)
    tensor_tflops: float  # dense bf16/fp16 tensor-core rate, fp32 accumulate
    fp32_tflops: float  # IEEE fp32 on CUDA cores (TF32 is not allowed for fp32)
    fp64_tflops: float
    approximate: bool = True
    note: str = ""

    def describe(self) -> str:
        mark = "approximate " if self.approximate else ""
        return (
            f"{self.name}: {mark}ceilings {self.copy_bandwidth / 1e12:.2f} TB/s copy (read+write), "
            f"{self.tensor_tflops:g} TFLOP/s bf16/fp16 tensor cores, {self.fp32_tflops:g} TFLOP/s fp32"
            + (f" ({self.note})" if self.note else "")
        )


_SPEC_NOTE = "~90% of spec HBM bandwidth, ~80% of dense spec tensor-core peak"
# (substrings that must all occur in the lower-cased device name, ceilings); the first match wins.
_CEILINGS: list[tuple[tuple[str, ...], DeviceCeilings]] = [
    (("h200",), DeviceCeilings(
        "H200", 4.2e12, 790.0, 60.0, 30.0,
        note="copy bandwidth measured (4.22 TB/s); FLOP rates ~80% of dense spec (989 bf16, 67 fp32)")),
    (("h100", "pcie"), DeviceCeilings("H100 PCIe", 1.8e12, 600.0, 45.0, 22.0, note=_SPEC_NOTE)),
    (("h100", "nvl"), DeviceCeilings("H100 NVL", 3.5e12, 670.0, 55.0, 27.0, note=_SPEC_NOTE)),
    (("h100",), DeviceCeilings("H100 SXM", 3.0e12, 790.0, 60.0, 30.0, note=_SPEC_NOTE)),
    (("h800",), DeviceCeilings("H800", 3.0e12, 790.0, 60.0, 1.0, note=_SPEC_NOTE)),
    (("b200",), DeviceCeilings("B200", 7.2e12, 1800.0, 65.0, 30.0, note=_SPEC_NOTE)),
    (("a100", "80gb"), DeviceCeilings("A100 80GB", 1.8e12, 250.0, 18.0, 9.0, note=_SPEC_NOTE)),
    (("a100",), DeviceCeilings("A100 40GB", 1.4e12, 250.0, 18.0, 9.0, note=_SPEC_NOTE)),
    (("l40s",), DeviceCeilings("L40S", 0.78e12, 290.0, 80.0, 1.2, note=_SPEC_NOTE)),
    (("l40",), DeviceCeilings("L40", 0.78e12, 145.0, 80.0, 1.2, note=_SPEC_NOTE)),
    (("l4",), DeviceCeilings("L4", 0.27e12, 97.0, 27.0, 0.4, note=_SPEC_NOTE)),
    (("a10g",), DeviceCeilings("A10G", 0.54e12, 56.0, 28.0, 0.5, note=_SPEC_NOTE)),
    (("a10",), DeviceCeilings("A10", 0.54e12, 100.0, 28.0, 0.5, note=_SPEC_NOTE)),
    (("4090",), DeviceCeilings("RTX 4090", 0.9e12, 132.0, 74.0, 1.2, note=_SPEC_NOTE)),
    (("mi300",), DeviceCeilings("MI300X", 4.7e12, 1000.0, 130.0, 65.0, note=_SPEC_NOTE)),
    (("cpu",), DeviceCeilings(
        "CPU", 20e9, 0.1, 0.1, 0.05, note="rough figures for a CPU running the Triton interpreter")),
]
_GENERIC_GPU = DeviceCeilings("generic GPU", 1.0e12, 100.0, 15.0, 1.0, note="rough generic figures, device unknown")

# FLOPs per output element for non-matmul ops (approximate: the floor of these ops is almost always memory).
_FLOPS_PER_ELEMENT: dict[str, float] = {
    "relu": 1, "relu_": 1, "relu6": 2, "hardtanh": 2, "hardtanh_": 2, "threshold": 1, "threshold_": 1,
    "leaky_relu": 2, "leaky_relu_": 2, "dropout": 1, "pad": 0, "embedding": 0, "one_hot": 1,
    "pixel_shuffle": 0, "pixel_unshuffle": 0, "channel_shuffle": 0, "native_channel_shuffle": 0,
    "sigmoid": 4, "tanh": 4, "silu": 5, "gelu": 10, "elu": 5, "selu": 6, "celu": 5, "softplus": 6, "mish": 10,
    "hardswish": 4, "hardsigmoid": 3, "logsigmoid": 6, "softsign": 3, "tanhshrink": 5,
    "softmax": 6, "log_softmax": 6, "softmin": 7, "layer_norm": 8, "rms_norm": 6, "group_norm": 8,
    "batch_norm": 5, "instance_norm": 8, "normalize": 5, "cross_entropy": 6, "nll_loss": 1, "mse_loss": 3,
}
_DEFAULT_FLOPS_PER_ELEMENT = 4.0
_MATMUL_LIKE = {"linear", "bilinear", "scaled_dot_product_attention", "conv1d", "conv2d", "conv3d",
                "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "mm", "bmm", "matmul"}


def ceilings_for(device_name: str | None) -> DeviceCeilings:
    """Ceilings for a device name such as `"NVIDIA H200"` (substring match), a generic GPU otherwise."""
    lowered = (device_name or "").lower()
    for keys, ceilings in _CEILINGS:
        if all(k in lowered for k in keys):
            return ceilings
    return _GENERIC_GPU


def device_description(device: str | torch.device | None) -> tuple[str, tuple[int, int] | None]:
    """(device name, compute capability) of a torch device: CUDA via torch.cuda, anything else the interpreter."""
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type == "cuda" and torch.cuda.is_available():
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(index)
        return torch.cuda.get_device_name(index), (int(major), int(minor))
    if dev.type == "cuda":
        return "CUDA device (unavailable here)", None
    return "CPU (Triton interpreter)", None


@dataclass(frozen=True)
class SampleRoofline:
    """The floor of one call: bytes, FLOPs, the time each needs at peak rate, and the larger one."""

    description: str
    bytes_moved: int
    flops: int
    memory_ms: float
    compute_ms: float
    outputs: tuple[tuple[tuple[int, ...], torch.dtype], ...]
    output_source: str  # "meta" (ran the original on meta tensors) or "assumed: <why>"

    @property
    def floor_ms(self) -> float:
        return max(self.memory_ms, self.compute_ms)

    @property
    def bound(self) -> str:
        return "memory" if self.memory_ms >= self.compute_ms else "compute"


@dataclass(frozen=True)
class RooflineEstimate:
    """Floor for one pass over the samples (each distinct call once): totals and per-call rows."""

    function: str
    bytes_moved: int
    flops: int
    floor_ms: float  # sum of the per-call floors
    memory_ms: float
    compute_ms: float
    bound: str  # "memory" or "compute": which limit dominates the total floor
    ceilings: DeviceCeilings
    per_sample: tuple[SampleRoofline, ...] = ()

    @property
    def calls(self) -> int:
        return len(self.per_sample)

    def describe(self) -> str:
        return (
            f"{self.bound}-bound floor {self.floor_ms * 1e3:.3g} us for {self.calls} call(s): "
            f"{self.bytes_moved / 1e6:.3g} MB moved, {self.flops / 1e9:.3g} GFLOP, on {self.ceilings.describe()}"
        )


# ---------------------------------------------------------------------------------------------------------
def _as_samples(samples: Iterable[Any]) -> list[Sample]:
    out = []
    for item in samples:
        if isinstance(item, Sample):
            out.append(item)
        elif hasattr(item, "sample") and isinstance(item.sample, Sample):
            out.append(item.sample)
        elif isinstance(item, tuple) and len(item) >= 2 and isinstance(item[1], Sample):
            out.append(item[1])
        else:
            raise TypeError(
                f"expected a Sample or a (count, Sample) pair, got {type(item).__name__}; build samples with "
                "forge.samples.Sample(args, kwargs)"
            )
    return out


def _layout(value: Any) -> tuple[tuple[int, ...], tuple[int, ...], torch.dtype] | None:
    if isinstance(value, torch.Tensor):
        return tuple(value.shape), tuple(value.stride()), value.dtype
    if isinstance(value, TensorSpec):
        return value.shape, value.stride, value.dtype
    return None


def _to_meta(value: Any) -> Any:
    layout = _layout(value)
    if layout is None:
        return value
    shape, stride, dtype = layout
    return torch.empty_strided(shape, stride, dtype=dtype, device="meta")


def _leaves(sample: Sample) -> list[Any]:
    leaves: list[Any] = []
    map_values((tuple(sample.args), dict(sample.kwargs)), lambda v: leaves.append(v) if _layout(v) else None)
    return leaves


def _footprint_bytes(value: Any) -> int:
    """Bytes of distinct elements a view reads: broadcast (stride-0) dims count once."""
    shape, stride, dtype = _layout(value)
    if any(s == 0 for s in shape):
        return 0
    distinct = math.prod(s for s, st in zip(shape, stride, strict=True) if st != 0)
    return distinct * torch.empty((), dtype=dtype).element_size()


def _resolve(function_name: str):
    try:
        return original_function(function_name)
    except ValueError:
        fn = getattr(torch, function_name, None)
        if callable(fn):
            return fn
        raise


def samples_device(samples: Iterable[Sample]) -> torch.device:
    """The device of the first tensor (or `TensorSpec`) in the samples; CPU when there is none."""
    for sample in samples:
        for value in _leaves(sample):
            return torch.device(value.device)
    return torch.device("cpu")


def meta_outputs(function_name: str, sample: Sample) -> list[tuple[tuple[int, ...], torch.dtype]] | None:
    """Output (shape, dtype) of each output tensor, found by running the original on meta tensors; None if it fails."""
    fn = _resolve(function_name)
    args = map_values(tuple(sample.args), _to_meta)
    kwargs = map_values(dict(sample.kwargs), _to_meta)
    try:
        with torch.no_grad():
            result = fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - data-dependent ops cannot run on meta tensors
        logger.debug("meta run of %s failed: %s", function_name, exc)
        return None
    return [(tuple(t.shape), t.dtype) for t in iter_tensors(result)]


def _numel(shape: Sequence[int]) -> int:
    return math.prod(shape)


def _matmul_flops(function_name: str, sample: Sample, leaves: list[Any], outputs: list) -> int | None:
    """FLOPs of the matmul-like ops (2 per multiply-add), None for others."""
    args = list(sample.args)
    kwargs = dict(sample.kwargs)

    def arg(index: int, name: str) -> Any:
        return args[index] if len(args) > index else kwargs.get(name)

    out_shape = outputs[0][0] if outputs else None
    if function_name == "linear":
        x, w, b = arg(0, "input"), arg(1, "weight"), arg(2, "bias")
        x_shape, w_shape = _layout(x)[0], _layout(w)[0]
        k = x_shape[-1]
        m = _numel(x_shape[:-1])
        n = w_shape[0] if len(w_shape) == 2 else 1
        return 2 * m * n * k + (m * n if _layout(b) else 0)
    if function_name == "bilinear":
        x1, w = arg(0, "input1"), arg(2, "weight")
        w_shape = _layout(w)[0]
        m = _numel(_layout(x1)[0][:-1])
        return 2 * m * w_shape[0] * w_shape[1] * w_shape[2]
    if function_name in {"conv1d", "conv2d", "conv3d"} and out_shape is not None:
        w_shape = _layout(arg(1, "weight"))[0]
        c_in_per_group, kernel = w_shape[1], _numel(w_shape[2:])
        # out_shape = [N, Cout, *spatial] (or unbatched [Cout, *spatial]): every output element is one dot product.
        return 2 * _numel(out_shape) * c_in_per_group * kernel
    if function_name in {"conv_transpose1d", "conv_transpose2d", "conv_transpose3d"}:
        x_shape, w_shape = _layout(arg(0, "input"))[0], _layout(arg(1, "weight"))[0]
        c_out_per_group, kernel = w_shape[1], _numel(w_shape[2:])
        # every input element scatters into c_out_per_group * kernel outputs.
        return 2 * _numel(x_shape) * c_out_per_group * kernel
    if function_name == "scaled_dot_product_attention":
        q, k, v = arg(0, "query"), arg(1, "key"), arg(2, "value")
        q_shape, k_shape, v_shape = _layout(q)[0], _layout(k)[0], _layout(v)[0]
        heads = _numel(q_shape[:-2])
        lq, e, lk, ev = q_shape[-2], q_shape[-1], k_shape[-2], v_shape[-1]
        flops = 2 * heads * lq * lk * e + 2 * heads * lq * lk * ev
        if bool(arg(5, "is_causal")):
            flops //= 2
        return flops
    if function_name in {"mm", "bmm", "matmul"} and out_shape is not None:
        k = _layout(leaves[0])[0][-1]
        return 2 * _numel(out_shape) * k
    return None


def _rate_tflops(ceilings: DeviceCeilings, dtype: torch.dtype | None, matmul: bool) -> float:
    if dtype == torch.float64:
        return ceilings.fp64_tflops
    if matmul and dtype in (torch.float16, torch.bfloat16, torch.int8, torch.uint8) or (
        matmul and dtype is not None and "float8" in str(dtype)
    ):
        return ceilings.tensor_tflops
    return ceilings.fp32_tflops


def _sample_roofline(function_name: str, sample: Sample, ceilings: DeviceCeilings) -> SampleRoofline:
    leaves = _leaves(sample)
    outputs = meta_outputs(function_name, sample)
    source = "meta"
    if outputs is None:
        floating = [v for v in leaves if _layout(v)[2].is_floating_point] or leaves
        outputs = [(_layout(floating[0])[0], _layout(floating[0])[2])] if floating else []
        source = "assumed: like the first floating input (the meta run failed)"
    read = sum(_footprint_bytes(v) for v in leaves)
    written = sum(_numel(shape) * torch.empty((), dtype=dtype).element_size() for shape, dtype in outputs)
    if function_name == "embedding" and len(leaves) >= 2:
        # Only the looked-up rows of the table are read: as many bytes as the output holds (at most the table).
        weight_bytes = _footprint_bytes(leaves[1])
        read = read - weight_bytes + min(weight_bytes, written)
    flops = _matmul_flops(function_name, sample, leaves, outputs)
    matmul = flops is not None
    if flops is None:
        elements = max([_numel(_layout(v)[0]) for v in leaves] + [_numel(s) for s, _ in outputs] + [0])
        per_element = _FLOPS_PER_ELEMENT.get(function_name, _DEFAULT_FLOPS_PER_ELEMENT)
        flops = int(elements * per_element)
    dtype = _layout(leaves[0])[2] if leaves else None
    rate = _rate_tflops(ceilings, dtype, matmul) * 1e12
    return SampleRoofline(
        description=sample.describe(),
        bytes_moved=int(read + written),
        flops=int(flops),
        memory_ms=(read + written) / ceilings.copy_bandwidth * 1e3,
        compute_ms=flops / rate * 1e3 if rate > 0 else 0.0,
        outputs=tuple((tuple(s), d) for s, d in outputs),
        output_source=source,
    )


def estimate(function_name: str, samples: Iterable[Any], device_name: str | None = None) -> RooflineEstimate:
    """Roofline floor of one call of each sample (Samples or (count, Sample) pairs) on `device_name`.

    `device_name` None: taken from the first tensor's device (CUDA: its name; otherwise the CPU figures).
    """
    sample_list = _as_samples(samples)
    if not sample_list:
        raise ValueError(f"roofline estimate for {function_name!r} needs at least one sample")
    if device_name is None:
        device_name = device_description(samples_device(sample_list))[0]
    ceilings = ceilings_for(device_name)
    rows = tuple(_sample_roofline(function_name, s, ceilings) for s in sample_list)
    memory_ms = sum(r.memory_ms for r in rows)
    compute_ms = sum(r.compute_ms for r in rows)
    return RooflineEstimate(
        function=function_name,
        bytes_moved=sum(r.bytes_moved for r in rows),
        flops=sum(r.flops for r in rows),
        floor_ms=sum(r.floor_ms for r in rows),
        memory_ms=memory_ms,
        compute_ms=compute_ms,
        bound="memory" if memory_ms >= compute_ms else "compute",
        ceilings=ceilings,
        per_sample=rows,
    )
