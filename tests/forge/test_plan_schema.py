"""Plan files are checked field by field and read with bounds: every bad file is a `PlanLoadError` (issue 11)."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest
import torch

from forge.plan import KernelOptimizationPlan, PlanEntry, PlanLoadError
from forge.plan_schema import PlanLimits, read_plan_json, validate_plan_dict
from forge.samples import Sample, draw_sample, signature_of
from kforge.cli import main
from tests.forge.providers_for_tests import FastGeluProvider


def _plan_dict(kwargs: dict | None = None) -> dict:
    x = torch.randn(4, 16)
    sample = Sample((x,), kwargs if kwargs is not None else {"approximate": "none"})
    provider = FastGeluProvider()
    provider.prepare([sample])
    entry = PlanEntry(provider=provider, signatures=(sample,), latency_ms=0.5, baseline_ms=1.0, description="fast")
    return KernelOptimizationPlan(entries=(entry,)).to_dict()


def _write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    return path


def test_a_valid_plan_passes_and_loads(tmp_path) -> None:
    data = _plan_dict()
    validate_plan_dict(copy.deepcopy(data))
    assert KernelOptimizationPlan.load(_write(tmp_path, data)).functions == ["gelu"]


def _tensor(data: dict) -> dict:
    return data["entries"][0]["signatures"][0]["args"][0]["tensor"]


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda d: d.update(environment="a100"), r"environment: must be an object, got str"),
    (lambda d: d["entries"][0].update(latency_ms="fast"), r"entries\[0\]\.latency_ms: must be a number or null"),
    (lambda d: d["entries"][0].update(baseline_ms=True), r"entries\[0\]\.baseline_ms: must be a number"),
    (lambda d: d["entries"][0].update(latency_ms=-1), r"latency_ms: must be >= 0"),
    (lambda d: d.update(extra=1), r"unknown key\(s\) 'extra'"),
    (lambda d: d["entries"][0].update(function="gelu; rm -rf"), r"function: 'gelu; rm -rf' is not a valid name"),
    (lambda d: d["entries"][0]["provider"].update(type=7), r"provider\.type: must be a name, got int"),
    (lambda d: d["entries"][0].update(signatures=[]), r"entry 0 \(gelu\): plan entry for gelu has no validated"),
    (lambda d: d["entries"][0].update(signatures={}), r"signatures: must be a list"),
    (lambda d: _tensor(d).update(shape=[2**20, 2**20], stride=[2**20, 1]),
     r"needs 1099511627776 elements of storage, over the limit of 2147483648 per tensor"),
    (lambda d: _tensor(d).update(shape=[4, 16], stride=[2**40, 1]), r"over the limit of 2147483648 per tensor"),
    (lambda d: _tensor(d).update(shape=[4, -16]), r"shape\[1\]: must be >= 0, got -16"),
    (lambda d: _tensor(d).update(shape=[4.5, 16]), r"shape\[0\]: must be a non-negative integer"),
    (lambda d: _tensor(d).update(stride=[1]), r"1 strides for 2 dimensions"),
    (lambda d: _tensor(d).update(dtype="float128"), r"unknown torch dtype 'float128'"),
    (lambda d: _tensor(d).update(device="tpu:0"), r"'tpu:0' is not a device"),
    (lambda d: _tensor(d).update(shape=[1] * 40, stride=[1] * 40), r"40 dimensions \(limit 32\)"),
    (lambda d: _tensor(d).update(mean="high"), r"tensor\.mean: must be a number"),
    (lambda d: d["entries"][0]["signatures"][0]["args"].append({"tensor": {}, "x": 1}), r"one of \["),
    (lambda d: d["entries"][0]["provider"].update(state=[[[[[[]]]]]] * 2, deep=_nested(80)),
     r"nested deeper than 64 levels"),
    (lambda d: d["entries"][0]["provider"].update(blob=10**30), r"integer .* out of range"),
])
def test_bad_fields_are_refused_at_load(tmp_path, mutate, message) -> None:
    data = _plan_dict()
    mutate(data)
    with pytest.raises(PlanLoadError, match=message):
        KernelOptimizationPlan.load(_write(tmp_path, data))


def _nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


def test_total_elements_per_entry_are_capped() -> None:
    data = _plan_dict()
    entry = data["entries"][0]
    entry["signatures"] = [copy.deepcopy(entry["signatures"][0]) for _ in range(3)]
    validate_plan_dict(copy.deepcopy(data), PlanLimits(max_entry_elements=3 * 64))
    with pytest.raises(PlanLoadError, match="more than 128 elements in all"):
        validate_plan_dict(data, PlanLimits(max_entry_elements=128))


def test_binary_deep_nan_and_huge_integer_files_are_load_errors(tmp_path) -> None:
    cases = {
        "binary": (bytes(range(256)) * 4, "is not UTF-8 text"),
        "deep": (b"[" * 5000 + b"]" * 5000, "nested too deeply"),
        "nan": (json.dumps({"latency_ms": float("nan")}).encode(), "non-finite number NaN"),
        "digits": (b"{\"version\": " + b"9" * 5000 + b"}", "not a valid plan"),
    }
    for name, (content, message) in cases.items():
        path = tmp_path / f"{name}.json"
        path.write_bytes(content)
        with pytest.raises(PlanLoadError, match=message):
            KernelOptimizationPlan.load(path)


def test_size_cap_and_non_regular_files_are_refused_before_reading(tmp_path) -> None:
    big = tmp_path / "big.json"
    with open(big, "wb") as handle:
        handle.truncate(300 * 2**20)  # sparse: 300 MB without writing them
    with pytest.raises(PlanLoadError, match=r"is 314572800 bytes, over the 67108864-byte limit"):
        KernelOptimizationPlan.load(big)
    with pytest.raises(PlanLoadError, match="not a regular file"):
        KernelOptimizationPlan.load("/dev/zero")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # no writer: a blocking open would hang here
    with pytest.raises(PlanLoadError, match="not a regular file"):
        KernelOptimizationPlan.load(fifo)
    with pytest.raises(PlanLoadError, match="is a directory"):
        KernelOptimizationPlan.load(tmp_path)
    small = tmp_path / "small.json"
    small.write_text(json.dumps(_plan_dict()))
    with pytest.raises(PlanLoadError, match="over the 100-byte limit"):
        read_plan_json(small, PlanLimits(max_file_bytes=100))


def test_plan_show_refuses_a_bad_field_in_one_line(tmp_path, capsys) -> None:
    data = _plan_dict()
    data["entries"][0]["latency_ms"] = "fast"
    assert main(["plan", "show", str(_write(tmp_path, data))]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "latency_ms: must be a number" in err[0]


def test_plan_verify_refuses_a_huge_signature_before_allocating(tmp_path, capsys) -> None:
    data = _plan_dict()
    _tensor(data).update(shape=[2**20, 2**20], stride=[2**20, 1])
    assert main(["plan", "verify", str(_write(tmp_path, data))]) == 2
    assert "per tensor" in capsys.readouterr().err


def test_plan_show_escapes_control_characters_from_the_file(tmp_path, capsys) -> None:
    data = _plan_dict({"approximate": "\x1b[2J\x1b]0;owned\x07"})
    data["entries"][0]["source"] = "static\x1b[31m\u202e"
    data["environment"]["gpu_name"] = "GPU\x1b[1A"
    assert main(["plan", "show", str(_write(tmp_path, data))]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    assert "\\x1b[2J" in out and "\\x1b[31m" in out and "GPU\\x1b[1A" in out and "\\u202e" in out


def test_generated_source_that_fails_screening_is_refused_at_load(tmp_path, capsys) -> None:
    from agent.provider import GeneratedKernelProvider
    from tests.agent.kernels import SILU_FORBIDDEN

    sample = Sample((torch.randn(64),), {"inplace": False})
    provider = GeneratedKernelProvider("silu", SILU_FORBIDDEN, language="triton", signatures=[sample],
                                       cache_dir=tmp_path)
    provider._ready = True
    path = KernelOptimizationPlan(entries=(PlanEntry(provider, (sample,)),)).save(tmp_path / "plan.json")
    with pytest.raises(PlanLoadError, match=r"entry 0 \(silu\): generated kernel fails screening"):
        KernelOptimizationPlan.load(path)
    assert main(["plan", "show", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fails screening" in err[0]


def _offset_plan_dict() -> dict:
    """A plan validated on `x[1:]` of a larger buffer: its tensor spec has a storage offset (issue 10)."""
    buf = torch.randn(5, 16)
    sample = Sample((buf[1:],), {"approximate": "none"})
    provider = FastGeluProvider()
    provider.prepare([sample])
    return KernelOptimizationPlan(entries=(PlanEntry(provider=provider, signatures=(sample,)),)).to_dict()


def test_an_offset_signature_round_trips_and_its_fresh_inputs_are_offset_views(tmp_path) -> None:
    data = _offset_plan_dict()
    assert _tensor(data)["storage_offset"] == 16
    plan = KernelOptimizationPlan.load(_write(tmp_path, data))
    spec = plan.entries[0].signatures[0].args[0]
    assert spec.storage_offset == 16
    buf = torch.randn(5, 16)
    assert signature_of((buf[1:],), {"approximate": "none"}) in plan.entries[0].signature_keys
    assert signature_of((buf[:4],), {"approximate": "none"}) not in plan.entries[0].signature_keys
    fresh = draw_sample(plan.entries[0].signatures[0], torch.Generator().manual_seed(0))
    assert fresh.args[0].storage_offset() == 16 and fresh.args[0].shape == (4, 16)
    assert fresh.signature() == signature_of((buf[1:],), {"approximate": "none"})
    assert plan.verify() == {"gelu": []}  # re-validated on offset views


def test_a_plan_written_before_offsets_loads_at_offset_zero(tmp_path) -> None:
    data = _offset_plan_dict()
    del _tensor(data)["storage_offset"]
    plan = KernelOptimizationPlan.load(_write(tmp_path, data))
    assert plan.entries[0].signatures[0].args[0].storage_offset == 0
    assert signature_of((torch.randn(4, 16),), {"approximate": "none"}) in plan.entries[0].signature_keys


@pytest.mark.parametrize(("offset", "message"), [
    ("16", r"tensor\.storage_offset: must be an integer, got str"),
    (16.0, r"tensor\.storage_offset: must be an integer, got float"),
    (True, r"tensor\.storage_offset: must be an integer, got bool"),
    (None, r"tensor\.storage_offset: must be an integer, got NoneType"),
    (-1, r"tensor\.storage_offset: must be >= 0, got -1"),
    (2**40, r"needs 1099511627840 elements of storage \(storage offset 1099511627776 included\), over the limit"),
])
def test_bad_storage_offsets_are_refused_at_load(tmp_path, offset, message) -> None:
    data = _offset_plan_dict()
    _tensor(data)["storage_offset"] = offset
    with pytest.raises(PlanLoadError, match=message):
        KernelOptimizationPlan.load(_write(tmp_path, data))
