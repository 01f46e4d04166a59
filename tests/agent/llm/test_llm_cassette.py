"""Record/replay: a recorded run replays with the server gone; misses, ordering and file handling."""

from __future__ import annotations

import json

import openai
import pytest

from agent.llm import Cassette, LLMClient, LLMConfig, LLMError, canonical_request, request_key
from tests.agent.llm_server import ScriptedLLMServer, reply

SYSTEM = {"role": "system", "content": "You write Triton kernels."}


def ask(content: str) -> list[dict]:
    return [SYSTEM, {"role": "user", "content": content}]


def config_for(server_url: str | None, cassette, **overrides) -> LLMConfig:
    settings = dict(model="test-model", base_url=server_url, api_key="sk-test", cassette=cassette,
                    max_retries=0, request_timeout_s=2.0, input_price_per_mtok=1.0, output_price_per_mtok=2.0)
    settings.update(overrides)
    return LLMConfig(**settings)


def echo(body: dict):
    return reply("reply to " + body["messages"][-1]["content"], usage={"prompt_tokens": 40, "completion_tokens": 9})


def test_record_then_replay_with_the_server_shut_down(tmp_path):
    cassette = tmp_path / "nested" / "run.jsonl"
    with ScriptedLLMServer(responder=echo) as server:
        url = server.base_url
        recorder = LLMClient(config_for(url, cassette))
        assert recorder.cassette_mode == "record"  # auto: the file did not exist
        live = [recorder.complete(ask("relu"), tag="relu"), recorder.complete(ask("gelu"), tag="gelu")]
        recorder.close()
    assert [r.from_cassette for r in live] == [False, False]
    lines = [json.loads(line) for line in cassette.read_text().splitlines()]
    assert [line["tag"] for line in lines] == ["relu", "gelu"]
    assert lines[0]["request"]["messages"] == ask("relu") and "sk-test" not in cassette.read_text()

    # The server is gone: replay must not touch the network.
    player = LLMClient(config_for(url, cassette))
    assert player.cassette_mode == "replay"  # auto: the file exists
    replayed = [player.complete(ask("relu"), tag="relu"), player.complete(ask("gelu"), tag="gelu")]
    assert [r.text for r in replayed] == [r.text for r in live] == ["reply to relu", "reply to gelu"]
    assert all(r.from_cassette for r in replayed)
    assert replayed[0].usage == live[0].usage and replayed[0].cost_usd == pytest.approx(live[0].cost_usd)
    summary = player.usage.summary()
    assert summary["calls"] == 2 and summary["cassette_calls"] == 2 and summary["prompt_tokens"] == 80

    with pytest.raises(LLMError) as info:
        player.complete(ask("softmax over the last dim " + "x" * 300))
    err = info.value
    assert err.kind == "cassette_miss"
    assert str(cassette) in err.message and "'test-model'" in err.message
    assert "softmax over the last dim" in err.message and "x" * 200 not in err.message
    assert "KFORGE_CASSETTE_MODE=record" in err.message


def test_replay_needs_no_endpoint_at_all(tmp_path, monkeypatch):
    cassette = tmp_path / "run.jsonl"
    with ScriptedLLMServer(responder=echo) as server:
        with LLMClient(config_for(server.base_url, cassette)) as recorder:
            recorder.complete(ask("relu"))

    def no_sdk(*args, **kwargs):
        raise AssertionError("replay constructed an SDK client")

    monkeypatch.setattr(openai, "OpenAI", no_sdk)
    offline = LLMConfig(model="test-model", cassette=cassette, input_price_per_mtok=1.0, output_price_per_mtok=2.0)
    assert offline.is_configured
    assert LLMClient(offline).complete(ask("relu")).text == "reply to relu"


def test_identical_requests_replay_in_recorded_order(tmp_path):
    cassette = tmp_path / "run.jsonl"
    with ScriptedLLMServer([reply("first"), reply("second")]) as server:
        with LLMClient(config_for(server.base_url, cassette)) as recorder:
            assert [recorder.complete(ask("relu")).text for _ in range(2)] == ["first", "second"]
    player = LLMClient(config_for(None, cassette))
    assert [player.complete(ask("relu")).text for _ in range(3)] == ["first", "second", "second"]


def test_generation_parameters_are_part_of_the_key(tmp_path):
    cassette = tmp_path / "run.jsonl"
    with ScriptedLLMServer(responder=echo) as server:
        with LLMClient(config_for(server.base_url, cassette, temperature=0.0)) as recorder:
            recorder.complete(ask("relu"))
    assert LLMClient(config_for(None, cassette, temperature=0.0)).complete(ask("relu")).text == "reply to relu"
    for changed in (dict(temperature=0.7), dict(reasoning_effort="high"), dict(max_completion_tokens=99),
                    dict(model="other-model", temperature=0.0), dict(temperature=0.0, extra_body={"top_k": 5})):
        with pytest.raises(LLMError) as info:
            LLMClient(config_for(None, cassette, **changed)).complete(ask("relu"))
        assert info.value.kind == "cassette_miss"


def test_explicit_replay_of_a_missing_cassette_is_refused(tmp_path):
    missing = tmp_path / "absent.jsonl"
    with pytest.raises(FileNotFoundError, match="KFORGE_CASSETTE_MODE=record"):
        LLMClient(config_for(None, missing, cassette_mode="replay"))


def test_explicit_record_starts_the_file_afresh(tmp_path):
    cassette = tmp_path / "run.jsonl"
    cassette.write_text('{"stale": true}\n')
    with ScriptedLLMServer(responder=echo) as server:
        with LLMClient(config_for(server.base_url, cassette, cassette_mode="record")) as recorder:
            recorder.complete(ask("relu"))
    lines = cassette.read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["response"]["text"] == "reply to relu"


def test_hand_written_line_without_key_replays(tmp_path):
    cassette = tmp_path / "hand.jsonl"
    request = canonical_request("test-model", ask("relu"), {})
    response = {"text": "```python\ndef kernel_function(x):\n    return x\n```", "finish_reason": "stop",
                "model": "test-model", "usage": {"prompt_tokens": 3, "completion_tokens": 4}}
    cassette.write_text(json.dumps({"request": request, "response": response}) + "\n\n")
    answer = LLMClient(config_for(None, cassette)).complete(ask("relu"))
    assert answer.text == response["text"] and answer.usage.total_tokens == 7 and answer.from_cassette


def test_corrupt_cassette_line_names_the_place(tmp_path):
    cassette = tmp_path / "bad.jsonl"
    request = canonical_request("test-model", ask("relu"), {})
    good = json.dumps({"key": request_key(request), "response": {"text": "x"}})
    cassette.write_text(good + "\n{not json\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:2"):
        Cassette(cassette, "replay")
    cassette.write_text(json.dumps({"request": request}) + "\n")
    with pytest.raises(ValueError, match="'response'"):
        Cassette(cassette, "replay")


def test_key_is_stable_and_sensitive():
    base = canonical_request("m", ask("relu"), {"temperature": 0.0})
    assert request_key(base) == request_key(canonical_request("m", ask("relu"), {"temperature": 0.0}))
    assert request_key(base) != request_key(canonical_request("m", ask("relu "), {"temperature": 0.0}))
    assert len(request_key(base)) == 64
