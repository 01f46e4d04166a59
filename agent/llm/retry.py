"""Retry policy of the LLM client: which SDK errors are retried, how long to wait, and the `LLMError` they become.

Retried: 429 (except error code/type `insufficient_quota`), 5xx, 408, 409, timeouts, connection errors, and 200
replies that are malformed or empty (`LLMReplyError`, metered before the retry). Never
retried: other 4xx (bad request, auth, not found, context length...), quota errors, and replies that finished with
`finish_reason == "length"` (those are not errors at all; see `LLMReply.truncated`).

Wait before retry n (1-based): exponential backoff ``initial * 2**(n-1)`` with jitter (a uniform factor in
[0.5, 1]), raised to the server's `retry-after-ms` / `Retry-After` (seconds or an HTTP date) when it asks for
longer, and capped at `max_wait_s` in every case.
"""

from __future__ import annotations

import email.utils
import math
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import openai

from agent.llm.errors import RETRYABLE_KINDS, LLMError

__all__ = ["ErrorClass", "RetryWait", "classify_exception", "is_retryable", "parse_retry_after", "to_llm_error"]


@dataclass(frozen=True)
class ErrorClass:
    """How the client treats one exception."""

    kind: str
    status: int | None

    @property
    def retryable(self) -> bool:
        return self.kind in RETRYABLE_KINDS


def _status_of(exc: BaseException) -> int | None:
    status = getattr(exc, "status_code", None)
    return status if isinstance(status, int) else None


def _is_quota(exc: BaseException) -> bool:
    markers = {getattr(exc, "code", None), getattr(exc, "type", None)}
    body = getattr(exc, "body", None)
    if isinstance(body, Mapping):
        inner = body.get("error", body)
        if isinstance(inner, Mapping):
            markers |= {inner.get("code"), inner.get("type")}
    return "insufficient_quota" in markers


def classify_exception(exc: BaseException) -> ErrorClass:
    """Kind (one of `LLM_ERROR_KINDS`) and HTTP status of an exception raised by an SDK call."""
    if isinstance(exc, LLMError):
        return ErrorClass(exc.kind, exc.status)
    status = _status_of(exc)
    if isinstance(exc, openai.APITimeoutError):
        return ErrorClass("timeout", None)
    if isinstance(exc, openai.APIConnectionError):
        return ErrorClass("connection", None)
    if isinstance(exc, openai.RateLimitError) or status == 429:
        return ErrorClass("quota" if _is_quota(exc) else "rate_limited", status)
    if status is not None:
        if status >= 500 or status == 409:
            return ErrorClass("server", status)
        if status == 408:
            return ErrorClass("timeout", status)
        return ErrorClass("client", status)
    if isinstance(exc, openai.APIResponseValidationError):
        return ErrorClass("server", status)
    return ErrorClass("client", status)


def is_retryable(exc: BaseException) -> bool:
    return classify_exception(exc).retryable


def to_llm_error(exc: BaseException, *, attempts: int | None = None) -> LLMError:
    """The `LLMError` for an SDK exception, its message saying what failed and, where it helps, the fix."""
    if isinstance(exc, LLMError):
        return exc
    cls = classify_exception(exc)
    detail = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    tried = f" after {attempts} attempt(s)" if attempts and cls.retryable else ""
    hints = {
        "rate_limited": ("the endpoint kept rate-limiting; lower concurrency or raise max_retries "
                         "(KFORGE_LLM_MAX_RETRIES, --llm-max-retries) / retry_max_wait_s"),
        "server": "the endpoint kept failing; check the server",
        "timeout": ("the request timed out; raise request_timeout_s (KFORGE_LLM_TIMEOUT, --llm-timeout) or check "
                    "the server"),
        "connection": "the endpoint could not be reached; check KFORGE_LLM_BASE_URL and that the server is up",
        "quota": "the account has no quota left (insufficient_quota); waiting will not help",
        "client": "the endpoint rejected the request; it is not retried (check model name, key and parameters)",
    }
    hint = hints.get(cls.kind, "")
    return LLMError(kind=cls.kind, message=f"{type(exc).__name__}{tried}: {detail}" + (f" -- {hint}" if hint else ""),
                    status=cls.status)


def _header(headers: Any, name: str) -> str | None:
    if headers is None:
        return None
    value = headers.get(name)
    if value is None and isinstance(headers, Mapping):
        lowered = {str(k).lower(): v for k, v in headers.items()}
        value = lowered.get(name)
    return None if value is None else str(value)


def parse_retry_after(headers: Any, *, now: float | None = None) -> float | None:
    """Seconds the server asked to wait: `retry-after-ms`, else `Retry-After` (seconds or HTTP date); None if absent.

    Works with httpx headers (case-insensitive) and plain mappings. Unparseable or negative values count as absent.
    """
    ms = _header(headers, "retry-after-ms")
    if ms is not None:
        try:
            value = float(ms) / 1000.0
            if math.isfinite(value) and value >= 0:
                return value
        except ValueError:
            pass
    raw = _header(headers, "retry-after")
    if raw is None:
        return None
    try:
        value = float(raw)
        return value if math.isfinite(value) and value >= 0 else None
    except ValueError:
        pass
    parsed = email.utils.parsedate_tz(raw)
    if parsed is None:
        return None
    when = email.utils.mktime_tz(parsed)
    return max(0.0, when - (time.time() if now is None else now))


class RetryWait:
    """Tenacity wait: jittered exponential backoff, at least the server's Retry-After, at most `max_wait_s`."""

    def __init__(self, *, initial_s: float, max_wait_s: float, rng: random.Random | None = None) -> None:
        self.initial_s = initial_s
        self.max_wait_s = max_wait_s
        self._rng = rng or random.Random()

    def backoff(self, attempt_number: int) -> float:
        base = self.initial_s * (2.0 ** min(max(attempt_number - 1, 0), 60))
        return min(base * self._rng.uniform(0.5, 1.0), self.max_wait_s)

    def __call__(self, retry_state: Any) -> float:
        wait = self.backoff(retry_state.attempt_number)
        outcome = retry_state.outcome
        exc = outcome.exception() if outcome is not None else None
        response = getattr(exc, "response", None)
        asked = parse_retry_after(getattr(response, "headers", None))
        if asked is not None:
            wait = max(wait, asked)
        return min(wait, self.max_wait_s)
