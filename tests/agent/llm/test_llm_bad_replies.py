"""Unusable and slow replies through the real openai SDK against the loopback server: malformed JSON, empty
choices, missing usage, a server trickling a byte a second; and the deadline / retry settings (env, CLI)."""

from __future__ import annotations

import argparse
import math
import pickle
import time

import pytest

from agent.cli_support import add_generator_arguments, llm_call_overrides
from agent.llm import (
    LLMClient,
    LLMConfig,
    LLMEmptyReplyError,
    LLMError,
    LLMMalformedReplyError,
    LLMReplyError,
    TokenUsage,
    estimate_usage,
)
from tests.agent.llm_server import ScriptedLLMServer, empty_choices, malformed_json, raw_body, reply, trickle

MESSAGES = [
    {"role": "system", "content": "You write Triton kernels."},
    {"role": "user", "content": "Write kernel_function for torch.nn.functional.relu."},
]
CODE_REPLY = "Here it is.\n```python\nimport triton\n\ndef kernel_function(x):\n    return x\n```\n"
PRICES = {"input_price_per_mtok": 2.0, "output_price_per_mtok": 8.0}


def make_client(server: ScriptedLLMServer, **overrides) -> LLMClient:
    settings = dict(model="test-model", base_url=server.base_url, api_key="sk-test", max_retries=2,
                    retry_initial_wait_s=0.01, retry_max_wait_s=0.05, request_timeout_s=5.0)
    settings.update(overrides)
    return LLMClient(LLMConfig(**settings))


def prompt_estimate() -> int:
    """The documented estimate, computed here independently: ceil(chars / 4) + 4 per message."""
    return sum(math.ceil(len(m["content"]) / 4) + 4 for m in MESSAGES)


# -- malformed JSON ------------------------------------------------------------------------------------------
def test_malformed_json_is_a_typed_llm_error_and_every_attempt_is_metered(scripted_llm):
    scripted_llm.push(malformed_json(), malformed_json(), malformed_json(), reply("never served"))
    client = make_client(scripted_llm, max_retries=2)
    with pytest.raises(LLMMalformedReplyError) as info:
        client.complete(MESSAGES, tag="relu")
    assert isinstance(info.value, LLMReplyError) and isinstance(info.value, LLMError)
    assert info.value.kind == "malformed" and info.value.status == 200
    assert "not JSON" in info.value.message and "def kernel_fun" in info.value.message
    assert len(scripted_llm.requests) == 3  # retried like a 5xx, max_retries=2
    records = client.usage.records
    assert [r.error for r in records] == ["malformed"] * 3
    assert all(r.usage_estimated and r.usage.prompt_tokens == prompt_estimate() for r in records)
    assert all(r.usage.completion_tokens > 0 for r in records)  # the cut-off body counts as billed output
    summary = client.usage.summary()
    assert summary["failed_calls"] == 3 and summary["estimated_calls"] == 3


def test_malformed_json_with_reported_usage_meters_the_reported_tokens(scripted_llm):
    cut = b'{"usage": {"prompt_tokens": 700, "completion_tokens": 800}, "choices": [{"message": {"content": "x'
    scripted_llm.push(raw_body(cut))
    client = make_client(scripted_llm, max_retries=0, **PRICES)
    with pytest.raises(LLMMalformedReplyError) as info:
        client.complete(MESSAGES)
    assert info.value.usage == TokenUsage(prompt_tokens=700, completion_tokens=800, total_tokens=1500)
    assert not info.value.usage_estimated
    (record,) = client.usage.records
    assert record.usage.total_tokens == 1500 and not record.usage_estimated
    assert record.cost_usd == pytest.approx((700 * 2.0 + 800 * 8.0) / 1e6)


@pytest.mark.parametrize("body", [[1, 2], "just text", {"error": {"message": "upstream exploded"}},
                                  {"choices": [{"message": "not an object"}]}, {"choices": "nope"}])
def test_200_bodies_that_are_not_chat_completions_are_malformed(scripted_llm, body):
    scripted_llm.push(raw_body(body))
    with pytest.raises(LLMMalformedReplyError) as info:
        make_client(scripted_llm, max_retries=0).complete(MESSAGES)
    assert info.value.kind == "malformed"
    if isinstance(body, dict) and "error" in body:
        assert "upstream exploded" in info.value.message


def test_malformed_then_good_reply_recovers(scripted_llm):
    scripted_llm.push(malformed_json(), reply("ok"))
    client = make_client(scripted_llm)
    assert client.complete(MESSAGES).text == "ok"
    assert [r.error for r in client.usage.records] == ["malformed", None]


