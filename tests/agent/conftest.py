"""Fixtures for the agent tests: a scripted OpenAI-compatible server on loopback."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.agent.llm_server import ScriptedLLMServer


@pytest.fixture
def scripted_llm() -> Iterator[ScriptedLLMServer]:
    """A started `ScriptedLLMServer` with an empty script (`push` steps or set `responder`); shut down afterwards."""
    with ScriptedLLMServer() as server:
        yield server
