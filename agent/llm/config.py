"""`LLMConfig`: which endpoint and model to call, how to call it, what it costs, and the optional cassette.

Build it directly or with `LLMConfig.from_env(**overrides)`, which reads these variables (explicit overrides win,
including an explicit `None`; an empty variable counts as unset):

=================================  ============================================================================
KFORGE_LLM_MODEL                   model name sent to the endpoint
KFORGE_LLM_BASE_URL                OpenAI-compatible base URL (else OPENAI_BASE_URL; else the SDK's default)
KFORGE_LLM_API_KEY                 API key (else OPENAI_API_KEY); local servers accept any non-empty string
KFORGE_CASSETTE                    path of a JSONL cassette for record/replay of calls
KFORGE_CASSETTE_MODE               "record" | "replay" | "auto" (auto = unset, see below)
KFORGE_CACHE_DIR                   cache directory (default ~/.cache/kforge)
KFORGE_LLM_INPUT_PRICE             USD per million prompt tokens
KFORGE_LLM_OUTPUT_PRICE            USD per million completion tokens (reasoning tokens included)
KFORGE_LLM_BUDGET_USD              stop calling once this much has been spent (needs both prices)
KFORGE_LLM_REASONING_EFFORT        sent as `reasoning_effort` (none | minimal | low | medium | high | ...)
KFORGE_LLM_MAX_COMPLETION_TOKENS   sent as `max_completion_tokens` (includes reasoning tokens)
KFORGE_LLM_TIMEOUT                 total deadline of one HTTP request in seconds (default 600; see below)
KFORGE_LLM_MAX_RETRIES             retries after a failed attempt (default 6; 0 = one attempt only)
=================================  ============================================================================

`request_timeout_s` bounds one whole request, connecting, sending and reading the entire reply: a server that
trickles its answer a byte at a time still fails at the deadline (httpx's own timeouts apply per read, which such a
server never trips). A call makes at most `max_retries + 1` requests, with waits between them (`retry_*_wait_s`).

Cassette mode: with a cassette path and `cassette_mode=None`, the client replays when the file exists and records
(to a new file) when it does not; `resolved_cassette_mode()` gives the answer. An explicit "record" starts the file
afresh (an existing file is replaced); an explicit "replay" needs the file to exist.

Parameters left `None` are not sent (several reasoning models reject sampling parameters they did not expect).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from forge.env import env_float, env_int, parse_float, parse_int

__all__ = ["CASSETTE_MODES", "CassetteMode", "LLMConfig", "parse_max_retries", "parse_timeout"]

CassetteMode = Literal["record", "replay"]
CASSETTE_MODES: tuple[str, ...] = ("record", "replay")

DEFAULT_CACHE_DIR = "~/.cache/kforge"

# Request body keys that dedicated fields own; `extra_body` must not set them a second time.
_OWNED_BODY_KEYS = frozenset(
    {"model", "messages", "temperature", "max_tokens", "max_completion_tokens", "reasoning_effort", "stream"}
)


@dataclass(frozen=True, repr=False)
class LLMConfig:
    """Endpoint, model, generation parameters, retry policy, prices, budget and cassette of an `LLMClient`."""

    model: str | None = None
    base_url: str | None = None
    api_key: str | None = None
    cassette: Path | None = None
    cassette_mode: CassetteMode | None = None
    cache_dir: Path = field(default_factory=lambda: Path(DEFAULT_CACHE_DIR).expanduser())
    temperature: float | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    reasoning_effort: str | None = None
    request_timeout_s: float = 600.0
    max_retries: int = 6
    retry_max_wait_s: float = 60.0
    retry_initial_wait_s: float = 1.0
    input_price_per_mtok: float | None = None
    output_price_per_mtok: float | None = None
    cost_budget_usd: float | None = None
    extra_body: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.cassette is not None:
            if not str(self.cassette).strip():
                raise ValueError("cassette is an empty path; pass a file path such as 'runs/llm.jsonl' or None")
            object.__setattr__(self, "cassette", Path(self.cassette).expanduser())
        object.__setattr__(self, "cache_dir", Path(self.cache_dir).expanduser())
        if self.cassette_mode not in (None, *CASSETTE_MODES):
            raise ValueError(f"cassette_mode must be 'record', 'replay' or None (auto), got {self.cassette_mode!r}")
        if self.cassette_mode is not None and self.cassette is None:
            raise ValueError(f"cassette_mode={self.cassette_mode!r} needs a cassette path (KFORGE_CASSETTE)")
        for name in ("max_tokens", "max_completion_tokens"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                raise ValueError(f"{name} must be a positive integer or None, got {value!r}")
        if isinstance(self.max_retries, bool) or not isinstance(self.max_retries, int) or self.max_retries < 0:
            raise ValueError(f"max_retries must be an integer >= 0, got {self.max_retries!r}")
        _check_number("request_timeout_s", self.request_timeout_s, positive=True)
        _check_number("retry_max_wait_s", self.retry_max_wait_s)
        _check_number("retry_initial_wait_s", self.retry_initial_wait_s)
        for name in ("temperature", "input_price_per_mtok", "output_price_per_mtok", "cost_budget_usd"):
            if getattr(self, name) is not None:
                _check_number(name, getattr(self, name))
        prices_known = self.input_price_per_mtok is not None and self.output_price_per_mtok is not None
        if self.cost_budget_usd is not None and not prices_known:
            raise ValueError(
                "cost_budget_usd needs both input_price_per_mtok and output_price_per_mtok to estimate spend; "
                "set KFORGE_LLM_INPUT_PRICE and KFORGE_LLM_OUTPUT_PRICE (USD per million tokens)"
            )
        effort = self.reasoning_effort
        if effort is not None and (not isinstance(effort, str) or not effort):
            raise ValueError(f"reasoning_effort must be a non-empty string or None, got {self.reasoning_effort!r}")
        if not isinstance(self.extra_body, Mapping):
            raise ValueError(f"extra_body must be a mapping, got {type(self.extra_body).__name__}")
        clashes = sorted(_OWNED_BODY_KEYS.intersection(self.extra_body))
        if clashes:
            raise ValueError(f"extra_body sets {clashes}, which dedicated LLMConfig fields own; use those fields")
        extra = dict(self.extra_body)
        try:
            json.dumps(extra, sort_keys=True)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"extra_body must be JSON-serialisable: {exc}") from exc
        object.__setattr__(self, "extra_body", extra)

    # -- construction from the environment ------------------------------------------------------------------
    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> LLMConfig:
        """Config from KFORGE_* / OPENAI_* variables (see the module docstring); keyword overrides win.

        `environ` defaults to `os.environ`. A malformed variable raises ValueError naming it, unless an override
        replaces that field.
        """
        env = os.environ if environ is None else environ
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise TypeError(f"unknown LLMConfig field(s) {unknown}; known fields: {sorted(known)}")

        def text(*names: str) -> str | None:
            for name in names:
                value = env.get(name)
                if value is not None and value.strip():
                    return value.strip()
            return None

        values: dict[str, Any] = {}
        readers = {
            "model": lambda: text("KFORGE_LLM_MODEL"),
            "base_url": lambda: text("KFORGE_LLM_BASE_URL", "OPENAI_BASE_URL"),
            "api_key": lambda: text("KFORGE_LLM_API_KEY", "OPENAI_API_KEY"),
            "cassette": lambda: text("KFORGE_CASSETTE"),
            "cassette_mode": lambda: _parse_mode(text("KFORGE_CASSETTE_MODE")),
            "cache_dir": lambda: text("KFORGE_CACHE_DIR"),
            "input_price_per_mtok": lambda: _parse_float(env, "KFORGE_LLM_INPUT_PRICE"),
            "output_price_per_mtok": lambda: _parse_float(env, "KFORGE_LLM_OUTPUT_PRICE"),
            "cost_budget_usd": lambda: _parse_float(env, "KFORGE_LLM_BUDGET_USD"),
            "reasoning_effort": lambda: text("KFORGE_LLM_REASONING_EFFORT"),
            "max_completion_tokens": lambda: _parse_positive_int(env, "KFORGE_LLM_MAX_COMPLETION_TOKENS"),
            "request_timeout_s": lambda: parse_timeout(env.get("KFORGE_LLM_TIMEOUT"), "KFORGE_LLM_TIMEOUT"),
            "max_retries": lambda: parse_max_retries(env.get("KFORGE_LLM_MAX_RETRIES"), "KFORGE_LLM_MAX_RETRIES"),
        }
        for name, read in readers.items():
            if name in overrides:
                continue
            value = read()
            if value is not None:
                values[name] = value
        values.update(overrides)
        return cls(**values)

    # -- derived facts ---------------------------------------------------------------------------------------
    @property
    def is_configured(self) -> bool:
        """True when calls can be served: an endpoint (base_url or api_key, with a model) or a cassette."""
        return self.cassette is not None or (bool(self.model) and bool(self.base_url or self.api_key))

    def resolved_cassette_mode(self) -> CassetteMode | None:
        """The effective cassette mode: the explicit one, else replay if the cassette file exists, else record."""
        if self.cassette is None:
            return None
        if self.cassette_mode is not None:
            return self.cassette_mode
        return "replay" if self.cassette.exists() else "record"

    def generation_parameters(self) -> dict[str, Any]:
        """The parameters that affect the reply (None = not sent): temperature, token limits, effort, extra_body."""
        return {
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "max_completion_tokens": self.max_completion_tokens,
            "reasoning_effort": self.reasoning_effort,
            "extra_body": dict(self.extra_body),
        }

    def fingerprint(self) -> str:
        """Stable string of the model and generation parameters, for cache keys (no endpoint, no secrets)."""
        payload = {"model": self.model, **self.generation_parameters()}
        return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)

    def __repr__(self) -> str:
        parts = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "api_key" and value is not None:
                parts.append("api_key='***'")
            else:
                parts.append(f"{f.name}={value!r}")
        return f"LLMConfig({', '.join(parts)})"


def _check_number(name: str, value: Any, *, positive: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise ValueError(f"{name} must be {'> 0' if positive else '>= 0'}, got {value!r}")


def _parse_mode(value: str | None) -> CassetteMode | None:
    if value is None or value.lower() == "auto":
        return None
    mode = value.lower()
    if mode not in CASSETTE_MODES:
        raise ValueError(f"KFORGE_CASSETTE_MODE={value!r} is not one of 'record', 'replay', 'auto'")
    return mode  # type: ignore[return-value]


def _parse_float(env: Mapping[str, str], name: str) -> float | None:
    return env_float(name, minimum=0, hint="give USD as a plain number, such as 2.5", environ=env)


def _parse_positive_int(env: Mapping[str, str], name: str) -> int | None:
    return env_int(name, minimum=1, hint="give a token count, such as 16384", environ=env)


def parse_timeout(raw: str | None, name: str) -> float | None:
    """Seconds > 0 from the text of `name` (an environment variable or a CLI flag); None when unset or blank."""
    if raw is None or not str(raw).strip():
        return None
    return parse_float(raw, name, above=0, what="a number of seconds",
                       hint="give the total deadline of one LLM request, such as 600")


def parse_max_retries(raw: str | None, name: str) -> int | None:
    """An integer >= 0 from the text of `name` (an environment variable or a CLI flag); None when unset or blank."""
    if raw is None or not str(raw).strip():
        return None
    return parse_int(raw, name, minimum=0, hint="give how many times a failed LLM request is retried, such as 6 "
                     "(0 = never)")
