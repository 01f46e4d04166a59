"""Retry-After parsing, the retry wait, error kinds, and the usage meter on its own."""

from __future__ import annotations

import email.utils
import pickle
import random
import threading
from types import SimpleNamespace

import pytest

from agent.llm import LLMError, TokenUsage, UsageMeter, parse_retry_after
from agent.llm.retry import RetryWait


@pytest.mark.parametrize(
    "headers, expected",
    [
        ({"Retry-After": "3"}, 3.0),
        ({"retry-after": "0.5"}, 0.5),
        ({"Retry-After": "2", "retry-after-ms": "250"}, 0.25),  # milliseconds first
        ({"retry-after-ms": "bogus", "Retry-After": "4"}, 4.0),
        ({"Retry-After": "soon"}, None),
        ({"Retry-After": "-5"}, None),
        ({}, None),
        (None, None),
    ],
)
def test_parse_retry_after(headers, expected):
    assert parse_retry_after(headers) == expected


def test_parse_retry_after_http_date():
    now = 1_800_000_000.0
    header = email.utils.formatdate(now + 30, usegmt=True)
    assert parse_retry_after({"Retry-After": header}, now=now) == pytest.approx(30.0)
    past = email.utils.formatdate(now - 30, usegmt=True)
    assert parse_retry_after({"Retry-After": past}, now=now) == 0.0


def _state(attempt: int, headers: dict | None):
    exc = RuntimeError("x")
    if headers is not None:
        exc.response = SimpleNamespace(headers=headers)
    outcome = SimpleNamespace(exception=lambda: exc)
    return SimpleNamespace(attempt_number=attempt, outcome=outcome)


def test_retry_wait_backs_off_honours_retry_after_and_caps():
    wait = RetryWait(initial_s=1.0, max_wait_s=10.0, rng=random.Random(0))
    first, third = wait(_state(1, None)), wait(_state(3, None))
    assert 0.5 <= first <= 1.0 and 2.0 <= third <= 4.0
    assert wait(_state(1, {"Retry-After": "7"})) >= 7.0  # the server's wait is the minimum
    assert wait(_state(1, {"Retry-After": "500"})) == 10.0  # ...capped by max_wait_s
    assert wait(_state(20, None)) == 10.0


def test_llm_error_kinds_are_checked_and_pickle():
    with pytest.raises(ValueError, match="unknown LLMError kind"):
        LLMError(kind="oops", message="m")
    err = LLMError(kind="server", message="boom", status=503)
    again = pickle.loads(pickle.dumps(err))
    assert (again.kind, again.message, again.status) == ("server", "boom", 503)
    assert "HTTP 503" in str(err)


def test_token_usage_sums_and_converts():
    a = TokenUsage(prompt_tokens=3, completion_tokens=4, total_tokens=7)
    b = TokenUsage.from_dict({"prompt_tokens": 1, "completion_tokens": 2, "completion_tokens_details":
                              {"reasoning_tokens": 1}})
    total = a + b
    assert (total.prompt_tokens, total.completion_tokens, total.reasoning_tokens, total.total) == (4, 6, 1, 10)
    assert TokenUsage.from_dict(total.to_dict()) == total
    assert TokenUsage.from_dict(None) == TokenUsage()


def test_meter_is_thread_safe():
    meter = UsageMeter(input_price_per_mtok=1.0, output_price_per_mtok=1.0, budget_usd=0.01)
    usage = TokenUsage(prompt_tokens=5, completion_tokens=5, total_tokens=10)  # $0.00001 each

    def record_many() -> None:
        for _ in range(25):
            meter.record(tag="t", model="m", usage=usage, from_cassette=False, latency_s=0.0)

    threads = [threading.Thread(target=record_many) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert meter.summary()["calls"] == 100 and meter.total().total_tokens == 1000
    assert meter.spent_usd == pytest.approx(0.001)
    meter.check_budget()  # 0.001 of 0.01 spent: still allowed


def test_meter_refuses_once_spent_reaches_the_budget():
    meter = UsageMeter(input_price_per_mtok=1.0, output_price_per_mtok=1.0, budget_usd=0.5)
    meter.check_budget()
    meter.record(tag="t", model="m", usage=TokenUsage(prompt_tokens=500_000, total_tokens=500_000),
                 from_cassette=True, latency_s=0.0)
    with pytest.raises(LLMError) as info:
        meter.check_budget()
    assert info.value.kind == "budget"


def test_meter_without_prices_reports_no_cost_and_refuses_a_budget():
    meter = UsageMeter()
    meter.record(tag="t", model="m", usage=TokenUsage(prompt_tokens=5), from_cassette=False, latency_s=0.1)
    assert meter.spent_usd is None and meter.summary()["cost_usd"] is None
    meter.check_budget()
    with pytest.raises(ValueError, match="prices"):
        UsageMeter(budget_usd=1.0)
