"""Function problems: one `torch.nn.functional` function and the real calls a model makes to it.

A `FunctionProblem` holds its calls as `(count, Sample)` pairs whose tensors are `forge.samples.TensorSpec`s, so a
suite file stays small and `materialize()` draws real tensors under a seed. `function_problem_from_json` parses one
entry of a suite file (schema: `evals/suites/README.md`) and reports schema errors as `SuiteFormatError`s that name
the offending field, e.g. `calls[0].args[1].tensor.dtype`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from forge.functional import original_function
from forge.samples import (
    Sample,
    TensorSpec,
    draw_sample,
    dtype_from_name,
    map_values,
    value_from_json,
    value_to_json,
)

from .base import Problem, ProblemKind, Provenance, SuiteFormatError, Tolerance

__all__ = ["FunctionProblem", "function_problem_from_json"]


@dataclass(frozen=True)
class FunctionProblem(Problem):
    """Make `torch.nn.functional.<function>` faster on these calls.

    `calls` are `(count, Sample)` pairs: `count` is how often the model makes that exact call per forward pass
    (a weight for aggregate timings), the sample's tensors are `TensorSpec`s. `tolerance` overrides the checker's
    default tolerance when set.
    """

    kind: ClassVar[ProblemKind] = "function"

    id: str
    suite: str
    function: str
    calls: tuple[tuple[int, Sample], ...]
    provenance: Provenance
    description: str = ""
    tolerance: Tolerance | None = None

    def __post_init__(self) -> None:
        original_function(self.function)  # raises a clear ValueError for names that are not F functions
        calls = tuple((int(count), Sample(tuple(s.args), dict(s.kwargs))) for count, s in self.calls)
        if not calls:
            raise ValueError(f"function problem {self.id!r} has no calls")
        if any(count < 1 for count, _ in calls):
            raise ValueError(f"function problem {self.id!r}: every call count must be >= 1")
        object.__setattr__(self, "calls", calls)

    @property
    def reference(self) -> Callable:
        """The unpatched PyTorch function (`forge.functional.original_function`)."""
        return original_function(self.function)

    def tensor_specs(self) -> Iterator[TensorSpec]:
        """Every tensor spec in every call, in order."""
        found: list[TensorSpec] = []

        def collect(value: Any) -> None:
            if isinstance(value, TensorSpec):
                found.append(value)

        for _, sample in self.calls:
            map_values(tuple(sample.args), collect)
            map_values(dict(sample.kwargs), collect)
        yield from found

    def materialize(self, device: str | torch.device = "cpu", seed: int = 0) -> list[tuple[int, Sample]]:
        """The calls with real tensors: `[(count, Sample)]`, drawn on the CPU under `seed` and moved to `device`.

        The same seed gives the same values on every device. On the `"meta"` device nothing is allocated or drawn
        (useful to check shapes of large problems).
        """
        target = torch.device(device)
        if target.type == "meta":
            return [(count, _meta_sample(sample)) for count, sample in self.calls]
        generator = torch.Generator().manual_seed(int(seed))
        return [(count, draw_sample(sample, generator, device=target)) for count, sample in self.calls]

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "id": self.id,
            "function": self.function,
            "description": self.description,
            "provenance": self.provenance.to_json(),
            "calls": [
                {
                    "count": count,
                    "args": [_value_to_json(a) for a in sample.args],
                    "kwargs": {k: _value_to_json(v) for k, v in sample.kwargs.items()},
                }
                for count, sample in self.calls
            ],
        }
        if self.tolerance is not None:
            data["tolerance"] = self.tolerance.to_json()
        return data


def _meta_sample(sample: Sample) -> Sample:
    def fn(value: Any) -> Any:
        if isinstance(value, TensorSpec):
            storage = torch.empty(max(value.storage_size(), 1), dtype=value.dtype, device="meta")
            return storage.as_strided(value.shape, value.stride, value.storage_offset)
        return value

    return Sample(map_values(tuple(sample.args), fn), map_values(dict(sample.kwargs), fn))


def _value_to_json(value: Any) -> Any:
    """`forge.samples.value_to_json`, leaving out a spec's default device and contiguous strides."""
    data = value_to_json(value)

    def strip(node: Any) -> Any:
        if isinstance(node, list):
            return [strip(v) for v in node]
        if isinstance(node, dict):
            if set(node) == {"tensor"} and isinstance(node["tensor"], dict) and "shape" in node["tensor"]:
                spec = dict(node["tensor"])
                if spec.get("device") == "cpu":
                    del spec["device"]
                if TensorSpec(tuple(spec["shape"]), dtype_from_name(spec["dtype"])).stride == tuple(spec["stride"]):
                    del spec["stride"]
                return {"tensor": spec}
            return {k: strip(v) for k, v in node.items()}
        return node

    return strip(data)


