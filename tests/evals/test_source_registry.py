"""The eval source registry (`evals.sources.registry`): one list of names for `kforge eval --source` and
`source_from_name`, SDPA names derived from forge's backend table."""

from __future__ import annotations

import argparse

import pytest

from evals.sources import (
    CompileSource,
    LLMSource,
    ProviderSource,
    SDPASource,
    check_source_name,
    register_source,
    source_from_name,
    source_names,
    source_usages,
)
from evals.sources import registry as registry_module
from forge.providers import sdpa_backend_names


def test_builtin_names_are_registered_once_and_sdpa_names_follow_forges_table() -> None:
    names = source_names()
    assert names[:4] == ("llm", "compile", "eager", "sdpa")
    assert names[4:] == tuple(f"sdpa-{b}" for b in sdpa_backend_names())
    assert source_usages()[-2:] == ("provider:<library>", "provider:<module>:<factory>")
    assert isinstance(source_from_name(" Compile "), CompileSource)
    flash = source_from_name("sdpa-flash")
    assert isinstance(flash, SDPASource) and flash.backend == "flash" and source_from_name("sdpa").backend is None
    assert isinstance(source_from_name("provider:forge.providers:CompiledFunctionProvider"), ProviderSource)
    with pytest.raises(ValueError, match="unknown eval source 'triton-magic'; choose one of: llm, compile"):
        source_from_name("triton-magic")


def test_the_cli_reads_the_registry(monkeypatch) -> None:
    from evals.cli import add_eval_parser
    from kforge.cli import build_parser

    assert check_source_name("SDPA-Math") == "sdpa-math"
    assert check_source_name(" provider:forge.providers:CompiledFunctionProvider ") == \
        "provider:forge.providers:CompiledFunctionProvider"  # a family keeps its case (module paths)
    with pytest.raises(ValueError, match="bad provider spec"):
        check_source_name("provider:")
    monkeypatch.setattr(registry_module, "_SOURCES", dict(registry_module._SOURCES))

    @register_source("scripted-test")
    def _scripted() -> CompileSource:
        return CompileSource()

    assert "scripted-test" in source_names() and isinstance(source_from_name("scripted-test"), CompileSource)
    args = build_parser().parse_args(["eval", "smoke", "--source", "scripted-test"])
    assert args.source == "scripted-test"
    parser = argparse.ArgumentParser(prog="kforge")
    assert "scripted-test" in add_eval_parser(parser.add_subparsers()).format_help()


def test_only_sources_registered_with_options_receive_them() -> None:
    from agent.llm import LLMConfig

    config = LLMConfig(model="m", cassette=None)
    llm = source_from_name("llm", llm_config=config, generator_options={"attempts": 2})
    assert isinstance(llm, LLMSource) and llm.config is config and llm.generator_options == {"attempts": 2}
    assert isinstance(source_from_name("compile", llm_config=config, generator_options={"attempts": 2}),
                      CompileSource)


def test_bad_registrations_are_refused() -> None:
    with pytest.raises(ValueError, match="a family name ends in one"):
        register_source("nocolon", CompileSource, family=True)
    with pytest.raises(ValueError, match="an exact name has no ':'"):
        register_source("a:b", CompileSource)
    with pytest.raises(TypeError, match="must be callable"):
        register_source("x", "not a factory")  # type: ignore[arg-type]
