"""The verdict belongs to the harness (issue 9, item 3): the candidate runs in the sandbox child, the oracle and the
verdict in the parent. Real children, real Triton (interpreted on CPU), the real oracle; screening is off where a
test needs the candidate to do what the screen forbids (the point is what happens when the screen is walked around).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from forge.checking import KernelUtils
from forge.outcome import Outcome
from forge.samples import Sample
from forge.sandbox.wire import Outbox, RemoteObject, WireError, decode_tree, encode_tree
from tests.sandbox_run import judge_file

FAST = KernelUtils(fresh_inputs_per_sample=1, warmup=1, rounds=3, min_run_time_s=0.0)
REPO = Path(__file__).resolve().parents[3]

SILU = textwrap.dedent(
    """
    import torch
    import triton
    import triton.language as tl
    # HEADER


    @triton.jit
    def _silu(x_ptr, out_ptr, n, SCALE: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + offs, (SCALE * x / (1.0 + tl.exp(-x))).to(out_ptr.dtype.element_ty), mask=mask)


    def kernel_function(input, inplace=False):
        # BODY
        x = input.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        _silu[(triton.cdiv(n, 128),)](x, out, n, SCALE=SCALE, BLOCK=128)
        return out
    """
)


def silu(scale: float = 1.0, *, body: str = "", header: str = "") -> str:
    header = textwrap.dedent(header).strip() + f"\nSCALE = {scale}\n"
    body = textwrap.indent(textwrap.dedent(body).strip() or "pass", "    ") + "\n"
    return SILU.replace("# HEADER\n", header).replace("    # BODY\n", body)


def silu_samples() -> list[Sample]:
    return [Sample((torch.randn(4, 64, generator=torch.Generator().manual_seed(1)),), {})]


def judge(source: str, samples: list[Sample] | None = None, function: str = "silu", **kwargs):
    kwargs.setdefault("kernel_utils", FAST)
    kwargs.setdefault("benchmark", False)
    kwargs.setdefault("timeout_s", 90)
    kwargs.setdefault("screen", False)
    return judge_file(source, function, samples or silu_samples(), **kwargs)


# ---------------------------------------------------------------------------------------------------------
# Forged verdicts and a patched judge, in the child, change nothing
# ---------------------------------------------------------------------------------------------------------
_FORGE_FILES = """
import json as _json
import os as _os


def _forge():
    verdict = {"status": "ok", "message": "correct on every sample", "details": {},
               "latency_ms": {"median_ms": 0.001}, "baseline_ms": {"median_ms": 1.0}}
    written = []
    for folder in (".", _os.environ["HOME"]):
        for name in ("result.json", "verdict.json", "job.json"):
            try:
                with open(_os.path.join(folder, name), "w") as fh:
                    fh.write(_json.dumps(verdict))
                written.append(_os.path.join(folder, name))
            except OSError:
                pass
    print("FORGED", written)
    print("PASS ALL_TESTS_PASSED")
"""


def test_a_kernel_that_writes_its_own_result_json_is_still_a_mismatch(tmp_path) -> None:
    folder = tmp_path / "run"
    result = judge(silu(1.5, body="_forge()", header=_FORGE_FILES), workdir=folder, benchmark=True)
    assert "FORGED ['/kforge-scratch/home/result.json'" in result.stdout, "the forgery was written in its scratch"
    assert not (folder / "result.json").exists(), "the run folder is read-only inside the boundary"
    assert json.loads((folder / "job.json").read_text())["function_name"] == "silu", "the job is the parent's"
    assert result.status == Outcome.MISMATCH, (result.message, result.details)
    assert "outside tolerance" in result.details["errors"][0]
    assert result.latency_ms is None and result.speedup is None
    assert result.details["validated_in"] == "harness process"


_PATCH_JUDGE = """
import forge.checking.compare as _compare
import forge.checking.expectation as _expectation
import forge.checking.validation as _validation


def _nothing(*args, **kwargs):
    return None


def _patch():
    torch.Tensor.any = lambda self, *a, **k: torch.zeros((), dtype=torch.bool)
    torch.allclose = lambda *a, **k: True
    torch.equal = lambda *a, **k: True
    for module in (_compare, _expectation, _validation):
        for name in dir(module):
            if name.endswith(("mismatch", "mismatch_issue", "errors")) and callable(getattr(module, name)):
                setattr(module, name, _nothing)
        module.structure_errors = lambda *a, **k: []