# ---------------------------------------------------------------------------------------------------------
# Parsing with field paths
# ---------------------------------------------------------------------------------------------------------
_PROBLEM_KEYS = {"id", "function", "description", "provenance", "calls", "tolerance"}
_CALL_KEYS = {"count", "args", "kwargs"}
_SPEC_KEYS = {"shape", "dtype", "device", "stride", "storage_offset", "low", "high", "mean", "std"}


class _FieldError(Exception):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field, self.message = field, message


def _require(condition: bool, field: str, message: str) -> None:
    if not condition:
        raise _FieldError(field, message)


def _check_keys(data: Any, allowed: set[str], required: set[str], field: str) -> None:
    _require(isinstance(data, dict), field, f"expected an object, got {type(data).__name__}")
    for key in sorted(required - set(data)):
        raise _FieldError(f"{field}.{key}" if field else key, "missing required field")
    for key in sorted(set(data) - allowed):
        raise _FieldError(f"{field}.{key}" if field else key, f"unknown field; allowed: {', '.join(sorted(allowed))}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _parse_spec(data: Any, field: str) -> TensorSpec:
    _check_keys(data, _SPEC_KEYS, {"shape", "dtype"}, field)
    shape = data["shape"]
    _require(isinstance(shape, list) and all(_is_int(s) and s >= 0 for s in shape), f"{field}.shape",
             f"expected a list of non-negative integers, got {shape!r}")
    try:
        dtype = dtype_from_name(data["dtype"]) if isinstance(data["dtype"], str) else None
    except ValueError as exc:
        raise _FieldError(f"{field}.dtype", str(exc)) from None
    _require(dtype is not None, f"{field}.dtype", f"expected a dtype name such as 'bfloat16', got {data['dtype']!r}")
    if "stride" in data:
        stride = data["stride"]
        _require(isinstance(stride, list) and len(stride) == len(shape) and all(_is_int(s) and s >= 0 for s in stride),
                 f"{field}.stride", f"expected {len(shape)} non-negative integers (one per dimension), got {stride!r}")
    if "storage_offset" in data:
        _require(_is_int(data["storage_offset"]) and data["storage_offset"] >= 0, f"{field}.storage_offset",
                 "expected a non-negative integer")
    if "device" in data:
        try:
            torch.device(data["device"])
        except (RuntimeError, TypeError):
            raise _FieldError(f"{field}.device", f"not a torch device: {data['device']!r}") from None
    for name in ("low", "high", "mean", "std"):
        if name in data:
            _require(_is_number(data[name]), f"{field}.{name}", f"expected a finite number, got {data[name]!r}")
    integral = not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)
    if integral:
        for name in ("low", "high"):
            _require(name in data, f"{field}.{name}",
                     f"integer tensors ({data['dtype']}) need 'low' and 'high' so random draws stay valid "
                     "(e.g. indices below the vocabulary size)")
        _require(data["low"] <= data["high"], f"{field}.low", f"low {data['low']} is above high {data['high']}")
    if "std" in data:
        _require(data["std"] >= 0, f"{field}.std", "expected a value >= 0")
    return TensorSpec.from_json(data)


