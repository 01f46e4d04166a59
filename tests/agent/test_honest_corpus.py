"""The honest corpus (`tests/honest_corpus/`): replies in real model style, written by stand-in models given only the
rendered first request, for KernelBench level 1-3 module problems and built-in function problems. Every one must
pass the screen: the screen once refused all eight honest KernelBench replies of a frontier model for
`super(ModelNew, self).__init__()` and for reading a submodule's `weight`. On a GPU,
`python3 -m benchmarks.honest_corpus judge` runs every file through the real judge (BENCHMARKS.md)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from agent.languages import get_language
from evals.problems.suite import load_suite

CORPUS = Path(__file__).resolve().parents[1] / "honest_corpus"
ENTRIES = json.loads((CORPUS / "manifest.json").read_text(encoding="utf-8"))["entries"]
FUNCTIONS = {p.id: p.function for p in load_suite("builtin")}


def test_the_corpus_covers_module_problems_of_three_levels_and_function_kernels() -> None:
    assert len(ENTRIES) >= 40
    levels = Counter(e["problem"].split("/")[0] for e in ENTRIES if e["kind"] == "module")
    assert set(levels) == {"level1", "level2", "level3"} and min(levels.values()) >= 5, levels
    assert sum(e["kind"] == "function" for e in ENTRIES) >= 10
    assert {p.relative_to(CORPUS).as_posix() for p in CORPUS.rglob("*.py")} == {e["file"] for e in ENTRIES}


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["file"] for e in ENTRIES])
def test_every_honest_reply_passes_the_screen(entry: dict) -> None:
    source = (CORPUS / entry["file"]).read_text(encoding="utf-8")
    triton = get_language("triton")
    if entry["kind"] == "module":
        violations = triton.screen_module(source)
    else:
        violations = triton.screen(source, FUNCTIONS[entry["problem"]])
    assert violations == [], "\n".join(str(v) for v in violations)
