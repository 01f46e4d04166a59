"""LLMConfig: environment precedence, bad values, secrets kept out of repr and fingerprint."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from agent.llm import LLMConfig


def test_kforge_variables_win_over_openai_ones():
    env = {
        "KFORGE_LLM_MODEL": "qwen",
        "KFORGE_LLM_BASE_URL": "http://127.0.0.1:8000/v1",
        "OPENAI_BASE_URL": "https://api.example.invalid/v1",
        "KFORGE_LLM_API_KEY": "kforge-key",
        "OPENAI_API_KEY": "openai-key",
    }
    config = LLMConfig.from_env(env)
    assert (config.model, config.base_url, config.api_key) == ("qwen", "http://127.0.0.1:8000/v1", "kforge-key")


def test_openai_variables_are_the_fallback():
    config = LLMConfig.from_env({"OPENAI_BASE_URL": "http://h/v1", "OPENAI_API_KEY": "k", "KFORGE_LLM_MODEL": "m"})
    assert (config.base_url, config.api_key) == ("http://h/v1", "k")
    assert config.is_configured


def test_all_variables_are_read():
    env = {
        "KFORGE_LLM_MODEL": "m",
        "KFORGE_CASSETTE": "~/runs/c.jsonl",
        "KFORGE_CASSETTE_MODE": "Replay",
        "KFORGE_CACHE_DIR": "/tmp/kforge-cache",
        "KFORGE_LLM_INPUT_PRICE": "2.5",
        "KFORGE_LLM_OUTPUT_PRICE": "10",
        "KFORGE_LLM_BUDGET_USD": "3",
        "KFORGE_LLM_REASONING_EFFORT": "high",
        "KFORGE_LLM_MAX_COMPLETION_TOKENS": "16384",
    }
    config = LLMConfig.from_env(env)
    assert config.cassette == Path("~/runs/c.jsonl").expanduser() and config.cassette_mode == "replay"
    assert config.cache_dir == Path("/tmp/kforge-cache")
    assert (config.input_price_per_mtok, config.output_price_per_mtok, config.cost_budget_usd) == (2.5, 10.0, 3.0)
    assert (config.reasoning_effort, config.max_completion_tokens) == ("high", 16384)


def test_explicit_overrides_win_including_none():
    env = {"KFORGE_LLM_MODEL": "from-env", "KFORGE_CASSETTE": "/tmp/c.jsonl", "KFORGE_LLM_INPUT_PRICE": "nope"}
    config = LLMConfig.from_env(env, model="explicit", cassette=None, input_price_per_mtok=1.0, temperature=0.3)
    assert (config.model, config.cassette, config.input_price_per_mtok, config.temperature) == (
        "explicit", None, 1.0, 0.3
    )


def test_from_env_reads_os_environ_by_default(monkeypatch):
    monkeypatch.setenv("KFORGE_LLM_MODEL", "env-model")
    monkeypatch.setenv("KFORGE_LLM_BASE_URL", "http://127.0.0.1:1/v1")
    monkeypatch.setenv("KFORGE_LLM_API_KEY", "")  # empty counts as unset
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    config = LLMConfig.from_env()
    assert (config.model, config.api_key) == ("env-model", None)


@pytest.mark.parametrize(
    "variable, value",
    [
        ("KFORGE_LLM_INPUT_PRICE", "cheap"),
        ("KFORGE_LLM_OUTPUT_PRICE", "-1"),
        ("KFORGE_LLM_BUDGET_USD", "lots"),
        ("KFORGE_CASSETTE_MODE", "rewind"),
        ("KFORGE_LLM_MAX_COMPLETION_TOKENS", "many"),
        ("KFORGE_LLM_MAX_COMPLETION_TOKENS", "0"),
    ],
)
def test_bad_variables_name_themselves(variable, value):
    env = {"KFORGE_CASSETTE": "/tmp/c.jsonl", variable: value}
    with pytest.raises(ValueError, match=variable):
        LLMConfig.from_env(env)


def test_unknown_override_is_refused():
    with pytest.raises(TypeError, match="temprature"):
        LLMConfig.from_env({}, temprature=0.1)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(cost_budget_usd=1.0), "KFORGE_LLM_INPUT_PRICE"),
        (dict(cost_budget_usd=1.0, input_price_per_mtok=1.0), "output_price_per_mtok"),
        (dict(cassette_mode="rewind", cassette="c.jsonl"), "cassette_mode"),
        (dict(cassette_mode="replay"), "needs a cassette path"),
        (dict(max_retries=-1), "max_retries"),
        (dict(request_timeout_s=0), "request_timeout_s"),
        (dict(max_completion_tokens=0), "max_completion_tokens"),
        (dict(extra_body={"temperature": 0.1}), "dedicated"),
        (dict(extra_body={"fn": object()}), "JSON"),
        (dict(reasoning_effort=""), "reasoning_effort"),
    ],
)
def test_bad_fields_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LLMConfig(model="m", **kwargs)


def test_api_key_never_appears_in_repr_str_or_fingerprint():
    config = LLMConfig(model="m", base_url="http://h/v1", api_key="sk-very-secret-123")
    for text in (repr(config), str(config), config.fingerprint(), repr([config])):
        assert "sk-very-secret-123" not in text
    assert "api_key='***'" in repr(config)
    assert "api_key=None" in repr(LLMConfig(model="m"))
    assert pickle.loads(pickle.dumps(config)) == config


def test_is_configured():
    assert not LLMConfig().is_configured
    assert not LLMConfig(model="m").is_configured
    assert not LLMConfig(base_url="http://h/v1").is_configured
    assert LLMConfig(model="m", base_url="http://h/v1").is_configured
    assert LLMConfig(model="m", api_key="k").is_configured
    assert LLMConfig(cassette="c.jsonl").is_configured


def test_cassette_mode_resolution(tmp_path):
    cassette = tmp_path / "c.jsonl"
    assert LLMConfig().resolved_cassette_mode() is None
    assert LLMConfig(cassette=cassette).resolved_cassette_mode() == "record"
    cassette.write_text("")
    assert LLMConfig(cassette=cassette).resolved_cassette_mode() == "replay"
    assert LLMConfig(cassette=cassette, cassette_mode="record").resolved_cassette_mode() == "record"


def test_fingerprint_is_stable_and_tracks_generation_parameters():
    a = LLMConfig(model="m", temperature=0.2, extra_body={"b": 1, "a": 2})
    same = LLMConfig(model="m", temperature=0.2, extra_body={"a": 2, "b": 1}, base_url="http://elsewhere/v1")
    assert a.fingerprint() == same.fingerprint()
    for changed in (
        LLMConfig(model="m2", temperature=0.2, extra_body={"b": 1, "a": 2}),
        LLMConfig(model="m", temperature=0.3, extra_body={"b": 1, "a": 2}),
        LLMConfig(model="m", temperature=0.2, extra_body={"b": 1, "a": 2}, reasoning_effort="low"),
        LLMConfig(model="m", temperature=0.2, extra_body={"b": 1, "a": 2}, max_completion_tokens=10),
        LLMConfig(model="m", temperature=0.2),
    ):
        assert changed.fingerprint() != a.fingerprint()
