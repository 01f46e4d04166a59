"""`kforge optimize` options for the LLM generator, and building the generator from them."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable

from agent.llm.config import parse_max_retries, parse_timeout

__all__ = ["add_generator_arguments", "generators_from_args", "llm_call_overrides"]

logger = logging.getLogger(__name__)


def add_generator_arguments(parser: argparse.ArgumentParser) -> None:
    from agent.languages import DEFAULT_LANGUAGE

    group = parser.add_argument_group("LLM kernel generator (used when an endpoint or a cassette is configured)")
    group.add_argument("--llm-model", help="model name (default $KFORGE_LLM_MODEL)")
    group.add_argument("--llm-base-url",
                       help="OpenAI-compatible endpoint (default $KFORGE_LLM_BASE_URL / $OPENAI_BASE_URL)")
    group.add_argument("--cassette", help="JSONL cassette of LLM calls (default $KFORGE_CASSETTE)")
    group.add_argument("--cassette-mode", choices=["record", "replay"], help="default $KFORGE_CASSETTE_MODE")
    group.add_argument("--llm-timeout", type=_flag_parser(parse_timeout, "--llm-timeout"), metavar="S",
                       help="total deadline of one LLM request in seconds (default $KFORGE_LLM_TIMEOUT or 600)")
    group.add_argument("--llm-max-retries", type=_flag_parser(parse_max_retries, "--llm-max-retries"), metavar="N",
                       help="retries of a failed LLM request (default $KFORGE_LLM_MAX_RETRIES or 6; 0 = none)")
    group.add_argument("--candidates", type=int, default=2, help="independent conversations per function (2)")
    group.add_argument("--attempts", type=int, default=4, help="turns per conversation to reach a correct kernel (4)")
    group.add_argument("--optimize-rounds", type=int, default=2, help="extra turns asking for faster kernels (2)")
    group.add_argument("--language", type=parse_languages, default=(DEFAULT_LANGUAGE,), metavar="NAMES",
                       help="kernel language(s) the model writes: triton, cuda, or triton,cuda (conversations "
                            f"alternate; the fastest correct kernel wins). Default {DEFAULT_LANGUAGE}")
    group.add_argument("--prompts-dir", help="folder of .j2 templates overriding the built-in prompts")
    group.add_argument("--artifacts-dir", help="where conversations, kernels and verdicts are written")
    group.add_argument("--generate-functions", metavar="NAMES",
                       help="comma-separated functions the generator may attempt (default: all deterministic ones)")
    add_sandbox_arguments(parser)


def parse_languages(text: str) -> tuple[str, ...]:
    """`--language`: comma-separated registered kernel languages (`triton`, `cuda`), no duplicates."""
    from agent.languages import language_names

    names = tuple(dict.fromkeys(n.strip().lower() for n in str(text).split(",") if n.strip()))
    unknown = [n for n in names if n not in language_names()]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"unknown kernel language {', '.join(unknown) or repr(text)}; choose from "
                                         f"{', '.join(language_names())} (comma-separated for several)")
    return names


def generators_from_args(args: argparse.Namespace) -> list:
    """An `LLMKernelGenerator` when an endpoint or cassette is configured (env or flags), else nothing."""
    from agent.generator import GeneratorOptions, LLMKernelGenerator
    from agent.llm import LLMConfig

    overrides = {}
    for flag, key in (("llm_model", "model"), ("llm_base_url", "base_url"), ("cassette", "cassette"),
                      ("cassette_mode", "cassette_mode")):
        value = getattr(args, flag, None)
        if value:
            overrides[key] = value
    overrides.update(llm_call_overrides(args))
    try:
        config = LLMConfig.from_env(**overrides)
    except (TypeError, ValueError) as exc:
        raise SystemExit(f"kforge: LLM generator configuration: {exc}") from exc
    shipped = False
    if not config.is_configured:
        config = _demo_cassette_config(args, config)
        shipped = config.is_configured
    if not config.is_configured:
        logger.info("no LLM endpoint or cassette configured: kernel generation is off")
        return []
    if shipped and not getattr(args, "unsafe_sandbox", False):
        _allow_shipped_demo_without_boundary(args)
    require_sandbox(args)
    return [
        LLMKernelGenerator(
            config,
            GeneratorOptions(
                candidates=args.candidates,
                attempts=args.attempts,
                optimize_rounds=args.optimize_rounds,
                languages=tuple(args.language),
                prompts_dir=args.prompts_dir,
                artifacts_dir=args.artifacts_dir,
                functions=_generated_functions(args),
            ),
        )
    ]


def module_sources_for(generators: list) -> list:
    """The agent's module source (`agent.modules.LLMModuleSource`) for each LLM generator: hot module classes of
    the model get a `ModelNew` conversation as well as the static `torch.compile` of their forward."""
    from agent.generator import LLMKernelGenerator
    from agent.modules import LLMModuleSource

    return [LLMModuleSource(g) for g in generators if isinstance(g, LLMKernelGenerator)]


def _allow_shipped_demo_without_boundary(args: argparse.Namespace) -> None:
    """The demo's recorded kernels ship inside kernel-forge itself (as trusted as the package), so where bubblewrap is
    missing they may run with the weaker isolation, with one warning, instead of making the README's demo fail."""
    from forge.sandbox.isolation import SandboxUnavailableError, resolve_isolation

    try:
        resolve_isolation("auto")
    except SandboxUnavailableError:
        print("kforge: bubblewrap is not installed: the demo's recorded kernels (shipped with kernel-forge) run with "
              "weaker isolation; install bubblewrap before generating kernels with a model", file=sys.stderr)
        args.unsafe_sandbox = True