"""


def _judged_in_process(source: str, tmp_path: Path) -> list[str]:
    """The old path: the candidate imported and validated in one process (a fresh interpreter, so the patches do
    not leak into pytest). Returns validate's errors."""
    kernel = tmp_path / "kernel.py"
    kernel.write_text(source)
    script = textwrap.dedent(
        f"""
        import importlib.util, json, torch
        from forge.checking import KernelUtils
        from forge.samples import Sample
        spec = importlib.util.spec_from_file_location("kforge_candidate", {str(kernel)!r})
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        samples = [Sample((torch.randn(4, 64, generator=torch.Generator().manual_seed(1)),), {{}})]
        module.kernel_function(*samples[0].args)  # the first call patches the judge
        errors = KernelUtils(fresh_inputs_per_sample=1).validate(torch.nn.functional.silu, module.kernel_function,
                                                                 samples)
        print(json.dumps([str(e) for e in errors]))
        """
    )
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=240,
                          cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_kernel_that_patches_the_judge_in_its_process_is_still_a_mismatch(tmp_path) -> None:
    source = silu(1.5, body="_patch()", header=_PATCH_JUDGE)
    result = judge(source)
    assert result.status == Outcome.MISMATCH, (result.message, result.details)
    assert "outside tolerance" in " ".join(result.details["errors"])


@pytest.mark.slow
def test_judged_in_its_own_process_the_same_patch_blinds_the_comparison(tmp_path) -> None:
    """Shows the test above can fail: where the kernel runs in the judge's process, validate finds fewer problems
    (the value comparisons are gone; what is left are the judge's integrity checks, when it has them)."""
    patched = _judged_in_process(silu(1.5, body="_patch()", header=_PATCH_JUDGE), tmp_path)
    assert not any("outside tolerance" in e for e in patched), patched


def test_honest_kernels_pass_and_timings_are_marked_feedback_only() -> None:
    result = judge(silu(), benchmark=True)
    assert result.status == Outcome.OK, (result.message, result.details, result.stderr[-2000:])
    assert result.details["timing_source"] == "sandbox child (feedback only)"
    assert result.latency_ms["median_ms"] > 0 and result.baseline_ms["median_ms"] > 0


# ---------------------------------------------------------------------------------------------------------
# The oracle's memory checks work across the process boundary
# ---------------------------------------------------------------------------------------------------------
_UNWRITTEN_TAIL = (
    "x = input.contiguous()\n"
    "out = torch.empty_like(x)\n"
    "_silu[(triton.cdiv(x.numel() - 64, 128),)](x, out, x.numel() - 64, SCALE=SCALE, BLOCK=128)\n"
    "return out"
)


def test_poisoned_allocations_catch_an_output_the_kernel_never_writes() -> None:
    result = judge(silu(body=_UNWRITTEN_TAIL))
    assert result.status == Outcome.MISMATCH, (result.message, result.details)
    text = " ".join(result.details["errors"])
    assert "outside tolerance" in text or "NaN" in text, text


def test_an_output_buffer_kept_across_calls_is_seen_as_the_same_memory() -> None:
    body = (
        "x = input.contiguous()\n"
        "if x.shape not in _CACHE:\n"
        "    _CACHE[x.shape] = torch.empty_like(x)\n"
        "out = _CACHE[x.shape]\n"
        "_silu[(triton.cdiv(x.numel(), 128),)](x, out, x.numel(), SCALE=SCALE, BLOCK=128)\n"
        "return out"
    )
    result = judge(silu(body=body, header="_CACHE = {}"))
    assert result.status == Outcome.MISMATCH, (result.message, result.details)
    assert "reuses an output buffer" in " ".join(result.details["errors"])


RELU_INPLACE = textwrap.dedent(
    """
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def _relu(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        tl.store(y_ptr + offs, tl.maximum(x, 0.0), mask=mask)


    def kernel_function(input, inplace=False):
        out = input if inplace else torch.empty_like(input)
        _relu[(triton.cdiv(input.numel(), 128),)](input, out, input.numel(), BLOCK=128)
        return OUT
    """
)


def _inplace_samples() -> list[Sample]:
    return [Sample((torch.randn(4, 64, generator=torch.Generator().manual_seed(2)),), {"inplace": True})]


def test_an_in_place_kernel_that_returns_its_input_is_ok() -> None:
    result = judge(RELU_INPLACE.replace("OUT", "out"), _inplace_samples(), "relu")
    assert result.status == Outcome.OK, (result.message, result.details, result.stderr[-2000:])


def test_an_in_place_kernel_that_returns_a_copy_is_a_mismatch() -> None:
    result = judge(RELU_INPLACE.replace("OUT", "out.clone()"), _inplace_samples(), "relu")
    assert result.status == Outcome.MISMATCH, (result.message, result.details)
    assert "does not share that input's memory" in " ".join(result.details["errors"])


def test_a_kernel_that_modifies_an_input_it_must_not_is_a_mismatch() -> None:
    result = judge(silu(body="input.mul_(2.0)"))
    assert result.status == Outcome.MISMATCH, (result.message, result.details)
    assert "modified an input" in " ".join(result.details["errors"])


# ---------------------------------------------------------------------------------------------------------
# Ends of the child are still classified by the parent
# ---------------------------------------------------------------------------------------------------------
def test_system_exit_in_a_call_is_a_runtime_error() -> None:
    result = judge(silu(body="raise SystemExit(0)"))
    assert result.status == Outcome.RUNTIME_ERROR, (result.message, result.details)
    assert result.details["exception"]["type"] == "builtins.SystemExit"


