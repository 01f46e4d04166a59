"""`LLMError`: the one exception the LLM client layer raises for endpoint, budget and cassette failures."""

from __future__ import annotations

from typing import Literal

__all__ = ["LLM_ERROR_KINDS", "RETRYABLE_KINDS", "LLMError", "LLMErrorKind"]

LLMErrorKind = Literal[
    "rate_limited", "server", "timeout", "connection", "quota", "client", "budget", "cassette_miss", "truncated",
    "cancelled",
]

LLM_ERROR_KINDS: frozenset[str] = frozenset(
    {
        "rate_limited",  # 429 that persisted past the retry budget
        "server",  # 5xx / 409 that persisted, or a malformed reply
        "timeout",  # the request timed out on every attempt
        "connection",  # the endpoint could not be reached on every attempt
        "quota",  # 429 with code `insufficient_quota`: will not clear by waiting
        "client",  # any other 4xx (bad request, auth, not found, context length...): never retried
        "budget",  # the configured cost budget is spent
        "cassette_miss",  # replay mode and the request was never recorded
        "truncated",  # raised by `LLMReply.require_complete()` for finish_reason == "length"
        "cancelled",  # `LLMClient.cancel()` / `close()` was called
    }
)

RETRYABLE_KINDS: frozenset[str] = frozenset({"rate_limited", "server", "timeout", "connection"})


class LLMError(Exception):
    """A failed LLM call. `kind` is one of `LLM_ERROR_KINDS`; `status` is the HTTP status when there was one."""

    def __init__(self, kind: LLMErrorKind | str, message: str, status: int | None = None) -> None:
        if kind not in LLM_ERROR_KINDS:
            raise ValueError(f"unknown LLMError kind {kind!r}; expected one of {sorted(LLM_ERROR_KINDS)}")
        self.kind = kind
        self.message = message
        self.status = status
        status_part = f" (HTTP {status})" if status is not None else ""
        super().__init__(f"[{kind}]{status_part} {message}")

    def __reduce__(self):  # keep keyword-style construction picklable across processes
        return (type(self), (self.kind, self.message, self.status))
