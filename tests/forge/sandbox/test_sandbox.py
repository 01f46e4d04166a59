"""The sandbox end to end: real child processes, real Triton (interpreted on CPU), the real oracle and benchmark.

Shapes are tiny so the interpreter is quick; every status has a test that produces it from a real candidate.
"""

from __future__ import annotations

import os
import signal
import socket
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

from agent.languages import get_language
from forge.checking import KernelUtils
from forge.judging import FunctionTarget
from forge.outcome import Outcome
from forge.samples import Sample, TensorSpec
from forge.sandbox import (
    IsolationLevel,
    SandboxOptions,
    SandboxPool,
    boundary_isolation,
    kill_all,
    live_process_groups,
    network_isolation,
)
from tests.sandbox_run import judge_file

FAST = KernelUtils(fresh_inputs_per_sample=1, warmup=1, rounds=3, min_run_time_s=0.0)

RELU = textwrap.dedent(
    """
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def _relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        tl.store(y_ptr + offs, tl.maximum(x, 0.0), mask=mask)


    def kernel_function(input, inplace=False):
        x = input.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        # BODY
        _relu_kernel[(triton.cdiv(n, 128),)](x, y, n, BLOCK=128)
        return y.view(input.shape)
    """
)


def relu_with(body: str = "", header: str = "", *, kernel: tuple[str, str] | None = None) -> str:
    """The correct relu kernel with extra lines in kernel_function, a header after the imports, or a kernel edit."""
    source = RELU.replace("    # BODY", textwrap.indent(textwrap.dedent(body).strip("\n"), "    ") if body else "")
    if header:
        source = source.replace("import triton.language as tl\n", "import triton.language as tl\n" + header + "\n")
    if kernel:
        assert kernel[0] in source
        source = source.replace(*kernel)
    return source


def samples() -> list[Sample]:
    return [Sample((torch.randn(4, 32, generator=torch.Generator().manual_seed(0)),), {})]


def run(source: str, **kwargs) -> object:
    kwargs.setdefault("kernel_utils", FAST)
    kwargs.setdefault("benchmark", False)
    kwargs.setdefault("timeout_s", 60)
    return judge_file(source, "relu", samples(), **kwargs)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ---------------------------------------------------------------------------------------------------------
