"""Run-time launch check: did the candidate's own kernels compute its result, with no PyTorch compute on its behalf?

WHY. Screening used to refuse a file whose `kernel_function` never launched a kernel *by name*. That was too strict
(a kernel picked from a per-shape cache, `kern, grid, meta = cfg; kern[grid](...)`, was refused and needed a special
case) and trivially fooled (a kernel that launches a no-op and computes the result with tensor operators,
`x / (1 + math.e ** -x)`, or reaches `torch.nn.functional` through another path, passed). Whether a kernel ran and
whether PyTorch computed is a fact of the run, so it is checked while the candidate runs:

- own-kernel launches are counted by the kernel language's hooks (`KernelLanguage.launch_monitor()`; each language
  calls `note_launch` / wraps its launchers with `counting`), the outermost launch only (an autotuner's benchmark runs
  or a heuristics wrapper's inner launch are part of one launch);
- every ATen op that runs while the candidate runs is seen by a `TorchDispatchMode` (and `Tensor.tolist`, which does
  not dispatch on the CPU, by a `TorchFunctionMode`) and classified with the allow-lists below.

POLICY (what the candidate's own Python code may make PyTorch do, outside its kernels):

- free, not reported: allocation (`empty*`, `new_empty*`), input-independent constants (`zeros*`, `ones*`, `full*`,
  `fill_` with a number, `zero_`, `arange`, `torch.tensor` of Python data: they compute nothing from the inputs, and
  accumulating kernels need zeroed outputs), views and metadata (`view`, `as_strided`, `reshape` without a copy,
  `permute`, `transpose`, `expand`, `slice`, `select`, `unsqueeze`, `squeeze`, `detach`, `alias`, `unbind`, ...);
  `contiguous()` of an already contiguous tensor dispatches nothing.
- reported, not refused (`LaunchRecord.copy_ops`): copies and conversions (`clone`, `copy_`, `_to_copy`:
  `.contiguous()` of a strided view, `.to(dtype)`, `.float()`, `out[:] = y`, `fill_` with a tensor). They move or
  round data but compute nothing of the op; honest kernels use them to lay out inputs and to return the dtype the
  caller asked for (a kernel computing natively in bf16 converts its result), and the benchmark charges their time.
  `LaunchPolicy(allow_copies=False)` refuses them too.
- refused (`LaunchRecord.compute_ops`): every other op, so arithmetic from tensor operators (`x * y`,
  `math.e ** x`, `-x`), reductions, matmuls, `torch.nn.functional` by any path, indexing with tensors, `cat`,
  random ops, and ops of other namespaces. The prompt asks the kernel to do the math itself: a "Triton kernel" that
  lets PyTorch compute is not one (`exploit_torch_operators_outside_triton` of the adversarial corpus: PyTorch's
  math behind a token launch, timed as if it were the generated kernel).
- refused for function kernels, reported for module kernels (`LaunchRecord.library_ops`, `LaunchPolicy.for_modules()`):
  the libraries that already win, `LIBRARY_OPS` (cuBLAS products, cuDNN/oneDNN convolutions, fused attention). A
  module kernel (a KernelBench `ModelNew`, a replacement of `LlamaMLP.forward`) may call them for those parts and
  must compute everything else in its own kernels, with at least one own launch per call; a function kernel replaces
  one such call or something smaller and computes it itself.
- refused (`LaunchRecord.host_reads`): reading tensor values on the host (`.item()`, `float(t)`, `int(t)`,
  `bool(t)`: `aten._local_scalar_dense`; `.tolist()`), since the values can then be computed in Python and put
  back with `torch.tensor`; a scalar the kernel needs is loaded from its pointer inside the kernel.
- refused: a call on non-empty inputs that launched none of the candidate's kernels (`LaunchPolicy.every_call`,
  default on: a result served from a cache, or PyTorch's, came from no kernel of the candidate's). A call whose
  tensor inputs are all empty is excused when the caller passes its inputs to `watch`.

Attribution. An op counts against the candidate when the innermost Python frame that is not PyTorch's own code
belongs neither to the kernel language's runtime (Triton's interpreter copies launch arguments with ATen ops; an
autotuner computes timing quantiles with `torch.quantile`) nor to the harness (`forge`, and the roots the language
adds). Candidate callables that a runtime calls back (an autotune `pre_hook`, a heuristics lambda) run in the
candidate's file, so their ops count.

Trust. The candidate runs in the same process as the monitor, so a kernel file could in principle tamper with the
modes or the counters; the static screen forbids the constructs needed (module attribute assignment, reflection,
`torch.utils`, `sys`, frame access), and the monitor only ever adds findings, never removes them.

Cost. Only while a watch is active: one Python call and a short frame walk per ATen op of the wrapper, and a
function-mode hop per torch function call (the Triton interpreter's own calls included). The language's counting
hooks are installed by `launch_monitor()` (the judging processes), not by a plain load, so production launches pay
nothing (Triton: `agent.languages.triton.hooks`). Measured on the CPU machine: the 21 honest kernels of the
project's corpus and replies pass; the autotuned silu validates in ~1.3 s under the watch, interpreted.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from forge.checking import dispatch_mode
from forge.checking.dispatch_mode import HarnessDispatchMode
from forge.outcome import Outcome, ValidationIssue
from forge.samples import iter_tensors

__all__ = [
    "COPY_OPS",
    "FREE_OPS",
    "HOST_READ_OPS",
    "WATCH",
    "LaunchMonitor",
    "LaunchPolicy",
    "LaunchRecord",
    "OpKind",
    "classify_op",
    "counting",
    "launch_issues",
    "note_launch",
]

logger = logging.getLogger(__name__)

# ATen ops (overload packet names) that compute nothing from the inputs: allocation, input-independent constants,
# views and metadata (dtype arithmetic too: `torch.promote_types` dispatches as an ATen op with no tensor argument;
# an honest rms_norm that picked its output dtype with it was refused on the H200, BENCHMARKS.md).
FREE_OPS: frozenset[str] = frozenset(
    """empty empty_like empty_strided empty_permuted new_empty new_empty_strided
    zeros zeros_like ones ones_like full full_like new_zeros new_ones new_full scalar_tensor arange
    zero_ lift_fresh lift_fresh_copy
    view _unsafe_view _reshape_alias as_strided as_strided_ reshape permute transpose transpose_ t t_ numpy_T
    expand expand_as view_as slice select unsqueeze unsqueeze_ squeeze squeeze_ detach detach_ alias unbind split
    split_with_sizes unsafe_split chunk tensor_split narrow movedim moveaxis swapaxes swapdims flatten unflatten
    diagonal unfold view_as_real view_as_complex real imag _conj _neg_view resolve_conj resolve_neg
    sym_size sym_stride sym_numel sym_storage_offset size stride numel dim is_contiguous
    is_non_overlapping_and_dense is_same_size is_complex is_floating_point is_signed requires_grad_ layout device
    contiguous
    promote_types can_cast result_type""".split()
)
# Copies and conversions: reported, not refused (see the module docstring).
COPY_OPS: frozenset[str] = frozenset(
    "clone copy_ _to_copy to _copy_from _copy_from_and_resize fill_ _reshape_copy".split()
)
# The libraries that already win, which a MODULE kernel may call for those parts (`LaunchPolicy.for_modules()`):
# cuBLAS products, cuDNN / oneDNN convolutions, fused attention. A function kernel may not (it replaces one of them or
# something smaller, and must compute it itself).
LIBRARY_OPS: frozenset[str] = frozenset(
    """mm addmm bmm baddbmm matmul linear mv addmv _addmm_activation
    convolution _convolution convolution_overrideable conv1d conv2d conv3d conv_transpose1d conv_transpose2d
    conv_transpose3d cudnn_convolution cudnn_convolution_transpose mkldnn_convolution _mps_convolution
    scaled_dot_product_attention _scaled_dot_product_flash_attention _scaled_dot_product_flash_attention_for_cpu
    _scaled_dot_product_efficient_attention _scaled_dot_product_cudnn_attention _flash_attention_forward
    _efficient_attention_forward""".split()
)
# Reads of tensor values on the host.
HOST_READ_OPS: frozenset[str] = frozenset({"_local_scalar_dense", "item"})
# Ops whose first argument decides: `fill_` with a number is a constant, with a tensor a (broadcast) copy.
_CONSTANT_OVERLOADS: frozenset[str] = frozenset({"fill_.Scalar"})
_NAMESPACES = frozenset({"aten", "prim", "prims"})


class OpKind(StrEnum):
    """How the launch check treats one ATen op run by the candidate's own code."""

    FREE = "free"
    COPY = "copy"
    HOST_READ = "host_read"
    LIBRARY = "library"  # a library product, convolution or attention: compute, except for module kernels
    COMPUTE = "compute"


