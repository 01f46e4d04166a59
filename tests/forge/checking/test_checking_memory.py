"""The memory-bounded oracle (issue 8): its peak memory, the checks that changed shape to get there (outputs released
after each run, comparisons in pieces, fingerprints for determinism), fewer fresh rounds for large inputs, and a
reference that runs out of memory still being the harness's failure."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import forge.checking.compare as compare
import forge.checking.validation as validation
from forge.checking.expectation import build_expectation
from forge.checking.footprint import measure_in_child
from forge.checking.tolerance import allowed_error, resolve_tolerances
from forge.checking.validation import ValidationReport, validate, validate_report
from forge.samples import Sample, TensorSpec

ROOT = Path(__file__).resolve().parents[3]

# The bound the oracle is held to on the CPU: peak extra resident memory <= MULTIPLE x (inputs + outputs) + CONSTANT.
# Measured (`forge.checking.footprint`, 512 MB fp32 inputs, anonymous resident memory): 2.5x for group_norm and
# 3.4x for rms_norm (whose float64 reference alone takes 3x); 10.4x for both before issue 8. CONSTANT covers the
# pieces' float64 temporaries, the fingerprint weights and the allocator's slack (it dominates at this test's size).
MULTIPLE = 4.0
CONSTANT = 256 << 20


def _child(problem: str, shape: tuple[int, ...]) -> dict:
    return measure_in_child(problem, shape, fresh=0, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("problem", ["group_norm", "rms_norm"])
def test_peak_memory_of_validate_is_a_small_multiple_of_the_problem(problem):
    record = _child(problem, (4, 64, 256, 256))  # 64 MB of fp32 input, 64 MB of output
    size = record["input_bytes"] + record["output_bytes"]
    print(problem, record["multiple_of_inputs_plus_outputs"], "x", record["peak_extra_bytes"] >> 20, "MB",
          record["wall_s"], "s")
    assert record["issues"] == []
    assert record["peak_extra_bytes"] <= MULTIPLE * size + CONSTANT, record  # the old oracle: ~10x, 1.3 GB here


def test_a_buffer_the_candidate_still_holds_is_caught_even_two_runs_later():
    buffers: list[torch.Tensor] = []

    def ping_pong(x):  # right values, but alternates between two cached buffers: run 3 returns run 1's memory
        if not buffers:
            buffers.extend([torch.empty_like(x), torch.empty_like(x)])
        out = buffers[0]
        buffers.reverse()
        return out.copy_(torch.relu(x))

    errors = validate(torch.relu, ping_pong, [Sample((torch.randn(64),), {})], fresh_inputs_per_sample=0)
    assert errors and "run 3 returned the same memory as run 1" in errors[0]


def test_memory_released_by_an_earlier_run_may_come_back():
    reused = []
    # Whether the CPU allocator hands a freed block back depends on what else was allocated in between (a CI run
    # once saw no reuse at three sizes), so more sizes are tried; the claim tested is that reuse, when it happens,
    # passes.
    for n in (1000, 100_000, 8, 16, 64, 256, 4096, 16_384):
        pointers: list[int] = []
        cache: dict[str, torch.Tensor] = {}

        def candidate(x, cache=cache, pointers=pointers):
            cache.clear()  # the previous output is now held by nobody: its memory may be handed out again
            out = cache["last"] = torch.relu(x)
            pointers.append(out.data_ptr())
            return out

        assert validate(torch.relu, candidate, [Sample((torch.randn(n),), {})], fresh_inputs_per_sample=0) == []
        reused.append(len(set(pointers)) < len(pointers))
    assert any(reused)  # the allocator did hand a released output's address to a later run, and it passed


def test_fresh_rounds_are_scaled_down_for_large_inputs_and_reported(monkeypatch):
    small = Sample((torch.randn(16),), {})
    large = Sample((TensorSpec((64, 64), torch.float32),), {})  # 16 KB, "large" under the patched threshold
    monkeypatch.setattr(validation, "LARGE_INPUT_BYTES", 4096)
    report = validate_report(torch.relu, torch.relu, [small, large], fresh_inputs_per_sample=3)
    assert isinstance(report, ValidationReport) and report.passed and report.issues == ()
    assert report.fresh_rounds_requested == 3 and report.fresh_rounds_used == (3, 1) and report.rounds_scaled_down
    assert report.cases_checked == 4 + 2 and report.cases_skipped == 0
    assert report.largest_input_bytes == 64 * 64 * 4 and report.largest_output_bytes == 64 * 64 * 4
    assert validation.fresh_rounds_for(2, 4097) == 1 and validation.fresh_rounds_for(0, 1 << 40) == 0
    assert validation.sample_input_bytes(large) == 16384

    wrong = validate_report(torch.relu, lambda x: torch.relu(x) + 1, [large], fresh_inputs_per_sample=3)
    assert not wrong.passed and {issue.case for issue in wrong.issues} == {"captured", "fresh #1"}


def test_small_inputs_with_large_outputs_get_the_large_input_cap(monkeypatch):
    """Issue 8: KernelBench's 63_conv_standard_2D reads 1 GiB and writes 8.5 GB; its inputs and outputs together
    earn the cap, from its captured case on."""
    monkeypatch.setattr(validation, "LARGE_INPUT_BYTES", 4096)
    sample = Sample((torch.randn(16, 16),), {})  # 1 KiB in

    def tiled(x):
        return x.repeat(8, 1) * 2.0  # 8 KiB out

    report = validate_report(tiled, tiled, [sample], fresh_inputs_per_sample=3)
    assert report.passed and report.fresh_rounds_used == (1,) and report.rounds_scaled_down
    assert report.largest_input_bytes == 1024 and report.largest_output_bytes == 8192
    wrong = validate_report(tiled, lambda x: tiled(x) + 1, [sample], fresh_inputs_per_sample=3)
    assert not wrong.passed and {issue.case for issue in wrong.issues} == {"captured", "fresh #1"}
    assert validate_report(torch.relu, torch.relu, [sample], fresh_inputs_per_sample=3).fresh_rounds_used == (3,)


def test_a_slow_reference_caps_fresh_rounds_and_a_slow_candidate_does_not(monkeypatch):
    """Issue 8: a reference slower than SLOW_REFERENCE_S on the captured case (a float64 3-D convolution) gets the
    large-input cap; only the reference's time counts, so a kernel cannot buy fewer checks by being slow."""
    import time as clock

    sample = Sample((torch.randn(32),), {})
    monkeypatch.setattr(validation, "SLOW_REFERENCE_S", 0.05)

    def slow_relu(x):
        clock.sleep(0.03)  # the float64 and the native run: 0.06 s per expectation
        return torch.relu(x)

    slow_reference = validate_report(slow_relu, torch.relu, [sample], fresh_inputs_per_sample=3)
    assert slow_reference.passed and slow_reference.fresh_rounds_used == (1,) and slow_reference.rounds_scaled_down
    slow_candidate = validate_report(torch.relu, slow_relu, [sample], fresh_inputs_per_sample=3)
    assert slow_candidate.passed and slow_candidate.fresh_rounds_used == (3,)


