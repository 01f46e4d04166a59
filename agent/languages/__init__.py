"""Kernel languages the agent can write, by name: `get_language("triton")` returns the `TritonLanguage`.

A language is registered with `register_language` (the built-ins at the end of this file). `DEFAULT_LANGUAGE` is
the language a user gets without asking for one; only the entry points read it (`agent.cli_support`'s
`--language`, `kforge eval`), and everything below them (tasks, prompts, screening, cassettes) is told the language
explicitly.
"""

from __future__ import annotations

from agent.languages.base import ExceptionClass, KernelLanguage
from agent.languages.cuda import CudaLanguage
from agent.languages.triton import TritonLanguage

__all__ = ["DEFAULT_LANGUAGE", "CudaLanguage", "ExceptionClass", "KernelLanguage", "TritonLanguage", "get_language",
           "language_names", "register_language"]

DEFAULT_LANGUAGE = "triton"

_LANGUAGES: dict[str, KernelLanguage] = {}


def register_language(language: KernelLanguage) -> None:
    """Make `language` available under `language.name` (replacing an earlier one of the same name)."""
    if not isinstance(language, KernelLanguage):
        raise TypeError(f"expected a KernelLanguage instance, got {type(language).__name__}")
    _LANGUAGES[language.name] = language


def get_language(name: str | KernelLanguage) -> KernelLanguage:
    """The registered language called `name` (an instance is returned as is); a clear error for unknown names."""
    if isinstance(name, KernelLanguage):
        return name
    try:
        return _LANGUAGES[name]
    except KeyError:
        raise ValueError(f"unknown kernel language {name!r}; known: {', '.join(language_names())}") from None


def language_names() -> list[str]:
    """Names of the registered languages, sorted."""
    return sorted(_LANGUAGES)


register_language(TritonLanguage())
register_language(CudaLanguage())
