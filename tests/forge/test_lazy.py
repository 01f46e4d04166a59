"""Package exports imported on first use (`forge.lazy`): what a sandbox child does not import, and the exports."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest

from forge.lazy import lazy_exports

HEAVY = ("forge.optimizer", "forge.runtime", "pandas", "openai", "agent.llm")


def test_a_sandbox_child_starts_without_the_optimizer_pandas_or_the_llm_client():
    # A fresh interpreter: this one imported everything already. agent.languages is what a Triton candidate's child
    # loads for its language.
    script = ("import sys, forge.sandbox.child, agent.languages; "
              f"print([m for m in {HEAVY!r} if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_an_export_is_imported_when_first_read_and_kept(monkeypatch):
    package = types.ModuleType("kforge_lazy_probe")
    monkeypatch.setitem(sys.modules, package.__name__, package)
    package.__getattr__, package.__dir__ = lazy_exports(package.__name__, {"Sample": "forge.samples"})
    from forge.samples import Sample

    assert "Sample" not in vars(package) and "Sample" in package.__dir__()
    assert package.Sample is Sample and vars(package)["Sample"] is Sample
    with pytest.raises(AttributeError, match="'kforge_lazy_probe' has no attribute 'Missing'"):
        package.Missing  # noqa: B018 - the attribute read is the test