def test_the_float64_reference_runs_without_cudnn_and_eager_keeps_the_users_setting():
    """Issue 8: cuDNN's float64 convolutions were 1.5-12x slower than PyTorch's own on the H200 (BENCHMARKS.md H8b), so
    the float64 run turns it off; the native run is the user's eager and keeps cuDNN as the user set it."""
    seen: list[tuple[torch.dtype, bool]] = []

    def reference(x):
        seen.append((x.dtype, torch.backends.cudnn.enabled))
        return torch.relu(x)

    sample = Sample((torch.randn(8),), {})
    assert torch.backends.cudnn.enabled
    build_expectation(reference, sample, resolve_tolerances(None), 4.0)
    assert seen == [(torch.float64, False), (torch.float32, True)] and torch.backends.cudnn.enabled

    def raising(x):
        if x.dtype == torch.float64:
            raise RuntimeError("no float64 kernel")
        return torch.relu(x)

    build_expectation(raising, sample, resolve_tolerances(None), 4.0)  # falls back to eager as the reference
    assert torch.backends.cudnn.enabled  # restored after the float64 run raised


def test_default_threshold_caps_rounds_above_one_gib():
    assert validation.LARGE_INPUT_BYTES == 1 << 30 and validation.LARGE_INPUT_FRESH_ROUNDS == 1
    assert validation.fresh_rounds_for(2, 1 << 30) == 2 and validation.fresh_rounds_for(2, (1 << 30) + 1) == 1


_MEMORY_CAP_SCRIPT = textwrap.dedent("""
    import json, resource, sys
    import torch
    from forge.checking import validate
    from forge.outcome import HarnessError
    from forge.samples import Sample

    def reference(x):  # needs 8 GB of float64 on the way: more than the cap allows
        return x + torch.zeros(1 << 30, dtype=torch.float64)[: x.numel()].view_as(x).to(x.dtype)

    sample = [Sample((torch.randn(64),), {})]
    validate(torch.relu, torch.relu, sample)  # warm up before capping the address space
    size = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (size + (2 << 30), resource.RLIM_INFINITY))
    try:
        validate(reference, torch.relu, sample)
        print(json.dumps({"raised": None}))
    except HarnessError as exc:
        print(json.dumps({"raised": "HarnessError", "out_of_memory": exc.out_of_memory, "reason": exc.reason}))
""")