# The statuses
# ---------------------------------------------------------------------------------------------------------
def test_correct_kernel_is_ok_with_candidate_and_baseline_timings(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    two = [Sample((torch.randn(4, 32),), {}), Sample((TensorSpec((2, 16), torch.float32),), {})]
    result = judge_file(relu_with("print('hello from the candidate')"), "relu", two, kernel_utils=FAST,
                           benchmark=True, counts=[2, 1], timeout_s=60)
    assert result.status == "ok", (result.message, result.details, result.stderr)
    for timing in (result.latency_ms, result.baseline_ms):
        assert timing is not None and timing["median_ms"] > 0 and timing["runs"] >= 3 and timing["device"] == "cpu"
    assert result.speedup is not None and result.speedup > 0
    assert "hello from the candidate" in result.stdout
    assert result.isolation is IsolationLevel.BOUNDARY and "bubblewrap" in result.isolation_reason
    assert result.source_path is None
    assert not list(tmp_path.glob("kforge-sandbox-*")), "the run folder must be removed when not kept"
    assert result.to_dict()["status"] == "ok"


def test_workdir_keeps_the_artifacts(tmp_path) -> None:
    folder = tmp_path / "attempt-1"
    result = run(relu_with(), workdir=folder)
    assert result.status == "ok"
    assert result.source_path == str(folder / "kernel.py")
    assert Path(result.source_path).read_text() == relu_with()
    assert (folder / "job.json").is_file() and (folder / "stdout.txt").is_file()
    assert not (folder / "result.json").exists(), "the verdict lives in the harness, never in the child's folder"
    with pytest.raises(ValueError, match="not empty"):
        run(relu_with(), workdir=folder)


def test_syntax_error_is_a_compile_error_and_nothing_runs(tmp_path) -> None:
    marker = tmp_path / "run" / "ran"  # the run folder is the child's working directory
    source = relu_with(header="open('ran', 'w').close()").replace(
        "def kernel_function(input, inplace=False):", "def kernel_function(input, inplace=False)")
    result = run(source, workdir=tmp_path / "run")
    assert result.status == "compile_error"
    assert "syntax error" in result.message and "expected ':'" in result.message
    assert result.details["phase"] == "screening"
    assert not marker.exists()


def test_triton_compile_error_is_a_compile_error_with_the_log() -> None:
    result = run(relu_with(kernel=("tl.arange(0, BLOCK)", "tl.arange(0, 3)")))
    assert result.status == "compile_error", (result.message, result.details)
    assert "power of 2" in result.details["compile_log"]
    assert "kernel.py" in result.details["exception"]["traceback"]


def test_wrong_values_are_a_mismatch_with_the_errors() -> None:
    result = run(relu_with(kernel=("tl.maximum(x, 0.0)", "tl.maximum(x, 0.5)")))
    assert result.status == "mismatch", (result.message, result.details)
    errors = result.details["errors"]
    assert errors and all(isinstance(e, str) for e in errors)
    assert "outside tolerance" in errors[0]
    assert result.latency_ms is None


def test_mismatch_carries_the_structured_issues_and_the_worst_elements() -> None:
    result = run(relu_with(kernel=("tl.maximum(x, 0.0)", "tl.maximum(x, 0.5)")))
    assert result.status == Outcome.MISMATCH
    issue = result.issues[0]
    assert issue.kind is Outcome.MISMATCH and issue.sample == 0 and issue.case == "captured" and issue.leaf == "output"
    x = samples()[0].args[0]  # samples() is seeded by the test: recompute what the kernel returned
    rows = result.details["mismatches"]
    assert rows and rows[0]["sample"] == 0 and rows[0]["output"] == "output"
    for row in rows:
        index = tuple(row["index"])
        assert row["expected"] == pytest.approx(torch.relu(x)[index].item())
        assert row["actual"] == pytest.approx(torch.clamp_min(x, 0.5)[index].item())
        assert row["abs_diff"] == pytest.approx(abs(row["actual"] - row["expected"]))


@pytest.mark.parametrize(("failure", "out_of_memory"),
                         [("raise", False), ("oom", True), ("memory_error", True), ("allocate", True)])
def test_a_failing_reference_is_a_harness_error_not_the_candidates(failure: str, out_of_memory: bool) -> None:
    from tests.forge.sandbox.harness_faults import FailingReferenceUtils

    utils = FailingReferenceUtils(fresh_inputs_per_sample=1, warmup=1, rounds=3, min_run_time_s=0.0, failure=failure)
    # The oracle (and so this reference) runs in the harness process: the boundary need not show the tests package.
    result = run(relu_with(), kernel_utils=utils, memory_limit_bytes=8 << 30)
    assert result.status == Outcome.HARNESS_ERROR, (result.message, result.details, result.stderr[-2000:])
    assert not result.status.blames_candidate
    assert result.details["out_of_memory"] is out_of_memory
    assert "exception" not in result.details and "harness error" in result.message
    assert result.details["harness_error"]["type"] != "builtins.ModuleNotFoundError"
    assert ("ran out of memory" in result.message) is out_of_memory


def test_a_bug_in_the_harness_is_a_harness_error_not_a_crash() -> None:
    from tests.forge.sandbox.harness_faults import BrokenHarnessUtils

    result = run(relu_with(), kernel_utils=BrokenHarnessUtils())
    assert result.status == Outcome.HARNESS_ERROR and "a bug in the harness" in result.message
    assert result.details["harness_error"]["type"] == "builtins.RuntimeError"


def test_exception_in_the_wrapper_is_a_runtime_error() -> None:
    result = run(relu_with("raise ValueError('boom from the candidate')"))
    assert result.status == "runtime_error", (result.message, result.details)
    exception = result.details["exception"]
    assert exception["type"] == "builtins.ValueError" and exception["message"] == "boom from the candidate"
    assert "kernel.py" in exception["traceback"] and "child.py" not in exception["traceback"]


@pytest.mark.parametrize(
    ("body", "header", "construct"),
    [
        ("y = F.relu(x)", "import torch.nn.functional as F", "torch.nn.functional.relu"),
        ("y = torch.relu(x)", "", "torch.relu"),
        ("y = x.relu()", "", ".relu"),
        ("y = G.relu(x)", "from torch.nn import functional as G", "torch.nn.functional.relu"),
    ],
)
def test_forbidden_candidate_never_runs(body: str, header: str, construct: str) -> None:
    # Were it run, the candidate would print the marker at import.
    source = relu_with(body + "\nreturn y", header + "\nprint('IMPORTED-MARKER')")
    result = run(source)
    assert result.status == "forbidden"
    assert construct in [v["construct"] for v in result.details["violations"]]
    assert construct.lstrip(".") in result.message
    assert "IMPORTED-MARKER" not in result.stdout


def test_the_marker_route_does_run_when_screening_is_off() -> None:
    """Shows the marker proves something: the same forbidden candidate, unscreened, runs and prints it."""
    source = relu_with("y = torch.relu(x)\nreturn y", "print('IMPORTED-MARKER')")
    result = run(source, screen=False)
    assert "IMPORTED-MARKER" in result.stdout
    assert result.status != "forbidden"  # it ran (the run-time launch check may still refuse the PyTorch fallback)


def test_the_run_folder_is_read_only_and_the_scratch_is_private(tmp_path) -> None:
    """Inside the boundary the child cannot write the run folder the parent wrote (its job, its inputs), and what
    it writes in its scratch (home, caches) is gone with it: the next candidate cannot find it."""
    probe = ("try:\n"
             "    open('planted', 'w').write('x')\n"
             "    print('RUN-FOLDER writable')\n"
             "except OSError as exc:\n"
             "    print('RUN-FOLDER refused', type(exc).__name__)\n"
             "open(HOME_FILE, 'w').write('x')\n")
    first = run(relu_with("", probe.replace("HOME_FILE", "'/kforge-scratch/home/planted.pt'")), screen=False,
                workdir=tmp_path / "first")
    assert "RUN-FOLDER refused" in first.stdout, first.stdout + first.stderr
    assert not (tmp_path / "first" / "planted").exists()
    second = run(relu_with("", "import os\nprint('SEEN', os.listdir('/kforge-scratch/home'))"), screen=False)
    assert "SEEN []" in second.stdout, second.stdout + second.stderr


def test_hanging_kernel_times_out_and_its_process_group_is_gone() -> None:
    result = run(relu_with("while True:\n    pass"), timeout_s=5)
    assert result.status == "timeout"
    assert result.details["cancelled"] is False and result.details["timeout_s"] == 5
    assert not group_alive(result.details["pid"])
    assert result.details["pid"] not in live_process_groups()


def test_segfault_is_a_crash_with_the_signal_and_the_parent_goes_on() -> None:
    # Screening refuses `import ctypes`, so the crash path is exercised with screening off (unsafe, tests only).
    # A real fault: inside the boundary the child is PID 1 of its namespace, which ignores a self-sent SIGSEGV.
    source = relu_with("ctypes.string_at(0)", "import ctypes")
    result = run(source, screen=False)
    assert result.status == "crash"
    assert result.details["signal"] == "SIGSEGV" and result.details["signal_number"] == signal.SIGSEGV
    assert "SIGSEGV" in result.message
    assert not group_alive(result.details["pid"])
    # The parent is unaffected and can screen the next candidate.
    assert run(relu_with("y = torch.relu(x)")).status == "forbidden"


def test_cpu_limit_kills_a_busy_child() -> None:
    result = run(relu_with("while True:\n    pass"), timeout_s=120, cpu_limit_s=6)
    assert result.status == "crash", (result.message, result.details)
    assert result.details["signal"] in {"SIGXCPU", "SIGKILL"}


_PROBE = textwrap.dedent(
    """
    import os
    import socket
    import sys

    _PORT = {port}
    _REPORTED = []


    def _report():
        if _REPORTED:
            return
        _REPORTED.append(True)
        for name in ("OPENAI_API_KEY", "KFORGE_LLM_API_KEY", "MY_SERVICE_TOKEN"):
            print("ENV", name, repr(os.environ.get(name)))
        print("ENVKEYS", ",".join(sorted(os.environ)))
        print("HOME", os.environ.get("HOME"))
        try:
            socket.create_connection(("127.0.0.1", _PORT), timeout=2).close()
            print("NET connected")
        except OSError as exc:
            print("NET blocked", type(exc).__name__)
        sys.stdout.flush()
    """
)


@pytest.fixture
def listener():
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    yield server.getsockname()[1]
    server.close()


def test_child_sees_no_secrets_and_no_network(monkeypatch, listener) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-parent-secret")
    monkeypatch.setenv("KFORGE_LLM_API_KEY", "kf-test-parent-secret")
    monkeypatch.setenv("MY_SERVICE_TOKEN", "tok-test-parent-secret")
    source = relu_with("_report()", header=_PROBE.format(port=listener))
    result = run(source, screen=False)
    assert result.status == "ok", (result.message, result.details, result.stderr)
    for name in ("OPENAI_API_KEY", "KFORGE_LLM_API_KEY", "MY_SERVICE_TOKEN"):
        assert f"ENV {name} None" in result.stdout
    assert "secret" not in result.stdout
    keys = next(line for line in result.stdout.splitlines() if line.startswith("ENVKEYS")).split(" ", 1)[1]
    assert not any(k in keys for k in ("KEY", "TOKEN", "SECRET"))
    assert "HOME /kforge-scratch/home" in result.stdout  # the child's private scratch
    assert result.isolation is IsolationLevel.BOUNDARY
    assert "NET blocked" in result.stdout


def test_without_isolation_the_same_probe_reaches_the_network(listener) -> None:
    """The network check above can fail: with isolation off, the probe connects."""
    result = run(relu_with("_report()", header=_PROBE.format(port=listener)), screen=False, isolation="none")
    assert result.status == "ok"
    assert result.isolation is IsolationLevel.NONE and "isolation='none'" in result.isolation_reason
    assert "NET connected" in result.stdout


def test_isolation_probes_are_cached_typed_and_explained() -> None:
    first = network_isolation()
    assert first is network_isolation()
    assert first.level in {IsolationLevel.NETWORK, IsolationLevel.NONE} and first.reason
    assert (first.level is IsolationLevel.NETWORK) == bool(first.prefix)
    boundary = boundary_isolation()
    assert boundary is boundary_isolation()
    assert boundary.level in {IsolationLevel.BOUNDARY, IsolationLevel.NONE} and boundary.reason
    assert boundary.safe == (boundary.level is IsolationLevel.BOUNDARY)


# ---------------------------------------------------------------------------------------------------------
# Cancellation, kill_all and the pool
# ---------------------------------------------------------------------------------------------------------
def _start(target, *args, **kwargs) -> tuple[threading.Thread, dict]:
    box: dict = {}
    thread = threading.Thread(target=lambda: box.setdefault("result", target(*args, **kwargs)), daemon=True)
    thread.start()
    return thread, box


def _wait_for(predicate, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def test_kill_all_ends_every_live_child() -> None:
    thread, box = _start(run, relu_with("while True:\n    pass"), timeout_s=120)
    _wait_for(lambda: bool(live_process_groups()))
    groups = live_process_groups()
    assert kill_all(timeout_s=5.0) >= 1
    thread.join(10)
    assert not thread.is_alive()
    result = box["result"]
    assert result.status == "timeout" and result.details["cancelled"] is True
    assert live_process_groups() == []
    assert not any(group_alive(g) for g in groups)


def test_cancel_event_aborts_a_running_child() -> None:
    cancel = threading.Event()
    thread, box = _start(run, relu_with("while True:\n    pass"), timeout_s=120, cancel_event=cancel)
    _wait_for(lambda: bool(live_process_groups()))
    cancel.set()
    thread.join(10)
    result = box["result"]
    assert result.status == "timeout"
    assert result.details["cancelled"] is True and result.details["reason"] == "cancel_event was set"
    assert not group_alive(result.details["pid"])


def test_pool_limits_concurrency_and_cancels_waiting_runs() -> None:
    pool = SandboxPool(max_concurrent=1, options=SandboxOptions(timeout_s=120))
    target, triton = FunctionTarget("relu", tuple(samples())), get_language("triton")
    first_thread, first = _start(pool.run, relu_with("while True:\n    pass"), target, triton, kernel_utils=FAST,
                                 benchmark=False)
    _wait_for(lambda: bool(pool.live_process_groups()))
    cancel = threading.Event()
    second_thread, second = _start(pool.run, relu_with(), target, triton, cancel_event=cancel)
    time.sleep(0.3)
    assert second_thread.is_alive(), "the second run must wait for the only slot"
    assert len(pool.live_process_groups()) == 1
    cancel.set()
    second_thread.join(5)
    assert second["result"].status == "timeout" and second["result"].details["cancelled"] is True
    assert "waiting for a sandbox slot" in second["result"].message
    assert pool.close() == 1
    first_thread.join(10)
    assert first["result"].status == "timeout" and first["result"].details["cancelled"] is True
    assert pool.live_process_groups() == [] and live_process_groups() == []
    assert pool.run(relu_with(), target, triton).details["cancelled"] is True  # closed pool refuses


# ---------------------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------------------
def test_bad_arguments_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="not a replaceable torch.nn.functional function"):
        judge_file(RELU, "no_such_op", samples())
    with pytest.raises(ValueError, match="at least one sample"):
        judge_file(RELU, "relu", [])
    with pytest.raises(ValueError, match="isolation must be"):
        judge_file(RELU, "relu", samples(), isolation="vm")
    with pytest.raises(ValueError, match="process_limit must be"):
        judge_file(RELU, "relu", samples(), process_limit=0)
    with pytest.raises(ValueError, match="memory_limit_bytes must be"):
        judge_file(RELU, "relu", samples(), memory_limit_bytes=-1)
    with pytest.raises(ValueError, match="counts must hold one int"):
        judge_file(RELU, "relu", samples(), counts=[1, 2])
    with pytest.raises(ValueError, match="looks like a credential"):
        judge_file(RELU, "relu", samples(), extra_env={"OPENAI_API_KEY": "x"}, screen=False)
    with pytest.raises(ValueError, match="SandboxPool|max_concurrent"):
        SandboxPool(max_concurrent=0)


# ---------------------------------------------------------------------------------------------------------
# On a GPU: real Triton compilation
# ---------------------------------------------------------------------------------------------------------
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.cuda
@needs_cuda
def test_cuda_kernel_is_ok_and_timed_on_the_gpu() -> None:
    cuda_samples = [Sample((torch.randn(64, 1024, device="cuda"),), {})]
    result = judge_file(RELU, "relu", cuda_samples, kernel_utils=FAST, benchmark=True, timeout_s=300)
    assert result.status == "ok", (result.message, result.details, result.stderr)
    assert result.latency_ms["device"].startswith("cuda") and result.baseline_ms["device"].startswith("cuda")


@pytest.mark.cuda
@needs_cuda
def test_cuda_compile_error_carries_the_compiler_log() -> None:
    cuda_samples = [Sample((torch.randn(64, 1024, device="cuda"),), {})]
    source = relu_with(kernel=("tl.arange(0, BLOCK)", "tl.arange(0, 3)"))
    result = judge_file(source, "relu", cuda_samples, kernel_utils=FAST, benchmark=False, timeout_s=300)
    assert result.status == "compile_error", (result.message, result.details, result.stderr)
    assert "power of 2" in result.details["compile_log"]


@pytest.mark.cuda
@needs_cuda
def test_cuda_illegal_address_ends_only_the_child() -> None:
    cuda_samples = [Sample((torch.randn(64, 1024, device="cuda"),), {})]
    source = relu_with(kernel=("x = tl.load(x_ptr + offs, mask=mask)", "x = tl.load(x_ptr + offs + (1 << 40))"))
    result = judge_file(source, "relu", cuda_samples, kernel_utils=FAST, benchmark=False, timeout_s=300)
    assert result.status in {"runtime_error", "crash"}, (result.message, result.details)
    if result.status == "runtime_error":
        assert "illegal" in result.message or "illegal" in result.details["exception"]["message"]
    assert torch.cuda.is_available() and torch.ones(1, device="cuda").item() == 1.0


def test_device_faults_are_told_apart_from_harness_errors() -> None:
    from forge.sandbox.child import is_device_fault

    assert is_device_fault(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert is_device_fault(RuntimeError("CUDA error: device-side assert triggered"))
    assert not is_device_fault(ValueError("validate needs at least one sample"))


def test_child_python_path_keeps_the_parents_entries(tmp_path) -> None:
    from forge.sandbox.environment import child_environment, repository_root

    env = child_environment(tmp_path, parent_env={"PYTHONPATH": "/opt/site:/other", "PATH": "/bin"})
    assert env["PYTHONPATH"].split(":") == [str(repository_root()), "/opt/site", "/other"]
