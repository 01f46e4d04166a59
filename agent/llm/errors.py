"""`LLMError`: the one exception the LLM client layer raises for endpoint, budget, cassette and reply failures.

A 200 reply that cannot be used (a body that is not JSON, no `choices`, no message) is an `LLMReplyError`
(`LLMMalformedReplyError` / `LLMEmptyReplyError`) rather than whatever the JSON parser or the SDK happened to raise,
so callers handle one exception type. It carries the tokens the reply reported (or an estimate, flagged), which the
client has already metered: an endpoint that bills for replies it then mangles still counts against the budget.

An attempt cut off after the request reached the endpoint (the deadline, a read timeout, a connection dropped
mid-reply, `cancel()`) is an `LLMInterruptedError` of kind "timeout", "connection" or "cancelled": it carries the
estimate the client metered for it and how many bytes of the reply had arrived, as attributes, so no caller needs
to read the message to learn what was charged (see `agent.llm.usage`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

from forge.errors import KernelForgeError

if TYPE_CHECKING:
    from agent.llm.usage import TokenUsage

__all__ = [
    "LLM_ERROR_KINDS",
    "RETRYABLE_KINDS",
    "LLMEmptyReplyError",
    "LLMError",
    "LLMErrorKind",
    "LLMInterruptedError",
    "LLMMalformedReplyError",
    "LLMReplyError",
]

LLMErrorKind = Literal[
    "rate_limited", "server", "timeout", "connection", "quota", "client", "budget", "cassette_miss", "truncated",
    "cancelled", "malformed", "empty",
]

LLM_ERROR_KINDS: frozenset[str] = frozenset(
    {
        "rate_limited",  # 429 that persisted past the retry budget
        "server",  # 5xx / 409 that persisted
        "timeout",  # the request missed its total deadline (request_timeout_s) on every attempt
        "connection",  # the endpoint could not be reached on every attempt
        "quota",  # 429 with code `insufficient_quota`: will not clear by waiting
        "client",  # any other 4xx (bad request, auth, not found, context length...): never retried
        "budget",  # the configured cost budget is spent
        "cassette_miss",  # replay mode and the request was never recorded
        "truncated",  # raised by `LLMReply.require_complete()` for finish_reason == "length"
        "cancelled",  # `LLMClient.cancel()` / `close()` was called
        "malformed",  # a 200 reply whose body is not a chat-completion JSON object, on every attempt
        "empty",  # a 200 reply with no choices or no message, on every attempt
    }
)

# Malformed and empty replies are retried like 5xx: they come from overloaded servers and proxies that cut a body
# short, and the generator ends a whole conversation on an LLMError. Each attempt is metered and the budget is
# checked before every attempt, so a server that keeps sending them costs at most max_retries + 1 replies.
RETRYABLE_KINDS: frozenset[str] = frozenset({"rate_limited", "server", "timeout", "connection", "malformed", "empty"})


class LLMError(KernelForgeError):
    """A failed LLM call. `kind` is one of `LLM_ERROR_KINDS`; `status` is the HTTP status when there was one."""

    def __init__(self, kind: LLMErrorKind | str, message: str, status: int | None = None) -> None:
        if kind not in LLM_ERROR_KINDS:
            raise ValueError(f"unknown LLMError kind {kind!r}; expected one of {sorted(LLM_ERROR_KINDS)}")
        self.kind = kind
        self.message = message
        self.status = status
        status_part = f" (HTTP {status})" if status is not None else ""
        super().__init__(f"[{kind}]{status_part} {message}")

    def __reduce__(self) -> tuple[Any, ...]:  # keep keyword-style construction picklable across processes
        return (type(self), (self.kind, self.message, self.status))


class LLMReplyError(LLMError):
    """A 200 reply that cannot be used. `usage` is what it reported (None when nothing could be read);
    `usage_estimated` is True when the client estimated it from the text instead (see `agent.llm.usage`)."""

    reply_kind: ClassVar[str] = "malformed"

    def __init__(self, message: str, status: int | None = None, usage: TokenUsage | None = None,
                 usage_estimated: bool = False) -> None:
        super().__init__(self.reply_kind, message, status)
        self.usage = usage
        self.usage_estimated = usage_estimated

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.message, self.status, self.usage, self.usage_estimated))


class LLMMalformedReplyError(LLMReplyError):
    """The reply body is not a chat completion: not JSON, not an object, or a choice without a usable message."""

    reply_kind = "malformed"


class LLMEmptyReplyError(LLMReplyError):
    """The reply is a chat completion with no choices (or a first choice with neither text nor a finish reason)."""

    reply_kind = "empty"


class LLMInterruptedError(LLMError):
    """An attempt the endpoint may have generated tokens for, cut off before a complete reply arrived.

    `usage` is what the client metered for it (an estimate when `usage_estimated`; see
    `agent.llm.usage.estimate_interrupted_usage`) and `received_bytes` how much of the reply body had arrived."""

    def __init__(self, kind: LLMErrorKind | str, message: str, status: int | None = None, *,
                 usage: TokenUsage | None = None, usage_estimated: bool = True, received_bytes: int = 0) -> None:
        super().__init__(kind, message, status)
        self.usage = usage
        self.usage_estimated = usage_estimated
        self.received_bytes = received_bytes

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_interrupted, (self.kind, self.message, self.status, self.usage, self.usage_estimated,
                                       self.received_bytes))


def _rebuild_interrupted(kind: str, message: str, status: int | None, usage: TokenUsage | None,
                         usage_estimated: bool, received_bytes: int) -> LLMInterruptedError:
    return LLMInterruptedError(kind, message, status, usage=usage, usage_estimated=usage_estimated,
                               received_bytes=received_bytes)
