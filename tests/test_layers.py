"""Layers point one way: `forge` (the library) imports nothing from `agent` (the LLM generator), `evals` or `kforge`
(the application that composes them); `agent` and `evals` import nothing from `kforge`. Read from the source, so a
lazy import inside a function counts too, and so do module names handed to `importlib.import_module`.

`benchmarks/` holds command-line tools over the packages, not code of its own that anything depends on: nothing in
`tests/` imports it, and no test runs one of its scripts or modules (a string naming `benchmarks.<module>` or
`benchmarks/<file>` outside a docstring), so code a test needs lives in a package and the tool is a thin CLI over it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {"forge": {"agent", "evals", "kforge"}, "agent": {"kforge", "evals"}, "evals": {"kforge"},
             "tests": {"benchmarks"}}
# `-m benchmarks.oracle_memory`, `benchmarks/render_demo_prompts.py`, `ROOT / "benchmarks"`
BENCHMARK_NAME = re.compile(r"(?<![\w.-])benchmarks[./][A-Za-z_]|^benchmarks$")


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


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}


def _benchmark_runs(package: str = "tests") -> list[str]:
    """Strings in `package` (docstrings aside) that name a module or file under `benchmarks/`: a test running it.
    This file is left out: it names `benchmarks` to forbid it."""
    found = []
    for path in sorted(p for p in (ROOT / package).rglob("*.py") if p.resolve() != Path(__file__).resolve()):
        tree = ast.parse(path.read_text(), filename=str(path))
        docstrings = _docstrings(tree)
        found += [f"{path.relative_to(ROOT)}:{node.lineno}: runs {node.value.strip()[:80]!r}"
                  for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
                  and BENCHMARK_NAME.search(node.value.strip())]
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_point_one_way(package):
    assert _crossings(package) == []


def test_no_test_runs_a_benchmark():
    assert _benchmark_runs() == []


def test_the_check_sees_a_lazy_import(tmp_path, monkeypatch):
    package = tmp_path / "forge"
    package.mkdir()
    (package / "bad.py").write_text("def f():\n    from agent.generator import LLMKernelGenerator\n"
                                    "    return __import__('evals.cli')\n")
    import sys

    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert _crossings("forge") == ["forge/bad.py:2: imports agent.generator", "forge/bad.py:3: imports evals.cli"]


def test_the_check_sees_a_test_that_imports_or_runs_a_benchmark(tmp_path, monkeypatch):
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_bad.py").write_text(
        '"""Mentioning benchmarks/oracle_memory.py in a docstring is fine."""\n'
        "import subprocess, sys\n"
        "from benchmarks.render_demo_prompts import render\n"
        "def test_it():\n"
        "    subprocess.run([sys.executable, '-m', 'benchmarks.oracle_memory', '--small'])\n"
        "    subprocess.run([sys.executable, f'{sys.prefix}/benchmarks/launch_overhead.py'])\n"
        "    assert 'the benchmarks are tools'\n")
    import sys

    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert _crossings("tests") == ["tests/test_bad.py:3: imports benchmarks.render_demo_prompts"]
    assert _benchmark_runs() == ["tests/test_bad.py:5: runs 'benchmarks.oracle_memory'",
                                 "tests/test_bad.py:6: runs '/benchmarks/launch_overhead.py'"]