# -- empty choices -------------------------------------------------------------------------------------------
def test_empty_choices_are_an_llm_error_and_their_reported_tokens_are_metered(scripted_llm):
    usage = {"prompt_tokens": 1000, "completion_tokens": 500, "total_tokens": 1500}
    scripted_llm.push(*[empty_choices(usage)] * 3)
    client = make_client(scripted_llm, max_retries=2, **PRICES)
    with pytest.raises(LLMEmptyReplyError) as info:
        client.complete(MESSAGES, tag="softmax")
    assert info.value.kind == "empty" and "empty 'choices'" in info.value.message
    assert len(scripted_llm.requests) == 3
    summary = client.usage.summary()
    assert (summary["calls"], summary["failed_calls"], summary["estimated_calls"]) == (3, 3, 0)
    assert summary["total_tokens"] == 4500
    assert summary["cost_usd"] == pytest.approx(3 * (1000 * 2.0 + 500 * 8.0) / 1e6)
    assert summary["per_tag"]["softmax"]["total_tokens"] == 4500


def test_empty_choices_trip_the_budget_between_retries(scripted_llm):
    usage = {"prompt_tokens": 1000, "completion_tokens": 500}  # $0.006 per reply at these prices
    scripted_llm.responder = lambda body: empty_choices(usage)
    client = make_client(scripted_llm, max_retries=6, cost_budget_usd=0.01, **PRICES)
    with pytest.raises(LLMError) as info:
        client.complete(MESSAGES)
    assert info.value.kind == "budget"
    assert len(scripted_llm.requests) == 2  # 0.006 < 0.01 allows a retry; 0.012 stops the third attempt


def test_empty_choices_without_usage_are_estimated(scripted_llm):
    scripted_llm.push(empty_choices())
    client = make_client(scripted_llm, max_retries=0)
    with pytest.raises(LLMEmptyReplyError) as info:
        client.complete(MESSAGES)
    assert info.value.usage_estimated and info.value.usage.prompt_tokens == prompt_estimate()
    assert client.usage.records[0].usage_estimated


def test_reply_errors_pickle_with_their_usage():
    usage = TokenUsage(prompt_tokens=3, completion_tokens=4, total_tokens=7)
    for cls in (LLMMalformedReplyError, LLMEmptyReplyError):
        again = pickle.loads(pickle.dumps(cls("bad", 200, usage, True)))
        assert type(again) is cls and (again.message, again.status, again.usage, again.usage_estimated) == (
            "bad", 200, usage, True)


# -- missing usage -------------------------------------------------------------------------------------------
def test_reply_without_usage_is_estimated_flagged_and_costs_money(scripted_llm):
    scripted_llm.push(reply(CODE_REPLY, send_usage=False, reasoning="think think"))
    client = make_client(scripted_llm, **PRICES)
    answer = client.complete(MESSAGES, tag="relu")
    assert answer.text == CODE_REPLY and answer.usage_estimated
    completion = math.ceil(len(CODE_REPLY) / 4) + math.ceil(len("think think") / 4)
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (prompt_estimate(), completion)
    assert answer.usage == estimate_usage(MESSAGES, CODE_REPLY, "think think")
    assert answer.cost_usd is not None and answer.cost_usd > 0
    assert client.usage.summary()["estimated_calls"] == 1
    assert list(client.usage.to_dataframe()["usage_estimated"]) == [True]


def test_all_zero_usage_counts_as_missing(scripted_llm):
    scripted_llm.push(reply(CODE_REPLY, usage={"prompt_tokens": 0, "completion_tokens": 0}))
    answer = make_client(scripted_llm).complete(MESSAGES)
    assert answer.usage_estimated and answer.usage.total_tokens > 0


def test_reported_usage_is_not_flagged(scripted_llm):
    scripted_llm.push(reply("ok", usage={"prompt_tokens": 10, "completion_tokens": 2}))
    answer = make_client(scripted_llm).complete(MESSAGES)
    assert not answer.usage_estimated and answer.usage.total_tokens == 12


def test_budget_triggers_on_replies_without_usage(scripted_llm):
    # ~40 estimated tokens per call at $1000 per million tokens: each call costs ~$0.04, over the $0.01 budget.
    scripted_llm.responder = lambda body: reply(CODE_REPLY, send_usage=False)
    client = make_client(scripted_llm, input_price_per_mtok=1000.0, output_price_per_mtok=1000.0,
                         cost_budget_usd=0.01)
    client.complete(MESSAGES)
    with pytest.raises(LLMError) as info:
        client.complete(MESSAGES)
    assert info.value.kind == "budget"
    assert len(scripted_llm.requests) == 1


def test_replayed_reply_without_usage_is_estimated_the_same(scripted_llm, tmp_path):
    cassette = tmp_path / "c.jsonl"
    scripted_llm.push(reply(CODE_REPLY, send_usage=False))
    recorded = make_client(scripted_llm, cassette=cassette, cassette_mode="record").complete(MESSAGES)
    replayed = LLMClient(LLMConfig(model="test-model", cassette=cassette, cassette_mode="replay")).complete(MESSAGES)
    assert replayed.from_cassette and replayed.usage_estimated and replayed.usage == recorded.usage


