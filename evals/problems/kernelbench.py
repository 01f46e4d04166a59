"""Module problems in the KernelBench file format, and the loader for a folder of them.

A KernelBench problem file defines `class Model(nn.Module)`, `get_inputs()` (forward arguments) and
`get_init_inputs()` (constructor arguments); a candidate solution defines `ModelNew` with the same constructor.
`ModuleProblem` keeps the file's source text and its provenance; building the models and their inputs under a seed
is the judge's (`forge.judging.modules.ModuleSource`), so the eval, the judge and its sandbox child build alike.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from forge.judging.modules import ModuleSource
from forge.source_files import load_source_text

from .base import Problem, ProblemKind, Provenance, SuiteFormatError, Tolerance

__all__ = ["ModuleProblem", "load_kernelbench_folder", "module_problem_from_source"]

_REQUIRED_NAMES = ("Model", "get_inputs", "get_init_inputs")
_LEVEL_DIR = re.compile(r"^level[_-]?(\d+)$", re.IGNORECASE)
_NUMBERED_FILE = re.compile(r"^(\d+)_(.+)$")


@dataclass(frozen=True)
class ModuleProblem(Problem):
    """Make the `Model` defined in `source` faster; a candidate defines `ModelNew` with the same constructor.

    `level` and `number` come from the KernelBench layout (`level1/19_ReLU.py` -> level 1, number 19,
    name "ReLU"); both are None for files outside that layout.
    """

    kind: ClassVar[ProblemKind] = "module"

    id: str
    suite: str
    source: str
    provenance: Provenance
    description: str = ""
    path: str | None = None
    level: int | None = None
    number: int | None = None
    name: str = ""
    tolerance: Tolerance | None = None

    # -- building (the KernelBench format: `forge.judging.modules.ModuleSource`) -------------------------
    @property
    def module_source(self) -> ModuleSource:
        """The problem file as the judge builds it."""
        return ModuleSource(self.source, name=self.id)

    def load(self) -> Any:
        """Execute the problem file in a fresh module and return that module."""
        return self.module_source.load()

    def instantiate(self, device: str | torch.device = "cpu", seed: int = 42, *,
                    dtype: torch.dtype | None = None) -> tuple[torch.nn.Module, list[Any]]:
        """`(model, inputs)` under `seed` (`ModuleSource.instantiate`)."""
        return self.module_source.instantiate(device, seed, dtype=dtype)

    def instantiate_candidate(self, candidate_source: str, device: str | torch.device = "cpu", seed: int = 42, *,
                              dtype: torch.dtype | None = None, class_name: str = "ModelNew") -> torch.nn.Module:
        """The candidate's `ModelNew(*get_init_inputs())` built under the same seed as `instantiate` builds `Model`,
        in its own fresh module (it cannot see `Model`). Runs the candidate's code in this process: the judge does
        this in its sandbox child."""
        candidate = load_source_text(candidate_source, name=f"{self.id}_candidate")
        cls = getattr(candidate, class_name, None)
        if not isinstance(cls, type):
            raise ValueError(f"candidate source for {self.id!r} defines no class {class_name!r}")
        return self.module_source.build(cls, device, seed, dtype=dtype)

    def make_inputs(self, seed: int = 42, fresh: bool = False, *, device: str | torch.device | None = None,
                    dtype: torch.dtype | None = None) -> list[Any]:
        """Forward arguments under `seed` (`ModuleSource.make_inputs`)."""
        return self.module_source.make_inputs(seed, fresh, device=device, dtype=dtype)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "id": self.id,
            "kind": self.kind,
            "suite": self.suite,
            "description": self.description,
            "provenance": self.provenance.to_json(),
            "path": self.path,
            "level": self.level,
            "number": self.number,
            "name": self.name,
        }
        if self.tolerance is not None:
            data["tolerance"] = self.tolerance.to_json()
        return data


# ---------------------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------------------
def _class_docstring(tree: ast.Module, name: str) -> str:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            doc = ast.get_docstring(node) or ""
            return " ".join(doc.split())
    return ""


def _defined_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def module_problem_from_source(source: str, *, problem_id: str, suite: str, path: str | None = None,
                               level: int | None = None, number: int | None = None,
                               name: str = "") -> ModuleProblem:
    """A `ModuleProblem` from KernelBench-format source text; a `SuiteFormatError` if the file cannot be one."""
    where = path or problem_id
    try:
        tree = ast.parse(source, filename=where)
    except SyntaxError as exc:
        raise SuiteFormatError(f"not valid Python: {exc.msg} (line {exc.lineno})", path=where,
                               problem_id=problem_id, field="source") from None
    defined = _defined_names(tree)
    for required in _REQUIRED_NAMES:
        if required not in defined:
            raise SuiteFormatError(
                f"a KernelBench problem file must define {', '.join(_REQUIRED_NAMES)}; {required!r} is missing",
                path=where, problem_id=problem_id, field=required)
    label = f"KernelBench level {level}" if level is not None else "KernelBench-format module"
    layer = name or problem_id
    source_note = f"KernelBench problem file {path}" if path else "KernelBench-format source text"
    return ModuleProblem(
        id=problem_id,
        suite=suite,
        source=source,
        provenance=Provenance(model=label, layer=layer, source=source_note),
        description=_class_docstring(tree, "Model"),
        path=path,
        level=level,
        number=number,
        name=name,
    )


def _load_level_dir(folder: Path, level: int | None, suite: str | None) -> list[ModuleProblem]:
    suite_name = suite or (f"kernelbench-level{level}" if level is not None else folder.name)
    problems = []
    files = [p for p in folder.glob("*.py") if not p.name.startswith(("_", "."))]

    def order(p: Path) -> tuple[int, int, str]:
        match = _NUMBERED_FILE.match(p.stem)
        return (0, int(match.group(1)), p.stem) if match else (1, 0, p.stem)

    for file in sorted(files, key=order):
        match = _NUMBERED_FILE.match(file.stem)
        number, name = (int(match.group(1)), match.group(2)) if match else (None, file.stem)
        problem_id = f"level{level}/{file.stem}" if level is not None else file.stem
        problems.append(module_problem_from_source(
            _read_problem_file(file, problem_id), problem_id=problem_id, suite=suite_name, path=str(file),
            level=level, number=number, name=name))
    return problems


def _read_problem_file(file: Path, problem_id: str) -> str:
    """The text of a problem file; a `SuiteFormatError` naming the file when it is unreadable or not UTF-8."""
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise SuiteFormatError(f"cannot read the file: {exc.strerror or exc}", path=str(file),
                               problem_id=problem_id) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise SuiteFormatError(
            f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}, line {line}); KernelBench files "
            "are Python source in UTF-8: re-save it as UTF-8 (e.g. `iconv -f latin1 -t utf-8`)",
            path=str(file), problem_id=problem_id) from None


def load_kernelbench_folder(path: str | Path, level: int | None = None, *,
                            suite: str | None = None) -> list[ModuleProblem]:
    """Load every KernelBench problem file in `path`.

    `path` is either one level folder (`.../KernelBench/level1`, files named `<number>_<Name>.py`; the level is
    parsed from the folder name, or taken from `level` for a folder named otherwise), or a folder holding
    `level<N>` sub-folders (all are loaded, or only `level` when given). Ids are `level<N>/<file stem>`
    (e.g. `level1/19_ReLU`), or the file stem when the level is unknown. The suite name defaults to
    `kernelbench-level<N>` (the folder name when the level is unknown).
    """
    folder = Path(path)
    if not folder.is_dir():
        raise NotADirectoryError(f"KernelBench folder {str(folder)!r} does not exist or is not a directory")
    level_dirs = sorted(
        ((int(m.group(1)), d) for d in folder.iterdir() if d.is_dir() and (m := _LEVEL_DIR.match(d.name))),
    )
    if level_dirs:
        chosen = [(n, d) for n, d in level_dirs if level is None or n == level]
        if not chosen:
            found = ", ".join(d.name for _, d in level_dirs)
            raise SuiteFormatError(f"no level{level} folder here (found: {found})", path=str(folder))
        problems = [p for n, d in chosen for p in _load_level_dir(d, n, suite)]
    else:
        match = _LEVEL_DIR.match(folder.name)
        folder_level = int(match.group(1)) if match else None
        if folder_level is not None and level is not None and folder_level != level:
            raise SuiteFormatError(f"folder is level {folder_level} but level={level} was asked for",
                                   path=str(folder))
        problems = _load_level_dir(folder, folder_level if folder_level is not None else level, suite)
    if not problems:
        raise SuiteFormatError("no KernelBench problem files (*.py defining Model, get_inputs, get_init_inputs) "
                               "found", path=str(folder))
    return problems
