"""Screening of a CUDA candidate: the Python launcher by the common Python policy, `CUDA_SRC` by the rules below.

The device source is scanned with comments and string contents blanked (`source.code_only`), so a banned word in a
comment is not flagged and one hidden in a string cannot be compiled anyway. What it refuses, and why:

* `#include` outside `ALLOWED_INCLUDES` (fp16/bf16/fp8 types, cooperative groups, mma, pipelines, libcu++
  `cuda/std/...`, cub block/warp/thread primitives) and every `#include "..."`: no ATen/torch headers (no ATen
  compute from C++), no cuBLAS/cuDNN/CUTLASS, no host headers. `#line` (it would falsify compiler positions) and
  `##` token pasting (it builds identifiers the screen cannot see) are refused too.
* `at::`, `torch::`, `c10::`, `cublas*`, `cudnn*`: ATen and library calls.
* `asm` / `__asm__` (inline PTX): not screened at all (it can read `%globaltimer`, issue any memory operation),
  and intrinsics cover what kernels need (`__ldg`, `__shfl_*_sync`, `cp.async` through `cuda_pipeline.h`).
* `cuda*` runtime API names and `cu*(` driver calls (`cudaMalloc`, `cudaStreamCreate`, `cudaDeviceSynchronize`,
  device-side `cudaLaunchDevice`...) and `<<<`: device code launches nothing, allocates nothing, syncs with no
  host, uses no stream; the harness launches on torch's current stream.
* `printf`, `malloc`, `free`, `new`, `delete`: device printf floods and serialises; device-heap allocation.
* `clock`, `clock64`, `__globaltimer`, `__nanosleep`: timing-dependent kernels.
* writable namespace-scope `__device__` variables and `__managed__`: state kept between calls (cached outputs);
  `__constant__` tables and `const` device variables are fine.
* structure: at least one `extern "C" __global__` kernel; every `__global__` kernel has C linkage, is not a
  template, and has parameters the launcher can pass (pointers and int/float scalars).

The Python side must define `CUDA_SRC` as one string literal, bind `kernels = load_cuda(CUDA_SRC)` once at module
level (imported from `agent.languages.cuda.runtime`), read only the kernels CUDA_SRC declares on that handle, and
launch one of them from `kernel_function` (or a helper it calls).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from agent.languages.cuda.source import (
    CUDA_SOURCE_NAME,
    HANDLE_FACTORY,
    KernelSignature,
    code_only,
    extern_c_blocks,
    extract_cuda_source,
    line_of,
    parse_kernels,
)
from agent.screening.python_ast import PythonRules, analyse_python
from agent.screening.violation import Violation

__all__ = ["ALLOWED_INCLUDES", "CUDA_PYTHON_RULES", "RUNTIME_MODULE", "screen_cuda_file", "screen_cuda_source"]

RUNTIME_MODULE = "agent.languages.cuda.runtime"

ALLOWED_INCLUDES: frozenset[str] = frozenset({
    "cuda_fp16.h", "cuda_bf16.h", "cuda_fp8.h", "cooperative_groups.h", "cooperative_groups/reduce.h",
    "cooperative_groups/memcpy_async.h", "cooperative_groups/scan.h", "mma.h", "cuda_pipeline.h",
    "cuda_pipeline_primitives.h", "cuda/pipeline", "cuda/barrier", "cuda/atomic", "vector_types.h",
    "math_constants.h",
})
_ALLOWED_INCLUDE_PREFIXES = ("cuda/std/", "cub/block/", "cub/warp/", "cub/thread/")

# (pattern on code-only text, construct, reason); first match per position wins.
_BANNED: tuple[tuple[re.Pattern[str], str, str], ...] = tuple(
    (re.compile(p), c, r) for p, c, r in (
        (r"\b(?:at|torch|c10)\s*::", "ATen", "ATen/torch C++ calls are not allowed: compute in your own kernels "
         "(torch is for allocation in the Python launcher only)"),
        (r"\b(?:cublas|cudnn|cutlass|cute|thrust)\w*", "library", "library calls (cuBLAS, cuDNN, CUTLASS, Thrust) "
         "are not allowed: write the kernel yourself"),
        (r"\b(?:asm|__asm__|__asm)\b", "asm", "inline PTX (`asm`) is not allowed: it cannot be screened; use CUDA "
         "intrinsics (__ldg, __shfl_xor_sync, __hfma2, cuda_pipeline.h for cp.async)"),
        (r"<<<", "<<<", "kernels may not launch kernels (`<<<...>>>`): the harness launches your extern \"C\" "
         "kernels from kernel_function"),
        (r"\bcuda[A-Z]\w*", "cuda API", "CUDA runtime API calls (cudaMalloc, cudaStream*, cudaDeviceSynchronize, "
         "cudaMemcpy, ...) are not allowed in device code: no allocation, streams, syncs or launches"),
        (r"\bcu[A-Z]\w*\s*\(", "driver API", "CUDA driver API calls are not allowed"),
        (r"\b(?:printf|vprintf|puts)\b", "printf", "device printf is not allowed (it serialises and floods output)"),
        (r"\b(?:malloc|free|realloc|calloc|new|delete)\b", "heap", "device-heap allocation (malloc/free/new/delete) "
         "is not allowed: allocate buffers with torch in kernel_function and pass them as pointers"),
        (r"\b(?:clock|clock64|__globaltimer|globaltimer|__nanosleep)\b", "timing", "clocks, timers and sleeps are not "
         "allowed in kernels (results must not depend on timing)"),
        (r"\b__managed__\b", "__managed__", "__managed__ (unified memory) variables are not allowed"),
    )
)
_INCLUDE = re.compile(r"^[ \t]*#[ \t]*include[ \t]*(?P<spec><[^>\n]*>|\"[^\"\n]*\"|.*)$", re.MULTILINE)
_DIRECTIVE = re.compile(r"^[ \t]*#[ \t]*(?P<name>\w+)", re.MULTILINE)
_DEVICE_VARIABLE = re.compile(
    r"\b__device__\b(?P<decl>[^;{}()]*?)\b(?P<name>[A-Za-z_]\w*)\s*(?:\[[^\]]*\]\s*)*(?:=|;|\{)")


@dataclass(frozen=True)
class _Found:
    construct: str
    line: int
    message: str
    kind: str = "forbidden"


def _include_problem(spec: str) -> str | None:
    spec = spec.strip()
    if spec.startswith('"'):
        return f"#include {spec}: quoted includes are not allowed (there are no local files); use <...> headers " \
               "from the allow-list"
    if not (spec.startswith("<") and spec.endswith(">")):
        return f"#include {spec}: only literal <header> includes are allowed"
    name = spec[1:-1].strip()
    if name in ALLOWED_INCLUDES or name.startswith(_ALLOWED_INCLUDE_PREFIXES):
        return None
    why = "ATen/torch headers are not allowed (no ATen calls from C++)" if name.startswith(("ATen", "torch", "c10")) \
        else "not on the include allow-list"
    allowed = ", ".join(sorted(ALLOWED_INCLUDES)) + ", cuda/std/*, cub/block|warp|thread/*"
    return f"#include <{name}>: {why} (allowed: {allowed}; int64_t & co. are predefined)"


def _scope_depths(code: str, raw: str) -> list[int]:
    """For each offset, how many braces other than `extern "C" {` / `namespace x {` enclose it."""
    transparent = {start for start, _ in extern_c_blocks(code, raw)}
    transparent |= {m.end() - 1 for m in re.finditer(r"\bnamespace\s*\w*\s*\{", code)}
    depths, stack = [0] * (len(code) + 1), []
    depth = 0
    for i, ch in enumerate(code):
        if ch == "{":
            opaque = i not in transparent
            stack.append(opaque)
            depth += opaque
        elif ch == "}" and stack:
            depth -= stack.pop()
        depths[i] = depth
    return depths


def _device_source_findings(cuda_source: str) -> list[_Found]:
    code = code_only(cuda_source)
    raw = code_only(cuda_source, keep_strings=True)
    found: list[_Found] = []
    for match in _INCLUDE.finditer(raw):
        problem = _include_problem(match.group("spec"))
        if problem:
            found.append(_Found("#include", line_of(code, match.start()), problem))
    for match in _DIRECTIVE.finditer(code):
        if match.group("name") == "line":
            found.append(_Found("#line", line_of(code, match.start()), "#line directives are not allowed (they "
                                "would misplace compiler messages)"))
    for match in re.finditer(r"##", code):
        found.append(_Found("##", line_of(code, match.start()), "token pasting (`##`) is not allowed: it builds "
                            "identifiers the screen cannot see"))
    code_no_includes = _INCLUDE.sub(lambda m: " " * len(m.group(0)), code)
    seen: set[tuple[int, int]] = set()
    for pattern, construct, reason in _BANNED:
        for match in pattern.finditer(code_no_includes):
            line = line_of(code, match.start())
            if (line, match.start()) in seen:
                continue
            seen.add((line, match.start()))
            word = match.group(0).rstrip("( \t")
            found.append(_Found(word if construct not in ("ATen", "<<<") else construct, line, f"`{word}`: {reason}"))
    depths = _scope_depths(code, raw)
    for match in _DEVICE_VARIABLE.finditer(code):
        decl = match.group("decl")
        if depths[match.start()] or re.search(r"\b(?:const|constexpr)\b", decl):
            continue
        found.append(_Found("__device__ variable", line_of(code, match.start()), f"`__device__ ... "
                            f"{match.group('name')}` is a writable global: state kept between calls is not allowed "
                            "(use __constant__ or const for tables, torch-allocated buffers for scratch)"))
    found += _structure_findings(parse_kernels(cuda_source))
    return found


def _structure_findings(kernels: list[KernelSignature]) -> list[_Found]:
    found: list[_Found] = []
    for k in kernels:
        if k.templated:
            found.append(_Found(k.name, k.line, f"__global__ {k.name} is a template: the harness launches "
                                "extern \"C\" kernels by name; keep templates in __device__ helpers", "structure"))
        elif not k.extern_c:
            found.append(_Found(k.name, k.line, f"__global__ {k.name} must be declared extern \"C\" (the harness "
                                "launches kernels by their C name)", "structure"))
        if k.problem:
            found.append(_Found(k.name, k.line, f"kernel {k.name}: {k.problem}", "structure"))
    if not any(k.extern_c and not k.templated and k.params is not None for k in kernels):
        found.append(_Found("__global__", 0, "CUDA_SRC defines no extern \"C\" __global__ kernel: the computation must "
                            "be written as CUDA kernels", "structure"))
    return found


def screen_cuda_source(cuda_source: str, first_line: int = 1) -> list[Violation]:
    """Violations in a device source; lines are shifted so CUDA_SRC line 1 is `first_line` of the file."""
    out = []
    for f in _device_source_findings(cuda_source):
        line = f.line + first_line - 1 if f.line else 0
        where = f" (CUDA_SRC line {f.line})" if f.line and first_line != 1 else ""
        out.append(Violation(f.construct, line, f.message + where, f.kind))  # type: ignore[arg-type]
    return sorted(out, key=lambda v: v.line)


def _runtime_reference(qualname: str) -> str | None:
    if qualname in (f"{RUNTIME_MODULE}.{HANDLE_FACTORY}", RUNTIME_MODULE, "agent.languages.cuda", "agent.languages",
                    "agent"):
        return None
    return f"{qualname} is not available to kernels (only `from {RUNTIME_MODULE} import {HANDLE_FACTORY}`)"


CUDA_PYTHON_RULES = PythonRules(
    extra_import_roots=frozenset({"agent"}),
    reference_rules={"agent": _runtime_reference},
    namespaces=frozenset({"agent.languages", "agent.languages.cuda", RUNTIME_MODULE}),
)


def _handle_bindings(tree: ast.Module) -> tuple[list[str], list[Violation]]:
    """Module-level names bound to `load_cuda(CUDA_SRC)`; violations for any other use of `load_cuda`."""
    handles: list[str] = []
    problems: list[Violation] = []
    top_level_calls: set[int] = set()
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call) and isinstance(stmt.value.func, ast.Name) \
                and stmt.value.func.id == HANDLE_FACTORY:
            top_level_calls.add(id(stmt.value))
            call = stmt.value
            ok_args = (len(call.args) == 1 and not call.keywords and isinstance(call.args[0], ast.Name)
                       and call.args[0].id == CUDA_SOURCE_NAME)
            if not ok_args or len(stmt.targets) != 1 or not isinstance(stmt.targets[0], ast.Name):
                problems.append(Violation(HANDLE_FACTORY, stmt.lineno, f"write exactly `kernels = {HANDLE_FACTORY}("
                                          f"{CUDA_SOURCE_NAME})` (one name, the literal CUDA_SRC, no options: the "
                                          "harness owns compilation)", "structure"))
            else:
                handles.append(stmt.targets[0].id)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == HANDLE_FACTORY \
                and id(node) not in top_level_calls:
            problems.append(Violation(HANDLE_FACTORY, node.lineno, f"{HANDLE_FACTORY} may be called only once, at "
                                      f"module level, as `kernels = {HANDLE_FACTORY}({CUDA_SOURCE_NAME})`",
                                      "structure"))
    if len(handles) > 1:
        problems.append(Violation(HANDLE_FACTORY, 0, f"{HANDLE_FACTORY}(CUDA_SRC) is bound more than once",
                                  "structure"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in handles and isinstance(node.ctx, (ast.Store, ast.Del)):
            stmt_ok = any(isinstance(s, ast.Assign) and s.targets and s.targets[0] is node for s in tree.body)
            if not stmt_ok:
                problems.append(Violation(node.id, node.lineno, f"`{node.id}` (the kernels handle) is rebound",
                                          "structure"))
    return handles, problems


def _holders(tree: ast.Module, handles: list[str]) -> set[str]:
    """Names assigned (anywhere) from expressions that mention a kernel of the handle, directly or through another
    holder (`_KERNELS = {torch.float32: kernels.silu_f32}`, `k = _KERNELS[x.dtype]`)."""
    holders: set[str] = set()
    assigns = [n for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.value is not None]
    changed = True
    while changed:
        changed = False
        for node in assigns:
            mentions = any(
                (isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id in handles)
                or (isinstance(sub, ast.Name) and sub.id in holders)
                for sub in ast.walk(node.value)  # type: ignore[arg-type]
            )
            if not mentions:
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name) and name.id not in holders and name.id not in handles:
                        holders.add(name.id)
                        changed = True
    return holders


def _launches(fn: ast.AST, handles: list[str], holders: set[str]) -> bool:
    """Whether `fn` contains a launch: `handle.kernel[...](...)` or `<holder>[...][...](...)`."""
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript):
            target = node.func.value
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id in handles:
                return True
            while isinstance(target, ast.Subscript):
                target = target.value
            if isinstance(target, ast.Name) and target.id in holders:
                return True
    return False


def screen_cuda_file(source: str, function_name: str | None, entry_point: str) -> list[Violation]:
    """Every violation of a CUDA candidate file (Python launcher + CUDA_SRC), sorted by line."""
    analysis = analyse_python(source, CUDA_PYTHON_RULES, function_name)
    if analysis.tree is None:
        return list(analysis.violations)
    tree = analysis.tree
    violations: list[Violation] = []
    extracted = extract_cuda_source(source)
    kernel_names: set[str] = set()
    if extracted is None:
        violations.append(Violation(CUDA_SOURCE_NAME, 0, f"no module-level `{CUDA_SOURCE_NAME} = r'''...'''`: the "
                                    "device code must be one plain string literal assigned once", "structure"))
    else:
        cuda_source, line = extracted
        violations += screen_cuda_source(cuda_source, first_line=line)
        kernel_names = {k.name for k in parse_kernels(cuda_source) if k.extern_c and k.params is not None}
    handles, problems = _handle_bindings(tree)
    violations += problems
    if not handles:
        violations.append(Violation(HANDLE_FACTORY, 0, f"no module-level `kernels = {HANDLE_FACTORY}("
                                    f"{CUDA_SOURCE_NAME})` (import it: `from {RUNTIME_MODULE} import "
                                    f"{HANDLE_FACTORY}`)", "structure"))
    kernel_reads: set[tuple[str, int]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in handles:
            if node.attr in kernel_names:
                kernel_reads.add((f".{node.attr}", node.lineno))
            elif extracted is not None:
                violations.append(Violation(f".{node.attr}", node.lineno, f"`{node.value.id}.{node.attr}`: CUDA_SRC "
                                            f"declares no extern \"C\" __global__ kernel {node.attr!r} (kernels: "
                                            f"{', '.join(sorted(kernel_names)) or 'none'})"))
    violations += [v for v in analysis.violations if (v.construct, v.line) not in kernel_reads]
    fn = analysis.functions.get(entry_point)
    if fn is None:
        violations.append(Violation(entry_point, 0, f"no top-level `def {entry_point}(...)`: the file must define it "
                                    "as the entry point the harness calls with the op's arguments", "structure"))
    elif handles and not any(_launches(analysis.functions[name], handles, _holders(tree, handles))
                             for name in analysis.reachable_functions(entry_point)):
        violations.append(Violation(entry_point, fn.lineno, f"`{entry_point}` never launches a CUDA kernel (expected "
                                    f"`{handles[0]}.<kernel>[grid, block](...)` in {entry_point} or a helper it "
                                    "calls)", "structure"))
    unique: list[Violation] = []
    for v in violations:
        if v not in unique:
            unique.append(v)
    return sorted(unique, key=lambda v: v.line)
