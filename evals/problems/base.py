"""The contract every eval problem meets: an id, the suite it belongs to, its kind and where it comes from.

Two kinds exist: `"function"` problems (one `torch.nn.functional` function and the real calls a model makes to it,
see `evals.problems.function`) and `"module"` problems (a KernelBench-format `Model` file, see
`evals.problems.kernelbench`). Runners dispatch on `Problem.kind`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from forge.errors import KernelForgeError

__all__ = ["Problem", "ProblemKind", "Provenance", "SuiteFormatError", "Tolerance"]

ProblemKind = Literal["function", "module"]


class SuiteFormatError(KernelForgeError, ValueError):
    """A suite file or problem folder that does not follow its schema; names the file, the problem and the field."""

    def __init__(self, message: str, *, path: str | None = None, problem_id: str | None = None,
                 field: str | None = None) -> None:
        self.path, self.problem_id, self.field, self.reason = path, problem_id, field, message
        parts = [str(path)] if path else []
        if problem_id is not None:
            parts.append(f"problem {problem_id!r}")
        if field:
            parts.append(f"field {field!r}")
        super().__init__(": ".join([*parts, message]))


@dataclass(frozen=True)
class Provenance:
    """Where a problem's shapes come from: the model, the layer in it, and a note naming the source.

    Example: `Provenance("Llama-3-8B", "model.layers.*.mlp.act_fn (SiLU)", "Llama-3-8B config: hidden 4096, ...")`.
    """

    model: str
    layer: str
    source: str

    def to_json(self) -> dict[str, str]:
        return {"model": self.model, "layer": self.layer, "source": self.source}


@dataclass(frozen=True)
class Tolerance:
    """An absolute/relative tolerance that overrides the checker's default for one problem."""

    atol: float
    rtol: float

    def __post_init__(self) -> None:
        for name in ("atol", "rtol"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"tolerance {name} must be a number >= 0, got {value!r}")
            object.__setattr__(self, name, float(value))

    def to_json(self) -> dict[str, float]:
        return {"atol": self.atol, "rtol": self.rtol}

    def as_tuple(self) -> tuple[float, float]:
        """`(atol, rtol)`, the form `forge.checking` tolerances take."""
        return (self.atol, self.rtol)


class Problem(ABC):
    """One benchmark problem. Concrete problems are frozen dataclasses with at least these attributes."""

    kind: ClassVar[ProblemKind]
    id: str
    suite: str
    provenance: Provenance
    description: str
    tolerance: Tolerance | None

    @abstractmethod
    def to_json(self) -> dict[str, Any]:
        """A JSON-safe description of the problem (for records, prompts and suite files)."""

    def label(self) -> str:
        """Short human-readable name, e.g. `builtin:llama3_8b.prefill.rms_norm`."""
        return f"{self.suite}:{self.id}"
