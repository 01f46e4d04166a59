"""`LLMClient`: chat completions from an OpenAI-compatible endpoint, with retries, metering and a cassette.

`complete(messages, tag=...)` returns an `LLMReply` or raises `LLMError`. The SDK's own retries are off
(`max_retries=0`) and tenacity owns the policy (see `agent.llm.retry`), so attempts do not multiply.

Each request has a total deadline, `request_timeout_s` (KFORGE_LLM_TIMEOUT): the reply is read as a stream and the
caller gets `LLMError(kind="timeout")` once the deadline passes, however slowly the server trickles bytes (httpx's
timeouts are per read; a server sending one byte a second never trips them). The body is parsed here rather than by
the SDK, so a 200 reply that is not JSON or has no choices becomes `LLMMalformedReplyError` /
`LLMEmptyReplyError` (retried like a 5xx), metered first with the tokens it reported or an estimate. A reply
without `usage` is metered with an estimate from its text (`agent.llm.usage.estimate_usage`), flagged
`usage_estimated`, so a cost budget still stops the run.

Every attempt is metered, failed ones included (`UsageRecord.outcome`; the rules are in `agent.llm.usage`). What an
attempt got to is observed, not guessed from error text: the HTTP client's trace hook says whether the request body
was written, and the request thread notes the 2xx status and every chunk of the body as it arrives. An attempt
whose request was written and whose reply did not arrive in full (deadline, read timeout, dropped connection,
cancel, gateway timeout) is "interrupted" and charged an estimate; it raises `LLMInterruptedError`, which carries
that estimate (a gateway's 504 stays the SDK's status error, so its Retry-After is honoured). A request never
written (connection refused) is "unsent" and an HTTP error status "rejected": neither charged, both recorded.

A reply that stopped on the token limit (`finish_reason == "length"`) is returned, not raised: `reply.truncated`
is True and the caller decides (retry with a larger `max_completion_tokens`, ask for a shorter answer, or call
`reply.require_complete()` to turn it into `LLMError(kind="truncated")`). Truncated text must never be treated as
complete code.

In replay mode the SDK client is never constructed, so no network is touched. One client may be shared by
several threads. `cancel()` is terminal: pending retry waits stop at once, callers blocked on an in-flight request
return at once with `LLMError(kind="cancelled")` (the HTTP client is closed; the abandoned request finishes or
times out on its own daemon thread, unobserved), and every later call raises the same; `close()` does the same
without counting as a cancellation.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import openai
import tenacity

from agent.llm.cassette import Cassette, canonical_request
from agent.llm.config import LLMConfig
from agent.llm.errors import (
    LLMEmptyReplyError,
    LLMError,
    LLMInterruptedError,
    LLMMalformedReplyError,
    LLMReplyError,
)
from agent.llm.retry import ErrorClass, RetryWait, classify_exception, is_retryable, to_llm_error
from agent.llm.usage import (
    AttemptOutcome,
    CompletionEstimate,
    TokenUsage,
    UsageMeter,
    estimate_interrupted_usage,
    estimate_tokens,
    estimate_usage,
    usage_is_reported,
)

__all__ = ["LLMClient", "LLMReply"]

logger = logging.getLogger(__name__)

_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})

# A gateway (load balancer, CDN, proxy) answering these gave up waiting for an upstream that was still working on
# the request, so tokens may have been generated and billed: metered as interrupted, not rejected.
GATEWAY_TIMEOUT_STATUSES = frozenset({504, 524})


@dataclass(frozen=True)
class LLMReply:
    """One completion. `cost_usd` is None when prices are unknown; `reasoning` is the separated reasoning text
    (`reasoning_content` / `reasoning`) when the endpoint sent one; `usage_estimated` is True when the endpoint
    reported no usage and `usage` was estimated from the text."""

    text: str
    finish_reason: str | None
    model: str | None
    usage: TokenUsage
    cost_usd: float | None
    from_cassette: bool
    latency_s: float
    reasoning: str | None = None
    usage_estimated: bool = False

    @property
    def truncated(self) -> bool:
        """True when the reply stopped on the token limit: the text is incomplete."""
        return self.finish_reason == "length"

    def require_complete(self) -> LLMReply:
        """This reply, or `LLMError(kind="truncated")` when it stopped on the token limit."""
        if self.truncated:
            raise LLMError(
                kind="truncated",
                message=(
                    f"the reply stopped on the token limit after {self.usage.completion_tokens} completion tokens "
                    f"(reasoning: {self.usage.reasoning_tokens}); raise max_completion_tokens "
                    f"(KFORGE_LLM_MAX_COMPLETION_TOKENS) or ask for a shorter answer"
                ),
            )
        return self


class LLMClient:
    """Thread-safe chat-completion client over an `LLMConfig` (see the module docstring)."""

    def __init__(self, config: LLMConfig, *, meter: UsageMeter | None = None) -> None:
        if not isinstance(config, LLMConfig):
            raise TypeError(f"LLMClient needs an LLMConfig, got {type(config).__name__}")
        mode = config.resolved_cassette_mode()
        if mode != "replay" and not (config.model and (config.base_url or config.api_key)):
            raise ValueError(
                "LLMClient needs an endpoint: set KFORGE_LLM_MODEL and KFORGE_LLM_BASE_URL and/or KFORGE_LLM_API_KEY "
                f"(or replay an existing cassette with KFORGE_CASSETTE); got {config!r}"
            )
        self.config = config
        self.usage = meter if meter is not None else UsageMeter.from_config(config)
        self.cassette: Cassette | None = Cassette(config.cassette, mode) if mode is not None else None
        self._sdk: openai.OpenAI | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._waiters: set[threading.Event] = set()
        self._cancelled = False
        self._closed = False

    @classmethod
    def from_env(cls, *, meter: UsageMeter | None = None, **overrides: Any) -> LLMClient:
        """`LLMClient(LLMConfig.from_env(**overrides))`."""
        return cls(LLMConfig.from_env(**overrides), meter=meter)

    def __repr__(self) -> str:
        mode = self.cassette.mode if self.cassette else None
        return f"LLMClient(model={self.config.model!r}, base_url={self.config.base_url!r}, cassette_mode={mode!r})"

    @property
    def cassette_mode(self) -> str | None:
        return self.cassette.mode if self.cassette is not None else None

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    # -- lifecycle --------------------------------------------------------------------------------------------
    def _sdk_client(self) -> openai.OpenAI:
        with self._lock:
            self._raise_if_stopped()
            if self._sdk is None:
                self._sdk = openai.OpenAI(
                    base_url=self.config.base_url,
                    api_key=self.config.api_key or "unused",
                    max_retries=0,
                    timeout=self.config.request_timeout_s,
                    # the SDK's defaults, plus a hook that traces each request for the meter (was it written?)
                    http_client=openai.DefaultHttpxClient(event_hooks={"request": [_trace_attempt]}),
                )
            return self._sdk

    def _raise_if_stopped(self) -> None:
        if self._stop.is_set():
            what = "cancelled" if self._cancelled else "closed"
            raise LLMError(kind="cancelled", message=f"the LLM client was {what}; no further calls are made")

    def cancel(self) -> None:
        """Stop pending retries, abandon in-flight requests and refuse later calls (`LLMError` "cancelled")."""
        self._cancelled = True
        self._shutdown()

    def close(self) -> None:
        """Close the HTTP client and the cassette; later calls raise `LLMError(kind="cancelled")`."""
        self._closed = True
        self._shutdown()

    def _shutdown(self) -> None:
        self._stop.set()
        with self._lock:
            sdk, self._sdk = self._sdk, None
            for waiter in self._waiters:
                waiter.set()
        if sdk is not None:
            try:
                sdk.close()
            except Exception:  # closing under an in-flight request may complain; the request is abandoned anyway
                logger.debug("error closing the HTTP client", exc_info=True)
        if self.cassette is not None:
            self.cassette.close()

    def __enter__(self) -> LLMClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- calls ------------------------------------------------------------------------------------------------
    def complete(self, messages: Sequence[Mapping[str, Any]], *, tag: str = "") -> LLMReply:
        """One chat completion for `messages` (OpenAI-style dicts with "role" and "content").

        `tag` labels the call in the usage meter (the generator passes the function name). Raises `LLMError`
        (see `LLM_ERROR_KINDS`); a truncated reply is returned with `truncated=True`.
        """
        _check_messages(messages)
        self._raise_if_stopped()
        self.usage.check_budget()
        request = canonical_request(self.config.model, messages, self.config.generation_parameters())
        started = time.monotonic()
        if self.cassette is not None and self.cassette.mode == "replay":
            response = dict(self.cassette.lookup(request).response)
            from_cassette = True
        else:
            response = self._call_endpoint(request, tag)
            from_cassette = False
        latency = time.monotonic() - started
        text = response.get("text") or ""
        if usage_is_reported(response.get("usage")):
            usage, estimated = TokenUsage.from_dict(response.get("usage")), False
        else:
            usage, estimated = estimate_usage(request["messages"], text, response.get("reasoning")), True
            logger.debug("LLM reply for tag %r reported no usage; estimated %d tokens", tag, usage.total_tokens)
        if self.cassette is not None and self.cassette.mode == "record":
            try:
                self.cassette.record(request, response, tag=tag)
            except RuntimeError as exc:  # closed by close()/cancel() while this call was finishing
                if not self._stop.is_set():
                    raise
                raise self._cancelled_error() from exc
        record = self.usage.record(
            tag=tag,
            model=response.get("model") or self.config.model,
            usage=usage,
            from_cassette=from_cassette,
            latency_s=latency,
            finish_reason=response.get("finish_reason"),
            usage_estimated=estimated,
        )
        reply = LLMReply(
            text=text,
            finish_reason=response.get("finish_reason"),
            model=response.get("model") or self.config.model,
            usage=usage,
            cost_usd=record.cost_usd,
            from_cassette=from_cassette,
            latency_s=latency,
            reasoning=response.get("reasoning"),
            usage_estimated=estimated,
        )
        if reply.truncated:
            logger.info("LLM reply for tag %r stopped on the token limit (finish_reason=length)", tag)
        return reply

    def _call_endpoint(self, request: Mapping[str, Any], tag: str) -> dict[str, Any]:
        cfg = self.config
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(cfg.max_retries + 1),
            wait=RetryWait(initial_s=cfg.retry_initial_wait_s, max_wait_s=cfg.retry_max_wait_s),
            retry=tenacity.retry_if_exception(is_retryable),
            sleep=self._interruptible_sleep,
            before_sleep=_log_retry,
            reraise=True,
        )
        try:
            return retrying(self._attempt, request, tag)
        except LLMError:
            raise
        except openai.OpenAIError as exc:
            if self._stop.is_set():
                raise self._cancelled_error() from exc
            attempts = retrying.statistics.get("attempt_number")
            raise to_llm_error(exc, attempts=attempts) from exc

    def _cancelled_error(self) -> LLMError:
        what = "cancelled" if self._cancelled else "closed"
        return LLMError(kind="cancelled", message=f"the LLM client was {what} during the call")

    def _interruptible_sleep(self, seconds: float) -> None:
        if self._stop.wait(seconds):
            raise self._cancelled_error()

    def _attempt(self, request: Mapping[str, Any], tag: str) -> dict[str, Any]:
        self.usage.check_budget()  # again before every retry: unusable replies were metered too
        sdk = self._sdk_client()
        params = request["parameters"]
        kwargs: dict[str, Any] = {"model": request["model"], "messages": request["messages"]}
        if params["temperature"] is not None:
            kwargs["temperature"] = params["temperature"]
        if params["max_tokens"] is not None:
            kwargs["max_tokens"] = params["max_tokens"]
        # Sent through extra_body so that SDK versions without these named arguments still pass them on.
        body = dict(params["extra_body"])
        if params["max_completion_tokens"] is not None:
            body["max_completion_tokens"] = params["max_completion_tokens"]
        if params["reasoning_effort"] is not None:
            body["reasoning_effort"] = params["reasoning_effort"]
        if body:
            kwargs["extra_body"] = body
        started = time.monotonic()
        progress = _Progress()
        try:
            raw, status = self._fetch_within_deadline(sdk, kwargs, progress)
        except Exception as exc:
            failure = self._meter_failed_attempt(exc, progress.snapshot(), request, tag, time.monotonic() - started)
            if failure is exc:
                raise
            raise failure from exc
        try:
            return _response_from_body(raw, request["messages"], status)
        except LLMReplyError as exc:
            self.usage.record(tag=tag, model=self.config.model, usage=exc.usage or TokenUsage(), from_cassette=False,
                              latency_s=time.monotonic() - started, usage_estimated=exc.usage_estimated,
                              error=exc.kind)
            raise

    def _meter_failed_attempt(self, exc: Exception, state: _AttemptState, request: Mapping[str, Any], tag: str,
                              latency_s: float) -> Exception:
        """Record an attempt that raised `exc` (see `agent.llm.usage` for what each outcome is charged) and return
        the exception to raise: an `LLMInterruptedError` carrying the estimate for an interrupted attempt, else
        `exc` itself (SDK errors keep their response, whose Retry-After the retry wait reads)."""
        outcome = _failure_outcome(exc, state)
        if outcome is None:  # the request thread never started: no attempt was made
            return exc
        failed = classify_exception(exc)  # kind and status, as the retry policy sees them
        usage, estimated, basis = TokenUsage(), False, None
        if outcome == "interrupted":
            usage, estimated, basis = _interrupted_usage(request, state.body)
        elif outcome == "rejected":
            usage = _error_body_usage(exc) or TokenUsage()
        self.usage.record(tag=tag, model=self.config.model, usage=usage, from_cassette=False, latency_s=latency_s,
                          usage_estimated=estimated, error=failed.kind, outcome=outcome, completion_estimate=basis)
        if outcome != "interrupted" or isinstance(exc, openai.APIStatusError):
            return exc
        return _interrupted_error(exc, failed, usage, estimated, basis, len(state.body))

    def _fetch_within_deadline(self, sdk: openai.OpenAI, kwargs: dict[str, Any],
                               progress: _Progress) -> tuple[bytes, int]:
        """The raw body and status of a 2xx reply, read in full before `request_timeout_s` has passed.

        Error statuses raise the SDK's `APIStatusError`s (classified by `agent.llm.retry`); a connection dropped
        mid-body raises `LLMError("connection")`. The request runs on a daemon thread that the caller stops waiting
        for at the deadline or on `cancel()`; the thread itself stops reading at the first chunk after the deadline
        (or on httpx's per-read timeout) and closes the response. `progress` follows what the attempt got to.
        """
        timeout_s = self.config.request_timeout_s
        deadline = time.monotonic() + timeout_s

        def fetch() -> tuple[bytes, int]:
            _ATTEMPT.progress = progress
            progress.begin()
            with sdk.chat.completions.with_streaming_response.create(**kwargs) as response:
                progress.respond(response.status_code)
                try:
                    for chunk in response.iter_bytes():
                        progress.receive(chunk)
                        if time.monotonic() > deadline:
                            raise _deadline_error(timeout_s, len(progress.snapshot().body))
                except LLMError:
                    raise
                except Exception as exc:  # the HTTP library's transport error: the body was cut off
                    raise LLMError(kind="connection", message=(
                        f"the connection dropped after {len(progress.snapshot().body)} bytes of the reply "
                        f"({type(exc).__name__}: {exc}); check the server or the proxy in front of it")) from exc
                return progress.snapshot().body, response.status_code

        return self._run_abandonable(fetch, deadline, timeout_s)

    def _run_abandonable(self, work: Any, deadline: float, timeout_s: float) -> Any:
        """`work()` on a daemon thread, so that `cancel()` or the deadline can abandon it at once.

        Closing an httpx client does not interrupt a request blocked on another thread; the caller therefore waits
        for the request, the stop signal or the deadline, and an abandoned request finishes (or times out) unobserved.
        """
        wake = threading.Event()
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["result"] = work()
            except BaseException as exc:  # handed to the waiting caller
                box["error"] = exc
            finally:
                wake.set()

        with self._lock:
            self._raise_if_stopped()
            self._waiters.add(wake)
        try:
            threading.Thread(target=run, name="kforge-llm-request", daemon=True).start()
            finished = wake.wait(max(0.0, deadline - time.monotonic()))
        finally:
            with self._lock:
                self._waiters.discard(wake)
        if "result" in box:
            return box["result"]
        if self._stop.is_set():
            raise self._cancelled_error() from box.get("error")
        if "error" in box:
            raise box["error"]
        if not finished:
            raise _deadline_error(timeout_s, None)
        raise self._cancelled_error()


_ATTEMPT = threading.local()  # the `_Progress` of the attempt running on this request thread


@dataclass(frozen=True)
class _AttemptState:
    """What one attempt had got to when it failed (a snapshot of `_Progress`).

    `traced`: the HTTP client reported connection events; `sent`: it finished writing the request body;
    `status`: the 2xx status whose body was being read (None before the headers); `body`: the bytes read."""

    began: bool = False
    traced: bool = False
    sent: bool = False
    status: int | None = None
    body: bytes = b""

    @property
    def may_have_reached_endpoint(self) -> bool:
        """True unless the HTTP client's trace shows the request body was never written. Without any trace event
        (a transport that does not report them) the request may have gone out: counted as reached."""
        return self.sent or self.status is not None or (self.began and not self.traced)


class _Progress:
    """Progress of one attempt, written by its request thread and read by the caller when the attempt fails."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._began = self._traced = self._sent = False
        self._status: int | None = None
        self._chunks: list[bytes] = []

    def begin(self) -> None:
        with self._lock:
            self._began = True

    def trace(self, event: str, info: Mapping[str, Any]) -> None:
        """httpcore's `trace` extension callback: "<http11|http2>.send_request_body.complete" once the request
        body is written (the endpoint can then process it)."""
        with self._lock:
            self._traced = True
            if event.endswith("send_request_body.complete"):
                self._sent = True

    def respond(self, status: int) -> None:
        with self._lock:
            self._status = status

    def receive(self, chunk: bytes) -> None:
        with self._lock:
            self._chunks.append(chunk)

    def snapshot(self) -> _AttemptState:
        with self._lock:
            return _AttemptState(began=self._began, traced=self._traced, sent=self._sent, status=self._status,
                                 body=b"".join(self._chunks))


def _trace_attempt(request: Any) -> None:
    """httpx `request` event hook: trace the request on behalf of the attempt running on this thread."""
    progress = getattr(_ATTEMPT, "progress", None)
    if progress is not None:
        request.extensions["trace"] = progress.trace


def _failure_outcome(exc: BaseException, state: _AttemptState) -> AttemptOutcome | None:
    """How a failed attempt is metered; None when its request thread never started."""
    if isinstance(exc, openai.APIStatusError):
        return "interrupted" if exc.status_code in GATEWAY_TIMEOUT_STATUSES else "rejected"
    if not state.began:
        return None
    return "interrupted" if state.may_have_reached_endpoint else "unsent"


_BASIS_NOTES: dict[CompletionEstimate | None, str] = {
    "limit": "an upper bound: completion at the request's token limit",
    "received": "a lower bound: completion from the bytes received, no token limit was sent",
    None: "counts found in the cut-off body",
}


def _completion_limit(request: Mapping[str, Any]) -> int | None:
    params = request["parameters"]
    limit = params.get("max_completion_tokens")
    return limit if limit is not None else params.get("max_tokens")


def _interrupted_usage(request: Mapping[str, Any], body: bytes) -> tuple[TokenUsage, bool, CompletionEstimate | None]:
    """Tokens to meter for an interrupted attempt, whether they are estimated, and the completion estimate's basis
    (None when the cut-off body carried counts of its own)."""
    reported = _reported_usage(_salvaged_usage(body)) if body else None
    if reported is not None:
        return reported, False, None
    received = body.decode("utf-8", errors="replace") if body else None
    usage, basis = estimate_interrupted_usage(request["messages"], received, _completion_limit(request))
    return usage, True, basis


def _interrupted_error(exc: BaseException, failed: ErrorClass, usage: TokenUsage, estimated: bool,
                       basis: CompletionEstimate | None, received_bytes: int) -> LLMInterruptedError:
    """The typed error of an interrupted attempt: `exc`'s message plus what was metered for it."""
    if isinstance(exc, LLMError):
        base = exc.message
    elif failed.kind == "connection":  # not "could not be reached": the request had been written
        base = (f"{type(exc).__name__}: the connection closed after the request was sent, before a complete "
                "reply; check the server or the proxy in front of it")
    else:
        base = to_llm_error(exc).message
    metered = (f"metered {'~' if estimated else ''}{usage.prompt_tokens} prompt + {usage.completion_tokens} "
               f"completion tokens ({_BASIS_NOTES[basis]}); {received_bytes} bytes of the reply had arrived")
    return LLMInterruptedError(failed.kind, f"{base} [{metered}]", failed.status, usage=usage,
                               usage_estimated=estimated, received_bytes=received_bytes)


def _error_body_usage(exc: BaseException) -> TokenUsage | None:
    """The usage an HTTP error's JSON body reports, if any (OpenAI-compatible endpoints send none)."""
    body = getattr(exc, "body", None)
    return _reported_usage(body.get("usage")) if isinstance(body, Mapping) else None


def _deadline_error(timeout_s: float, received: int | None) -> LLMError:
    got = "no complete reply" if received is None else f"only {received} bytes of the reply"
    return LLMError(kind="timeout", message=(
        f"{got} within the {timeout_s:g} s deadline of one request; raise request_timeout_s (KFORGE_LLM_TIMEOUT, "
        "--llm-timeout) or check the server"))


def _check_messages(messages: Sequence[Mapping[str, Any]]) -> None:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise ValueError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or "role" not in message or "content" not in message:
            raise ValueError(f"messages[{i}] must be a dict with 'role' and 'content', got {message!r:.200}")
        if message["role"] not in _ROLES:
            raise ValueError(f"messages[{i}] has unknown role {message['role']!r}; expected one of {sorted(_ROLES)}")


_USAGE_FIELD = re.compile(rb'"(prompt_tokens|completion_tokens)"\s*:\s*(\d+)')


def _reported_usage(data: Any) -> TokenUsage | None:
    """The usage a reply reported, or None when it reported none (or nonsense)."""
    if not usage_is_reported(data):
        return None
    try:
        return TokenUsage.from_dict(data)
    except (TypeError, ValueError, AttributeError):
        return None


def _unusable_usage(reported: Any, messages: Sequence[Mapping[str, Any]], body: bytes) -> tuple[TokenUsage, bool]:
    """Tokens to meter for an unusable reply: the reported ones, else an estimate (prompt, and the body's text for
    a body that is not JSON: a proxy that cut a long answer short was still billed for it)."""
    usage = _reported_usage(reported)
    if usage is not None:
        return usage, False
    estimate = estimate_usage(messages, None)
    extra = estimate_tokens(body.decode("utf-8", errors="replace")) if reported is None and body else 0
    return TokenUsage(prompt_tokens=estimate.prompt_tokens, completion_tokens=extra,
                      total_tokens=estimate.prompt_tokens + extra), True


def _salvaged_usage(body: bytes) -> dict[str, int] | None:
    """Usage counts found in a body that is not valid JSON (e.g. cut short after the usage object)."""
    found = {name.decode(): int(value) for name, value in _USAGE_FIELD.findall(body)}
    return found or None


def _excerpt(body: bytes) -> str:
    """The whole body when short, else its start and its end (where a cut-off body stops)."""
    if len(body) <= 240:
        return repr(body)
    return f"{body[:160]!r} ... {body[-60:]!r} ({len(body)} bytes)"


def _response_from_body(body: bytes, messages: Sequence[Mapping[str, Any]], status: int) -> dict[str, Any]:
    """The cassette/LLMReply view of a raw chat-completion body; `LLMReplyError` when it cannot be used."""
    try:
        data = json.loads(body)
    except ValueError as exc:  # JSONDecodeError, or bytes that are not UTF-8
        usage, estimated = _unusable_usage(_salvaged_usage(body), messages, body)
        raise LLMMalformedReplyError(
            f"the endpoint answered HTTP {status} with a body that is not JSON ({exc}): {_excerpt(body)}",
            status, usage, estimated) from None
    if not isinstance(data, dict):
        usage, estimated = _unusable_usage(None, messages, b"")
        raise LLMMalformedReplyError(
            f"the endpoint answered HTTP {status} with JSON {type(data).__name__}, not a chat-completion object",
            status, usage, estimated)
    reported = data.get("usage")
    choices = data.get("choices")
    if isinstance(choices, list) and not choices:
        usage, estimated = _unusable_usage(reported, messages, b"")
        raise LLMEmptyReplyError(
            f"the endpoint answered HTTP {status} with an empty 'choices' list (reported usage: {reported!r:.200})",
            status, usage, estimated)
    choice = choices[0] if isinstance(choices, list) else None
    message = choice.get("message") if isinstance(choice, dict) else None
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(message, dict) or not (content is None or isinstance(content, (str, list))):
        usage, estimated = _unusable_usage(reported, messages, b"")
        problem = data.get("error") if "error" in data else f"choices: {choices!r:.200}"
        raise LLMMalformedReplyError(
            f"the endpoint answered HTTP {status} with JSON that holds no chat message ({problem!s:.300})",
            status, usage, estimated)
    if isinstance(content, list):  # content parts: keep the text ones
        content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    finish_reason = choice.get("finish_reason")
    model = data.get("model")
    usage = _reported_usage(reported)
    response: dict[str, Any] = {
        "text": content or "",
        "finish_reason": finish_reason if isinstance(finish_reason, str) else None,
        "model": model if isinstance(model, str) else None,
        "usage": usage.to_dict() if usage is not None else None,
    }
    reasoning = _reasoning_text(message)
    if reasoning:
        response["reasoning"] = reasoning
    return response


def _reasoning_text(message: Mapping[str, Any]) -> str | None:
    for name in ("reasoning_content", "reasoning"):
        value = message.get(name)
        if isinstance(value, str) and value:
            return value
    return None


def _log_retry(retry_state: tenacity.RetryCallState) -> None:
    exc = retry_state.outcome.exception() if retry_state.outcome is not None else None
    wait = retry_state.next_action.sleep if retry_state.next_action is not None else 0.0
    logger.info("LLM call attempt %d failed (%s: %s); retrying in %.2fs", retry_state.attempt_number,
                type(exc).__name__, exc, wait)
