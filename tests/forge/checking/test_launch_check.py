"""`forge.checking.launch_check`, language-neutral: the op policy, the records, `launch_issues`, and a monitor
watching real torch code with launches counted by a stand-in language (a launcher wrapped with `counting`).
Real Triton kernels are in tests/agent/test_launch_check.py."""

from __future__ import annotations

import json
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch

from forge.checking.launch_check import (
    WATCH,
    LaunchMonitor,
    LaunchPolicy,
    LaunchRecord,
    OpKind,
    classify_op,
    launch_issues,
    note_launch,
)
from forge.outcome import Outcome, ValidationIssue
from forge.source_files import import_source_file

aten = torch.ops.aten


@pytest.mark.parametrize(("op", "kind"), [
    (aten.empty.memory_format, OpKind.FREE), (aten.empty_like.default, OpKind.FREE),
    (aten.zeros.default, OpKind.FREE), (aten.full.default, OpKind.FREE), (aten.fill_.Scalar, OpKind.FREE),
    (aten.view.default, OpKind.FREE), (aten.as_strided.default, OpKind.FREE), (aten.permute.default, OpKind.FREE),
    (aten.slice.Tensor, OpKind.FREE), (aten.select.int, OpKind.FREE), (aten.expand.default, OpKind.FREE),
    (aten.detach.default, OpKind.FREE), (aten.lift_fresh.default, OpKind.FREE),
    (aten.promote_types.default, OpKind.FREE), (aten.can_cast.default, OpKind.FREE),
    (aten.clone.default, OpKind.COPY), (aten.copy_.default, OpKind.COPY), (aten._to_copy.default, OpKind.COPY),
    (aten.fill_.Tensor, OpKind.COPY),
    (aten._local_scalar_dense.default, OpKind.HOST_READ),
    (aten.mul.Tensor, OpKind.COMPUTE), (aten.pow.Scalar, OpKind.COMPUTE), (aten._softmax.default, OpKind.COMPUTE),
    (aten.silu.default, OpKind.COMPUTE), (aten.index.Tensor, OpKind.COMPUTE), (aten.cat.default, OpKind.COMPUTE),
    (aten.mm.default, OpKind.LIBRARY), (aten.addmm.default, OpKind.LIBRARY),
    (aten.convolution.default, OpKind.LIBRARY), (aten.sum.dim_IntList, OpKind.COMPUTE),
])
def test_op_policy(op: Any, kind: OpKind) -> None:
    assert classify_op(op) is kind


def test_ops_of_other_namespaces_are_compute() -> None:
    class Foreign:  # what a custom operator looks like to the classifier
        namespace = "mylib"
        _overloadname = "default"
        overloadpacket = type("P", (), {"__name__": "empty"})

    assert classify_op(Foreign()) is OpKind.COMPUTE


def test_record_round_trips_through_json() -> None:
    record = LaunchRecord(launches=2, kernels=("a", "b"), compute_ops=("aten.mul.Tensor",), host_reads=("x",),
                          copy_ops=("aten.clone.default",), library_ops=("aten.mm.default",), empty_call=False,
                          completed=True, sample=1,
                          case="fresh #1", run="2")
    assert LaunchRecord.from_dict(json.loads(json.dumps(record.to_dict()))) == record


def _done(**fields: Any) -> LaunchRecord:
    return LaunchRecord(completed=True, **fields)


def test_clean_records_pass() -> None:
    records = [_done(launches=1, kernels=("k",), copy_ops=("aten.clone.default",)), _done(launches=3)]
    assert launch_issues(records) == []
    assert launch_issues([]) == []


def test_compute_ops_fail_with_where_they_first_ran() -> None:
    records = [_done(launches=1), _done(launches=1, compute_ops=("aten.mul.Tensor",), sample=0, case="captured",
                                        run="1"), _done(launches=1, compute_ops=("aten.add.Tensor",))]
    (issue,) = launch_issues(records)
    assert isinstance(issue, ValidationIssue) and issue.kind is Outcome.FORBIDDEN
    assert issue.startswith("launch check: computation outside the candidate's own kernels")
    assert "aten.mul.Tensor, aten.add.Tensor" in issue and "in 2 of 3 calls" in issue
    assert (issue.sample, issue.case, issue.run) == (0, "captured", "1")
    assert "sample 0, captured, run 1" in issue


