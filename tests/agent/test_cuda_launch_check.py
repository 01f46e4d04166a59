"""The run-time launch check for CUDA candidates (`CudaLanguage.launch_monitor()`), with the same rules as Triton's.

CPU: the candidate files are really built (nvcc or NVRTC, for sm_90; skipped clearly without a compiler) and
really imported through `CudaLanguage.load`, the counting observer, the watch and `launch_issues` are the real
code; only the driver call is replaced (`_CubinModule.launcher`, and the pointer packing accepts CPU tensors), since
no CUDA launch can happen without a GPU. The `cuda` tests run the same candidates with real launches, directly and
through the sandbox.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
import torch

from agent.languages import get_language
from agent.languages.cuda.reference_candidates import RMS_NORM_FILE
from agent.languages.cuda.toolchain import TOOLCHAIN_ENV, find_nvcc, nvrtc_library, toolchain
from forge.checking.launch_check import LaunchMonitor, LaunchRecord, launch_issues

CUDA = get_language("cuda")
HAS_COMPILER = find_nvcc() is not None or nvrtc_library() is not None
CPU_BACKEND = "nvrtc" if nvrtc_library() is not None else "nvcc"
needs_compiler = pytest.mark.skipif(not HAS_COMPILER, reason="neither nvcc nor NVRTC is available: nothing to build")
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

_LAUNCH = "    _BY_DTYPE[input.dtype][rows, block](input, weight, out, n, _FP32_EPS if eps is None else eps)\n"
_RETURN = "    return out\n"
assert _LAUNCH + _RETURN in RMS_NORM_FILE

# rms_norm over a last dimension of size 1 is x / sqrt(x * x + eps): PyTorch computes it here, no kernel runs
# (the launch sits behind a branch never taken, so the static by-name check is satisfied).
NO_LAUNCH = RMS_NORM_FILE.replace(_LAUNCH + _RETURN, "    if rows > 1 << 40:\n    " + _LAUNCH
                                  + "    return input / (input * input + (1e-6 if eps is None else eps)) ** 0.5\n")
# Launches its kernel, then lets PyTorch compute on the result.
COMPUTE_BESIDE = RMS_NORM_FILE.replace(_LAUNCH + _RETURN, _LAUNCH + "    return out * 1.0\n")
# Launches its kernel, then reads a tensor value on the host.
HOST_READ = RMS_NORM_FILE.replace(_LAUNCH + _RETURN, _LAUNCH + "    if float(out.flatten()[0]) > 1e30:\n"
                                  "        return input\n" + _RETURN)


@pytest.fixture(scope="module")
def build_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cuda_build_cache")  # one build of the rms_norm source for the whole module


@pytest.fixture
def fake_driver(monkeypatch: pytest.MonkeyPatch, build_cache: Path) -> list[tuple]:
    """Real builds for sm_90 with a pinned toolchain; the driver launch replaced by a recorder (no GPU here)."""
    from agent.languages.cuda import runtime

    monkeypatch.setenv(TOOLCHAIN_ENV, toolchain(CPU_BACKEND, "sm_90").to_json())
    monkeypatch.setenv("KFORGE_CUDA_CACHE", str(build_cache))
    runtime.clear_loaded()
    launched: list[tuple] = []

    def launcher(self: Any, name: str):
        def run(grid: tuple, block: tuple, shared: int, values: Any) -> None:
            launched.append((name, grid, block, shared))

        return run

    monkeypatch.setattr(runtime._CubinModule, "launcher", launcher)
    monkeypatch.setattr(runtime, "_pointer", lambda value, param, kernel: 0 if value is None else value.data_ptr())
    yield launched
    runtime.clear_loaded()


def _load(tmp_path: Path, source: str) -> Any:
    assert CUDA.screen(source, "rms_norm") == [], CUDA.screen(source, "rms_norm")  # each passes the static screen
    path = tmp_path / f"candidate_{uuid.uuid4().hex[:8]}.py"
    path.write_text(source)
    return CUDA.load(path, f"kforge_test_cuda_launch_{path.stem}")


def _watched(monitor: LaunchMonitor, fn: Any, *args: Any) -> tuple[Any, LaunchRecord]:
    with monitor.watch(args) as record:
        out = fn(*args)
    return out, record


def _messages(records: list[LaunchRecord]) -> str:
    return "\n".join(str(issue) for issue in launch_issues(records))


def test_cuda_has_a_launch_monitor_that_installs_one_counting_observer() -> None:
    from agent.languages.cuda import runtime

    monitor = CUDA.launch_monitor()
    CUDA.launch_monitor()
    assert isinstance(monitor, LaunchMonitor) and monitor.language == "cuda"
    assert runtime._LAUNCH_OBSERVERS.count(runtime._count_launch) == 1


def test_launches_outside_a_watch_are_not_counted_and_inside_one_are() -> None:
    from agent.languages.cuda.runtime import _Kernel
    from agent.languages.cuda.source import parse_kernels

    (sig,) = parse_kernels('extern "C" __global__ void k(float* x, int n) {}')
    kernel = _Kernel(sig, lambda *a: None, checked_packing=True)
    monitor = CUDA.launch_monitor()
    kernel[1, 32](None, 3)  # no watch: nothing to count into
    with monitor.watch() as record:
        kernel[1, 32](None, 3)
        kernel[2, 32](None, 3)
    assert (record.launches, record.kernels) == (2, ("k",))


@needs_compiler
def test_honest_cuda_candidate_passes_and_its_launches_are_counted(tmp_path: Path, fake_driver: list) -> None:
    monitor = CUDA.launch_monitor()  # before the import, as the sandbox child does
    fn = _load(tmp_path, RMS_NORM_FILE)
    x, w = torch.randn(6, 64), torch.randn(64)
    records = [_watched(monitor, fn, x, (64,), w, 1e-6)[1], _watched(monitor, fn, x.half(), (64,))[1]]
    assert [(r.launches, r.kernels, r.compute_ops, r.host_reads) for r in records] == [
        (1, ("rms_f32",), (), ()), (1, ("rms_f16",), (), ())]
    assert [name for name, *_ in fake_driver] == ["rms_f32", "rms_f16"]
    assert launch_issues(records) == []
    _, empty = _watched(monitor, fn, torch.empty(0, 64), (64,))  # empty input: no launch needed
    assert empty.empty_call and empty.launches == 0 and launch_issues([empty]) == []


@needs_compiler
def test_cuda_candidate_that_launches_nothing_and_returns_pytorch_result_fails(tmp_path: Path,
                                                                              fake_driver: list) -> None:
    import torch.nn.functional as F

    monitor = CUDA.launch_monitor()
    fn = _load(tmp_path, NO_LAUNCH)
    x = torch.randn(8, 1)
    out, record = _watched(monitor, fn, x, (1,), None, 1e-6)
    torch.testing.assert_close(out, F.rms_norm(x, (1,), eps=1e-6))  # the right answer, from PyTorch
    assert record.launches == 0 and fake_driver == []
    assert "aten.mul.Tensor" in record.compute_ops
    message = _messages([record])
    assert "no kernel of the candidate was launched" in message and "computation outside" in message


@needs_compiler
@pytest.mark.parametrize("source,finding", [(COMPUTE_BESIDE, "aten.mul.Tensor"), (HOST_READ, "read tensor values")],
                         ids=["compute-beside-a-launch", "host-read"])
def test_cuda_candidate_that_launches_but_lets_pytorch_compute_fails(tmp_path: Path, fake_driver: list, source: str,
                                                                     finding: str) -> None:
    monitor = CUDA.launch_monitor()
    fn = _load(tmp_path, source)
    _, record = _watched(monitor, fn, torch.randn(4, 32), (32,))
    assert record.launches == 1
    message = _messages([record])
    assert message.startswith("launch check:") and finding in message


# ---------------------------------------------------------------------------------------------------------
# On a GPU: real launches, and the sandbox's verdict
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.cuda
@needs_gpu
def test_real_cuda_launches_are_counted_and_a_pytorch_fallback_is_refused(monkeypatch: pytest.MonkeyPatch,
                                                                          tmp_path: Path) -> None:
    monkeypatch.setenv("KFORGE_CUDA_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(TOOLCHAIN_ENV, raising=False)
    monitor = CUDA.launch_monitor()
    honest = _load(tmp_path, RMS_NORM_FILE)
    x = torch.randn(16, 1024, device="cuda")
    out, record = _watched(monitor, honest, x, (1024,))
    torch.cuda.synchronize()
    assert (record.launches, record.kernels) == (1, ("rms_f32",)) and launch_issues([record]) == []
    torch.testing.assert_close(out, torch.nn.functional.rms_norm(x, (1024,)), atol=1e-5, rtol=1e-5)
    cheat = _load(tmp_path, NO_LAUNCH)
    _, bad = _watched(monitor, cheat, torch.randn(16, 1, device="cuda"), (1,))
    assert bad.launches == 0 and "no kernel of the candidate was launched" in _messages([bad])


@pytest.mark.cuda
@needs_gpu
def test_sandbox_refuses_a_cuda_candidate_whose_result_pytorch_computed() -> None:
    from forge.checking import KernelUtils
    from forge.samples import Sample
    from tests.sandbox_run import judge_file

    fast = KernelUtils(fresh_inputs_per_sample=1, warmup=1, rounds=3, min_run_time_s=0.0)
    samples = [Sample((torch.randn(64, 1, device="cuda"), (1,)), {})]
    honest = judge_file(RMS_NORM_FILE, "rms_norm", samples, language="cuda", kernel_utils=fast, timeout_s=300,
                           allow_unsafe=True, benchmark=False)
    assert honest.status == "ok", (honest.message, honest.details)
    cheat = judge_file(NO_LAUNCH, "rms_norm", samples, language="cuda", kernel_utils=fast, timeout_s=300,
                          allow_unsafe=True, benchmark=False)
    assert cheat.status != "ok"
    assert any("no kernel of the candidate was launched" in e for e in cheat.details.get("errors", ())), cheat.details
