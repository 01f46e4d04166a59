"""Token usage and spend: `TokenUsage` of one reply, and `UsageMeter`, which sums calls per tag and per run.

Cost is estimated from the configured prices (USD per million tokens; completion tokens include reasoning tokens,
as OpenAI-style endpoints report them). With a price unknown, the cost is None and no budget can be enforced
(`LLMConfig` refuses a budget without prices). The budget check runs before each call: once the estimated spend
reaches the budget, the next call raises `LLMError(kind="budget")`. Calls already in flight on other threads finish,
so the spend can overshoot the budget by at most those calls.

Replayed (cassette) calls are counted like live ones, with the recorded token counts, so a replayed run stops at
the same point as the recorded run did; they are flagged `from_cassette` and counted separately in `summary()`.

A reply that reports no usage (some local servers and proxies omit it) would otherwise cost $0 and never trigger
the budget. Its tokens are estimated instead with `estimate_usage`: ceil(characters / 4) per text plus 4 tokens of
chat framing per message, OpenAI's published rule of thumb for English with BPE tokenizers (code and non-Latin text
run denser, so the estimate can be low by a few tens of percent: treat budgets on such endpoints as approximate).
Estimated records carry `usage_estimated=True` and are counted in `summary()["estimated_calls"]` (usage.json).
Replies that cannot be used (malformed, empty) are metered too, with `error` set to the `LLMError` kind.

Every attempt is metered, retries included, failed ones too, with an `outcome` (`AttemptOutcome`) that says how
its tokens were counted:

- "reply" / "unusable": a complete 2xx body, with its reported tokens (or the estimate above);
- "interrupted": the request reached the endpoint (or may have: the client cannot tell) and no complete reply came
  back: the total deadline passed (a slow server, or one trickling bytes), the read timed out, the connection
  dropped mid-reply, `cancel()` / `close()` abandoned it, or a gateway answered 504 / 524 (its upstream was still
  working). The endpoint may have generated and billed tokens nobody saw, so the attempt is charged an estimate
  (`estimate_interrupted_usage`): the prompt as above, and as completion the request's token limit
  (`max_completion_tokens`, else `max_tokens`) when one was sent -- an upper bound, the endpoint cannot bill more
  -- or, with no limit, the tokens of the bytes that arrived (JSON framing included) -- a lower bound, since what
  the endpoint generated and never sent is unknowable; set KFORGE_LLM_MAX_COMPLETION_TOKENS to bound it.
  `completion_estimate` says which ("limit" / "received"); counts that a cut-off body carried win over both;
- "rejected": the endpoint answered an HTTP error status (400, 401, 404, 429, 500, 503...). OpenAI-compatible
  endpoints bill no tokens for those (nothing was generated), so they cost 0 unless the error body reports usage;
- "unsent": the request never reached the endpoint (connection refused, DNS or TLS failure: the request body was
  not written), so nothing was processed or billed: 0 tokens.

`summary()` (usage.json) counts them as `interrupted_calls` (of which `lower_bound_calls` had no limit),
`rejected_calls` and `unsent_calls`, all within `calls` and `failed_calls`; interrupted estimates are in
`estimated_calls` too. The budget counts interrupted estimates like any other spend, so a run of timed-out requests
stops at the budget. A cassette holds only complete replies, so a replayed run does not see the interrupted
attempts of the recorded one.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

from agent.llm.errors import LLMError

if TYPE_CHECKING:
    import pandas as pd

    from agent.llm.config import LLMConfig

__all__ = [
    "ATTEMPT_OUTCOMES", "CHARS_PER_TOKEN", "MESSAGE_OVERHEAD_TOKENS", "AttemptOutcome", "CompletionEstimate",
    "TokenUsage", "UsageMeter", "UsageRecord", "estimate_cost_usd", "estimate_interrupted_usage", "estimate_tokens",
    "estimate_usage", "usage_is_reported",
]

CHARS_PER_TOKEN = 4  # OpenAI's rule of thumb for English text (see the module docstring)
MESSAGE_OVERHEAD_TOKENS = 4  # role and separators of one chat message

AttemptOutcome = Literal["reply", "unusable", "interrupted", "rejected", "unsent"]
ATTEMPT_OUTCOMES: frozenset[str] = frozenset({"reply", "unusable", "interrupted", "rejected", "unsent"})
CompletionEstimate = Literal["limit", "received"]  # how an interrupted attempt's completion tokens were estimated


@dataclass(frozen=True)
class TokenUsage:
    """Tokens of one call (or a sum). `reasoning_tokens` is None when the endpoint did not report it."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int | None = None
    total_tokens: int = 0

    @property
    def total(self) -> int:
        """Alias of `total_tokens`."""
        return self.total_tokens

    def __add__(self, other: TokenUsage) -> TokenUsage:
        if not isinstance(other, TokenUsage):
            return NotImplemented
        reasoning = None
        if self.reasoning_tokens is not None or other.reasoning_tokens is not None:
            reasoning = (self.reasoning_tokens or 0) + (other.reasoning_tokens or 0)
        return TokenUsage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            reasoning_tokens=reasoning,
            total_tokens=self.total_tokens + other.total_tokens,
        )

    def to_dict(self) -> dict[str, int | None]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> TokenUsage:
        """From a dict with OpenAI's usage keys (missing keys count as 0; total defaults to prompt + completion)."""
        if not data:
            return cls()
        prompt = int(data.get("prompt_tokens") or 0)
        completion = int(data.get("completion_tokens") or 0)
        reasoning = data.get("reasoning_tokens")
        if reasoning is None:
            details = data.get("completion_tokens_details") or {}
            reasoning = details.get("reasoning_tokens") if isinstance(details, Mapping) else None
        total = data.get("total_tokens")
        return cls(
            prompt_tokens=prompt,
            completion_tokens=completion,
            reasoning_tokens=None if reasoning is None else int(reasoning),
            total_tokens=int(total) if total is not None else prompt + completion,
        )

    @classmethod
    def from_openai(cls, usage: Any) -> TokenUsage:
        """From the SDK's `CompletionUsage` object (or None when the endpoint sent no usage)."""
        if usage is None:
            return cls()
        details = getattr(usage, "completion_tokens_details", None)
        reasoning = getattr(details, "reasoning_tokens", None) if details is not None else None
        prompt = int(getattr(usage, "prompt_tokens", 0) or 0)
        completion = int(getattr(usage, "completion_tokens", 0) or 0)
        total = getattr(usage, "total_tokens", None)
        return cls(
            prompt_tokens=prompt,
            completion_tokens=completion,
            reasoning_tokens=None if reasoning is None else int(reasoning),
            total_tokens=int(total) if total is not None else prompt + completion,
        )


