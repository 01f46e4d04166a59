"""Limits of the harness are the harness's: sized from the case, and when one is reached the verdict is
`harness_error` naming it (`forge.judging.HarnessLimit`), never the candidate's `runtime_error` or `crash`.

The old fixed 256 MiB RLIMIT_FSIZE of the child refused every output of a few hundred MB (an lm_head at prefill
writes 525 MB), because a reply's tensors travel as memory files, and the refusal reached the model as "your file
raised an exception while running"."""

from __future__ import annotations

import torch

from forge.checking import KernelUtils
from forge.judging import FunctionTarget, HarnessLimit
from forge.outcome import Outcome
from forge.samples import Sample, TensorSpec
from forge.sandbox import SandboxOptions
from forge.sandbox.runner import case_bytes
from tests.forge.sandbox.test_sandbox import relu_with, run

FAST = KernelUtils(fresh_inputs_per_sample=1, warmup=1, rounds=3, min_run_time_s=0.0)


def test_the_limits_are_sized_from_the_case_an_lm_head_included() -> None:
    """Llama-3.2-1B's lm_head at prefill: bf16[1, 2048, 2048] x bf16[128256, 2048] -> a 525 MB output. The case is
    sized on meta tensors (nothing is allocated), and the child's limits then fit it with room."""
    x = TensorSpec((1, 2048, 2048), torch.bfloat16, "cpu", (2048 * 2048, 2048, 1), 0)
    w = TensorSpec((128256, 2048), torch.bfloat16, "cpu", (2048, 1), 0)
    target = FunctionTarget("linear", (Sample((x, w), {}),))
    moved = case_bytes(target)
    output = 2048 * 128256 * 2
    assert moved == x.nbytes + w.nbytes + output
    sized = SandboxOptions(memory_limit_bytes=1 << 30).sized_for(moved)
    assert sized.memory_limit_bytes >= 4 * moved and sized.reply_bytes >= 2 * moved
    assert sized.file_size_bytes >= sized.reply_bytes > 256 << 20  # the old fixed limit
    big = SandboxOptions().sized_for(5 << 30)  # KernelBench's shipped sizes: several GB per input
    assert big.memory_limit_bytes >= 20 << 30 and big.file_size_bytes >= 20 << 30
    assert SandboxOptions().sized_for(1 << 20).memory_limit_bytes == SandboxOptions().memory_limit_bytes
    explicit = SandboxOptions(file_size_limit_bytes=1 << 20, reply_limit_bytes=2 << 20).sized_for(5 << 30)
    assert (explicit.file_size_bytes, explicit.reply_bytes) == (1 << 20, 2 << 20)  # set explicitly: kept


def test_an_output_over_2_gib_travels_from_the_child(tmp_path) -> None:
    """A 2.2 GiB tensor crosses the channel (memory files bounded by the case-sized limits, not 256 MiB): the
    parent receives it and judges it (here a wrong shape, so a mismatch of the candidate's, decided in the parent),
    instead of a `File too large` in the child reported as the candidate's exception."""
    huge = 2_361_000_000 // 4  # float32 elements: 2.2 GiB, sent once (the oracle keeps each run's outputs)
    body = f"_CALLS.append(1)\nif len(_CALLS) == 1:\n    return torch.empty({huge}, dtype=torch.float32)"
    result = run(relu_with(body, "_CALLS = []"), screen=False, timeout_s=240)
    assert result.status == Outcome.MISMATCH, (result.status, result.message, result.stderr[-2000:])
    assert "shape" in " ".join(result.details["errors"])
    assert result.limit is None


def test_a_reply_over_the_file_size_limit_is_a_harness_error_naming_it() -> None:
    body = "return torch.zeros(4 << 20, dtype=torch.float32)"  # 16 MiB, over the 1 MiB limit set below
    result = run(relu_with(body), screen=False, file_size_limit_bytes=1 << 20)
    assert result.status == Outcome.HARNESS_ERROR, (result.status, result.message, result.stderr[-2000:])
    assert result.limit is HarnessLimit.FILE_SIZE and "not the candidate's fault" in result.message
    assert not result.status.blames_candidate


def test_a_reply_over_what_the_parent_accepts_is_a_harness_error_naming_it() -> None:
    body = "return torch.zeros(4 << 20, dtype=torch.float32)"
    result = run(relu_with(body), screen=False, reply_limit_bytes=1 << 20)
    assert result.status == Outcome.HARNESS_ERROR and result.limit is HarnessLimit.REPLY_SIZE, result.message


def test_memory_exhausted_under_the_childs_limit_is_a_harness_error_naming_it() -> None:
    body = "big = torch.empty(3 << 30, dtype=torch.uint8)\nbig.fill_(1)"  # 3 GiB, over the 1 GiB limit
    result = run(relu_with(body), screen=False, memory_limit_bytes=1 << 30)
    assert result.status == Outcome.HARNESS_ERROR, (result.status, result.message, result.stderr[-2000:])
    assert result.limit is HarnessLimit.MEMORY


def test_the_candidates_own_exception_is_still_its_runtime_error() -> None:
    """The control: an ordinary exception in the candidate is not a harness limit."""
    result = run(relu_with("raise OSError(5, 'an I/O error of its own')"), screen=False)
    assert result.status == Outcome.RUNTIME_ERROR and result.limit is None


def test_time_the_harness_spends_does_not_count_against_the_candidate() -> None:
    """The time limit is the candidate's: the child's start-up, import and the time it holds the turn. A slow
    oracle (here a reference that sleeps 0.7 s per call, a dozen calls or more) does not time a quick kernel out."""

    class SlowReference(KernelUtils):
        def validate(self, reference_fn, candidate, samples):
            import time

            def slow(*args, **kwargs):
                time.sleep(0.7)
                return reference_fn(*args, **kwargs)

            return super().validate(slow, candidate, samples)

    utils = SlowReference(fresh_inputs_per_sample=1, warmup=1, rounds=3, min_run_time_s=0.0)
    result = run(relu_with(), kernel_utils=utils, timeout_s=8, isolation="none", allow_unsafe=True)
    assert result.status == Outcome.OK, (result.message, result.details)
    assert result.wall_s > 8 > result.details["child_s"]


def test_the_parent_running_out_of_memory_for_the_outputs_is_a_harness_error(monkeypatch) -> None:
    """On a shared GPU the harness itself may not have room for what the child sends (seen on the H200 with two
    judges at KernelBench's shipped sizes): that is the harness's limit, not a malformed reply of the child."""
    from forge.sandbox import harness, wire

    real = wire.read_storage

    def tight(fd, nbytes, device, into=None):
        if nbytes >= 512:  # the outputs, not the 0-byte bookkeeping
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 6.00 GiB (test)")
        return real(fd, nbytes, device, into)

    monkeypatch.setattr(harness.wire, "read_storage", tight)
    result = run(relu_with())
    assert result.status == Outcome.HARNESS_ERROR, (result.status, result.message)
    assert result.limit is HarnessLimit.DEVICE_MEMORY and "could not hold the outputs" in result.message


def test_triton_reporting_cuda_out_of_memory_is_the_device_memory_limit() -> None:
    from forge.sandbox.child import limit_of

    assert limit_of(RuntimeError("Triton Error [CUDA]: out of memory")) is HarnessLimit.DEVICE_MEMORY
    assert limit_of(MemoryError()) is HarnessLimit.MEMORY
    assert limit_of(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 9 GB")) \
        is HarnessLimit.MEMORY
    assert limit_of(ValueError("a bad shape")) is None
