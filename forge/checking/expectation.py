"""What a correct candidate must produce for one call, computed from the reference and sealed while candidates run.

`build_expectation` runs the reference twice: on float64-upcast copies of the floating inputs, then eagerly on
clones in the native dtypes. From that it keeps, per tensor leaf of the output (and per input the eager call
mutated): the reference values, the per-element allowance (see `forge.checking.tolerance`) and the NaN/inf placement
of eager output; integer and bool leaves keep the eager values (exact match). It also keeps the output structure,
which inputs eager mutated and which outputs alias a mutated input.

Memory (measured: on a 7.5 GB fp32 GroupNorm the old expectation, its copies and the four kept runs held 131 GB of
a 141 GB H200). With S the size of a float32 output, what is kept is compact:

- the reference as float64 for float32/float64 outputs (2S; float32 is 0.6% of the fp32 allowance away from it,
  but user tolerances may be tighter), as float32 for 16- and 8-bit floats (their allowance is >= 1e-3 relative,
  float32 rounding 6e-8);
- the allowance as float32 (S), rounded up so it never tightens; float64 for float64 outputs;
- the NaN/inf codes as int8 only when eager output has a non-finite element (none otherwise);
- no eager copy of a floating leaf (its error is folded into the allowance).

The float64 run goes first (its outputs: 2S, its inputs: 2x the inputs, dropped right after unless the reference
mutated them), then the eager run on clones (the clones are dropped once mutation is known), so the two runs'
buffers never coexist with both sets of inputs. The reference calls themselves cannot be chunked generically (any
function may be the reference): their own temporaries are the reference's, at float64 width. Everything after
them is computed in flat pieces (`forge.checking.compare.iter_pieces`): a first pass for the rms of eager's error,
a second that writes the reference (into the float64 run's own output buffer when nothing else shares it), the
allowance and the codes. Peak while building: inputs + about 4S for a unary fp32 op, plus the reference's own
temporaries.

The float64 run has cuDNN turned off: cuDNN has no fast float64 path, and PyTorch's own kernels (im2col plus a
float64 GEMM) gave the same outputs (within 1e-15 relative) 1.5-12x faster on the H200 for KernelBench's
convolutions at shipped size (`benchmarks/float64_reference.py`, BENCHMARKS.md H8b): `68_conv_transposed_3D` 2.79 s
-> 0.24 s per call, the 2-D transposed ones ~0.33 s -> ~0.03 s. The eager run keeps the user's backends: it is the
baseline whose rounding the allowance reflects.

Expectations up to `_SEAL_LIMIT_BYTES` are sealed into a bytes blob (`Expectation.seal`) and their tensors
released before the candidate runs, so a candidate cannot find the expected output among live tensors (e.g. via
`gc`); `unseal` brings them back for each comparison. Larger ones stay live (copying them off the device per run
would cost more than the check, and the blob would double their host memory).
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from forge.checking.compare import (
    ContainerNode,
    Skeleton,
    TensorMeta,
    ValueLeaf,
    as_real,
    bits_equal,
    exact_mismatch_issue,
    float_mismatch_issue,
    iter_pieces,
    iter_tensor_leaves,
    skeleton_of,
    special_codes_piece,
    tensor_leaves_of_skeleton,
    unchanged_after_upcast,
)
from forge.checking.tolerance import (
    allowed_error,
    eager_outlier_count,
    outlier_budget,
    output_scale,
    rounding_unit,
    tail_allowance,
    tolerance_for,
)
from forge.errors import KernelForgeError
from forge.outcome import ValidationIssue, is_memory_exhaustion
from forge.samples import Sample, clone_tensor, map_values

__all__ = [
    "Expectation",
    "LeafKind",
    "ReferenceFailure",
    "build_expectation",
    "call_quietly",
    "input_leaves",
    "leaf_value_issues",
    "storage_ptr",
    "synchronize_devices",
    "tensor_bytes",
]

logger = logging.getLogger(__name__)

# Seal in memory only up to this size; bigger expectations stay as live tensors (sealing copies them off the
# device and holds a second copy on the host while it is built and read back).
_SEAL_LIMIT_BYTES = 64 << 20

_WIDE_FLOATS = (torch.float32, torch.float64, torch.complex64, torch.complex128)
_DOUBLE_FLOATS = (torch.float64, torch.complex128)


class ReferenceFailure(KernelForgeError):
    """The reference function raised on this input (the input is invalid for the function)."""

    outcome = "harness_error"


class LeafKind:
    FLOAT = "float"
    EXACT = "exact"


def input_leaves(sample: Sample) -> list[tuple[str, torch.Tensor]]:
    """`(locator, tensor)` for every tensor argument: `args[0]`, `kwargs["weight"]`, `args[1][0]`..."""
    leaves = list(iter_tensor_leaves(tuple(sample.args), "args"))
    leaves += list(iter_tensor_leaves(dict(sample.kwargs), "kwargs"))
    return leaves


def tensor_bytes(value: Any) -> int:
    """Bytes of the tensor leaves of a value (as laid out: numel times element size)."""
    return sum(t.numel() * t.element_size() for _, t in iter_tensor_leaves(value, ""))


def call_quietly(fn: Callable[..., Any], sample: Sample) -> Any:
    """`fn(*args, **kwargs)` under `torch.no_grad()`."""
    with torch.no_grad():
        return fn(*sample.args, **sample.kwargs)


def _upcast_copy(value: Any) -> Any:
    """A float64 (complex128) copy of a floating (complex) tensor, a clone of any other tensor; one copy each."""
    if not isinstance(value, torch.Tensor):
        return value
    if value.is_floating_point() and value.dtype != torch.float64:
        return value.detach().to(torch.float64)
    if value.is_complex() and value.dtype != torch.complex128:
        return value.detach().to(torch.complex128)
    return clone_tensor(value)


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
    nbytes: int = 0

    def output_metas(self) -> list[tuple[str, TensorMeta]]:
        return list(tensor_leaves_of_skeleton(self.skeleton, "output"))

    @property
    def output_bytes(self) -> int:
        """Bytes of the reference's tensor outputs at their own dtypes (the O of the oracle's memory bound)."""
        return sum(math.prod(m.shape) * torch.empty((), dtype=m.dtype).element_size() for _, m in self.output_metas())

    def seal(self) -> None:
        """Move the expected numbers into a bytes blob and drop the tensors (no-op for large ones)."""
        if self._tensors is None:
            return
        self.nbytes = sum(t.numel() * t.element_size() for t in self._tensors.values())
        if self.nbytes > _SEAL_LIMIT_BYTES:
            logger.debug("expectation of %d bytes kept live (over the sealing limit)", self.nbytes)
            return
        self._devices = {k: str(t.device) for k, t in self._tensors.items()}
        buffer = io.BytesIO()
        torch.save({k: t.cpu() for k, t in self._tensors.items()}, buffer)
        self._sealed = buffer.getvalue()
        self._tensors = None

    def unseal(self) -> dict[str, torch.Tensor]:
        """The expected tensors (`<locator>/reference`, `/allowed`, `/special` when eager output has NaN/inf,
        `/exact`), on their devices. Drop the result after use: for a sealed expectation it is a fresh copy."""
        if self._tensors is not None:
            return self._tensors
        assert self._sealed is not None
        loaded = torch.load(io.BytesIO(self._sealed), weights_only=True)
        return {k: t.to(self._devices[k]) for k, t in loaded.items()}


# ---------------------------------------------------------------------------------------------------------
# Per-leaf expectation, in flat pieces
# ---------------------------------------------------------------------------------------------------------
def _compact(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` itself when it owns exactly its elements, else a compact copy (a view would seal its whole base)."""
    tensor = tensor.detach()
    exact_size = tensor.numel() * tensor.element_size()
    if tensor.is_contiguous() and tensor.storage_offset() == 0 and tensor.untyped_storage().nbytes() == exact_size:
        return tensor
    return tensor.clone(memory_format=torch.contiguous_format)


