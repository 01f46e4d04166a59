"""Execute Python source text as a fresh module backed by a real file (`forge.source_files.load_source_text`)."""

from __future__ import annotations

from forge.source_files import load_source_text

__all__ = ["load_source_module"]

load_source_module = load_source_text