@functools.cache
def _classify(namespace: str, packet: str, overload: str) -> OpKind:
    if namespace not in _NAMESPACES:
        return OpKind.COMPUTE
    if f"{packet}.{overload}" in _CONSTANT_OVERLOADS:
        return OpKind.FREE
    if packet in HOST_READ_OPS:
        return OpKind.HOST_READ
    if packet in FREE_OPS:
        return OpKind.FREE
    if packet in COPY_OPS:
        return OpKind.COPY
    if packet in LIBRARY_OPS:
        return OpKind.LIBRARY
    return OpKind.COMPUTE


def _op_parts(func: Any) -> tuple[str, str, str]:
    namespace = getattr(func, "namespace", "") or ""
    packet = getattr(getattr(func, "overloadpacket", None), "__name__", None) or getattr(func, "__name__", str(func))
    overload = getattr(func, "_overloadname", "") or "default"
    return namespace, packet.split(".")[-1], overload


def classify_op(func: Any) -> OpKind:
    """The policy's verdict on an `OpOverload` (e.g. `torch.ops.aten.mul.Tensor` -> `compute`)."""
    return _classify(*_op_parts(func))


def op_name(func: Any) -> str:
    """`aten.mul.Tensor`-style name of an `OpOverload`."""
    namespace, packet, overload = _op_parts(func)
    return f"{namespace}.{packet}.{overload}" if namespace else f"{packet}.{overload}"


