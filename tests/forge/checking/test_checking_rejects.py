"""The oracle rejects bad candidates: each known way of being wrong (or of cheating) in its own test."""

from __future__ import annotations

import json
import os
import pickle
import signal

import pytest
import torch
import torch.nn.functional as F

from forge.checking import validate
from forge.outcome import HarnessError, Outcome, ValidationIssue, outcome_of_issues
from forge.samples import Sample


def _layer_norm_samples(dtype: torch.dtype = torch.float32) -> list[Sample]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 32, generator=g).to(dtype)
    w = torch.randn(32, generator=g).to(dtype)
    b = torch.randn(32, generator=g).to(dtype)
    return [Sample((x, (32,), w, b), {"eps": 1e-5})]


def _softmax_samples() -> list[Sample]:
    g = torch.Generator().manual_seed(2)
    return [
        Sample((torch.randn(3, 16, generator=g),), {"dim": -1}),
        Sample((torch.randn(2, 5, 8, generator=g),), {"dim": 1}),
    ]


def test_rejects_value_off_by_one_percent_fp32():
    errors = validate(F.layer_norm, lambda *a, **k: F.layer_norm(*a, **k) * 1.01, _layer_norm_samples())
    assert errors
    assert "outside tolerance" in errors[0]


def test_rejects_zeros():
    errors = validate(F.softmax, lambda x, dim: torch.zeros_like(x), _softmax_samples())
    assert any("outside tolerance" in e for e in errors)


def test_rejects_bf16_offset_of_one_tenth():
    errors = validate(F.layer_norm, lambda *a, **k: F.layer_norm(*a, **k) + 0.1, _layer_norm_samples(torch.bfloat16))
    assert any("outside tolerance" in e for e in errors)


def test_rejects_wrong_shape():
    errors = validate(F.softmax, lambda x, dim: F.softmax(x, dim=dim).unsqueeze(0), _softmax_samples())
    assert errors and all("shape" in e for e in errors)


def test_rejects_wrong_dtype():
    errors = validate(F.softmax, lambda x, dim: F.softmax(x.double(), dim=dim), _softmax_samples())
    assert errors and "dtype torch.float64 instead of torch.float32" in errors[0]


def test_rejects_wrong_device():
    errors = validate(F.softmax, lambda x, dim: F.softmax(x, dim=dim).to("meta"), _softmax_samples())
    assert errors and "device meta instead of cpu" in errors[0]


def test_rejects_nan_where_reference_is_finite():
    def candidate(x, dim):
        out = F.softmax(x, dim=dim)
        out.view(-1)[0] = float("nan")
        return out

    errors = validate(F.softmax, candidate, _softmax_samples())
    assert errors and "NaN/inf" in errors[0]
    assert "index (0, 0): expected" in errors[0] and "got nan" in errors[0]


def test_rejects_finite_where_reference_is_nan():
    sample = [Sample((torch.randn(64, generator=torch.Generator().manual_seed(3)),), {})]
    errors = validate(torch.sqrt, lambda x: torch.sqrt(x).nan_to_num(0.0), sample)
    assert errors and "expected NaN, got 0" in errors[0]


def test_rejects_inf_with_wrong_sign():
    sample = [Sample((torch.tensor([0.0, 1.0, 2.0, 0.0]),), {})]
    errors = validate(torch.log, lambda x: torch.log(x).abs(), sample, fresh_inputs_per_sample=0)
    assert errors and "expected -inf, got inf" in errors[0]


def test_rejects_unwritten_output():
    errors = validate(F.softmax, lambda x, dim: torch.empty_like(x), _softmax_samples())
    assert errors


def test_rejects_partly_written_output_thanks_to_poisoned_allocations():
    def candidate(x, dim):
        out = torch.empty_like(x)
        out[..., :-1] = F.softmax(x, dim=dim)[..., :-1]  # last column never written
        return out

    errors = validate(F.softmax, candidate, [Sample((torch.randn(6, 16),), {"dim": 0})], fresh_inputs_per_sample=0)
    assert errors
    assert any("filled with NaN" in e or "NaN/inf" in e or "outside tolerance" in e for e in errors)