def test_host_reads_fail() -> None:
    (issue,) = launch_issues([_done(launches=1, host_reads=("aten._local_scalar_dense.default",))])
    assert "read tensor values on the host" in issue and issue.kind is Outcome.FORBIDDEN


def test_a_call_without_a_launch_fails_unless_its_inputs_were_empty() -> None:
    (issue,) = launch_issues([_done(launches=1), _done(launches=0)])
    assert "no kernel of the candidate was launched (in 1 of 2 calls" in issue
    assert launch_issues([_done(launches=1), _done(launches=0, empty_call=True)]) == []


def test_policy_every_call_off_needs_one_launch_overall() -> None:
    lenient = LaunchPolicy(every_call=False)
    assert launch_issues([_done(launches=1), _done(launches=0)], lenient) == []
    assert launch_issues([_done(launches=0), _done(launches=0)], lenient)


def test_policy_can_refuse_copies() -> None:
    record = _done(launches=1, copy_ops=("aten._to_copy.default",))
    assert launch_issues([record]) == []
    (issue,) = launch_issues([record], LaunchPolicy(allow_copies=False))
    assert "aten._to_copy.default" in issue


def test_module_kernels_may_call_the_libraries_but_must_launch_their_own() -> None:
    record = _done(launches=1, library_ops=("aten.addmm.default", "aten._scaled_dot_product_flash_attention.default"))
    (issue,) = launch_issues([record])  # a function kernel computes its result itself
    assert "aten.addmm.default" in issue and issue.kind is Outcome.FORBIDDEN
    assert launch_issues([record], LaunchPolicy.for_modules()) == []
    only_library = _done(launches=0, library_ops=("aten.addmm.default",))
    (issue,) = launch_issues([only_library], LaunchPolicy.for_modules())
    assert "no kernel of the candidate was launched" in issue
    mixed = _done(launches=1, library_ops=("aten.mm.default",), compute_ops=("aten.mul.Tensor",))
    (issue,) = launch_issues([mixed], LaunchPolicy.for_modules())
    assert "aten.mul.Tensor" in issue and "aten.mm.default" not in issue


def test_incomplete_records_are_not_judged() -> None:
    assert launch_issues([LaunchRecord(launches=0, compute_ops=("aten.mul.Tensor",))]) == []


# ---------------------------------------------------------------------------------------------------------
# A monitor watching real torch code; launches counted by a stand-in language
# ---------------------------------------------------------------------------------------------------------
RUNTIME = """
import torch

from forge.checking.launch_check import counting


class FakeKernel:
    \"\"\"A stand-in language's kernel: `launch` writes `2 * x` into `out` with ATen ops (as a runtime might).\"\"\"

    def __init__(self, name):
        self.name = name

    def launch(self, x, out, *, warmup=False, inner=None):
        if inner is not None:
            inner.launch(x, out)
        out.copy_(x * 2)


FakeKernel.launch = counting(FakeKernel.launch, lambda kernel: kernel.name, lambda kwargs: bool(kwargs.get("warmup")))


def run_for_candidate(x):
    return torch.sigmoid(x) * x  # the runtime's own ATen ops
"""

CANDIDATE = """
import torch


def honest(kernel, x):
    out = torch.empty_like(x)
    kernel.launch(x.contiguous(), out)
    return out.view(x.shape)


def fallback(kernel, x):
    return x * 2


def through_runtime(kernel, runtime, x):
    out = torch.empty_like(x)
    kernel.launch(x, out)
    return runtime.run_for_candidate(out)


def module_like(kernel, x, w):
    h = torch.nn.functional.linear(x, w)  # cuBLAS for the product
    out = torch.empty_like(h)
    kernel.launch(h, out)  # the rest in its own kernel
    return out


def host(kernel, x):
    out = torch.empty_like(x)
    kernel.launch(x, out)
    return torch.tensor([2.0 * v for v in x.tolist()])
"""


def _module(folder: Path, source: str) -> Any:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"m_{uuid.uuid4().hex[:8]}.py"
    path.write_text(textwrap.dedent(source))
    return import_source_file(path, path.stem)


@pytest.fixture
def setup(tmp_path: Path) -> tuple[LaunchMonitor, Any, Any]:
    runtime = _module(tmp_path / "runtime", RUNTIME)
    candidate = _module(tmp_path / "candidate", CANDIDATE)
    return LaunchMonitor("fake", ignored_roots=[tmp_path / "runtime"]), runtime, candidate


