"""Comparisons of one candidate result against what was expected, each returning a readable problem or None.

Outputs are walked as trees of tuples, lists and dicts; a leaf is named by a locator such as `output`,
`output[0]` or `output["x"]` (and `args[0]`, `kwargs["weight"]` for inputs). The structure check insists on the
same container types, the same tensor type (exactly `torch.Tensor` where the reference returns a plain tensor:
subclasses can defer or fake computation), shape, dtype, device and layout, and equal non-tensor leaves. Value
checks report the number of bad elements, the max abs and rel error, the worst index and the expected and actual
values there, as a `forge.outcome.ValidationIssue` (`*_mismatch_issue`; its string is the message) with the few
worst elements as rows for the fix prompt's table.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from forge.outcome import MismatchRow, Outcome, ValidationIssue

__all__ = [
    "MISMATCH_ROWS",
    "ContainerNode",
    "TensorMeta",
    "ValueLeaf",
    "bits_equal",
    "bits_mismatch",
    "exact_mismatch",
    "exact_mismatch_issue",
    "float_mismatch",
    "float_mismatch_issue",
    "iter_tensor_leaves",
    "skeleton_of",
    "special_codes",
    "structure_errors",
    "tensor_leaves_of_skeleton",
]

# Codes for non-finite values, so placements can be compared with one equality.
FINITE, NAN, POS_INF, NEG_INF = 0, 1, 2, 3
_SPECIAL_VALUES = {NAN: "NaN", POS_INF: "+inf", NEG_INF: "-inf"}
# Worst elements kept per value mismatch (the fix prompt's table).
MISMATCH_ROWS = 5


@dataclass(frozen=True)
class TensorMeta:
    """Everything about a tensor leaf except its values."""

    type: type
    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    layout: torch.layout

    @classmethod
    def of(cls, tensor: torch.Tensor) -> TensorMeta:
        return cls(type(tensor), tuple(tensor.shape), tensor.dtype, tensor.device, tensor.layout)

    def describe(self) -> str:
        text = f"{str(self.dtype).removeprefix('torch.')}[{', '.join(map(str, self.shape))}] on {self.device}"
        if self.layout != torch.strided:
            text += f" ({self.layout})"
        return text


@dataclass(frozen=True)
class ContainerNode:
    """A tuple, list or dict in an output tree: its exact type and its children (a tuple, or a dict by key)."""

    kind: type
    children: tuple | dict


@dataclass(frozen=True)
class ValueLeaf:
    """A non-tensor leaf; the candidate's value must be equal (same type, same value; NaN equals NaN)."""

    value: Any


Skeleton = TensorMeta | ContainerNode | ValueLeaf


def _is_container(value: Any) -> bool:
    return isinstance(value, (tuple, list, dict)) and not isinstance(value, torch.Size)


def skeleton_of(value: Any) -> Skeleton:
    """The structure of an output: containers and tensor metadata, with non-tensor leaves kept as values."""
    if isinstance(value, torch.Tensor):
        return TensorMeta.of(value)
    if isinstance(value, dict):
        return ContainerNode(type(value), {k: skeleton_of(v) for k, v in value.items()})
    if _is_container(value):
        return ContainerNode(type(value), tuple(skeleton_of(v) for v in value))
    return ValueLeaf(value)


def _child_locator(locator: str, key: Any) -> str:
    return f"{locator}[{key!r}]".replace("'", '"') if isinstance(key, str) else f"{locator}[{key}]"


def iter_tensor_leaves(value: Any, locator: str) -> Iterator[tuple[str, torch.Tensor]]:
    """`(locator, tensor)` for every tensor inside nested tuples, lists and dicts, in order."""
    if isinstance(value, torch.Tensor):
        yield locator, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from iter_tensor_leaves(v, _child_locator(locator, k))
    elif _is_container(value):
        for i, v in enumerate(value):
            yield from iter_tensor_leaves(v, _child_locator(locator, i))


