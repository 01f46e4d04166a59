"""Metering of attempts that fail after the endpoint may have generated tokens, through the real openai SDK against
the loopback server: a slow reply past the deadline, a reply trickling a byte at a time, a connection dropped
mid-reply, a cancelled call, a gateway timeout; retries each count, the budget counts the estimates, and a refused
connection (nothing sent) or an error status (nothing generated) is recorded at zero tokens."""

from __future__ import annotations

import math
import pickle
import threading

import pytest

from agent.llm import (
    LLMClient,
    LLMConfig,
    LLMError,
    LLMInterruptedError,
    TokenUsage,
    estimate_interrupted_usage,
)
from tests.agent.llm_server import ScriptedLLMServer, error, hang, rate_limited, raw_body, reply, trickle

MESSAGES = [
    {"role": "system", "content": "You write Triton kernels."},
    {"role": "user", "content": "Write kernel_function for torch.nn.functional.relu."},
]
CODE_REPLY = "Here it is.\n```python\nimport triton\n\ndef kernel_function(x):\n    return x\n```\n"
PRICES = {"input_price_per_mtok": 2.0, "output_price_per_mtok": 8.0}


def make_client(server: ScriptedLLMServer, **overrides) -> LLMClient:
    settings = dict(model="test-model", base_url=server.base_url, api_key="sk-test", max_retries=0,
                    retry_initial_wait_s=0.01, retry_max_wait_s=0.05, request_timeout_s=0.5)
    settings.update(overrides)
    return LLMClient(LLMConfig(**settings))


def prompt_estimate() -> int:
    """The documented estimate, computed here independently: ceil(chars / 4) + 4 per message."""
    return sum(math.ceil(len(m["content"]) / 4) + 4 for m in MESSAGES)


def cost(prompt: int, completion: int) -> float:
    return (prompt * PRICES["input_price_per_mtok"] + completion * PRICES["output_price_per_mtok"]) / 1e6


# -- a slow reply past the deadline ----------------------------------------------------------------------------
def test_a_slow_reply_that_times_out_is_metered_as_a_flagged_estimate(scripted_llm):
    scripted_llm.push(hang(10, then=reply("too late")))
    client = make_client(scripted_llm, **PRICES)
    with pytest.raises(LLMInterruptedError) as info:
        client.complete(MESSAGES, tag="relu")
    assert info.value.kind == "timeout" and info.value.received_bytes == 0
    expected = TokenUsage(prompt_tokens=prompt_estimate(), completion_tokens=0, total_tokens=prompt_estimate())
    assert info.value.usage == expected and info.value.usage_estimated
    (record,) = client.usage.records
    assert (record.outcome, record.error, record.completion_estimate) == ("interrupted", "timeout", "received")
    assert record.usage == expected and record.usage_estimated
    assert record.cost_usd == pytest.approx(cost(prompt_estimate(), 0))
    summary = client.usage.summary()
    assert (summary["calls"], summary["failed_calls"], summary["estimated_calls"]) == (1, 1, 1)
    assert (summary["interrupted_calls"], summary["lower_bound_calls"]) == (1, 1)
    assert summary["per_tag"]["relu"]["interrupted_calls"] == 1
    assert client.usage.spent_usd == pytest.approx(cost(prompt_estimate(), 0))
    assert list(client.usage.to_dataframe()["outcome"]) == ["interrupted"]


@pytest.mark.parametrize("limit", [{"max_completion_tokens": 1000}, {"max_tokens": 300}])
def test_a_slow_reply_with_a_token_limit_is_charged_the_limit(scripted_llm, limit):
    scripted_llm.push(hang(10))
    client = make_client(scripted_llm, **PRICES, **limit)
    with pytest.raises(LLMInterruptedError):
        client.complete(MESSAGES)
    (bound,) = limit.values()
    (record,) = client.usage.records
    assert record.usage.completion_tokens == bound and record.completion_estimate == "limit"
    assert record.usage.prompt_tokens == prompt_estimate() and record.usage_estimated
    assert record.cost_usd == pytest.approx(cost(prompt_estimate(), bound))
    summary = client.usage.summary()
    assert (summary["interrupted_calls"], summary["lower_bound_calls"]) == (1, 0)


# -- a reply trickling in, cut off at the deadline -------------------------------------------------------------
def test_a_drip_cut_off_at_the_deadline_is_charged_what_arrived(scripted_llm):
    scripted_llm.push(trickle(reply(CODE_REPLY), interval_s=0.05))  # ~400 bytes: ~20 s at this pace
    client = make_client(scripted_llm, request_timeout_s=1.0, **PRICES)
    with pytest.raises(LLMInterruptedError) as info:
        client.complete(MESSAGES)
    received = info.value.received_bytes
    assert info.value.kind == "timeout" and "1 s deadline" in info.value.message
    assert 1 <= received <= 20  # the server waits 0.05 s before each byte, and the deadline is 1 s
    (record,) = client.usage.records
    assert record.outcome == "interrupted" and record.usage_estimated and record.completion_estimate == "received"
    assert record.usage.completion_tokens == math.ceil(received / 4)  # the bytes that arrived, ~4 per token
    assert record.usage.prompt_tokens == prompt_estimate() and record.usage == info.value.usage


