"""The CUDA candidate file format, read statically: the `CUDA_SRC` string and the `extern "C"` kernels it declares.

A CUDA candidate is a Python file (```python fence) holding the device code as one module-level string literal
`CUDA_SRC = r'''...'''`, a handle `kernels = load_cuda(CUDA_SRC)` from `agent.languages.cuda.runtime`, and a
`kernel_function(...)` that allocates outputs with torch and launches `kernels.<name>[grid, block](args...)`.
Why this shape and not a `.cu` file with a C++ launcher: NVRTC compiles device code only (no host C++, no ATen
headers), and a torch-extension build of a C++ launcher is a 35 s cold `load_inline` build (measured); a
Python launcher keeps host logic (shape dispatch, grids, allocation) screenable by the same Python policy as
Triton's, and lets the harness own every compile option (arch, flags, cache) because the string is a literal it
can extract without running the file (so candidates can be compiled in a pool before their child starts).

This module has no torch or CUDA dependency: `extract_cuda_source` (AST), `code_only` (comments and string
contents blanked, offsets kept), and `parse_kernels` (the launchable kernels and their parameter kinds, which the
launcher needs to pack arguments: a C `int` and a `long long` differ in size and a wrong guess corrupts the launch).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from forge.text import parse_python

__all__ = [
    "CUDA_SOURCE_NAME",
    "HANDLE_FACTORY",
    "KernelParam",
    "KernelSignature",
    "ParamKind",
    "SCALAR_KINDS",
    "code_only",
    "extract_cuda_source",
    "line_of",
    "parse_kernels",
]

CUDA_SOURCE_NAME = "CUDA_SRC"
HANDLE_FACTORY = "load_cuda"

# Parameter kind -> the C spellings accepted for it (after `const`/`volatile`/`__restrict__` are dropped).
SCALAR_KINDS: dict[str, frozenset[str]] = {
    "i32": frozenset({"int", "signed", "signed int", "int32_t"}),
    "u32": frozenset({"unsigned", "unsigned int", "uint32_t"}),
    "i64": frozenset({"long", "long int", "long long", "long long int", "int64_t", "ptrdiff_t", "signed long long"}),
    "u64": frozenset({"unsigned long", "unsigned long long", "unsigned long long int", "uint64_t", "size_t"}),
    "f32": frozenset({"float"}),
    "f64": frozenset({"double"}),
    "bool": frozenset({"bool"}),
}
ParamKind = str  # "ptr" or a key of SCALAR_KINDS

_QUALIFIERS = {"const", "volatile", "__restrict__", "__restrict", "restrict", "__grid_constant__"}
_IDENT = re.compile(r"[A-Za-z_]\w*")
_NAME_BEFORE_PAREN = re.compile(r"[\s\w:<>,*&]*?\b([A-Za-z_]\w*)\s*\(")
_KERNEL_ATTRIBUTES = frozenset({"__launch_bounds__", "__maxnreg__", "__cluster_dims__"})


@dataclass(frozen=True)
class KernelParam:
    """One kernel parameter: its name, kind (`"ptr"` for any pointer, else a scalar kind) and C type as written."""

    name: str
    kind: ParamKind
    c_type: str


@dataclass(frozen=True)
class KernelSignature:
    """A `__global__` function: name, 1-based line in CUDA_SRC, whether it has C linkage, and its parameters
    (`params` is None when a parameter type is not one the launcher can pass; `problem` says which)."""

    name: str
    line: int
    extern_c: bool
    params: tuple[KernelParam, ...] | None
    problem: str | None = None
    templated: bool = False


def code_only(text: str, *, keep_strings: bool = False) -> str:
    """`text` with comments (and, unless `keep_strings`, string/char literal contents) replaced by spaces; newlines
    and every offset are kept, so positions and line numbers still refer to the original."""
    out = list(text)
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out[i:j] = " " * (j - i)
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out[i:j] = [ch if ch == "\n" else " " for ch in text[i:j]]
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            if not keep_strings:
                out[i + 1:j] = [ch if ch == "\n" else " " for ch in text[i + 1:j]]
            i = j + 1
        else:
            i += 1
    return "".join(out)


def line_of(text: str, offset: int) -> int:
    """1-based line number of `offset` in `text`."""
    return text.count("\n", 0, offset) + 1


def extract_cuda_source(python_source: str) -> tuple[str, int] | None:
    """`(CUDA_SRC value, line of the assignment)` when the file assigns one plain string literal to a module-level
    `CUDA_SRC` exactly once; None otherwise (no such name, an f-string, concatenation, or several assignments)."""
    try:
        tree = parse_python(python_source)
    except SyntaxError:
        return None
    found: list[tuple[str, int]] = []
    for stmt in tree.body:
        targets: list[ast.expr] = []
        value: ast.expr | None = None
        if isinstance(stmt, ast.Assign):
            targets, value = stmt.targets, stmt.value
        elif isinstance(stmt, ast.AnnAssign):
            targets, value = [stmt.target], stmt.value
        if any(isinstance(t, ast.Name) and t.id == CUDA_SOURCE_NAME for t in targets):
            if len(targets) != 1 or not (isinstance(value, ast.Constant) and isinstance(value.value, str)):
                return None
            found.append((value.value, stmt.lineno))
    return found[0] if len(found) == 1 else None


def _balanced(code: str, start: int, open_: str = "(", close: str = ")") -> int:
    """Offset just past the bracket that closes the one at `start` (or len(code) when it never closes)."""
    depth = 0
    for j in range(start, len(code)):
        if code[j] == open_:
            depth += 1
        elif code[j] == close:
            depth -= 1
            if depth == 0:
                return j + 1
    return len(code)


def extern_c_blocks(code: str, raw: str) -> list[tuple[int, int]]:
    """Offset ranges of `extern "C" { ... }` blocks (`code` = comments blanked, strings kept in `raw` positions)."""
    ranges = []
    for match in re.finditer(r'\bextern\s*"C"\s*\{', raw):
        brace = match.end() - 1
        ranges.append((brace, _balanced(code, brace, "{", "}")))
    return ranges


def _split_params(text: str) -> list[str]:
    parts, depth, current = [], 0, []
    for ch in text:
        if ch in "(<[":
            depth += 1
        elif ch in ")>]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    if "".join(current).strip():
        parts.append("".join(current))
    return [p.strip() for p in parts]


def _param(text: str) -> KernelParam | str:
    """A parsed parameter, or why it cannot be passed."""
    text = text.split("=")[0].strip()
    if text in ("", "void"):
        return "empty parameter"
    is_array = text.endswith("]")
    text = re.sub(r"\[[^\]]*\]\s*$", "", text).strip()
    names = _IDENT.findall(text)
    if not names:
        return f"cannot read parameter `{text}`"
    name = names[-1]
    type_text = text[: text.rfind(name)].strip()
    if "&" in type_text:
        return f"`{text}` is a reference; pass tensors as pointers and scalars by value"
    if "*" in type_text or is_array:
        return KernelParam(name, "ptr", " ".join(type_text.split()) + ("*" if is_array else ""))
    words = " ".join(w for w in _IDENT.findall(type_text) if w not in _QUALIFIERS)
    for kind, spellings in SCALAR_KINDS.items():
        if words in spellings:
            return KernelParam(name, kind, words)
    return (f"parameter `{text}` has type `{words or type_text}`, which the launcher cannot pass; use pointers for "
            "tensors and int, unsigned, int64_t, uint64_t, float, double or bool for scalars")


def parse_kernels(cuda_source: str) -> list[KernelSignature]:
    """Every `__global__` function defined in `cuda_source`, in order."""
    code = code_only(cuda_source)
    raw = code_only(cuda_source, keep_strings=True)
    blocks = extern_c_blocks(code, raw)
    kernels: list[KernelSignature] = []
    for match in re.finditer(r"\b__global__\b", code):
        pos = match.end()
        name_match = None
        while True:
            m = _NAME_BEFORE_PAREN.match(code, pos)
            if m is not None and m.group(1) in _KERNEL_ATTRIBUTES:
                pos = _balanced(code, m.end() - 1)
                continue
            name_match = m
            break
        if name_match is None:
            continue
        name = name_match.group(1)
        open_paren = name_match.end() - 1
        close = _balanced(code, open_paren)
        after = code[close:close + 200].lstrip()
        if not after.startswith("{"):
            continue  # a declaration; the definition is listed where it appears
        start = max(code.rfind(";", 0, match.start()), code.rfind("}", 0, match.start()),
                    code.rfind("{", 0, match.start()))
        prefix = raw[start + 1:match.start()]
        extern_c = bool(re.search(r'\bextern\s*"C"', prefix)) or any(a < match.start() < b for a, b in blocks)
        templated = bool(re.search(r"\btemplate\s*<", code[start + 1:match.start()]))
        params: list[KernelParam] = []
        problem = None
        for text in _split_params(code[open_paren + 1:close - 1]):
            parsed = _param(text)
            if isinstance(parsed, str):
                if parsed == "empty parameter":
                    continue
                problem = parsed
                break
            params.append(parsed)
        kernels.append(KernelSignature(name, line_of(cuda_source, match.start()), extern_c,
                                       None if problem else tuple(params), problem, templated))
    return kernels