def _owns_alone(tensor: torch.Tensor, shared: set[int]) -> bool:
    """Whether a float64 buffer may be overwritten in place: contiguous, exactly its storage, shared by no leaf."""
    return (tensor.dtype == torch.float64 and tensor.is_contiguous() and tensor.storage_offset() == 0
            and tensor.untyped_storage().nbytes() == tensor.numel() * 8 and storage_ptr(tensor) not in shared)


def _round_up_to(values64: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An allowance in `dtype`: one step up from `values64` when `dtype` is narrower, so it never tightens, and
    capped at the largest finite value (an infinite allowance would let an infinite output pass the fast check)."""
    largest = torch.finfo(dtype).max
    if dtype == torch.float64:
        return values64.clamp(max=largest)
    narrow = values64.to(dtype)
    return torch.nextafter(narrow, torch.full((), math.inf, dtype=dtype, device=narrow.device)).clamp_(max=largest)


@dataclass(frozen=True)
class _Allowance:
    """`forge.checking.tolerance.allowed_error` of one leaf, applied piece by piece: its leaf-wide terms (the rms
    of eager's error and the output's rms magnitude, via `output_scale`) come from a first pass over all pieces.
    A leaf of one piece calls `allowed_error` itself; tests/forge/checking/test_checking_memory.py checks that the
    two agree on a leaf of many pieces, so a change of the formula in tolerance.py cannot pass unnoticed here."""

    dtype: torch.dtype
    tolerances: Mapping[torch.dtype, tuple[float, float]]
    error_factor: float
    pieces: int
    rms_error: float
    rms_magnitude: float

    def of(self, expected64: torch.Tensor, eager_error: torch.Tensor | None) -> torch.Tensor:
        if self.pieces == 1:
            return allowed_error(expected64, eager_error, self.dtype, self.tolerances, self.error_factor)
        atol, rtol = tolerance_for(self.dtype, self.tolerances)
        magnitude = expected64.abs()  # finite by construction
        if eager_error is None:
            eager_error = magnitude * rounding_unit(self.dtype)
        scale = output_scale(torch.tensor([self.rms_magnitude], dtype=torch.float64), self.dtype).item()
        return atol * scale + rtol * magnitude + self.error_factor * (eager_error + self.rms_error)


def _eager_error(
    e64: torch.Tensor, r64: torch.Tensor | None, finite: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`(expected, eager error or None)` of one piece: the float64 reference where it and eager are finite, else
    eager output where finite (with no error of its own), else 0."""
    zero = torch.zeros((), dtype=torch.float64, device=e64.device)
    if r64 is None:
        return torch.where(finite, e64, zero), None
    good = finite & torch.isfinite(r64)
    expected = torch.where(good, r64, torch.where(finite, e64, zero))
    return expected, torch.where(good, (e64 - r64).abs(), zero)


def _finite(values: torch.Tensor) -> torch.Tensor:
    """`isfinite` in one kernel (NaN fails `<` too); torch's own is a composite of several."""
    return values.abs() < math.inf


@dataclass(frozen=True)
class _LeafStatistics:
    pieces: int
    rms_error: float
    rms_magnitude: float
    all_finite: bool  # eager and float64 outputs hold no NaN/inf: the expected values are the float64 ones
    has_special: bool  # eager output holds a NaN/inf: its codes are stored


def _leaf_statistics(e: torch.Tensor, r: torch.Tensor | None, dtype: torch.dtype) -> _LeafStatistics:
    """Pass 1 over a leaf: the rms of eager's error and of |expected| (the allowance's leaf-wide terms), and whether
    any element is NaN/inf. Tries the all-finite case first (a finite sum means finite elements): five kernels per
    piece; else the general one."""
    unit = rounding_unit(dtype)
    sums: list[torch.Tensor] = []
    errors: list[torch.Tensor] = []
    magnitudes: list[torch.Tensor] = []
    for _, (ep, rp) in iter_pieces(e, r):
        e64 = ep.to(torch.float64)
        r64 = e64 if rp is None else rp.to(torch.float64)
        sums.append(e64.sum() + r64.sum())
        magnitudes.append(torch.dot(r64, r64))
        errors.append(magnitudes[-1] * unit**2 if rp is None else torch.dot(e64 - r64, e64 - r64))
    if not sums:
        return _LeafStatistics(0, 0.0, 0.0, True, False)
    numel = e.numel()
    finite_sums, error_total, magnitude_total = torch.stack([
        torch.isfinite(torch.stack(sums)).all().to(torch.float64), torch.stack(errors).sum(),
        torch.stack(magnitudes).sum()]).tolist()
    if finite_sums:
        return _LeafStatistics(len(sums), math.sqrt(error_total / numel), math.sqrt(magnitude_total / numel), True,
                               False)
    errors, magnitudes, specials = [], [], []
    for _, (ep, rp) in iter_pieces(e, r):
        e64 = ep.to(torch.float64)
        finite = _finite(e64)
        specials.append((~finite).sum())
        expected, error = _eager_error(e64, None if rp is None else rp.to(torch.float64), finite)
        magnitude = expected.abs()
        errors.append((magnitude * unit if error is None else error).square().sum())
        magnitudes.append(magnitude.square().sum())
    special_total, error_total, magnitude_total = torch.stack([
        torch.stack(specials).sum().to(torch.float64), torch.stack(errors).sum(), torch.stack(magnitudes).sum()
    ]).tolist()
    return _LeafStatistics(len(errors), math.sqrt(error_total / numel), math.sqrt(magnitude_total / numel),
                           False, special_total > 0)


def _float_leaf(
    locator: str,
    eager: torch.Tensor,
    reference: torch.Tensor | None,
    in_place: bool,
    tolerances: Mapping[torch.dtype, tuple[float, float]],
    error_factor: float,
    out: dict[str, torch.Tensor],
) -> None:
    """Store `<locator>/reference`, `/allowed` and (when eager has NaN/inf) `/special` of one floating leaf."""
    e = as_real(eager.detach())
    r = None if reference is None else as_real(reference.detach())
    stats = _leaf_statistics(e, r, eager.dtype)
    allowance = _Allowance(eager.dtype, tolerances, error_factor, stats.pieces, stats.rms_error, stats.rms_magnitude)
    ref_dtype = torch.float64 if eager.dtype in _WIDE_FLOATS else torch.float32
    allowed_dtype = torch.float64 if eager.dtype in _DOUBLE_FLOATS else torch.float32
    stored = r if in_place and r is not None and ref_dtype == torch.float64 else torch.empty(
        e.shape, dtype=ref_dtype, device=e.device)
    allowed = torch.empty(e.shape, dtype=allowed_dtype, device=e.device)
    special = torch.empty(e.shape, dtype=torch.int8, device=e.device) if stats.has_special else None
    # Pass 2: write the reference, the allowance and the codes piece by piece.
    worst: list[torch.Tensor] = []  # eager's largest error per piece, for the tail bound
    outliers: list[torch.Tensor] = []  # elements eager itself puts beyond the floor, per piece
    for _, (ep, rp, sp, ap, cp) in iter_pieces(e, r, stored, allowed, special):
        e64 = ep.to(torch.float64)
        r64 = None if rp is None else rp.to(torch.float64)
        if stats.all_finite:
            expected, error = (e64, None) if r64 is None else (r64, (e64 - r64).abs_())
        else:
            expected, error = _eager_error(e64, r64, _finite(e64))
        if expected.numel():
            worst.append((expected.abs() * rounding_unit(eager.dtype) if error is None else error).max())
        piece_allowed = allowance.of(expected, error)
        outliers.append(eager_outlier_count(piece_allowed, error, error_factor))
        ap.copy_(_round_up_to(piece_allowed, allowed_dtype))
        if sp is not rp:
            sp.copy_(expected)
        elif not stats.all_finite:
            sp.copy_(expected)  # in place: the float64 output, with non-finite elements replaced
        if cp is not None:
            cp.copy_(special_codes_piece(ep))
    out[f"{locator}/reference"] = stored
    out[f"{locator}/allowed"] = allowed
    out[f"{locator}/tail"] = tail_allowance(torch.stack(worst).max() if worst else None, error_factor)
    eager_outliers = int(torch.stack(outliers).sum()) if outliers else 0
    out[f"{locator}/budget"] = torch.tensor(outlier_budget(e.numel(), eager_outliers, error_factor))
    if special is not None:
        out[f"{locator}/special"] = special


# ---------------------------------------------------------------------------------------------------------
# The two reference runs
# ---------------------------------------------------------------------------------------------------------
# The two reference runs of one expectation, one at a time in this process: the float64 run turns cuDNN off, a
# process-wide setting, so two oracles in threads (the judge's children judged at once, `Judge.judge_ahead`) would
# otherwise give one's eager run the other's backends, or leave cuDNN off when both end.
_REFERENCE_RUNS = threading.RLock()


@contextlib.contextmanager
def _cudnn_off() -> Iterator[None]:
    """cuDNN disabled, and only that (`torch.backends.cudnn.flags` would also reset its other settings)."""
    was = torch.backends.cudnn.enabled
    torch.backends.cudnn.enabled = False
    try:
        yield
    finally:
        torch.backends.cudnn.enabled = was


def _float64_run(reference_fn: Callable[..., Any], sample: Sample) -> tuple[Any, dict[str, torch.Tensor]]:
    """The reference on float64 copies: `(output, the copies it mutated)`, or `(None, {})` when it fails. cuDNN is
    off for this run only (see the module docstring: its float64 convolutions are up to 12x slower than PyTorch's
    own); the eager run keeps the user's backends."""
    upcast = Sample(map_values(tuple(sample.args), _upcast_copy), map_values(dict(sample.kwargs), _upcast_copy))
    try:
        with _cudnn_off():
            out = call_quietly(reference_fn, upcast)
        synchronize_devices(out)
    except Exception as exc:  # noqa: BLE001 - fall back to eager output as the reference
        level = logging.INFO if is_memory_exhaustion(exc) else logging.DEBUG
        logger.log(level, "float64 reference unavailable (%s: %s); using eager output", type(exc).__name__, exc)
        return None, {}
    originals = dict(input_leaves(sample))
    mutated = {loc: t for loc, t in input_leaves(upcast) if not unchanged_after_upcast(originals[loc], t)}
    return out, mutated


def _eager_run(reference_fn: Callable[..., Any], sample: Sample) -> tuple[Any, dict[str, torch.Tensor]]:
    """The reference on native clones: `(output, the clones it mutated)`; `ReferenceFailure` when it raises."""
    clones = sample.clone()
    try:
        out = call_quietly(reference_fn, clones)
        synchronize_devices(out)
    except Exception as exc:  # noqa: BLE001 - any reference failure means "not a valid input"
        raise ReferenceFailure(f"{type(exc).__name__}: {exc}") from exc
    mutated = {loc: a for (loc, b), (_, a) in zip(input_leaves(sample), input_leaves(clones), strict=True)
               if not bits_equal(b, a)}
    return out, mutated


def build_expectation(
    reference_fn: Callable[..., Any],
    sample: Sample,
    tolerances: Mapping[torch.dtype, tuple[float, float]],
    error_factor: float,
) -> Expectation:
    """Run the reference (float64, then native) and return the sealed expectation.

    Raises `ReferenceFailure` when the reference raises on the native-dtype inputs.
    """
    with _REFERENCE_RUNS:
        f64_out, f64_mutated = _float64_run(reference_fn, sample)
        try:
            eager_out, eager_mutated = _eager_run(reference_fn, sample)
        except ReferenceFailure as exc:
            if f64_out is None or not is_memory_exhaustion(exc.__cause__ or exc):
                raise
            logger.info("the native reference ran out of memory beside the float64 results; retrying without them")
            f64_out, f64_mutated = None, {}
            eager_out, eager_mutated = _eager_run(reference_fn, sample)

    skeleton = skeleton_of(eager_out)
    float64_reference = f64_out is not None and _same_shapes(skeleton, skeleton_of(f64_out))
    if f64_out is not None and not float64_reference:
        logger.debug("the float64 run returned a differently shaped output; using eager output")
    mutated = list(eager_mutated)

    aliases: dict[str, str] = {}
    storage_of_mutated = {storage_ptr(t): loc for loc, t in eager_mutated.items()}
    storage_of_mutated.pop(0, None)  # empty storages share address 0
    for locator, eager_leaf in iter_tensor_leaves(eager_out, "output"):
        owner = storage_of_mutated.get(storage_ptr(eager_leaf))
        if owner is not None:
            aliases[locator] = owner

    eager_leaves = list(iter_tensor_leaves(eager_out, "output")) + list(eager_mutated.items())
    ref_leaves: dict[str, torch.Tensor] = {}
    if float64_reference:
        ref_leaves = dict(iter_tensor_leaves(f64_out, "output"))
        ref_leaves.update({loc: t for loc, t in f64_mutated.items() if loc in eager_mutated})
    del eager_out, f64_out, eager_mutated, f64_mutated  # each leaf is released once its expectation is stored
    pointers = [storage_ptr(t) for t in ref_leaves.values()]
    shared = {p for p in pointers if pointers.count(p) > 1}

    tensors: dict[str, torch.Tensor] = {}
    kinds: dict[str, str] = {}
    while eager_leaves:
        locator, eager_leaf = eager_leaves.pop(0)
        reference = ref_leaves.pop(locator, None)
        if not (eager_leaf.is_floating_point() or eager_leaf.is_complex()):
            tensors[f"{locator}/exact"] = _compact(eager_leaf)
            kinds[locator] = LeafKind.EXACT
            continue
        usable = reference is not None and reference.shape == eager_leaf.shape and (
            reference.is_floating_point() or reference.is_complex())
        in_place = usable and _owns_alone(as_real(reference), shared)
        _float_leaf(locator, eager_leaf, reference if usable else None, in_place, tolerances, error_factor, tensors)
        kinds[locator] = LeafKind.FLOAT
        del eager_leaf, reference

    expectation = Expectation(
        skeleton=skeleton,
        leaf_kinds=kinds,
        mutated_inputs=mutated,
        aliases=aliases,
        float64_reference=float64_reference,
        _tensors=tensors,
    )
    del tensors
    expectation.seal()
    return expectation


def leaf_value_issues(
    expectation: Expectation, expected: dict[str, torch.Tensor], got: dict[str, torch.Tensor]
) -> list[ValidationIssue]:
    """Value issues of every leaf `expectation` judges: `expected` is `expectation.unseal()`, `got` maps each locator
    (output leaves, and inputs the reference updates in place) to the candidate's tensor. Exact leaves must match
    exactly, floating leaves within the allowance; each issue names its leaf."""
    issues = []
    for locator, kind in expectation.leaf_kinds.items():
        value = got[locator]
        if kind == LeafKind.EXACT:
            problem = exact_mismatch_issue(value, expected[f"{locator}/exact"])
        else:
            problem = float_mismatch_issue(value, expected[f"{locator}/reference"], expected[f"{locator}/allowed"],
                                           expected.get(f"{locator}/special"), tail=expected.get(f"{locator}/tail"),
                                           budget=expected.get(f"{locator}/budget"))
        if problem:
            name = locator if locator.startswith("output") else f"input {locator} (updated in place by the reference)"
            issues.append(problem.derive(f"{name}: {problem}", leaf=locator))
    return issues


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