def test_a_drip_cut_off_with_a_token_limit_is_charged_the_limit(scripted_llm):
    scripted_llm.push(trickle(reply(CODE_REPLY), interval_s=0.05))
    client = make_client(scripted_llm, request_timeout_s=0.6, max_completion_tokens=500)
    with pytest.raises(LLMInterruptedError) as info:
        client.complete(MESSAGES)
    assert info.value.received_bytes >= 1
    (record,) = client.usage.records
    assert record.usage.completion_tokens == 500 and record.completion_estimate == "limit"


def test_counts_that_arrived_before_the_cut_are_metered_as_reported(scripted_llm):
    body = b'{"usage": {"prompt_tokens": 700, "completion_tokens": 800}, "choices": [' + b" " * 5000
    scripted_llm.push(trickle(raw_body(body), interval_s=0.001))  # the counts in ~0.06 s, the rest in ~5 s
    client = make_client(scripted_llm, request_timeout_s=0.5, max_completion_tokens=4000)
    with pytest.raises(LLMInterruptedError) as info:
        client.complete(MESSAGES)
    assert info.value.usage == TokenUsage(prompt_tokens=700, completion_tokens=800, total_tokens=1500)
    (record,) = client.usage.records
    assert record.outcome == "interrupted" and not record.usage_estimated and record.completion_estimate is None


# -- every attempt counts --------------------------------------------------------------------------------------
def test_every_timed_out_attempt_is_metered_not_only_the_last(scripted_llm):
    scripted_llm.push(hang(10), trickle(reply(CODE_REPLY), interval_s=0.05),
                      reply("ok", usage={"prompt_tokens": 10, "completion_tokens": 2}))
    client = make_client(scripted_llm, max_retries=2, **PRICES)
    assert client.complete(MESSAGES, tag="relu").text == "ok"
    records = client.usage.records
    assert [r.outcome for r in records] == ["interrupted", "interrupted", "reply"]
    assert [r.error for r in records] == ["timeout", "timeout", None]
    summary = client.usage.summary()
    assert (summary["calls"], summary["interrupted_calls"], summary["estimated_calls"]) == (3, 2, 2)
    assert summary["prompt_tokens"] == 2 * prompt_estimate() + 10
    assert summary["cost_usd"] == pytest.approx(sum(r.cost_usd for r in records)) and records[1].cost_usd > 0


def test_each_attempt_of_a_call_that_keeps_timing_out_is_charged(scripted_llm):
    scripted_llm.push(hang(10), hang(10), hang(10))
    client = make_client(scripted_llm, request_timeout_s=0.3, max_retries=2, max_completion_tokens=100)
    with pytest.raises(LLMInterruptedError) as info:
        client.complete(MESSAGES)
    assert info.value.kind == "timeout" and len(scripted_llm.requests) == 3
    assert [r.outcome for r in client.usage.records] == ["interrupted"] * 3
    assert client.usage.total().total_tokens == 3 * (prompt_estimate() + 100)


# -- the budget ------------------------------------------------------------------------------------------------
def test_the_budget_stops_a_run_of_timeouts_on_estimates_alone(scripted_llm):
    scripted_llm.responder = lambda body: hang(10)
    per_attempt = cost(prompt_estimate(), 0)  # nothing arrives and no limit is sent: the prompt alone
    client = make_client(scripted_llm, request_timeout_s=0.3, max_retries=6, cost_budget_usd=1.5 * per_attempt,
                         **PRICES)
    with pytest.raises(LLMError) as info:
        client.complete(MESSAGES)
    assert info.value.kind == "budget"
    assert len(scripted_llm.requests) == 2  # 1x the cost < 1.5x allows a retry; 2x stops the third attempt
    assert all(r.outcome == "interrupted" and r.usage_estimated for r in client.usage.records)
    assert client.usage.spent_usd == pytest.approx(2 * per_attempt)
    with pytest.raises(LLMError) as again:
        client.complete(MESSAGES)
    assert again.value.kind == "budget" and len(scripted_llm.requests) == 2


# -- a dropped connection, a cancelled call ---------------------------------------------------------------------
def test_a_connection_dropped_mid_reply_is_a_typed_interrupted_error():
    server = ScriptedLLMServer([trickle(reply(CODE_REPLY), interval_s=0.02)]).start()
    try:
        client = make_client(server, request_timeout_s=30.0)
        stopper = threading.Timer(0.5, server.shutdown)  # ends the trickle: the connection closes mid-body
        stopper.start()
        with pytest.raises(LLMInterruptedError) as info:
            client.complete(MESSAGES)
        stopper.join()
    finally:
        server.shutdown()
    assert info.value.kind == "connection" and "dropped" in info.value.message
    received = info.value.received_bytes
    assert 1 <= received < len(CODE_REPLY)
    (record,) = client.usage.records
    assert (record.outcome, record.error) == ("interrupted", "connection")
    assert record.usage.completion_tokens == math.ceil(received / 4) and record.usage_estimated


