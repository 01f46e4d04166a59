"""LLMClient against a real loopback server through the real openai SDK: replies, retries, errors, cancel."""

from __future__ import annotations

import threading

import pytest

from agent.llm import LLMClient, LLMConfig, LLMError
from tests.agent.llm_server import (
    ScriptedLLMServer,
    error,
    hang,
    insufficient_quota,
    rate_limited,
    reply,
    server_error,
)

MESSAGES = [
    {"role": "system", "content": "You write Triton kernels."},
    {"role": "user", "content": "Write kernel_function for torch.nn.functional.relu."},
]
CODE_REPLY = "Here it is.\n```python\nimport triton\n\ndef kernel_function(x):\n    return x\n```\n"


def make_client(server: ScriptedLLMServer, **overrides) -> LLMClient:
    settings = dict(
        model="test-model",
        base_url=server.base_url,
        api_key="sk-test-secret",
        max_retries=2,
        retry_initial_wait_s=0.01,
        retry_max_wait_s=0.05,
        request_timeout_s=5.0,
    )
    settings.update(overrides)
    return LLMClient(LLMConfig(**settings))


def test_reply_with_usage_and_cost(scripted_llm):
    usage = {"prompt_tokens": 1000, "completion_tokens": 500, "reasoning_tokens": 200}
    scripted_llm.push(reply(CODE_REPLY, usage=usage))
    client = make_client(scripted_llm, input_price_per_mtok=2.0, output_price_per_mtok=8.0)
    answer = client.complete(MESSAGES, tag="relu")
    assert answer.text == CODE_REPLY
    assert answer.finish_reason == "stop" and not answer.truncated
    assert answer.model == "test-model"
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (1000, 500)
    assert answer.usage.reasoning_tokens == 200 and answer.usage.total == 1500
    assert answer.cost_usd == pytest.approx((1000 * 2.0 + 500 * 8.0) / 1e6)
    assert answer.from_cassette is False and answer.latency_s >= 0
    (body,) = scripted_llm.requests
    assert body["model"] == "test-model" and body["messages"] == MESSAGES
    for unsent in ("temperature", "max_tokens", "max_completion_tokens", "reasoning_effort"):
        assert unsent not in body
    assert scripted_llm.request_headers[0]["authorization"] == "Bearer sk-test-secret"


def test_cost_is_none_without_prices(scripted_llm):
    scripted_llm.push(reply("hi", usage={"prompt_tokens": 10, "completion_tokens": 2}))
    answer = make_client(scripted_llm).complete(MESSAGES)
    assert answer.cost_usd is None and answer.usage.total_tokens == 12


def test_429_waits_at_least_retry_after_then_succeeds(scripted_llm):
    scripted_llm.push(rate_limited(retry_after=1), reply("ok"))
    client = make_client(scripted_llm, retry_max_wait_s=5.0)
    assert client.complete(MESSAGES).text == "ok"
    assert len(scripted_llm.requests) == 2
    first, second = scripted_llm.request_times
    assert second - first >= 1.0  # the server's Retry-After is the minimum wait


def test_429_retry_after_ms_is_honoured(scripted_llm):
    scripted_llm.push(rate_limited(retry_after_ms=300), reply("ok"))
    assert make_client(scripted_llm, retry_max_wait_s=5.0).complete(MESSAGES).text == "ok"
    first, second = scripted_llm.request_times
    assert second - first >= 0.3


@pytest.mark.parametrize("status", [500, 503])
def test_5xx_past_the_retry_budget_raises_server(scripted_llm, status):
    scripted_llm.push(*[server_error(status)] * 3, reply("too late"))
    with pytest.raises(LLMError) as info:
        make_client(scripted_llm, max_retries=2).complete(MESSAGES)
    assert info.value.kind == "server" and info.value.status == status
    assert len(scripted_llm.requests) == 3  # 1 attempt + 2 retries, SDK retries off
    assert scripted_llm.pending_steps == 1


def test_5xx_then_success_within_budget(scripted_llm):
    scripted_llm.push(server_error(502), server_error(500), reply("recovered"))
    assert make_client(scripted_llm, max_retries=2).complete(MESSAGES).text == "recovered"


def test_rate_limited_past_the_budget_raises_rate_limited(scripted_llm):
    scripted_llm.push(rate_limited(retry_after=0), rate_limited(retry_after=0))
    with pytest.raises(LLMError) as info:
        make_client(scripted_llm, max_retries=1).complete(MESSAGES)
    assert info.value.kind == "rate_limited" and info.value.status == 429


