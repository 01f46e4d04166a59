"""The one registry of eval source names: `kforge eval --source` (its choices, help and errors) and
`source_from_name` both read it, so a new source is its class in `evals/sources/` plus one `register_source` call
(in `evals/sources/__init__.py`, next to the built-in ones).

    register_source("compile", CompileSource)                              # an exact name
    register_source("llm", lambda **options: LLMSource(**options), takes_options=True)
    register_source("provider:", ProviderSource, family=True,              # a family: provider:<spec>
                    usage=("provider:<library>", "provider:<module>:<factory>"), check=parse_provider_spec)

An exact name's factory is called with no arguments (or with `source_from_name`'s keyword options when
`takes_options`); a family's factory with the whole name (`"provider:flaggems"`). Names are matched without case;
family names keep their case (a module path may need it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from evals.sources.base import EvalSource

__all__ = ["SourceEntry", "check_source_name", "register_source", "source_from_name", "source_names",
           "source_usages"]


@dataclass(frozen=True)
class SourceEntry:
    """One registered name. `name`: the exact name, or for a `family` its prefix (`"provider:"`). `factory`: makes
    the source (see the module docstring). `usage`: how the name is spelled in help and errors (default `name`).
    `check`: for a family, validates a full name without building anything (the CLI calls it while parsing
    arguments); raises ValueError. `takes_options`: the factory takes `source_from_name`'s keyword options."""

    name: str
    factory: Callable[..., EvalSource]
    usage: tuple[str, ...]
    family: bool = False
    check: Callable[[str], Any] | None = None
    takes_options: bool = False


_SOURCES: dict[str, SourceEntry] = {}


def register_source(name: str, factory: Callable[..., EvalSource] | None = None, *, family: bool = False,
                    usage: str | Sequence[str] | None = None, check: Callable[[str], Any] | None = None,
                    takes_options: bool = False) -> Any:
    """Register `factory` under `name` (replacing an earlier registration of that name); without `factory`, a
    decorator that registers the function it decorates and returns it unchanged."""
    if factory is None:
        def decorate(function: Callable[..., EvalSource]) -> Callable[..., EvalSource]:
            register_source(name, function, family=family, usage=usage, check=check, takes_options=takes_options)
            return function

        return decorate
    key = str(name).strip().lower()
    if not key or (family and not key.endswith(":")) or (not family and ":" in key):
        raise ValueError(f"bad eval source name {name!r}: an exact name has no ':'; a family name ends in one "
                         "(e.g. 'provider:')")
    if not callable(factory):
        raise TypeError(f"the factory of eval source {key!r} must be callable, got {type(factory).__name__}")
    if usage is None:
        spelled = (f"{key}<spec>",) if family else (key,)
    else:
        spelled = (usage,) if isinstance(usage, str) else tuple(usage)
    _SOURCES[key] = SourceEntry(key, factory, spelled, family, check, takes_options)
    return factory


def source_names() -> tuple[str, ...]:
    """The exact source names, in registration order (`llm`, `compile`, `eager`, `sdpa`, `sdpa-<backend>`...)."""
    return tuple(entry.name for entry in _SOURCES.values() if not entry.family)


def source_usages() -> tuple[str, ...]:
    """Every way to name a source, for help and errors: the exact names, then each family's spellings."""
    return (*source_names(), *(u for entry in _SOURCES.values() if entry.family for u in entry.usage))


def _entry(name: str) -> SourceEntry:
    key = str(name).strip().lower()
    entry = _SOURCES.get(key)
    if entry is not None and not entry.family:
        return entry
    for family in _SOURCES.values():
        if family.family and key.startswith(family.name):
            return family
    raise ValueError(f"unknown eval source {name!r}; choose one of: {', '.join(source_usages())}")


def check_source_name(name: str) -> str:
    """`name` as the registry spells it (exact names lower-case, family names as given, stripped); a ValueError
    naming the choices for an unknown name, or the family's own error for a malformed one."""
    entry = _entry(name)
    if not entry.family:
        return entry.name
    if entry.check is not None:
        entry.check(str(name).strip())
    return str(name).strip()


def source_from_name(name: str, *, llm_config: Any = None, **llm_options: Any) -> EvalSource:
    """A registered name (`"compile"`, `"sdpa"`, `"sdpa-<backend>"`, `"provider:<spec>"`, `"llm"`...) -> the source.
    `llm_config` / `llm_options` go to factories registered with `takes_options` (the LLM source) and are ignored
    by the others."""
    entry = _entry(name)
    if entry.family:
        return entry.factory(str(name))
    if entry.takes_options:
        return entry.factory(llm_config=llm_config, **llm_options)
    return entry.factory()
