"""Take the code out of an LLM reply: `extract_code` picks one fenced block; `no_code_feedback` says what was wrong.

Accepted fences: ```python, ```py, ```python3, ```triton and bare ``` (also ~~~ and longer fences), opening and
closing on their own lines. Prose around and between blocks is ignored, and so are closed `<think>...</think>`
sections (reasoning that some servers leave in the content). Choice among several blocks:

1. the last block that defines an entry point (`def kernel_function(` or `class ModelNew`), preferring blocks
   that also import something (a complete module over a snippet);
2. else the longest accepted block.

A reply whose last fence never closes was cut off (truncated): `extract_code` returns None rather than guess, and
`no_code_feedback` explains it. A reply with no fence at all is accepted only when the whole reply is valid
Python that defines an entry point.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from forge.text import parse_python

__all__ = ["DEFAULT_ENTRY_POINTS", "ExtractedCode", "extract_code", "no_code_feedback"]

DEFAULT_ENTRY_POINTS: tuple[str, ...] = ("kernel_function", "ModelNew")

_LANGUAGE_TAGS = {"python": {"python", "py", "python3", "triton", ""}}
_FENCE = re.compile(r"^ {0,3}(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^\n`]*?)[ \t]*$")
_THINK_CLOSED = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)


@dataclass(frozen=True)
class ExtractedCode:
    """The chosen code, how many fenced blocks the reply had, and a note on the choice."""

    code: str
    block_count: int
    note: str


@dataclass(frozen=True)
class _Block:
    language: str
    code: str
    index: int


@dataclass(frozen=True)
class _Scan:
    blocks: tuple[_Block, ...]
    unclosed: _Block | None  # the block whose fence never closed, if any
    unclosed_think: bool


def _scan(text: str) -> _Scan:
    unclosed_think = False
    text = _THINK_CLOSED.sub("", text)
    lowered = text.lower()
    if "<think>" in lowered:  # reasoning that never ended: nothing after it is an answer
        text = text[: lowered.index("<think>")]
        unclosed_think = True
    blocks: list[_Block] = []
    open_fence: str | None = None
    language = ""
    body: list[str] = []
    for line in text.splitlines():
        match = _FENCE.match(line)
        if open_fence is None:
            if match:
                open_fence = match.group("fence")
                language = match.group("info").split()[0].lower() if match.group("info").strip() else ""
                body = []
            continue
        if match and not match.group("info") and match.group("fence")[0] == open_fence[0] \
                and len(match.group("fence")) >= len(open_fence):
            blocks.append(_Block(language=language, code="\n".join(body).strip("\n") + "\n", index=len(blocks)))
            open_fence = None
            continue
        body.append(line)
    unclosed = None
    if open_fence is not None:
        unclosed = _Block(language=language, code="\n".join(body), index=len(blocks))
    return _Scan(blocks=tuple(blocks), unclosed=unclosed, unclosed_think=unclosed_think)


def _accepted_tags(language: str) -> set[str]:
    lang = language.lower()
    return _LANGUAGE_TAGS.get(lang, {lang, ""})


def _defines(code: str, entry_points: Sequence[str]) -> str | None:
    for name in entry_points:
        if re.search(rf"^\s*(?:async\s+)?def\s+{re.escape(name)}\s*\(", code, re.MULTILINE) or re.search(
            rf"^\s*class\s+{re.escape(name)}\b", code, re.MULTILINE
        ):
            return name
    return None


def _has_import(code: str) -> bool:
    return re.search(r"^\s*(?:import|from)\s+\w", code, re.MULTILINE) is not None


def extract_code(
    text: str, language: str = "python", *, entry_points: Sequence[str] = DEFAULT_ENTRY_POINTS
) -> ExtractedCode | None:
    """The code block to use from an LLM reply, or None (see the module docstring; `no_code_feedback` says why)."""
    if not text or not text.strip():
        return None
    scan = _scan(text)
    if scan.unclosed is not None or scan.unclosed_think:
        return None
    tags = _accepted_tags(language)
    candidates = [b for b in scan.blocks if b.language in tags and b.code.strip()]
    total = len(scan.blocks)
    if not candidates:
        if total == 0 and language.lower() == "python":
            return _whole_reply_as_code(text, entry_points)
        return None
    defining = [(b, _defines(b.code, entry_points)) for b in candidates]
    defining = [(b, name) for b, name in defining if name is not None]
    if defining:
        complete = [(b, name) for b, name in defining if _has_import(b.code)]
        block, name = (complete or defining)[-1]
        note = f"block {block.index + 1} of {total}: the last one defining {name}"
        if len(defining) > 1:
            note += f" ({len(defining)} blocks define an entry point)"
        return ExtractedCode(code=block.code, block_count=total, note=note)
    block = max(candidates, key=lambda b: (len(b.code), b.index))
    names = " / ".join(entry_points)
    note = f"block {block.index + 1} of {total}: the longest {language} block (none defines {names})"
    return ExtractedCode(code=block.code, block_count=total, note=note)


def _whole_reply_as_code(text: str, entry_points: Sequence[str]) -> ExtractedCode | None:
    code = text.strip("\n") + "\n"
    try:
        parse_python(code)
    except SyntaxError:
        return None
    name = _defines(code, entry_points)
    if name is None:
        return None
    return ExtractedCode(code=code, block_count=0, note=f"unfenced reply: the whole reply is Python defining {name}")


def no_code_feedback(text: str, *, entry_point: str = "kernel_function", language: str = "python") -> str:
    """A specific message for the fix prompt when `extract_code` found no usable code in `text`."""
    want = f"one ```{language} fenced block containing the complete module that defines `{entry_point}`"
    if not text or not text.strip():
        return f"Your reply was empty. Reply with {want}."
    scan = _scan(text)
    if scan.unclosed_think:
        return (
            "Your reply ended inside its <think> reasoning section, before any answer. Keep the reasoning short and "
            f"reply with {want}."
        )
    if scan.unclosed is not None:
        lines = scan.unclosed.code.count("\n") + 1 if scan.unclosed.code else 0
        return (
            f"Your reply was cut off inside a code block (after {lines} lines the closing ``` never came), so the "
            f"code is incomplete. Reply with {want}, shorter: drop explanations and unused variants."
        )
    tags = _accepted_tags(language)
    others = sorted({b.language or "untagged" for b in scan.blocks if b.language not in tags})
    if scan.blocks and others and not any(b.language in tags for b in scan.blocks):
        return (
            f"Your reply contained code blocks only in other languages ({', '.join(others)}). Reply with {want}."
        )
    if scan.blocks and not any(b.code.strip() for b in scan.blocks if b.language in tags):
        return f"Your reply's ```{language} block was empty. Reply with {want}."
    if scan.blocks:
        return f"Your reply's code blocks did not define `{entry_point}`. Reply with {want}."
    return f"Your reply contained no ```{language} fenced block defining `{entry_point}`. Reply with {want}."
