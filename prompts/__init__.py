"""Jinja templates of the LLM kernel agent's prompts (rendered by `agent.prompting.PromptRenderer`)."""

from pathlib import Path

PROMPTS_DIR = Path(__file__).parent
