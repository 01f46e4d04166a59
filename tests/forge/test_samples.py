"""Samples, specs and signatures: de-dup keys include dtype, device, strides, storage offset and address alignment;
JSON round trips; containers keep their types."""

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
    map_values,
    sample_from_json,
    sample_to_json,
    signature_of,
    spec_sample,
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


def test_signature_tells_offset_views_and_address_alignment_apart() -> None:
    fresh, buf = torch.randn(4, 8), torch.randn(6, 8)
    # the issue-10 case: same shape, strides, dtype and device as a fresh tensor, but it starts at element 8
    assert signature_of((buf[1:5],), {}) != signature_of((fresh,), {})
    assert signature_of((buf[:4],), {}) == signature_of((fresh,), {})  # offset 0, larger storage: same call
    assert signature_of((buf[1:5],), {}) == signature_of((buf[2:],), {})  # offsets 8 and 16: same class
    flat = torch.randn(40)
    misaligned, aligned = flat[1:33].view(4, 8), flat[4:36].view(4, 8)  # 4 vs 16 bytes past the storage start
    assert misaligned.data_ptr() % 16 == 4 and aligned.data_ptr() % 16 == 0
    assert signature_of((misaligned,), {}) != signature_of((aligned,), {})
    assert signature_of((aligned,), {}) == signature_of((buf[1:5],), {})
    np = pytest.importorskip("numpy")
    unaligned_base = torch.from_numpy(np.zeros(33, np.float32)[1:]).view(4, 8)  # offset 0 on a misaligned storage
    assert unaligned_base.storage_offset() == 0
    same = unaligned_base.data_ptr() % 16 == fresh.data_ptr() % 16
    assert (signature_of((unaligned_base,), {}) == signature_of((fresh,), {})) == same


@pytest.mark.parametrize("start", [0, 1, 2, 4, 8])
def test_spec_of_a_view_has_its_live_signature_and_draws_an_offset_view(start: int) -> None:
    view = torch.randn(64)[start : start + 32].view(4, 8)
    spec = TensorSpec.of(view)
    assert spec.storage_offset == start and spec.storage_size() == start + 32
    assert signature_of((spec,), {}) == signature_of((view,), {})
    drawn = spec.draw(torch.Generator().manual_seed(0))
    assert drawn.storage_offset() == start and drawn.untyped_storage().nbytes() == (start + 32) * 4
    assert signature_of((drawn,), {}) == signature_of((view,), {})
    fresh = draw_sample(Sample((spec,), {}), torch.Generator().manual_seed(1)).args[0]
    assert fresh.storage_offset() == start and signature_of((fresh,), {}) == signature_of((view,), {})
    assert clone_value(view).storage_offset() == start


def test_spec_json_round_trips_the_offset_and_old_specs_load_at_offset_zero() -> None:
    view = torch.randn(40)[3:35].view(4, 8)
    sample = Sample((view,), {"eps": 1e-5})
    data = json.loads(json.dumps(sample_to_json(sample)))
    assert data["args"][0]["tensor"]["storage_offset"] == 3
    restored = sample_from_json(data)
    assert restored.args[0].storage_offset == 3 and restored.signature() == sample.signature()
    assert draw_sample(restored, torch.Generator().manual_seed(0)).args[0].storage_offset() == 3
    del data["args"][0]["tensor"]["storage_offset"]  # a plan written before offsets were recorded
    old = sample_from_json(data)
    assert old.args[0].storage_offset == 0 and old.signature() == signature_of((torch.randn(4, 8),), {"eps": 1e-5})


@pytest.mark.parametrize("bad", ["3", 2.5, True, -1, None])
def test_spec_json_refuses_a_storage_offset_that_is_not_a_non_negative_integer(bad) -> None:
    with pytest.raises(ValueError, match="storage_offset must be a non-negative integer"):
        TensorSpec.from_json({"shape": [2], "dtype": "float32", "stride": [1], "storage_offset": bad})


def test_map_values_keeps_torch_size_and_other_tuple_subclasses() -> None:
    x = torch.randn(2, 640)
    size = x.shape[-1:]
    cloned = clone_value((x, size))
    assert type(cloned[1]) is torch.Size and cloned[1] == size
    assert type(map_values(torch.Size([2, 3]), lambda v: v + 1)) is torch.Size
    assert map_values(torch.Size([2, 3]), str) == ("2", "3")  # not a size any more: a plain tuple
    values = torch.return_types.max((torch.ones(2), torch.zeros(2)))
    assert type(map_values(values, lambda v: v)) is type(values)
    assert type(spec_sample(Sample((x, size), {})).args[1]) is torch.Size
    assert type(map_values((1, 2), lambda v: v)) is tuple


def test_torch_size_and_tuple_are_the_same_signature_but_lists_are_not() -> None:
    x = torch.randn(2, 640)
    assert signature_of((x, torch.Size([640])), {}) == signature_of((x, (640,)), {})
    assert signature_of((x,), {"shape": torch.Size([640])}) == signature_of((x,), {"shape": (640,)})
    assert signature_of((x, [640]), {}) != signature_of((x, (640,)), {})
    assert signature_of((x, torch.Size([640])), {}) != signature_of((x, (641,)), {})


def test_statistics_of_huge_tensors_are_computed_in_pieces_with_the_same_result(monkeypatch):
    """Issue 8: above `_STATS_CHUNK` elements the mean and spread come from two chunked passes (no float64 copy of a
    7.5 GB input); they agree with the one-shot path, non-finite values left out in both."""
    import forge.samples as samples

    values = torch.randn(40, 50, generator=torch.Generator().manual_seed(5)) * 3 + 1
    values[3, 7], values[9, 1] = float("nan"), float("inf")
    one_shot = samples.TensorSpec.of(values)
    monkeypatch.setattr(samples, "_STATS_CHUNK", 64)
    chunked = samples.TensorSpec.of(values)
    assert chunked.mean == pytest.approx(one_shot.mean, rel=1e-12)
    assert chunked.std == pytest.approx(one_shot.std, rel=1e-12)
    empty = samples.TensorSpec.of(torch.full((100,), float("nan")))
    assert (empty.mean, empty.std) == (None, None)