def estimate_tokens(text: str | None) -> int:
    """Estimated token count of `text`: ceil(len(text) / CHARS_PER_TOKEN); 0 for empty or None."""
    return math.ceil(len(text) / CHARS_PER_TOKEN) if text else 0


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence) and not isinstance(content, (bytes, bytearray)):
        return " ".join(str(p.get("text", "")) if isinstance(p, Mapping) else str(p) for p in content)
    return "" if content is None else str(content)


def estimate_usage(messages: Sequence[Mapping[str, Any]], text: str | None, reasoning: str | None = None) -> TokenUsage:
    """Estimated `TokenUsage` of a call from its text (for replies that report none; see the module docstring).

    Prompt: every message's content plus `MESSAGE_OVERHEAD_TOKENS` each; completion: the reply text plus the
    separated reasoning text (counted as `reasoning_tokens` too when present)."""
    prompt = sum(estimate_tokens(_content_text(m.get("content"))) + MESSAGE_OVERHEAD_TOKENS for m in messages)
    reasoning_tokens = estimate_tokens(reasoning) if reasoning else None
    completion = estimate_tokens(text) + (reasoning_tokens or 0)
    return TokenUsage(prompt_tokens=prompt, completion_tokens=completion, reasoning_tokens=reasoning_tokens,
                      total_tokens=prompt + completion)


def estimate_interrupted_usage(
    messages: Sequence[Mapping[str, Any]], received: str | None, completion_limit: int | None
) -> tuple[TokenUsage, CompletionEstimate]:
    """Estimated `TokenUsage` of an attempt cut off before a complete reply (see the module docstring).

    Prompt: as `estimate_usage`. Completion: `completion_limit` (the request's max_completion_tokens / max_tokens)
    when set, or more if the `received` text already estimates higher -- an upper bound, "limit"; else the tokens of
    `received` (0 when nothing arrived) -- a lower bound, "received"."""
    prompt = estimate_usage(messages, None).prompt_tokens
    seen = estimate_tokens(received)
    if completion_limit is not None:
        completion, basis = max(completion_limit, seen), "limit"
    else:
        completion, basis = seen, "received"
    usage = TokenUsage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)
    return usage, basis