# ---------------------------------------------------------------------------------------------------------
# Records and policy
# ---------------------------------------------------------------------------------------------------------
def _add(items: tuple[str, ...], item: str) -> tuple[str, ...]:
    return items if item in items else (*items, item)


@dataclass
class LaunchRecord:
    """What one watched call of the candidate did (filled in while it runs, hence mutable).

    launches: own-kernel launches (outermost only); kernels: their names, first seen first; compute_ops /
    host_reads / copy_ops: distinct ATen ops (e.g. `aten.mul.Tensor`) the candidate's code made PyTorch run, by
    policy class, first seen first; empty_call: every tensor input was empty (no launch needed); completed: the
    watched block exited without an exception. sample / case / run: where the call was made, set by the caller for
    its messages (as in `ValidationIssue`).
    """

    launches: int = 0
    kernels: tuple[str, ...] = ()
    compute_ops: tuple[str, ...] = ()
    host_reads: tuple[str, ...] = ()
    copy_ops: tuple[str, ...] = ()
    library_ops: tuple[str, ...] = ()
    empty_call: bool = False
    completed: bool = False
    sample: int | None = None
    case: str | None = None
    run: str | None = None

    def note_launch(self, kernel: str) -> None:
        self.launches += 1
        self.kernels = _add(self.kernels, kernel)

    def note_op(self, name: str, kind: OpKind) -> None:
        if kind is OpKind.COMPUTE:
            self.compute_ops = _add(self.compute_ops, name)
        elif kind is OpKind.HOST_READ:
            self.host_reads = _add(self.host_reads, name)
        elif kind is OpKind.COPY:
            self.copy_ops = _add(self.copy_ops, name)
        elif kind is OpKind.LIBRARY:
            self.library_ops = _add(self.library_ops, name)

    def where(self) -> str:
        parts = [f"sample {self.sample}" if self.sample is not None else "", self.case or "",
                 f"run {self.run}" if self.run else ""]
        return ", ".join(p for p in parts if p)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form (for the sandbox's protocol)."""
        return {"launches": self.launches, "kernels": list(self.kernels), "compute_ops": list(self.compute_ops),
                "host_reads": list(self.host_reads), "copy_ops": list(self.copy_ops),
                "library_ops": list(self.library_ops), "empty_call": self.empty_call,
                "completed": self.completed, "sample": self.sample, "case": self.case, "run": self.run}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LaunchRecord:
        return cls(launches=int(data.get("launches", 0)), kernels=tuple(data.get("kernels") or ()),
                   compute_ops=tuple(data.get("compute_ops") or ()), host_reads=tuple(data.get("host_reads") or ()),
                   copy_ops=tuple(data.get("copy_ops") or ()), library_ops=tuple(data.get("library_ops") or ()),
                   empty_call=bool(data.get("empty_call")),
                   completed=bool(data.get("completed")), sample=data.get("sample"), case=data.get("case"),
                   run=data.get("run"))


@dataclass(frozen=True)
class LaunchPolicy:
    """Settings of `launch_issues`: `every_call` (each completed call on non-empty inputs must launch an own kernel;
    False: at least one call must), `allow_copies` (copies and dtype conversions outside the kernels are only
    reported; False refuses them like compute), `allow_library` (products, convolutions and attention through
    PyTorch, `LIBRARY_OPS`, are reported, not refused: the module-kernel policy)."""

    every_call: bool = True
    allow_copies: bool = True
    allow_library: bool = False

    @classmethod
    def for_modules(cls) -> LaunchPolicy:
        """A module kernel (a `ModelNew`, a replacement of a module class's forward): the libraries that already win
        for their parts (`LIBRARY_OPS`), at least one own kernel in every call, nothing else."""
        return cls(allow_library=True)


_RULE = ("a kernel must compute its result in its own kernels; outside them only allocation, constant fills, views, "
         "copies and dtype conversions may run")


def _first(records: list[LaunchRecord], found: Callable[[LaunchRecord], bool]) -> tuple[int, LaunchRecord | None]:
    hits = [r for r in records if found(r)]
    return len(hits), (hits[0] if hits else None)


def _issue(message: str, record: LaunchRecord) -> ValidationIssue:
    return ValidationIssue(message, kind=Outcome.FORBIDDEN, sample=record.sample, case=record.case, run=record.run)


def _union(records: Iterable[LaunchRecord], attribute: str) -> tuple[str, ...]:
    names: tuple[str, ...] = ()
    for record in records:
        for name in getattr(record, attribute):
            names = _add(names, name)
    return names


def _calls(count: int, total: int, record: LaunchRecord) -> str:
    where = record.where()
    return f"in {count} of {total} calls" + (f", first at {where}" if where else "")


def launch_issues(records: Iterable[LaunchRecord], policy: LaunchPolicy = LaunchPolicy()) -> list[ValidationIssue]:
    """The launch check's findings over the watched calls (empty = passed), as `ValidationIssue`s of kind
    `forbidden` whose messages start with "launch check:". Records of calls that did not complete are skipped (the
    exception is the finding there); no completed call means nothing to judge."""
    done = [r for r in records if r.completed]
    if not done:
        return []
    total, issues = len(done), []
    refused = ("compute_ops",) + (() if policy.allow_copies else ("copy_ops",)) + \
        (() if policy.allow_library else ("library_ops",))
    count, first = _first(done, lambda r: any(getattr(r, a) for a in refused))
    if first is not None:
        ops = [op for a in refused for op in _union(done, a)]
        issues.append(_issue(f"launch check: computation outside the candidate's own kernels: PyTorch ran "
                             f"{', '.join(ops)} on its behalf ({_calls(count, total, first)}); {_RULE}", first))
    count, first = _first(done, lambda r: bool(r.host_reads))
    if first is not None:
        issues.append(_issue(f"launch check: computation outside the candidate's own kernels: it read tensor values "
                             f"on the host ({', '.join(_union(done, 'host_reads'))}: .item(), .tolist(), float(t), "
                             f"int(t), bool(t)) ({_calls(count, total, first)}); values must be loaded and computed "
                             "in the kernel", first))
    needing = [r for r in done if not r.empty_call]
    count, first = _first(needing, lambda r: r.launches == 0)
    if first is not None and (policy.every_call or count == len(needing)):
        issues.append(_issue(f"launch check: no kernel of the candidate was launched ({_calls(count, total, first)}); "
                             "the result must come from the candidate's own kernels", first))
    return issues


# ---------------------------------------------------------------------------------------------------------
# Watching a call
# ---------------------------------------------------------------------------------------------------------
@dataclass
class _WatchState:
    """The process's current watch: the record launches go to, and how deep inside an own launch we are."""

    record: LaunchRecord | None = None
    depth: int = 0


WATCH = _WatchState()


def note_launch(kernel: str) -> bool:
    """Count one own-kernel launch into the active watch, unless it happens inside another launch (an autotuner's
    benchmark runs); returns whether it counted. For languages whose launch needs no depth tracking."""
    record = WATCH.record
    if record is None or WATCH.depth:
        return False
    record.note_launch(kernel)
    return True


def counting(original: Callable[..., Any], name_of: Callable[[Any], str],
             skip: Callable[[dict[str, Any]], bool] | None = None) -> Callable[..., Any]:
    """Wrap a launcher method `original(self, *args, **kwargs)` so that, while a watch is active, an outermost call
    counts as one launch of `name_of(self)` (calls for which `skip(kwargs)` is true, e.g. Triton's warm-ups, do not).
    Nested launches inside it are not counted. Costs one attribute read when no watch is active."""

    @functools.wraps(original)
    def launcher(self: Any, *args: Any, **kwargs: Any) -> Any:
        record = WATCH.record
        if record is None or WATCH.depth or (skip is not None and skip(kwargs)):
            return original(self, *args, **kwargs)
        record.note_launch(name_of(self))
        WATCH.depth += 1
        try:
            return original(self, *args, **kwargs)
        finally:
            WATCH.depth -= 1

    launcher.__kforge_counting__ = original  # type: ignore[attr-defined]
    return launcher


def _root(path: str | Path) -> tuple[str, ...]:
    text = os.path.abspath(str(path))
    real = os.path.realpath(text)
    return tuple({text.rstrip(os.sep) + os.sep, real.rstrip(os.sep) + os.sep})


_TORCH_ROOTS = _root(Path(torch.__file__).parent)
_FORGE_ROOTS = _root(Path(__file__).resolve().parents[1])
# Frames of these files are the recorders' own (the dispatch modes' wrapper included): looked through, as torch's.
_TRANSPARENT = frozenset({__file__, dispatch_mode.__file__})


class _Attribution:
    """Whether an op was made by the candidate: the innermost frame outside PyTorch is not harness or runtime code."""

    def __init__(self, ignored_roots: tuple[str, ...]) -> None:
        self.ignored = ignored_roots
        self._kind: dict[str, int] = {}  # filename -> 0 transparent (torch), 1 ignored, 2 candidate

    def _file_kind(self, filename: str) -> int:
        kind = self._kind.get(filename)
        if kind is None:
            if filename in _TRANSPARENT or filename.startswith(_TORCH_ROOTS):
                kind = 0
            elif filename.startswith(self.ignored):
                kind = 1
            else:
                kind = 2
            self._kind[filename] = kind
        return kind

    def by_candidate(self) -> bool:
        frame = sys._getframe(2)
        while frame is not None:
            kind = self._file_kind(frame.f_code.co_filename)
            if kind:
                return kind == 2
            frame = frame.f_back
        return True


class _OpRecorder(HarnessDispatchMode):
    def __init__(self, record: LaunchRecord, attribution: _Attribution) -> None:
        super().__init__()
        self.record = record
        self.attribution = attribution

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch's protocol
        kind = classify_op(func)
        if kind is not OpKind.FREE and self.attribution.by_candidate():
            self.record.note_op(op_name(func), kind)
        return func(*args, **(kwargs or {}))


_TOLIST = torch.Tensor.tolist
_HOST_READ_FUNCTIONS = {_TOLIST: "Tensor.tolist"}
_numpy = getattr(torch.Tensor, "numpy", None)
if _numpy is not None:
    _HOST_READ_FUNCTIONS[_numpy] = "Tensor.numpy"


class _HostReadRecorder(TorchFunctionMode):
    """`Tensor.tolist` / `Tensor.numpy` read values without dispatching an ATen op on the CPU."""

    def __init__(self, record: LaunchRecord, attribution: _Attribution) -> None:
        super().__init__()
        self.record = record
        self.attribution = attribution

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch's protocol
        name = _HOST_READ_FUNCTIONS.get(func)
        if name is not None and self.attribution.by_candidate():
            self.record.note_op(name, OpKind.HOST_READ)
        return func(*args, **(kwargs or {}))


def _all_empty(inputs: Any) -> bool:
    tensors = list(iter_tensors(inputs))
    return bool(tensors) and all(t.numel() == 0 for t in tensors)


class LaunchMonitor:
    """Watches calls of a candidate: `with monitor.watch(inputs) as record: out = candidate(*args, **kwargs)`.

    Language-neutral; a language's `launch_monitor()` installs its launch-counting hooks (see `counting`,
    `note_launch`) and returns one of these with the directories of its runtime as `ignored_roots` (ops made from
    there are not the candidate's; `forge` itself is always ignored). One watch at a time per process.
    """

    def __init__(self, language: str, ignored_roots: Iterable[str | Path] = ()) -> None:
        self.language = language
        roots: tuple[str, ...] = _FORGE_ROOTS
        for root in ignored_roots:
            roots += _root(root)
        self.ignored_roots = roots

    def __repr__(self) -> str:
        return f"LaunchMonitor({self.language!r})"

    @contextmanager
    def watch(self, inputs: Any = None) -> Iterator[LaunchRecord]:
        """Record one call. `inputs` (the call's args/kwargs, optional): when every tensor in them is empty the call
        needs no launch. The record is complete once the block exits without an exception."""
        if WATCH.record is not None:
            raise RuntimeError("a launch watch is already active in this process")
        record = LaunchRecord(empty_call=inputs is not None and _all_empty(inputs))
        attribution = _Attribution(self.ignored_roots)
        WATCH.record, WATCH.depth = record, 0
        try:
            with _HostReadRecorder(record, attribution), _OpRecorder(record, attribution):
                yield record
            record.completed = True
        finally:
            WATCH.record, WATCH.depth = None, 0
        logger.debug("watched call: %s", record)

