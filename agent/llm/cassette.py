"""JSONL cassette: record LLM calls to a file and replay them later with no network.

One line per call: ``{"key", "tag", "request": {"model", "messages", "parameters"}, "response": {"text",
"finish_reason", "model", "usage", ["reasoning"]}}``. The key is the sha256 of the canonical JSON (sorted keys, no
whitespace) of the request: model, messages and the parameters that affect the reply (temperature, max_tokens,
max_completion_tokens, reasoning_effort, extra_body). A hand-written line may omit "key"; it is computed from
"request".

Replay serves identical requests in recorded order: the nth time a request is asked, it gets the nth reply
recorded for it (two independent conversations that open with the same prompt each get their own reply). Once the
recorded replies of a key are used up, the last one is served again. A request that was never recorded raises
`LLMError(kind="cassette_miss")` naming the cassette, the model, the start of the last user message and the fix.

Record mode starts the file afresh (creating parent folders) and appends one flushed line per successful call;
writes are serialised, so threads may share one cassette.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.llm.config import CASSETTE_MODES, CassetteMode
from agent.llm.errors import LLMError
from forge.text import clip

__all__ = ["Cassette", "CassetteEntry", "canonical_request", "last_user_text", "request_key"]

logger = logging.getLogger(__name__)


def canonical_request(model: str | None, messages: Sequence[Mapping[str, Any]], parameters: Mapping[str, Any]) -> dict:
    """The request as recorded and keyed: model, messages (as plain dicts) and the reply-affecting parameters."""
    return {
        "model": model,
        "messages": [dict(m) for m in messages],
        "parameters": {
            "temperature": parameters.get("temperature"),
            "max_tokens": parameters.get("max_tokens"),
            "max_completion_tokens": parameters.get("max_completion_tokens"),
            "reasoning_effort": parameters.get("reasoning_effort"),
            "extra_body": dict(parameters.get("extra_body") or {}),
        },
    }


def request_key(request: Mapping[str, Any]) -> str:
    """sha256 hex digest of the canonical JSON of a `canonical_request` dict."""
    canonical = json.dumps(request, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def last_user_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """Text of the last user message (text parts joined when the content is a list of parts); "" when none."""
    for message in reversed(messages):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, Sequence):
            return " ".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
        return str(content)
    return ""


@dataclass(frozen=True)
class CassetteEntry:
    """One recorded reply: the `response` dict of a cassette line and the tag it was recorded under."""

    key: str
    response: Mapping[str, Any]
    tag: str = ""


class Cassette:
    """A JSONL record of LLM calls, opened in "record" or "replay" mode."""

    def __init__(self, path: str | Path, mode: CassetteMode) -> None:
        if mode not in CASSETTE_MODES:
            raise ValueError(f"cassette mode must be one of {CASSETTE_MODES}, got {mode!r}")
        self.path = Path(path).expanduser()
        self.mode = mode
        self._lock = threading.Lock()
        self._entries: dict[str, list[CassetteEntry]] = {}
        self._served: dict[str, int] = {}
        self._file = None
        if mode == "replay":
            self._load()
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self.path.exists():
                logger.info("recording cassette %s: replacing the existing file", self.path)
            self._file = self.path.open("w", encoding="utf-8")

    def __repr__(self) -> str:
        return f"Cassette({str(self.path)!r}, mode={self.mode!r})"

    # -- replay ----------------------------------------------------------------------------------------------
    def _load(self) -> None:
        if not self.path.is_file():
            raise FileNotFoundError(
                f"cassette {self.path} does not exist, so there is nothing to replay; record it first with "
                f"KFORGE_CASSETTE_MODE=record against an endpoint (KFORGE_LLM_BASE_URL / KFORGE_LLM_API_KEY, "
                f"KFORGE_LLM_MODEL)"
            )
        with self.path.open(encoding="utf-8") as handle:
            for lineno, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(
                        f"{self.path}:{lineno}: not valid JSON ({exc}); fix the line or re-record"
                    ) from exc
                if not isinstance(record, dict) or not isinstance(record.get("response"), dict):
                    raise ValueError(f"{self.path}:{lineno}: a cassette line needs a 'response' object")
                key = record.get("key")
                if isinstance(record.get("request"), dict):
                    computed = request_key(record["request"])
                    if key is not None and key != computed:
                        logger.warning("%s:%d: stored key differs from the request's; using the request's",
                                       self.path, lineno)
                    key = computed
                if not isinstance(key, str):
                    raise ValueError(f"{self.path}:{lineno}: a cassette line needs a 'request' object or a 'key'")
                entry = CassetteEntry(key=key, response=record["response"], tag=str(record.get("tag", "")))
                self._entries.setdefault(key, []).append(entry)
        logger.debug("loaded cassette %s: %d keys", self.path, len(self._entries))

    def __len__(self) -> int:
        return sum(len(v) for v in self._entries.values())

    def lookup(self, request: Mapping[str, Any]) -> CassetteEntry:
        """The next recorded reply for `request` (replay mode); `LLMError(kind="cassette_miss")` if never recorded."""
        if self.mode != "replay":
            raise RuntimeError(f"{self!r} is not in replay mode")
        key = request_key(request)
        with self._lock:
            entries = self._entries.get(key)
            if not entries:
                raise LLMError(kind="cassette_miss", message=self._miss_message(request))
            index = self._served.get(key, 0)
            self._served[key] = index + 1
        if index >= len(entries):
            logger.debug("cassette %s: key %s asked %d times, %d recorded; reusing the last reply",
                         self.path, key[:12], index + 1, len(entries))
            index = len(entries) - 1
        return entries[index]

    def _miss_message(self, request: Mapping[str, Any]) -> str:
        prompt = last_user_text(request.get("messages") or [])
        excerpt = clip(prompt, 203, collapse=False)
        return (
            f"cassette miss: {self.path} has no recorded reply for this request (model {request.get('model')!r}, "
            f"parameters {json.dumps(request.get('parameters'), sort_keys=True)}; last user message starts: "
            f"{excerpt!r}). The prompt, model or generation parameters changed since it was recorded. Fix: re-record "
            f"with KFORGE_CASSETTE_MODE=record against an endpoint (KFORGE_LLM_BASE_URL / KFORGE_LLM_API_KEY, "
            f"KFORGE_LLM_MODEL)."
        )

    # -- record ----------------------------------------------------------------------------------------------
    def record(self, request: Mapping[str, Any], response: Mapping[str, Any], *, tag: str = "") -> str:
        """Append one call (record mode) and flush; returns its key."""
        if self.mode != "record":
            raise RuntimeError(f"{self!r} is not in record mode")
        key = request_key(request)
        line = json.dumps(
            {"key": key, "tag": tag, "request": request, "response": dict(response)}, ensure_ascii=False
        )
        with self._lock:
            if self._file is None or self._file.closed:
                raise RuntimeError(f"{self!r} is closed")
            self._file.write(line + "\n")
            self._file.flush()
        return key

    def close(self) -> None:
        with self._lock:
            if self._file is not None and not self._file.closed:
                self._file.close()