def _parse_value(data: Any, field: str) -> Any:
    if isinstance(data, list):
        return [_parse_value(v, f"{field}[{i}]") for i, v in enumerate(data)]
    if isinstance(data, dict):
        _require(len(data) == 1, field, f"a tagged value has exactly one key (tensor, tuple, dict, dtype, ...), got "
                 f"{sorted(data)}")
        (tag, payload), = data.items()
        if tag == "tensor":
            return _parse_spec(payload, f"{field}.tensor")
        if tag == "tuple":
            _require(isinstance(payload, list), f"{field}.tuple", "expected a list")
            return tuple(_parse_value(v, f"{field}.tuple[{i}]") for i, v in enumerate(payload))
        if tag == "dict":
            _require(isinstance(payload, dict), f"{field}.dict", "expected an object")
            return {k: _parse_value(v, f"{field}.dict.{k}") for k, v in payload.items()}
        try:
            return value_from_json(data)
        except (ValueError, TypeError) as exc:
            raise _FieldError(f"{field}.{tag}", str(exc)) from None
    _require(data is None or isinstance(data, (bool, int, float, str)), field, f"unsupported value {data!r}")
    return data


def _parse_provenance(data: Any, field: str) -> Provenance:
    _check_keys(data, {"model", "layer", "source"}, {"model", "layer", "source"}, field)
    for key in ("model", "layer", "source"):
        _require(isinstance(data[key], str) and data[key].strip() != "", f"{field}.{key}",
                 "expected a non-empty string")
    return Provenance(data["model"], data["layer"], data["source"])


def _parse_tolerance(data: Any, field: str) -> Tolerance:
    _check_keys(data, {"atol", "rtol"}, {"atol", "rtol"}, field)
    for key in ("atol", "rtol"):
        _require(_is_number(data[key]) and data[key] >= 0, f"{field}.{key}",
                 f"expected a number >= 0, got {data[key]!r}")
    return Tolerance(data["atol"], data["rtol"])


def _parse_call(data: Any, field: str) -> tuple[int, Sample]:
    _check_keys(data, _CALL_KEYS, {"args"}, field)
    count = data.get("count", 1)
    _require(_is_int(count) and count >= 1, f"{field}.count", f"expected an integer >= 1, got {count!r}")
    _require(isinstance(data["args"], list), f"{field}.args", "expected a list of arguments")
    kwargs = data.get("kwargs", {})
    _require(isinstance(kwargs, dict), f"{field}.kwargs", "expected an object of keyword arguments")
    args = tuple(_parse_value(v, f"{field}.args[{i}]") for i, v in enumerate(data["args"]))
    parsed_kwargs = {k: _parse_value(v, f"{field}.kwargs.{k}") for k, v in kwargs.items()}
    return count, Sample(args, parsed_kwargs)


def function_problem_from_json(data: Any, *, suite: str, path: str | None = None,
                               index: int | None = None) -> FunctionProblem:
    """Parse one problem entry of a suite file; a `SuiteFormatError` names `path`, the problem id and the field."""
    problem_id = data.get("id") if isinstance(data, dict) and isinstance(data.get("id"), str) else None
    where = problem_id if problem_id is not None else (f"#{index}" if index is not None else None)
    try:
        _check_keys(data, _PROBLEM_KEYS, {"id", "function", "provenance", "calls"}, "")
        _require(problem_id is not None and problem_id.strip() != "", "id", "expected a non-empty string")
        function = data["function"]
        _require(isinstance(function, str), "function", "expected a torch.nn.functional function name")
        try:
            original_function(function)
        except ValueError as exc:
            raise _FieldError("function", str(exc)) from None
        description = data.get("description", "")
        _require(isinstance(description, str), "description", "expected a string")
        provenance = _parse_provenance(data["provenance"], "provenance")
        calls_data = data["calls"]
        _require(isinstance(calls_data, list) and len(calls_data) > 0, "calls", "expected a non-empty list of calls")
        calls = tuple(_parse_call(c, f"calls[{i}]") for i, c in enumerate(calls_data))
        tolerance = _parse_tolerance(data["tolerance"], "tolerance") if data.get("tolerance") is not None else None
    except _FieldError as exc:
        raise SuiteFormatError(exc.message, path=path, problem_id=where, field=exc.field) from None
    return FunctionProblem(
        id=problem_id,
        suite=suite,
        function=function,
        calls=calls,
        provenance=provenance,
        description=description,
        tolerance=tolerance,
    )
