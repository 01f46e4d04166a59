"""The probes run after `validate` passes (issue 10, mechanisms 2 and 4): each one shown failing a kernel that
`validate` alone accepts, and honest kernels passing them all."""

from __future__ import annotations

import dataclasses
import importlib.util
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from forge.checking import KernelUtils, validate
from forge.checking.expectation import build_expectation
from forge.checking.probes import Probe, ProbeSettings, _check_dependence, _Failed, run_probes
from forge.checking.tolerance import resolve_tolerances
from forge.outcome import CandidateCall, Outcome
from forge.samples import Sample, Widening, draw_sample
from tests.agent import kernels as agent_kernels

REPO = Path(__file__).resolve().parents[3]
TABLE = resolve_tolerances(None)


def _randn(shape: tuple[int, ...], seed: int, scale: float = 1.0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return (torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype)


def _layer_norm_sample() -> list[Sample]:
    return [Sample((_randn((8, 64), 1), (64,), 1 + _randn((64,), 2, 0.1), _randn((64,), 3, 0.1), 1e-5), {})]


def _probe(reference, candidate, samples, seed: int = 7) -> list:
    return run_probes(reference, CandidateCall(candidate), samples, table=TABLE, settings=ProbeSettings(seed=seed))


def _runs(issues) -> set[str]:
    return {i.run for i in issues}


def test_a_kernel_correct_for_as_many_calls_as_validate_makes_fails_the_extra_calls():
    samples = [Sample((_randn((8, 64), 4),), {})]
    calls = {"n": 0}

    def counting(x, inplace=False):
        calls["n"] += 1
        return F.silu(x)

    assert validate(F.silu, counting, samples) == []
    budget = calls["n"]  # 12 today: captured + 2 fresh inputs, 4 runs each
    seen = {"n": 0}

    def correct_then_wrong(x, inplace=False):
        seen["n"] += 1
        return F.silu(x) if seen["n"] <= budget else F.silu(x) * 1.5

    assert validate(F.silu, correct_then_wrong, samples) == []
    seen["n"] = 0
    issues = KernelUtils().validate(F.silu, correct_then_wrong, samples)
    assert issues and issues[0].run in {p.value for p in Probe}
    assert "outside tolerance" in issues[0]


def test_a_value_fingerprint_cache_serving_from_the_fifth_sighting_fails_the_in_place_update():
    seen: dict = {}

    def fingerprint_cache(x, normalized_shape, weight=None, bias=None, eps=1e-5):
        key = (tuple(x.shape), tuple(x.reshape(-1)[::61].tolist()))
        count, cached = seen.get(key, (0, None))
        if count >= 4:
            seen[key] = (count + 1, cached)
            return cached.clone()
        out = F.layer_norm(x, normalized_shape, weight, bias, eps)
        seen[key] = (count + 1, out.clone())
        return out

    samples = _layer_norm_sample()
    assert validate(F.layer_norm, fingerprint_cache, samples) == []
    issues = KernelUtils(probes=ProbeSettings(seed=11)).validate(F.layer_norm, fingerprint_cache, samples)
    assert _runs(issues) == {Probe.IN_PLACE_UPDATE}
    assert "updated in place" in issues[0] and "outside tolerance" in issues[0]


def test_a_data_ptr_keyed_cache_fails_the_in_place_update():
    by_address: dict = {}

    def address_cache(x, normalized_shape, weight=None, bias=None, eps=1e-5):
        key = (x.data_ptr(), tuple(x.shape))
        if key not in by_address:
            by_address[key] = F.layer_norm(x, normalized_shape, weight, bias, eps)
        return by_address[key].clone()

    issues = _probe(F.layer_norm, address_cache, _layer_norm_sample())
    # Caught by the in-place update, or earlier when the allocator hands a probe input a cached address.
    assert issues and _runs(issues) <= {p.value for p in Probe} and "outside tolerance" in issues[0]
    by_object: dict = {}

    def same_object_cache(x, normalized_shape, weight=None, bias=None, eps=1e-5):  # keyed by the live tensor
        key = (id(x), x.data_ptr())
        if key not in by_object:
            by_object[key] = (x, F.layer_norm(x, normalized_shape, weight, bias, eps))
        return by_object[key][1].clone()

    assert validate(F.layer_norm, same_object_cache, _layer_norm_sample()) == []
    issues = _probe(F.layer_norm, same_object_cache, _layer_norm_sample())
    assert _runs(issues) == {Probe.IN_PLACE_UPDATE} and "same tensors updated in place" in issues[0]


def test_a_background_thread_that_writes_after_returning_fails_quiescence():
    def deferred(x, inplace=False):
        out = torch.empty_like(x)

        def finish():
            time.sleep(0.005)
            out.copy_(F.silu(x))

        threading.Thread(target=finish, name="deferred-silu").start()
        return out

    issues = _probe(F.silu, deferred, [Sample((_randn((8, 64), 5),), {})])
    assert _runs(issues) == {Probe.QUIESCENCE}
    assert "deferred-silu" in issues[0]


def test_a_thread_the_call_starts_through_another_is_its_own_and_one_another_thread_starts_is_not():
    def relayed(x, inplace=False):  # the work is deferred by a thread that starts another and ends at once
        out = torch.empty_like(x)

        def finish():
            time.sleep(0.005)
            out.copy_(F.silu(x))

        relay = threading.Thread(target=lambda: threading.Thread(target=finish, name="relayed-silu").start())
        relay.start()
        relay.join()
        return out

    issues = _probe(F.silu, relayed, [Sample((_randn((8, 64), 5),), {})])
    assert _runs(issues) == {Probe.QUIESCENCE}

    go, stop = threading.Event(), threading.Event()

    def unrelated() -> None:  # what the test runner or a harness pool does on its own thread meanwhile
        while not stop.is_set():
            if go.wait(0.001):
                threading.Thread(target=time.sleep, args=(0.05,), name="not-the-call").start()

    def honest(x, inplace=False):
        go.set()
        time.sleep(0.003)  # the other thread starts one while this call runs
        go.clear()
        return F.silu(x)

    spawner = threading.Thread(target=unrelated, daemon=True)
    spawner.start()
    try:
        assert _probe(F.silu, honest, [Sample((_randn((8, 64), 5),), {})]) == []
    finally:
        stop.set()
        spawner.join()


def test_calls_probed_on_two_threads_at_once_each_see_only_their_own_threads():
    """Two validations at once (judging ahead runs several): each call's list holds the threads it started, and
    `Thread.start` is the one process-wide wrapper before and after, never a patch left behind by either call."""
    from forge.checking import probes

    both_inside = threading.Barrier(2)
    seen: dict[str, list[str]] = {}

    def call(name: str) -> None:
        with probes._threads_started() as started:
            both_inside.wait()
            worker = threading.Thread(target=time.sleep, args=(0.01,), name=f"{name}-worker")
            worker.start()
            both_inside.wait()
            worker.join()
        seen[name] = [t.name for t in started]

    callers = [threading.Thread(target=call, args=(name,)) for name in ("a", "b")]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join()
    assert seen == {"a": ["a-worker"], "b": ["b-worker"]}
    assert threading.Thread.start is probes._collecting_start


def test_an_output_written_after_the_call_is_seen_by_the_re_read():
    held: list = []

    def late_writer(x, inplace=False):  # finishes the previous call's output on the next call (no thread)
        out = F.silu(x)
        for earlier in held:
            earlier.add_(1.0)
        held.append(out)
        return out

    issues = _probe(F.silu, late_writer, [Sample((_randn((8, 64), 6),), {})])
    assert _runs(issues) == {Probe.QUIESCENCE}
    assert "changed after the call returned" in issues[0]


def test_a_kernel_that_ignores_the_storage_offset_fails_the_offset_view():
    def from_storage_start(x, inplace=False):
        return F.silu(x.as_strided(x.shape, x.stride(), 0))

    samples = [Sample((_randn((8, 64), 7),), {})]
    assert validate(F.silu, from_storage_start, samples) == []
    issues = _probe(F.silu, from_storage_start, samples)
    assert _runs(issues) == {Probe.OFFSET_VIEW}
    buffer = _randn((8 * 64 + 3,), 8)
    captured_view = [Sample((buffer[3:].view(8, 64),), {})]  # captured as a view: moved to another offset
    assert _runs(_probe(F.silu, lambda x, inplace=False: F.silu(x.as_strided(x.shape, x.stride(), 3)),
                        captured_view)) == {Probe.OFFSET_VIEW}


def test_degenerate_outputs_fail_on_wide_inputs():
    flat = [Sample((_randn((8, 64), 9, scale=1e-4),), {"dim": -1})]

    def constant(x, dim=None, _stacklevel=3, dtype=None):  # exact to 2e-6 on the flat captured logits
        return torch.full_like(x, 1.0 / x.shape[-1]) + (x - x.mean()) * 0

    relaxed = {torch.float32: (1e-3, 1e-3)}  # floors loose enough that the captured flat logits pass
    assert validate(F.softmax, constant, flat, tolerances=relaxed) == []
    issues = run_probes(F.softmax, CandidateCall(constant), flat, table=resolve_tolerances(relaxed),
                        settings=ProbeSettings(seed=3))
    assert _runs(issues) == {Probe.WIDE_INPUTS}


def test_wide_draws_are_wider_than_captured():
    x = _randn((64, 64), 10, scale=0.004, dtype=torch.bfloat16)
    wide = draw_sample(Sample((x,), {}), torch.Generator().manual_seed(0), widen=Widening()).args[0]
    assert wide.dtype == x.dtype and wide.shape == x.shape
    assert float(wide.float().std()) > 100 * float(x.float().std())
    assert float(wide.float().abs().max()) > 4 * float(wide.float().std())  # outliers
    with pytest.raises(ValueError, match="outlier_fraction"):
        Widening(outlier_fraction=2.0)


def test_an_output_that_does_not_follow_its_input_fails_the_dependence_check():
    before_inputs = Sample((_randn((4, 16), 11),), {})
    after_inputs = Sample((before_inputs.args[0].clone(),), {})
    after_inputs.args[0][1, 3] += 5.0
    before = build_expectation(F.silu, before_inputs, TABLE, 4.0)
    after = build_expectation(F.silu, after_inputs, TABLE, 4.0)
    stale = F.silu(before_inputs.args[0])
    with pytest.raises(_Failed) as failed:
        _check_dependence("poke", after, before.unseal(), stale, stale.clone())
    assert failed.value.issues[0].run == Probe.INPUT_DEPENDENCE
    _check_dependence("poke", after, before.unseal(), stale, F.silu(after_inputs.args[0]))  # follows: no issue


def test_a_candidate_raising_in_a_probe_is_a_runtime_error():
    calls = {"n": 0}

    def raises_later(x, inplace=False):
        calls["n"] += 1
        if calls["n"] > 2:
            raise SystemExit(3)
        return F.silu(x)

    issues = _probe(F.silu, raises_later, [Sample((_randn((4, 8), 12),), {})])
    assert issues[0].kind == Outcome.RUNTIME_ERROR and issues[0].exception_type == "SystemExit"


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.kernel_function


def test_honest_kernels_pass_every_probe(tmp_path: Path):
    silu = _load(REPO / "agent" / "examples" / "triton_example.py", "probe_triton_example")
    source = tmp_path / "rms_norm_ok.py"
    source.write_text(agent_kernels.RMS_NORM_OK)
    rms_norm = _load(source, "probe_rms_norm_ok")
    utils = KernelUtils()
    assert utils.validate(F.silu, silu, [Sample((_randn((8, 64), 13, dtype=torch.bfloat16),), {})]) == []
    x = _randn((4, 256), 14, dtype=torch.float16)
    assert utils.validate(F.rms_norm, rms_norm, [Sample((x, (256,), torch.ones(256, dtype=torch.float16), 1e-6),
                                                        {})]) == []
    assert utils.validate(F.layer_norm, lambda *a, **k: F.layer_norm(*a, **k), _layer_norm_sample()) == []
    buffer = _randn((65,), 15)
    assert utils.validate(F.silu, lambda x, inplace=False: x * torch.sigmoid(x), [Sample((buffer[1:],), {})]) == []
    in_place = [Sample((_randn((4, 8), 16),), {"inplace": True})]
    assert utils.validate(F.relu, lambda x, inplace=False: x.clamp_(min=0), in_place) == []


def test_probe_settings_are_checked_and_can_be_switched_off():
    with pytest.raises(ValueError, match="extra_calls_cpu"):
        ProbeSettings(extra_calls_cpu=(3, 1))
    with pytest.raises(ValueError, match="slow_reference_s"):
        ProbeSettings(slow_reference_s=0.0)
    samples = [Sample((_randn((4, 8), 17),), {})]
    assert run_probes(F.silu, lambda x, inplace=False: torch.zeros_like(x), samples, table=TABLE,
                      settings=ProbeSettings(enabled=False)) == []


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_honest_triton_passes_and_a_thread_launching_the_work_fails():
    silu = _load(REPO / "agent" / "examples" / "triton_example.py", "probe_triton_example_cuda")
    samples = [Sample((_randn((64, 1024), 18, dtype=torch.bfloat16).cuda(),), {})]
    assert KernelUtils().validate(F.silu, silu, samples) == []

    def launched_from_a_thread(x, inplace=False):
        out = torch.empty_like(x)
        threading.Thread(target=lambda: out.copy_(silu(x)), name="cuda-deferred").start()
        return out

    issues = _probe(F.silu, launched_from_a_thread, samples)
    assert issues and issues[0].run in {Probe.QUIESCENCE, Probe.WIDE_INPUTS}


def test_inputs_over_the_large_threshold_get_fewer_probe_calls_and_still_catch_a_stale_cache(monkeypatch):
    """Issue 8: at KernelBench's 7.5 GB inputs every probe call costs a float64 reference of several GB, so large
    samples get one repeat, one in-place update and at most one extra call; the update still catches a cache."""
    import forge.checking.probes as probes

    samples = [Sample((_randn((16, 64), 21),), {})]
    settings = ProbeSettings(seed=3, extra_calls_cpu=(3, 3), repeats_before_update_cpu=(2, 2))

    def counted(threshold: int) -> int:
        calls = {"n": 0}

        def silu(x, inplace=False):
            calls["n"] += 1
            return F.silu(x)

        monkeypatch.setattr(probes, "LARGE_INPUT_BYTES", threshold)
        assert run_probes(F.silu, CandidateCall(silu), samples, table=TABLE, settings=settings) == []
        return calls["n"]

    normal, large = counted(1 << 30), counted(1024)
    # wide + offset view, plus 2 repeats + 2 updates + 3 extra calls (normal) vs 1 + 1 + 1 (large)
    assert (normal, large) == (2 + 2 + 2 + 3, 2 + 1 + 1 + 1)
    # A reference slower than slow_reference_s per expectation (a float64 convolution) scales the pattern the same
    # way from its first expectation on.
    settings = dataclasses.replace(settings, slow_reference_s=1e-9)
    assert counted(1 << 30) == large
    settings = dataclasses.replace(settings, slow_reference_s=1.0)

    cache: dict[int, torch.Tensor] = {}

    def by_address(x, inplace=False):
        if x.data_ptr() not in cache:
            cache[x.data_ptr()] = F.silu(x)
        return cache[x.data_ptr()]

    issues = run_probes(F.silu, CandidateCall(by_address), samples, table=TABLE, settings=settings)
    assert Probe.IN_PLACE_UPDATE.value in _runs(issues) or Probe.INPUT_DEPENDENCE.value in _runs(issues)


def test_small_inputs_with_outputs_over_the_large_threshold_get_the_scaled_pattern(monkeypatch):
    """Issue 8: KernelBench's 63_conv_standard_2D reads 1 GiB and writes 8.5 GB; an expectation's inputs and outputs
    together over the threshold scale the probe pattern from then on, as large inputs do."""
    import forge.checking.probes as probes

    samples = [Sample((_randn((16, 64), 22),), {})]  # 4 KiB in, 16 KiB out
    settings = ProbeSettings(seed=3, extra_calls_cpu=(3, 3), repeats_before_update_cpu=(2, 2))

    def tiled(x):
        return x.repeat(4, 1) * 2.0

    def counted(threshold: int) -> int:
        calls = {"n": 0}

        def candidate(x):
            calls["n"] += 1
            return x.repeat(4, 1) * 2.0

        monkeypatch.setattr(probes, "LARGE_INPUT_BYTES", threshold)
        assert run_probes(tiled, CandidateCall(candidate), samples, table=TABLE, settings=settings) == []
        return calls["n"]

    # wide + offset view, plus 2 repeats + 2 updates + 3 extra calls (normal) vs 1 + 1 + 1 (scaled)
    assert counted(1 << 30) == 2 + 2 + 2 + 3
    assert counted(8 << 10) == 2 + 1 + 1 + 1  # inputs alone (4 KiB) stay under 8 KiB, inputs + outputs do not


def test_the_dependence_check_counts_the_same_in_small_pieces(monkeypatch):
    """The check walks the expectations piece by piece (issue 8: no full-size float64 temporaries); with pieces of
    7 elements a stale output still fails and a following one still passes."""
    import forge.checking.compare as compare

    monkeypatch.setattr(compare, "CPU_CHUNK_ELEMENTS", 7)
    before_inputs = Sample((_randn((4, 16), 12),), {})
    after_inputs = Sample((before_inputs.args[0].clone(),), {})
    after_inputs.args[0][2, 5] -= 6.0
    before = build_expectation(F.gelu, before_inputs, TABLE, 4.0)
    after = build_expectation(F.gelu, after_inputs, TABLE, 4.0)
    stale = F.gelu(before_inputs.args[0])
    with pytest.raises(_Failed):
        _check_dependence("poke", after, before.unseal(), stale, stale.clone())
    _check_dependence("poke", after, before.unseal(), stale, F.gelu(after_inputs.args[0]))
