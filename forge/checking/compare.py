"""Comparisons of one candidate result against what was expected, each returning a readable problem or None.

Outputs are walked as trees of tuples, lists and dicts; a leaf is named by a locator such as `output`,
`output[0]` or `output["x"]` (and `args[0]`, `kwargs["weight"]` for inputs). The structure check insists on the
same container types, the same tensor type (exactly `torch.Tensor` where the reference returns a plain tensor:
subclasses can defer or fake computation), shape, dtype, device and layout, and equal non-tensor leaves. Value
checks report the number of bad elements, the max abs and rel error, the worst index and the expected and actual
values there, as a `forge.outcome.ValidationIssue` (`*_mismatch_issue`; its string is the message) with the few
worst elements as rows for the fix prompt's table.

Every elementwise check walks its tensors in flat row-major pieces (`iter_pieces`, `CPU_CHUNK_ELEMENTS` /
`CUDA_CHUNK_ELEMENTS` elements each), so its float64 temporaries are a constant size rather than a multiple of the
output (measured: a whole-tensor comparison of a 7.5 GB fp32 output held ~4 float64 copies of it, 60 GB). A passing
leaf costs one synchronisation; the details of a failing one (worst elements, first index) take a second pass.
`fingerprint` lets runs be compared bitwise without keeping an earlier run's output.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from forge.checking.tolerance import outlier_budget
from forge.outcome import MismatchRow, Outcome, ValidationIssue
from forge.text import clip

__all__ = [
    "CPU_CHUNK_ELEMENTS",
    "CUDA_CHUNK_ELEMENTS",
    "MISMATCH_ROWS",
    "ContainerNode",
    "TensorMeta",
    "ValueLeaf",
    "bits_equal",
    "bits_mismatch",
    "block_piece",
    "chunk_elements",
    "exact_mismatch",
    "exact_mismatch_issue",
    "float_mismatch",
    "float_mismatch_issue",
    "fingerprint",
    "fingerprint_mismatch",
    "flat_blocks",
    "iter_pieces",
    "iter_tensor_leaves",
    "skeleton_of",
    "special_codes",
    "special_codes_piece",
    "structure_errors",
    "tensor_leaves_of_skeleton",
    "unchanged_after_upcast",
]

# Codes for non-finite values, so placements can be compared with one equality.
FINITE, NAN, POS_INF, NEG_INF = 0, 1, 2, 3
_SPECIAL_VALUES = {NAN: "NaN", POS_INF: "+inf", NEG_INF: "-inf"}
# Worst elements kept per value mismatch (the fix prompt's table).
MISMATCH_ROWS = 5
# Elements per piece of the elementwise checks (`iter_pieces`). A piece costs a few float64 temporaries: 8 MB each
# on the CPU (1M elements; with 2M or 4M, 16-32 MB temporaries fall under glibc's dynamic mmap threshold, come from
# the heap and stay resident after use: the oracle's peak on a 128 MB fp32 GroupNorm rose from 2.65x to 3.6x its
# inputs + outputs, measured as anonymous resident memory), 128 MB on CUDA (16M elements), where each kernel's launch
# (~10 us) stays small next to its memory traffic (~0.1 ms per float64 pass on an H200) and the caching allocator
# reuses the same blocks piece after piece.
CPU_CHUNK_ELEMENTS = 1 << 20
CUDA_CHUNK_ELEMENTS = 1 << 24


@dataclass(frozen=True)
class TensorMeta:
    """Everything about a tensor leaf except its values."""

    type: type
    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    layout: torch.layout
    # The strides the reference returned: compared only where a kernel replaces a call inside a model
    # (`structure_errors(..., strides=True)`), never part of equality.
    stride: tuple[int, ...] | None = field(default=None, compare=False)

    @classmethod
    def of(cls, tensor: torch.Tensor) -> TensorMeta:
        stride = tuple(tensor.stride()) if tensor.layout == torch.strided else None
        return cls(type(tensor), tuple(tensor.shape), tensor.dtype, tensor.device, tensor.layout, stride)

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


def _memory_formats(shape: tuple[int, ...], stride: tuple[int, ...]) -> set[torch.memory_format]:
    """The standard memory formats a layout is dense in (empty: a layout of its own, e.g. a transpose kept)."""
    meta = torch.empty_strided(shape, stride, device="meta")
    formats = {torch.contiguous_format, torch.channels_last, torch.channels_last_3d}
    usable = {f for f in formats if (f is torch.contiguous_format or len(shape) == (4 if f is torch.channels_last
                                                                                     else 5))}
    return {f for f in usable if meta.is_contiguous(memory_format=f)}


def layout_error(expected: TensorMeta, got: torch.Tensor) -> str | None:
    """The stride problem of `got` against the reference's layout, or None when it does not matter.

    Why a kernel must return PyTorch's layout: the model's later code was written for it. A `view` of an output
    with other strides raises, and ops reading a transposed or NHWC tensor where PyTorch handed them an NCHW one
    take other paths or copy, which the kernel's own timing never sees. Where PyTorch keeps an input's odd layout
    (an elementwise op on a transpose), a row-major output is accepted: `view` works on it and it is what
    `x.contiguous()` + `torch.empty_like` kernels return. Dimensions of size 1 (any stride addresses the same
    element) and empty tensors are not compared."""
    if expected.stride is None or got.layout != torch.strided or got.numel() == 0:
        return None
    sizes = tuple(got.shape)
    mine = tuple(s for n, s in zip(sizes, got.stride(), strict=True) if n > 1)
    theirs = tuple(s for n, s in zip(sizes, expected.stride, strict=True) if n > 1)
    if mine == theirs:
        return None
    if got.is_contiguous() and not _memory_formats(sizes, expected.stride):
        return None
    return (f"strides {list(got.stride())} instead of PyTorch's {list(expected.stride)}: return the layout PyTorch "
            "returns for these inputs (the model's later ops were written for it: `view` fails and other ops copy "
            "on another layout)")


def structure_errors(expected: Skeleton, got: Any, locator: str, *, strides: bool = False) -> list[str]:
    """Problems with the shape of `got` against the reference skeleton (empty when the structure matches);
    `strides`: also the layout (`layout_error`)."""
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
        layout = layout_error(expected, got) if strides else None
        return [f"{locator}: wrong layout: {layout}"] if layout else []
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
            errors += structure_errors(child, value, child_locator, strides=strides)
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
    return clip(text, limit, collapse=False)


# ---------------------------------------------------------------------------------------------------------
# Values
# ---------------------------------------------------------------------------------------------------------
def as_real(tensor: torch.Tensor) -> torch.Tensor:
    """Complex tensors as their real view (an extra trailing dim of 2); others unchanged."""
    return torch.view_as_real(tensor.resolve_conj()) if tensor.is_complex() else tensor


# ---------------------------------------------------------------------------------------------------------
# Flat chunks: every elementwise check walks its tensors in row-major pieces of at most `chunk_elements`
# elements, so its float64 temporaries stay a constant size instead of a multiple of the output.
# ---------------------------------------------------------------------------------------------------------
Block = tuple[tuple[int, ...], tuple[int, int] | None]


def chunk_elements(device: torch.device | str) -> int:
    """Elements per piece: `CPU_CHUNK_ELEMENTS` on the CPU, `CUDA_CHUNK_ELEMENTS` on an accelerator."""
    return CPU_CHUNK_ELEMENTS if torch.device(device).type == "cpu" else CUDA_CHUNK_ELEMENTS


def flat_blocks(shape: tuple[int, ...], limit: int) -> Iterator[Block]:
    """Row-major blocks covering a tensor of `shape`, each of at most `limit` elements, in order.

    A block is `(leading indices, (start, length) along the next dim, or None for all of it)`; `block_piece`
    cuts it from any tensor of that shape, so tensors of different strides are walked in the same pieces."""
    yield from _blocks(tuple(shape), max(1, limit), ())


def _blocks(shape: tuple[int, ...], limit: int, prefix: tuple[int, ...]) -> Iterator[Block]:
    if not shape or math.prod(shape) <= limit:
        yield prefix, None
        return
    row = math.prod(shape[1:])
    if row <= limit:
        step = limit // row
        for start in range(0, shape[0], step):
            yield prefix, (start, min(step, shape[0] - start))
    else:
        for index in range(shape[0]):
            yield from _blocks(shape[1:], limit, prefix + (index,))


def block_piece(tensor: torch.Tensor, block: Block) -> torch.Tensor:
    """The 1-d piece of `tensor` a block covers (a view when the tensor is contiguous, else a small copy)."""
    prefix, span = block
    piece = tensor[prefix] if prefix else tensor
    if span is not None:
        piece = piece.narrow(0, span[0], span[1])
    return piece.reshape(-1)


def iter_pieces(*tensors: torch.Tensor | None) -> Iterator[tuple[int, tuple[torch.Tensor | None, ...]]]:
    """`(flat offset, pieces)` over tensors of the same shape (None stays None), chunked for the first's device."""
    first = tensors[0]
    assert first is not None
    offset = 0
    for block in flat_blocks(tuple(first.shape), chunk_elements(first.device)):
        pieces = tuple(None if t is None else block_piece(t, block) for t in tensors)
        yield offset, pieces
        offset += pieces[0].numel()


