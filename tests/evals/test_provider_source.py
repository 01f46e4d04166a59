"""`ProviderSource`: any KernelProvider (instances, a registered kernel library, a module:factory spec) evaluated
through the same oracle and timing as every other eval source, on CPU."""

from __future__ import annotations

import pickle
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from evals.cli import build_source, default_out_dir
from evals.problems import FunctionProblem, Provenance, load_suite
from evals.sources import ProviderSource, source_from_name
from evals.sources.provider import parse_provider_spec
from forge.checking import KernelUtils
from forge.providers.libraries import FLAGGEMS, LibraryUnavailable, register_library, unregister_library
from forge.samples import Sample, TensorSpec
from tests.forge.providers_for_tests import DoublingReluProvider, WrongGeluProvider
from tests.forge.test_library_providers import _STANDIN_SOURCE, _library

_FAST = KernelUtils(fresh_inputs_per_sample=1, warmup=1, rounds=3, min_run_time_s=0.0)


def _problem(problem_id: str) -> FunctionProblem:
    return next(p for p in load_suite("smoke") if p.id == problem_id)


def _gelu_problem() -> FunctionProblem:
    sample = Sample((TensorSpec((4, 32), torch.float32),), {})
    return FunctionProblem(id="t.gelu", suite="t", function="gelu", calls=((2, sample),),
                           provenance=Provenance("test", "gelu", "hand-written"))


@pytest.fixture
def standin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The Triton stand-in library of tests/forge/test_library_providers.py, registered as "standin"."""
    module = f"kforge_standin_eval_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(_STANDIN_SOURCE))
    monkeypatch.syspath_prepend(str(tmp_path))
    register_library(_library("standin", module))
    yield "standin"
    unregister_library("standin")
    sys.modules.pop(module, None)


def test_spec_parsing_and_errors() -> None:
    assert parse_provider_spec("provider:FlagGems") == ("flaggems", None)
    assert parse_provider_spec("provider:pkg.mod:Factory") == ("pkg.mod", "Factory")
    for bad in ("provider:", "provider:pkg:", "provider:a:b:c"):
        with pytest.raises(ValueError, match="bad provider spec"):
            parse_provider_spec(bad)
    with pytest.raises(ValueError, match="unknown kernel library 'nolib'"):
        source_from_name("provider:nolib")
    with pytest.raises(ValueError, match="cannot import no_such_pkg"):
        source_from_name("provider:no_such_pkg.mod:Factory")
    with pytest.raises(ValueError, match="has no attribute 'Nope'"):
        source_from_name("provider:forge.providers:Nope")


def test_missing_library_is_a_one_line_error_before_any_worker() -> None:
    if FLAGGEMS.is_installed():
        pytest.skip("FlagGems is installed here")
    hint = r'FlagGems is not installed; install it with pip install -e "\.\[flaggems\]"'
    with pytest.raises(LibraryUnavailable, match=hint):
        source_from_name("provider:flaggems")


def test_provider_instances_are_judged_by_the_oracle() -> None:
    source = ProviderSource([DoublingReluProvider(), WrongGeluProvider()])
    assert source.name == "provider:DoublingReluProvider+WrongGeluProvider"
    relu = source.evaluate(_problem("smoke.relu"), 0, "cpu", _FAST)
    assert relu["correct"] and relu["failure_reason"] is None and relu["latency_ms"] > 0
    gelu = source.evaluate(_gelu_problem(), 0, "cpu", _FAST)
    assert gelu["compiled"] and not gelu["correct"] and gelu["failure_reason"].startswith("incorrect")
    silu = source.evaluate(_problem("smoke.silu"), 0, "cpu", _FAST)
    assert silu["failure_reason"] == "unsupported: provider:DoublingReluProvider+WrongGeluProvider has no provider " \
                                     "for F.silu"
    restored = pickle.loads(pickle.dumps(source))  # travels to worker processes
    assert restored.name == source.name


def test_factory_spec_gets_the_function_name() -> None:
    source = source_from_name("provider:tests.forge.providers_for_tests:DoublingReluProvider")
    assert [p.supported_function for p in source.providers_for("relu")] == ["relu"]
    assert source.evaluate(_problem("smoke.relu"), 0, "cpu", _FAST)["correct"]
    # The same factory asked for silu claims silu but computes relu: the oracle, not the source, says no.
    assert source.evaluate(_problem("smoke.silu"), 0, "cpu", _FAST)["failure_reason"].startswith("incorrect")


def test_library_spec_evaluates_a_triton_library_on_cpu(standin: str) -> None:
    source = source_from_name(f"provider:{standin}")
    assert source.name == "provider:standin"
    record = source.evaluate(_problem("smoke.silu"), 0, "cpu", _FAST)
    assert record["correct"] and record["latency_ms"] > 0 and record["eager_ms"] > 0, record["failure_reason"]
    relu = source.evaluate(_problem("smoke.relu"), 0, "cpu", _FAST)
    assert relu["failure_reason"] == "unsupported: provider:standin has no provider for F.relu"


def test_library_refusal_reason_reaches_the_record(standin: str) -> None:
    problem = _problem("smoke.silu")
    double = FunctionProblem(id="t.silu64", suite="t", function="silu", provenance=problem.provenance,
                             calls=((1, Sample((TensorSpec((8,), torch.float64),), {})),))
    record = source_from_name(f"provider:{standin}").evaluate(double, 0, "cpu", _FAST)
    assert record["failure_reason"] == "unsupported: Standin silu: input must be an fp16, bf16 or fp32 tensor, " \
                                       "got torch.float64"


def test_cli_accepts_provider_sources() -> None:
    import argparse

    from evals.cli import add_eval_parser

    parser = argparse.ArgumentParser()
    add_eval_parser(parser.add_subparsers())
    args = parser.parse_args(["eval", "smoke", "--source", "provider:forge.providers:CompiledFunctionProvider"])
    assert args.source == "provider:forge.providers:CompiledFunctionProvider"
    assert build_source(args).name == "provider:forge.providers:CompiledFunctionProvider"
    assert default_out_dir("builtin", args.source) == Path("runs/eval/builtin-provider-forge.providers-"
                                                           "CompiledFunctionProvider")
    with pytest.raises(SystemExit):
        parser.parse_args(["eval", "smoke", "--source", "provider:a:b:c"])
    with pytest.raises(SystemExit):
        parser.parse_args(["eval", "smoke", "--source", "triton"])
