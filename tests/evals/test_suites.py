"""Suite files: the shipped builtin and smoke suites, schema validation errors, and drawing real calls."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
import torch

from evals import (
    FunctionProblem,
    SuiteFormatError,
    builtin_suite_names,
    load_suite,
    read_suite_file,
    suite_to_json,
    write_suite_file,
)
from forge.samples import TensorSpec

SUITES_DIR = Path(__file__).resolve().parents[2] / "evals" / "suites"


def _good_entry(**overrides):
    entry = {
        "id": "toy.layer_norm",
        "function": "layer_norm",
        "description": "toy",
        "provenance": {"model": "Toy", "layer": "ln", "source": "hand-written"},
        "calls": [{"count": 2, "args": [{"tensor": {"shape": [4, 8], "dtype": "float32"}}, {"tuple": [8]}],
                   "kwargs": {"eps": 1e-5}}],
    }
    entry.update(overrides)
    return entry


def _write(tmp_path: Path, problems, **top) -> Path:
    path = tmp_path / "suite.json"
    path.write_text(json.dumps({"schema_version": 1, "suite": "mine", "problems": problems, **top}))
    return path


# -- shipped suites ----------------------------------------------------------------------------------------
def test_builtin_names():
    assert builtin_suite_names() == ["builtin", "smoke"]


def test_smoke_suite_runs_on_cpu():
    problems = load_suite("smoke")
    assert 4 <= len(problems) <= 6
    for problem in problems:
        assert problem.kind == "function" and problem.suite == "smoke"
        assert problem.provenance.model and problem.provenance.layer and problem.provenance.source
        for count, sample in problem.materialize("cpu", seed=0):
            assert count >= 1
            out = problem.reference(*sample.args, **sample.kwargs)
            assert torch.isfinite(out).all()


def test_builtin_suite_is_real_and_shapes_fit_on_meta():
    problems = load_suite("builtin")
    assert len(problems) >= 24
    assert len({p.id for p in problems}) == len(problems)
    models = {p.provenance.model for p in problems}
    for needed in ("Llama-3-8B", "Mistral-7B-v0.1", "BERT-base-uncased", "ViT-B/16", "GPT-2 (124M)",
                   "Stable Diffusion 1.5 UNet", "Whisper-tiny"):
        assert needed in models
    for problem in problems:
        assert problem.provenance.layer.strip() and problem.provenance.source.strip()
        assert problem.description.strip()
        for _, sample in problem.materialize("meta"):
            tensors = [v for v in (*sample.args, *sample.kwargs.values()) if isinstance(v, torch.Tensor)]
            assert tensors and all(t.device.type == "meta" for t in tensors)
            # The reference accepts the call: shapes, dtypes and arguments are consistent.
            out = problem.reference(*sample.args, **sample.kwargs)
            assert out.device.type == "meta"


def test_builtin_dtypes_and_integer_ranges():
    problems = {p.id: p for p in load_suite("builtin")}
    rms = problems["llama3_8b.prefill.rms_norm"]
    (_, sample), = rms.calls
    assert [a.shape for a in sample.args if isinstance(a, TensorSpec)] == [(2048, 4096), (4096,)]
    assert {a.dtype for a in sample.args if isinstance(a, TensorSpec)} == {torch.bfloat16}
    assert problems["sd15_unet.group_norm"].calls[0][1].args[0].dtype == torch.float16
    assert problems["gpt2.softmax"].calls[0][1].args[0].dtype == torch.float32
    # Integer inputs stay valid: embedding ids below the table size, targets below the vocabulary.
    emb = problems["llama3_8b.prefill_b32.embedding"].calls[0][1]
    assert emb.args[0].dtype == torch.int64 and emb.args[0].low == 0 and emb.args[0].high == emb.args[1].shape[0] - 1
    ce = problems["llama3_8b.prefill.cross_entropy"].calls[0][1]
    assert ce.args[1].high == ce.args[0].shape[1] - 1
    # Attention inputs keep the strides of a transposed view, as the model passes them.
    q = problems["vit_b16.sdpa"].calls[0][1].args[0]
    assert not q.is_contiguous
    (_, meta_sample), = problems["vit_b16.sdpa"].materialize("meta")
    assert meta_sample.args[0].stride() == q.stride


def test_suite_files_match_their_generator():
    make_suites = importlib.import_module("evals.suites.make_suites")
    for name, make in (("builtin", make_suites.builtin_problems), ("smoke", make_suites.smoke_problems)):
        committed = json.loads((SUITES_DIR / f"{name}.json").read_text())
        assert committed["problems"] == suite_to_json(make(), suite=name)["problems"]


# -- materialize -------------------------------------------------------------------------------------------
def test_materialize_is_seeded_and_respects_integer_ranges():
    (problem,) = [p for p in load_suite("smoke") if p.function == "cross_entropy"]
    (_, a), = problem.materialize("cpu", seed=3)
    (_, b), = problem.materialize("cpu", seed=3)
    (_, c), = problem.materialize("cpu", seed=4)
    assert torch.equal(a.args[0], b.args[0]) and torch.equal(a.args[1], b.args[1])
    assert not torch.equal(a.args[0], c.args[0])
    spec = problem.calls[0][1].args[1]
    targets = a.args[1]
    assert targets.dtype == torch.int64 and int(targets.min()) >= spec.low and int(targets.max()) <= spec.high


def test_tensor_specs_lists_every_tensor():
    problems = {p.id: p for p in load_suite("builtin")}
    specs = list(problems["whisper_tiny.encoder.gelu"].tensor_specs())
    assert [s.shape for s in specs] == [(16, 384, 3000), (16, 384, 1500), (16, 1500, 1536)]


# -- schema errors -----------------------------------------------------------------------------------------
def test_valid_file_parses_and_round_trips(tmp_path):
    (problem,) = read_suite_file(_write(tmp_path, [_good_entry(tolerance={"atol": 0.1, "rtol": 0.01})]))
    assert isinstance(problem, FunctionProblem) and problem.suite == "mine"
    assert problem.calls[0][0] == 2 and problem.tolerance.as_tuple() == (0.1, 0.01)
    again = write_suite_file([problem], tmp_path / "out.json", suite="mine")
    assert read_suite_file(again) == [problem]
    assert load_suite(str(again)) == [problem]


@pytest.mark.parametrize(
    ("entry", "field", "words"),
    [
        (_good_entry(function="not_a_function"), "function", "not a replaceable"),
        (_good_entry(provenance={"model": "Toy", "source": "x"}), "provenance.layer", "missing"),
        (_good_entry(provenance={"model": "Toy", "layer": " ", "source": "x"}), "provenance.layer", "non-empty"),
        (_good_entry(calls=[{"args": [{"tensor": {"shape": [4], "dtype": "float33"}}]}]),
         "calls[0].args[0].tensor.dtype", "unknown torch dtype"),
        (_good_entry(calls=[{"args": [{"tensor": {"shape": [4, -1], "dtype": "float32"}}]}]),
         "calls[0].args[0].tensor.shape", "non-negative"),
        (_good_entry(calls=[{"args": [{"tensor": {"shape": [4, 2], "dtype": "float32", "stride": [1]}}]}]),
         "calls[0].args[0].tensor.stride", "one per dimension"),
        (_good_entry(calls=[{"args": [{"tensor": {"shape": [4], "dtype": "float32"}},
                                      {"tensor": {"shape": [4], "dtype": "int64", "low": 0}}]}]),
         "calls[0].args[1].tensor.high", "need 'low' and 'high'"),
        (_good_entry(calls=[{"args": [], "kwargs": {"w": {"tensor": {"shape": [4], "dtype": "int32"}}}}]),
         "calls[0].kwargs.w.tensor.low", "need 'low' and 'high'"),
        (_good_entry(calls=[{"count": 0, "args": []}]), "calls[0].count", "integer >= 1"),
        (_good_entry(calls=[]), "calls", "non-empty"),
        (_good_entry(calls=[{"args": [], "kw": {}}]), "calls[0].kw", "unknown field"),
        (_good_entry(tolerance={"atol": -1, "rtol": 0}), "tolerance.atol", ">= 0"),
        (_good_entry(shape=[1]), "shape", "unknown field"),
    ],
)
def test_schema_errors_name_file_problem_and_field(tmp_path, entry, field, words):
    path = _write(tmp_path, [entry])
    with pytest.raises(SuiteFormatError) as info:
        read_suite_file(path)
    error = info.value
    assert error.field == field and error.problem_id == "toy.layer_norm" and error.path == str(path)
    message = str(error)
    assert str(path) in message and "toy.layer_norm" in message and field in message and words in message


def test_schema_errors_at_suite_level(tmp_path):
    with pytest.raises(SuiteFormatError, match="duplicate problem id") as info:
        read_suite_file(_write(tmp_path, [_good_entry(), _good_entry()]))
    assert info.value.problem_id == "toy.layer_norm" and info.value.field == "id"
    with pytest.raises(SuiteFormatError, match="'extra'.*unknown field"):
        read_suite_file(_write(tmp_path, [], extra=1))
    with pytest.raises(SuiteFormatError, match="schema_version"):
        read_suite_file(_write(tmp_path, [], schema_version=2))
    entry = _good_entry()
    del entry["id"]
    with pytest.raises(SuiteFormatError, match="#0.*'id'.*missing"):
        read_suite_file(_write(tmp_path, [entry]))
    broken = tmp_path / "broken.json"
    broken.write_text('{"suite": "x", "problems": [')
    with pytest.raises(SuiteFormatError, match="broken.json: not valid JSON"):
        read_suite_file(broken)


def test_load_suite_rejects_unknown_names(tmp_path):
    with pytest.raises(ValueError, match="unknown suite 'nope'"):
        load_suite("nope")
    text_file = tmp_path / "suite.txt"
    text_file.write_text("{}")
    with pytest.raises(ValueError, match="not a .json suite file"):
        load_suite(text_file)


def test_function_problem_rejects_bad_construction():
    with pytest.raises(ValueError, match="not a replaceable"):
        FunctionProblem(id="x", suite="s", function="nope", calls=(), provenance=None)
    with pytest.raises(ValueError, match="no calls"):
        FunctionProblem(id="x", suite="s", function="relu", calls=(), provenance=None)
