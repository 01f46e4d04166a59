"""Kernel-cache entries are signed (issue 9, items 4 and 5): a planted, edited or moved entry is a miss, and its code
is never imported in the process; a signed entry is still screened again before import.

The generator tests run `LLMKernelGenerator` against the scripted loopback server with the real sandbox: after a
miss the "LLM" is asked and its kernel validated in the sandbox, so the number of requests shows whether the cache
was used. The marker kernel writes a file when imported; the screen (which would refuse it) is switched off in
those tests to stand for a screen bypass (issue 9 found several), so only the signature stands between it and the
process.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from agent import GeneratedKernelProvider, GeneratorOptions, LLMConfig, LLMKernelGenerator
from agent.cache import KernelCache
from agent.languages import get_language
from forge.checking import KernelUtils
from forge.judging import JudgeOptions
from forge.samples import Sample
from forge.sandbox import SandboxOptions
from forge.signing import SigningKey, sign_document
from tests.agent.kernels import SILU_OK, SILU_WRONG, fenced
from tests.agent.llm_server import ScriptedLLMServer, reply
from tests.conftest import TEST_SIGNING_KEY

QUICK = KernelUtils(fresh_inputs_per_sample=1, rounds=3, warmup=1, min_run_time_s=0.01)


def _samples() -> list[Sample]:
    return [Sample((torch.randn(8, 64, generator=torch.Generator().manual_seed(0)),), {})]


def _generator(server: ScriptedLLMServer, tmp_path: Path) -> LLMKernelGenerator:
    config = LLMConfig(model="scripted-model", base_url=server.base_url, api_key="sk-test",
                       cache_dir=tmp_path / "cache", max_retries=2, retry_initial_wait_s=0.01, retry_max_wait_s=0.05)
    return LLMKernelGenerator(config, GeneratorOptions(candidates=1, attempts=2, optimize_rounds=0,
                                                       artifacts_dir=tmp_path / "runs"), kernel_utils=QUICK,
                              judge_options=JudgeOptions(SandboxOptions(timeout_s=120.0), max_concurrent=2))


def _marker_source(marker: Path) -> str:
    return SILU_OK.replace("import torch\n", f"import torch\nopen({str(marker)!r}, 'w').close()\n", 1)


def _plant(generator: LLMKernelGenerator, source: str, *, key: SigningKey | None = None) -> Path:
    """Write a cache entry for silu under the generator's key, as an attacker (key=None) or the user would."""
    cache_key = generator.cache_key_for(generator._task("silu", _samples())[0])
    provider = GeneratedKernelProvider("silu", source, language="triton", signatures=_samples())
    provider._ready = True
    document = {"key": cache_key, "provider": provider.to_dict(), "info": {"sandbox_speedup": 9.9}}
    if key is not None:
        document = sign_document(document, key)
    path = generator.cache._path(cache_key)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document))
    return path


@pytest.fixture
def no_screen(monkeypatch):
    """Stand-in for a screen bypass: the language's screen accepts everything."""
    monkeypatch.setattr(type(get_language("triton")), "screen", lambda self, source, function: [])


def _generate(generator: LLMKernelGenerator):
    samples = _samples()
    assert generator.prepare("silu", samples)
    return generator.submit("silu", samples).result(timeout=300)


def test_a_planted_unsigned_entry_is_a_miss_and_never_imported(tmp_path, no_screen) -> None:
    marker = tmp_path / "imported.marker"
    with ScriptedLLMServer([reply(fenced(SILU_OK))]) as server:
        generator = _generator(server, tmp_path)
        _plant(generator, _marker_source(marker))
        result = _generate(generator)
        assert len(server.requests) == 1  # a miss: the LLM was asked
    assert result.succeeded and not result.usage.get("cached")
    assert not marker.exists()  # the planted code never ran in this process
    x = torch.randn(8, 64)
    torch.testing.assert_close(result.provider(x), F.silu(x))


def test_an_entry_signed_with_another_key_is_a_miss(tmp_path) -> None:
    with ScriptedLLMServer([reply(fenced(SILU_OK))]) as server:
        generator = _generator(server, tmp_path)
        _plant(generator, SILU_WRONG, key=SigningKey(b"the attacker's key", "test"))  # screens clean, wrong values
        result = _generate(generator)
        assert len(server.requests) == 1
    x = torch.randn(8, 64)
    torch.testing.assert_close(result.provider(x), F.silu(x))


def test_a_signed_entry_is_served_and_still_screened(tmp_path, monkeypatch) -> None:
    key = SigningKey(TEST_SIGNING_KEY.encode(), "test")
    with ScriptedLLMServer([]) as server:
        generator = _generator(server, tmp_path)
        _plant(generator, SILU_OK, key=key)
        result = _generate(generator)
        assert len(server.requests) == 0 and result.usage["cached"]
    # signed but failing the screen: refused before import (the marker would be written at import)
    marker = tmp_path / "imported.marker"
    cache = KernelCache(tmp_path / "cache")
    cache_key = generator.cache_key_for(generator._task("silu", _samples())[0])
    _plant(generator, _marker_source(marker), key=key)
    assert cache.get(cache_key) is None and not marker.exists()


def test_put_signs_and_edits_or_moves_are_misses(tmp_path, caplog) -> None:
    cache = KernelCache(tmp_path / "cache")
    provider = GeneratedKernelProvider("silu", SILU_OK, language="triton", signatures=_samples())
    provider._ready = True
    path = cache.put("a" * 64, provider, {"sandbox_speedup": 1.5})
    stored = json.loads(path.read_text())
    assert stored["signature"]["signer"] == "tests@kforge"
    got, info = cache.get("a" * 64)
    assert got.source == SILU_OK and info == {"sandbox_speedup": 1.5}

    stored["info"]["sandbox_speedup"] = 99.0  # any field is covered
    path.write_text(json.dumps(stored))
    assert cache.get("a" * 64) is None
    assert "treated as a miss; nothing was imported" in caplog.text and "signature does not match" in caplog.text

    cache.put("a" * 64, provider, {})
    moved = cache._path("b" * 64)
    moved.write_text(cache._path("a" * 64).read_text())  # a valid entry under another task's key
    assert cache.get("b" * 64) is None and "stored under another key" in caplog.text


def test_put_creates_a_private_key_when_none_is_configured(tmp_path, monkeypatch) -> None:
    import os
    import stat

    monkeypatch.delenv("KFORGE_SIGNING_KEY")
    cache = KernelCache(tmp_path / "cache")
    provider = GeneratedKernelProvider("silu", SILU_OK, language="triton", signatures=_samples())
    provider._ready = True
    cache.put("c" * 64, provider)
    key_file = Path(os.environ["KFORGE_SIGNING_KEY_FILE"])
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert cache.get("c" * 64)[0].source == SILU_OK
