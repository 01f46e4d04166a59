"""`kforge optimize` options for the LLM generator, and building the generator from them."""

from __future__ import annotations

import argparse
import logging

__all__ = ["add_generator_arguments", "generators_from_args"]

logger = logging.getLogger(__name__)


def add_generator_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("LLM kernel generator (used when an endpoint or a cassette is configured)")
    group.add_argument("--llm-model", help="model name (default $KFORGE_LLM_MODEL)")
    group.add_argument("--llm-base-url",
                       help="OpenAI-compatible endpoint (default $KFORGE_LLM_BASE_URL / $OPENAI_BASE_URL)")
    group.add_argument("--cassette", help="JSONL cassette of LLM calls (default $KFORGE_CASSETTE)")
    group.add_argument("--cassette-mode", choices=["record", "replay"], help="default $KFORGE_CASSETTE_MODE")
    group.add_argument("--candidates", type=int, default=2, help="independent conversations per function (2)")
    group.add_argument("--attempts", type=int, default=4, help="turns per conversation to reach a correct kernel (4)")
    group.add_argument("--optimize-rounds", type=int, default=2, help="extra turns asking for faster kernels (2)")
    group.add_argument("--prompts-dir", help="folder of .j2 templates overriding the built-in prompts")
    group.add_argument("--artifacts-dir", help="where conversations, kernels and verdicts are written")
    group.add_argument("--generate-functions", metavar="NAMES",
                       help="comma-separated functions the generator may attempt (default: all deterministic ones)")


def generators_from_args(args: argparse.Namespace) -> list:
    """An `LLMKernelGenerator` when an endpoint or cassette is configured (env or flags), else nothing."""
    from agent.generator import LLMKernelGenerator
    from agent.llm import LLMConfig

    overrides = {}
    for flag, key in (("llm_model", "model"), ("llm_base_url", "base_url"), ("cassette", "cassette"),
                      ("cassette_mode", "cassette_mode")):
        value = getattr(args, flag, None)
        if value:
            overrides[key] = value
    try:
        config = LLMConfig.from_env(**overrides)
    except (TypeError, ValueError) as exc:
        raise SystemExit(f"kforge: LLM generator configuration: {exc}") from exc
    if not config.is_configured:
        logger.info("no LLM endpoint or cassette configured: kernel generation is off")
        return []
    return [
        LLMKernelGenerator(
            config,
            candidates=args.candidates,
            attempts=args.attempts,
            optimize_rounds=args.optimize_rounds,
            prompts_dir=args.prompts_dir,
            artifacts_dir=args.artifacts_dir,
            functions=_names(args.generate_functions),
        )
    ]


def _names(text: str | None) -> list[str] | None:
    return [n.strip() for n in text.split(",") if n.strip()] if text else None


def first_turn_requests(generator, profile, functions: list[str]) -> list[dict]:
    """The exact first request the generator sends for each function (what a recording would key on)."""
    from agent.llm.cassette import canonical_request

    requests = []
    for name in functions:
        profiled = profile.functions.get(name)
        if profiled is None or not profiled.samples:
            continue
        samples = [s for _, s in profiled.samples]
        task, _ = generator._task(name, samples)
        messages = [{"role": "system", "content": generator.renderer.system(task)},
                    {"role": "user", "content": generator.renderer.generate(task)}]
        request = canonical_request(generator.config.model, messages, generator.config.generation_parameters())
        requests.append({"function": name, "request": request})
    return requests
