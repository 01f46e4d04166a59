"""Samples, specs and signatures: de-dup keys include dtype, device and strides; JSON round trips."""

from __future__ import annotations

import json

import pytest
import torch

from forge.samples import (
    Sample,
    SampleCounter,
    TensorSpec,
    clone_value,
    draw_sample,
    sample_from_json,
    sample_to_json,
    signature_of,
)


def test_signature_distinguishes_dtype_stride_and_scalar_types() -> None:
    x = torch.randn(4, 8)
    assert signature_of((x,), {}) == signature_of((torch.randn(4, 8),), {})
    assert signature_of((x,), {}) != signature_of((x.double(),), {})
    assert signature_of((x,), {}) != signature_of((torch.randn(8, 4).t(),), {})
    assert signature_of((x,), {"dim": 1}) != signature_of((x,), {"dim": 1.0})
    assert signature_of((x,), {"dim": 1}) != signature_of((x,), {"dim": True})
    assert signature_of((x,), {"a": 1, "b": 2}) == signature_of((x,), {"b": 2, "a": 1})


def test_counter_dedups_by_dtype_and_stride_and_clones() -> None:
    counter = SampleCounter()
    x = torch.randn(4, 8)
    counter.add((x,), {})
    counter.add((torch.randn(4, 8),), {})
    counter.add((x.to(torch.bfloat16),), {})
    counter.add((torch.randn(8, 4).t(),), {})
    counts = [c for c, _ in counter.items()]
    assert counts == [2, 1, 1]
    stored = counter.items()[0][1].args[0]
    x.add_(1.0)
    assert not torch.equal(stored, x)


def test_spec_draw_keeps_layout_and_ranges() -> None:
    base = torch.randn(6, 10)[:, ::2]
    spec = TensorSpec.of(base)
    drawn = spec.draw(torch.Generator().manual_seed(0))
    assert drawn.shape == base.shape and drawn.stride() == base.stride() and drawn.dtype == base.dtype
    idx = TensorSpec.of(torch.tensor([3, 7, 9])).draw(torch.Generator().manual_seed(1))
    assert int(idx.min()) >= 3 and int(idx.max()) <= 9
    expanded = torch.randn(1, 8).expand(4, 8)
    assert clone_value(expanded).stride() == (0, 1)


def test_sample_json_round_trip_preserves_signature() -> None:
    x = torch.randn(2, 3, 4).transpose(1, 2)
    sample = Sample((x, (4,)), {"weight": None, "eps": 1e-5, "dtype": torch.float32, "mode": "x", "n": float("inf")})
    data = json.loads(json.dumps(sample_to_json(sample)))
    restored = sample_from_json(data)
    assert signature_of(restored.args, restored.kwargs) == sample.signature()
    fresh = draw_sample(restored, torch.Generator().manual_seed(0))
    assert fresh.signature() == sample.signature()


def test_invalid_json_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown torch dtype"):
        TensorSpec.from_json({"shape": [2], "dtype": "float99", "stride": [1]})
    with pytest.raises(ValueError, match="expected keys 'args' and 'kwargs'"):
        sample_from_json({"nope": 1})
