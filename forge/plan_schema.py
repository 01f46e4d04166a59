"""Plan files are untrusted input: read them with bounds and check every field before anything is built.

A plan travels between machines and may be edited by hand, truncated, or replaced by something that is not a plan at
all. Before this module each of these reached code that assumed a well-formed file: a binary file escaped as
`UnicodeDecodeError`, JSON nested 5,000 deep as `RecursionError`, `environment` as a string as `AttributeError`,
`latency_ms: "fast"` loaded and then crashed `kforge plan show`, a 300 MB file or `/dev/zero` was read whole, and a
signature shape of 2^20 x 2^20 made `plan verify` try to allocate 4 TB. Here:

- `read_plan_json(path)` opens without blocking (a FIFO cannot hang it), refuses anything but a regular file,
  refuses files over `PlanLimits.max_file_bytes` (64 MiB: the largest plan `kforge optimize` wrote for the
  35-problem builtin suite is under 2 MB; generated sources are a few KB each) from `fstat` before reading, reads at
  most that many bytes, decodes strict UTF-8 and parses JSON with NaN/Infinity refused;
- `validate_plan_dict(data)` walks the parsed document once: nesting depth, list / object / string sizes, finite
  numbers and bounded integers everywhere (provider state included), then the plan's own structure: the allowed
  keys and the type of every field of the plan, its entries, their signatures and every tensor spec, and the
  `signature` block (`forge.signing`: exactly its five string fields, key id and MAC as lowercase hex).

Tensor specs are bounded where `plan verify` allocates them (`TensorSpec.draw` allocates the storage a view
needs, offset and strides included): at most `max_tensor_elements` (2^31) elements of storage per tensor and
`max_entry_elements` (2^34) summed over one entry's signatures (verify draws them all before validating). 2^31 is
above the largest activation of the builtin suite (Llama-3-8B logits at 8k tokens: 8192 x 128256 ~ 2^30) and, at
4 bytes, within one GPU; raise the limits with `PlanLimits` for larger models.

Every failure raises `forge.plan.PlanLoadError` naming the JSON path of the bad field (`entries[0].latency_ms`).
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forge.text import clip

__all__ = ["PlanLimits", "DEFAULT_LIMITS", "read_plan_json", "validate_plan_dict"]


@dataclass(frozen=True)
class PlanLimits:
    """Bounds on a plan file; the module docstring says where each default comes from."""

    max_file_bytes: int = 64 * 2**20
    max_depth: int = 64
    max_list_items: int = 100_000
    max_object_keys: int = 10_000
    max_string_chars: int = 4 * 2**20
    max_entries: int = 1_000
    max_signatures: int = 10_000
    max_dims: int = 32
    max_abs_int: int = 2**63 - 1
    max_tensor_elements: int = 2**31
    max_entry_elements: int = 2**34


DEFAULT_LIMITS = PlanLimits()

_PLAN_KEYS = frozenset({"format", "version", "created", "environment", "execution", "entries", "signature"})
_SIGNATURE_KEYS = frozenset({"algorithm", "signer", "key_id", "signed_at", "mac"})
_HEX = {"key_id": re.compile(r"[0-9a-f]{8}"), "mac": re.compile(r"[0-9a-f]{64}")}
_ENTRY_KEYS = frozenset({"function", "source", "description", "latency_ms", "baseline_ms", "provider", "signatures"})
_SAMPLE_KEYS = frozenset({"args", "kwargs"})
_TENSOR_KEYS = frozenset({"shape", "dtype", "device", "stride", "storage_offset", "low", "high", "mean", "std"})
_VALUE_TAGS = frozenset({"tensor", "dtype", "device", "size", "tuple", "dict", "float"})
_NAME = re.compile(r"(?:module:)?[A-Za-z_][A-Za-z0-9_.]{0,255}")  # an F function, a type, or a module class
_DEVICE = re.compile(r"(cpu|cuda|meta|mps|xpu|hip)(:[0-9]{1,4})?")
_NON_FINITE = frozenset({"nan", "inf", "-inf", "+inf"})


class _Violation(Exception):
    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where or 'plan'}: {problem}")


def _load_error(message: str) -> Exception:
    from forge.plan import PlanLoadError  # forge.plan imports this module: resolve the class at raise time

    return PlanLoadError(message)


# ---------------------------------------------------------------------------------------------------------
# reading
# ---------------------------------------------------------------------------------------------------------
def read_plan_json(path: str | os.PathLike, limits: PlanLimits = DEFAULT_LIMITS) -> Any:
    """The parsed JSON of the plan file at `path` (bounded read); `PlanLoadError` naming the file otherwise."""
    path = Path(path)
    raw = _read_bounded(path, limits.max_file_bytes)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _load_error(f"plan file {path} is not UTF-8 text (byte {exc.start}); is it a plan?") from None
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise _load_error(
            f"plan file {path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); "
            "it may be truncated or edited by hand - re-create it with `kforge optimize`"
        ) from exc
    except RecursionError:
        raise _load_error(f"plan file {path} is nested too deeply to be a plan") from None
    except ValueError as exc:  # NaN/Infinity, or an integer with thousands of digits
        raise _load_error(f"plan file {path} is not a valid plan: {exc}") from None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name} in JSON")


def _read_bounded(path: Path, cap: int) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise _load_error(f"cannot read plan file {path}: {exc.strerror or exc}") from exc
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise _load_error(f"cannot read plan file {path}: it is a directory")
        if not stat.S_ISREG(info.st_mode):
            raise _load_error(f"cannot read plan file {path}: not a regular file (a device, FIFO or socket)")
        if info.st_size > cap:
            raise _load_error(f"plan file {path} is {info.st_size} bytes, over the {cap}-byte limit for plans")
        chunks, total = [], 0
        while total <= cap:
            chunk = os.read(fd, min(1 << 20, cap + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > cap:  # the file grew while it was read
            raise _load_error(f"plan file {path} is over the {cap}-byte limit for plans")
        return b"".join(chunks)
    except OSError as exc:
        raise _load_error(f"cannot read plan file {path}: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------------------------
# validating
# ---------------------------------------------------------------------------------------------------------
def validate_plan_dict(data: Any, limits: PlanLimits = DEFAULT_LIMITS) -> None:
    """Check a parsed plan document; raises `PlanLoadError` naming the first bad field. Returns None when valid."""
    try:
        _check_generic(data, "", 0, limits)
        _check_plan(data, limits)
    except _Violation as exc:
        raise _load_error(str(exc)) from None


def _check_generic(value: Any, where: str, depth: int, limits: PlanLimits) -> None:
    """Bounded depth, sizes and finite numbers anywhere in the document (provider state included)."""
    if depth > limits.max_depth:
        raise _Violation(where, f"nested deeper than {limits.max_depth} levels")
    if isinstance(value, dict):
        if len(value) > limits.max_object_keys:
            raise _Violation(where, f"object with {len(value)} keys (limit {limits.max_object_keys})")
        for key, item in value.items():
            _check_string(key, f"{where} key", limits)
            _check_generic(item, f"{where}.{key}" if where else key, depth + 1, limits)
    elif isinstance(value, list):
        if len(value) > limits.max_list_items:
            raise _Violation(where, f"list of {len(value)} items (limit {limits.max_list_items})")
        for index, item in enumerate(value):
            _check_generic(item, f"{where}[{index}]", depth + 1, limits)
    elif isinstance(value, str):
        _check_string(value, where, limits)
    elif isinstance(value, bool) or value is None:
        return
    elif isinstance(value, int):
        if abs(value) > limits.max_abs_int:
            raise _Violation(where, f"integer {value} out of range")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise _Violation(where, f"non-finite number {value}")
    else:  # pragma: no cover - json.loads makes nothing else
        raise _Violation(where, f"unexpected {type(value).__name__}")


def _check_string(value: str, where: str, limits: PlanLimits) -> None:
    if len(value) > limits.max_string_chars:
        raise _Violation(where, f"string of {len(value)} characters (limit {limits.max_string_chars})")


def _expect(value: Any, kinds: type | tuple[type, ...], where: str, what: str) -> Any:
    bad_bool = isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,))
    if not isinstance(value, kinds) or bad_bool:
        raise _Violation(where, f"must be {what}, got {type(value).__name__} {_short(value)}")
    return value


def _short(value: Any) -> str:
    return clip(repr(value), 60, collapse=False)


def _check_keys(obj: Mapping, allowed: frozenset[str], where: str, required: tuple[str, ...] = ()) -> None:
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise _Violation(where, f"unknown key(s) {', '.join(map(repr, unknown))} "
                         f"(allowed: {', '.join(sorted(allowed))})")
    for key in required:
        if key not in obj:
            raise _Violation(where, f"missing key {key!r}")


def _check_name(value: Any, where: str) -> None:
    _expect(value, str, where, "a name")
    if not _NAME.fullmatch(value):
        raise _Violation(where, f"{_short(value)} is not a valid name")


def _check_number(value: Any, where: str, *, optional: bool = True, minimum: float | None = None) -> None:
    if value is None and optional:
        return
    _expect(value, (int, float), where, "a number" + (" or null" if optional else ""))
    if minimum is not None and value < minimum:
        raise _Violation(where, f"must be >= {minimum}, got {value}")


def _check_plan(data: Any, limits: PlanLimits) -> None:
    _expect(data, dict, "", "a JSON object")
    _check_keys(data, _PLAN_KEYS, "", required=("format", "version", "entries"))
    _expect(data["format"], str, "format", "a string")
    _expect(data["version"], int, "version", "an integer")
    if "created" in data and data["created"] is not None:
        _expect(data["created"], str, "created", "a string")
    if data.get("execution") is not None:
        _expect(data["execution"], str, "execution", "a string")
    environment = data.get("environment")
    if environment is not None:
        _expect(environment, dict, "environment", "an object")
        for key, value in environment.items():
            _check_environment_value(value, f"environment.{key}")
    if "signature" in data:
        _check_signature_block(data["signature"])
    entries = _expect(data["entries"], list, "entries", "a list")
    if len(entries) > limits.max_entries:
        raise _Violation("entries", f"{len(entries)} entries (limit {limits.max_entries})")
    for index, entry in enumerate(entries):
        _check_entry(entry, f"entries[{index}]", limits)


def _check_signature_block(block: Any) -> None:
    """The `forge.signing` block: exactly its five string fields, the key id and MAC as lowercase hex."""
    _expect(block, dict, "signature", "an object")
    _check_keys(block, _SIGNATURE_KEYS, "signature", required=tuple(sorted(_SIGNATURE_KEYS)))
    for key in sorted(_SIGNATURE_KEYS):
        value = _expect(block[key], str, f"signature.{key}", "a string")
        if len(value) > 256:
            raise _Violation(f"signature.{key}", f"string of {len(value)} characters (limit 256)")
        if key in _HEX and not _HEX[key].fullmatch(value):
            raise _Violation(f"signature.{key}", f"{_short(value)} is not lowercase hex of the expected "
                             "length")


def _check_environment_value(value: Any, where: str) -> None:
    if isinstance(value, list):
        for index, item in enumerate(value):
            _expect(item, (str, int, float), f"{where}[{index}]", "a string or a number")
    elif value is not None:
        _expect(value, (str, int, float, bool), where, "a string, a number or a list of them")


def _check_entry(entry: Any, where: str, limits: PlanLimits) -> None:
    _expect(entry, dict, where, "an object")
    _check_keys(entry, _ENTRY_KEYS, where, required=("provider", "signatures"))
    if entry.get("function") is not None:
        _check_name(entry["function"], f"{where}.function")
    for key in ("source", "description"):
        if entry.get(key) is not None:
            _expect(entry[key], str, f"{where}.{key}", "a string")
    for key in ("latency_ms", "baseline_ms"):
        _check_number(entry.get(key), f"{where}.{key}", minimum=0)
    provider = _expect(entry["provider"], dict, f"{where}.provider", "an object")
    if "type" not in provider:
        raise _Violation(f"{where}.provider", "missing key 'type'")
    _check_name(provider["type"], f"{where}.provider.type")
    signatures = _expect(entry["signatures"], list, f"{where}.signatures", "a list")
    if len(signatures) > limits.max_signatures:
        raise _Violation(f"{where}.signatures", f"{len(signatures)} signatures (limit {limits.max_signatures})")
    total = 0
    for index, sample in enumerate(signatures):
        total += _check_sample(sample, f"{where}.signatures[{index}]", limits)
        if total > limits.max_entry_elements:
            raise _Violation(f"{where}.signatures", f"tensors of more than {limits.max_entry_elements} elements in "
                             "all (the per-entry limit; see forge.plan_schema.PlanLimits)")


def _check_sample(sample: Any, where: str, limits: PlanLimits) -> int:
    """Check one serialised call; returns the elements of storage its tensors need."""
    _expect(sample, dict, where, "an object")
    _check_keys(sample, _SAMPLE_KEYS, where, required=("args",))
    args = _expect(sample["args"], list, f"{where}.args", "a list")
    kwargs = _expect(sample.get("kwargs", {}), dict, f"{where}.kwargs", "an object")
    total = sum(_check_value(v, f"{where}.args[{i}]", limits) for i, v in enumerate(args))
    for key, value in kwargs.items():
        _check_name(key, f"{where}.kwargs key")
        total += _check_value(value, f"{where}.kwargs.{key}", limits)
    return total


def _check_value(value: Any, where: str, limits: PlanLimits) -> int:
    """One serialised argument (`forge.samples.value_to_json`); returns the elements of storage it needs."""
    if isinstance(value, list):
        return sum(_check_value(v, f"{where}[{i}]", limits) for i, v in enumerate(value))
    if not isinstance(value, dict):
        return 0  # a JSON scalar (the generic pass checked it)
    if len(value) != 1 or next(iter(value)) not in _VALUE_TAGS:
        raise _Violation(where, f"a serialised argument is one of {sorted(_VALUE_TAGS)} objects, got keys "
                         f"{sorted(value)[:5]}")
    (tag, payload), = value.items()
    where = f"{where}.{tag}"
    if tag == "tensor":
        return _check_tensor(payload, where, limits)
    if tag == "dtype":
        _check_dtype(payload, where)
    elif tag == "device":
        _check_device(payload, where)
    elif tag == "size":
        _check_ints(payload, where, limits, what="size")
    elif tag == "tuple":
        return _check_value(_expect(payload, list, where, "a list"), where, limits)
    elif tag == "dict":
        _expect(payload, dict, where, "an object")
        return sum(_check_value(v, f"{where}.{k}", limits) for k, v in payload.items())
    elif tag == "float":
        if _expect(payload, str, where, "a string").strip().lower() not in _NON_FINITE:
            raise _Violation(where, f"{_short(payload)} is not one of nan, inf, -inf")
    return 0


def _check_dtype(value: Any, where: str) -> None:
    import torch

    _expect(value, str, where, "a dtype name")
    if not isinstance(getattr(torch, value.removeprefix("torch."), None), torch.dtype):
        raise _Violation(where, f"unknown torch dtype {_short(value)}")


def _check_device(value: Any, where: str) -> None:
    _expect(value, str, where, "a device name")
    if not _DEVICE.fullmatch(value):
        raise _Violation(where, f"{_short(value)} is not a device such as 'cpu' or 'cuda:0'")


def _check_ints(value: Any, where: str, limits: PlanLimits, *, what: str) -> list[int]:
    items = _expect(value, list, where, f"a list of non-negative integers ({what})")
    if len(items) > limits.max_dims:
        raise _Violation(where, f"{len(items)} dimensions (limit {limits.max_dims})")
    for index, item in enumerate(items):
        _expect(item, int, f"{where}[{index}]", "a non-negative integer")
        if item < 0:
            raise _Violation(f"{where}[{index}]", f"must be >= 0, got {item}")
    return items


def _check_tensor(spec: Any, where: str, limits: PlanLimits) -> int:
    _expect(spec, dict, where, "a tensor spec object")
    _check_keys(spec, _TENSOR_KEYS, where, required=("shape", "dtype"))
    shape = _check_ints(spec["shape"], f"{where}.shape", limits, what="shape")
    _check_dtype(spec["dtype"], f"{where}.dtype")
    if spec.get("device") is not None:
        _check_device(spec["device"], f"{where}.device")
    stride = None
    if spec.get("stride") is not None:
        stride = _check_ints(spec["stride"], f"{where}.stride", limits, what="stride")
        if len(stride) != len(shape):
            raise _Violation(f"{where}.stride", f"{len(stride)} strides for {len(shape)} dimensions")
    offset = spec.get("storage_offset", 0)
    _expect(offset, int, f"{where}.storage_offset", "an integer")
    if offset < 0:
        raise _Violation(f"{where}.storage_offset", f"must be >= 0, got {offset}")
    for key in ("low", "high", "mean", "std"):
        _check_number(spec.get(key), f"{where}.{key}")
    elements = _storage_elements(shape, stride, offset)
    if elements > limits.max_tensor_elements:
        included = f" (storage offset {offset} included)" if offset else ""
        raise _Violation(where, f"shape {shape} needs {elements} elements of storage{included}, over the limit of "
                         f"{limits.max_tensor_elements} per tensor (see forge.plan_schema.PlanLimits)")
    return elements


def _storage_elements(shape: list[int], stride: list[int] | None, offset: int) -> int:
    """What `TensorSpec.draw` allocates: the storage a strided view needs, offset included."""
    if any(size == 0 for size in shape):
        return offset
    if stride is None:
        return offset + math.prod(shape)
    return offset + 1 + sum((size - 1) * step for size, step in zip(shape, stride, strict=True))