def test_rejects_mutated_input():
    def candidate(x, dim):
        out = F.softmax(x, dim=dim)
        x.zero_()
        return out

    errors = validate(F.softmax, candidate, _softmax_samples())
    assert errors and "input args[0]: the candidate modified an input the reference leaves unchanged" in errors[0]


def test_rejects_non_deterministic_result():
    calls = {"n": 0}

    def candidate(x, dim):
        calls["n"] += 1
        return F.softmax(x, dim=dim) + 1e-8 * calls["n"]  # within tolerance, but never the same twice

    errors = validate(F.softmax, candidate, _softmax_samples())
    assert errors and all("non-deterministic" in e for e in errors)
    calls["n"] = 0
    assert validate(F.softmax, candidate, _softmax_samples(), require_deterministic=False) == []


def test_rejects_tensor_subclass_output():
    class LazyTensor(torch.Tensor):
        pass

    errors = validate(F.softmax, lambda x, dim: F.softmax(x, dim=dim).as_subclass(LazyTensor), _softmax_samples())
    assert errors and "torch.Tensor subclass" in errors[0]


def test_candidate_exception_becomes_an_error_string():
    def candidate(x, dim):
        raise RuntimeError("kernel exploded")

    errors = validate(F.softmax, candidate, _softmax_samples())
    assert len(errors) == 6  # 2 samples x (captured + 2 fresh)
    assert errors[0].startswith("sample 0 (captured)")
    assert "candidate raised RuntimeError: kernel exploded" in errors[0]
    assert "sample 1 (fresh #2)" in errors[-1]


def test_candidate_system_exit_does_not_escape():
    def candidate(x, dim):
        raise SystemExit(3)

    errors = validate(F.softmax, candidate, _softmax_samples()[:1], fresh_inputs_per_sample=0)
    assert errors and "candidate raised SystemExit" in errors[0]


def test_rejects_candidate_right_only_on_first_call():
    state = {"calls": 0}

    def candidate(x, dim):
        state["calls"] += 1
        return F.softmax(x, dim=dim) if state["calls"] == 1 else torch.full_like(x, 1.0 / x.shape[dim])

    errors = validate(F.softmax, candidate, _softmax_samples()[:1], fresh_inputs_per_sample=0)
    assert errors and "run 2" in errors[0]


def test_fresh_inputs_catch_a_candidate_memoised_by_shape():
    cache: dict = {}

    def candidate(x, dim):
        key = (tuple(x.shape), dim)
        if key not in cache:
            cache[key] = F.softmax(x, dim=dim)
        return cache[key].clone()

    samples = _softmax_samples()
    assert validate(F.softmax, candidate, samples, fresh_inputs_per_sample=0) == []  # captured inputs alone pass
    cache.clear()
    errors = validate(F.softmax, candidate, samples)
    assert errors and errors[0].startswith("sample 0 (fresh #1)")


def test_rejects_wrong_integer_output():
    def candidate(x, kernel_size, return_indices):
        values, indices = F.max_pool2d(x, kernel_size, return_indices=True)
        return values, indices + 1

    sample = [Sample((torch.randn(1, 2, 4, 4), 2), {"return_indices": True})]
    errors = validate(F.max_pool2d, candidate, sample)
    assert errors and "output[1]: " in errors[0] and "must match exactly" in errors[0]


def test_rejects_wrong_container_and_non_tensor_leaf():
    def reference(x):
        return (x * 2, x.shape[0])

    sample = [Sample((torch.randn(3),), {})]
    as_list = validate(reference, lambda x: [x * 2, x.shape[0]], sample)
    assert as_list and "expected a tuple, got list" in as_list[0]
    wrong_int = validate(reference, lambda x: (x * 2, 4), sample)
    assert wrong_int and "output[1]: expected int 3, got int 4" in wrong_int[0]


def test_rejects_in_place_op_that_does_not_update_its_input():
    sample = [Sample((torch.randn(4, 8),), {"inplace": True})]
    errors = validate(F.relu, lambda x, inplace: torch.clamp(x, min=0), sample)
    assert errors and "input args[0] (updated in place by the reference)" in errors[0]