def test_a_cancelled_in_flight_call_is_metered(scripted_llm):
    scripted_llm.push(hang(60))
    client = make_client(scripted_llm, request_timeout_s=120.0, max_completion_tokens=256)
    outcome: dict = {}

    def run() -> None:
        try:
            client.complete(MESSAGES, tag="relu")
        except LLMError as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    for _ in range(500):
        if scripted_llm.requests:
            break
        threading.Event().wait(0.01)
    client.cancel()
    thread.join(timeout=10)
    assert isinstance(outcome["error"], LLMInterruptedError) and outcome["error"].kind == "cancelled"
    (record,) = client.usage.records
    assert (record.outcome, record.error, record.tag) == ("interrupted", "cancelled", "relu")
    assert record.usage.total_tokens == prompt_estimate() + 256 and record.usage_estimated


# -- nothing sent, nothing generated ---------------------------------------------------------------------------
def test_a_refused_connection_is_recorded_and_charges_nothing():
    with ScriptedLLMServer() as server:
        client = make_client(server, max_retries=1, cost_budget_usd=1e-9, max_completion_tokens=1000, **PRICES)
    with pytest.raises(LLMError) as info:  # the listening socket is closed: every attempt is refused
        client.complete(MESSAGES)
    assert info.value.kind == "connection" and not isinstance(info.value, LLMInterruptedError)
    records = client.usage.records
    assert [(r.outcome, r.error) for r in records] == [("unsent", "connection")] * 2
    assert all(r.usage == TokenUsage() and not r.usage_estimated and r.cost_usd == 0.0 for r in records)
    summary = client.usage.summary()
    assert (summary["calls"], summary["unsent_calls"], summary["failed_calls"]) == (2, 2, 2)
    assert (summary["prompt_tokens"], summary["completion_tokens"], summary["estimated_calls"]) == (0, 0, 0)
    assert client.usage.spent_usd == 0.0


def test_error_statuses_are_recorded_unbilled_and_a_gateway_timeout_is_charged(scripted_llm):
    scripted_llm.push(rate_limited(retry_after=0), error(504),
                      reply("ok", usage={"prompt_tokens": 10, "completion_tokens": 2}))
    client = make_client(scripted_llm, max_retries=2, max_tokens=50, **PRICES)
    assert client.complete(MESSAGES).text == "ok"
    rejected, gateway, answered = client.usage.records
    assert (rejected.outcome, rejected.error, rejected.usage, rejected.cost_usd) == (
        "rejected", "rate_limited", TokenUsage(), 0.0)
    assert (gateway.outcome, gateway.error, gateway.completion_estimate) == ("interrupted", "server", "limit")
    assert gateway.usage.total_tokens == prompt_estimate() + 50 and gateway.usage_estimated
    assert answered.outcome == "reply"
    summary = client.usage.summary()
    assert (summary["calls"], summary["rejected_calls"], summary["interrupted_calls"]) == (3, 1, 1)


@pytest.mark.parametrize("status", [400, 401, 422])
def test_a_rejected_request_is_one_unbilled_call(scripted_llm, status):
    scripted_llm.push(error(status))
    client = make_client(scripted_llm, max_completion_tokens=1000, **PRICES)
    with pytest.raises(LLMError) as info:
        client.complete(MESSAGES)
    assert info.value.kind == "client"
    (record,) = client.usage.records
    assert (record.outcome, record.usage, record.cost_usd) == ("rejected", TokenUsage(), 0.0)


# -- the rule and the error on their own ------------------------------------------------------------------------
def test_the_interrupted_estimate_rule():
    prompt = prompt_estimate()
    assert estimate_interrupted_usage(MESSAGES, None, None) == (
        TokenUsage(prompt_tokens=prompt, total_tokens=prompt), "received")
    usage, basis = estimate_interrupted_usage(MESSAGES, "x" * 41, None)
    assert (usage.completion_tokens, basis) == (11, "received")
    usage, basis = estimate_interrupted_usage(MESSAGES, "x" * 41, 2048)
    assert (usage.completion_tokens, usage.total_tokens, basis) == (2048, prompt + 2048, "limit")
    usage, _ = estimate_interrupted_usage(MESSAGES, "x" * 400, 10)  # more arrived than the limit estimates
    assert usage.completion_tokens == 100


def test_interrupted_errors_pickle_with_their_usage():
    usage = TokenUsage(prompt_tokens=3, completion_tokens=4, total_tokens=7)
    err = LLMInterruptedError("timeout", "cut", None, usage=usage, usage_estimated=True, received_bytes=12)
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is LLMInterruptedError and isinstance(again, LLMError)
    assert (again.kind, again.message, again.usage, again.usage_estimated, again.received_bytes) == (
        "timeout", "cut", usage, True, 12)