def _demo_cassette_config(args: argparse.Namespace, config):
    """With `--demo` and no endpoint or cassette configured: replay the cassette shipped for that demo on this
    device in the first `--language` (`agent.demo_cassettes`), so the demo runs the whole agent path with no key.
    It holds first turns only,
    so the run asks one turn per function; the functions it covers are all attempted (generator threshold 0) unless
    the user chose otherwise. Returns `config` unchanged when there is no such cassette."""
    import dataclasses

    import torch

    from agent.demo_cassettes import demo_cassette
    from agent.languages import DEFAULT_LANGUAGE

    demo = getattr(args, "demo", None)
    if not demo:
        return config
    device = getattr(args, "device", "auto") or "auto"
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    language = (getattr(args, "language", None) or (DEFAULT_LANGUAGE,))[0]
    shipped = demo_cassette(demo, device, language=language)
    if shipped is None:
        logger.info("no %s cassette ships for demo %s on %s: kernel generation is off", language, demo, device)
        return config
    defaults = {"candidates": 2, "attempts": 4, "optimize_rounds": 2, "generator_threshold": 10.0}
    replay = {"candidates": 1, "attempts": 1, "optimize_rounds": 0, "generator_threshold": 0.0}
    for name, default in defaults.items():
        if getattr(args, name, default) == default:
            setattr(args, name, replay[name])
    from forge.modules import MODULE_PREFIX

    functions = [t for t in shipped.functions if not t.startswith(MODULE_PREFIX)]
    classes = [t[len(MODULE_PREFIX):] for t in shipped.functions if t.startswith(MODULE_PREFIX)]
    if not getattr(args, "generate_functions", None):
        args.generate_functions = ",".join(functions)
        args.replay_functions = tuple(functions)  # possibly none: the cassette may hold module conversations only
    if classes and getattr(args, "modules", None) is None:
        args.modules = classes
    print(f"kforge: no LLM endpoint configured; replaying the demo's recorded generator conversations "
          f"({shipped.path.name}: {', '.join(shipped.functions)})")
    return dataclasses.replace(config, model=shipped.model, cassette=shipped.path, cassette_mode="replay")


def llm_call_overrides(args: argparse.Namespace) -> dict[str, float | int]:
    """`LLMConfig` overrides from `--llm-timeout` / `--llm-max-retries` (only the flags that were given)."""
    overrides: dict[str, float | int] = {}
    if getattr(args, "llm_timeout", None) is not None:
        overrides["request_timeout_s"] = args.llm_timeout
    if getattr(args, "llm_max_retries", None) is not None:
        overrides["max_retries"] = args.llm_max_retries
    return overrides


def _flag_parser(parse: Callable[[str, str], float | int | None], flag: str) -> Callable[[str], float | int]:
    """An argparse `type` from an `agent.llm.config` parser: its ValueError becomes argparse's one-line error."""

    def convert(text: str) -> float | int:
        try:
            value = parse(text, flag)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc).removeprefix(f"{flag}=")) from None
        if value is None:
            raise argparse.ArgumentTypeError(f"{flag} needs a value")
        return value

    convert.__name__ = flag.lstrip("-").replace("-", "_")
    return convert


def _names(text: str | None) -> list[str] | None:
    return [n.strip() for n in text.split(",") if n.strip()] if text else None


def _generated_functions(args: argparse.Namespace) -> tuple[str, ...] | None:
    """`--generate-functions`, else the functions a replayed demo cassette holds (maybe none), else None (all)."""
    named = _names(getattr(args, "generate_functions", None))
    if named:
        return tuple(named)
    return getattr(args, "replay_functions", None)


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


# -- sandbox boundary (generated code runs inside bubblewrap unless the user opts out) ------------------------
def add_sandbox_arguments(parser: argparse.ArgumentParser) -> None:
    """`--unsafe-sandbox`: the explicit opt-out of the bubblewrap boundary (same as `KFORGE_UNSAFE_SANDBOX=1`)."""
    group = parser.add_argument_group("sandbox for generated kernels")
    group.add_argument("--unsafe-sandbox", action="store_true",
                       help="run generated kernels even where the bubblewrap boundary cannot be set up (weaker "
                            "isolation: a network namespace at best; the kernels can read your files). Same as "
                            "KFORGE_UNSAFE_SANDBOX=1")


def require_sandbox(args: argparse.Namespace) -> None:
    """Before any LLM call: exit with the reason when the boundary is unavailable and the user did not opt out.

    `--unsafe-sandbox` sets `KFORGE_UNSAFE_SANDBOX=1` for this process and its workers; the one warning is logged
    when the weaker isolation is chosen.
    """
    import os

    from forge.sandbox.isolation import UNSAFE_ENV, SandboxUnavailableError, resolve_isolation

    if getattr(args, "unsafe_sandbox", False):
        os.environ[UNSAFE_ENV] = "1"
    try:
        resolve_isolation("auto")
    except SandboxUnavailableError as exc:
        raise SystemExit(f"kforge: {exc}") from exc
