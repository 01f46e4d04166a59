"""`Violation`: one reason a candidate kernel source is refused before it runs."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any, Literal

__all__ = ["Violation", "ViolationKind", "format_violations", "has_syntax_error"]

ViolationKind = Literal["forbidden", "syntax", "structure"]


@dataclass(frozen=True)
class Violation:
    """A construct that screening refuses, where it is, and why.

    `construct` names what was found (a resolved name such as `torch.nn.functional.softmax`, `import subprocess`,
    `x.relu`, `@`); `line` is 1-based (0 when the problem concerns the whole file, e.g. a missing entry point);
    `kind` is `"syntax"` for a source that does not parse, `"structure"` for a missing entry point or kernel, and
    `"forbidden"` for a banned construct.
    """

    construct: str
    line: int
    message: str
    kind: ViolationKind = "forbidden"

    def __str__(self) -> str:
        where = f"line {self.line}" if self.line > 0 else "file"
        return f"{where}: {self.message}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def format_violations(violations: Iterable[Violation]) -> str:
    """One violation a line, e.g. for an LLM feedback prompt."""
    return "\n".join(str(v) for v in violations)


def has_syntax_error(violations: Iterable[Violation]) -> bool:
    """Whether the source did not parse (such a candidate is a compile error, not a forbidden one)."""
    return any(v.kind == "syntax" for v in violations)
