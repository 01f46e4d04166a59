"""`CandidateLanguage`: what the judge needs from a kernel language, and how the sandbox child finds the same one.

The judge lives in `forge`, the languages (Triton, CUDA C++) in `agent.languages`; forge never imports them. A
language is handed to the judge as an object, and the child re-creates it from its class's import path
(`language_ref`), written by the parent into the job file. Each language is one class with a no-argument
constructor.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

__all__ = ["CandidateCode", "CandidateLanguage", "language_from_ref", "language_ref"]


@runtime_checkable
class CandidateLanguage(Protocol):
    """A kernel language as the judge uses it (`agent.languages.base.KernelLanguage` implements it).

    In the judging process: `name`, `file_suffix`, `screen(source, function_name)` and `screen_module(source)`
    (findings with `kind`, `construct`, `line`, `message` and `to_dict()`; empty: may run), `device_types()`,
    `child_environment(device_type, scratch)` (variables for a child whose private writable folder is `scratch`),
    `shared_caches()` (folders this process fills and children only read, e.g. prebuilt CUDA binaries). In the
    child: `load(path, module_name, entry_point=None)`, `launch_monitor()` (or None), `classify_exception(exc)`
    ("compile_error" or "runtime_error") and `compile_log(exc)`."""

    name: str
    file_suffix: str

    def screen(self, source: str, function_name: str | None = None) -> Sequence[Any]: ...

    def screen_module(self, source: str, attributes: frozenset[str] = ...) -> Sequence[Any]: ...

    def device_types(self) -> tuple[str, ...]: ...

    def child_environment(self, device_type: str, scratch: Path) -> dict[str, str]: ...

    def shared_caches(self) -> Sequence[Path]: ...

    def load(self, path: str | Path, module_name: str, entry_point: str | None = None) -> Callable[..., Any]: ...


def language_ref(language: Any) -> str:
    """`module:QualifiedName` of the language's class (the child imports it from there)."""
    cls = type(language)
    return f"{cls.__module__}:{cls.__qualname__}"


def language_from_ref(ref: str) -> Any:
    """A new instance of the language class `language_ref` named."""
    module_name, _, qualname = ref.partition(":")
    if not module_name or not qualname:
        raise ValueError(f"a language reference is 'module:QualifiedName', got {ref!r}")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj()


@dataclass(frozen=True)
class CandidateCode:
    """A candidate as code: its source and its language (a `CandidateLanguage` object). What a provider that
    carries code hands the judge (`KernelProvider.candidate_code`)."""

    source: str
    language: Any
