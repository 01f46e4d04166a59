"""Template variables for a task: the function's description, one row per call signature (every argument's shape,
dtype, strides, offset or value; call counts and time shares; output shapes; the roofline floor), and the device.

Everything is pre-formatted text, so templates stay simple and overridable (see prompts/README.md for the names).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from agent.languages import get_language
from agent.prompting.task import InstanceTask, KernelTask, ModuleTask
from agent.roofline import RooflineEstimate, SampleRoofline, estimate
from agent.semantics import entry_signature, parameter_names, semantics_summary, signature_text
from forge.samples import Sample, TensorSpec, dtype_name, map_values

__all__ = ["SMALL_CALL_FLOOR_US", "describe_value", "instance_task_context", "kernel_task_context",
           "module_task_context"]

logger = logging.getLogger(__name__)

# A call whose roofline floor is below this is launch-bound on any GPU (an empty launch costs a few microseconds).
SMALL_CALL_FLOOR_US = 5.0


def _spec(value: Any) -> TensorSpec | None:
    if isinstance(value, TensorSpec):
        return value
    if isinstance(value, torch.Tensor):
        stats = not value.dtype.is_floating_point and value.layout == torch.strided and value.device.type != "meta"
        return TensorSpec.of(value, with_stats=stats)
    return None


def _layout_notes(spec: TensorSpec) -> list[str]:
    notes = []
    if spec.is_contiguous:
        notes.append("contiguous")
    else:
        broadcast = [d for d, (s, st) in enumerate(zip(spec.shape, spec.stride, strict=True)) if st == 0 and s > 1]
        if broadcast:
            kind = f"broadcast view: stride 0 on dim(s) {', '.join(map(str, broadcast))} (those indices all read the " \
                   "same elements)"
        elif spec.is_dense:
            kind = "a permuted/transposed view of dense memory"
        else:
            kind = "a strided view (e.g. a slice): rows are not adjacent in memory"
        notes.append(f"NON-CONTIGUOUS, {kind}")
    if spec.storage_offset:
        notes.append(
            f"storage offset {spec.storage_offset} elements (a tensor passed to a kernel already points at its first "
            "element)"
        )
    if spec.low is not None and spec.high is not None and not spec.dtype.is_floating_point:
        notes.append(f"values in [{spec.low:g}, {spec.high:g}]")
    return notes


def describe_value(value: Any) -> str:
    """One argument in words: `tensor bfloat16, shape (2, 4096), stride (4096, 1), contiguous`, or `1e-06 (float)`."""
    spec = _spec(value)
    if spec is not None:
        return (
            f"tensor {dtype_name(spec.dtype)}, shape {tuple(spec.shape)}, stride {tuple(spec.stride)}, "
            + ", ".join(_layout_notes(spec))
        )
    if isinstance(value, (tuple, list, dict)):
        has_tensor: list[bool] = []
        map_values(value, lambda v: has_tensor.append(_spec(v) is not None))
        if any(has_tensor):
            return Sample((value,), {}).describe()[1:-1] + f" ({type(value).__name__} containing tensors)"
    if isinstance(value, torch.dtype):
        return f"torch.{dtype_name(value)} (dtype)"
    return f"{value!r} ({type(value).__name__})"


def _roofline_rows(task: KernelTask) -> tuple[RooflineEstimate | None, list[SampleRoofline | None]]:
    try:
        result = estimate(task.function, task.sample_list, task.device_name)
    except Exception as exc:  # noqa: BLE001 - the prompt is still useful without floors
        logger.debug("no roofline estimate for %s: %s", task.function, exc)
        return None, [None] * len(task.samples)
    return result, list(result.per_sample)


def _floor_text(row: SampleRoofline) -> str:
    return (
        f"~{row.floor_ms * 1e3:.3g} us ({row.bound}-bound: {row.bytes_moved / 1e6:.3g} MB moved, "
        f"{row.flops / 1e9:.3g} GFLOP)"
    )


def _signature_rows(task: KernelTask, rows: list[SampleRoofline | None]) -> list[dict[str, Any]]:
    names = parameter_names(task.function)
    out = []
    for index, (entry, roof) in enumerate(zip(task.samples, rows, strict=True), start=1):
        sample = entry.sample
        arguments = []
        for position, value in enumerate(sample.args):
            label = names[position] if position < len(names) else f"args[{position}]"
            arguments.append(f"`{label}` (positional {position}): {describe_value(value)}")
        for name, value in sample.kwargs.items():
            arguments.append(f"`{name}` (keyword): {describe_value(value)}")
        outputs = []
        if roof is not None and roof.output_source == "meta":
            outputs = [f"tensor {dtype_name(dtype)}, shape {tuple(shape)}" for shape, dtype in roof.outputs]
        out.append(
            {
                "index": index,
                "count": entry.count,
                "time_share": f"{entry.time_share * 100:.1f}%" if entry.time_share is not None else None,
                "call": "kernel_function" + sample.describe(),
                "arguments": arguments,
                "outputs": outputs,
                "floor": _floor_text(roof) if roof is not None else None,
                # Launch-bound on a GPU; under the CPU interpreter speed is not the point.
                "small": roof is not None and not task.is_interpreter and roof.floor_ms * 1e3 < SMALL_CALL_FLOOR_US,
            }
        )
    return out


def _device_context(device_name: str, capability: tuple[int, int] | None, is_interpreter: bool) -> dict[str, Any]:
    return {
        "device_name": device_name,
        "compute_capability": f"{capability[0]}.{capability[1]} (sm_{capability[0]}{capability[1]})"
        if capability else None,
        "is_interpreter": is_interpreter,
    }


def _tensor_specs(samples: list[Sample]) -> list[TensorSpec]:
    specs: list[TensorSpec] = []
    for sample in samples:
        map_values(
            (tuple(sample.args), dict(sample.kwargs)),
            lambda v: specs.append(spec) if (spec := _spec(v)) is not None else None,
        )
    return specs


def _has_true_inplace(samples: list[Sample]) -> bool:
    return any(s.kwargs.get("inplace") is True for s in samples)


def kernel_task_context(task: KernelTask) -> dict[str, Any]:
    """The variables of the function templates: `task`, `signatures`, `roofline` (or None)."""
    roofline, rows = _roofline_rows(task)
    signatures = _signature_rows(task, rows)
    specs = _tensor_specs(task.sample_list)
    small = [row["index"] for row in signatures if row["small"]]
    task_vars = {
        "kind": "function",
        "function": task.function,
        "qualified_name": task.qualified_name,
        "signature": signature_text(task.function),
        "entry_signature": entry_signature(task.function),
        "semantics": semantics_summary(task.function),
        "language": task.language,
        "language_name": get_language(task.language).title,
        "n_signatures": len(signatures),
        "has_fp32": any(s.dtype == torch.float32 for s in specs),
        "has_half": any(s.dtype in (torch.float16, torch.bfloat16) for s in specs),
        "has_noncontiguous": any(not s.is_contiguous for s in specs),
        "has_storage_offset": any(s.storage_offset for s in specs),
        "has_inplace": task.function.endswith("_") or _has_true_inplace(task.sample_list),
        "small_calls": small,
        "small_call_floor_us": f"{SMALL_CALL_FLOOR_US:g}",
        **_device_context(task.device_name, task.compute_capability, task.is_interpreter),
    }
    return {"task": task_vars, "signatures": signatures, "roofline": roofline}


def module_task_context(task: ModuleTask) -> dict[str, Any]:
    """The variables of the module templates: `task` (source, inputs, init inputs, device...)."""
    inputs = [f"forward argument {i}: {describe_value(v)}" for i, v in enumerate(task.inputs)]
    init_inputs = [f"constructor argument {i}: {describe_value(v)}" for i, v in enumerate(task.init_inputs)]
    specs = [s for v in task.inputs if (s := _spec(v)) is not None]
    task_vars = {
        "kind": "module",
        "name": task.name,
        "source": task.source,
        "inputs": inputs,
        "init_inputs": init_inputs,
        "dtype": dtype_name(task.dtype) if task.dtype is not None else None,
        "language": task.language,
        "language_name": get_language(task.language).title,
        "has_fp32": any(s.dtype == torch.float32 for s in specs) or task.dtype == torch.float32,
        "has_half": any(s.dtype in (torch.float16, torch.bfloat16) for s in specs)
        or task.dtype in (torch.float16, torch.bfloat16),
        "has_noncontiguous": any(not s.is_contiguous for s in specs),
        **_device_context(task.device_name, task.compute_capability, task.is_interpreter),
    }
    return {"task": task_vars}


def _instance_rows(task: InstanceTask) -> list[dict[str, Any]]:
    names = task.forward_parameters
    rows = []
    for index, entry in enumerate(task.samples, start=1):
        sample = entry.sample
        arguments = [f"`{names[i] if i < len(names) else f'args[{i}]'}` (positional {i}): {describe_value(v)}"
                     for i, v in enumerate(sample.args)]
        arguments += [f"`{k}` (keyword): {describe_value(v)}" for k, v in sample.kwargs.items()]
        output = task.outputs[index - 1] if index - 1 < len(task.outputs) else None
        rows.append({"index": index, "count": entry.count,
                     "time_share": f"{entry.time_share * 100:.1f}%" if entry.time_share is not None else None,
                     "call": "forward" + sample.describe(), "arguments": arguments,
                     "outputs": [output] if output else [], "floor": None, "small": False})
    return rows


def instance_task_context(task: InstanceTask) -> dict[str, Any]:
    """The variables of the instance templates: `task` (the class, its sources, attributes, tensors, device) and
    `signatures` (every sampled call, as the function templates show them)."""
    specs = _tensor_specs(task.sample_list)
    tensor_dtypes = " ".join(line for _, line in task.tensors)
    task_vars = {
        "kind": "instance",
        "name": task.name,
        "class_name": task.class_name,
        "forward_source": task.forward_source,
        "init_source": task.init_source,
        "helpers": [{"name": n, "source": s} for n, s in task.helpers],
        "attributes": [f"`{n}` = {v}" for n, v in task.attributes],
        "tensors": [f"`{n}`: {line}" for n, line in task.tensors],
        "submodules": [f"`{n}`: {cls}" for n, cls in task.submodules],
        "n_signatures": len(task.samples),
        "language": task.language,
        "language_name": get_language(task.language).title,
        "has_fp32": any(s.dtype == torch.float32 for s in specs) or "float32" in tensor_dtypes,
        "has_half": any(s.dtype in (torch.float16, torch.bfloat16) for s in specs)
        or "float16" in tensor_dtypes or "bfloat16" in tensor_dtypes,
        "has_noncontiguous": any(not s.is_contiguous for s in specs),
        "has_storage_offset": any(s.storage_offset for s in specs),
        **_device_context(task.device_name, task.compute_capability, task.is_interpreter),
    }
    return {"task": task_vars, "signatures": _instance_rows(task)}
