"""Layers point one way: `forge` (the library) imports nothing from `agent` (the LLM generator), `evals` or `kforge`
(the application that composes them); `agent` and `evals` import nothing from `kforge`. Read from the source, so a
lazy import inside a function counts too, and so do module names handed to `importlib.import_module`."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {"forge": {"agent", "evals", "kforge"}, "agent": {"kforge", "evals"}, "evals": {"kforge"}}


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in {
                "import_module", "__import__"} and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            found.append((node.lineno, node.args[0].value))
    return found


def _crossings(package: str) -> list[str]:
    banned = FORBIDDEN[package]
    return [f"{path.relative_to(ROOT)}:{line}: imports {name}"
            for path in sorted((ROOT / package).rglob("*.py"))
            for line, name in _imports(path) if name.split(".")[0] in banned]


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_point_one_way(package):
    assert _crossings(package) == []


def test_the_check_sees_a_lazy_import(tmp_path, monkeypatch):
    package = tmp_path / "forge"
    package.mkdir()
    (package / "bad.py").write_text("def f():\n    from agent.generator import LLMKernelGenerator\n"
                                    "    return __import__('evals.cli')\n")
    import sys

    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert _crossings("forge") == ["forge/bad.py:2: imports agent.generator", "forge/bad.py:3: imports evals.cli"]