def usage_is_reported(data: Any) -> bool:
    """True when a reply's `usage` value holds real counts: a mapping with a positive prompt or completion count.

    Missing, null, not a mapping, or all zeros (some servers send zeros rather than omitting it) count as not
    reported, and the client estimates instead."""
    if not isinstance(data, Mapping):
        return False
    try:
        return int(data.get("prompt_tokens") or 0) > 0 or int(data.get("completion_tokens") or 0) > 0
    except (TypeError, ValueError):
        return False


def estimate_cost_usd(
    usage: TokenUsage, input_price_per_mtok: float | None, output_price_per_mtok: float | None
) -> float | None:
    """USD cost of `usage` at the given prices per million tokens; None when a price is unknown."""
    if input_price_per_mtok is None or output_price_per_mtok is None:
        return None
    return (usage.prompt_tokens * input_price_per_mtok + usage.completion_tokens * output_price_per_mtok) / 1e6


@dataclass(frozen=True)
class UsageRecord:
    """One metered attempt of a call; `error` is the `LLMError` kind when it failed.

    `usage_estimated` is True when the tokens were estimated rather than reported; `outcome` says what the attempt
    got to and `completion_estimate` how an interrupted one's completion was estimated (see the module docstring).
    """

    tag: str
    model: str | None
    usage: TokenUsage
    cost_usd: float | None
    from_cassette: bool
    latency_s: float
    finish_reason: str | None
    timestamp: float
    usage_estimated: bool = False
    error: str | None = None
    outcome: AttemptOutcome = "reply"
    completion_estimate: CompletionEstimate | None = None