def test_a_reference_exhausting_a_memory_cap_is_a_harness_error():
    done = subprocess.run([sys.executable, "-c", _MEMORY_CAP_SCRIPT], capture_output=True, text=True, cwd=ROOT,
                          check=False, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["raised"] == "HarnessError" and result["out_of_memory"], result
    assert "the reference ran out of memory on a captured sample" in result["reason"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("float64_works", [True, False])
def test_allowance_built_in_pieces_matches_allowed_error(monkeypatch, dtype, float64_works):
    monkeypatch.setattr(compare, "CPU_CHUNK_ELEMENTS", 97)  # many pieces, none aligned with the rows
    x = (torch.randn(33, 40, generator=torch.Generator().manual_seed(3)) * 0.01).to(dtype)

    def reference(t):
        if t.dtype == torch.float64 and not float64_works and dtype != torch.float64:
            raise TypeError("no float64 path")
        return torch.softmax(t, dim=-1)

    table = resolve_tolerances(None)
    expected = build_expectation(reference, Sample((x,), {}), table, 4.0).unseal()
    eager = torch.softmax(x, dim=-1).double()
    ref64 = torch.softmax(x.double(), dim=-1) if float64_works or dtype == torch.float64 else eager
    error = (eager - ref64).abs() if float64_works or dtype == torch.float64 else None
    whole = allowed_error(ref64, error, dtype, table, 4.0)
    stored = expected["output/allowed"].double()
    assert (stored >= whole).all()  # rounding to float32 never tightens the allowance
    assert torch.allclose(stored, whole, rtol=1e-6, atol=0)
    assert torch.allclose(expected["output/reference"].double(), ref64, rtol=1e-7, atol=0)
    assert "output/special" not in expected  # all finite: no codes kept
    assert expected["output/allowed"].dtype == (torch.float64 if dtype == torch.float64 else torch.float32)


def test_non_finite_outputs_keep_their_codes_and_are_checked_in_pieces(monkeypatch):
    monkeypatch.setattr(compare, "CPU_CHUNK_ELEMENTS", 7)
    x = torch.randn(10, 9, generator=torch.Generator().manual_seed(4))
    x[2, 3], x[7, 1] = -1.0, 0.0  # log: NaN at a negative input, -inf at zero
    samples = [Sample((x.abs() * torch.sign(x),), {})]
    expected = build_expectation(torch.log, samples[0], resolve_tolerances(None), 4.0).unseal()
    assert expected["output/special"].dtype == torch.int8 and int((expected["output/special"] != 0).sum()) > 0
    assert validate(torch.log, torch.log, samples, fresh_inputs_per_sample=0) == []

    def finite_everywhere(t):
        return torch.log(t).nan_to_num(nan=0.0, neginf=-1e3)

    errors = validate(torch.log, finite_everywhere, samples, fresh_inputs_per_sample=0)
    assert errors and "have NaN/inf where the reference does not" in errors[0]


def test_value_check_in_pieces_finds_the_worst_element_of_a_strided_output(monkeypatch):
    monkeypatch.setattr(compare, "CPU_CHUNK_ELEMENTS", 50)
    x = torch.randn(40, 30, generator=torch.Generator().manual_seed(5))

    def candidate(t):
        out = torch.relu(t).t().contiguous().t()  # right values, transposed strides
        out[31, 17] += 0.5
        out[3, 2] += 0.25
        return out

    errors = validate(torch.relu, candidate, [Sample((x,), {})], fresh_inputs_per_sample=0,
                      check_layout=False)  # the value check on its own
    first = errors[0]
    assert first.bad_elements == 2 and first.worst_index == (31, 17)
    assert first.max_abs_error == pytest.approx(0.5) and [r.index for r in first.rows] == [(31, 17), (3, 2)]


def test_determinism_by_fingerprint_names_where_runs_differ_and_ignores_nan_payloads(monkeypatch):
    monkeypatch.setattr(compare, "CPU_CHUNK_ELEMENTS", 16)
    x = torch.randn(8, 8, generator=torch.Generator().manual_seed(6))
    calls = []

    def drifting(t):
        calls.append(1)
        out = torch.tanh(t)
        out[5, 4] = torch.nextafter(out[5, 4], torch.tensor(2.0)) if len(calls) > 1 else out[5, 4]
        return out  # one ulp off after the first call: within tolerance, but not bitwise reproducible

    errors = validate(torch.tanh, drifting, [Sample((x,), {})], fresh_inputs_per_sample=0)
    assert errors and "identical calls gave different results" in errors[0]
    assert "elements (4, 0) to (5, 7)" in errors[0]  # the 16-element piece holding (5, 4)
    assert validate(torch.tanh, drifting, [Sample((x,), {})], fresh_inputs_per_sample=0,
                    require_deterministic=False) == []

    y = x.clone()
    y[0, 0] = -1.0
    payloads = iter(range(1, 100))

    def nan_payloads(t):  # a different NaN bit pattern on each call where the reference has NaN
        out = torch.sqrt(t)
        out.view(torch.int32)[torch.isnan(out)] = 0x7FC00000 + next(payloads)
        return out

    assert validate(torch.sqrt, nan_payloads, [Sample((y,), {})], fresh_inputs_per_sample=0) == []


def test_validate_still_returns_a_list_of_issues():
    issues = validate(F.relu, F.relu, [Sample((torch.randn(4),), {})])
    assert issues == [] and isinstance(issues, list)
