"""The environment-variable readers (`forge.env`): defaults, parsing, and one-line errors naming the fix."""

from __future__ import annotations

import pytest

from forge.env import env_flag, env_float, env_int, env_text, parse_float, parse_int
from forge.errors import SettingError, UsageError


def test_unset_or_blank_variables_give_the_default() -> None:
    env = {"BLANK": "  "}
    assert env_text("MISSING", "d", environ=env) == "d" and env_text("BLANK", environ=env) is None
    assert env_flag("BLANK", True, environ=env) is True and env_flag("MISSING", False, environ=env) is False
    assert env_int("BLANK", 7, environ=env) == 7 and env_float("MISSING", None, environ=env) is None


def test_values_parse_with_their_bounds() -> None:
    env = {"ON": " Yes ", "OFF": "0", "N": " 12 ", "X": "2.5"}
    assert env_flag("ON", False, environ=env) is True and env_flag("OFF", True, environ=env) is False
    assert env_int("N", minimum=1, environ=env) == 12
    assert env_float("X", minimum=0, environ=env) == 2.5 and parse_float("600", "--t", above=0) == 600.0
    assert parse_int("0", "--retries", minimum=0) == 0


@pytest.mark.parametrize(("call", "message"), [
    (lambda env: env_flag("F", True, environ=env), "F='maybe' is not a flag; use 1/true/yes/on to turn it on"),
    (lambda env: env_int("I", environ=env), "I='1.5' is not an integer; give an integer or leave it unset"),
    (lambda env: env_int("M", minimum=1, environ=env), "M='0' is not an integer >= 1"),
    (lambda env: env_float("X", minimum=0, hint="give USD, such as 2.5", environ=env),
     "X='-1' is not a number >= 0; give USD, such as 2.5"),
    (lambda env: env_float("INF", above=0, what="a number of seconds", environ=env),
     "INF='inf' is not a number of seconds > 0"),
])
def test_bad_values_raise_one_line_setting_errors_naming_the_variable(call, message) -> None:
    env = {"F": "maybe", "I": "1.5", "M": "0", "X": "-1", "INF": "inf"}
    with pytest.raises(SettingError) as info:
        call(env)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)
    assert isinstance(info.value, UsageError) and isinstance(info.value, ValueError)

