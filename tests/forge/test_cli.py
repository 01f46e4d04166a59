"""The kforge CLI: the demo end to end, a user's model by PKG.MODULE:FACTORY, and plan show."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kforge.cli import main

REPO = Path(__file__).resolve().parents[2]


def test_optimize_demo_writes_a_loadable_plan(tmp_path, capsys) -> None:
    out = tmp_path / "demo.plan.json"
    assert main(["optimize", "--demo", "--device", "cpu", "--no-generate", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "== profile" in printed and "rms_norm" in printed and "== candidates ==" in printed
    assert "== hot module classes" in printed and "\nreachable: " in printed and "% in F calls" in printed
    assert json.loads(out.read_text())["format"] == "kernel-forge-plan"
    assert main(["plan", "show", str(out)]) == 0
    assert "replacement(s)" in capsys.readouterr().out


def test_optimize_a_user_model_by_factory(tmp_path, monkeypatch, capsys) -> None:
    package = tmp_path / "usermodels"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "mlp.py").write_text(textwrap.dedent("""
        import torch
        from torch import nn

        def build():
            return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.LayerNorm(64))

        def inputs():
            return [torch.randn(8, 32), torch.randn(8, 32)]
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    code = main(["optimize", "usermodels.mlp:build", "--inputs", "usermodels.mlp:inputs", "--device", "cpu",
                 "--no-generate"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "gelu" in printed and "layer_norm" in printed and "linear" in printed


def test_bad_target_and_plan_errors_are_clear(tmp_path, capsys) -> None:
    assert main(["optimize", "nocolon", "--inputs", "x:y", "--device", "cpu"]) == 2
    assert "PKG.MODULE:NAME" in capsys.readouterr().err
    assert main(["optimize", "no_such_pkg_xyz:build", "--inputs", "x:y", "--device", "cpu"]) == 2
    assert "cannot import" in capsys.readouterr().err
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    assert main(["plan", "show", str(broken)]) == 2
    assert "not valid JSON" in capsys.readouterr().err


def test_console_script_entry_point_runs() -> None:
    result = subprocess.run([sys.executable, "-m", "kforge.cli", "--help"], capture_output=True, text=True,
                            cwd=REPO, timeout=120)
    assert result.returncode == 0 and "optimize" in result.stdout and "plan" in result.stdout


def test_plan_verify_checks_every_kernel(tmp_path, capsys) -> None:
    import torch

    from forge.plan import KernelOptimizationPlan, PlanEntry
    from forge.samples import Sample
    from tests.forge.providers_for_tests import DoublingReluProvider, FastGeluProvider

    x = torch.randn(4, 16)
    good = FastGeluProvider()
    good.prepare([Sample((x,), {})])
    path = KernelOptimizationPlan(entries=(PlanEntry(good, (Sample((x,), {}),)),)).save(tmp_path / "good.json")
    assert main(["plan", "verify", str(path)]) == 0
    assert "1 of 1 kernel(s) verified" in capsys.readouterr().out
    wrong = DoublingReluProvider("gelu")  # relu posing as gelu
    wrong.prepare([Sample((x,), {})])
    path = KernelOptimizationPlan(entries=(PlanEntry(wrong, (Sample((x,), {}),)),)).save(tmp_path / "bad.json")
    assert main(["plan", "verify", str(path)]) == 1
    assert "mismatch" in capsys.readouterr().out


def test_bad_llm_configuration_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.setenv("KFORGE_LLM_MODEL", "m")
    monkeypatch.setenv("KFORGE_LLM_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("KFORGE_LLM_INPUT_PRICE", "cheap")
    with pytest.raises(SystemExit, match="KFORGE_LLM_INPUT_PRICE"):
        main(["optimize", "--demo", "--device", "cpu"])


def test_library_warnings_stay_out_of_the_output_unless_verbose(capsys) -> None:
    import logging
    import warnings

    from kforge.cli import _configure_logging

    try:
        for verbosity, shown in ((0, False), (1, True)):
            _configure_logging(verbosity)
            with warnings.catch_warnings():
                warnings.simplefilter("always")
                warnings.warn("Dynamo does not know how to trace this builtin", UserWarning, stacklevel=1)
            assert ("Dynamo does not know" in capsys.readouterr().err) is shown
    finally:
        logging.captureWarnings(False)
        logging.getLogger().handlers.clear()
