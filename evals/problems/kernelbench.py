"""Module problems in the KernelBench file format, and the loader for a folder of them.

A KernelBench problem file defines `class Model(nn.Module)`, `get_inputs()` (forward arguments) and
`get_init_inputs()` (constructor arguments); a candidate solution defines `ModelNew` with the same constructor.
`ModuleProblem` keeps the file's source text and builds the reference model and its inputs under a seed, each time
in a fresh module. Unlike the upstream harness, integer and bool inputs keep their dtype (a `dtype` cast applies to
floating tensors only), and `make_inputs(fresh=True)` re-draws inputs from a normal distribution so negative
branches get checked too (upstream inputs are `torch.rand`, i.e. all in [0, 1)).
"""

from __future__ import annotations

import ast
import dataclasses
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from forge.samples import TensorSpec, map_values

from .base import Problem, ProblemKind, Provenance, SuiteFormatError, Tolerance
from .source_module import load_source_module

__all__ = ["ModuleProblem", "load_kernelbench_folder", "module_problem_from_source"]

_REQUIRED_NAMES = ("Model", "get_inputs", "get_init_inputs")
_LEVEL_DIR = re.compile(r"^level[_-]?(\d+)$", re.IGNORECASE)
_NUMBERED_FILE = re.compile(r"^(\d+)_(.+)$")


@contextmanager
def _seeded(seed: int, device: Any = None) -> Iterator[None]:
    """Seed torch's RNGs for the block and restore the CPU generator's state, and the current CUDA device's when CUDA
    is in use (`torch.manual_seed` seeds every device; a model built under a seed must not leave the caller's CUDA
    stream of random numbers changed)."""
    target = torch.device(device) if device is not None else None
    if target is not None and target.type == "cuda":
        cuda = [target.index if target.index is not None else torch.cuda.current_device()]
    elif torch.cuda.is_available() and torch.cuda.is_initialized():
        cuda = [torch.cuda.current_device()]
    else:
        cuda = []
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed(int(seed))
        yield


@contextmanager
def _allocating_on(device: Any) -> Iterator[None]:
    """New tensors default to `device` inside the block, so a file's `torch.rand(...)` draws on the GPU directly:
    at KernelBench's shipped sizes CPU draws then copies took 3-10 s of a problem's 15-30 s of harness time on an
    H200 (BENCHMARKS H2). Values then differ from a CPU draw but are as deterministic for a seed and device."""
    if device is None or torch.device(device).type == "cpu":
        yield
        return
    with torch.device(torch.device(device)):
        yield


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

    # -- building ---------------------------------------------------------------------------------------
    def load(self) -> Any:
        """Execute the problem file in a fresh module and return that module."""
        return load_source_module(self.source, name=self.id)

    def instantiate(self, device: str | torch.device = "cpu", seed: int = 42, *,
                    dtype: torch.dtype | None = None) -> tuple[torch.nn.Module, list[Any]]:
        """`(model, inputs)`: `Model(*get_init_inputs())` built right after `torch.manual_seed(seed)` and moved to
        `device` (floating parameters cast to `dtype` when given), and `make_inputs(seed)` on the same device.

        The model is left in the mode its constructor sets (training mode, as upstream KernelBench does).
        """
        module = self.load()
        model = self._build(module, "Model", device, seed, dtype)
        return model, self._inputs(module, seed, fresh=False, device=device, dtype=dtype)

    def instantiate_candidate(self, candidate_source: str, device: str | torch.device = "cpu", seed: int = 42, *,
                              dtype: torch.dtype | None = None, class_name: str = "ModelNew") -> torch.nn.Module:
        """Build the candidate's `ModelNew(*get_init_inputs())` under the same seed as `instantiate` does, so a
        candidate that creates the same layers in the same order gets the same weights.

        The candidate runs in its own fresh module (it cannot see `Model`); constructor arguments come from the
        problem file.
        """
        init_inputs = self._init_inputs(self.load(), seed)
        candidate = load_source_module(candidate_source, name=f"{self.id}_candidate")
        cls = getattr(candidate, class_name, None)
        if not isinstance(cls, type):
            raise ValueError(f"candidate source for {self.id!r} defines no class {class_name!r}")
        return self._construct(cls, init_inputs, device, seed, dtype)

    def make_inputs(self, seed: int = 42, fresh: bool = False, *, device: str | torch.device | None = None,
                    dtype: torch.dtype | None = None) -> list[Any]:
        """Forward arguments: the file's `get_inputs()` under `torch.manual_seed(seed)`.

        With `fresh=True` every tensor is then re-drawn with the same shape, dtype and strides: floating tensors
        from a standard normal, integer and bool tensors uniformly within the [min, max] the original showed (so
        indices and class targets stay valid). Non-tensor items pass through. Tensors are moved to `device` when
        given; `dtype` casts floating tensors only.
        """
        return self._inputs(self.load(), seed, fresh=fresh, device=device, dtype=dtype)

    # -- internals ------------------------------------------------------------------------------------------
    def _init_inputs(self, module: Any, seed: int) -> list[Any]:
        with _seeded(seed):
            return list(module.get_init_inputs())

    def _build(self, module: Any, class_name: str, device: Any, seed: int,
               dtype: torch.dtype | None) -> torch.nn.Module:
        return self._construct(getattr(module, class_name), self._init_inputs(module, seed), device, seed, dtype)

    @staticmethod
    def _construct(cls: type, init_inputs: list[Any], device: Any, seed: int,
                   dtype: torch.dtype | None) -> torch.nn.Module:
        with _seeded(seed):
            model = cls(*init_inputs)
        model = model.to(device=torch.device(device))
        if dtype is not None:
            model = model.to(dtype=dtype)  # nn.Module.to(dtype) casts floating parameters and buffers only
        return model

    def _inputs(self, module: Any, seed: int, *, fresh: bool, device: Any, dtype: torch.dtype | None) -> list[Any]:
        with _seeded(seed, device), _allocating_on(device):
            inputs = list(module.get_inputs())
        if fresh:
            generator = torch.Generator().manual_seed(int(seed))
            inputs = [map_values(v, lambda t: _redraw(t, generator)) for v in inputs]

        def place(value: Any) -> Any:
            if not isinstance(value, torch.Tensor):
                return value
            if device is not None:
                value = value.to(device=torch.device(device))
            if dtype is not None and value.is_floating_point():
                value = value.to(dtype=dtype)
            return value

        return [map_values(v, place) for v in inputs]

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


def _redraw(value: Any, generator: torch.Generator) -> Any:
    if not isinstance(value, torch.Tensor) or value.layout != torch.strided:
        return value
    spec = TensorSpec.of(value)
    if value.is_floating_point():
        spec = dataclasses.replace(spec, mean=None, std=None)  # TensorSpec draws N(0, 1) without moments
    return spec.draw(generator, device=value.device)


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
