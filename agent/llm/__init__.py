"""LLM client layer: config from the environment, an OpenAI-compatible client with retries, usage metering with a
cost budget, and a JSONL cassette for record/replay."""

from agent.llm.cassette import Cassette, CassetteEntry, canonical_request, last_user_text, request_key
from agent.llm.client import LLMClient, LLMReply
from agent.llm.config import CASSETTE_MODES, LLMConfig
from agent.llm.errors import (
    LLM_ERROR_KINDS,
    RETRYABLE_KINDS,
    LLMEmptyReplyError,
    LLMError,
    LLMInterruptedError,
    LLMMalformedReplyError,
    LLMReplyError,
)
from agent.llm.retry import classify_exception, parse_retry_after
from agent.llm.usage import (
    AttemptOutcome,
    TokenUsage,
    UsageMeter,
    UsageRecord,
    estimate_cost_usd,
    estimate_interrupted_usage,
    estimate_usage,
)

__all__ = [
    "CASSETTE_MODES",
    "LLM_ERROR_KINDS",
    "RETRYABLE_KINDS",
    "AttemptOutcome",
    "Cassette",
    "CassetteEntry",
    "LLMClient",
    "LLMConfig",
    "LLMEmptyReplyError",
    "LLMError",
    "LLMInterruptedError",
    "LLMMalformedReplyError",
    "LLMReply",
    "LLMReplyError",
    "TokenUsage",
    "UsageMeter",
    "UsageRecord",
    "canonical_request",
    "classify_exception",
    "estimate_cost_usd",
    "estimate_interrupted_usage",
    "estimate_usage",
    "last_user_text",
    "parse_retry_after",
    "request_key",
]
