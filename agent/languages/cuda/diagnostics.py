"""Compiler output -> a short list of (file, line, message): what the model sees after a failed CUDA build.

nvcc and NVRTC share the EDG front end, whose errors read `FILE(LINE): error: MESSAGE`, followed by the source line,
a caret line and, for templates, `detected during instantiation of "..." at line N` chains (one cub/cooperative
groups misuse gives dozens of those lines). ptxas adds `ptxas error   : ...` lines (register/shared-memory limits)
with no source position. Kept: errors (warnings only when there is no error), deduplicated, at most
`MAX_DIAGNOSTICS`, each message cut to `MAX_MESSAGE` characters, plus the first instantiation line of a template
error (it names the types). Dropped: source echoes, carets, the remaining instantiation chain, and summary lines
("2 errors detected in the compilation of ...").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from forge.errors import KernelForgeError
from forge.text import clip

__all__ = ["CompileDiagnostic", "CudaCompileError", "MAX_DIAGNOSTICS", "format_diagnostics", "parse_compiler_output"]

MAX_DIAGNOSTICS = 8
MAX_MESSAGE = 300

_EDG = re.compile(r"^(?P<file>[^\s()][^()]*?)\((?P<line>\d+)\)\s*:\s*(?P<sev>catastrophic error|error|warning|remark)"
                  r"(?:\s*#[\w-]+-[A-Z]|\s*#\d+-D)?\s*:?\s*(?P<msg>.*)$")
_GCC = re.compile(r"^(?P<file>[^\s:][^:]*):(?P<line>\d+):(?:\d+:)?\s*(?P<sev>fatal error|error|warning):"
                  r"\s*(?P<msg>.*)$")
_PTXAS = re.compile(r"^ptxas\s+(?P<sev>fatal|error|warning)\s*:\s*(?P<msg>.*)$")
_NVRTC = re.compile(r"^nvrtc:\s*(?P<sev>error|warning)\s*:?\s*(?P<msg>.*)$")
_INSTANTIATION = re.compile(r"^\s*detected during")


@dataclass(frozen=True)
class CompileDiagnostic:
    """One compiler message: `file` as the compiler named it (`CUDA_SRC` for the candidate's device code), `line`
    1-based (0 when the compiler gave none, e.g. ptxas), `severity` `"error"` or `"warning"`."""

    file: str
    line: int
    severity: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file} line {self.line}" if self.line else self.file
        return f"{where}: {self.severity}: {self.message}"


class CudaCompileError(KernelForgeError, RuntimeError):
    """A CUDA build failed. `diagnostics` is the short list; `log` the full compiler output (for logs, not prompts)."""

    def __init__(self, diagnostics: list[CompileDiagnostic], log: str, backend: str) -> None:
        self.diagnostics = list(diagnostics)
        self.log = log
        self.backend = backend
        first = str(self.diagnostics[0]) if self.diagnostics else (log.strip().splitlines() or ["no output"])[-1]
        more = f" (+{len(self.diagnostics) - 1} more)" if len(self.diagnostics) > 1 else ""
        super().__init__(f"CUDA compile error ({backend}): {first}{more}")


def _file_name(path: str) -> str:
    """The candidate's own file keeps its name; temporary build paths are cut to the base name."""
    return path.rsplit("/", 1)[-1]


def parse_compiler_output(log: str) -> list[CompileDiagnostic]:
    """The short list of diagnostics in an nvcc / NVRTC / ptxas / host-compiler log (see the module docstring)."""
    found: list[CompileDiagnostic] = []
    last_error: int | None = None
    instantiation_added: set[int] = set()
    for raw in log.splitlines():
        line = raw.rstrip()
        match = _EDG.match(line) or _GCC.match(line)
        if match:
            sev = "warning" if match.group("sev") in ("warning", "remark") else "error"
            found.append(CompileDiagnostic(_file_name(match.group("file")), int(match.group("line")), sev,
                                           clip(match.group("msg"), MAX_MESSAGE)))
            last_error = len(found) - 1 if sev == "error" else None
            continue
        match = _PTXAS.match(line) or _NVRTC.match(line)
        if match:
            sev = "warning" if match.group("sev") == "warning" else "error"
            found.append(CompileDiagnostic("ptxas" if line.startswith("ptxas") else "nvrtc", 0, sev,
                                           clip(match.group("msg"), MAX_MESSAGE)))
            last_error = None
            continue
        if _INSTANTIATION.match(line) and last_error is not None and last_error not in instantiation_added:
            instantiation_added.add(last_error)
            d = found[last_error]
            found[last_error] = CompileDiagnostic(d.file, d.line, d.severity,
                                                  clip(f"{d.message} ({line.strip()})", MAX_MESSAGE))
    errors = [d for d in found if d.severity == "error"]
    chosen = errors or found
    unique: list[CompileDiagnostic] = []
    for d in chosen:
        if d not in unique:
            unique.append(d)
    return unique[:MAX_DIAGNOSTICS]


def format_diagnostics(diagnostics: list[CompileDiagnostic], cuda_source: str | None = None) -> str:
    """One diagnostic a line, each followed by the offending CUDA_SRC line when `cuda_source` is given."""
    lines = cuda_source.splitlines() if cuda_source is not None else []
    out: list[str] = []
    for d in diagnostics:
        out.append(str(d))
        if d.file == "CUDA_SRC" and 0 < d.line <= len(lines):
            out.append(f"    {lines[d.line - 1].strip()}")
    return "\n".join(out)
