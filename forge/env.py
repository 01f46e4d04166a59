"""Settings from environment variables: one reader per kind of value, one form of error.

    from forge.env import env_flag, env_float, env_int
    if env_flag("KFORGE_TRITON_LAUNCH_CACHE", True): ...
    budget = env_float("KFORGE_LLM_BUDGET_USD", None, minimum=0, hint="give USD as a plain number, such as 2.5")

An unset or blank variable gives the default. A value that does not parse, or lies outside its bounds, raises
`forge.errors.SettingError` (a `UsageError`, so `kforge` prints it as one line, and a ValueError) naming the
variable, its value and the form expected: `KFORGE_X='abc' is not a number >= 0; give ..., such as 2.5`. The
`parse_*` functions do the same for a value's text under any name (a CLI flag's, e.g. `--llm-timeout`), so a flag
and the variable behind it refuse the same values with the same words. `environ` reads a mapping instead of
`os.environ` (tests, `LLMConfig.from_env(environ)`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path

from forge.errors import SettingError

__all__ = ["FALSE_WORDS", "TRUE_WORDS", "cache_root", "env_flag", "env_float", "env_int", "env_text", "parse_flag",
           "parse_float", "parse_int"]

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def env_text(name: str, default: str | None = None, *, environ: Mapping[str, str] | None = None) -> str | None:
    """The variable's value, stripped; `default` when it is unset or blank."""
    raw = (os.environ if environ is None else environ).get(name)
    if raw is None or not raw.strip():
        return default
    return raw.strip()


def _bounds(minimum: float | None, above: float | None) -> str:
    if above is not None:
        return f" > {above:g}"
    return f" >= {minimum:g}" if minimum is not None else ""


def _refuse(name: str, raw: str, expected: str, hint: str | None) -> SettingError:
    return SettingError(f"{name}={raw!r} is not {expected}; {hint or f'give {expected} or leave it unset'}")


def parse_float(raw: str, name: str, *, minimum: float | None = None, above: float | None = None,
                what: str = "a number", hint: str | None = None) -> float:
    """A finite number from `raw`, at least `minimum` / greater than `above`; `SettingError` naming `name`
    otherwise. `what` says what the number is ("a number of seconds"); `hint` how to fix it ("give ..., such as
    600")."""
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value) or (minimum is not None and value < minimum) or (above is not None and value <= above):
        raise _refuse(name, raw, what + _bounds(minimum, above), hint)
    return value


def parse_int(raw: str, name: str, *, minimum: int | None = None, what: str = "an integer",
              hint: str | None = None) -> int:
    """A whole number from `raw` (no fraction, no exponent), at least `minimum`; `SettingError` naming `name`
    otherwise."""
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise _refuse(name, raw, what + _bounds(minimum, None), hint) from None
    if minimum is not None and value < minimum:
        raise _refuse(name, raw, what + _bounds(minimum, None), hint)
    return value


def parse_flag(raw: str, name: str) -> bool:
    """`1`/`true`/`yes`/`on` -> True, `0`/`false`/`no`/`off` -> False (any case); `SettingError` otherwise."""
    word = str(raw).strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise _refuse(name, raw, "a flag", f"use {'/'.join(TRUE_WORDS)} to turn it on or {'/'.join(FALSE_WORDS)} to "
                  "turn it off")


def env_flag(name: str, default: bool, *, environ: Mapping[str, str] | None = None) -> bool:
    """The variable as a flag (`parse_flag`); `default` when unset or blank."""
    raw = env_text(name, environ=environ)
    return default if raw is None else parse_flag(raw, name)


def env_int(name: str, default: int | None = None, *, minimum: int | None = None, what: str = "an integer",
            hint: str | None = None, environ: Mapping[str, str] | None = None) -> int | None:
    """The variable as a whole number (`parse_int`); `default` when unset or blank."""
    raw = env_text(name, environ=environ)
    return default if raw is None else parse_int(raw, name, minimum=minimum, what=what, hint=hint)


def env_float(name: str, default: float | None = None, *, minimum: float | None = None, above: float | None = None,
              what: str = "a number", hint: str | None = None,
              environ: Mapping[str, str] | None = None) -> float | None:
    """The variable as a finite number (`parse_float`); `default` when unset or blank."""
    raw = env_text(name, environ=environ)
    return default if raw is None else parse_float(raw, name, minimum=minimum, above=above, what=what, hint=hint)


def cache_root(*, environ: Mapping[str, str] | None = None) -> Path:
    """kforge's cache folder: `$KFORGE_CACHE_DIR`, else `~/.cache/kforge` (kernels, modules, logs, sandbox caches)."""
    named = env_text("KFORGE_CACHE_DIR", environ=environ)
    return Path(named) if named is not None else Path.home() / ".cache" / "kforge"