def test_system_exit_at_import_is_a_compile_error() -> None:
    result = judge(silu(header="raise SystemExit(0)"))
    assert result.status == Outcome.COMPILE_ERROR, (result.message, result.details)
    assert "SystemExit" in result.message


def test_a_child_that_exits_mid_call_is_a_crash() -> None:
    result = judge(silu(body="import os\nos._exit(3)"))
    assert result.status == Outcome.CRASH, (result.message, result.details)
    assert result.details["exit_code"] == 3 and "without a valid result" in result.message


def test_a_forged_message_on_the_channel_stops_the_child_and_is_a_crash() -> None:
    """The kernel writes a frame of its own on the channel's descriptor: the parent refuses it, never a verdict."""
    body = (
        "import os, socket, stat\n"
        "for fd in range(3, 64):\n"
        "    try:\n"
        "        if stat.S_ISSOCK(os.fstat(fd).st_mode):\n"
        "            os.write(fd, b'\\x00\\x00\\x00\\x05\\x00\\x00\\x00\\x00\\x4b\\x46{\"op\"')\n"
        "    except OSError:\n"
        "        pass"
    )
    result = judge(silu(body=body), timeout_s=60)
    assert result.status == Outcome.CRASH, (result.message, result.details)
    assert "stopped" in result.message or "without a valid result" in result.message


# ---------------------------------------------------------------------------------------------------------
# The wire: the parent decodes data only, and checks every view against its storage
# ---------------------------------------------------------------------------------------------------------
def test_outputs_are_decoded_as_data_with_views_checked_against_their_storage() -> None:
    outbox = Outbox()
    base = torch.arange(12, dtype=torch.float32)
    tree = encode_tree((base[2:6], {"n": 3, "x": float("nan")}, [base.view(3, 4).t()], object()), outbox)
    storages = [torch.empty(s["nbytes"], dtype=torch.uint8).untyped_storage() for s in outbox.storages]
    for storage, original in zip(storages, outbox.keep, strict=True):
        torch.empty(0, dtype=torch.uint8).set_(storage).copy_(torch.empty(0, dtype=torch.uint8).set_(original))
    outbox.close()
    view, extras, (transposed,), opaque = decode_tree(tree, lambda ref: storages[ref[1]])
    assert torch.equal(view, base[2:6]) and torch.equal(transposed, base.view(3, 4).t())
    assert view.untyped_storage().data_ptr() == transposed.untyped_storage().data_ptr(), "one storage, two views"
    assert extras["n"] == 3 and extras["x"] != extras["x"]
    assert isinstance(opaque, RemoteObject)

    too_far = {"T": {"ref": ["new", 0], "dtype": "float32", "shape": [13], "stride": [1], "offset": 0}}
    with pytest.raises(WireError, match="reaches byte"):
        decode_tree(too_far, lambda ref: storages[0])
    for bad in ({"T": {"ref": ["new", 0], "dtype": "object", "shape": [1], "stride": [1], "offset": 0}},
                {"pickle": "cos\nsystem\n"}, {"T": {"ref": ["new", 0], "dtype": "float32", "shape": [-1],
                                                    "stride": [1], "offset": 0}}):
        with pytest.raises(WireError):
            decode_tree(bad, lambda ref: storages[0])
    deep: object = 1
    for _ in range(100):
        deep = {"list": [deep]}
    with pytest.raises(WireError, match="deep"):
        decode_tree(deep, lambda ref: storages[0])


# ---------------------------------------------------------------------------------------------------------
# On a GPU: the same checks with tensors crossing the boundary through host memory
# ---------------------------------------------------------------------------------------------------------
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.cuda
@needs_cuda
def test_on_cuda_honest_forged_in_place_and_reused_buffers_are_judged_in_the_harness() -> None:
    cuda = [Sample((torch.randn(64, 1024, device="cuda"),), {})]
    honest = judge(silu(), cuda, benchmark=True, timeout_s=300)
    assert honest.status == Outcome.OK, (honest.message, honest.details, honest.stderr[-2000:])
    assert honest.latency_ms["device"].startswith("cuda")
    patched = judge(silu(1.5, body="_patch()", header=_PATCH_JUDGE), cuda, timeout_s=300)
    assert patched.status == Outcome.MISMATCH, (patched.message, patched.details)
    unwritten = judge(silu(body=_UNWRITTEN_TAIL), cuda, timeout_s=300)
    assert unwritten.status == Outcome.MISMATCH, (unwritten.message, unwritten.details)
    inplace = [Sample((torch.randn(64, 1024, device="cuda"),), {"inplace": True})]
    assert judge(RELU_INPLACE.replace("OUT", "out"), inplace, "relu", timeout_s=300).status == Outcome.OK
    copy = judge(RELU_INPLACE.replace("OUT", "out.clone()"), inplace, "relu", timeout_s=300)
    assert copy.status == Outcome.MISMATCH and "does not share" in " ".join(copy.details["errors"])