@pytest.fixture
def runtime(setup: tuple[LaunchMonitor, Any, Any]) -> Any:
    return setup[1]


def test_an_honest_call_counts_its_launch_and_no_compute(setup: tuple[LaunchMonitor, Any, Any]) -> None:
    monitor, runtime, candidate = setup
    x = torch.randn(4, 3).t()
    with monitor.watch(((x,), {})) as record:
        out = candidate.honest(runtime.FakeKernel("double"), x)
    torch.testing.assert_close(out, 2 * x)
    assert record.completed and record.launches == 1 and record.kernels == ("double",)
    assert record.compute_ops == ()  # the kernel's own `x * 2` ran inside its launch, from its runtime's code
    assert record.copy_ops == ("aten.clone.default",)  # .contiguous() of a transposed view
    assert launch_issues([record]) == []


def test_compute_in_the_candidates_code_is_recorded(setup: tuple[LaunchMonitor, Any, Any]) -> None:
    monitor, runtime, candidate = setup
    x = torch.randn(5)  # made outside the watch: the test's own ops are not the candidate's
    with monitor.watch() as record:
        candidate.fallback(runtime.FakeKernel("double"), x)
    assert record.launches == 0 and record.compute_ops == ("aten.mul.Tensor",)
    assert len(launch_issues([record])) == 2


def test_ops_made_by_an_ignored_runtime_are_not_the_candidates(setup: tuple[LaunchMonitor, Any, Any]) -> None:
    monitor, runtime, candidate = setup
    x = torch.randn(5)
    with monitor.watch() as record:
        candidate.through_runtime(runtime.FakeKernel("double"), runtime, x)
    assert record.launches == 1 and record.compute_ops == ()
    strict = LaunchMonitor("fake")  # without the runtime's root the same ops count
    with strict.watch() as record:
        candidate.through_runtime(runtime.FakeKernel("double"), runtime, x)
    assert set(record.compute_ops) == {"aten.mul.Tensor", "aten.sigmoid.default"}


def test_host_reads_are_recorded(setup: tuple[LaunchMonitor, Any, Any]) -> None:
    monitor, runtime, candidate = setup
    x = torch.randn(5)
    with monitor.watch() as record:
        candidate.host(runtime.FakeKernel("double"), x)
    assert record.host_reads == ("Tensor.tolist",)


def test_only_outermost_non_warmup_launches_count(runtime: Any) -> None:
    monitor, x = LaunchMonitor("fake"), torch.randn(3)
    outer, inner = runtime.FakeKernel("outer"), runtime.FakeKernel("inner")
    with monitor.watch() as record:
        outer.launch(x, torch.empty(3), inner=inner)
        outer.launch(x, torch.empty(3), warmup=True)
        assert note_launch("direct")
    assert record.launches == 2 and record.kernels == ("outer", "direct")
    assert not note_launch("outside a watch")


def test_one_watch_at_a_time_and_the_state_is_reset(runtime: Any) -> None:
    monitor = LaunchMonitor("fake")
    with monitor.watch(), pytest.raises(RuntimeError, match="already active"), monitor.watch():
        pass
    assert WATCH.record is None and WATCH.depth == 0
    with pytest.raises(ZeroDivisionError), monitor.watch() as record:
        runtime.FakeKernel("k").launch(torch.ones(1), torch.empty(1))
        _ = 1 / 0
    assert record.launches == 1 and not record.completed and WATCH.record is None and WATCH.depth == 0


def test_an_empty_call_is_marked() -> None:
    monitor = LaunchMonitor("fake")
    with monitor.watch(((torch.empty(0, 4),), {"eps": 1e-5})) as record:
        pass
    assert record.empty_call
    with monitor.watch(((torch.empty(0, 4), torch.ones(2)), {})) as record:
        pass
    assert not record.empty_call


def test_a_module_kernel_calling_linear_is_watched_as_a_library_call(setup: tuple[LaunchMonitor, Any, Any]) -> None:
    monitor, runtime, candidate = setup
    x, w = torch.randn(4, 8), torch.randn(6, 8)
    with monitor.watch(((x, w), {})) as record:
        candidate.module_like(runtime.FakeKernel("double"), x, w)
    assert record.launches == 1 and record.compute_ops == () and record.library_ops
    assert launch_issues([record], LaunchPolicy.for_modules()) == []
    assert launch_issues([record])  # refused for a function kernel