def _comparable(piece: torch.Tensor) -> torch.Tensor:
    """A floating piece in a dtype that `isnan`/`isinf` support (float8 has none of them: use float32)."""
    return piece.to(torch.float32) if piece.is_floating_point() and piece.element_size() == 1 else piece


def special_codes(values: torch.Tensor) -> torch.Tensor:
    """int8 codes per element: 0 finite, 1 NaN, 2 +inf, 3 -inf (any floating dtype; computed in pieces)."""
    codes = torch.zeros(values.shape, dtype=torch.int8, device=values.device)
    for _, (piece, out) in iter_pieces(values, codes):
        out.copy_(special_codes_piece(piece))
    return codes


def special_codes_piece(piece: torch.Tensor) -> torch.Tensor:
    """`special_codes` of one piece, in one go (its temporaries are the size of the piece)."""
    piece = _comparable(piece)
    codes = torch.zeros(piece.shape, dtype=torch.int8, device=piece.device)
    codes.masked_fill_(torch.isnan(piece), NAN)
    codes.masked_fill_(torch.isposinf(piece), POS_INF)
    codes.masked_fill_(torch.isneginf(piece), NEG_INF)
    return codes


def _unravel(flat_index: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    index = []
    for size in reversed(shape):
        index.append(flat_index % size if size else 0)
        flat_index = flat_index // size if size else 0
    return tuple(reversed(index))


def _fmt(value: float) -> str:
    return f"{value:.6g}"


def _total(counts: list[torch.Tensor]) -> int:
    """Sum of per-piece device counts, with one synchronisation."""
    return int(torch.stack(counts).sum().item()) if counts else 0


def float_mismatch(
    got: torch.Tensor, reference: torch.Tensor, allowed: torch.Tensor, special: torch.Tensor | None
) -> str | None:
    """Problem with a floating (or complex) leaf as text, or None (see `float_mismatch_issue`)."""
    issue = float_mismatch_issue(got, reference, allowed, special)
    return None if issue is None else issue.message


def _expected_value(reference: torch.Tensor, special: torch.Tensor | None, index: tuple[int, ...]) -> float | str:
    kind = FINITE if special is None else int(special[index].item())
    return float(reference[index].item()) if kind == FINITE else _SPECIAL_VALUES[kind]


def _misplaced(values64: torch.Tensor, special: torch.Tensor | None) -> torch.Tensor:
    return ~torch.isfinite(values64) if special is None else special_codes_piece(values64) != special


def _abs_error(values64: torch.Tensor, reference: torch.Tensor, special: torch.Tensor | None) -> torch.Tensor:
    error = (values64 - reference.to(torch.float64)).abs()
    return error if special is None else torch.where(special == FINITE, error, torch.zeros((), dtype=error.dtype,
                                                                                         device=error.device))


def float_mismatch_issue(
    got: torch.Tensor, reference: torch.Tensor, allowed: torch.Tensor, special: torch.Tensor | None,
    *, tail: torch.Tensor | None = None, budget: int | torch.Tensor | None = None,
) -> ValidationIssue | None:
    """Problem with a floating (or complex) leaf, or None, as a `ValidationIssue` with the counts, max errors,
    the worst index and up to `MISMATCH_ROWS` worst elements.

    `reference` (float64 or float32) and `allowed` hold the expected value and allowance where `special` (see
    `special_codes`, computed from eager output; None when every element is finite) is finite; NaN and ±inf must
    sit exactly where `special` says. With `tail` (0-dim: `forge.checking.tolerance.tail_allowance`), up to
    `budget` elements (default `outlier_budget(numel)`; the expectation's own counts eager's outliers too) may exceed
    their allowance when none exceeds `max(allowance, tail)`: a kernel with another rounding order than PyTorch's (an
    online softmax, bf16 probabilities before the value product) has its own rare worst elements, elsewhere than
    eager's. Checked in flat pieces (`iter_pieces`) with one synchronisation when the leaf passes; the details of a
    failure take a second pass.
    """
    values = as_real(got.detach())
    tensors = (values, reference, allowed, special)
    if special is None and _all_within(tensors):
        return None
    misplaced_counts: list[torch.Tensor] = []
    bad_counts: list[torch.Tensor] = []
    severe_counts: list[torch.Tensor] = []
    if tail is None:
        budget = 0
    else:
        budget = outlier_budget(values.numel()) if budget is None else int(budget)
    for _, (v, r, a, s) in iter_pieces(*tensors):
        v64 = v.to(torch.float64)
        misplaced_counts.append(_misplaced(v64, s).sum())
        error, a64 = _abs_error(v64, r, s), a.to(torch.float64)
        bad_counts.append((error > a64).sum())
        if budget:
            severe_counts.append((error > torch.maximum(a64, tail.to(a64.device))).sum())
    misplaced = _total(misplaced_counts)
    if misplaced:
        return _misplaced_issue(tensors, misplaced)
    bad = _total(bad_counts)
    if bad and bad <= budget and not _total(severe_counts):
        return None  # a few outliers, each within PyTorch's own worst error (times the factor)
    return _out_of_tolerance_issue(tensors, bad, budget) if bad else None


def _all_within(tensors: tuple[torch.Tensor | None, ...]) -> bool:
    """The passing case in four kernels per piece: every element finite (its sum is) and within its allowance
    (a NaN or inf fails `<=`). The error is computed in the wider of the two dtypes (float64 for float32 outputs)."""
    passed: list[torch.Tensor] = []
    for _, (v, r, a, _s) in iter_pieces(*tensors):
        within = (torch.sub(v, r).abs_() <= a).all()
        passed.append(within & torch.isfinite(v.sum()))
    return bool(torch.stack(passed).all().item()) if passed else True


def _misplaced_issue(tensors: tuple[torch.Tensor | None, ...], count: int) -> ValidationIssue:
    values, reference, _, special = tensors
    shape, numel = tuple(values.shape), values.numel()
    flat: list[int] = []
    for offset, (v, _r, _a, s) in iter_pieces(*tensors):
        hits = torch.nonzero(_misplaced(v.to(torch.float64), s))[: MISMATCH_ROWS - len(flat), 0].tolist()
        flat += [offset + int(h) for h in hits]
        if len(flat) >= MISMATCH_ROWS:
            break
    rows = tuple(
        MismatchRow(index, _expected_value(reference, special, index), float(values[index].item()))
        for index in (_unravel(f, shape) for f in flat)
    )
    first = rows[0]
    expected_text = _fmt(first.expected) if isinstance(first.expected, float) else first.expected
    message = (
        f"{count} of {numel} elements have NaN/inf where the reference does not (or the reverse); "
        f"first at index {first.index}: expected {expected_text}, got {_fmt(float(first.got))}"
    )
    return ValidationIssue(message, kind=Outcome.MISMATCH, bad_elements=count, elements=numel,
                           worst_index=first.index, expected=first.expected, got=first.got, rows=rows)


def _out_of_tolerance_issue(tensors: tuple[torch.Tensor | None, ...], count: int, budget: int = 0) -> ValidationIssue:
    values = tensors[0]
    shape, numel = tuple(values.shape), values.numel()
    tiny = torch.finfo(torch.float64).tiny
    max_abs: list[torch.Tensor] = []
    max_rel: list[torch.Tensor] = []
    candidates: list[torch.Tensor] = []  # per piece: rows of (ratio, flat index, expected, got, error, allowed)
    for offset, (v, r, a, s) in iter_pieces(*tensors):
        v64, r64, a64 = v.to(torch.float64), r.to(torch.float64), a.to(torch.float64)
        error = _abs_error(v64, r64, s)
        bad = error > a64
        zero = torch.zeros((), dtype=torch.float64, device=error.device)
        ratio = torch.where(bad, error / a64.clamp_min(tiny), zero)
        max_abs.append(error.max() if error.numel() else zero)
        relative = torch.where(error > 0, error / r64.abs(), zero)
        max_rel.append(relative.max() if relative.numel() else zero)
        top = ratio.topk(min(MISMATCH_ROWS, ratio.numel())).indices
        candidates.append(torch.stack([ratio[top], (top + offset).to(torch.float64), r64[top], v64[top], error[top],
                                       a64[top]], dim=1))
    table = torch.cat(candidates)
    table = table[table[:, 0].topk(min(MISMATCH_ROWS, count)).indices].tolist()
    rows = tuple(
        MismatchRow(_unravel(int(flat), shape), expected, got, error, allowed)
        for _ratio, flat, expected, got, error, allowed in table
    )
    worst = rows[0]
    abs_error, rel_error = float(torch.stack(max_abs).max().item()), float(torch.stack(max_rel).max().item())
    message = (
        f"{count} of {numel} elements outside tolerance: "
        f"max abs error {abs_error:.3g}, max rel error {rel_error:.3g}; "
        f"worst at index {worst.index}: expected {_fmt(float(worst.expected))}, "
        f"got {_fmt(float(worst.got))} (allowed error {worst.allowed:.3g})"
    )
    if budget:
        message += f"; {budget} may exceed it within PyTorch's own worst error"
    return ValidationIssue(message, kind=Outcome.MISMATCH, bad_elements=count, elements=numel,
                           max_abs_error=abs_error, max_rel_error=rel_error, worst_index=worst.index,
                           expected=worst.expected, got=worst.got, allowed=worst.allowed, rows=rows)


def exact_mismatch(got: torch.Tensor, expected: torch.Tensor) -> str | None:
    """Problem with an integer or bool leaf (must be exactly equal) as text, or None."""
    issue = exact_mismatch_issue(got, expected)
    return None if issue is None else issue.message


def exact_mismatch_issue(got: torch.Tensor, expected: torch.Tensor) -> ValidationIssue | None:
    """Problem with an integer or bool leaf (must be exactly equal), or None, as a `ValidationIssue` with the first
    `MISMATCH_ROWS` differing elements."""
    counts, flat = _differences(got, expected, lambda a, b: a != b)
    count = _total(counts)
    if not count:
        return None
    shape = tuple(got.shape)
    rows = tuple(MismatchRow(index, _plain(expected[index].item()), _plain(got[index].item()))
                 for index in (_unravel(f, shape) for f in flat(MISMATCH_ROWS)))
    first = rows[0]
    message = (
        f"{count} of {got.numel()} elements differ (integer/bool outputs must match exactly); "
        f"first at index {first.index}: expected {expected[first.index].item()}, got {got[first.index].item()}"
    )
    return ValidationIssue(message, kind=Outcome.MISMATCH, bad_elements=count, elements=got.numel(),
                           worst_index=first.index, expected=first.expected, got=first.got, rows=rows)


def _plain(value: Any) -> float:
    return float(value)


def _differences(
    a: torch.Tensor, b: torch.Tensor, differ: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
) -> tuple[list[torch.Tensor], Callable[[int], list[int]]]:
    """Per-piece counts of `differ(piece_a, piece_b)` and a function giving the first `n` differing flat indices."""
    counts = [differ(pa, pb).sum() for _, (pa, pb) in iter_pieces(a, b)]

    def first(n: int) -> list[int]:
        found: list[int] = []
        for offset, (pa, pb) in iter_pieces(a, b):
            found += [offset + int(h) for h in torch.nonzero(differ(pa, pb))[: n - len(found), 0].tolist()]
            if len(found) >= n:
                break
        return found

    return counts, first


_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bit_difference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Mask of elements whose bits differ, treating any NaN as equal to any NaN (1-d pieces of one dtype)."""
    if a.dtype == torch.bool:
        return a != b
    if a.dtype.is_floating_point:
        view = _INT_VIEW[a.element_size()]
        differ = a.view(view) != b.view(view)
        both_nan = torch.isnan(_comparable(a)) & torch.isnan(_comparable(b))
        return differ & ~both_nan
    return a != b


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, dtype and bits (NaN-aware: any NaN equals any NaN; -0.0 differs from 0.0)."""
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        return False
    return bits_mismatch(a, b) is None


def bits_mismatch(
    first: torch.Tensor, second: torch.Tensor, names: tuple[str, str] = ("first", "second")
) -> str | None:
    """Where two tensors of the same metadata differ bitwise (NaN-aware), or None (compared in pieces)."""
    if first.shape != second.shape or first.dtype != second.dtype or first.device != second.device:
        return (
            f"metadata differs: {TensorMeta.of(first).describe()} ({names[0]}) vs "
            f"{TensorMeta.of(second).describe()} ({names[1]})"
        )
    a, b = as_real(first.detach()), as_real(second.detach())
    if _same_bits(a, b):
        return None
    counts, flat = _differences(a, b, _bit_difference)
    count = _total(counts)
    if not count:
        return None
    index = _unravel(flat(1)[0], tuple(a.shape))
    return (
        f"{count} of {a.numel()} elements differ; first at index {index}: "
        f"{names[0]} {a[index].item()!r}, {names[1]} {b[index].item()!r}"
    )


def _int_view(piece: torch.Tensor) -> torch.Tensor:
    return piece.view(_INT_VIEW[piece.element_size()]) if piece.is_floating_point() else piece


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-for-bit equal, NaN payloads included (the fast path; NaNs of different payloads fall to the slow one)."""
    if a.device.type == "cpu":
        return all(torch.equal(_int_view(pa), _int_view(pb)) for _, (pa, pb) in iter_pieces(a, b))
    differ = [(_int_view(pa) != _int_view(pb)).any() for _, (pa, pb) in iter_pieces(a, b)]
    return not bool(torch.stack(differ).any().item()) if differ else True


_WEIGHTS: dict[tuple[str, int, torch.dtype], torch.Tensor] = {}


def _fingerprint_weights(device: torch.device, length: int, dtype: torch.dtype) -> torch.Tensor:
    """Two rows of fixed pseudo-random odd weights of `dtype` (int32 or int64), one per position of a piece, drawn
    once per device at the full piece size (so a piece's weights never change between runs): at most 2 x 8 bytes
    per element of a piece, 16 MB on the CPU, 256 MB on CUDA."""
    size = chunk_elements(device)
    key = (str(device), size, dtype)
    weights = _WEIGHTS.get(key)
    if weights is None:
        info = torch.iinfo(dtype)
        generator = torch.Generator().manual_seed(0x5EED)
        drawn = torch.randint(info.min, info.max, (2, size), generator=generator, dtype=dtype)
        weights = _WEIGHTS[key] = torch.bitwise_or(drawn, 1).to(device)
    return weights[:, :length]


def _canonical_bits(piece: torch.Tensor) -> torch.Tensor:
    """The bits of a 1-d piece as int32 (int64 for 8-byte dtypes), every NaN replaced by one canonical NaN (any NaN
    equals any NaN). On the CPU a piece whose sum is finite has no NaN and skips the replacement."""
    wide = torch.int64 if piece.element_size() == 8 else torch.int32
    if not piece.dtype.is_floating_point:
        return piece.to(wide)
    bits = piece.view(_INT_VIEW[piece.element_size()])
    if piece.device.type != "cpu" or not math.isfinite(float(piece.sum())):
        canonical = torch.full((), float("nan"), dtype=piece.dtype, device=piece.device).view(bits.dtype)
        bits = torch.where(torch.isnan(_comparable(piece)), canonical, bits)
    return bits.to(wide)


def fingerprint(tensor: torch.Tensor) -> torch.Tensor:
    """Per-piece fingerprints of a tensor's bits (NaN-aware like `bits_equal`), as int64 `[pieces, 2]`.

    Each half is the exact sum of the element bits times fixed pseudo-random odd weights, the products wrapping at
    the element width (32 bits, 64 for 8-byte dtypes): any single differing element changes both halves (an odd
    weight times a non-zero difference never wraps to 0), and a random pattern of differences leaves both unchanged
    with probability about 2^-64. Lets `validate` check that runs agree bitwise without keeping the first run's
    output (`fingerprint_mismatch` locates the first differing piece)."""
    values = as_real(tensor.detach())
    rows = []
    for _, (piece,) in iter_pieces(values):
        bits = _canonical_bits(piece)
        weights = _fingerprint_weights(bits.device, bits.numel(), bits.dtype)
        rows.append(torch.stack([(bits * weights[0]).sum(), (bits * weights[1]).sum()]))
    if not rows:
        return torch.zeros((0, 2), dtype=torch.int64, device=values.device)
    return torch.stack(rows)


def fingerprint_mismatch(first: torch.Tensor, second: torch.Tensor, shape: tuple[int, ...],
                         names: tuple[str, str] = ("first", "second")) -> str | None:
    """Where two fingerprints of tensors of `shape` differ (the first differing piece's index range), or None."""
    if first.shape == second.shape and torch.equal(first, second):
        return None
    differing = (first != second).any(dim=1).nonzero()
    piece = int(differing[0, 0].item()) if differing.numel() else 0
    blocks = list(flat_blocks(shape, chunk_elements(first.device)))
    start = sum(_block_numel(shape, b) for b in blocks[:piece])
    end = start + _block_numel(shape, blocks[piece]) - 1
    return (f"the bits of {names[1]} differ from {names[0]} (compared by fingerprint) in elements "
            f"{_unravel(start, shape)} to {_unravel(end, shape)} (row-major), and maybe elsewhere")


def _block_numel(shape: tuple[int, ...], block: Block) -> int:
    prefix, span = block
    rest = shape[len(prefix):]
    if span is None:
        return math.prod(rest)
    return span[1] * math.prod(rest[1:])


def unchanged_after_upcast(original: torch.Tensor, copy: torch.Tensor) -> bool:
    """Whether `copy` (a clone of `original`, possibly upcast to a wider dtype) still holds `original`'s values
    bit for bit once `original` is converted the same way (NaN-aware; compared in pieces)."""
    if copy.shape != original.shape or copy.device != original.device:
        return False
    a, b = as_real(original.detach()), as_real(copy.detach())
    if a.dtype != b.dtype and not (a.is_floating_point() and b.is_floating_point()):
        return False
    pieces = list(iter_pieces(a, b))
    if all(torch.equal(pa.to(pb.dtype), pb) for _, (pa, pb) in pieces):
        return True
    return _total([_bit_difference(pa.to(pb.dtype), pb).sum() for _, (pa, pb) in pieces]) == 0