# -- total deadline ------------------------------------------------------------------------------------------
def test_a_server_trickling_a_byte_a_second_times_out_at_the_deadline(scripted_llm):
    scripted_llm.push(trickle(reply(CODE_REPLY), interval_s=1.0))  # ~400 bytes: ~400 s if nothing stops it
    client = make_client(scripted_llm, request_timeout_s=1.5, max_retries=0)
    started = time.monotonic()
    with pytest.raises(LLMError) as info:
        client.complete(MESSAGES)
    assert info.value.kind == "timeout" and "1.5 s deadline" in info.value.message
    assert time.monotonic() - started < 60  # not the ~400 s the body takes at one byte a second


def test_a_trickled_attempt_is_retried_and_the_retry_succeeds(scripted_llm):
    scripted_llm.push(trickle(reply(CODE_REPLY), interval_s=1.0), reply("ok"))
    client = make_client(scripted_llm, request_timeout_s=1.5, max_retries=1)
    assert client.complete(MESSAGES).text == "ok"
    assert len(scripted_llm.requests) == 2


def test_a_quick_trickle_within_the_deadline_is_read_in_full(scripted_llm):
    scripted_llm.push(trickle(reply("tiny", usage={"prompt_tokens": 1, "completion_tokens": 1}), interval_s=0.001))
    assert make_client(scripted_llm, request_timeout_s=30.0).complete(MESSAGES).text == "tiny"


# -- settings: env and CLI -----------------------------------------------------------------------------------
def test_timeout_and_retries_come_from_the_environment():
    config = LLMConfig.from_env({"KFORGE_LLM_TIMEOUT": "2.5", "KFORGE_LLM_MAX_RETRIES": "0"})
    assert (config.request_timeout_s, config.max_retries) == (2.5, 0)
    assert (LLMConfig.from_env({}).request_timeout_s, LLMConfig.from_env({}).max_retries) == (600.0, 6)
    overridden = LLMConfig.from_env({"KFORGE_LLM_TIMEOUT": "abc"}, request_timeout_s=9.0)
    assert overridden.request_timeout_s == 9.0  # an override replaces a malformed variable


@pytest.mark.parametrize("name, raw", [
    ("KFORGE_LLM_TIMEOUT", "abc"), ("KFORGE_LLM_TIMEOUT", "-5"), ("KFORGE_LLM_TIMEOUT", "0"),
    ("KFORGE_LLM_TIMEOUT", "inf"), ("KFORGE_LLM_TIMEOUT", "nan"), ("KFORGE_LLM_MAX_RETRIES", "abc"),
    ("KFORGE_LLM_MAX_RETRIES", "-1"), ("KFORGE_LLM_MAX_RETRIES", "1.5"),
])
def test_bad_timeout_and_retry_values_name_the_variable_and_the_fix(name, raw):
    with pytest.raises(ValueError) as info:
        LLMConfig.from_env({name: raw})
    message = str(info.value)
    assert message.startswith(f"{name}={raw!r}") and "\n" not in message
    assert "such as" in message


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kforge optimize")
    add_generator_arguments(parser)
    return parser


def test_cli_flags_set_the_deadline_and_retries():
    args = _parser().parse_args(["--llm-timeout", "2", "--llm-max-retries", "0"])
    assert llm_call_overrides(args) == {"request_timeout_s": 2.0, "max_retries": 0}
    assert llm_call_overrides(_parser().parse_args([])) == {}


def test_generators_from_args_uses_the_flags(monkeypatch, tmp_path):
    from agent.cli_support import generators_from_args

    for name in ("KFORGE_LLM_API_KEY", "OPENAI_API_KEY", "KFORGE_CASSETTE", "KFORGE_LLM_MAX_RETRIES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KFORGE_LLM_MODEL", "m")
    monkeypatch.setenv("KFORGE_LLM_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("KFORGE_LLM_TIMEOUT", "abc")  # the flag replaces the malformed variable
    args = _parser().parse_args(["--llm-timeout", "3", "--llm-max-retries", "1", "--artifacts-dir", str(tmp_path)])
    (generator,) = generators_from_args(args)
    assert (generator.config.request_timeout_s, generator.config.max_retries) == (3.0, 1)
    monkeypatch.setenv("KFORGE_LLM_TIMEOUT", "-1")
    with pytest.raises(SystemExit, match="KFORGE_LLM_TIMEOUT='-1'"):
        generators_from_args(_parser().parse_args([]))


@pytest.mark.parametrize("argv", [["--llm-timeout", "abc"], ["--llm-timeout", "-5"], ["--llm-max-retries", "x"],
                                  ["--llm-max-retries", "-2"]])
def test_bad_cli_values_are_one_line_argparse_errors(argv, capsys):
    with pytest.raises(SystemExit) as info:
        _parser().parse_args(argv)
    assert info.value.code == 2
    error_line = capsys.readouterr().err.strip().splitlines()[-1]
    assert error_line.startswith(f"kforge optimize: error: argument {argv[0]}: '{argv[1]}' is not")