def tensor_leaves_of_skeleton(skeleton: Skeleton, locator: str) -> Iterator[tuple[str, TensorMeta]]:
    """`(locator, TensorMeta)` for every tensor leaf of a skeleton, in the order of `iter_tensor_leaves`."""
    if isinstance(skeleton, TensorMeta):
        yield locator, skeleton
    elif isinstance(skeleton, ContainerNode):
        items = skeleton.children.items() if isinstance(skeleton.children, dict) else enumerate(skeleton.children)
        for k, child in items:
            yield from tensor_leaves_of_skeleton(child, _child_locator(locator, k))


def _type_name(value: Any) -> str:
    kind = type(value)
    return kind.__qualname__ if kind.__module__ in ("builtins", "torch") else f"{kind.__module__}.{kind.__qualname__}"


def _values_equal(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and math.isnan(a) and math.isnan(b):
        return True
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - exotic __eq__: fall back to identity
        return a is b


def structure_errors(expected: Skeleton, got: Any, locator: str) -> list[str]:
    """Problems with the shape of `got` against the reference skeleton (empty when the structure matches)."""
    if isinstance(expected, TensorMeta):
        if not isinstance(got, torch.Tensor):
            return [f"{locator}: expected a tensor {expected.describe()}, got {_type_name(got)} {_short_repr(got)}"]
        if type(got) is not expected.type:
            if expected.type is torch.Tensor:
                return [
                    f"{locator}: got a {_type_name(got)}, a torch.Tensor subclass; a kernel must return a plain "
                    "torch.Tensor (subclasses can defer or fake the computation)"
                ]
            return [f"{locator}: expected a {_type_name(expected)} tensor, got a {_type_name(got)}"]
        problems = []
        if tuple(got.shape) != expected.shape:
            problems.append(f"shape {list(got.shape)} instead of {list(expected.shape)}")
        if got.dtype != expected.dtype:
            problems.append(f"dtype {got.dtype} instead of {expected.dtype}")
        if got.device != expected.device:
            problems.append(f"device {got.device} instead of {expected.device}")
        if got.layout != expected.layout:
            problems.append(f"layout {got.layout} instead of {expected.layout}")
        if problems:
            return [f"{locator}: wrong tensor metadata: " + ", ".join(problems) + f" (expected {expected.describe()})"]
        return []
    if isinstance(expected, ContainerNode):
        if type(got) is not expected.kind:
            return [f"{locator}: expected a {expected.kind.__qualname__}, got {_type_name(got)} {_short_repr(got)}"]
        if isinstance(expected.children, dict):
            if list(got.keys()) != list(expected.children.keys()):
                return [f"{locator}: expected keys {list(expected.children)}, got keys {list(got.keys())}"]
            pairs = [(_child_locator(locator, k), child, got[k]) for k, child in expected.children.items()]
        else:
            if len(got) != len(expected.children):
                return [f"{locator}: expected {len(expected.children)} elements, got {len(got)}"]
            pairs = [(_child_locator(locator, i), child, got[i]) for i, child in enumerate(expected.children)]
        errors: list[str] = []
        for child_locator, child, value in pairs:
            errors += structure_errors(child, value, child_locator)
        return errors
    if not _values_equal(expected.value, got):
        return [
            f"{locator}: expected {_type_name(expected.value)} {_short_repr(expected.value)}, "
            f"got {_type_name(got)} {_short_repr(got)}"
        ]
    return []


def _short_repr(value: Any, limit: int = 80) -> str:
    if isinstance(value, torch.Tensor):
        return TensorMeta.of(value).describe()
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a broken __repr__ must not break the report
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---------------------------------------------------------------------------------------------------------
# Values
# ---------------------------------------------------------------------------------------------------------
def as_real(tensor: torch.Tensor) -> torch.Tensor:
    """Complex tensors as their real view (an extra trailing dim of 2); others unchanged."""
    return torch.view_as_real(tensor.resolve_conj()) if tensor.is_complex() else tensor


def special_codes(values64: torch.Tensor) -> torch.Tensor:
    """int8 codes per element: 0 finite, 1 NaN, 2 +inf, 3 -inf."""
    codes = torch.zeros(values64.shape, dtype=torch.int8, device=values64.device)
    codes[torch.isnan(values64)] = NAN
    codes[torch.isposinf(values64)] = POS_INF
    codes[torch.isneginf(values64)] = NEG_INF
    return codes


def _unravel(flat_index: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    index = []
    for size in reversed(shape):
        index.append(flat_index % size if size else 0)
        flat_index = flat_index // size if size else 0
    return tuple(reversed(index))


def _fmt(value: float) -> str:
    return f"{value:.6g}"


def _first_index(mask: torch.Tensor) -> tuple[int, ...]:
    flat = int(torch.nonzero(mask.reshape(-1))[0].item())
    return _unravel(flat, tuple(mask.shape))


def float_mismatch(
    got: torch.Tensor, reference: torch.Tensor, allowed: torch.Tensor, special: torch.Tensor
) -> str | None:
    """Problem with a floating (or complex) leaf as text, or None (see `float_mismatch_issue`)."""
    issue = float_mismatch_issue(got, reference, allowed, special)
    return None if issue is None else issue.message


def _expected_value(reference: torch.Tensor, special: torch.Tensor, index: tuple[int, ...]) -> float | str:
    kind = int(special[index].item())
    return float(reference[index].item()) if kind == FINITE else _SPECIAL_VALUES[kind]


def float_mismatch_issue(
    got: torch.Tensor, reference: torch.Tensor, allowed: torch.Tensor, special: torch.Tensor
) -> ValidationIssue | None:
    """Problem with a floating (or complex) leaf, or None, as a `ValidationIssue` with the counts, max errors,
    the worst index and up to `MISMATCH_ROWS` worst elements.

    `reference` (float64) and `allowed` hold the expected value and allowance where `special` (see
    `special_codes`, computed from eager output) is finite; NaN and ±inf must sit exactly where `special` says.
    """
    values = as_real(got).detach().to(torch.float64)
    got_special = special_codes(values)
    misplaced = got_special != special
    shape = tuple(values.shape)
    if bool(misplaced.any()):
        count = int(misplaced.sum().item())
        flat = torch.nonzero(misplaced.reshape(-1))[:MISMATCH_ROWS, 0].tolist()
        rows = tuple(
            MismatchRow(index, _expected_value(reference, special, index), float(values[index].item()))
            for index in (_unravel(int(f), shape) for f in flat)
        )
        first = rows[0]
        expected_text = _fmt(first.expected) if isinstance(first.expected, float) else first.expected
        message = (
            f"{count} of {values.numel()} elements have NaN/inf where the reference does not (or the reverse); "
            f"first at index {first.index}: expected {expected_text}, got {_fmt(float(first.got))}"
        )
        return ValidationIssue(message, kind=Outcome.MISMATCH, bad_elements=count, elements=values.numel(),
                               worst_index=first.index, expected=first.expected, got=first.got, rows=rows)
    finite = special == FINITE
    error = torch.where(finite, (values - reference).abs(), torch.zeros((), dtype=torch.float64, device=values.device))
    allowed = allowed.to(torch.float64)
    bad = error > allowed
    if not bool(bad.any()):
        return None
    ratio = torch.where(bad, error / allowed.clamp_min(torch.finfo(torch.float64).tiny), torch.zeros_like(error))
    count = int(bad.sum().item())
    order = ratio.reshape(-1).topk(min(MISMATCH_ROWS, count)).indices.tolist()
    rows = tuple(
        MismatchRow(index, float(reference[index].item()), float(values[index].item()),
                    float(error[index].item()), float(allowed[index].item()))
        for index in (_unravel(int(f), shape) for f in order)
    )
    worst = rows[0]
    magnitude = reference.abs()
    relative = torch.where(error > 0, error / magnitude, torch.zeros_like(error))
    max_abs, max_rel = float(error.max().item()), float(relative.max().item())
    message = (
        f"{count} of {values.numel()} elements outside tolerance: "
        f"max abs error {max_abs:.3g}, max rel error {max_rel:.3g}; "
        f"worst at index {worst.index}: expected {_fmt(float(worst.expected))}, "
        f"got {_fmt(float(worst.got))} (allowed error {worst.allowed:.3g})"
    )
    return ValidationIssue(message, kind=Outcome.MISMATCH, bad_elements=count, elements=values.numel(),
                           max_abs_error=max_abs, max_rel_error=max_rel, worst_index=worst.index,
                           expected=worst.expected, got=worst.got, allowed=worst.allowed, rows=rows)


def exact_mismatch(got: torch.Tensor, expected: torch.Tensor) -> str | None:
    """Problem with an integer or bool leaf (must be exactly equal) as text, or None."""
    issue = exact_mismatch_issue(got, expected)
    return None if issue is None else issue.message


def exact_mismatch_issue(got: torch.Tensor, expected: torch.Tensor) -> ValidationIssue | None:
    """Problem with an integer or bool leaf (must be exactly equal), or None, as a `ValidationIssue` with the first
    `MISMATCH_ROWS` differing elements."""
    if torch.equal(got, expected):
        return None
    diff = got != expected
    shape = tuple(diff.shape)
    flat = torch.nonzero(diff.reshape(-1))[:MISMATCH_ROWS, 0].tolist()
    rows = tuple(MismatchRow(index, _plain(expected[index].item()), _plain(got[index].item()))
                 for index in (_unravel(int(f), shape) for f in flat))
    first = rows[0]
    count = int(diff.sum().item())
    message = (
        f"{count} of {got.numel()} elements differ (integer/bool outputs must match exactly); "
        f"first at index {first.index}: expected {expected[first.index].item()}, got {got[first.index].item()}"
    )
    return ValidationIssue(message, kind=Outcome.MISMATCH, bad_elements=count, elements=got.numel(),
                           worst_index=first.index, expected=first.expected, got=first.got, rows=rows)


def _plain(value: Any) -> float:
    return float(value)


_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bit_difference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Mask of elements whose bits differ, treating any NaN as equal to any NaN."""
    a, b = as_real(a.detach()), as_real(b.detach())
    if a.dtype == torch.bool:
        return a != b
    if a.dtype.is_floating_point:
        view = _INT_VIEW[a.element_size()]
        differ = a.view(view) != b.view(view)
        both_nan = torch.isnan(a.to(torch.float64)) & torch.isnan(b.to(torch.float64))
        return differ & ~both_nan
    return a != b


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, dtype and bits (NaN-aware: any NaN equals any NaN; -0.0 differs from 0.0)."""
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        return False
    return not bool(_bit_difference(a, b).any())


def bits_mismatch(
    first: torch.Tensor, second: torch.Tensor, names: tuple[str, str] = ("first", "second")
) -> str | None:
    """Where two tensors of the same metadata differ bitwise (NaN-aware), or None."""
    if first.shape != second.shape or first.dtype != second.dtype or first.device != second.device:
        return (
            f"metadata differs: {TensorMeta.of(first).describe()} ({names[0]}) vs "
            f"{TensorMeta.of(second).describe()} ({names[1]})"
        )
    diff = _bit_difference(first, second)
    if not bool(diff.any()):
        return None
    a, b = as_real(first.detach()), as_real(second.detach())
    index = _first_index(diff)
    return (
        f"{int(diff.sum().item())} of {diff.numel()} elements differ; first at index {index}: "
        f"{names[0]} {a[index].item()!r}, {names[1]} {b[index].item()!r}"
    )