def test_insufficient_quota_is_not_retried(scripted_llm):
    scripted_llm.push(insufficient_quota(), reply("never served"))
    with pytest.raises(LLMError) as info:
        make_client(scripted_llm).complete(MESSAGES)
    assert info.value.kind == "quota" and info.value.status == 429
    assert len(scripted_llm.requests) == 1


@pytest.mark.parametrize("status", [400, 401, 404, 422])
def test_other_4xx_is_not_retried(scripted_llm, status):
    body = {"error": {"message": "maximum context length exceeded", "type": "invalid_request_error",
                      "param": None, "code": "context_length_exceeded"}}
    scripted_llm.push(error(status, body=body), reply("never served"))
    with pytest.raises(LLMError) as info:
        make_client(scripted_llm).complete(MESSAGES)
    assert info.value.kind == "client" and info.value.status == status
    assert "maximum context length exceeded" in str(info.value)
    assert len(scripted_llm.requests) == 1


def test_finish_reason_length_is_returned_truncated(scripted_llm):
    scripted_llm.push(reply("```python\ndef kernel_function(x):\n    return", finish_reason="length"))
    answer = make_client(scripted_llm).complete(MESSAGES)
    assert answer.truncated and answer.finish_reason == "length"
    with pytest.raises(LLMError) as info:
        answer.require_complete()
    assert info.value.kind == "truncated" and "max_completion_tokens" in info.value.message
    assert len(scripted_llm.requests) == 1  # a truncated reply is never retried


def test_complete_reply_passes_require_complete(scripted_llm):
    scripted_llm.push(reply("done"))
    answer = make_client(scripted_llm).complete(MESSAGES)
    assert answer.require_complete() is answer


def test_reasoning_parameters_are_sent_when_set(scripted_llm):
    scripted_llm.push(reply("a"), reply("b"))
    make_client(scripted_llm, max_completion_tokens=2048, reasoning_effort="high", temperature=0.2,
                extra_body={"top_k": 20}).complete(MESSAGES)
    make_client(scripted_llm, max_tokens=512).complete(MESSAGES)
    reasoning_body, plain_body = scripted_llm.requests
    assert reasoning_body["max_completion_tokens"] == 2048
    assert reasoning_body["reasoning_effort"] == "high"
    assert reasoning_body["temperature"] == 0.2 and reasoning_body["top_k"] == 20
    assert "max_tokens" not in reasoning_body
    assert plain_body["max_tokens"] == 512
    assert "max_completion_tokens" not in plain_body and "reasoning_effort" not in plain_body


def test_reasoning_text_is_kept(scripted_llm):
    scripted_llm.push(reply("answer", reasoning="first I think"))
    assert make_client(scripted_llm).complete(MESSAGES).reasoning == "first I think"


def test_timeout_past_the_budget_raises_timeout(scripted_llm):
    scripted_llm.push(hang(10), hang(10))
    with pytest.raises(LLMError) as info:
        make_client(scripted_llm, request_timeout_s=0.3, max_retries=1).complete(MESSAGES)
    assert info.value.kind == "timeout"
    assert len(scripted_llm.requests) == 2


def test_unreachable_endpoint_raises_connection():
    with ScriptedLLMServer() as server:
        client = make_client(server, max_retries=1)
    with pytest.raises(LLMError) as info:
        client.complete(MESSAGES)
    assert info.value.kind == "connection"


def test_script_exhaustion_fails_fast(scripted_llm):
    with pytest.raises(LLMError) as info:
        make_client(scripted_llm).complete(MESSAGES)
    assert info.value.kind == "client" and "script exhausted" in str(info.value)


def _call_in_thread(client: LLMClient) -> tuple[threading.Thread, dict]:
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["reply"] = client.complete(MESSAGES)
        except LLMError as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def _wait_for_requests(server: ScriptedLLMServer, count: int) -> None:
    done = threading.Event()
    for _ in range(500):
        if len(server.requests) >= count:
            return
        done.wait(0.01)
    raise AssertionError(f"server saw {len(server.requests)} requests, expected {count}")


def test_cancel_stops_a_pending_retry_wait(scripted_llm):
    scripted_llm.push(rate_limited(retry_after=60), reply("never served"))
    client = make_client(scripted_llm, retry_max_wait_s=60.0)
    thread, outcome = _call_in_thread(client)
    _wait_for_requests(scripted_llm, 1)
    client.cancel()
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert outcome["error"].kind == "cancelled"
    assert len(scripted_llm.requests) == 1
    with pytest.raises(LLMError) as info:
        client.complete(MESSAGES)
    assert info.value.kind == "cancelled" and client.cancelled