class UsageMeter:
    """Thread-safe per-call usage log with per-tag and per-run sums, cost estimate and budget stop."""

    def __init__(
        self,
        *,
        input_price_per_mtok: float | None = None,
        output_price_per_mtok: float | None = None,
        budget_usd: float | None = None,
    ) -> None:
        if budget_usd is not None and (input_price_per_mtok is None or output_price_per_mtok is None):
            raise ValueError("a cost budget needs both input and output prices (USD per million tokens)")
        self.input_price_per_mtok = input_price_per_mtok
        self.output_price_per_mtok = output_price_per_mtok
        self.budget_usd = budget_usd
        self._lock = threading.Lock()
        self._records: list[UsageRecord] = []

    @classmethod
    def from_config(cls, config: LLMConfig) -> UsageMeter:
        return cls(
            input_price_per_mtok=config.input_price_per_mtok,
            output_price_per_mtok=config.output_price_per_mtok,
            budget_usd=config.cost_budget_usd,
        )

    @property
    def prices_known(self) -> bool:
        return self.input_price_per_mtok is not None and self.output_price_per_mtok is not None

    def estimate_cost(self, usage: TokenUsage) -> float | None:
        return estimate_cost_usd(usage, self.input_price_per_mtok, self.output_price_per_mtok)

    @property
    def spent_usd(self) -> float | None:
        """Estimated spend of all recorded calls; None when prices are unknown."""
        with self._lock:
            return self._spent_locked()

    def _spent_locked(self) -> float | None:
        if not self.prices_known:
            return None
        return sum(r.cost_usd or 0.0 for r in self._records)

    def check_budget(self) -> None:
        """Raise `LLMError(kind="budget")` when the estimated spend has reached the budget."""
        if self.budget_usd is None:
            return
        with self._lock:
            spent = self._spent_locked() or 0.0
        if spent >= self.budget_usd:
            raise LLMError(
                kind="budget",
                message=(
                    f"LLM cost budget reached: spent ~${spent:.4f} of ${self.budget_usd:.4f} "
                    f"(cost_budget_usd / KFORGE_LLM_BUDGET_USD); raise the budget to continue"
                ),
            )

    def record(
        self,
        *,
        tag: str,
        model: str | None,
        usage: TokenUsage,
        from_cassette: bool,
        latency_s: float,
        finish_reason: str | None = None,
        usage_estimated: bool = False,
        error: str | None = None,
        outcome: AttemptOutcome | None = None,
        completion_estimate: CompletionEstimate | None = None,
    ) -> UsageRecord:
        """Log one attempt and return its record (with the estimated cost). `outcome` defaults to "reply", or
        "unusable" when `error` is set."""
        if outcome is None:
            outcome = "reply" if error is None else "unusable"
        if outcome not in ATTEMPT_OUTCOMES:
            raise ValueError(f"unknown attempt outcome {outcome!r}; expected one of {sorted(ATTEMPT_OUTCOMES)}")
        rec = UsageRecord(
            tag=tag,
            model=model,
            usage=usage,
            cost_usd=self.estimate_cost(usage),
            from_cassette=from_cassette,
            latency_s=latency_s,
            finish_reason=finish_reason,
            timestamp=time.time(),
            usage_estimated=usage_estimated,
            error=error,
            outcome=outcome,
            completion_estimate=completion_estimate,
        )
        with self._lock:
            self._records.append(rec)
        return rec

    @property
    def records(self) -> tuple[UsageRecord, ...]:
        with self._lock:
            return tuple(self._records)

    def total(self) -> TokenUsage:
        """Summed tokens of the run."""
        return sum((r.usage for r in self.records), TokenUsage())

    def by_tag(self) -> dict[str, dict[str, Any]]:
        """Per-tag sums: {tag: {calls, cassette_calls, ..., interrupted_calls, ..., cost_usd, latency_s}}."""
        groups: dict[str, list[UsageRecord]] = {}
        for rec in self.records:
            groups.setdefault(rec.tag, []).append(rec)
        return {tag: self._sum(recs) for tag, recs in sorted(groups.items())}

    def _sum(self, recs: list[UsageRecord]) -> dict[str, Any]:
        usage = sum((r.usage for r in recs), TokenUsage())
        return {
            "calls": len(recs),
            "cassette_calls": sum(1 for r in recs if r.from_cassette),
            "truncated_calls": sum(1 for r in recs if r.finish_reason == "length"),
            "failed_calls": sum(1 for r in recs if r.error is not None),
            "estimated_calls": sum(1 for r in recs if r.usage_estimated),
            "interrupted_calls": sum(1 for r in recs if r.outcome == "interrupted"),
            "lower_bound_calls": sum(1 for r in recs if r.completion_estimate == "received"),
            "rejected_calls": sum(1 for r in recs if r.outcome == "rejected"),
            "unsent_calls": sum(1 for r in recs if r.outcome == "unsent"),
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "reasoning_tokens": usage.reasoning_tokens,
            "total_tokens": usage.total_tokens,
            "cost_usd": sum(r.cost_usd or 0.0 for r in recs) if self.prices_known else None,
            "latency_s": sum(r.latency_s for r in recs),
        }

    def summary(self) -> dict[str, Any]:
        """Run totals plus `per_tag` sums, prices and budget (`cost_usd` None when prices are unknown)."""
        run = self._sum(list(self.records))
        return {
            **run,
            "input_price_per_mtok": self.input_price_per_mtok,
            "output_price_per_mtok": self.output_price_per_mtok,
            "budget_usd": self.budget_usd,
            "per_tag": self.by_tag(),
        }

    def to_dataframe(self) -> pd.DataFrame:
        """One row per attempt: tag, model, tokens, cost_usd, from_cassette, latency_s, finish_reason, timestamp,
        usage_estimated, error, outcome, completion_estimate."""
        import pandas as pd

        columns = [
            "tag", "model", "prompt_tokens", "completion_tokens", "reasoning_tokens", "total_tokens", "cost_usd",
            "from_cassette", "latency_s", "finish_reason", "timestamp", "usage_estimated", "error", "outcome",
            "completion_estimate",
        ]
        rows = [
            {
                "tag": r.tag,
                "model": r.model,
                **r.usage.to_dict(),
                "cost_usd": r.cost_usd,
                "from_cassette": r.from_cassette,
                "latency_s": r.latency_s,
                "finish_reason": r.finish_reason,
                "timestamp": r.timestamp,
                "usage_estimated": r.usage_estimated,
                "error": r.error,
                "outcome": r.outcome,
                "completion_estimate": r.completion_estimate,
            }
            for r in self.records
        ]
        return pd.DataFrame(rows, columns=columns)
