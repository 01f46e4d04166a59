"""`screen_source`: static screening of a candidate kernel source in a given language."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent.screening.violation import Violation

if TYPE_CHECKING:
    from agent.languages.base import KernelLanguage

__all__ = ["screen_source"]


def screen_source(source: str, function_name: str | None, language: str | KernelLanguage) -> list[Violation]:
    """Every construct the language's policy refuses in `source`, sorted by line; empty = the source may run.

    `function_name` is the `torch.nn.functional` function the kernel implements (its PyTorch spellings are named as
    "the reference op" in messages). `language`: a registered language's name or a `KernelLanguage`. A source that
    does not parse gives one violation of kind `"syntax"`.
    """
    from agent.languages import get_language  # languages import screening: resolve lazily

    if not isinstance(source, str):
        raise TypeError(f"source must be a str, got {type(source).__name__}")
    return get_language(language).screen(source, function_name)