def test_cancel_abandons_an_in_flight_call(scripted_llm):
    scripted_llm.push(hang(60))
    client = make_client(scripted_llm, request_timeout_s=120.0)
    thread, outcome = _call_in_thread(client)
    _wait_for_requests(scripted_llm, 1)
    client.cancel()
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert outcome["error"].kind == "cancelled"


def test_closed_client_refuses_calls(scripted_llm):
    scripted_llm.push(reply("one"))
    with make_client(scripted_llm) as client:
        assert client.complete(MESSAGES).text == "one"
    with pytest.raises(LLMError) as info:
        client.complete(MESSAGES)
    assert info.value.kind == "cancelled" and not client.cancelled


def test_threads_share_one_client(scripted_llm):
    scripted_llm.responder = lambda body: reply("echo: " + body["messages"][-1]["content"])
    client = make_client(scripted_llm)
    results: dict[int, str] = {}

    def ask(i: int) -> None:
        results[i] = client.complete([{"role": "user", "content": f"prompt {i}"}], tag=f"fn{i % 2}").text

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert results == {i: f"echo: prompt {i}" for i in range(8)}
    summary = client.usage.summary()
    assert summary["calls"] == 8
    assert summary["per_tag"]["fn0"]["calls"] == summary["per_tag"]["fn1"]["calls"] == 4


def test_budget_stops_calls(scripted_llm):
    usage = {"prompt_tokens": 1000, "completion_tokens": 500}  # $0.006 per call at these prices
    scripted_llm.responder = lambda body: reply("x", usage=usage)
    client = make_client(scripted_llm, input_price_per_mtok=2.0, output_price_per_mtok=8.0, cost_budget_usd=0.01)
    client.complete(MESSAGES)
    client.complete(MESSAGES)  # spent 0.006 < 0.01 before this call
    with pytest.raises(LLMError) as info:
        client.complete(MESSAGES)
    assert info.value.kind == "budget" and "0.0120" in info.value.message
    assert len(scripted_llm.requests) == 2  # the refused call never reached the endpoint


def test_usage_is_summed_per_tag(scripted_llm):
    scripted_llm.push(
        reply("a", usage={"prompt_tokens": 10, "completion_tokens": 5}),
        reply("b", usage={"prompt_tokens": 20, "completion_tokens": 7, "reasoning_tokens": 3}),
        reply("c", usage={"prompt_tokens": 30, "completion_tokens": 9}, finish_reason="length"),
    )
    client = make_client(scripted_llm, input_price_per_mtok=1.0, output_price_per_mtok=2.0)
    client.complete(MESSAGES, tag="relu")
    client.complete(MESSAGES, tag="relu")
    client.complete(MESSAGES, tag="softmax")
    per_tag = client.usage.by_tag()
    assert per_tag["relu"]["calls"] == 2
    assert (per_tag["relu"]["prompt_tokens"], per_tag["relu"]["completion_tokens"]) == (30, 12)
    assert per_tag["relu"]["reasoning_tokens"] == 3
    assert per_tag["relu"]["cost_usd"] == pytest.approx((30 * 1.0 + 12 * 2.0) / 1e6)
    assert per_tag["softmax"]["truncated_calls"] == 1
    summary = client.usage.summary()
    assert (summary["calls"], summary["prompt_tokens"], summary["completion_tokens"]) == (3, 60, 21)
    assert summary["cost_usd"] == pytest.approx((60 * 1.0 + 21 * 2.0) / 1e6)
    frame = client.usage.to_dataframe()
    assert list(frame["tag"]) == ["relu", "relu", "softmax"]
    assert frame["prompt_tokens"].sum() == 60


@pytest.mark.parametrize(
    "messages",
    [[], "hello", [{"role": "user"}], [{"role": "wizard", "content": "x"}]],
)
def test_bad_messages_are_rejected_before_any_request(scripted_llm, messages):
    with pytest.raises(ValueError):
        make_client(scripted_llm).complete(messages)
    assert scripted_llm.requests == []


def test_client_needs_an_endpoint_or_a_cassette():
    with pytest.raises(ValueError, match="KFORGE_LLM_MODEL"):
        LLMClient(LLMConfig(model="m"))
    with pytest.raises(ValueError, match="KFORGE_LLM_MODEL"):
        LLMClient(LLMConfig(base_url="http://127.0.0.1:9/v1"))