def test_rejects_in_place_op_that_returns_a_copy():
    def candidate(x, inplace):
        x.clamp_(min=0)
        return x.clone()

    errors = validate(F.relu, candidate, [Sample((torch.randn(4, 8),), {"inplace": True})])
    assert errors and "does not share that input's memory" in errors[0]


def test_reference_failure_on_captured_sample_is_a_harness_error():
    def reference(x):
        raise ValueError("unsupported input")

    with pytest.raises(HarnessError, match="reference raised on a captured sample .*ValueError: unsupported") as info:
        validate(reference, lambda x: x, [Sample((torch.randn(2),), {})])
    assert not info.value.out_of_memory and isinstance(info.value.__cause__, ValueError)


@pytest.mark.parametrize("error", [torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 14.00 GiB"),
                                   MemoryError(), RuntimeError("DefaultCPUAllocator: can't allocate memory")])
def test_reference_out_of_memory_is_a_harness_error_even_on_a_fresh_draw(error):
    calls = []

    def reference(x):
        calls.append(1)
        if len(calls) > 2:  # the captured sample's two reference runs pass; the fresh draw runs out of memory
            raise error
        return torch.relu(x)

    with pytest.raises(HarnessError, match="ran out of memory on a fresh input") as info:
        validate(reference, torch.relu, [Sample((torch.randn(8),), {})], fresh_inputs_per_sample=1)
    assert info.value.out_of_memory


def test_reference_that_rejects_a_fresh_draw_is_skipped_not_blamed():
    calls = []

    def reference(x):
        calls.append(1)
        if len(calls) > 2:
            raise ValueError("this draw is not a valid input")
        return torch.relu(x)

    assert validate(reference, torch.relu, [Sample((torch.randn(8),), {})], fresh_inputs_per_sample=1) == []
    calls.clear()
    assert validate(reference, lambda x: torch.relu(x) + 1, [Sample((torch.randn(8),), {})],
                    fresh_inputs_per_sample=1)  # the captured sample still catches a wrong candidate


def test_harness_failure_while_checking_is_a_harness_error(monkeypatch):
    import forge.checking.expectation as expectation  # leaf_value_issues, the comparison validate runs per leaf

    def broken(*args, **kwargs):
        raise RuntimeError("a bug in our comparison")

    monkeypatch.setattr(expectation, "float_mismatch_issue", broken)
    with pytest.raises(HarnessError, match="failed checking the candidate's result: RuntimeError: a bug"):
        validate(torch.relu, torch.relu, [Sample((torch.randn(8),), {})])


def test_issues_are_typed_records_that_read_as_the_message():
    samples = [Sample((torch.randn(4, 8, generator=torch.Generator().manual_seed(1)),), {})]
    errors = validate(torch.relu, lambda x: torch.relu(x) * 2 + 1, samples, fresh_inputs_per_sample=0)
    first = errors[0]
    assert isinstance(first, ValidationIssue) and isinstance(first, str) and "; ".join(errors).startswith(first)
    assert first.kind is Outcome.MISMATCH and first.sample == 0 and first.case == "captured"
    assert first.leaf == "output" and first.run.startswith("run 1") and first.bad_elements == 32
    expected = torch.relu(samples[0].args[0]).double()
    got = (torch.relu(samples[0].args[0]) * 2 + 1).double()
    worst = first.rows[0]
    assert worst.index == first.worst_index and len(first.rows) == 5
    assert worst.expected == pytest.approx(expected[worst.index].item())
    assert worst.got == pytest.approx(got[worst.index].item())
    assert worst.abs_error == pytest.approx((got - expected)[worst.index].abs().item())  # worst = error / allowed
    assert first.max_abs_error == pytest.approx((got - expected).abs().max().item())
    again = ValidationIssue.from_dict(json.loads(json.dumps(first.to_dict())))
    assert again == first and again.fields() == first.fields()
    assert pickle.loads(pickle.dumps(first)).fields() == first.fields()
    assert outcome_of_issues(errors) is Outcome.MISMATCH and outcome_of_issues([]) is Outcome.OK


