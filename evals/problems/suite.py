"""Suites: named lists of problems, read from JSON suite files or from folders of KernelBench problem files.

`load_suite("builtin")` and `load_suite("smoke")` read the suites shipped in `evals/suites/`; any other argument is
a path to a JSON suite file (schema: `evals/suites/README.md`) or to a folder of KernelBench files.
`write_suite_file` writes function problems back in the same schema, compactly formatted.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from forge.atomic import write_text_atomic

from .base import Problem, SuiteFormatError
from .function import FunctionProblem, function_problem_from_json
from .kernelbench import load_kernelbench_folder

__all__ = [
    "SCHEMA_VERSION",
    "builtin_suite_names",
    "load_suite",
    "read_suite_file",
    "suite_to_json",
    "write_suite_file",
]

SCHEMA_VERSION = 1
_BUILTIN = ("builtin", "smoke")
_TOP_KEYS = {"schema_version", "suite", "description", "problems"}


def builtin_suite_names() -> list[str]:
    """Names accepted by `load_suite` without a path."""
    return list(_BUILTIN)


def _builtin_text(name: str) -> tuple[str, str]:
    resource = resources.files("evals").joinpath("suites").joinpath(f"{name}.json")
    return resource.read_text(encoding="utf-8"), f"evals/suites/{name}.json"


def _parse_suite(text: str, where: str) -> list[FunctionProblem]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SuiteFormatError(f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
                               path=where) from None
    if not isinstance(data, dict):
        raise SuiteFormatError(f"expected a JSON object with {sorted(_TOP_KEYS)}, got {type(data).__name__}",
                               path=where)
    for key in sorted(set(data) - _TOP_KEYS):
        raise SuiteFormatError(f"unknown field; allowed: {', '.join(sorted(_TOP_KEYS))}", path=where, field=key)
    for key in ("suite", "problems"):
        if key not in data:
            raise SuiteFormatError("missing required field", path=where, field=key)
    version = data.get("schema_version", SCHEMA_VERSION)
    if version != SCHEMA_VERSION:
        raise SuiteFormatError(f"unsupported schema version {version!r}; this version reads {SCHEMA_VERSION}",
                               path=where, field="schema_version")
    suite = data["suite"]
    if not isinstance(suite, str) or not suite.strip():
        raise SuiteFormatError("expected a non-empty string", path=where, field="suite")
    if not isinstance(data["problems"], list):
        raise SuiteFormatError("expected a list of problems", path=where, field="problems")
    problems: list[FunctionProblem] = []
    seen: set[str] = set()
    for index, entry in enumerate(data["problems"]):
        problem = function_problem_from_json(entry, suite=suite, path=where, index=index)
        if problem.id in seen:
            raise SuiteFormatError("duplicate problem id", path=where, problem_id=problem.id, field="id")
        seen.add(problem.id)
        problems.append(problem)
    return problems


def read_suite_file(path: str | Path) -> list[FunctionProblem]:
    """The function problems of one JSON suite file; `SuiteFormatError` names the file, problem and field."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"suite file {str(file)!r} does not exist") from None
    return _parse_suite(text, str(file))


def load_suite(name_or_path: str | Path) -> list[Problem]:
    """Problems of a suite: `"builtin"`, `"smoke"`, a `.json` suite file, or a folder of KernelBench files."""
    text = str(name_or_path)
    path = Path(name_or_path)
    if text in _BUILTIN and not path.exists():
        return list(_parse_suite(*_builtin_text(text)))
    if path.is_dir():
        return list(load_kernelbench_folder(path))
    if path.is_file():
        if path.suffix.lower() != ".json":
            raise ValueError(f"suite file {text!r} is not a .json suite file; pass a folder for KernelBench files")
        return list(read_suite_file(path))
    raise ValueError(f"unknown suite {text!r}: expected one of {', '.join(_BUILTIN)}, a .json suite file, "
                     "or a folder of KernelBench problem files")


# ---------------------------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------------------------
def suite_to_json(problems: Sequence[FunctionProblem], *, suite: str, description: str = "") -> dict[str, Any]:
    """The suite-file form of `problems`."""
    for problem in problems:
        if not isinstance(problem, FunctionProblem):
            raise TypeError(f"only function problems go in suite files; {problem.id!r} is a {problem.kind} problem")
    return {
        "schema_version": SCHEMA_VERSION,
        "suite": suite,
        "description": description,
        "problems": [p.to_json() for p in problems],
    }


def _compact_dumps(value: Any, indent: int = 0, width: int = 118) -> str:
    """JSON with nested containers kept on one line when they fit in `width` columns."""
    flat = json.dumps(value, ensure_ascii=False)
    if not isinstance(value, (dict, list)) or len(flat) + indent <= width or not value:
        return flat
    pad, inner = " " * indent, " " * (indent + 2)
    if isinstance(value, list):
        items = [inner + _compact_dumps(v, indent + 2, width) for v in value]
        return "[\n" + ",\n".join(items) + "\n" + pad + "]"
    items = [f"{inner}{json.dumps(k)}: {_compact_dumps(v, indent + 2, width)}" for k, v in value.items()]
    return "{\n" + ",\n".join(items) + "\n" + pad + "}"


def write_suite_file(problems: Sequence[FunctionProblem], path: str | Path, *, suite: str,
                     description: str = "") -> Path:
    """Write `problems` as a suite file (validated by reading it back before it replaces `path`)."""
    text = _compact_dumps(suite_to_json(problems, suite=suite, description=description)) + "\n"
    target = Path(path)
    _parse_suite(text, str(target))  # never write a file this module cannot read back
    return write_text_atomic(target, text)