@pytest.mark.parametrize("abort", [SystemExit(3), KeyboardInterrupt(), GeneratorExit()])
def test_candidate_raising_a_base_exception_is_a_runtime_error(abort):
    def candidate(x):
        raise abort

    errors = validate(torch.relu, candidate, [Sample((torch.randn(8),), {})])
    assert errors[0].kind is Outcome.RUNTIME_ERROR and errors[0].exception_type == type(abort).__name__
    assert outcome_of_issues(errors) is Outcome.RUNTIME_ERROR
    assert f"candidate raised {type(abort).__name__}" in errors[0]


def test_a_real_ctrl_c_while_the_candidate_runs_still_propagates():
    def candidate(x):
        os.kill(os.getpid(), signal.SIGINT)  # what the terminal sends on Ctrl-C
        return torch.relu(x)

    with pytest.raises(KeyboardInterrupt):
        validate(torch.relu, candidate, [Sample((torch.randn(8),), {})])
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_error_messages_name_sample_leaf_index_and_values():
    def candidate(x):
        values = x.sort(dim=-1).values
        values[1, 2] += 1.0
        return {"sorted": values, "pair": (x.sum(-1), x.argmax(-1))}

    def reference(x):
        return {"sorted": x.sort(dim=-1).values, "pair": (x.sum(-1), x.argmax(-1))}

    samples = [Sample((torch.randn(2, 3),), {}), Sample((torch.randn(3, 5),), {})]
    errors = validate(reference, candidate, samples)
    first = errors[0]
    assert first.startswith("sample 0 (captured) (f32[2,3])")
    assert 'output["sorted"]: 1 of 6 elements outside tolerance' in first
    assert "max abs error 1, max rel error" in first
    assert "worst at index (1, 2): expected" in first and "got" in first
    assert any(e.startswith("sample 1 (fresh #1) (f32[3,5])") for e in errors)


def test_rejects_output_buffer_reused_across_calls():
    buffers: dict = {}

    def candidate(x, dim):
        out = buffers.setdefault((tuple(x.shape), x.dtype), torch.empty_like(x))
        torch.softmax(x, dim=dim, out=out)
        return out  # right values every time, but a later call overwrites what an earlier caller holds

    errors = validate(F.softmax, candidate, _softmax_samples()[:1], fresh_inputs_per_sample=0)
    assert errors and "reuses an output buffer across calls" in errors[0]


def _ulp_noise(x: torch.Tensor) -> torch.Tensor:
    """relu with one-ulp noise from the global RNG: different bits on identical calls, like atomics."""
    noise = (torch.rand(x.shape, dtype=torch.float64) < 0.5).to(x.dtype) * torch.finfo(x.dtype).eps
    return torch.relu(x) * (1 + noise)


def test_bitwise_determinism_is_waived_only_where_the_reference_itself_varies() -> None:
    from forge.checking import validate
    from forge.samples import Sample

    samples = [Sample((torch.randn(64, 128),), {})]
    errors = validate(torch.relu, _ulp_noise, samples, fresh_inputs_per_sample=0)
    assert errors and "identical calls gave different results" in errors[0]
    assert validate(_ulp_noise, _ulp_noise, samples, fresh_inputs_per_sample=0) == []


def _relu_channels_last(x: torch.Tensor) -> torch.Tensor:
    """Right values in another memory format: what a GEMM-based conv returns when it skips the transpose back."""
    return torch.relu(x).contiguous(memory_format=torch.channels_last)


def test_rejects_output_in_another_layout():
    x = torch.randn(2, 3, 4, 5)  # PyTorch's relu keeps it row-major
    issues = validate(F.relu, _relu_channels_last, [Sample((x,), {})])
    assert outcome_of_issues(issues) is Outcome.MISMATCH
    assert "wrong layout" in str(issues[0]) and "[60, 20, 5, 1]" in str(issues[0])


def test_whole_problem_outputs_are_compared_by_value_only():
    """`check_layout=False` (KernelBench module problems: nothing reads their output afterwards)."""
    x = torch.randn(2, 3, 4, 5)
    assert validate(F.relu, _relu_channels_last, [Sample((x,), {})], check_layout=False) == []
